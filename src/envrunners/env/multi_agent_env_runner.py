"""``MultiAgentEnvRunner``: RLlib's new-stack multi-agent runner on the shared sampling core.

It builds a vectorised ``MultiAgentEnv`` (sync, or sub-envs in worker processes,
stepped ready-first with ``ready_first_batch_size`` / ``overlap_inference``) and a ``MultiRLModule`` with one module per policy id, and
``sample()`` returns ``MultiAgentEpisode`` lists with RLlib's semantics: agents
that act at different times, actions held until an agent's next observation,
``count_steps_by`` env or agent steps, chunks that continue across calls. Any
RLModule acts (default or user modules per module id, stateless or recurrent
with per-agent state); the loop itself (one forward per module per step) is
``envrunners.sampling.multi_agent.MultiAgentSampler``.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import gymnasium as gym

from envrunners.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from envrunners.env import _multi_agent_setup as setup
from envrunners.env import runner_setup
from envrunners.env.env_runner import ENV_STEP_FAILURE, NewStackEnvRunner
from envrunners.env.multi_agent_episode import MultiAgentEpisode
from envrunners.errors import ConfigError, NonFiniteEnvDataError
from envrunners.sampling._overlap_choice import decide_overlap
from envrunners.sampling.finite_checks import check_module_outputs, restart_bad_agent_sub_envs
from envrunners.sampling.multi_agent import MultiAgentSampler, MultiAgentSampleResult
from envrunners.sampling.sample_result import MultiAgentEpisodeStats
from envrunners.utils import metrics as M
from envrunners.utils.gc_pause import DeferredGC

__all__ = ["MultiAgentEnvRunner"]

logger = logging.getLogger("envrunners")

_EPISODE_EVENTS = ("on_episode_created", "on_episode_start", "on_episode_step", "on_episode_end")


class MultiAgentEnvRunner(NewStackEnvRunner):
    """Samples a (vectorised) multi-agent env with one module per policy id.

    Args:
        config: The ``AlgorithmConfig``; must be multi-agent
            (``config.multi_agent(policies=..., policy_mapping_fn=...)``).
        **kwargs: ``worker_index``, ``num_workers`` and ``spaces`` (used when this
            runner has no env, e.g. the local runner of a group with remotes).

    Raises:
        ValueError: The config is not multi-agent.
        ConfigError: ``policy_mapping_fn`` cannot be called as ``fn(agent_id, episode)``.
    """

    def __init__(self, config: Any = None, **kwargs: Any):
        if config is None:
            config = kwargs.pop("config", None)
        if config is None or not config.is_multi_agent:
            raise ValueError(
                f"Cannot use this EnvRunner class ({type(self).__name__}), if your setup is "
                "not multi-agent! Try adding multi-agent information to your AlgorithmConfig "
                "via calling `config.multi_agent(policies=..., policy_mapping_fn=...)`, or use "
                "SingleAgentEnvRunner."
            )
        super().__init__(config=config, **kwargs)
        setup.check_mapping_fn(self.config.policy_mapping_fn)
        self._module_ids = list(self.config.policies)
        self._mapping_fn = setup.CheckedMappingFn(self.config.policy_mapping_fn, self._module_ids)
        self._sampler: MultiAgentSampler | None = None
        self._module_spaces: dict[str, tuple[gym.Space, gym.Space]] = {}
        self._env_to_module: dict[str, ConnectorPipelineV2] = {}
        self._module_to_env: dict[str, ConnectorPipelineV2] = {}
        #: The ready-first batch ``overlap_inference="auto"`` chose (None: the config's).
        self._ready_batch: int | None = None
        #: ``(env step s, forward s)`` that ``overlap_inference="auto"`` measured, if it did.
        self._overlap_costs: tuple[float, float] | None = None
        #: Ready-first: sub-envs whose reset observations no recv() has brought yet.
        self._unchecked_resets: set[int] = set()
        if runner_setup.should_create_env(self.config, self.worker_index):
            self.make_env()
        else:
            self._module_spaces = {
                mid: self.spaces[mid] for mid in self._module_ids if mid in self.spaces
            }
            self._build_connectors()
        self.make_module()
        self._choose_overlap()

    # -- construction --------------------------------------------------------------
    def make_env(self) -> None:
        """(Re)create the vector env, its per-module connectors and the sampler."""
        self._replace_env(functools.partial(setup.make_vector_env, batch_size=self._ready_batch))
        self._module_spaces = setup.module_spaces(
            self.config,
            self.env.single_observation_spaces,
            self.env.single_action_spaces,
            self.env.possible_agents,
        )
        self._build_connectors()
        events = frozenset(e for e in _EPISODE_EVENTS if runner_setup.has_callbacks(self, e))
        kwargs = {
            "observation_spaces": self.env.single_observation_spaces,
            "action_spaces": self.env.single_action_spaces,
            "obs_fns": {m: self._e2m_fn(p) for m, p in self._env_to_module.items() if len(p)},
            "action_fns": {m: self._m2e_fn(p) for m, p in self._module_to_env.items() if len(p)},
            "lookback": self.config.episode_lookback_horizon,
            "events": events,
            "pause_gc": getattr(self.config, "pause_gc_during_sample", True),
        }
        if self._sampler is not None and self._sampler.num_envs == self.num_envs:
            for key, value in kwargs.items():  # keep the sampler (a failed step recreates us)
                setattr(self._sampler, key, value)
        else:
            self._sampler = MultiAgentSampler(
                num_envs=self.num_envs,
                new_episode=self._new_episode,
                reset_fn=self._reset_vector_env,
                step_fn=self._try_env_step,
                fire=self._fire_episode,
                failed_fn=lambda: getattr(self.env, "failed", None),
                recv_fn=self._recv_vector_env,
                send_fn=self._send_env,
                async_reset_fn=self._async_reset_vector_env,
                **kwargs,
            )
            self._sampler.check_finite = True
            self._sampler.on_non_finite = self._on_non_finite
        self._env_created()

    def _choose_overlap(self) -> None:
        """``overlap_inference="auto"``: time a few env steps and forwards, then decide.

        Only for a backend that can step asynchronously (``"shared_memory"``), with a
        module and no ready-first batch set by the config; overlapping rebuilds the env
        with half the sub-envs per ready-first batch (``on_environment_created`` fires
        again for it). A forward that fails here (e.g. a ``policy_mapping_fn`` that needs
        a real episode) leaves the sub-envs stepping together. The timing leaves torch's
        global RNG as it found it.
        """
        config = self.config
        if self.env is None or self.module is None or self._ready_batch is not None:
            return
        if not runner_setup.auto_overlap_applies(config, self._env_context, self.num_envs):
            return
        spaces = self.env.single_action_spaces

        def random_actions(obs_l: list[dict]) -> list[dict]:
            return [{aid: spaces[aid].sample() for aid in obs_i} for obs_i in obs_l]

        forward = setup.timing_forward(self.module, self._mapping_fn)
        try:
            threads = runner_setup.torch_threads(config, self.worker_index)
            with threads, runner_setup.torch_rng_kept():  # no trace in later actions
                env_s, fwd_s = runner_setup.time_step_and_forward(
                    self.env, forward, random_actions=random_actions
                )
        except Exception as err:  # noqa: BLE001 - the choice is an optimisation only
            logger.debug("overlap_inference='auto': timing failed (%r): step together", err)
            self._needs_initial_reset = True
            return
        self._overlap_costs = (env_s, fwd_s)
        self._needs_initial_reset = True
        if decide_overlap(env_s, fwd_s, self.num_envs):
            self._ready_batch = self.num_envs // 2
            self.make_env()

    def _build_connectors(self) -> None:
        self._env_to_module, self._module_to_env = {}, {}
        for mid, (obs_space, act_space) in self._module_spaces.items():
            e2m, m2e = runner_setup.build_connectors(
                self.config, obs_space, act_space, self.env, spaces=self.spaces
            )
            self._env_to_module[mid], self._module_to_env[mid] = e2m, m2e

    def make_module(self) -> None:
        """Build a ``MultiRLModule`` with one module per policy id.

        ``module`` stays None (only random actions) if spaces are unknown or the
        default module cannot handle them; a bad ``rl_module_spec`` raises. A base
        ``AlgorithmConfig`` without ``rl_module_spec`` builds none (as in RLlib):
        ``sample()`` then takes random actions.
        """
        self.module, self._module_error = None, None
        if not runner_setup.builds_module(self.config):
            self._module_error = runner_setup.NO_DEFAULT_MODULE
            return
        spaces = self.get_spaces()
        missing = [mid for mid in self._module_ids if mid not in spaces]
        if missing:
            self._module_error = f"no spaces are known for module(s) {missing}"
            return
        try:
            self.module = setup.build_modules(
                self.config, {mid: spaces[mid] for mid in self._module_ids}
            )
        except NotImplementedError as err:
            self._module_error = str(err)
        except ConfigError as err:
            if self.config.rl_module_spec is not None:
                raise  # the user's own module spec is wrong: say so now
            # The default module cannot handle these spaces; random actions still work.
            self._module_error = str(err)

    # -- hooks used by the sampler -------------------------------------------------
    def _e2m_fn(self, pipeline: ConnectorPipelineV2) -> Any:
        def to_module(obs: Any) -> Any:
            kwargs = {"rl_module": self.module, "metrics": self.metrics}
            return pipeline(batch={"obs": obs}, explore=self._explore, **kwargs)["obs"]

        return to_module

    def _m2e_fn(self, pipeline: ConnectorPipelineV2) -> Any:
        def to_env(actions: Any) -> Any:
            kwargs = {"rl_module": self.module, "metrics": self.metrics}
            batch = pipeline(batch={"actions": actions}, explore=self._explore, **kwargs)
            return batch.get("actions_for_env", batch["actions"])

        return to_env

    def _new_episode(self, env_index: int) -> MultiAgentEpisode:
        episode = MultiAgentEpisode(
            observation_space=self.env.single_observation_spaces,
            action_space=self.env.single_action_spaces,
            agent_to_module_mapping_fn=self._mapping_fn,
        )
        if "on_episode_created" in self._sampler.events:
            self._fire_episode("on_episode_created", episode, env_index)
        return episode

    def _fire_episode(self, event: str, episode: Any, env_index: int, **extra: Any) -> None:
        runner_setup.fire(
            self,
            event,
            episode=episode,
            env_runner=self,
            metrics_logger=self.metrics,
            env=self.env.unwrapped,
            rl_module=self.module,
            env_index=env_index,
            **extra,
        )

    def _reset_vector_env(self) -> tuple[list, list]:
        obs, infos = self._try_env_reset(seed=self._seed if self._needs_initial_reset else None)
        self._needs_initial_reset = False
        if not self.config.disable_env_checking:
            setup.check_reset_observations(self.env, obs)
        return obs, infos

    def _async_reset_vector_env(self) -> None:
        """Reset an asynchronous env without waiting (seeded on the first reset)."""
        start = time.perf_counter()
        runner_setup.async_reset(self.env, self._seed if self._needs_initial_reset else None)
        self._env_reset_time += time.perf_counter() - start
        self._needs_initial_reset = False
        # Each sub-env's reset observations come with its first recv(): checked there.
        checking = not self.config.disable_env_checking
        self._unchecked_resets = set(range(self.num_envs)) if checking else set()

    def _recv_vector_env(self) -> Any:
        """``_recv_env``, checking each sub-env's reset observations (in its first results
        after an ``async_reset``) against the spaces, as ``_reset_vector_env`` does."""
        results = self._recv_env()
        unchecked = self._unchecked_resets
        if unchecked and results is not ENV_STEP_FAILURE:
            firsts = [(j, int(i)) for j, i in enumerate(results[0]) if int(i) in unchecked]
            if firsts:
                obs = results[1]
                setup.check_reset_observations(
                    self.env, [obs[j] for j, _ in firsts], [i for _, i in firsts]
                )
                unchecked.difference_update(i for _, i in firsts)
        return results

    def _act(
        self,
        module_id: str,
        obs: Any,
        explore: bool,
        t: int,
        state: Any = None,
        extra_inputs: dict | None = None,
    ) -> dict:
        """One forward of ``module_id``'s module for the batch of all agents mapped to it.

        Stateless modules with ``compute_actions_numpy`` (the default MLP / CNN) take
        that numpy path directly; any other module goes through ``_acting.act``
        (``state``: the batch's recurrent state, the next one returned under
        ``Columns.STATE_OUT``; ``extra_inputs``: ``prev_actions`` / ``prev_rewards``).
        """
        start = time.perf_counter()
        fast = self._fast_acting[module_id]
        if fast is not None:
            out = fast(obs, explore=explore)
        else:
            module = self._modules[module_id]
            out = setup.act_with_module(module, obs, explore, t, state, extra_inputs)
        self._inference_time += time.perf_counter() - start
        check_module_outputs(module_id, out)
        return out

    def _on_non_finite(self, errors: list[NonFiniteEnvDataError], results: tuple) -> Any:
        """Non-finite observations or rewards (one error per bad sub-env).

        Without ``restart_failed_sub_environments`` the first error is raised. With it,
        each bad sub-env is recreated as if its step had raised: the returned results
        hold its reset step in place of the rejected one. A vector env that cannot
        recreate one sub-env is recreated whole (returns None).
        """
        if not self.config.restart_failed_sub_environments:
            raise errors[0]
        restart = getattr(self.env, "restart_sub_env", None)
        if restart is None or getattr(self.env, "is_async", False):
            # A ready-first env has other sub-envs' actions in flight: recreate it whole.
            self._recreate_env_after(errors[0])
            return None
        return restart_bad_agent_sub_envs(restart, errors, results)

    # -- sampling ------------------------------------------------------------------
    def sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool | None = None,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[MultiAgentEpisode]:
        """Collect experience: RLlib's ``MultiAgentEnvRunner.sample`` semantics.

        ``num_timesteps`` counts env steps or agent steps (``config.count_steps_by``).
        With no counts, ``truncate_episodes`` samples ``rollout_fragment_length *
        num_envs`` steps and ``complete_episodes`` one episode per sub-env. Finished
        episodes come first, then each sub-env's in-progress chunk, which the next
        call continues (same ``id_``, ``env_t_started`` = this chunk's ``env_t``).
        """
        # Weights set meanwhile wait (see set_state); young garbage collections wait too.
        with self._weights_lock, DeferredGC(getattr(self.config, "pause_gc_during_sample", True)):
            random_actions = self._acts_randomly(random_actions)
            num_timesteps, num_episodes, start = self._begin_sample(
                num_timesteps, num_episodes, explore, random_actions
            )
            sampler = self._sampler
            reset = force_reset or num_episodes is not None or self._needs_initial_reset
            if reset or not sampler.started:
                if getattr(self.env, "is_async", False):  # reset obs come with recv()
                    self._async_reset_vector_env()
                    sampler.start_async()
                else:
                    sampler.start()
            if num_episodes is not None:
                self._needs_initial_reset = True
            self._modules = modules = dict(self.module.items()) if self.module is not None else {}
            self._fast_acting = {mid: setup.fast_acting(m) for mid, m in modules.items()}
            sampler.use_states({mid: m for mid, m in modules.items() if m.is_stateful()})
            sampler.weights_seq_no = self._weights_seq_no
            t_offset = self._t_offset()
            try:
                with runner_setup.torch_threads(self.config, self.worker_index):
                    result = sampler.run(
                        act_fn=None if random_actions else self._act,
                        explore=self._explore,
                        num_timesteps=num_timesteps,
                        num_episodes=num_episodes,
                        count_agent_steps=self.config.count_steps_by == "agent_steps",
                        t_offset=t_offset,
                        defer_extras=bool(self.config.episodes_to_numpy),
                    )
            except BaseException:
                sampler.started = False  # the episodes in flight are inconsistent: reset next time
                raise
            self._record(result)
            episodes = result.episodes
            if self.config.episodes_to_numpy:
                for episode in episodes:
                    episode.to_numpy()
            self._end_sample(episodes, start)
            return episodes

    # -- what NewStackEnvRunner asks of us: agents, modules and states --------------
    def _steps_by_agent_and_module(self, result: MultiAgentSampleResult) -> dict:
        return result.agent_counts

    def _log_episode_breakdown(self, stats: MultiAgentEpisodeStats, window: int) -> None:
        log = self.metrics.log_value
        for aid, ret in stats.agent_returns.items():
            log((M.EPISODE_AGENT_RETURN_MEAN, aid), ret, window=window)
        for aid, n in stats.agent_steps.items():
            log((M.EPISODE_AGENT_STEPS, aid), n, window=window)
        for mid, ret in stats.module_returns.items():
            log((M.EPISODE_MODULE_RETURN_MEAN, mid), ret, window=window)

    def _set_module_state(self, weights: Any) -> None:
        self.module.set_state(weights)

    def _get_connector_state(self, pipelines: dict[str, ConnectorPipelineV2]) -> dict:
        """``{module_id: pipeline state}``."""
        return {mid: p.get_state() for mid, p in pipelines.items()}

    def _set_connector_state(self, pipelines: dict[str, ConnectorPipelineV2], state: Any) -> None:
        """Load ``{module_id: pipeline state}`` (ids this runner lacks are skipped)."""
        for mid, sub in (state or {}).items():
            if mid in pipelines:
                pipelines[mid].set_state(sub)

    # -- spaces and policies -------------------------------------------------------
    def get_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        """``__env__``, ``__env_single__`` and, per module id, its (module-side obs, action) spaces."""
        modules = {
            mid: (self._env_to_module[mid].observation_space or spaces[0], spaces[1])
            for mid, spaces in self._module_spaces.items()
        }
        if self.env is None:
            return {**self.spaces, **modules}
        return {**self._env_spaces(), **modules}

    def get_policies_to_train(self) -> set[str]:
        """The module ids that ``config.policies_to_train`` marks trainable (all if None)."""
        to_train = self.config.policies_to_train
        if to_train is None:
            return set(self._module_ids)
        if callable(to_train):
            return {mid for mid in self._module_ids if to_train(mid, None)}
        return {mid for mid in self._module_ids if mid in set(to_train)}
