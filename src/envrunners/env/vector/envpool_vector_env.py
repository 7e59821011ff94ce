"""``EnvPoolVectorEnv``: an EnvPool pool (C++ sub-envs on threads) as the sampler's vector env.

It presents what the single-agent sampler steps: ``reset(seed=)`` and ``step(actions)``
returning batch-first arrays and ``infos`` as a list of per-sub-env dicts, with
gymnasium's ``NEXT_STEP`` autoreset (EnvPool's own autoreset is that already: the
call after a sub-env's episode ended resets it, ignores its action and returns its
reset observation with reward 0 and both flags False). EnvPool may return sub-envs
in any order; rows are put back in ``env_id`` order, so row ``i`` is always sub-env ``i``.

Where EnvPool differs from gymnasium, this class maps it:

- Seeds are fixed when a pool is made, so ``reset(seed=s)`` rebuilds the pool with
  ``seed=s`` (EnvPool gives sub-env ``i`` its own stream from ``s``; the streams are
  not gymnasium's, so the initial states differ from the gymnasium path's).
- Atari frames come channels-first ``(4, 84, 84)``; they are returned channels-last
  ``(84, 84, 4)`` (a fresh copy), the layout ``wrap_atari_for_new_api_stack`` gives the CNN.
- ``infos`` are empty dicts unless ``return_infos=True`` (EnvPool's dict of arrays
  split per sub-env: per-step Python work, so opt-in).

Asynchronous use (``batch_size < num_envs``): ``async_reset()``, then ``recv()`` the
first ``batch_size`` sub-envs that are ready and ``send(actions, env_ids)`` their
actions; the per-sub-env episode rules are the same as in ``step``.
"""

from __future__ import annotations

import contextlib
import operator
import sys
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from envrunners.errors import ConfigError, EnvPoolNotInstalledError, UnknownEnvError, suggest
from envrunners.sampling._overlap_choice import available_cpus

__all__ = [
    "ATARI_DEFAULTS",
    "ENVPOOL_PREFIX",
    "EnvPoolVectorEnv",
    "async_num_threads",
    "envpool_from_config",
    "envpool_task_id",
    "import_envpool",
    "is_envpool_id",
]

#: ``config.environment(env="envpool:<task>")`` selects this backend for EnvPool's ``<task>``.
ENVPOOL_PREFIX = "envpool:"

#: EnvPool Atari options giving what ``wrap_atari_for_new_api_stack(gym.make(id, frameskip=1,
#: repeat_action_probability=0), dim=84, framestack=4, normalize=False)`` gives: 84x84
#: grayscale (area resize), 4 frames skipped with a max over the last two, up to 30 NOOPs
#: after reset, a lost life ends the episode, FIRE on reset, 4 stacked frames, unclipped
#: rewards, 27,000 agent steps (108,000 frames) per episode at most.
ATARI_DEFAULTS: dict[str, Any] = {
    "img_height": 84,
    "img_width": 84,
    "gray_scale": True,
    "use_inter_area_resize": True,
    "frame_skip": 4,
    "stack_num": 4,
    "noop_max": 30,
    "episodic_life": True,
    "use_fire_reset": True,
    "reward_clip": False,
    "repeat_action_probability": 0.0,
    "full_action_space": False,
    "max_episode_steps": 27000,
}


def import_envpool() -> Any:
    """The ``envpool`` module; ``EnvPoolNotInstalledError`` naming the extra if it is missing."""
    try:
        import envpool
    except ImportError as err:
        raise EnvPoolNotInstalledError(
            "the EnvPool backend (gym_env_vectorize_mode='envpool' or an 'envpool:' env id) "
            "needs the envpool package: pip install 'envrunners[envpool]'"
        ) from err
    return envpool


def envpool_task_id(env: Any) -> str:
    """EnvPool's task id for ``config.env``.

    ``"envpool:<task>"`` names EnvPool's task as is; a gymnasium id is mapped to
    EnvPool's name for the same task (``"ale_py:ALE/Pong-v5"`` and ``"ALE/Pong-v5"``
    -> ``"Pong-v5"``; ``"CartPole-v1"``, ``"HalfCheetah-v5"`` are the same in both).

    Raises:
        ConfigError: ``env`` is not a string (EnvPool builds its envs from a task id).
        UnknownEnvError: EnvPool has no such task (with the closest names it has).
    """
    if not isinstance(env, str):
        raise ConfigError(
            f"the EnvPool backend needs config.env to be a task id string (e.g. "
            f"'envpool:CartPole-v1' or 'CartPole-v1'), got {env!r} of type {type(env).__name__}."
        )
    task = env[len(ENVPOOL_PREFIX) :] if env.startswith(ENVPOOL_PREFIX) else env
    if task.startswith("ale_py:"):
        task = task[len("ale_py:") :]
    if task.startswith("ALE/"):
        task = task[len("ALE/") :]
    known = import_envpool().list_all_envs()
    if task not in known:
        hint = suggest(task, known)
        raise UnknownEnvError(
            f"EnvPool has no task {task!r} (from config.env={env!r}).{hint} "
            "envpool.list_all_envs() lists its tasks."
        )
    return task


def async_num_threads(batch_size: int) -> int:
    """EnvPool threads for an asynchronous pool: ``batch_size``, but one core fewer than
    this process may use (at least one thread).

    Why: stepped ready-first, the sampler acts on one batch while the pool steps the
    other, so the acting thread is busy too; EnvPool's own default (``num_threads=0``:
    ``min(batch_size, cores)``) puts a thread on every core, and on a small machine
    the pool's threads then preempt the acting thread. A synchronous pool keeps
    EnvPool's default: the sampler waits while it steps.
    """
    return max(1, min(int(batch_size), available_cpus() - 1))


def _is_atari(spec_config: Any) -> bool:
    return hasattr(spec_config, "stack_num") and hasattr(spec_config, "frame_skip")


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` EnvPool sub-envs of ``task_id`` behind gymnasium's vector-env API.

    Args:
        task_id: EnvPool's task id, or a name ``envpool_task_id`` maps to one.
        num_envs: How many sub-envs.
        batch_size: Sub-envs per ``recv()`` (``None`` = ``num_envs``: synchronous).
        seed: The pool's seed (``None``: a fresh random one, as unseeded gymnasium envs).
        return_infos: Return EnvPool's infos split per sub-env (else empty dicts).
        **make_kwargs: Further ``envpool.make`` options (``max_episode_steps``,
            ``num_threads``, Atari's ``episodic_life``...). Atari tasks start from
            ``ATARI_DEFAULTS``, which these override. An asynchronous pool's
            ``num_threads`` defaults to :func:`async_num_threads`.
    """

    def __init__(
        self,
        task_id: str,
        num_envs: int,
        *,
        batch_size: int | None = None,
        seed: int | None = None,
        return_infos: bool = False,
        **make_kwargs: Any,
    ):
        envpool = import_envpool()
        if num_envs < 1:
            raise ConfigError(f"EnvPoolVectorEnv: num_envs must be >= 1, got {num_envs}")
        batch_size = num_envs if batch_size is None else int(batch_size)
        if not 1 <= batch_size <= num_envs:
            raise ConfigError(
                f"EnvPoolVectorEnv: batch_size must be in [1, num_envs={num_envs}], "
                f"got {batch_size}"
            )
        self._envpool = envpool
        task_id = envpool_task_id(task_id)
        self.task_id = task_id
        self.num_envs = int(num_envs)
        self.batch_size = batch_size
        self.return_infos = bool(return_infos)
        with warnings.catch_warnings():  # EnvPool's float64 space bounds cast to float32
            warnings.simplefilter("ignore")
            spec_config = envpool.make_spec(task_id).config
        self.is_atari = _is_atari(spec_config)
        options = {**ATARI_DEFAULTS, **make_kwargs} if self.is_atari else dict(make_kwargs)
        if batch_size < num_envs and "num_threads" not in options:
            options["num_threads"] = async_num_threads(batch_size)
        unknown = sorted(set(options) - set(spec_config._fields))
        if unknown:
            raise ConfigError(
                f"EnvPool task {task_id!r} has no option(s) {unknown}; its options are "
                f"{sorted(set(spec_config._fields) - {'num_envs', 'batch_size', 'seed'})}."
            )
        self._make_options = options
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % 2**31)
        self._seed = int(seed)
        self.pool = self._make_pool(self._seed)
        #: Whether the pool has been reset or stepped since it was made with ``_seed``.
        self._used = False
        obs_space = self.pool.single_observation_space
        # Atari: EnvPool stacks channels-first; the CNN (and the gymnasium path) want
        # channels-last, so observations are returned transposed (``_obs_out``).
        self._channels_last = self.is_atari and len(obs_space.shape) == 3
        if self._channels_last:
            obs_space = gym.spaces.Box(
                np.moveaxis(obs_space.low, 0, -1),
                np.moveaxis(obs_space.high, 0, -1),
                dtype=obs_space.dtype,
            )
        self.single_observation_space = obs_space
        self.single_action_space = self.pool.single_action_space
        self.observation_space = batch_space(obs_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.render_mode = None
        self.spec = None
        self._ids = np.arange(self.num_envs, dtype=np.int32)
        self.closed = False

    def _direct_plan(self, pool: Any) -> None:
        """Find the pool's C++ ``_recv`` / ``_send`` layout, for the stepping fast path.

        Why: EnvPool's Python ``recv`` / ``send`` rebuild a config dict, a state dict
        and a pytree per call (several microseconds, as much as stepping a batch of
        classic-control envs). For a single-player pool with array actions and a
        plain ``obs`` array, :meth:`_recv_arrays` and :meth:`_send_arrays` read the
        same arrays by index and hand the same arrays over; anything else (or
        ``return_infos``) keeps EnvPool's own calls.
        """
        self._recv_index: tuple[int, ...] | None = None
        self._send_order: tuple[int, ...] | None = None
        self._action_dtype: Any = None
        #: Set once EnvPool's own ``send`` has checked an action's dtype and shape.
        self._action_checked = False
        try:
            state_keys = list(pool._state_keys)
            action_keys = list(pool._spec._action_keys)
            action_dtype = pool._spec._action_spec[-1][0]
            players = pool.config.get("max_num_players", 1)
        except (AttributeError, IndexError, TypeError):
            return
        wanted = ("obs", "reward", "done", "trunc", "info:env_id")
        if (
            players != 1
            or self.return_infos
            or not callable(getattr(pool, "_recv", None))
            or not callable(getattr(pool, "_send", None))
            or any(key not in state_keys for key in wanted)
            or sum(key.startswith("obs") for key in state_keys) != 1
        ):
            return
        self._recv_index = tuple(state_keys.index(key) for key in wanted)
        self._recv_get = operator.itemgetter(*self._recv_index)
        # ``send`` lists [env_id, players.env_id (the same ids), action] in the pool's order.
        if sorted(action_keys) == ["action", "env_id", "players.env_id"]:
            slots = {"env_id": 0, "players.env_id": 0, "action": 1}
            if action_keys[-1] == "action":
                self._send_order = tuple(slots[key] for key in action_keys)
                #: ``(ids, actions)`` -> the arrays in ``_send_order`` (one C call).
                self._send_pick = operator.itemgetter(*self._send_order)
                self._action_dtype = action_dtype

    def _make_pool(self, seed: int) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pool = self._envpool.make(
                self.task_id,
                env_type="gymnasium",
                num_envs=self.num_envs,
                batch_size=self.batch_size,
                seed=seed,
                **self._make_options,
            )
            # The spaces are built lazily, with the same float32 warning.
            pool.single_observation_space, pool.single_action_space  # noqa: B018
        self._direct_plan(pool)
        return pool

    def _recv_arrays(self) -> tuple[Any, ...]:
        """EnvPool's ``recv()`` as ``(obs, rewards, terminated, truncated, env_ids, info)``.

        On the fast path (see :meth:`_direct_plan`) ``info`` is None (no infos are
        returned then) and ``terminated`` is computed as EnvPool's gymnasium wrapper
        does it (``done & ~trunc``).
        """
        if self._recv_index is None:
            obs, rewards, terms, truncs, info = self.pool.recv()
            return obs, rewards, terms, truncs, info["env_id"], info
        obs, rewards, done, truncs, env_ids = self._recv_get(self.pool._recv())
        # ``done & ~truncs`` in one pass (for booleans ``a > b`` is ``a and not b``).
        return obs, rewards, np.greater(done, truncs), truncs, env_ids, None

    def _send_arrays(self, actions: np.ndarray, env_ids: np.ndarray | None) -> None:
        """EnvPool's ``send(actions, env_ids)`` (all sub-envs for None), directly on the fast
        path once EnvPool's own ``send`` has checked the first action.

        The pool reads the arrays it is handed when its threads step, after this
        returns: it gets copies (in its dtypes), never the caller's arrays.
        """
        order = self._send_order
        if order is None or not self._action_checked or type(actions) is not np.ndarray:
            self.pool.send(actions, env_ids)
            self._action_checked = True
            return
        ids = self._ids if env_ids is None else env_ids.astype(np.int32)
        self.pool._send(self._send_pick((ids, actions.astype(self._action_dtype, order="C"))))

    @property
    def is_async(self) -> bool:
        """Whether ``recv()`` returns fewer than ``num_envs`` sub-envs (``batch_size < num_envs``)."""
        return self.batch_size < self.num_envs

    # -- layout -----------------------------------------------------------------------
    def _obs_out(self, obs: np.ndarray) -> np.ndarray:
        """EnvPool's ``(N, C, H, W)`` Atari frames as gymnasium's ``(N, H, W, C)``: a fresh
        array, built channel by channel (each plane read in order: ~3-4x faster here
        than copying a ``moveaxis`` view, which reads across planes; the sampler copies
        the frames into its buffers either way)."""
        if not self._channels_last:
            return obs
        return np.stack([obs[:, c] for c in range(obs.shape[1])], axis=-1)

    def _infos_out(self, info: dict | None, n: int) -> list[dict]:
        if not self.return_infos:
            return [{} for _ in range(n)]
        flat = {
            key: value
            for key, value in info.items()
            if key != "players" and isinstance(value, np.ndarray)
        }
        return [{key: value[i] for key, value in flat.items()} for i in range(n)]

    def _in_id_order(self, env_ids: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        """``arrays`` with rows sorted by ``env_ids`` (no copy when already in order)."""
        if env_ids.shape[0] == self.num_envs and (env_ids == self._ids).all():
            return arrays
        order = np.argsort(env_ids, kind="stable")
        return tuple(a[order] for a in arrays)

    # -- gymnasium VectorEnv API ------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, list[dict]]:
        """Reset every sub-env; a seed rebuilds the pool with it (EnvPool seeds at make).

        Raises:
            ConfigError: asynchronous pools start with ``async_reset()``; a seed that is
                a list (one per sub-env) is not supported by EnvPool.
        """
        if self.is_async:
            raise ConfigError(
                f"EnvPoolVectorEnv with batch_size={self.batch_size} < num_envs="
                f"{self.num_envs} is asynchronous: start it with async_reset(), then recv()/send()."
            )
        if seed is not None:
            if not isinstance(seed, int | np.integer):
                raise ConfigError(
                    f"EnvPoolVectorEnv.reset(seed=...) takes one int (sub-env i gets EnvPool's "
                    f"stream i of it), got {seed!r}"
                )
            if self._used or int(seed) != self._seed:
                self.pool.close()
                self._seed = int(seed)
                self.pool = self._make_pool(self._seed)
        self._used = True
        obs, info = self.pool.reset(options=options)
        (obs,) = self._in_id_order(info["env_id"], obs)
        return self._obs_out(obs), self._infos_out(info, self.num_envs)

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list]:
        """Step every sub-env; one whose last step ended its episode is reset instead."""
        self._send_arrays(np.asarray(actions), None)
        obs, rewards, terms, truncs, env_ids, info = self._recv_arrays()
        obs, rewards, terms, truncs = self._in_id_order(env_ids, obs, rewards, terms, truncs)
        return self._obs_out(obs), rewards, terms, truncs, self._infos_out(info, self.num_envs)

    # -- asynchronous API (EnvPool's send/recv) ---------------------------------------
    def async_reset(self, *, seed: int | None = None) -> None:
        """Reset every sub-env without waiting; ``recv()`` returns them as they are ready.

        A pool that was already reset or stepped is rebuilt (EnvPool would still
        deliver the results of actions in flight): with ``seed``, or else with the next
        seed of this pool's own sequence, so that its episodes do not repeat.
        """
        if seed is not None and not isinstance(seed, int | np.integer):
            raise ConfigError(f"EnvPoolVectorEnv.async_reset(seed=...) takes one int, got {seed!r}")
        if self._used or (seed is not None and int(seed) != self._seed):
            self.pool.close()
            if seed is None:
                seed = int(np.random.SeedSequence(self._seed).generate_state(1)[0] % 2**31)
            self._seed = int(seed)
            self.pool = self._make_pool(self._seed)
        self._used = True
        self.pool.async_reset()

    def recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list]:
        """The next ``batch_size`` ready sub-envs: ``(env_ids, obs, rewards, terminated,
        truncated, infos)``, row ``j`` belonging to sub-env ``env_ids[j]``.

        A sub-env whose previous result ended its episode comes back reset (reward 0,
        flags False) after its next ``send``, whatever action that carried.
        """
        if self._recv_index is not None and not self._channels_last:
            # ``_recv_arrays``'s fast path, inline (this is the per-batch call).
            obs, rewards, done, truncs, env_ids = self._recv_get(self.pool._recv())
            infos = [{} for _ in range(len(env_ids))]
            return env_ids, obs, rewards, np.greater(done, truncs), truncs, infos
        obs, rewards, terms, truncs, env_ids, info = self._recv_arrays()
        if self._channels_last:
            obs = self._obs_out(obs)
        infos = (
            [{} for _ in range(len(env_ids))]
            if info is None
            else self._infos_out(info, len(env_ids))
        )
        return np.asarray(env_ids), obs, rewards, terms, truncs, infos

    def send(self, actions: Any, env_ids: Any) -> None:
        """Hand ``actions[j]`` to sub-env ``env_ids[j]`` (ids as ``recv()`` returned them)."""
        if type(env_ids) is not np.ndarray:
            env_ids = np.asarray(env_ids, dtype=np.int32)
        self._send_arrays(actions if type(actions) is np.ndarray else np.asarray(actions), env_ids)

    # -- the rest of gymnasium's API ----------------------------------------------------
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Read (or call) ``name`` on the pool, once per sub-env (EnvPool has no sub-env objects)."""
        attr = getattr(self.pool, name)
        value = attr(*args, **kwargs) if callable(attr) else attr
        return (value,) * self.num_envs

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Read attribute ``name`` of the pool, once per sub-env."""
        return (getattr(self.pool, name),) * self.num_envs

    def close_extras(self, **kwargs: Any) -> None:
        """Stop the pool's threads; silently while the interpreter shuts down (a pool
        still open then is closed by ``__del__``, when ``warnings`` may be gone)."""
        pool = getattr(self, "pool", None)
        if pool is None:
            return
        if sys.is_finalizing():
            with contextlib.suppress(Exception):
                pool.close()
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pool.close()


def is_envpool_id(env: Any) -> bool:
    """Whether ``config.env`` names an EnvPool task with the ``"envpool:"`` prefix."""
    return isinstance(env, str) and env.startswith(ENVPOOL_PREFIX)


def envpool_from_config(
    env: Any, env_config: dict, num_envs: int, seed: int | None
) -> EnvPoolVectorEnv:
    """The runner's ``EnvPoolVectorEnv``: ``env_config`` holds ``envpool.make`` options
    (``batch_size``, ``num_threads``, ``max_episode_steps``, Atari's...) and
    ``return_infos``."""
    options = dict(env_config)
    return_infos = bool(options.pop("return_infos", False))
    return EnvPoolVectorEnv(env, num_envs, seed=seed, return_infos=return_infos, **options)
