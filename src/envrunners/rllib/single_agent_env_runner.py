"""RLlib's ``SingleAgentEnvRunner`` with ``sample()`` stepping through envrunners' core.

A subclass of ``ray.rllib.env.single_agent_env_runner.SingleAgentEnvRunner``: RLlib
builds the env (``make_env``), the connector pipelines and its own RLModule from
the config's ``rl_module_spec`` exactly as for its own runner, and ``sample()``,
``get_state``/``set_state``, checkpointing, ``get_spaces`` and fault tolerance are
RLlib's. Only ``_sample`` (the stepping) differs: ``SingleAgentSampler`` runs one
batched forward per vector step (``ModuleActor``: RLlib's default connector work
on the whole batch), writes column buffers, and the returned RLlib
``SingleAgentEpisode``s are built once per call from them. A runner whose
pipelines hold user connectors, or whose config sets per-episode callbacks, samples
RLlib's own way (logged once at INFO) so those still run.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.rllib.callbacks.utils import make_callback
from ray.rllib.core import DEFAULT_AGENT_ID, DEFAULT_MODULE_ID
from ray.rllib.env.single_agent_env_runner import (
    SingleAgentEnvRunner as RLlibSingleAgentEnvRunner,
)
from ray.rllib.utils.metrics import (
    ENV_STEP_TIMER,
    EPISODE_DURATION_SEC_MEAN,
    EPISODE_LEN_MAX,
    EPISODE_LEN_MEAN,
    EPISODE_LEN_MIN,
    EPISODE_RETURN_MAX,
    EPISODE_RETURN_MEAN,
    EPISODE_RETURN_MIN,
    RLMODULE_INFERENCE_TIMER,
)

from envrunners.env.runner_setup import check_num_envs, close_quietly, make_vector_env
from envrunners.env.vector.envpool_vector_env import is_envpool_id
from envrunners.rllib._env_steps import step_with_rllib_failure_handling
from envrunners.rllib._episodes_to_rllib import RLlibEpisodeList, to_rllib_episode
from envrunners.rllib._module_acting import (
    DEFAULT_ENV_TO_MODULE,
    DEFAULT_MODULE_TO_ENV,
    ModuleActor,
    action_fn_for,
    custom_connectors,
    episode_callbacks_in_use,
)
from envrunners.sampling.buffers import RecurrentState
from envrunners.sampling.single_agent import SingleAgentSampler

__all__ = ["SingleAgentEnvRunner"]

logger = logging.getLogger(__name__)

#: What RLlib 2.60's ``_log_episode_metrics`` logs per episode: key, ``EpisodeStats`` field.
_EPISODE_METRICS = (
    (EPISODE_LEN_MEAN, "length"),
    (EPISODE_RETURN_MEAN, "ret"),
    (EPISODE_DURATION_SEC_MEAN, "duration_s"),
    (("agent_episode_return_mean", DEFAULT_AGENT_ID), "ret"),
    (("module_episode_return_mean", DEFAULT_MODULE_ID), "ret"),
    (EPISODE_LEN_MIN, "length"),
    (EPISODE_RETURN_MIN, "ret"),
    (EPISODE_LEN_MAX, "length"),
    (EPISODE_RETURN_MAX, "ret"),
)


class SingleAgentEnvRunner(RLlibSingleAgentEnvRunner):
    """RLlib's single-agent runner, sampling through envrunners' batched loop.

    Use it with one config line::

        config.env_runners(env_runner_cls=envrunners.rllib.SingleAgentEnvRunner)

    Attributes:
        uses_rllib_sampling: Why this runner samples RLlib's own way (user connectors
            or per-episode callbacks), or ``None`` when it uses envrunners' loop.
    """

    def __init__(self, *, config: Any, **kwargs: Any):
        self._sampler: SingleAgentSampler | None = None
        super().__init__(config=config, **kwargs)
        #: ``EpisodeStats`` of finished episodes not yet reported by ``get_metrics``.
        self._finished_stats: list[Any] = []
        self._env_step_s, self._env_step_calls = 0.0, 0
        self.uses_rllib_sampling = self._rllib_sampling_reason()
        if self.uses_rllib_sampling is not None:
            logger.info(
                "envrunners.rllib.SingleAgentEnvRunner samples with RLlib's own loop: %s",
                self.uses_rllib_sampling,
            )
            self._actor = None
            return
        self._actor = (
            ModuleActor(self.module, self._device, self._exploration_t)
            if (self.module is not None)
            else None
        )
        if self.env is not None:
            self._build_sampler()

    # -- setup ---------------------------------------------------------------------
    def _rllib_sampling_reason(self) -> str | None:
        """Why the batched loop cannot stand in for RLlib's here (None: it can)."""
        reasons = []
        custom = custom_connectors(self._env_to_module, DEFAULT_ENV_TO_MODULE)
        custom += custom_connectors(self._module_to_env, DEFAULT_MODULE_TO_ENV)
        if custom:
            reasons.append(f"custom connectors {custom}")
        callbacks = episode_callbacks_in_use(self.config)
        if callbacks:
            reasons.append(f"per-episode callbacks {callbacks}")
        return "; ".join(reasons) or None

    def _build_sampler(self) -> None:
        sampler = SingleAgentSampler(
            self.env,
            observation_space=self.env.single_observation_space,
            action_space=self.env.single_action_space,
            step_fn=self._step_env,
            action_fn=action_fn_for(self.config, self.env.single_action_space),
            lookback=self.config.episode_lookback_horizon,
        )
        if self._actor is not None and self._actor.stateful:
            sampler.recurrent = RecurrentState(self._actor.initial_state(), self.num_envs)
        self._sampler = sampler

    def make_env(self) -> None:
        """The vector env from envrunners' construction where it can express the config.

        ``gym_env_vectorize_mode="sync"`` gives ``FastSyncVectorEnv`` (sub-envs built as
        RLlib builds them, no per-step copies, per-sub-env restarts), an ``"envpool:"``
        id (or mode ``"envpool"``) EnvPool's C++ pool; any other mode, and a runner
        sampling RLlib's way (user connectors, per-episode callbacks), gets RLlib's
        ``make_env``. The sampler then steps it.
        """
        if not self._own_env_construction():
            super().make_env()
        else:
            if self.env is not None:
                close_quietly(self.env)
            self.env, env_ctx = make_vector_env(self.config, self.worker_index, self.num_workers)
            self.num_envs = check_num_envs(self.env, self.config)
            self._needs_initial_reset = True
            make_callback(
                "on_environment_created",
                callbacks_objects=self._callbacks,
                callbacks_functions=self.config.callbacks_on_environment_created,
                kwargs=dict(
                    env_runner=self,
                    metrics_logger=self.metrics,
                    env=self.env.unwrapped,
                    env_context=env_ctx,
                ),
            )
        if self._sampler is not None:
            self._sampler.env = self.env

    def _own_env_construction(self) -> bool:
        """Whether ``make_env`` builds the env with envrunners' construction."""
        config = self.config
        if is_envpool_id(config.env):
            return True  # RLlib's make_env cannot build these
        if episode_callbacks_in_use(config) or not config.env:
            return False
        if (
            getattr(config, "_env_to_module_connector", None) is not None
            or getattr(config, "_module_to_env_connector", None) is not None
            or not config.add_default_connectors_to_env_to_module_pipeline
            or not config.add_default_connectors_to_module_to_env_pipeline
        ):
            # RLlib's loop keeps views of the env's observation batch in its episodes;
            # FastSyncVectorEnv reuses that batch, so RLlib's loop gets RLlib's env.
            return False
        mode = config.gym_env_vectorize_mode
        return str(getattr(mode, "value", mode)).lower() in ("sync", "envpool")

    # -- stepping ------------------------------------------------------------------
    def _exploration_t(self, ts: int) -> int:
        """The ``t`` RLlib's runner passes to ``forward_exploration`` after ``ts`` steps.

        Its estimate of the algorithm's global env steps: this runner's lifetime
        steps (synced by the algorithm) plus this call's, times the runner count.
        """
        n = self.config.num_env_runners or 1
        return (self.num_env_steps_sampled_lifetime // n + ts) * n

    def _step_env(self, actions: Any) -> Any:
        """``env.step`` with RLlib's failure handling (recreate the env or raise)."""
        return step_with_rllib_failure_handling(self, actions, self._after_env_recreated)

    def _after_env_recreated(self) -> None:
        # The sampler resets the new env and starts fresh episodes.
        self._needs_initial_reset = False

    def _sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list:
        """Sample through ``SingleAgentSampler``; RLlib's own ``_sample`` where needed."""
        if self._sampler is None:
            return super()._sample(
                num_timesteps=num_timesteps,
                num_episodes=num_episodes,
                explore=explore,
                random_actions=random_actions,
                force_reset=force_reset,
            )
        sampler = self._sampler
        if force_reset or num_episodes is not None or self._needs_initial_reset:
            # Seeded only on the first reset, as RLlib's runner does.
            obs, infos = self._try_env_reset(
                seed=self._seed if self._needs_initial_reset else None, options=None
            )
            sampler.env = self.env  # a failed reset may have recreated it
            sampler.start(obs, infos)
            self._needs_initial_reset = False
        if num_episodes is not None:
            self._needs_initial_reset = True
        sampler.weights_seq_no = self._weights_seq_no
        actor = self._actor
        act_fn = None
        if actor is not None and not random_actions:
            act_fn = actor.act_stateful if actor.stateful else actor.act
            actor.forward_s, actor.forward_calls = 0.0, 0
        self._env_step_s, self._env_step_calls = 0.0, 0
        if act_fn is not None:
            actor.begin()
        try:
            result = sampler.run(
                act_fn=act_fn,
                explore=explore,
                num_timesteps=num_timesteps,
                num_episodes=num_episodes,
                random_actions=random_actions or actor is None,
            )
        finally:
            if act_fn is not None:
                actor.end()
        ts = result.env_steps
        obs_space, act_space = self.env.single_observation_space, self.env.single_action_space
        lists = not self.episodes_to_numpy  # RLlib's list buffers, not finalized
        done = [
            to_rllib_episode(ep, obs_space, act_space, stats.duration_s, lists)
            for ep, stats in zip(result.done, result.episode_stats)
        ]
        ongoing = [
            to_rllib_episode(ep, obs_space, act_space, as_lists=lists) for ep in result.ongoing
        ]
        self._finished_stats.extend(result.episode_stats)
        # RLlib's per-call timers, logged once per sample() as the mean per vector step.
        if self._env_step_calls:
            self.metrics.log_value(ENV_STEP_TIMER, self._env_step_s / self._env_step_calls)
        if act_fn is not None and actor.forward_calls:
            self.metrics.log_value(RLMODULE_INFERENCE_TIMER, actor.forward_s / actor.forward_calls)
        self._log_env_steps(metric=self._metrics_num_env_steps_sampled, num_steps=ts)
        self._increase_sampled_metrics(ts, len(done))
        return RLlibEpisodeList(done + ongoing)

    # -- metrics -------------------------------------------------------------------
    def get_metrics(self) -> Any:
        """RLlib's metrics; the batched loop's finished episodes logged with RLlib's keys."""
        if self._finished_stats:
            self._log_finished_episodes(self._finished_stats)
            self._finished_stats.clear()
        return super().get_metrics()

    def _log_finished_episodes(self, finished: list[Any]) -> None:
        """``_log_episode_metrics`` per finished episode, its values pushed per key.

        The first episode goes through RLlib's method (creating the stats objects
        with its reduce and window); the others' values are pushed into those same
        objects key by key, what RLlib's ``log_value`` calls end in, without their
        per-call key lookups. A subclass overriding ``_log_episode_metrics`` gets
        it called per episode.
        """
        first = finished[0]
        self._log_episode_metrics(first.length, first.ret, first.duration_s)
        rest = finished[1:]
        if type(self)._log_episode_metrics is not RLlibSingleAgentEnvRunner._log_episode_metrics:
            for stats in rest:
                self._log_episode_metrics(stats.length, stats.ret, stats.duration_s)
            return
        for key, field in _EPISODE_METRICS:
            push = self.metrics._get_key(key).push
            for stats in rest:
                push(getattr(stats, field))
