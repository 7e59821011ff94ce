"""The files of an ``envrunners train`` run that a later command reads back: checkpoint and settings.

Why: three parties share them: the training loop writes them, ``train --resume``
continues from them and ``sample --checkpoint`` acts with the policy. The
checkpoint (``checkpoint/``) is ``Algorithm.save_to_path``'s format, so the API
loads it too (``Algorithm.from_checkpoint``); the run's command-line settings
(env id, algo, network, ...) sit beside it in ``run.json``. A directory holding
something else (an older CLI checkpoint, a foreign folder) is refused with a
clear message that names the flag it came from.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from envrunners.errors import CliError, EnvRunnersError

__all__ = ["CHECKPOINT_DIR", "RUN_FILE", "load_checkpoint", "save_run_settings"]

#: The checkpoint's folder inside a run directory.
CHECKPOINT_DIR = "checkpoint"
#: The run's settings inside a run directory.
RUN_FILE = "run.json"
#: ``metadata.json`` format of ``Algorithm.save_to_path`` (and of the CLI's checkpoints).
ALGORITHM_FORMAT = "envrunners-algorithm-checkpoint"
#: The format of checkpoints written by envrunners train before it used ``Algorithm``.
_OLD_CLI_FORMAT = "envrunners-train-checkpoint"
#: Run settings not saved: each resume gives its own budget.
_NOT_SAVED = ("stop_timesteps",)


def save_run_settings(run_dir: Path, run: dict[str, Any]) -> None:
    """Write the run's settings (all but its budget) to ``run_dir/run.json`` atomically."""
    settings = {k: v for k, v in run.items() if k not in _NOT_SAVED}
    fd, tmp = tempfile.mkstemp(prefix=".run.", suffix=".json", dir=run_dir)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(settings, f, indent=1, default=str)
        os.replace(tmp, run_dir / RUN_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path, flag: str = "--resume") -> dict[str, Any]:
    """Read the run in ``path`` (the run directory or its ``checkpoint/``).

    Args:
        path: The directory the user named.
        flag: The flag that named it (``--resume``, ``--checkpoint``), for messages.

    Returns:
        The checkpoint's state (``learner``, ``env_runner``, ``progress``) plus
        ``run`` (the settings) and ``path`` (the checkpoint directory, for
        ``Algorithm.restore_from_path``).

    Raises:
        CliError: No usable checkpoint there (exit code 2).
    """
    from envrunners.utils.checkpoints import load_state

    run_dir = path
    ckpt = path / CHECKPOINT_DIR
    if not ckpt.is_dir() and (path / "state.json").is_file():
        ckpt, run_dir = path, path.parent
    try:
        state, meta = load_state(ckpt)
    except EnvRunnersError as err:  # no state.json: not a checkpoint directory
        raise CliError(
            f"{flag} {str(path)!r}: no envrunners train checkpoint there ({err})"
        ) from None
    except Exception as err:  # bad JSON, a truncated npz, no permission
        raise CliError(
            f"{flag} {str(path)!r}: cannot read the checkpoint in {ckpt}: a file is damaged "
            f"or unreadable ({type(err).__name__})"
        ) from None
    if meta.get("format") == _OLD_CLI_FORMAT:
        raise CliError(
            f"{flag} {str(path)!r}: this checkpoint was written by an older envrunners train "
            f"(format {_OLD_CLI_FORMAT!r}), which this version no longer reads; start a new run"
        )
    if meta.get("format") != ALGORITHM_FORMAT:
        raise CliError(f"{flag} {str(path)!r}: {ckpt} is not an envrunners train checkpoint")
    run = _read_run_file(run_dir / RUN_FILE, flag, path)
    if run is None:  # a checkpoint written by Algorithm.save_to_path: settings from its config
        run = _settings_from_config(meta)
    return {**state, "run": run, "path": str(ckpt)}


def _read_run_file(file: Path, flag: str, path: Path) -> dict[str, Any] | None:
    if not file.is_file():
        return None
    try:
        run = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise CliError(f"{flag} {str(path)!r}: cannot read {file.name} ({err})") from None
    if not isinstance(run, dict):
        raise CliError(f"{flag} {str(path)!r}: {file.name} is not a JSON object")
    return run


def _settings_from_config(meta: dict[str, Any]) -> dict[str, Any]:
    """The CLI settings an ``Algorithm`` checkpoint's saved config implies."""
    config = meta.get("config") or {}
    model = config.get("model_config") or {}
    run: dict[str, Any] = {
        "algo": "pg" if ":PG" in str(meta.get("algo_class")) else "ppo",
        "model_config": dict(model),  # the whole network description, defaults left out
    }
    if isinstance(config.get("env"), str):
        run["env"] = config["env"]
    if "observation_filter" in config:
        run["obs_filter"] = config["observation_filter"]
    if model.get("fcnet_hiddens"):
        run["hidden"] = list(model["fcnet_hiddens"])
    for key in ("use_lstm", "lstm_cell_size", "max_seq_len"):
        if key in model:
            run[key] = model[key]
    return run
