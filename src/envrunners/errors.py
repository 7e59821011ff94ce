"""The envrunners exception tree: one class per kind of misuse or failure.

Every error raised on bad input comes from here, and its message names the bad
value, what was expected and, where there is one, the fix::

    EnvRunnersError                  base of everything below
    ├── ConfigError(ValueError)      a config key, type or value is wrong
    ├── EnvCreatorError(TypeError)   an env creator returned something that is not an env
    ├── UnknownPolicyError(KeyError) a policy/module id that is not known
    ├── OfflineDataError(ValueError) a corrupt or unreadable offline record (path, line)
    ├── EnvRunnerError(RuntimeError) a remote runner failed or hung (runner_index)
    ├── SpaceError(ValueError)       an observation or action outside its space
    ├── MultiAgentEnvError(ValueError) a multi-agent env broke the step protocol
    └── ModuleActingError(ValueError) an RLModule's acting inputs or outputs are unusable

The built-in bases keep ``except ValueError`` style code from RLlib working.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "ConfigError",
    "EnvCreatorError",
    "EnvRunnerError",
    "EnvRunnersError",
    "ModuleActingError",
    "MultiAgentEnvError",
    "OfflineDataError",
    "SpaceError",
    "UnknownPolicyError",
    "suggest",
]


def suggest(value: object, candidates: Iterable[object], n: int = 3) -> str:
    """Return a ``" Did you mean 'x'?"`` hint for ``value`` among ``candidates``, or ``""``."""
    names = [str(c) for c in candidates]
    close = difflib.get_close_matches(str(value), names, n=n, cutoff=0.6)
    if not close:
        return ""
    if len(close) == 1:
        return f" Did you mean {close[0]!r}?"
    return " Did you mean one of " + ", ".join(repr(c) for c in close) + "?"


class EnvRunnersError(Exception):
    """Base class of every error envrunners raises on purpose."""


class ConfigError(EnvRunnersError, ValueError):
    """A configuration key, type or value is invalid.

    ``problems`` holds every problem found (``AlgorithmConfig.validate`` reports
    all of them at once); the message joins them, one per line.
    """

    def __init__(self, message: str | None = None, *, problems: list[str] | None = None):
        self.problems = list(problems) if problems else ([message] if message else [])
        if message is None:
            if len(self.problems) == 1:
                message = self.problems[0]
            else:
                lines = "\n".join(f"  - {p}" for p in self.problems)
                message = f"{len(self.problems)} problems in the config:\n{lines}"
        super().__init__(message)


class EnvCreatorError(EnvRunnersError, TypeError):
    """An env creator (gym id, class or callable) did not produce a usable env."""


class UnknownPolicyError(EnvRunnersError, KeyError):
    """A policy or module id was asked for that does not exist."""

    def __str__(self) -> str:  # KeyError would repr() the message; show it plainly.
        return str(self.args[0]) if self.args else ""


class OfflineDataError(EnvRunnersError, ValueError):
    """Offline data could not be read: names the file and (1-based) line."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        self.path = path
        self.line = line
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)


class EnvRunnerError(EnvRunnersError, RuntimeError):
    """A (remote) env runner failed, died or hung; carries its index and remote traceback."""

    def __init__(
        self,
        message: str,
        *,
        runner_index: int | None = None,
        remote_traceback: str | None = None,
    ):
        self.runner_index = runner_index
        self.remote_traceback = remote_traceback
        prefix = f"env runner {runner_index}: " if runner_index is not None else ""
        text = prefix + message
        if remote_traceback:
            text += "\n\nRemote traceback:\n" + remote_traceback
        super().__init__(text)


class SpaceError(EnvRunnersError, ValueError):
    """An observation or action is outside its declared gymnasium space."""


class MultiAgentEnvError(EnvRunnersError, ValueError):
    """A multi-agent env or episode was used against the multi-agent step protocol."""


# core: RLModule acting (issue 14)
class ModuleActingError(EnvRunnersError, ValueError):
    """An RLModule cannot act on what it was given, or its outputs name no action.

    Raised when a forward pass returns neither ``Columns.ACTIONS`` nor
    ``Columns.ACTION_DIST_INPUTS``, or a stateful module is asked to act without state.
    """
