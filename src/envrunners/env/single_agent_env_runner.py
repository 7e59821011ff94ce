"""``SingleAgentEnvRunner``: RLlib's new-stack single-agent runner on the fast sampler.

It builds a vector env and the module from the config, and ``sample()`` returns
``SingleAgentEpisode`` lists with RLlib's semantics (fragments, batch modes,
continuity of chunks across calls, finished episodes first). The stepping itself
happens in ``envrunners.sampling.single_agent.SingleAgentSampler``.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.connectors.connector_v2 import ConnectorPipelineV2, ConnectorV2
from envrunners.core import (
    COMPONENT_ENV_TO_MODULE_CONNECTOR,
    COMPONENT_MODULE_TO_ENV_CONNECTOR,
    COMPONENT_RL_MODULE,
    DEFAULT_AGENT_ID,
    DEFAULT_MODULE_ID,
    INPUT_ENV_SINGLE_SPACES,
    INPUT_ENV_SPACES,
)
from envrunners.env import runner_setup
from envrunners.env._runner_common import RunnerCommonMixin
from envrunners.env.env_runner import EnvRunner
from envrunners.env.single_agent_episode import SingleAgentEpisode
from envrunners.offline.episode_writer import record_episodes
from envrunners.sampling.single_agent import SingleAgentSampler, SingleAgentSampleResult
from envrunners.utils import metrics as M

__all__ = ["SingleAgentEnvRunner"]


class SingleAgentEnvRunner(RunnerCommonMixin, EnvRunner):
    """Samples a (vectorised) single-agent gymnasium env with one module.

    Args:
        config: The ``AlgorithmConfig``.
        **kwargs: ``worker_index``, ``num_workers`` and ``spaces`` (used when this
            runner has no env, e.g. the local runner of a group with remotes).
    """

    def __init__(self, *, config: Any, **kwargs: Any):
        super().__init__(config=config, **kwargs)
        self.tune_trial_id = kwargs.get("tune_trial_id")
        self.spaces: dict = kwargs.get("spaces") or {}
        self._callbacks = runner_setup.make_callbacks(self.config)
        self.num_envs = 0
        self._sampler: SingleAgentSampler | None = None
        self._needs_initial_reset = True
        self._weights_seq_no = 0
        self._time_after_sampling: float | None = None
        self._done_stats: list = []
        self._prev_chunks: dict[str, list[SingleAgentEpisode]] = defaultdict(list)
        self.module: Any = None
        self._env_to_module: ConnectorPipelineV2 = ConnectorPipelineV2()
        self._module_to_env: ConnectorPipelineV2 = ConnectorPipelineV2()
        if runner_setup.should_create_env(self.config, self.worker_index):
            self.make_env()
        else:
            self._build_connectors()
        self.make_module()

    # -- construction --------------------------------------------------------------
    def make_env(self) -> None:
        """(Re)create the vector env, its connectors and the sampler (closes the old env)."""
        if self.env is not None:
            runner_setup.close_quietly(self.env)
            self.env = None
        self.env, self._env_context = runner_setup.make_vector_env(
            self.config, self.worker_index, self.num_workers
        )
        self.num_envs = runner_setup.check_num_envs(self.env, self.config)
        rebuilt = self._sampler is not None and self._sampler.env is not None
        if rebuilt and self._spaces_unchanged():
            # A recreated env (after a failure or a config change) keeps the connector
            # state (e.g. filter statistics); the running sampler switches to it.
            self._sampler.env = self.env
            self._sampler.reward_fn = runner_setup.reward_transform(self.config)
            self._sampler.lookback = self.config.episode_lookback_horizon
        else:
            self._build_connectors()
            self._sampler = SingleAgentSampler(
                self.env,
                observation_space=self._env_to_module.observation_space,
                action_space=self.env.single_action_space,
                step_fn=self._try_env_step,
                obs_fn=self._obs_to_module,
                action_fn=self._actions_to_env,
                reward_fn=runner_setup.reward_transform(self.config),
                lookback=self.config.episode_lookback_horizon,
            )
        self._needs_initial_reset = True
        runner_setup.fire(
            self,
            "on_environment_created",
            env_runner=self,
            metrics_logger=self.metrics,
            env=self.env.unwrapped,
            env_context=self._env_context,
        )

    def _spaces_unchanged(self) -> bool:
        old = self._env_to_module.input_observation_space, self._module_to_env.input_action_space
        return old == (self.env.single_observation_space, self.env.single_action_space)

    def _build_connectors(self) -> None:
        obs_space, act_space = self._single_spaces()
        self._env_to_module, self._module_to_env = runner_setup.build_connectors(
            self.config, obs_space, act_space, env=self.env
        )

    def _single_spaces(self) -> tuple[gym.Space | None, gym.Space | None]:
        if self.env is not None:
            return self.env.single_observation_space, self.env.single_action_space
        spaces = self.spaces.get(INPUT_ENV_SINGLE_SPACES) or self.spaces.get(DEFAULT_MODULE_ID)
        if spaces:
            return spaces[0], spaces[1]
        return self.config.observation_space, self.config.action_space

    def make_module(self) -> None:
        """Build the module from ``config.rl_module_spec`` or the default MLP."""
        spaces = self.get_spaces()
        if DEFAULT_MODULE_ID not in spaces:
            self.module = None
            return
        self.module = runner_setup.build_module(self.config, spaces[DEFAULT_MODULE_ID])

    # -- connectors used by the sampler -----------------------------------------
    def _obs_to_module(self, obs: Any) -> Any:
        if not len(self._env_to_module):
            return obs
        return self._env_to_module(batch={"obs": obs}, explore=self._explore)["obs"]

    def _actions_to_env(self, actions: np.ndarray) -> Any:
        if not len(self._module_to_env):
            return actions
        batch = self._module_to_env(batch={"actions": actions}, explore=self._explore)
        return batch.get("actions_for_env", batch["actions"])

    def _act(self, obs: Any, explore: bool, t: int) -> tuple[Any, dict]:
        start = time.perf_counter()
        out = runner_setup.compute_actions(self.module, obs, explore, t)
        self._inference_time += time.perf_counter() - start
        actions = out.pop("actions")
        return actions, out

    # -- sampling ------------------------------------------------------------------
    def sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool | None = None,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[SingleAgentEpisode]:
        """Collect experience: RLlib's ``SingleAgentEnvRunner.sample`` semantics.

        With no counts, ``truncate_episodes`` returns about
        ``rollout_fragment_length * num_envs`` steps and ``complete_episodes``
        one whole episode per sub-env. Finished episodes come first, then the
        in-progress chunk of each sub-env, which the next call continues (same
        ``id_``, ``t_started`` = this chunk's ``t``).
        """
        if self.env is None:
            raise ValueError(
                f"{self} doesn't have an env! Can't call `sample()` on it (this is a "
                "group's local runner without env: set create_env_on_local_worker=True, "
                "or sample from the remote runners)."
            )
        num_timesteps, num_episodes = runner_setup.check_sample_counts(num_timesteps, num_episodes)
        start = time.perf_counter()
        if self._time_after_sampling is not None:
            self.metrics.log_value(M.TIME_BETWEEN_SAMPLING, start - self._time_after_sampling)
        self.metrics.log_value(M.WEIGHTS_SEQ_NO, self._weights_seq_no, reduce="last")
        self._explore = self.config.explore if explore is None else explore
        if num_timesteps is None and num_episodes is None:
            if self.config.batch_mode == "truncate_episodes":
                fragment = self.config.get_rollout_fragment_length(self.worker_index or 0)
                num_timesteps = fragment * self.num_envs
            else:
                num_episodes = self.num_envs
        if random_actions is False and self.module is None:
            raise ValueError(
                "this runner has no module (no action space known): sample with "
                "random_actions=True or give the runner an env/spaces."
            )
        if force_reset or num_episodes is not None or self._needs_initial_reset:
            self._reset_envs()
        if num_episodes is not None:
            self._needs_initial_reset = True
        self._inference_time = 0.0
        sampler = self._sampler
        sampler.weights_seq_no = self._weights_seq_no
        num_runners = self.config.num_env_runners or 1
        t_offset = (self.num_env_steps_sampled_lifetime // num_runners) * num_runners
        with runner_setup.torch_threads(self.config, self.worker_index):
            result = sampler.run(
                act_fn=None if random_actions else self._act,
                explore=self._explore,
                num_timesteps=num_timesteps,
                num_episodes=num_episodes,
                random_actions=random_actions,
                t_offset=t_offset,
            )
        self._record(result)
        episodes = result.episodes
        runner_setup.fire_episode_callbacks(self, result)
        runner_setup.fire(
            self, "on_sample_end", env_runner=self, metrics_logger=self.metrics, samples=episodes
        )
        record_episodes(self, episodes)  # no-op unless config.output is set
        self._time_after_sampling = time.perf_counter()
        self.metrics.log_value(M.SAMPLE_TIMER, self._time_after_sampling - start)
        return episodes

    def _reset_envs(self) -> None:
        seed = self._seed if self._needs_initial_reset else None
        obs, infos = self._try_env_reset(seed=seed)
        if isinstance(infos, dict):  # a gymnasium vector env without DictInfoToList
            infos = [{} for _ in range(self.num_envs)]
        runner_setup.check_observations(self, obs)
        self._explore = self.config.explore
        self._sampler.start(obs, infos)
        self._prev_chunks.clear()
        self._needs_initial_reset = False
        if not self.config.disable_env_checking:
            self._sampler.check_fn = lambda raw, acts: runner_setup.check_step(self, raw, acts)

    def _record(self, result: SingleAgentSampleResult) -> None:
        steps = result.env_steps
        n_done = len(result.done)
        log = self.metrics.log_value
        log(M.NUM_ENV_STEPS_SAMPLED, steps, reduce="sum")
        log(M.NUM_ENV_STEPS_SAMPLED_LIFETIME, steps, reduce="lifetime_sum", with_throughput=True)
        log((M.NUM_AGENT_STEPS_SAMPLED, DEFAULT_AGENT_ID), steps, reduce="sum")
        log((M.NUM_AGENT_STEPS_SAMPLED_LIFETIME, DEFAULT_AGENT_ID), steps, reduce="lifetime_sum")
        log((M.NUM_MODULE_STEPS_SAMPLED, DEFAULT_MODULE_ID), steps, reduce="sum")
        log((M.NUM_MODULE_STEPS_SAMPLED_LIFETIME, DEFAULT_MODULE_ID), steps, reduce="lifetime_sum")
        log(M.NUM_EPISODES, n_done, reduce="sum")
        log(M.NUM_EPISODES_LIFETIME, n_done, reduce="lifetime_sum")
        if result.num_sub_env_failures:  # whole-env failures were logged by _try_env_step
            n_failed = result.num_sub_env_failures
            log(M.NUM_ENV_STEP_FAILURES_LIFETIME, n_failed, reduce="lifetime_sum")
        if result.num_dropped_episodes:
            log("num_episodes_dropped_lifetime", result.num_dropped_episodes, reduce="lifetime_sum")
        if self.module is not None and steps:
            log(M.RLMODULE_INFERENCE_TIMER, self._inference_time / max(1, steps))
        self._log_env_timers(steps)
        self._done_stats.extend(result.episode_stats)

    # -- metrics, spaces, state ----------------------------------------------------
    def get_metrics(self) -> dict:
        """Whole-episode stats of the episodes finished since the last call, plus counters."""
        window = max(
            1,
            math.ceil(self.config.metrics_num_episodes_for_smoothing / (self.num_workers or 1)),
        )
        log = self.metrics.log_value
        for stats in self._done_stats:
            log(M.EPISODE_LEN_MEAN, stats.length, window=window)
            log(M.EPISODE_RETURN_MEAN, stats.ret, window=window)
            log(M.EPISODE_DURATION_SEC_MEAN, stats.duration_s, window=window)
            log(("agent_episode_return_mean", DEFAULT_AGENT_ID), stats.ret, window=window)
            log(("module_episode_return_mean", DEFAULT_MODULE_ID), stats.ret, window=window)
            log(M.EPISODE_LEN_MIN, stats.length, reduce="min", window=window)
            log(M.EPISODE_RETURN_MIN, stats.ret, reduce="min", window=window)
            log(M.EPISODE_LEN_MAX, stats.length, reduce="max", window=window)
            log(M.EPISODE_RETURN_MAX, stats.ret, reduce="max", window=window)
        self._done_stats = []
        return self.metrics.reduce()

    def get_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        """``__env__``, ``__env_single__`` and ``default_policy`` (module-side) spaces."""
        if self.env is None:
            obs, act = self._single_spaces()
            if obs is None or act is None:
                return dict(self.spaces)
            spaces = dict(self.spaces)
            spaces.setdefault(DEFAULT_MODULE_ID, (self._env_to_module.observation_space, act))
            return spaces
        return {
            INPUT_ENV_SPACES: (self.env.observation_space, self.env.action_space),
            INPUT_ENV_SINGLE_SPACES: (
                self.env.single_observation_space,
                self.env.single_action_space,
            ),
            DEFAULT_MODULE_ID: (
                self._env_to_module.observation_space,
                self.env.single_action_space,
            ),
        }

    def get_state(
        self,
        components: str | list[str] | None = None,
        *,
        not_components: str | list[str] | None = None,
        **kwargs: Any,
    ) -> dict:
        """Lifetime step count, module weights (+ ``weights_seq_no``) and connector states."""
        state: dict[str, Any] = {
            "num_env_steps_sampled_lifetime": self.num_env_steps_sampled_lifetime
        }
        pick = runner_setup.component_selector(components, not_components)
        if pick(COMPONENT_RL_MODULE):
            if self.module is None:
                raise AttributeError("this runner has no module; its rl_module state is undefined")
            state[COMPONENT_RL_MODULE] = self.module.get_state(
                inference_only=kwargs.get("inference_only", False)
            )
            state[M.WEIGHTS_SEQ_NO] = self._weights_seq_no
        if pick(COMPONENT_ENV_TO_MODULE_CONNECTOR):
            state[COMPONENT_ENV_TO_MODULE_CONNECTOR] = self._env_to_module.get_state()
        if pick(COMPONENT_MODULE_TO_ENV_CONNECTOR):
            state[COMPONENT_MODULE_TO_ENV_CONNECTOR] = self._module_to_env.get_state()
        return state

    def set_state(self, state: dict) -> None:
        """Apply a state; module weights only if ``weights_seq_no`` is 0 or newer than ours."""
        if COMPONENT_ENV_TO_MODULE_CONNECTOR in state:
            self._env_to_module.set_state(state[COMPONENT_ENV_TO_MODULE_CONNECTOR])
        if COMPONENT_MODULE_TO_ENV_CONNECTOR in state:
            self._module_to_env.set_state(state[COMPONENT_MODULE_TO_ENV_CONNECTOR])
        if COMPONENT_RL_MODULE in state:
            seq = int(state.get(M.WEIGHTS_SEQ_NO, 0) or 0)
            if seq == 0 or self._weights_seq_no < seq:
                weights = runner_setup.resolve_ref(state[COMPONENT_RL_MODULE])
                if isinstance(weights, dict) and DEFAULT_MODULE_ID in weights:
                    weights = weights[DEFAULT_MODULE_ID]
                self.module.set_state(weights)
            if seq > 0:
                self._weights_seq_no = max(self._weights_seq_no, seq)
        if "num_env_steps_sampled_lifetime" in state:
            self.num_env_steps_sampled_lifetime = int(state["num_env_steps_sampled_lifetime"])

    def get_weights(self, modules: Any = None) -> dict:
        """The module's weights as numpy arrays (``get_state(components="rl_module")``)."""
        return self.get_state(components=COMPONENT_RL_MODULE)[COMPONENT_RL_MODULE]

    # -- health and lifecycle ------------------------------------------------------
    def add_connector_step(self, connector: ConnectorV2, *, to_env: bool = False) -> None:
        """Append a step to the env-to-module (or module-to-env) pipeline."""
        (self._module_to_env if to_env else self._env_to_module).append(connector)

    def __repr__(self) -> str:
        return f"SingleAgentEnvRunner(worker_index={self.worker_index}, num_envs={self.num_envs})"
