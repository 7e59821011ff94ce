"""How a single-agent runner calls its two connector pipelines during sampling.

Once per vector step (per ready-first batch when stepping ready-first) the sampler
hands the runner the new observation batch (env-to-module) and the module's action
batch (module-to-env). Each pipeline is called with RLlib's keywords:
``rl_module``, ``batch``, ``episodes``, ``explore``, ``shared_data`` (one dict per
step, shared by both pipelines) and ``metrics``. ``episodes`` is a
``VectorEpisodes`` when a piece of the env-to-module pipeline reads episodes (a
``VectorEpisodeTracker`` is then fed from the acting, env-step or ``recv`` and
observation hooks), else an empty list. An empty pipeline is skipped: the
default path does no per-step connector work.
"""

from __future__ import annotations

from typing import Any

from envrunners.connectors.vector_episodes import VectorEpisodeTracker
from envrunners.env.env_runner import ENV_STEP_FAILURE

__all__ = ["SamplingConnectors"]


class SamplingConnectors:
    """The runner's ``obs_fn`` / ``action_fn`` / step hook around its pipelines.

    Args:
        runner: The runner; its ``_env_to_module`` / ``_module_to_env`` pipelines,
            ``module``, ``_explore``, ``metrics``, ``env`` and ``num_envs`` are read
            at each call, so rebuilt pipelines or modules take effect at once.
    """

    def __init__(self, runner: Any):
        self._runner = runner
        self.tracker: VectorEpisodeTracker | None = None
        self._shared: dict = {}
        self._episodes: Any = []

    def obs_to_module(self, obs: Any) -> Any:
        """Run the env-to-module pipeline on an observation batch; returns the module obs."""
        runner = self._runner
        pipeline = runner._env_to_module
        if not len(pipeline):
            return obs
        self._shared = {}
        episodes: Any = []
        if pipeline.reads_episodes:
            episodes = self._tracker().observe(obs)
        self._episodes = episodes
        batch = pipeline(
            rl_module=runner.module,
            batch={"obs": obs},
            episodes=episodes,
            explore=runner._explore,
            shared_data=self._shared,
            metrics=runner.metrics,
        )
        return batch["obs"]

    def _tracker(self) -> VectorEpisodeTracker:
        """The episode tracker (made on first use: the next batch starts every sub-env)."""
        runner = self._runner
        tracker = self.tracker
        if tracker is None or tracker.num_envs != runner.num_envs:
            tracker = self.tracker = VectorEpisodeTracker(
                runner.num_envs, ENV_STEP_FAILURE, lambda: runner.env
            )
        return tracker

    def forget_episodes(self) -> None:
        """The envs were reset: every sub-env's next observation starts an episode."""
        if self.tracker is not None:
            self.tracker.forget()

    def actions_to_env(self, actions: Any) -> Any:
        """Run the module-to-env pipeline on an action batch; returns the env actions."""
        if self.tracker is not None:
            self.tracker.after_actions(actions)
        runner = self._runner
        pipeline = runner._module_to_env
        if not len(pipeline):
            return actions
        batch = pipeline(
            rl_module=runner.module,
            batch={"actions": actions},
            episodes=self._episodes,
            explore=runner._explore,
            shared_data=self._shared,
            metrics=runner.metrics,
        )
        return batch.get("actions_for_env", batch["actions"])

    def after_step(self, results: Any) -> Any:
        """Pass an env step's results through, noting rewards and episode ends."""
        if self.tracker is not None:
            self.tracker.after_step(results)
        return results

    def after_recv(self, results: Any) -> Any:
        """Pass a ready-first ``recv()``'s results through, noting its sub-envs, rewards
        and episode ends (only wired while a piece reads episodes: see the runner)."""
        self._tracker().after_recv(results)
        return results
