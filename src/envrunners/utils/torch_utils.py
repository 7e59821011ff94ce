"""Small torch helpers shared by modules, runners and policies.

Runners call :func:`set_torch_threads` once at start-up so that several runners on
one machine do not fight over cores, and :func:`convert_to_torch_tensor` turns the
numpy structures that connectors and episodes produce into the tensors a module
expects (float64 becomes float32, which is what every default module computes in).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from envrunners.errors import ConfigError

__all__ = ["convert_to_numpy", "convert_to_torch_tensor", "set_torch_threads"]


def set_torch_threads(n: int | None) -> int:
    """Set torch's intra-op thread count for this process and return the previous value.

    A runner that owns one CPU gains nothing from torch spreading a tiny MLP over
    many threads, and loses a lot to the synchronisation, so runners default to 1.

    Args:
        n: Threads to use; ``None`` leaves the current setting untouched.

    Returns:
        The thread count in effect before the call.

    Raises:
        ConfigError: ``n`` is not a positive int.
    """
    previous = torch.get_num_threads()
    if n is None:
        return previous
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ConfigError(f"set_torch_threads: n must be a positive int or None, got {n!r}.")
    if int(n) != previous:
        torch.set_num_threads(int(n))
    return previous


def _array_to_tensor(value: np.ndarray, device: torch.device | str | None) -> Any:
    if value.dtype == np.float64:
        value = value.astype(np.float32)
    elif value.dtype == object or value.dtype.kind in "USV":
        return value  # strings and objects have no tensor form; pass them through
    elif not value.flags.writeable:
        # Arrays read from Ray's object store are read-only; torch must own a copy.
        value = value.copy()
    tensor = torch.from_numpy(value)
    return tensor if device is None else tensor.to(device)


def convert_to_torch_tensor(struct: Any, device: torch.device | str | None = None) -> Any:
    """Map a nested structure of numpy arrays and scalars to torch tensors.

    Modules compute in float32, so float64 arrays and Python floats are converted to
    float32; other dtypes keep their type. Tensors are moved to ``device`` if given,
    ``None`` stays ``None`` and strings or object arrays pass through unchanged.

    Args:
        struct: A tensor, array, scalar, or dict / list / tuple nesting of them
            (mappings come back as plain dicts).
        device: Where the tensors should live; ``None`` keeps them on the CPU.

    Returns:
        The same nesting with tensors at the leaves.
    """
    if struct is None or isinstance(struct, str):
        return struct
    if isinstance(struct, torch.Tensor):
        if struct.dtype == torch.float64:
            struct = struct.float()
        return struct if device is None else struct.to(device)
    if isinstance(struct, np.ndarray):
        return _array_to_tensor(struct, device)
    if isinstance(struct, Mapping):
        return {k: convert_to_torch_tensor(v, device) for k, v in struct.items()}
    if isinstance(struct, tuple) and hasattr(struct, "_fields"):  # namedtuple
        return type(struct)(*(convert_to_torch_tensor(v, device) for v in struct))
    if isinstance(struct, (list, tuple)):
        return type(struct)(convert_to_torch_tensor(v, device) for v in struct)
    if isinstance(struct, (bool, np.bool_)):
        return torch.tensor(bool(struct), device=device)
    if isinstance(struct, (int, np.integer)):
        return torch.tensor(int(struct), device=device)
    if isinstance(struct, (float, np.floating)):
        return torch.tensor(float(struct), dtype=torch.float32, device=device)
    return struct


def convert_to_numpy(struct: Any) -> Any:
    """Map a nested structure of tensors to numpy arrays (detached, on the CPU).

    The inverse of :func:`convert_to_torch_tensor` for shipping module outputs and
    states across processes: plain numpy crosses Ray without pickling torch.
    """
    if isinstance(struct, torch.Tensor):
        return struct.detach().cpu().numpy()
    if isinstance(struct, Mapping):
        return {k: convert_to_numpy(v) for k, v in struct.items()}
    if isinstance(struct, tuple) and hasattr(struct, "_fields"):
        return type(struct)(*(convert_to_numpy(v) for v in struct))
    if isinstance(struct, (list, tuple)):
        return type(struct)(convert_to_numpy(v) for v in struct)
    return struct
