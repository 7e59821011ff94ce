"""``EmptyInfosBuffer``: an episode's infos of ``n`` empty dicts, made on first use.

Why: most envs return no infos, yet an episode holds one distinct dict per
observation (a user may fill one step's dict without touching the others). A
sampler builds hundreds of episodes per ``sample()`` call; making their
thousands of empty dicts up front costs allocations and the garbage collections
they trigger, mostly for dicts nobody reads. This buffer holds only their
count: the first read or write of ``data`` (every getter, setter, ``append``,
``get_state``, ``==``) makes the dicts and turns the object into a plain
``InfiniteLookbackBuffer`` for good, so what users see is unchanged. Lengths
(``len``, ``validate``) and pickling (``_episode_transport``) need no dicts.
"""

from __future__ import annotations

import copy
from typing import Any

from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

__all__ = ["EmptyInfosBuffer"]

#: The base class's ``data`` slot (this subclass's ``data`` property shadows it).
_DATA = InfiniteLookbackBuffer.__dict__["data"]


class EmptyInfosBuffer(InfiniteLookbackBuffer):
    """A non-finalized buffer of ``n`` distinct empty dicts, ``lookback`` of them history.

    Until its data is touched, the base ``data`` slot holds the count ``n``.
    No slots of its own: the object's class can switch to ``InfiniteLookbackBuffer``.
    """

    __slots__ = ()

    @classmethod
    def of_length(cls, n: int, lookback: int) -> EmptyInfosBuffer:
        """``n`` empty dicts, the first ``min(lookback, n)`` of them lookback."""
        buf = object.__new__(cls)
        _DATA.__set__(buf, n)
        buf.lookback = min(lookback, n)
        buf.finalized = False
        buf._space = None
        buf.space_struct = None
        return buf

    @property
    def data(self) -> list[dict]:  # type: ignore[override]
        """Make the dicts: from now on this is a plain ``InfiniteLookbackBuffer``."""
        data = [{} for _ in range(_DATA.__get__(self))]
        _DATA.__set__(self, data)
        self.__class__ = InfiniteLookbackBuffer
        return data

    @data.setter
    def data(self, value: Any) -> None:
        _DATA.__set__(self, value)
        self.__class__ = InfiniteLookbackBuffer

    def len_incl_lookback(self) -> int:
        """The number of dicts (lookback included), without making them."""
        return _DATA.__get__(self)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        """Pickle (and ``copy.deepcopy``) as the count: the copy makes its own dicts."""
        return (EmptyInfosBuffer.of_length, (_DATA.__get__(self), self.lookback))

    def __copy__(self) -> InfiniteLookbackBuffer:
        """A shallow copy shares the dicts: make them, then copy the plain buffer."""
        self.data  # noqa: B018 (makes the dicts; the class is the base one from now on)
        return copy.copy(self)
