"""Building blocks every runner shares: env, connectors, module, checks, callbacks.

Kept apart from the runner classes so the single-agent runner, the multi-agent
runner and the old-stack ``RolloutWorker`` build their pieces the same way and
fail with the same clear errors.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.connectors.connector_v2 import ConnectorV2
from envrunners.connectors.env_to_module import EnvToModulePipeline, MeanStdFilter
from envrunners.connectors.module_to_env import ModuleToEnvPipeline, NormalizeAndClipActions
from envrunners.connectors.module_to_env.normalize_and_clip_actions import has_box_leaf
from envrunners.connectors.reward_clipping import clip_rewards_fn
from envrunners.connectors.vector_episodes import row_of
from envrunners.core._nested import map_structure
from envrunners.core.columns import Columns
from envrunners.core.rl_module._acting import act, initial_state_batch
from envrunners.env.env_context import EnvContext
from envrunners.env.registry import (
    check_is_env,
    has_gym_vector_entry_point,
    resolve_env_creator,
)
from envrunners.env.vector.envpool_vector_env import envpool_from_config, is_envpool_id
from envrunners.env.vector.fast_sync_vector_env import FastSyncVectorEnv
from envrunners.env.vector.shared_memory_vector_env import SharedMemoryVectorEnv
from envrunners.errors import ConfigError, EnvCreatorError, SpaceError
from envrunners.sampling.buffers import RecurrentState

logger = logging.getLogger("envrunners")

_CALLBACK_EVENTS = (
    "on_environment_created",
    "on_episode_created",
    "on_episode_start",
    "on_episode_step",
    "on_episode_end",
    "on_sample_end",
)


# -- env ----------------------------------------------------------------------------
def should_create_env(config: Any, worker_index: int | None) -> bool:
    """RLlib's rule: a group's local runner (index 0 with remotes) has no env by default."""
    return (
        worker_index is None
        or worker_index > 0
        or bool(config.create_env_on_local_worker)
        or not config.num_env_runners
    )


def close_quietly(env: Any) -> None:
    """Close ``env``; a failure only logs (we are replacing or dropping it anyway)."""
    try:
        env.close()
    except Exception:  # noqa: BLE001
        logger.warning("closing the env failed", exc_info=True)


def _mode(config: Any) -> str:
    mode = config.gym_env_vectorize_mode
    return str(getattr(mode, "value", mode)).lower()


def make_env_context(config: Any, worker_index: int | None, num_workers: int | None) -> EnvContext:
    """The ``EnvContext`` handed to env creators (or ``config.env_config`` if it is one)."""
    if isinstance(config.env_config, EnvContext):
        return config.env_config
    return EnvContext(
        config.env_config or {},
        worker_index=worker_index or 0,
        num_workers=num_workers,
        remote=bool(config.remote_worker_envs),
    )


def make_vector_env(
    config: Any,
    worker_index: int | None,
    num_workers: int | None,
    *,
    batch_size: int | None = None,
) -> tuple[gym.vector.VectorEnv, EnvContext]:
    """Build the runner's vector env for ``config.gym_env_vectorize_mode``.

    ``sync`` uses ``FastSyncVectorEnv`` (per-sub-env restarts); ``async`` runs the
    sub-envs in worker processes with shared memory; ``vector_entry_point`` calls
    the creator once with ``num_envs`` and expects a gymnasium ``VectorEnv`` (a gymnasium
    id with a vector entry point goes through ``gym.make_vec``, as in RLlib); ``envpool``
    (or an ``"envpool:<task>"`` env id) steps EnvPool's C++ sub-envs, ``env_config``
    being ``envpool.make``'s options; ``shared_memory`` steps the sub-envs in worker
    processes (one per core) that write their results into shared memory.

    ``batch_size`` (the runner's choice for ``overlap_inference="auto"``) overrides the
    ready-first batch the config asks for (``ready_first_batch_size``).
    """
    ctx = make_env_context(config, worker_index, num_workers)
    n = int(config.num_envs_per_env_runner)
    mode = _mode(config)
    if batch_size is None:
        batch_size = ready_first_batch_size(config, n, ctx)
    if mode == "envpool" or is_envpool_id(config.env):
        return _envpool_env(config, ctx, n, worker_index, batch_size), ctx
    if mode == "vector_entry_point" and has_gym_vector_entry_point(config.env):
        env = gym.make_vec(
            config.env, num_envs=n, vectorization_mode="vector_entry_point", **dict(ctx)
        )
        return _infos_as_list(env), ctx
    if mode == "vector_entry_point":
        creator = resolve_env_creator(
            config.env, ctx.copy_with_overrides(env_config={**ctx, "num_envs": n})
        )
        env = creator()
        if not isinstance(env, gym.vector.VectorEnv):
            raise EnvCreatorError(
                f"gym_env_vectorize_mode='vector_entry_point' needs the creator of {config.env!r} "
                f"to return a gymnasium VectorEnv, got {type(env).__name__}."
            )
        return _infos_as_list(env), ctx
    fns = [_checked_fn(config, ctx.copy_with_overrides(vector_index=i)) for i in range(n)]
    if mode == "sync":
        env = FastSyncVectorEnv(
            fns, restart_failed=bool(config.restart_failed_sub_environments), copy=False
        )
        return env, ctx
    if mode == "async":
        env = gym.vector.AsyncVectorEnv(
            fns, shared_memory=True, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP
        )
        return _infos_as_list(env), ctx
    if mode == "shared_memory":
        return _shared_memory_env(config, fns, batch_size), ctx
    raise ConfigError(
        f"gym_env_vectorize_mode={config.gym_env_vectorize_mode!r} is not one of "
        "'sync', 'async', 'vector_entry_point', 'envpool', 'shared_memory'."
    )


def _shared_memory_env(
    config: Any, fns: list[Callable[[], gym.Env]], batch_size: int | None
) -> SharedMemoryVectorEnv:
    """``SharedMemoryVectorEnv`` recreating failed sub-envs if the config says so; stepped
    ready-first by the sampler when ``batch_size < num_envs`` (None: every sub-env per call).

    A worker that does not answer within ``sample_timeout_s`` (as for the multi-agent
    ``AsyncVectorMultiAgentEnv``) is killed and replaced, or reported.
    """
    return SharedMemoryVectorEnv(
        fns,
        batch_size=batch_size,
        restart_failed=bool(config.restart_failed_sub_environments),
        copy=False,
        timeout_s=getattr(config, "sample_timeout_s", None) or None,
    )


def _envpool_env(
    config: Any, ctx: EnvContext, n: int, worker_index: int | None, batch_size: int | None
) -> Any:
    """EnvPool's pool, seeded as the runner seeds its first reset; asynchronous (stepped
    ready-first by the sampler) when ``batch_size < n``."""
    seed = None
    if config.seed is not None:  # the runner's seed for its first reset (env_runner.py)
        seed = int(config.seed + (worker_index or 0) + 1_000_000 * bool(config.in_evaluation))
    options = dict(ctx)
    options["batch_size"] = n if batch_size is None else batch_size
    return envpool_from_config(config.env, options, n, seed)


#: Vectorize modes whose env can step asynchronously (``is_async``/``recv``/``send``):
#: ``"shared_memory"`` only counts where that mode is registered.
ASYNC_MODES = ("envpool", "shared_memory")


def can_step_async(config: Any) -> bool:
    """Whether the config's backend can step its sub-envs ready-first."""
    return _mode(config) in ASYNC_MODES or is_envpool_id(config.env)


def ready_first_batch_size(config: Any, num_envs: int, env_config: Any = None) -> int | None:
    """The ready-first batch the config asks for; None: step every sub-env together.

    ``ready_first_batch_size``, else EnvPool's own ``env_config["batch_size"]``, else
    half the sub-envs with ``overlap_inference=True``. ``"auto"`` is decided later, by
    the runner, from measured costs (``time_step_and_forward``).

    Raises:
        ConfigError: The batch is not in ``[1, num_envs_per_env_runner]``, the two
            keys disagree, or a batch below ``num_envs`` (or overlap) is asked of a
            backend that cannot step asynchronously.
    """
    explicit = getattr(config, "ready_first_batch_size", None)
    from_env = None
    if _mode(config) == "envpool" or is_envpool_id(config.env):
        from_env = (env_config or {}).get("batch_size")
    if explicit is not None and from_env is not None and int(from_env) != int(explicit):
        raise ConfigError(
            f"ready_first_batch_size={explicit} and env_config['batch_size']={from_env} "
            "disagree: set one of them (both name the sub-envs acted on per step)."
        )
    batch = explicit if explicit is not None else from_env
    name = "ready_first_batch_size" if explicit is not None else "env_config['batch_size']"
    overlap = getattr(config, "overlap_inference", "auto")
    if batch is None and overlap is True:
        if num_envs < 2:
            raise ConfigError(
                f"overlap_inference=True needs num_envs_per_env_runner >= 2 (two halves of "
                f"sub-envs), got num_envs_per_env_runner={num_envs}."
            )
        batch, name = num_envs // 2, "overlap_inference=True"
    if batch is None:
        return None
    if (
        not isinstance(batch, int | np.integer)
        or isinstance(batch, bool)
        or not (1 <= batch <= num_envs)
    ):
        raise ConfigError(
            f"{name} must be an int in [1, num_envs_per_env_runner={num_envs}] (the "
            f"sub-envs acted on per step), got {batch!r}."
        )
    if batch < num_envs and not can_step_async(config):
        raise ConfigError(
            f"{name} (a batch of {batch} of {num_envs} sub-envs) needs a backend that "
            "steps asynchronously: gym_env_vectorize_mode='envpool' (or an 'envpool:' env "
            "id) or 'shared_memory'; got gym_env_vectorize_mode="
            f"{config.gym_env_vectorize_mode!r}."
        )
    return int(batch) if batch < num_envs else None


def auto_overlap_applies(config: Any, env_config: Any, num_envs: int) -> bool:
    """Whether ``overlap_inference="auto"`` has a choice to make (else: step together)."""
    return (
        getattr(config, "overlap_inference", "auto") == "auto"
        and num_envs >= 2
        and can_step_async(config)
        and ready_first_batch_size(config, num_envs, env_config) is None
        and not (
            (_mode(config) == "envpool" or is_envpool_id(config.env))
            and (env_config or {}).get("batch_size") is not None
        )
    )


def time_step_and_forward(
    env: Any,
    act_fn: Callable[[Any], Any],
    steps: int = 8,
    random_actions: Callable[[Any], Any] | None = None,
) -> tuple[float, float]:
    """Seconds per synchronous step of all sub-envs and per forward for all of them.

    Measured briefly on the runner's (still synchronous) env: one reset, a warm-up
    step and forward, then the fastest of ``steps`` timed random-action steps and of
    ``steps`` forwards (``act_fn(raw_obs)``) on the observations they returned. The
    fastest, not the mean: on a loaded machine single steps wait milliseconds for a
    core, which says nothing about what the env costs. ``random_actions(raw_obs)``:
    the actions for those observations (default: a sample of ``env.action_space``).
    """
    obs, _ = env.reset()
    act_fn(obs)
    env_s, fwd_s = [], []
    for _ in range(steps + 1):
        a = env.action_space.sample() if random_actions is None else random_actions(obs)
        start = time.perf_counter()
        obs = env.step(a)[0]
        env_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        act_fn(obs)
        fwd_s.append(time.perf_counter() - start)
    return min(env_s[1:]), min(fwd_s[1:])


def async_reset(env: Any, seed: int | None) -> None:
    """``env.async_reset()``, seeded where the backend takes a seed there."""
    if seed is not None and "seed" in inspect.signature(env.async_reset).parameters:
        env.async_reset(seed=seed)
    else:
        env.async_reset()


def check_num_envs(env: Any, config: Any) -> int:
    """The vector env's size; ``ConfigError`` unless it is ``num_envs_per_env_runner``."""
    if env.num_envs != config.num_envs_per_env_runner:
        raise ConfigError(
            f"the vector env has {env.num_envs} sub-envs, but config."
            f"num_envs_per_env_runner={config.num_envs_per_env_runner}"
        )
    return env.num_envs


def _checked_fn(config: Any, ctx: EnvContext) -> Callable[[], gym.Env]:
    creator = resolve_env_creator(config.env, ctx)

    def build() -> gym.Env:
        return check_is_env(creator(), config.env)

    return build


def _infos_as_list(env: gym.vector.VectorEnv) -> gym.vector.VectorEnv:
    from gymnasium.wrappers.vector import DictInfoToList

    return DictInfoToList(env)


# -- connectors, rewards, module ----------------------------------------------------
_WRONG_SIGNATURE_LOGGED: set[str] = set()


def _user_connectors(config: Any, key: str, env: Any, spaces: Any, device: Any) -> list:
    """Call ``config.<key>`` as RLlib does: ``fn(env, spaces[, device])``, else ``fn(env)``.

    The one-argument fallback happens, as in RLlib 2.60, when the call raises a
    TypeError about a positional argument (an old ``fn(env)`` signature). The
    function may return a connector (a pipeline counts as one) or a list of them.
    """
    fn = getattr(config, key, None)
    if fn is None:
        return []
    args = (env, spaces, device) if key == "env_to_module_connector" else (env, spaces)
    try:
        made = fn(*args)
    except TypeError as err:
        if not (err.args and "positional argument" in str(err.args[0])):
            raise
        if key not in _WRONG_SIGNATURE_LOGGED:
            _WRONG_SIGNATURE_LOGGED.add(key)
            wanted = "env, spaces, device" if len(args) == 3 else "env, spaces"
            logger.error(
                "Your `config.%s` function seems to have a wrong or outdated signature! It "
                "should be: `def myfunc(%s): ...`; calling it as `myfunc(env)`.",
                key,
                wanted,
            )
        made = fn(env)
    if isinstance(made, ConnectorV2):
        return [made]
    if isinstance(made, list | tuple):
        return list(made)
    raise ConfigError(
        f"`AlgorithmConfig.env_runners({key}=..)` must return a ConnectorV2 object or a list "
        f"thereof to be added to a connector pipeline! Your function returned {made!r}."
    )


def build_connectors(
    config: Any,
    obs_space: gym.Space | None,
    act_space: gym.Space | None,
    env: Any = None,
    spaces: dict[str, tuple[gym.Space, gym.Space]] | None = None,
) -> tuple[EnvToModulePipeline, ModuleToEnvPipeline]:
    """The env-to-module and module-to-env pipelines from the config.

    Env-to-module: the user's pieces (``config.env_to_module_connector(env, spaces,
    device)``), then the observation filter (``observation_filter``). Module-to-env:
    the user's pieces (``config.module_to_env_connector(env, spaces)``), then, with
    ``add_default_connectors_to_module_to_env_pipeline`` (default True),
    ``NormalizeAndClipActions`` for an action space with a Box leaf, as RLlib appends
    it. RLlib's other default pieces (batching, tensors, ``GetActions``) are what the
    sampler and ``_acting.act`` do themselves, so no piece stands for them.

    Args:
        spaces: Passed to the user's functions: ``{"__env__": (obs, act) of the
            vector env, "__env_single__": (obs, act) of one sub-env}`` (RLlib's layout).
    """
    import torch

    e2m: list[ConnectorV2] = _user_connectors(
        config, "env_to_module_connector", env, spaces, torch.device("cpu")
    )
    obs_filter = getattr(config, "observation_filter", "NoFilter")
    if obs_filter == "MeanStdFilter" or obs_filter == "ConcurrentMeanStdFilter":
        e2m.append(MeanStdFilter())
    elif obs_filter not in (None, "NoFilter"):
        raise ConfigError(
            f"observation_filter={obs_filter!r} is not supported by the new-stack runners: "
            "use 'NoFilter' or 'MeanStdFilter'."
        )
    m2e: list[ConnectorV2] = _user_connectors(config, "module_to_env_connector", env, spaces, None)
    add_defaults = getattr(config, "add_default_connectors_to_module_to_env_pipeline", True)
    if add_defaults and has_box_leaf(act_space):
        m2e.append(
            NormalizeAndClipActions(
                normalize_actions=bool(config.normalize_actions),
                clip_actions=bool(config.clip_actions),
            )
        )
    return (
        EnvToModulePipeline(obs_space, act_space, e2m),
        ModuleToEnvPipeline(obs_space, act_space, m2e),
    )


def reward_transform(config: Any) -> Callable[[np.ndarray], np.ndarray] | None:
    """``config.clip_rewards`` as a function of the reward batch (None = keep)."""
    return clip_rewards_fn(config.clip_rewards)


#: Why a runner of a base ``AlgorithmConfig`` has no module (and samples randomly).
NO_DEFAULT_MODULE = (
    "a base AlgorithmConfig has no default module, as in RLlib; set "
    "config.rl_module(rl_module_spec=RLModuleSpec(...)) or use an algorithm's config "
    "(e.g. PPOConfig)"
)


def builds_module(config: Any) -> bool:
    """Whether a runner builds a module for ``config`` (else it samples random actions).

    As in RLlib, the base ``AlgorithmConfig`` has no default module: without an
    ``rl_module_spec`` its runners have none. Algorithm configs (``PPOConfig``,
    ``PGConfig``, subclasses) get the default module; a config class may say
    otherwise with ``get_default_rl_module_spec`` raising ``NotImplementedError``.
    """
    if getattr(config, "rl_module_spec", None) is not None:
        return True
    default = getattr(config, "get_default_rl_module_spec", None)
    if default is not None:
        try:
            default()
        except NotImplementedError:
            return False
        return True
    cls = type(config)
    return not (cls.__name__ == "AlgorithmConfig" and cls.__module__.startswith("envrunners."))


def build_module(config: Any, spaces: tuple[gym.Space, gym.Space], inference_only: bool = True):
    """Build the RLModule for one module id from ``config.rl_module_spec`` or the default."""
    from envrunners.core.rl_module import default_torch_rl_module as default_model
    from envrunners.core.rl_module.rl_module import RLModuleSpec

    obs_space, act_space = spaces
    spec = getattr(config, "rl_module_spec", None)
    model_config = dict(getattr(config, "model_config", None) or {})
    if spec is None:
        spec = default_model.default_rl_module_spec(
            obs_space, act_space, model_config=model_config, inference_only=inference_only
        )
    elif isinstance(spec, RLModuleSpec):
        spec = RLModuleSpec(
            module_class=spec.module_class,
            observation_space=spec.observation_space or obs_space,
            action_space=spec.action_space or act_space,
            inference_only=spec.inference_only or inference_only,
            learner_only=spec.learner_only,
            model_config={**model_config, **(spec.model_config or {})},
            catalog_class=spec.catalog_class,
            load_state_path=spec.load_state_path,
        )
        if spec.module_class is None:
            spec = default_model.default_rl_module_spec(
                spec.observation_space,
                spec.action_space,
                model_config=spec.model_config,
                inference_only=inference_only,
            )
    else:
        raise ConfigError(
            f"config.rl_module_spec must be an RLModuleSpec, got {type(spec).__name__}"
        )
    module = spec.build()
    if hasattr(module, "eval"):
        module.eval()
    return module


def compute_actions(module: Any, obs: Any, explore: bool, t: int) -> dict[str, np.ndarray]:
    """Actions (and extra model outputs) of a stateless module for a batch, as numpy.

    The default module's numpy fast path is called directly (what ``_acting.act``
    does for it, without its ~1 us dispatch: the stateless loops are the hot
    ones); any other module goes through ``_acting.act``, with the timestep ``t``
    passed to its forward pass.
    """
    fast = getattr(module, "compute_actions_numpy", None)
    if fast is not None:
        return fast(obs, explore=explore)
    actions, out, _ = act(module, obs, explore, t=t)
    out[Columns.ACTIONS] = actions
    return out


def recurrent_state(module: Any, num_envs: int, action_space: gym.Space) -> RecurrentState | None:
    """The sampler's per-sub-env state column for a stateful module (None if stateless).

    Feeds ``prev_actions`` / ``prev_rewards`` when the module's ``model_config`` asks
    for them (``lstm_use_prev_action`` / ``lstm_use_prev_reward``).
    """
    if module is None or not module.is_stateful():
        return None
    model_config = getattr(module, "model_config", None) or {}
    initial = map_structure(lambda leaf: leaf[0], initial_state_batch(module, 1))
    return RecurrentState(
        initial,
        num_envs,
        prev_action_example=(
            action_space.sample() if model_config.get("lstm_use_prev_action") else None
        ),
        prev_rewards=bool(model_config.get("lstm_use_prev_reward")),
    )


@contextlib.contextmanager
def torch_rng_kept() -> Iterator[None]:
    """Run a block that draws from torch's global RNG (timing forwards that sample
    actions), then put that RNG back as it was: the block leaves no trace in later draws."""
    import torch

    state = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(state)


@contextlib.contextmanager
def torch_threads(config: Any, worker_index: int | None) -> Iterator[None]:
    """Run inference with the runner's thread count (1 by default), then restore.

    Both torch's intra-op threads and numpy's BLAS threads (the default module's
    acting forward runs on numpy): a runner uses the CPUs it asked for
    (``num_cpus_per_env_runner``), not every core, and BLAS threads do not spin
    on cores that env stepping or other runners need.
    """
    import torch

    # A fractional share (num_cpus_per_env_runner=0.5) still runs on one thread.
    wanted = max(1, int(getattr(config, "num_cpus_per_env_runner", 1) or 1))
    before = torch.get_num_threads()
    if wanted != before:
        torch.set_num_threads(wanted)
    blas = _blas_pools()
    try:
        with blas.limit(limits=wanted) if blas is not None else contextlib.nullcontext():
            yield
    finally:
        if wanted != before:
            torch.set_num_threads(before)


#: ``(len(sys.modules) when found, threadpoolctl's BLAS handle or None)``.
_BLAS_POOLS: list[tuple[int, Any]] = []


def _blas_pools() -> Any:
    """threadpoolctl's handle on the loaded BLAS libraries, or None.

    Found again whenever modules were imported since the last look: an import can
    load another BLAS (opencv ships its own), which must be limited too. In steady
    sampling nothing is imported, so this is one ``len`` per ``sample()``.
    """
    loaded = len(sys.modules)
    if not _BLAS_POOLS or _BLAS_POOLS[0][0] != loaded:
        try:
            from threadpoolctl import ThreadpoolController

            pools = ThreadpoolController().select(user_api="blas")
        except Exception:  # threadpoolctl missing or unable to inspect this process
            pools = None
        _BLAS_POOLS[:] = [
            (len(sys.modules), pools if pools is not None and pools.lib_controllers else None)
        ]
    return _BLAS_POOLS[0][1]


# -- checks -------------------------------------------------------------------------
def check_sample_counts(
    num_timesteps: int | None, num_episodes: int | None
) -> tuple[int | None, int | None]:
    """Validate ``sample()`` counts (AssertionError like RLlib, with a clear message)."""
    assert not (num_timesteps is not None and num_episodes is not None), (
        "Provide either `num_timesteps` or `num_episodes`. Both provided here: "
        f"num_timesteps={num_timesteps}, num_episodes={num_episodes}"
    )
    for name, value in (("num_timesteps", num_timesteps), ("num_episodes", num_episodes)):
        if value is not None:
            assert isinstance(value, int | np.integer) and value >= 0, (
                f"`{name}` must be a non-negative int, got {value!r}"
            )
    return num_timesteps, num_episodes


def check_observations(runner: Any, obs: Any) -> None:
    """Raise ``SpaceError`` if a sub-env's observation lies outside its space."""
    if runner.config.disable_env_checking:
        return
    space = runner.env.single_observation_space
    for i in range(_batch_rows(obs, runner.num_envs)):
        item = row_of(obs, i)
        if not space.contains(item):
            raise SpaceError(
                f"sub-environment {i} returned observation {item!r}, which is not in its "
                f"observation_space {space}. Fix the env (or its observation_space), or set "
                "config.environment(disable_env_checking=True) to skip this check."
            )


def _batch_rows(batch: Any, default: int) -> int:
    """Rows of a (possibly nested) batch: a ready-first batch has fewer than ``num_envs``."""
    while isinstance(batch, dict | tuple | list) and batch:
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else default


def check_step(runner: Any, raw_obs: Any, actions: Any) -> None:
    """Check the first step's observations and actions against the spaces."""
    check_observations(runner, raw_obs)
    space = runner.env.single_action_space
    for i in range(_batch_rows(actions, runner.num_envs)):
        action = row_of(actions, i)
        if not isinstance(action, dict | tuple):  # (nested actions: their leaves as they are)
            action = np.asarray(action, dtype=getattr(space, "dtype", None))
        if not space.contains(action):
            raise SpaceError(
                f"action {action!r} for sub-environment {i} is not in the action_space {space}. "
                "For Box spaces set config.environment(clip_actions=True) or keep "
                "normalize_actions=True; otherwise fix the module's output."
            )


# -- state helpers ------------------------------------------------------------------
def component_selector(
    components: str | list[str] | None, not_components: str | list[str] | None
) -> Callable[[str], bool]:
    """``pick(name)``: RLlib's component selection (paths like ``rl_module/p0`` count)."""

    def norm(x: str | list[str] | None) -> list[str]:
        return [] if x is None else [x] if isinstance(x, str) else list(x)

    wanted, unwanted = norm(components), norm(not_components)

    def pick(name: str) -> bool:
        def hit(items: list[str]) -> bool:
            return any(c == name or c.startswith(name + "/") for c in items)

        if wanted and not hit(wanted):
            return False
        return not any(c == name for c in unwanted)

    return pick


def resolve_ref(value: Any) -> Any:
    """``ray.get`` an ObjectRef; anything else is returned as is."""
    if type(value).__name__ == "ObjectRef":
        import ray

        return ray.get(value)
    return value


# -- callbacks ----------------------------------------------------------------------
def make_callbacks(config: Any) -> list[Any]:
    """Instantiate ``config.callbacks_class`` (a class or a list of classes)."""
    classes = getattr(config, "callbacks_class", None)
    if classes is None:
        return []
    if not isinstance(classes, list | tuple):
        classes = [classes]
    return [cls() if isinstance(cls, type) else cls for cls in classes]


def _functions(config: Any, event: str) -> list[Callable[..., Any]]:
    fns = getattr(config, f"callbacks_{event}", None)
    if fns is None:
        return []
    return list(fns) if isinstance(fns, list | tuple) else [fns]


def has_callbacks(runner: Any, event: str) -> bool:
    """Whether any callback object or function listens to ``event``."""
    return bool(_functions(runner.config, event)) or any(
        hasattr(cb, event) for cb in runner._callbacks
    )


def fire(runner: Any, event: str, **kwargs: Any) -> None:
    """Call ``event`` on every callback object, then every registered function."""
    for cb in runner._callbacks:
        method = getattr(cb, event, None)
        if method is not None:
            method(**kwargs)
    for fn in _functions(runner.config, event):
        fn(**kwargs)


def fire_episode_callbacks(runner: Any, result: Any) -> None:
    """Episode callbacks for one ``sample()`` call, fired after it returns.

    ``on_episode_start``/``on_episode_created`` for episodes that began in the call,
    ``on_episode_step`` once per env step with the chunk holding that step, and
    ``on_episode_end`` (with ``prev_episode_chunks``) for finished episodes.
    """
    events = [e for e in _CALLBACK_EVENTS[1:5] if has_callbacks(runner, e)]
    if not events:
        return
    common = {
        "env_runner": runner,
        "metrics_logger": runner.metrics,
        "env": runner.env.unwrapped if runner.env is not None else None,
        "rl_module": runner.module,
    }
    prev = runner._prev_chunks
    groups = (
        ("done", result.done, result.done_env_index),
        ("ongoing", result.ongoing, result.ongoing_env_index),
    )
    for kind, episodes, env_indices in groups:
        for episode, env_index in zip(episodes, env_indices):
            kw = {**common, "episode": episode, "env_index": env_index}
            if episode.t_started == 0:
                if "on_episode_created" in events:
                    fire(runner, "on_episode_created", **kw)
                if "on_episode_start" in events:
                    fire(runner, "on_episode_start", **kw)
            if "on_episode_step" in events:
                for _ in range(len(episode)):
                    fire(runner, "on_episode_step", **kw)
            if kind == "done":
                chunks = prev.pop(episode.id_, [])
                if "on_episode_end" in events:
                    fire(runner, "on_episode_end", prev_episode_chunks=chunks, **kw)
            else:
                prev[episode.id_].append(episode)
