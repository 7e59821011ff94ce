"""Torch optimizer state as plain data (str keys, numpy leaves) and back.

Why: a policy state must survive ``ray.put`` and plain-file checkpoints
(JSON + ``.npz``, no pickle); torch's ``state_dict`` has int keys and tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["optimizer_state_from_plain", "optimizer_state_to_plain"]


def optimizer_state_to_plain(state: dict[str, Any]) -> dict[str, Any]:
    """A torch optimizer ``state_dict`` with str keys and numpy leaves (checkpointable)."""

    def leaf(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.detach().cpu().numpy().copy()
        if isinstance(v, tuple):
            return list(v)
        return v

    return {
        "state": {str(k): {n: leaf(v) for n, v in s.items()} for k, s in state["state"].items()},
        "param_groups": [{n: leaf(v) for n, v in g.items()} for g in state["param_groups"]],
    }


def optimizer_state_from_plain(plain: Mapping[str, Any]) -> dict[str, Any]:
    def leaf(name: str, v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return torch.from_numpy(v.copy())
        if name == "betas" and isinstance(v, list):
            return tuple(v)
        return v

    return {
        "state": {int(k): {n: leaf(n, v) for n, v in s.items()} for k, s in plain["state"].items()},
        "param_groups": [
            {n: (list(v) if n == "params" else leaf(n, v)) for n, v in g.items()}
            for g in plain["param_groups"]
        ],
    }
