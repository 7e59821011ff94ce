"""``ModuleLearners``: one single-file learner per module of a multi-agent config.

Why: RLlib's multi-agent PPO trains each module on the steps of the agents mapped
to it. A ``MultiAgentEpisode`` keeps one ``SingleAgentEpisode`` per agent (its
observations, actions, ``action_logp`` and rewards, with the bootstrap observation
and lookback a single-agent chunk has), so each module's learner is the unchanged
``PPOLearner`` / ``PGLearner`` fed the agent chunks of its module. This object
holds them and speaks the learner protocol ``Algorithm`` and
``EnvRunnerGroup.sync_weights`` use (``update``, ``get_state``, ``set_state``,
``weights_seq_no``), with weights keyed by module id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envrunners.algorithms.ppo.ppo_learner import weights_lag
from envrunners.core.rl_module.multi_rl_module import MultiRLModuleSpec

__all__ = ["ModuleConfig", "ModuleLearners", "policies_to_train"]


class ModuleConfig:
    """The algorithm config as one module's learner reads it.

    Every attribute is the config's, except ``rl_module_spec`` (the module's own
    spec of a ``MultiRLModuleSpec``), ``model_config`` (merged with the module's
    override) and the keys of ``algorithm_config_overrides_per_module[module_id]``
    and of the module's ``PolicySpec.config`` (e.g. a per-module ``lr``), which win;
    the runners build their modules from the same sources.
    """

    def __init__(self, config: Any, module_id: str) -> None:
        spec = config.rl_module_spec
        if isinstance(spec, MultiRLModuleSpec):
            specs = spec.rl_module_specs
            spec = specs.get(module_id) if isinstance(specs, dict) else specs
        overrides = dict((config.algorithm_config_overrides_per_module or {}).get(module_id) or {})
        overrides.update(getattr(config.policies.get(module_id), "config", None) or {})
        model_config = {
            **(config.model_config or {}),
            **(overrides.pop("model_config", None) or {}),
        }
        self.__dict__["_config"] = config
        self.__dict__["_overrides"] = {
            **overrides,
            "rl_module_spec": spec,
            "model_config": model_config,
        }

    def __getattr__(self, name: str) -> Any:
        overrides = self.__dict__["_overrides"]
        if name in overrides:
            return overrides[name]
        return getattr(self.__dict__["_config"], name)


def policies_to_train(config: Any) -> list[str]:
    """The module ids ``config.policies_to_train`` marks trainable (all when it is None)."""
    to_train = config.policies_to_train
    ids = list(config.policies)
    if to_train is None:
        return ids
    if callable(to_train):
        return [mid for mid in ids if to_train(mid, None)]
    return [mid for mid in ids if mid in set(to_train)]


class ModuleLearners:
    """A learner per module id; ``update`` trains the trainable ones on their agents' chunks.

    Modules outside ``policies_to_train`` keep a learner too: it holds their
    weights, so every runner gets the same ones from ``sync_weights`` (RLlib's
    learner group also holds every module and trains only the trainable ones).

    Args:
        learners: ``{module_id: PPOLearner}`` (or any class with its interface).
        trainable: The module ids to train.
    """

    def __init__(self, learners: dict[str, Any], trainable: Sequence[str]) -> None:
        self.learners = dict(learners)
        self.trainable = [mid for mid in trainable if mid in self.learners]
        self.weights_seq_no = 0
        self.num_env_steps_trained = 0

    @classmethod
    def from_group(cls, config: Any, group: Any, learner_class: type) -> ModuleLearners:
        """Build one ``learner_class`` per module id, with the spaces the group's runners report."""
        spaces = group.get_spaces()
        learners = {}
        for mid in config.policies:
            obs_space, act_space = spaces[mid]
            learners[mid] = learner_class(
                ModuleConfig(config, mid), observation_space=obs_space, action_space=act_space
            )
        return cls(learners, policies_to_train(config))

    def split_by_module(self, episodes: Sequence[Any]) -> dict[str, list[Any]]:
        """``{module_id: [agent chunks]}``: each agent's ``SingleAgentEpisode`` under its module."""
        out: dict[str, list[Any]] = {}
        for episode in episodes:
            for aid, chunk in episode.agent_episodes.items():
                if len(chunk):
                    out.setdefault(episode.module_for(aid), []).append(chunk)
        return out

    def update(self, episodes: Sequence[Any]) -> dict[str, dict[str, float]]:
        """Train every trainable module on its agents' chunks of ``episodes``.

        Returns:
            ``{module_id: stats}`` for the modules that had steps to train on.
        """
        chunks = self.split_by_module(episodes)
        stats = {
            mid: self.learners[mid].update(chunks[mid]) for mid in self.trainable if chunks.get(mid)
        }
        if stats:
            self.weights_seq_no += 1
            self.num_env_steps_trained += sum(len(e) for e in episodes)
            # The runners sample with this object's version, not the module learners'.
            for mid in stats:
                lag = weights_lag(chunks[mid], self.weights_seq_no)
                if lag is not None:
                    stats[mid]["diff_num_grad_updates_vs_sampler_policy"] = lag
        return stats

    def get_state(
        self,
        components: str | Sequence[str] | None = None,
        *,
        inference_only: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Weights as ``{"rl_module": {module_id: weights}, "weights_seq_no": n}``.

        Args:
            components: None for everything (each learner's optimizer and counters,
                under ``"learners"``); ``"rl_module"`` or ``"rl_module/<module_id>"``
                entries for the weights of all or of the named modules.
            inference_only: Only the weights an inference-only module has.
            **kwargs: Ignored (RLlib call compatibility).
        """
        if components is None:
            return {
                "learners": {mid: learner.get_state() for mid, learner in self.learners.items()},
                "weights_seq_no": self.weights_seq_no,
                "num_env_steps_trained": self.num_env_steps_trained,
            }
        names = [components] if isinstance(components, str) else list(components)
        wanted = {n.partition("/")[2] for n in names if n.startswith("rl_module/")}
        if "rl_module" in names or not wanted:
            wanted = set(self.learners)
        weights = {
            mid: learner.module.get_state(inference_only=inference_only)
            for mid, learner in self.learners.items()
            if mid in wanted
        }
        return {"rl_module": weights, "weights_seq_no": self.weights_seq_no}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore ``get_state()`` output (full, or ``rl_module`` weights by module id)."""
        for mid, sub in (state.get("learners") or {}).items():
            if mid in self.learners:
                self.learners[mid].set_state(sub)
        for mid, weights in (state.get("rl_module") or {}).items():
            if mid in self.learners:
                self.learners[mid].module.set_state(weights)
        self.weights_seq_no = int(state.get("weights_seq_no", self.weights_seq_no))
        self.num_env_steps_trained = int(
            state.get("num_env_steps_trained", self.num_env_steps_trained)
        )
