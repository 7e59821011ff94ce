"""``MultiAgentEnvRunner`` for RLlib's own algorithms: RLlib's runner, our multi-agent loop.

Use: ``config.env_runners(env_runner_cls=envrunners.rllib.MultiAgentEnvRunner)``.
It subclasses ``ray.rllib.env.multi_agent_env_runner.MultiAgentEnvRunner`` and
inherits everything RLlib's Algorithm, EnvRunnerGroup, fault tolerance and
checkpointing talk to: the env (RLlib's ``make_env``: a vector env of RLlib
``MultiAgentEnv`` instances), the ``MultiRLModule`` (RLlib's ``make_module``, so
learner weights fit), ``sample()``'s bookkeeping (timers, ``on_sample_end``),
``get_metrics`` and ``get_state`` / ``set_state``. Only ``_sample`` is replaced:
the steps go through ``envrunners.sampling.multi_agent.MultiAgentSampler`` (one
forward per module per vector step, RLlib's modules called by
``_multi_agent_acting.ModuleActing``), and the chunks it returns become RLlib
``MultiAgentEpisode`` objects once per call. Stateful (recurrent) modules carry
one state row per agent in the sampler (initial state at the agent's episode
start, ``STATE_OUT`` recorded per agent step as RLlib's runner records it).
With custom connectors or episode callbacks, RLlib's own ``_sample`` runs
instead (logged once).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.env.multi_agent_env_runner import (
    MultiAgentEnvRunner as RLlibMultiAgentEnvRunner,
)
from ray.rllib.utils import metrics as M
from ray.rllib.utils.metrics import ENV_STEP_TIMER

from envrunners.env.multi_agent_episode import MultiAgentEpisode
from envrunners.rllib._env_steps import step_with_rllib_failure_handling
from envrunners.rllib._multi_agent_acting import (
    ModuleActing,
    action_transforms,
    user_connectors,
    why_not_ours,
)
from envrunners.rllib._multi_agent_episodes import to_rllib_episode
from envrunners.sampling.multi_agent import MultiAgentSampler, MultiAgentSampleResult

__all__ = ["MultiAgentEnvRunner"]

logger = logging.getLogger("envrunners")

_NO_CONTEXT = contextlib.nullcontext()
_EPISODE_EVENTS = ("on_episode_created", "on_episode_start", "on_episode_step", "on_episode_end")


class MultiAgentEnvRunner(RLlibMultiAgentEnvRunner):
    """RLlib's ``MultiAgentEnvRunner`` whose ``_sample`` runs through envrunners' loop.

    Args:
        config: RLlib's multi-agent ``AlgorithmConfig`` (``policies``,
            ``policy_mapping_fn``, ``policies_to_train``).
        **kwargs: What RLlib passes (``worker_index``, ``num_workers``, ``spaces``).
    """

    def __init__(self, config: Any, **kwargs: Any):
        self._core: MultiAgentSampler | None = None
        self._core_env: Any = None
        self._core_in_use = False
        self._fallback_logged = False
        super().__init__(config=config, **kwargs)

    # -- the loop ------------------------------------------------------------------
    def _sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list:
        """RLlib's ``_sample`` contract (episodes: finished first, then ongoing chunks)."""
        reason = self._why_rllib_loop(random_actions)
        if reason is not None:
            if not self._fallback_logged:
                logger.info(
                    "envrunners.rllib.MultiAgentEnvRunner: %s, so RLlib's own sampling loop "
                    "runs (its connectors and callbacks included).",
                    reason,
                )
                self._fallback_logged = True
            if self._core_in_use:  # RLlib's loop cannot continue our episodes
                self._core_in_use = False
                force_reset = True
            return super()._sample(
                num_timesteps=num_timesteps,
                num_episodes=num_episodes,
                explore=explore,
                random_actions=random_actions,
                force_reset=force_reset,
            )
        return self._sample_with_core(
            num_timesteps=num_timesteps,
            num_episodes=num_episodes,
            explore=explore,
            random_actions=random_actions,
            force_reset=force_reset,
        )

    @property
    def uses_rllib_sampling(self) -> str | None:
        """Why ``sample()`` runs RLlib's own loop (as the single-agent runner's attribute
        says), or None when it runs ours. Random-action calls may still run ours."""
        return self._why_rllib_loop(random_actions=False)

    def _why_rllib_loop(self, random_actions: bool) -> str | None:
        """Why RLlib's own loop must run (None: ours runs)."""
        events = [e for e in _EPISODE_EVENTS if self._listens(e)]
        if events:
            return f"episode callbacks {events} are configured"
        sub_envs = getattr(self.env, "envs", None)
        if not sub_envs:
            return f"the vector env {type(self.env).__name__} exposes no sub-envs (`envs`)"
        if self._agent_spaces() is None:
            return (
                "the env declares neither `possible_agents` nor per-agent `observation_spaces` "
                "and `action_spaces` (our loop needs every agent's spaces up front)"
            )
        if random_actions:  # no forward; RLlib's loop still runs user connectors
            if self.module is None:
                return None
            return user_connectors(self._env_to_module, self._module_to_env)
        return why_not_ours(self.config, self.module, self._env_to_module, self._module_to_env)

    def _listens(self, event: str) -> bool:
        """Whether a callback object or function of the config handles ``event``."""
        if getattr(self.config, f"callbacks_{event}", None):
            return True
        default = getattr(RLlibCallback, event)
        return any(getattr(type(cb), event, default) is not default for cb in self._callbacks)

    def _sample_with_core(
        self,
        *,
        num_timesteps: int | None,
        num_episodes: int | None,
        explore: bool,
        random_actions: bool,
        force_reset: bool,
    ) -> list:
        core = self._get_core()
        if not self._core_in_use:  # the first call, or RLlib's loop ran last
            force_reset = True
        reset = force_reset or num_episodes is not None or self._needs_initial_reset
        if reset or not core.started:
            self._ongoing_episodes_for_metrics.clear()
            core.start()
        self._core_in_use = True
        if num_episodes is not None:
            self._needs_initial_reset = True
        core.weights_seq_no = self._weights_seq_no
        num_runners = self.config.num_env_runners or 1
        if self.module is not None:  # per-agent recurrent state rows (reset with the episodes)
            core.use_states({mid: m for mid, m in self.module.items() if m.is_stateful()})
        acting = None
        if not random_actions:
            acting = ModuleActing(
                dict(self.module.items()),
                self._device,
                self.num_env_steps_sampled_lifetime // num_runners,
                num_runners,
            )
        self._env_step_s, self._env_step_calls = 0.0, 0
        try:
            with acting if acting is not None else _NO_CONTEXT:
                result = core.run(
                    act_fn=acting,
                    explore=explore,
                    num_timesteps=num_timesteps,
                    num_episodes=num_episodes,
                    count_agent_steps=self.config.count_steps_by == "agent_steps",
                    defer_extras=bool(self.episodes_to_numpy),
                )
        except BaseException:
            core.started = False  # episodes in flight are inconsistent: reset next time
            raise
        episodes = self._to_rllib(result)
        self._log_sampled(result, acting)
        return episodes

    def _to_rllib(self, result: MultiAgentSampleResult) -> list:
        """RLlib episodes for the finished and cut chunks; registered for metrics as RLlib does."""
        mapping_fn = self.config.policy_mapping_fn
        numpy = self.episodes_to_numpy
        done = []
        for episode in result.done:
            rl_episode = to_rllib_episode(episode, mapping_fn)
            if numpy:
                rl_episode.to_numpy()
            done.append(rl_episode)
        ongoing = []
        for episode in result.ongoing:
            rl_episode = to_rllib_episode(episode, mapping_fn)
            self._ongoing_episodes_for_metrics[rl_episode.id_].append(rl_episode)
            if numpy:
                rl_episode.to_numpy()
            ongoing.append(rl_episode)
        self._done_episodes_for_metrics.extend(done)
        return done + ongoing

    def _log_sampled(self, result: MultiAgentSampleResult, acting: ModuleActing | None) -> None:
        """RLlib's per-step sample counters and timers, logged once per call."""
        log = self.metrics.log_value
        env_steps = result.env_steps
        if env_steps > 0:
            log(M.NUM_ENV_STEPS_SAMPLED, env_steps, reduce="sum")
            log(
                M.NUM_ENV_STEPS_SAMPLED_LIFETIME,
                env_steps,
                reduce="lifetime_sum",
                with_throughput=True,
            )
            self._log_env_steps(metric=self._metrics_num_env_steps_sampled, num_steps=env_steps)
        if self._env_step_calls:
            self._log_env_steps(
                metric=self._metrics_num_try_env_step, num_steps=self._env_step_calls
            )
            log(ENV_STEP_TIMER, self._env_step_s / self._env_step_calls)
        if result.done:
            log(M.NUM_EPISODES, len(result.done), reduce="sum")
            log(M.NUM_EPISODES_LIFETIME, len(result.done), reduce="lifetime_sum")
        module_steps: dict[Any, int] = {}
        for (aid, mid), n in result.agent_counts.items():
            log((M.NUM_AGENT_STEPS_SAMPLED, str(aid)), n, reduce="sum")
            log((M.NUM_AGENT_STEPS_SAMPLED_LIFETIME, str(aid)), n, reduce="lifetime_sum")
            module_steps[mid] = module_steps.get(mid, 0) + n
        for mid, n in module_steps.items():
            log((M.NUM_MODULE_STEPS_SAMPLED, mid), n, reduce="sum")
            log((M.NUM_MODULE_STEPS_SAMPLED_LIFETIME, mid), n, reduce="lifetime_sum")
        if acting is not None and acting.forwards:
            log(M.RLMODULE_INFERENCE_TIMER, acting.inference_s / acting.forwards)

    # -- the core and its env hooks ------------------------------------------------
    def _get_core(self) -> MultiAgentSampler:
        """Our loop over ``self.env`` (rebuilt when ``make_env`` made a new env)."""
        if self.env is None:
            raise ValueError(f"{self} doesn't have an env! Can't call `sample()` on it.")
        core = self._core
        if core is not None and self._core_env is self.env:
            return core
        obs_spaces, act_spaces = self._agent_spaces()
        module_action_spaces = {
            mid: spaces[1]
            for mid, spaces in self.get_spaces().items()
            if not str(mid).startswith("__")
        }
        kwargs = {
            "observation_spaces": obs_spaces,
            "action_spaces": act_spaces,
            "action_fns": action_transforms(self.config, module_action_spaces),
            "lookback": self.config.episode_lookback_horizon,
        }
        if core is not None and core.num_envs == self.num_envs:
            for key, value in kwargs.items():  # after a failed step recreated the env
                setattr(core, key, value)
        else:
            core = self._core = MultiAgentSampler(
                num_envs=self.num_envs,
                new_episode=self._new_core_episode,
                reset_fn=self._core_reset,
                step_fn=self._core_step,
                **kwargs,
            )
        self._core_env = self.env
        return core

    def _agent_spaces(self) -> tuple[dict, dict] | None:
        """Every agent's observation and action spaces (None: the env does not say).

        From the first sub-env's ``possible_agents``, else from the vector env's
        per-agent space dicts (RLlib's vector env reads the sub-env's
        ``observation_spaces`` / ``action_spaces``).
        """
        first = self.env.envs[0].unwrapped
        agents = list(getattr(first, "possible_agents", None) or ())
        if agents:
            return (
                {aid: first.get_observation_space(aid) for aid in agents},
                {aid: first.get_action_space(aid) for aid in agents},
            )
        obs = getattr(self.env, "single_observation_spaces", None)
        act = getattr(self.env, "single_action_spaces", None)
        if (
            isinstance(obs, Mapping)
            and isinstance(act, Mapping)
            and obs
            and obs.keys() == act.keys()
        ):
            return dict(obs), dict(act)
        return None

    def _new_core_episode(self, env_index: int) -> MultiAgentEpisode:
        core = self._core
        return MultiAgentEpisode(
            observation_space=core.observation_spaces,
            action_space=core.action_spaces,
            agent_to_module_mapping_fn=self.config.policy_mapping_fn,
        )

    def _core_reset(self) -> tuple[list, list]:
        """Reset all sub-envs (seeded on the first reset after ``make_env``, as RLlib)."""
        obs, infos = self._try_env_reset(seed=self._seed if self._needs_initial_reset else None)
        self._needs_initial_reset = False
        if self.env is not self._core_env:  # the reset recreated the env
            self._get_core()
        return list(obs), list(infos)

    def _core_step(self, actions: list) -> Any:
        """``env.step`` with RLlib's failure handling (``_try_env_step``), timed in bulk."""
        return step_with_rllib_failure_handling(self, actions, self._get_core)
