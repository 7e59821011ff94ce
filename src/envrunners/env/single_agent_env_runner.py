"""``SingleAgentEnvRunner``: RLlib's new-stack single-agent runner on the fast sampler.

It builds a vector env and the module from the config, and ``sample()`` returns
``SingleAgentEpisode`` lists with RLlib's semantics (fragments, batch modes,
continuity of chunks across calls, finished episodes first). The stepping itself
happens in ``envrunners.sampling.single_agent.SingleAgentSampler``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from envrunners.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from envrunners.connectors.connector_v2 import ConnectorV2
from envrunners.core import (
    DEFAULT_AGENT_ID,
    DEFAULT_MODULE_ID,
    INPUT_ENV_SINGLE_SPACES,
)
from envrunners.core.columns import Columns
from envrunners.core.rl_module._acting import act
from envrunners.env import runner_setup
from envrunners.env._sampling_connectors import SamplingConnectors
from envrunners.env.env_runner import NewStackEnvRunner
from envrunners.env.single_agent_episode import SingleAgentEpisode
from envrunners.errors import ConfigError, NonFiniteEnvDataError
from envrunners.sampling._overlap_choice import decide_overlap
from envrunners.sampling.finite_checks import (
    ObsRewardCheck,
    all_finite_fast,
    check_module_outputs,
    restart_bad_sub_envs,
)
from envrunners.sampling.sample_result import EpisodeStats
from envrunners.sampling.single_agent import SingleAgentSampler, SingleAgentSampleResult
from envrunners.utils.gc_pause import DeferredGC

__all__ = ["SingleAgentEnvRunner"]

logger = logging.getLogger("envrunners")


class SingleAgentEnvRunner(NewStackEnvRunner):
    """Samples a (vectorised) single-agent gymnasium env with one module.

    Args:
        config: The ``AlgorithmConfig``.
        **kwargs: ``worker_index``, ``num_workers`` and ``spaces`` (used when this
            runner has no env, e.g. the local runner of a group with remotes).
    """

    def __init__(self, *, config: Any, **kwargs: Any):
        super().__init__(config=config, **kwargs)
        self._sampler: SingleAgentSampler | None = None
        #: Earlier chunks of the ongoing episodes (for ``on_episode_end``).
        self._prev_chunks: dict[str, list[SingleAgentEpisode]] = defaultdict(list)
        self._env_to_module: ConnectorPipelineV2 = ConnectorPipelineV2()
        self._module_to_env: ConnectorPipelineV2 = ConnectorPipelineV2()
        self._connectors = SamplingConnectors(self)
        #: The ready-first batch ``overlap_inference="auto"`` chose (None: the config's).
        self._ready_batch: int | None = None
        #: ``(env step s, forward s)`` that ``overlap_inference="auto"`` measured, if it did.
        self._overlap_costs: tuple[float, float] | None = None
        #: ``(env steps/s stepping all sub-envs, ready-first)`` that "auto" measured for a
        #: stateful module (see ``_choose_overlap``), if it did.
        self._overlap_rates: tuple[float, float] | None = None
        announce_later = False
        if runner_setup.should_create_env(self.config, self.worker_index):
            self._build_env()
            # "auto" overlap may replace this env: announce only the env that is used.
            announce_later = runner_setup.auto_overlap_applies(
                self.config, self._env_context, self.num_envs
            )
            if not announce_later:
                self._env_created()
        else:
            self._build_connectors()
        self.make_module()
        if announce_later:
            self._choose_overlap()
            self._env_created()

    # -- construction --------------------------------------------------------------
    def make_env(self) -> None:
        """(Re)create the vector env, its connectors and the sampler (closes the old env);
        fires ``on_environment_created``."""
        self._build_env()
        self._env_created()

    def _build_env(self) -> None:
        """``make_env`` without firing ``on_environment_created``."""
        self._replace_env(
            functools.partial(runner_setup.make_vector_env, batch_size=self._ready_batch)
        )
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
                step_fn=self._step_env,
                obs_fn=self._obs_to_module,
                action_fn=self._actions_to_env,
                reward_fn=runner_setup.reward_transform(self.config),
                lookback=self.config.episode_lookback_horizon,
                recv_fn=self._recv_env,
                send_fn=self._send_env,
            )
            self._use_module_state()
        self._check_ready_first_connectors()
        self._sampler.finite_check = ObsRewardCheck(self.env.single_observation_space)
        self._sampler.on_non_finite = self._on_non_finite

    def _check_ready_first_connectors(self) -> None:
        """Wire the episode tracker to ready-first batches, or a ``ConfigError`` if a
        piece that reads episodes cannot take them (``supports_ready_first``)."""
        pipeline = self._env_to_module
        if not getattr(self.env, "is_async", False):
            return
        refusing = pipeline.pieces_refusing_ready_first() if pipeline.reads_episodes else []
        if refusing:
            names = ", ".join(type(c).__name__ for c in refusing)
            raise ConfigError(
                "ready-first stepping (an asynchronous env: EnvPool's batch_size, "
                "ready_first_batch_size or overlap_inference) acts on a few sub-envs at a "
                f"time, but the env-to-module pipeline has pieces that read episodes ({names}) "
                "and do not say they can take such batches. A piece that keeps no history "
                "per batch row, or indexes it by `episodes.env_indices` (each view's "
                "`env_index`), sets the class attribute `supports_ready_first = True`; "
                "else set ready_first_batch_size=None and overlap_inference=False to step "
                "all sub-envs together."
            )
        # Only pieces that read episodes need each batch's sub-envs noted (the tracker).
        self._sampler.recv_fn = self._recv_noted if pipeline.reads_episodes else self._recv_env

    def _recv_noted(self) -> Any:
        """``_recv_env``, noting the batch's sub-envs, rewards and ends for the episode views."""
        return self._connectors.after_recv(self._recv_env())

    def _choose_overlap(self) -> None:
        """``overlap_inference="auto"``: time a few env steps and forwards, then decide.

        Only for a backend that can step asynchronously, with a module and no ready-first
        batch set by the config; overlapping rebuilds the env with half the sub-envs per
        ready-first batch. ``on_environment_created`` is the caller's: it fires once, for
        the env this leaves. The timing leaves torch's global RNG as it found it, so the
        episodes sampled later are the ones the chosen setting gives by itself.

        For a stateful module that rule is only a first test: its ready-first loop also
        gathers and scatters state rows per batch, work that forward timings do not see
        (a small LSTM on EnvPool CartPole passed the rule and ran at 0.67x stepping all
        sub-envs together). So where the rule says overlap, short discarded sampler runs
        time both ways (``_sampling_rate``) and the faster one is kept; only with an
        empty env-to-module pipeline, whose pieces could otherwise learn from those steps.
        """
        config = self.config
        if self.env is None or self.module is None or self._ready_batch is not None:
            return
        if not runner_setup.auto_overlap_applies(config, self._env_context, self.num_envs):
            return
        if self._env_to_module.pieces_refusing_ready_first():  # every sub-env, every step
            return
        recurrent = self._sampler.recurrent
        # The module acts on what the env-to-module pipeline makes of the observations;
        # a pipeline that changes their space (flattening, frame stacking) is timed on a
        # sample of its output space (running it would change its state and statistics).
        space = self._env_to_module.observation_space
        module_obs = None
        if space is not None and space != self.env.single_observation_space:
            module_obs = batch_space(space, self.num_envs).sample()

        def forward(obs: Any) -> None:
            if module_obs is not None:
                obs = module_obs
            if recurrent is None:
                runner_setup.compute_actions(self.module, obs, True, 0)
            else:
                act(self.module, obs, True, recurrent.state, extra_inputs=recurrent.extra_inputs)

        timers = self._env_step_time, self._env_reset_time
        with runner_setup.torch_threads(config, self.worker_index), runner_setup.torch_rng_kept():
            env_s, fwd_s = runner_setup.time_step_and_forward(self.env, forward)
            self._overlap_costs = (env_s, fwd_s)
            self._needs_initial_reset = True
            if not decide_overlap(env_s, fwd_s, self.num_envs):
                return
            measure = recurrent is not None and not len(self._env_to_module)
            together = self._sampling_rate() if measure else 0.0
            self._ready_batch = self.num_envs // 2
            self._build_env()
            if measure:
                ready_first = self._sampling_rate()
                self._overlap_rates = (together, ready_first)
                logger.debug(
                    "overlap_inference='auto', stateful module: %.0f env steps/s stepping "
                    "all sub-envs, %.0f ready-first -> %s",
                    together,
                    ready_first,
                    "overlap" if ready_first > together else "step together",
                )
                if ready_first <= together:
                    self._ready_batch = None
                    self._build_env()
                self._env_step_time, self._env_reset_time = timers

    def _sampling_rate(self, min_s: float = 0.05, max_runs: int = 16) -> float:
        """Env steps per second of the sampler on the current env with the stateful module:
        one warm-up run, then runs of ``4 * num_envs`` steps until ``min_s`` have passed
        (at most ``max_runs``). Their episodes are discarded; the envs are reset first
        (seeded as for the first ``sample()``, which resets them again: the caller
        announces the env with ``_env_created``)."""
        self._needs_initial_reset = True
        self._reset_envs()
        self._sampler.check_fn = None
        steps = 4 * self.num_envs

        def run() -> int:
            return self._sampler.run(
                act_fn=self._act_stateful,
                explore=True,
                num_timesteps=steps,
                num_episodes=None,
                random_actions=False,
                t_offset=0,
            ).env_steps

        run()
        done, start = 0, time.perf_counter()
        for _ in range(max_runs):
            done += run()
            if time.perf_counter() - start >= min_s:
                break
        return done / (time.perf_counter() - start)

    def _spaces_unchanged(self) -> bool:
        old = self._env_to_module.input_observation_space, self._module_to_env.input_action_space
        return old == (self.env.single_observation_space, self.env.single_action_space)

    def _build_connectors(self) -> None:
        obs_space, act_space = self._single_spaces()
        spaces = self._env_spaces() if self.env is not None else self.spaces
        self._env_to_module, self._module_to_env = runner_setup.build_connectors(
            self.config, obs_space, act_space, env=self.env, spaces=spaces
        )

    def _single_spaces(self) -> tuple[gym.Space | None, gym.Space | None]:
        if self.env is not None:
            return self.env.single_observation_space, self.env.single_action_space
        spaces = self.spaces.get(INPUT_ENV_SINGLE_SPACES) or self.spaces.get(DEFAULT_MODULE_ID)
        if spaces:
            return spaces[0], spaces[1]
        return self.config.observation_space, self.config.action_space

    def make_module(self) -> None:
        """Build the module from ``config.rl_module_spec`` or the default MLP.

        A base ``AlgorithmConfig`` without ``rl_module_spec`` builds none (as in
        RLlib): ``sample()`` then takes random actions.
        """
        if not runner_setup.builds_module(self.config):
            self.module, self._module_error = None, runner_setup.NO_DEFAULT_MODULE
            return
        spaces = self.get_spaces()
        if DEFAULT_MODULE_ID not in spaces:
            self.module, self._module_error = None, "no action space known"
            return
        self.module = runner_setup.build_module(self.config, spaces[DEFAULT_MODULE_ID])
        self._module_error = None
        self._use_module_state()

    def _use_module_state(self) -> None:
        """Give the sampler a per-sub-env state column if the module is stateful.

        A rebuilt module or sampler starts every sub-env from the initial state.
        """
        if self._sampler is None or getattr(self, "module", None) is None:
            return
        self._sampler.recurrent = runner_setup.recurrent_state(
            self.module, self._sampler.num_envs, self._sampler.action_space
        )

    # -- connectors used by the sampler -----------------------------------------
    def _obs_to_module(self, obs: Any) -> Any:
        return self._connectors.obs_to_module(obs)

    def _actions_to_env(self, actions: np.ndarray) -> Any:
        return self._connectors.actions_to_env(actions)

    def _step_env(self, actions: Any) -> Any:
        return self._connectors.after_step(self._try_env_step(actions))

    def _on_non_finite(self, errors: list[NonFiniteEnvDataError], results: Any) -> Any:
        """A step with non-finite observations or rewards (one error per bad sub-env).

        Without ``restart_failed_sub_environments`` the first error is raised. With it,
        each bad sub-env is recreated as if its step had raised (its partial episode is
        dropped, its reset observation takes the bad row's place); a vector env that
        cannot recreate one sub-env is recreated whole.
        """
        if not self.config.restart_failed_sub_environments:
            raise errors[0]
        restart = getattr(self.env, "restart_sub_env", None)
        if restart is None or getattr(self.env, "is_async", False):
            # A sub-env of a ready-first batch has actions in flight: recreate them all.
            return self._recreate_env_after(errors[0])
        return restart_bad_sub_envs(restart, errors, results)

    def _act(self, obs: Any, explore: bool, t: int) -> tuple[Any, dict]:
        """One forward of a stateless module for all sub-envs (the sampler's ``ActFn``)."""
        start = time.perf_counter()
        out = runner_setup.compute_actions(self.module, obs, explore, t)
        self._inference_time += time.perf_counter() - start
        inputs = out.get(Columns.ACTION_DIST_INPUTS)
        if inputs is not None and not all_finite_fast(inputs):
            check_module_outputs(DEFAULT_MODULE_ID, out)
        actions = out.pop(Columns.ACTIONS)
        return actions, out

    def _act_stateful(
        self, obs: Any, explore: bool, t: int, state: Any, extra_inputs: dict | None
    ) -> tuple[Any, dict, Any]:
        """One forward of a stateful module for all sub-envs (a ``StatefulActFn``)."""
        start = time.perf_counter()
        result = act(self.module, obs, explore, state, extra_inputs=extra_inputs, t=t)
        self._inference_time += time.perf_counter() - start
        check_module_outputs(DEFAULT_MODULE_ID, result[1])
        return result

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
        # Weights set meanwhile wait (see set_state); young garbage collections wait too.
        with self._weights_lock, DeferredGC(getattr(self.config, "pause_gc_during_sample", True)):
            random_actions = self._acts_randomly(random_actions)
            num_timesteps, num_episodes, start = self._begin_sample(
                num_timesteps, num_episodes, explore, random_actions
            )
            if force_reset or num_episodes is not None or self._needs_initial_reset:
                self._reset_envs()
            if self._sampler.ready_first:  # a connector may have been added since make_env
                self._check_ready_first_connectors()
            if num_episodes is not None:
                self._needs_initial_reset = True
            sampler = self._sampler
            sampler.weights_seq_no = self._weights_seq_no
            t_offset = self._t_offset()
            with runner_setup.torch_threads(self.config, self.worker_index):
                result = sampler.run(
                    act_fn=(
                        None
                        if random_actions
                        else self._act
                        if sampler.recurrent is None
                        else self._act_stateful
                    ),
                    explore=self._explore,
                    num_timesteps=num_timesteps,
                    num_episodes=num_episodes,
                    random_actions=random_actions,
                    t_offset=t_offset,
                )
            self._record(result)
            episodes = result.episodes
            runner_setup.fire_episode_callbacks(self, result)
            self._end_sample(episodes, start)
            return episodes

    def _reset_envs(self) -> None:
        seed = self._seed if self._needs_initial_reset else None
        if getattr(self.env, "is_async", False):
            # Ready-first: the reset observations arrive with the first recv() calls.
            start = time.perf_counter()
            runner_setup.async_reset(self.env, seed)
            self._env_reset_time += time.perf_counter() - start
            self._explore = self.config.explore
            self._sampler.start_async()
            self._connectors.forget_episodes()
            self._prev_chunks.clear()
            self._needs_initial_reset = False
            if not self.config.disable_env_checking:
                self._sampler.check_fn = lambda raw, acts: runner_setup.check_step(self, raw, acts)
            return
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

    # -- what NewStackEnvRunner asks of us: agents, modules and states --------------
    def _steps_by_agent_and_module(self, result: SingleAgentSampleResult) -> dict:
        return {(DEFAULT_AGENT_ID, DEFAULT_MODULE_ID): result.env_steps}

    def _log_episode_breakdown(self, stats: EpisodeStats, window: int) -> None:
        log = self.metrics.log_value
        log(("agent_episode_return_mean", DEFAULT_AGENT_ID), stats.ret, window=window)
        log(("module_episode_return_mean", DEFAULT_MODULE_ID), stats.ret, window=window)

    def _set_module_state(self, weights: Any) -> None:
        if isinstance(weights, dict) and DEFAULT_MODULE_ID in weights:
            weights = weights[DEFAULT_MODULE_ID]  # a {module_id: weights} state
        self.module.set_state(weights)

    def _get_connector_state(self, pipeline: ConnectorPipelineV2) -> Any:
        return pipeline.get_state()

    def _set_connector_state(self, pipeline: ConnectorPipelineV2, state: Any) -> None:
        pipeline.set_state(state)

    # -- spaces and connectors -----------------------------------------------------
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
            **self._env_spaces(),
            DEFAULT_MODULE_ID: (
                self._env_to_module.observation_space,
                self.env.single_action_space,
            ),
        }

    def add_connector_step(self, connector: ConnectorV2, *, to_env: bool = False) -> None:
        """Append a step to the env-to-module (or module-to-env) pipeline."""
        (self._module_to_env if to_env else self._env_to_module).append(connector)
