"""Copy-on-write private views of object-store arrays, for weights a runner adopts.

``ray.get`` of numpy arrays is zero-copy: they are read-only views of the object
store's shared memory. Loading them into a module by copying costs a remote runner
about 7 ms per 40 MB per sync. Pointing the module's parameters at the shared
pages instead is free, but torch ignores numpy's read-only flag: an in-place write
(an optimizer step, ``param.add_(...)``) would change the object for every reader.

``adoptable_state`` maps the same pages a second time with ``MAP_PRIVATE``: reads
share the physical pages (nothing is copied), and the kernel gives this process
its own copy of a page on the first write to it, so writes stay private and never
reach shared memory. Each view keeps the array it came from, and with it Ray's pin
on the object, alive: the pages cannot be reused while any parameter uses them, and
they are released once the module drops them (at the next sync). The new mapping's
pages are faulted in by the first forward pass that reads them (about 2.5 ms per
40 MB here, against 7 ms for the copy), not during the sync.

Linux only (``/proc/self/maps`` and ``/proc/self/map_files``). Anywhere this does
not work (another OS, small objects that Ray keeps out of shared memory, an array
that is not contiguous) ``adoptable_state`` returns None and the caller copies.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["AdoptableState", "adoptable_state"]

logger = logging.getLogger("envrunners")

#: Below this many bytes in all, copying is cheaper than mapping (about 60 us).
MIN_BYTES = 1 << 20


class AdoptableState(dict):
    """A module state whose arrays the receiver may keep as its parameters' storage.

    Its arrays are writable, private to this process and used by nobody else, so
    ``RLModule.set_state`` points parameters at them instead of copying. Nested
    states (``{module_id: state}``) are ``AdoptableState`` at every level.
    """


class _PinnedMap(mmap.mmap):
    """A private mapping that keeps the arrays it maps again (``pins``) alive."""

    pins: list[np.ndarray]


@dataclass(frozen=True)
class _Region:
    """One file-backed shared mapping of this process (a line of ``/proc/self/maps``)."""

    start: int
    end: int
    offset: int
    inode: int


_regions: list[_Region] = []  # shared mappings seen before (the object store's)
_disabled = False  # set after a failure that would repeat (e.g. no map_files access)


def _read_region(addr: int) -> _Region | None:
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) < 6 or "s" not in fields[1]:
                    continue
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                if lo <= addr < hi and int(fields[4]) != 0:
                    region = _Region(lo, hi, int(fields[2], 16), int(fields[4]))
                    _regions.append(region)
                    return region
    except OSError:
        return None
    return None


def _region_of(addr: int) -> _Region | None:
    for region in _regions:
        if region.start <= addr < region.end:
            return region
    return _read_region(addr)


def _open_region(region: _Region) -> int | None:
    """An fd of the file behind ``region``, if it is still the mapping we saw."""
    try:
        fd = os.open(f"/proc/self/map_files/{region.start:x}-{region.end:x}", os.O_RDONLY)
    except OSError:
        return None
    if os.fstat(fd).st_ino != region.inode:
        os.close(fd)
        return None
    return fd


def _map_group(region: _Region, arrays: list[np.ndarray]) -> list[np.ndarray] | None:
    """Private views of ``arrays`` (all inside ``region``), from one new mapping."""
    addrs = [a.__array_interface__["data"][0] for a in arrays]
    lo = min(addrs)
    hi = max(addr + a.nbytes for addr, a in zip(addrs, arrays))
    file_lo = region.offset + (lo - region.start)
    base = file_lo - file_lo % mmap.ALLOCATIONGRANULARITY
    fd = _open_region(region)
    if fd is None:  # stale (the mapping changed since we read it): read it again
        _regions.remove(region)
        fresh = _read_region(lo)
        if fresh is None or hi > fresh.end:
            return None
        region = fresh
        file_lo = region.offset + (lo - region.start)
        base = file_lo - file_lo % mmap.ALLOCATIONGRANULARITY
        fd = _open_region(region)
        if fd is None:
            raise OSError(f"cannot open /proc/self/map_files for {region}")
    try:
        pinned = _PinnedMap(
            fd,
            hi - lo + (file_lo - base),
            flags=mmap.MAP_PRIVATE,
            prot=mmap.PROT_READ | mmap.PROT_WRITE,
            offset=base,
        )
    finally:
        os.close(fd)
    pinned.pins = arrays
    shift = file_lo - base - lo
    return [
        np.frombuffer(pinned, dtype=a.dtype, count=a.size, offset=addr + shift).reshape(a.shape)
        for addr, a in zip(addrs, arrays)
    ]


def _leaves(tree: Mapping[str, Any], out: list[np.ndarray]) -> bool:
    """Collect the array leaves; False if some leaf cannot be viewed (not contiguous)."""
    for value in tree.values():
        if isinstance(value, np.ndarray):  # (first: the ABC check below is slower)
            if not value.flags.c_contiguous:
                return False
            if value.nbytes:
                out.append(value)
        elif isinstance(value, Mapping):
            if not _leaves(value, out):
                return False
    return True


def _rebuild(tree: Mapping[str, Any], views: dict[int, np.ndarray]) -> AdoptableState:
    out = AdoptableState()
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out[key] = _rebuild(value, views)
        elif isinstance(value, np.ndarray):
            out[key] = views[id(value)] if value.nbytes else value.copy()
        else:
            out[key] = value
    return out


def adoptable_state(state: Mapping[str, Any], min_bytes: int = MIN_BYTES) -> AdoptableState | None:
    """Copy-on-write views of ``state``'s arrays (fresh from ``ray.get``), or None.

    Args:
        state: A (nested) ``{name: numpy array}`` module state whose arrays live in
            Ray's object store (read-only, zero-copy ``ray.get`` results).
        min_bytes: Below this total size return None (copying is cheaper).

    Returns:
        The same tree as an ``AdoptableState`` with every array replaced by a
        writable private view of the same memory, or None when any array is not
        in a shared file mapping or the mapping fails (then copy as usual).
    """
    global _disabled
    arrays: list[np.ndarray] = []
    if _disabled or not _leaves(state, arrays) or not arrays:
        return None
    if sum(a.nbytes for a in arrays) < min_bytes:
        return None
    groups: dict[_Region, list[np.ndarray]] = {}
    for a in arrays:
        region = _region_of(a.__array_interface__["data"][0])
        if region is None:
            return None  # e.g. a small object Ray kept in the process heap
        groups.setdefault(region, []).append(a)
    views: dict[int, np.ndarray] = {}
    try:
        for region, group in groups.items():
            mapped = _map_group(region, group)
            if mapped is None:
                return None
            views.update((id(a), v) for a, v in zip(group, mapped))
    except (OSError, ValueError) as err:
        _disabled = True
        logger.debug("Copy-on-write weight views are unavailable here (%r); copying.", err)
        return None
    return _rebuild(state, views)
