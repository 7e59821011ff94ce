"""State, weights, checkpoints and lifecycle of ``MultiAgentEnvRunner`` (a mixin).

Why: kept apart from the sampling side of the runner so each module stays short.
The state has the single-agent runner's layout, except that the module state is
``{module_id: weights}`` (never unwrapped) and each connector component is
``{module_id: pipeline state}``.
"""

from __future__ import annotations

from typing import Any

from envrunners.core import (
    COMPONENT_ENV_TO_MODULE_CONNECTOR,
    COMPONENT_MODULE_TO_ENV_CONNECTOR,
    COMPONENT_RL_MODULE,
)
from envrunners.env import runner_setup
from envrunners.utils import metrics as M

__all__ = ["MultiAgentRunnerStateMixin"]


class MultiAgentRunnerStateMixin:
    """``get_state``/``set_state``, weights, checkpoints, health and ``stop``."""

    module: Any
    env: Any
    config: Any
    worker_index: int | None
    num_env_steps_sampled_lifetime: int
    _weights_seq_no: int
    _env_to_module: dict
    _module_to_env: dict

    def get_state(
        self,
        components: str | list[str] | None = None,
        *,
        not_components: str | list[str] | None = None,
        **kwargs: Any,
    ) -> dict:
        """Lifetime step count, module weights (+ ``weights_seq_no``) and connector states.

        Args:
            components: Only these (``"rl_module"``, ``"rl_module/p0"``, connector names).
            not_components: Leave these out.
            **kwargs: ``inference_only`` (drop learner-only weights).

        Raises:
            AttributeError: ``rl_module`` is selected but the runner has no module.
        """
        state: dict[str, Any] = {
            "num_env_steps_sampled_lifetime": self.num_env_steps_sampled_lifetime
        }
        pick = runner_setup.component_selector(components, not_components)
        if pick(COMPONENT_RL_MODULE):
            if self.module is None:
                raise AttributeError("this runner has no module; its rl_module state is undefined")
            sub = _sub_components(components, COMPONENT_RL_MODULE)
            not_sub = _sub_components(not_components, COMPONENT_RL_MODULE)
            state[COMPONENT_RL_MODULE] = self.module.get_state(
                components=sub,
                not_components=not_sub,
                inference_only=kwargs.get("inference_only", False),
            )
            state[M.WEIGHTS_SEQ_NO] = self._weights_seq_no
        if pick(COMPONENT_ENV_TO_MODULE_CONNECTOR):
            state[COMPONENT_ENV_TO_MODULE_CONNECTOR] = {
                mid: p.get_state() for mid, p in self._env_to_module.items()
            }
        if pick(COMPONENT_MODULE_TO_ENV_CONNECTOR):
            state[COMPONENT_MODULE_TO_ENV_CONNECTOR] = {
                mid: p.get_state() for mid, p in self._module_to_env.items()
            }
        return state

    def set_state(self, state: dict) -> None:
        """Apply a state; module weights only if ``weights_seq_no`` is 0 or newer than ours."""
        for key, pipelines in (
            (COMPONENT_ENV_TO_MODULE_CONNECTOR, self._env_to_module),
            (COMPONENT_MODULE_TO_ENV_CONNECTOR, self._module_to_env),
        ):
            for mid, sub in (state.get(key) or {}).items():
                if mid in pipelines:
                    pipelines[mid].set_state(sub)
        if COMPONENT_RL_MODULE in state:
            seq = int(state.get(M.WEIGHTS_SEQ_NO, 0) or 0)
            if seq == 0 or self._weights_seq_no < seq:
                weights = runner_setup.resolve_ref(state[COMPONENT_RL_MODULE])
                if self.module is None:
                    raise AttributeError("this runner has no module to set weights on")
                self.module.set_state(weights)
            if seq > 0:
                self._weights_seq_no = max(self._weights_seq_no, seq)
        if "num_env_steps_sampled_lifetime" in state:
            self.num_env_steps_sampled_lifetime = int(state["num_env_steps_sampled_lifetime"])

    def get_weights(self, modules: Any = None) -> dict:
        """``{module_id: weights}`` (all modules, or those in ``modules``)."""
        comps = COMPONENT_RL_MODULE
        if modules is not None:
            ids = [modules] if isinstance(modules, str) else list(modules)
            comps = [f"{COMPONENT_RL_MODULE}/{mid}" for mid in ids]  # type: ignore[assignment]
        return self.get_state(components=comps)[COMPONENT_RL_MODULE]


def _sub_components(value: str | list[str] | None, prefix: str) -> list[str] | None:
    """``["rl_module/p0"]`` -> ``["p0"]``; None if nothing below ``prefix`` is named."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    subs = [c[len(prefix) + 1 :] for c in items if c.startswith(prefix + "/")]
    return subs or None
