"""A module's ``state_dict(keep_vars=True)``, kept while its parameters and buffers stay put.

Why: every weight sync reads the source module's state and loads it into each
runner's module; walking the module tree for ``state_dict`` costs more than
copying a small module's weights (about 15 us hot, 50 us in an idle runner).

The cached entries are valid while no parameter, buffer or submodule was
registered anywhere in the process since (torch's global registration hooks,
which also see ``module.weight = nn.Parameter(...)``) and every entry is still
the tensor its owner module holds under that name (which catches deletion,
``None``, and ``_apply`` making new parameters). Modules that change what
``state_dict`` returns (state-dict hooks, an own ``state_dict``,
``_save_to_state_dict`` or ``get_extra_state``) are not cached.

``numpy_views`` adds writable numpy views of the (CPU) entries' memory, which
``get_state`` hands out and ``set_state`` copies into with ``np.copyto``: in an
idle runner that costs about a quarter of ``from_numpy`` plus
``torch._foreach_copy_`` (about 45 us against 180 us for the default module). They
are checked per call (``data_ptr``) like the acting path's views, and dropped when
the module's storage is replaced (``drop_numpy_views``). ``prefer_huge_pages`` backs
the large entries of a module whose weights are read for sending with huge pages.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = [
    "CacheRecord",
    "drop_numpy_views",
    "numpy_views",
    "prefer_huge_pages",
    "state_entries",
]

#: Replaced by a new object whenever torch registers a parameter, buffer or module.
_token: object = object()
_hooks_installed = False
_CACHE_ATTR = "_state_entries_cache"
_VIEWS_ATTR = "_state_views_cache"
_HUGE_PAGES_ATTR = "_state_huge_pages"
_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25
_DATA_PTR = torch.Tensor.data_ptr


class CacheRecord(tuple):
    """A cache record kept on a module; a copied or pickled module goes without it (it
    describes the original's tensors)."""

    def __reduce__(self) -> tuple:
        return (type(None), ())


def _new_token(*_: Any) -> None:
    """Registration hook: every cached entry list is stale now (returns None: keeps the object)."""
    global _token
    _token = object()


def _install_hooks() -> None:
    global _hooks_installed
    from torch.nn.modules import module as torch_module

    for register in (
        torch_module.register_module_parameter_registration_hook,
        torch_module.register_module_buffer_registration_hook,
        torch_module.register_module_module_registration_hook,
    ):
        register(_new_token)
    _hooks_installed = True


def state_entries(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict(keep_vars=True)`` (cached; the caller must not change the dict)."""
    cache = module.__dict__.get(_CACHE_ATTR)
    if cache is not None and cache[0] is _token:
        _, entries, owners, hooks = cache
        if entries is None:  # not cacheable (checked again after the next registration)
            return module.state_dict(keep_vars=True)
        if not any(hooks) and all(holder.get(name) is tensor for holder, name, tensor in owners):
            return entries
    if not _hooks_installed:
        _install_hooks()
    token = _token
    entries = module.state_dict(keep_vars=True)
    record = _cache_record(module, entries) or (None, None, None)
    # (``object.__setattr__``: a plain attribute, past nn.Module's registration)
    object.__setattr__(module, _CACHE_ATTR, CacheRecord((token, *record)))
    return entries


def _cache_record(module: nn.Module, entries: dict[str, torch.Tensor]) -> tuple | None:
    """``(entries, [(owner's dict, name, tensor)], the modules' state-dict hook dicts)``, or
    None: not cacheable. (No module is referenced: no reference cycle through the module.)"""
    modules = list(module.modules())
    for m in modules:
        cls = type(m)
        if (
            m._state_dict_hooks
            or m._state_dict_pre_hooks
            or cls.state_dict is not nn.Module.state_dict
            or cls._save_to_state_dict is not nn.Module._save_to_state_dict
            or cls.get_extra_state is not nn.Module.get_extra_state
        ):
            return None
    owners = []
    for full_name, tensor in entries.items():
        prefix, _, name = full_name.rpartition(".")
        try:
            owner = module.get_submodule(prefix) if prefix else module
        except AttributeError:
            return None
        holder = owner._parameters if name in owner._parameters else owner._buffers
        if holder.get(name) is not tensor:
            return None
        owners.append((holder, name, tensor))
    hooks = [h for m in modules for h in (m._state_dict_hooks, m._state_dict_pre_hooks)]
    return entries, owners, hooks


def numpy_views(
    module: nn.Module, entries: dict[str, torch.Tensor]
) -> tuple[list[tuple[str, np.ndarray]], list[torch.Tensor]] | None:
    """``([(name, writable numpy view of the entry)], tensors)`` for the cached ``entries``
    (``state_entries(module)``); None if they are not cached or some entry is not a
    plain CPU tensor numpy can view.

    Whoever writes through the views bumps the tensors' autograd versions
    (``torch.autograd.graph.increment_version``), as an in-place ``copy_`` would.
    """
    cache = module.__dict__.get(_VIEWS_ATTR)
    if cache is not None and cache[0] is entries:
        _, targets, tensors, pointers = cache
        if list(map(_DATA_PTR, tensors)) == pointers:
            return targets
    record = module.__dict__.get(_CACHE_ATTR)
    if record is None or record[1] is not entries:
        return None  # views made per call would cost more than they save
    tensors = list(entries.values())
    views: list[tuple[str, np.ndarray]] = []
    for name, tensor in entries.items():
        if tensor.device.type != "cpu" or tensor.layout != torch.strided:
            break
        try:
            views.append((name, tensor.detach().numpy()))
        except (TypeError, RuntimeError):  # e.g. bfloat16, or a conjugate view
            break
    targets = (views, tensors) if len(views) == len(tensors) else None
    pointers = list(map(_DATA_PTR, tensors))
    object.__setattr__(module, _VIEWS_ATTR, CacheRecord((entries, targets, tensors, pointers)))
    return targets


def drop_numpy_views(module: nn.Module) -> None:
    """Forget the numpy views (the module's storage was replaced: they would keep the old)."""
    module.__dict__.pop(_VIEWS_ATTR, None)


def prefer_huge_pages(module: nn.Module, targets: tuple[list, list] | None) -> None:
    """Back the memory of the large entries in ``targets`` (``numpy_views``) with huge
    pages, once per storage.

    Why: torch allocates parameters on 4 KB pages; a weight sync reads all of them
    into the object store, and reading from huge pages (which numpy gives large
    arrays) is about 20% faster here (fewer TLB misses), 0.5 ms per 40 MB.
    ``MADV_COLLAPSE`` (Linux 6.1+) makes them at once, a one-off 10-100 ms per 40 MB;
    where it fails nothing changes. Only whole 2 MB pages inside anonymous private
    mappings (never a file mapping, e.g. adopted object-store pages); contents stay.
    """
    if targets is None or not sys.platform.startswith("linux"):
        return
    done = module.__dict__.get(_HUGE_PAGES_ATTR)
    if done is not None and done[0] is targets:
        return
    object.__setattr__(module, _HUGE_PAGES_ATTR, CacheRecord((targets,)))
    spans = []
    for _, view in targets[0]:
        addr = view.__array_interface__["data"][0]
        lo = -(-addr // _HUGE_PAGE) * _HUGE_PAGE
        hi = (addr + view.nbytes) // _HUGE_PAGE * _HUGE_PAGE
        if hi > lo:
            spans.append((lo, hi))
    if spans:
        _collapse(spans)


def _collapse(spans: list[tuple[int, int]]) -> None:
    try:
        with open("/proc/self/maps") as maps:
            anonymous = []
            for line in maps:
                fields = line.split()
                if len(fields) == 5 and fields[1].endswith("p") and fields[4] == "0":
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    anonymous.append((lo, hi))
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for lo, hi in spans:
        if any(a <= lo and hi <= b for a, b in anonymous):
            madvise(lo, hi - lo, _MADV_HUGEPAGE)
            madvise(lo, hi - lo, _MADV_COLLAPSE)
