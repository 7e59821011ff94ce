"""Methods shared by the new-stack runners: weights, health, stop and checkpoints.

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
from envrunners.env import runner_setup
from envrunners.offline.episode_writer import close_episode_writer
from envrunners.utils import metrics as M
from envrunners.utils.checkpoints import load_state, save_state

__all__ = ["RunnerCommonMixin"]


class RunnerCommonMixin:
    """For runners with ``get_state``/``set_state``, ``env``, ``module`` and two
    connector pipelines: ``set_weights``, ``assert_healthy``, ``stop`` and the
    ``save_to_path``/``restore_from_path``/``from_checkpoint`` checkpoints."""

    def set_weights(
        self, weights: dict, global_vars: dict | None = None, weights_seq_no: int = 0
    ) -> None:
        """Set module weights, gated by ``weights_seq_no`` like ``set_state``."""
        self.set_state({COMPONENT_RL_MODULE: weights, M.WEIGHTS_SEQ_NO: weights_seq_no})  # type: ignore[attr-defined]
        if global_vars and "num_env_steps_sampled_lifetime" in global_vars:
            self.num_env_steps_sampled_lifetime = int(  # type: ignore[attr-defined]
                global_vars["num_env_steps_sampled_lifetime"]
            )

    def assert_healthy(self) -> None:
        """Raise ``AssertionError`` unless the env and module exist."""
        env, module = self.env, self.module  # type: ignore[attr-defined]
        assert env is not None and module is not None, (
            f"{type(self).__name__}(worker_index={self.worker_index}) is not healthy: "  # type: ignore[attr-defined]
            f"env={'ok' if env is not None else 'missing'}, "
            f"module={'ok' if module is not None else 'missing'}"
        )

    def stop(self) -> None:
        """Publish any episode recording and close the env (and its worker processes)."""
        close_episode_writer(self)
        if self.env is not None:  # type: ignore[attr-defined]
            runner_setup.close_quietly(self.env)  # type: ignore[attr-defined]

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
