"""Checkpoint methods shared by the new-stack runners (RLlib's ``Checkpointable`` subset).

A runner's state goes to a directory as plain files (JSON + ``.npz``, no
pickle, written atomically); restoring always applies the weights.
"""

from __future__ import annotations

from typing import Any

from envrunners.core import (
    COMPONENT_ENV_TO_MODULE_CONNECTOR,
    COMPONENT_MODULE_TO_ENV_CONNECTOR,
    COMPONENT_RL_MODULE,
)
from envrunners.utils import metrics as M
from envrunners.utils.checkpoints import load_state, save_state

__all__ = ["RunnerCheckpointMixin"]


class RunnerCheckpointMixin:
    """``save_to_path``/``restore_from_path``/``from_checkpoint`` for runners with
    ``get_state``/``set_state``, a ``module`` and two connector pipelines."""

    def get_ctor_args_and_kwargs(self) -> tuple[tuple, dict]:
        """What rebuilds this runner: ``((), {"config": config})``."""
        return (), {"config": self.config}  # type: ignore[attr-defined]

    def get_checkpointable_components(self) -> list[tuple[str, Any]]:
        """The module and both connector pipelines."""
        return [
            (COMPONENT_RL_MODULE, self.module),  # type: ignore[attr-defined]
            (COMPONENT_ENV_TO_MODULE_CONNECTOR, self._env_to_module),  # type: ignore[attr-defined]
            (COMPONENT_MODULE_TO_ENV_CONNECTOR, self._module_to_env),  # type: ignore[attr-defined]
        ]

    def get_metadata(self) -> dict:
        """Class and version info stored next to a checkpoint."""
        import envrunners

        return {
            "class": f"{type(self).__module__}.{type(self).__qualname__}",
            "envrunners_version": envrunners.__version__,
            "checkpoint_version": 1,
        }

    def save_to_path(self, path: str, *, state: dict | None = None) -> str:
        """Write the runner state to directory ``path`` (plain files, atomically)."""
        state = self.get_state() if state is None else state  # type: ignore[attr-defined]
        return str(save_state(path, state, self.get_metadata()))

    def restore_from_path(self, path: str, **kwargs: Any) -> None:
        """Load a state written by ``save_to_path`` (weights always applied)."""
        state, _ = load_state(path)
        state = dict(state)
        state.pop(M.WEIGHTS_SEQ_NO, None)
        self.set_state(state)  # type: ignore[attr-defined]

    @classmethod
    def from_checkpoint(cls, path: str, *, config: Any, **kwargs: Any) -> Any:
        """Build a runner from ``config`` and restore the checkpoint at ``path`` into it."""
        runner = cls(config=config, **kwargs)
        runner.restore_from_path(path)
        return runner
