"""Plain-file checkpoints of nested state dicts: JSON plus ``.npz``, never pickle.

A state is a nested dict whose leaves are numpy arrays, numbers, strings, bools,
None or lists of those. Arrays go into ``arrays.npz`` (loaded with
``allow_pickle=False``), everything else into ``state.json``. Writes go to a
temporary directory renamed into place, so a checkpoint is complete or absent.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from envrunners.errors import EnvRunnersError

__all__ = ["load_state", "save_state"]

_ARRAY = "__ndarray__"
_SEP = "/"


def _split(state: Any, prefix: str, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(state, dict):
        out = {}
        for key, value in state.items():
            if not isinstance(key, str) or _SEP in key:
                raise EnvRunnersError(
                    f"checkpoint state keys must be str without {_SEP!r}, got {key!r}"
                )
            out[key] = _split(value, f"{prefix}{_SEP}{key}" if prefix else key, arrays)
        return out
    if isinstance(state, np.ndarray):
        if state.dtype == object:
            raise EnvRunnersError(f"cannot checkpoint object array at {prefix!r} without pickle")
        arrays[prefix] = state
        return {_ARRAY: prefix}
    if isinstance(state, np.generic):
        return state.item()
    if isinstance(state, list | tuple):
        return [_split(v, f"{prefix}{_SEP}{i}", arrays) for i, v in enumerate(state)]
    if state is None or isinstance(state, bool | int | float | str):
        return state
    if hasattr(state, "detach") and hasattr(state, "numpy"):  # a torch tensor
        return _split(state.detach().cpu().numpy(), prefix, arrays)
    raise EnvRunnersError(
        f"cannot checkpoint {type(state).__name__} at {prefix!r}: only numpy arrays, numbers, "
        "strings, bools, None, lists and dicts are stored (no pickle)."
    )


def _join(tree: Any, arrays: Any) -> Any:
    if isinstance(tree, dict):
        if set(tree) == {_ARRAY}:
            return arrays[tree[_ARRAY]]
        return {k: _join(v, arrays) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_join(v, arrays) for v in tree]
    return tree


def save_state(path: str | os.PathLike, state: dict, metadata: dict | None = None) -> Path:
    """Write ``state`` (and JSON ``metadata``) to directory ``path`` atomically."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    tree = _split(state, "", arrays)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with open(tmp / "state.json", "w") as f:
            json.dump(tree, f)
        np.savez(tmp / "arrays.npz", **arrays)
        with open(tmp / "metadata.json", "w") as f:
            json.dump(metadata or {}, f)
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def load_state(path: str | os.PathLike) -> tuple[dict, dict]:
    """Read ``(state, metadata)`` written by ``save_state``."""
    src = Path(path)
    if not (src / "state.json").is_file():
        raise EnvRunnersError(f"{src} is not a checkpoint directory (no state.json in it)")
    with open(src / "state.json") as f:
        tree = json.load(f)
    with np.load(src / "arrays.npz", allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    metadata: dict = {}
    if (src / "metadata.json").is_file():
        with open(src / "metadata.json") as f:
            metadata = json.load(f)
    return _join(tree, arrays), metadata
