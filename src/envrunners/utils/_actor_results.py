"""Result containers of fault-aware remote calls, and how remote errors are labelled.

``ResultOrError`` holds one call's value or error, ``CallResult`` adds the actor
id and tag, ``RemoteCallResults`` collects a batch of them. Remote application
errors arrive as ``RayTaskError``; they are stored as the instance that is also
of the user's exception class, with the actor's id written into the message so
a caller can tell which actor raised.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

__all__ = ["CallResult", "RemoteCallResults", "ResultOrError", "label_remote_error"]


def _as_instance_of_cause(error: BaseException) -> BaseException:
    """``RayTaskError`` → the variant that is also an instance of the user's class."""
    from ray.exceptions import RayTaskError

    if isinstance(error, RayTaskError):
        cause = getattr(error, "cause", None)
        if cause is not None and not isinstance(error, type(cause)):
            return error.as_instanceof_cause()
    return error


def label_remote_error(error: BaseException, label: str) -> BaseException:
    """Return ``error`` with ``label`` (e.g. ``"env runner 2"``) leading its message.

    Why: a ``RayTaskError`` names the remote function and pid but not which of a
    group's runners raised. The result is still a ``RayTaskError`` and still an
    instance of the original exception class, so ``except ValueError`` and
    ``except RayError`` both keep working. Other errors are returned unchanged.
    """
    from ray.exceptions import RayTaskError

    if not isinstance(error, RayTaskError):
        return error
    cause = getattr(error, "cause", None)
    if cause is None:
        return error
    text = f"{label} raised {type(cause).__name__}: {error}"
    relabelled = RayTaskError(
        getattr(error, "function_name", "apply"), text, cause, proctitle=label, pid=0, ip="-"
    )
    return _as_instance_of_cause(relabelled)


def remote_traceback_of(error: BaseException) -> str:
    """The remote traceback text carried by a (labelled) ``RayTaskError``, or ``str(error)``."""
    inner = getattr(error, "remote_traceback", None)
    if isinstance(inner, str) and inner:
        return inner
    return str(error)


class ResultOrError:
    """The value returned by one remote call, or the error it raised.

    ``None`` is a valid result. A ``RayTaskError`` is stored as the instance that
    also derives from the remote exception's class (``isinstance(err, KeyError)``
    holds for a remote ``KeyError``).

    Args:
        result: The returned value.
        error: The exception, if the call failed.
    """

    __slots__ = ("_error", "_result")

    def __init__(self, result: Any = None, error: BaseException | None = None):
        self._result = result
        self._error = _as_instance_of_cause(error) if error is not None else None

    @property
    def ok(self) -> bool:
        """True when the call returned without error."""
        return self._error is None

    @property
    def result(self) -> Any:
        """The returned value (None for a failed call)."""
        return self._result

    @property
    def error(self) -> BaseException | None:
        """The exception of a failed call, else None."""
        return self._error

    def get(self) -> Any:
        """The error if there is one, else the result."""
        return self._error if self._error is not None else self._result

    def __repr__(self) -> str:
        if self.ok:
            return f"ResultOrError(result={self._result!r})"
        return f"ResultOrError(error={type(self._error).__name__})"


@dataclasses.dataclass
class CallResult:
    """One remote call's outcome, with the id of the actor that served it and its tag."""

    actor_id: int
    result_or_error: ResultOrError
    tag: str | None = None

    @property
    def ok(self) -> bool:
        """True when the call returned without error."""
        return self.result_or_error.ok

    def get(self) -> Any:
        """The error if there is one, else the result."""
        return self.result_or_error.get()


class RemoteCallResults:
    """The outcomes of a batch of remote calls, in the order they were collected."""

    def __init__(self) -> None:
        self.result_or_errors: list[CallResult] = []

    def add_result(self, actor_id: int, result_or_error: ResultOrError, tag: str | None) -> None:
        """Append one call's outcome."""
        self.result_or_errors.append(CallResult(actor_id, result_or_error, tag))

    def __len__(self) -> int:
        return len(self.result_or_errors)

    def __iter__(self) -> Iterator[CallResult]:
        # A copy, so callers may add results while iterating.
        return iter(list(self.result_or_errors))

    def ignore_errors(self) -> Iterator[CallResult]:
        """Only the successful results."""
        return (r for r in self.result_or_errors if r.ok)

    def ignore_ray_errors(self) -> Iterator[CallResult]:
        """The results whose ``get()`` is not a ``RayError``.

        Remote application errors arrive as ``RayTaskError`` (a ``RayError``), so
        in practice this yields the successful results only.
        """
        from ray.exceptions import RayError

        return (r for r in self.result_or_errors if not isinstance(r.get(), RayError))

    def __repr__(self) -> str:
        ok = sum(1 for r in self.result_or_errors if r.ok)
        return f"RemoteCallResults({ok} ok, {len(self) - ok} errors)"
