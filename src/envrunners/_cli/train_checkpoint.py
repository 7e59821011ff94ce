"""The checkpoint of an ``envrunners train`` run: where it lives, writing it, reading it back.

Why: three parties share it: the training loop writes one per iteration,
``train --resume`` continues from one and ``sample --checkpoint`` acts with its
policy. It is plain files (``envrunners.utils.checkpoints``) in ``checkpoint/``
of the run directory, tagged with a format name so a foreign directory is
refused with a clear message.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from envrunners.errors import CliError, EnvRunnersError

__all__ = ["CHECKPOINT_DIR", "load_checkpoint", "save_checkpoint"]

#: The checkpoint's folder inside a run directory.
CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_FORMAT = "envrunners-train-checkpoint"
#: Run settings a checkpoint leaves out: each resume gives its own budget.
_NOT_SAVED = ("stop_timesteps",)


def save_checkpoint(run_dir: Path, state: dict[str, Any], run: dict[str, Any]) -> None:
    """Write ``state`` and the run's settings (all but its budget) to ``run_dir/checkpoint``.

    Args:
        run_dir: The run's output directory.
        state: ``learner``, ``env_runner`` and ``progress`` states.
        run: The run's settings (``env``, ``algo``, hyperparameters, ...).
    """
    import envrunners
    from envrunners.utils.checkpoints import save_state

    state = {**state, "run": {k: v for k, v in run.items() if k not in _NOT_SAVED}}
    metadata = {
        "format": CHECKPOINT_FORMAT,
        "version": 1,
        "envrunners_version": envrunners.__version__,
        "env": run["env"],
        "algo": run["algo"],
        "saved_at": _dt.datetime.now().isoformat(timespec="seconds"),
    }
    save_state(run_dir / CHECKPOINT_DIR, state, metadata)


def load_checkpoint(path: Path) -> dict:
    """Read the checkpoint of the run in ``path`` (the run directory or its ``checkpoint/``).

    Raises:
        CliError: No ``envrunners train`` checkpoint there (exit code 2).
    """
    from envrunners.utils.checkpoints import load_state

    ckpt = path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path
    try:
        state, meta = load_state(ckpt)
    except (EnvRunnersError, OSError, ValueError) as err:
        raise CliError(
            f"--resume {str(path)!r}: no envrunners train checkpoint there ({err})"
        ) from None
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise CliError(f"--resume {str(path)!r}: {ckpt} is not an `envrunners train` checkpoint")
    return state
