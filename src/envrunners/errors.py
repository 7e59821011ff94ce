"""The envrunners exception tree: one class per kind of misuse or failure.

Every error raised on bad input comes from here, and its message names the bad
value, what was expected and, where there is one, the fix::

    EnvRunnersError                  base of everything below
    ├── ConfigError(ValueError)      a config key, type or value is wrong
    │   ├── EnvPoolNotInstalledError(ImportError) the EnvPool backend without envpool
    │   ├── FrozenConfigError(AttributeError) a frozen config was modified
    │   ├── UnknownOptionError(TypeError) an unknown keyword to a builder method
    │   ├── NoAlgorithmClassError(TypeError) build_algo() on a config without an algorithm
    │   └── UnknownLoggerError       an experiment-tracking logger name that does not exist
    ├── CliError                     bad command-line input (exit code 2) or a failed command
    ├── EnvCreatorError(TypeError)   an env creator returned something that is not an env
    │   └── UnknownEnvError(EnvError) an env id that cannot be found or created
    ├── UnknownPolicyError(KeyError) a policy/module id that is not known
    │   └── UnknownPolicyToRemoveError(ValueError) remove_policy() of an unknown id
    ├── OfflineDataError(ValueError) a corrupt or unreadable offline record (path, line)
    │   ├── OfflineInputNotFoundError(FileNotFoundError) an input path matches no file
    │   ├── UnencodableValueError(TypeError) a value to write is not plain data
    │   ├── PickleNotAllowedError    RLlib's pickled data read without ``allow_pickle``
    │   └── OfflineSchemaError       a Parquet file's columns are not the expected layout
    ├── CompressionError(ValueError) an array cannot be packed, or a string is no packed array
    ├── EnvRunnerError(RuntimeError) a remote runner failed or hung (runner_index)
    │   └── RemoteEnvRunnerError(ray.exceptions.RayError) such a fault as the group
    │                                raises it to the caller (built when first used)
    ├── SpaceError(ValueError)       an observation or action outside its space
    ├── MultiAgentEnvError(ValueError) a multi-agent env broke the step protocol
    ├── DeprecatedAPIError(ValueError) a removed RLlib API was called (names its replacement)
    ├── BatchArgumentError(ValueError, AssertionError) a bad argument to a batch method
    ├── BatchTypeError(TypeError, AssertionError) a non-batch value where a batch belongs
    ├── ColumnKeyError(KeyError)     a batch column that is missing or forbidden
    ├── SubEnvError(RuntimeError)    a sub-env in a worker process raised, died or hung
    │   └── VectorEnvWorkerDiedError a shared-memory vector env's worker process died
    │       └── VectorEnvWorkerHungError such a worker did not answer within timeout_s
    ├── ModuleActingError(ValueError) an RLModule's acting inputs or outputs are unusable
    ├── ConnectorError(ValueError)   a connector returned no batch or lacks what it reads
    ├── EnvError(ValueError)         an env is not valid (``ray.rllib.utils.error``)
    ├── NonFiniteValueError(ValueError) a NaN/inf where sampling needs finite numbers
    │   ├── NonFiniteEnvDataError    a sub-env's observation or reward (sub-env, step, column)
    │   └── NonFiniteModuleOutputError a module's logits/means (module_id)
    ├── UnsupportedSpaceException    an observation or action space is not supported
    ├── NotSerializable              an object cannot be serialized
    ├── LoggerPackageMissingError(ImportError) a logger's package (tensorboard, wandb, mlflow)
    │                                is not installed
    └── RLlibExtraMissingError(ModuleNotFoundError) ``envrunners.rllib`` without a working
                                     ``ray[rllib]`` (names the ``rllib`` extra)

    StepFailedRecreateEnvError       raised BY an env (not by envrunners) to ask for a
                                     silent recreate (``ray.rllib.env.env_errors``)

The built-in bases keep ``except ValueError`` style code from RLlib working.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "BatchArgumentError",
    "BatchTypeError",
    "CliError",
    "ColumnKeyError",
    "CompressionError",
    "ConfigError",
    "ConnectorError",
    "LoggerPackageMissingError",
    "DeprecatedAPIError",
    "EnvCreatorError",
    "EnvPoolNotInstalledError",
    "EnvError",
    "EnvRunnerError",
    "EnvRunnersError",
    "FrozenConfigError",
    "ModuleActingError",
    "NonFiniteEnvDataError",
    "NonFiniteModuleOutputError",
    "NonFiniteValueError",
    "NoAlgorithmClassError",
    "NotSerializable",
    "MultiAgentEnvError",
    "OfflineDataError",
    "OfflineInputNotFoundError",
    "OfflineSchemaError",
    "PickleNotAllowedError",
    "RLlibExtraMissingError",
    "RemoteEnvRunnerError",  # noqa: F822 - built on first use (module __getattr__)
    "SpaceError",
    "StepFailedRecreateEnvError",
    "SubEnvError",
    "VectorEnvWorkerDiedError",
    "VectorEnvWorkerHungError",
    "UnencodableValueError",
    "UnknownEnvError",
    "UnknownLoggerError",
    "UnknownOptionError",
    "UnknownPolicyError",
    "UnknownPolicyToRemoveError",
    "UnsupportedSpaceException",
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


# --- batches (policy/sample_batch) -------------------------------------------------------------


class DeprecatedAPIError(EnvRunnersError, ValueError):
    """A removed RLlib API was called; the message names its replacement."""

    def __init__(self, old: str, new: str):
        super().__init__(f"`{old}` has been removed; use `{new}` instead.")


class BatchArgumentError(EnvRunnersError, ValueError, AssertionError):
    """A bad argument to a batch method.

    A ``ValueError``; also an ``AssertionError``, which is what RLlib raised in
    these places, so code written against RLlib keeps catching it.
    """


class BatchTypeError(EnvRunnersError, TypeError, AssertionError):
    """A value of the wrong type was put into a batch (also an ``AssertionError``, as in RLlib)."""


class ColumnKeyError(EnvRunnersError, KeyError):
    """A column a batch operation needs is missing or forbidden (a ``KeyError``)."""

    def __str__(self) -> str:  # KeyError would repr() the message; show it plainly.
        return str(self.args[0]) if self.args else ""


# --- config, CLI, offline data, utils (issue 13) ---


class FrozenConfigError(ConfigError, AttributeError):
    """A frozen config was modified (also an ``AttributeError``, which RLlib raised)."""


class CliError(EnvRunnersError):
    """A command-line problem, which the ``envrunners`` command reports as one line.

    ``code`` is the exit code: 2 (the default, argparse's convention) for bad
    input, 1 for a failure.
    """

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


class OfflineInputNotFoundError(OfflineDataError, FileNotFoundError):
    """An offline input path, glob or directory matches no readable file."""


class UnencodableValueError(OfflineDataError, TypeError):
    """A value to be written is not plain data (it would need pickle); names where it sits."""


class PickleNotAllowedError(OfflineDataError):
    """A record holds RLlib's cloudpickle-packed data and ``allow_pickle`` was not given."""


class CompressionError(EnvRunnersError, ValueError):
    """An array cannot be packed (object dtype) or a string is not a valid packed array."""


# -- old API stack (evaluation/) ---------------------------------------------------------------
class UnknownPolicyToRemoveError(UnknownPolicyError, ValueError):
    """``RolloutWorker.remove_policy`` was given an id the worker has no policy for.

    A ``ValueError`` too, because RLlib raises ``ValueError`` there; old-stack code
    catching that keeps working, and ``except UnknownPolicyError`` catches it as well.
    """


# -- runners and vector envs (env/vector, sampling) ---------------------------------
class SubEnvError(EnvRunnersError, RuntimeError):
    """A sub-env in a worker process raised, died or hung.

    Attributes:
        sub_env_index: Which sub-env.
        remote_traceback: The traceback text from the worker process, if any.
    """

    def __init__(self, message: str, *, sub_env_index: int, remote_traceback: str | None = None):
        self.sub_env_index = sub_env_index
        self.remote_traceback = remote_traceback
        text = f"sub-environment {sub_env_index}: {message}"
        if remote_traceback:
            text += "\n\nTraceback in the sub-environment's worker process:\n" + remote_traceback
        super().__init__(text)


class StepFailedRecreateEnvError(Exception):
    """Raised by an env's ``step``/``reset`` to ask for a silent recreate and reset.

    With ``restart_failed_sub_environments=True`` the runner recreates the failing
    (sub-)environment, drops its partial episode and goes on, without logging a
    traceback (any other exception is logged once). Not an ``EnvRunnersError``:
    envs raise it, as in RLlib (``ray.rllib.env.env_errors``).
    """


# -- core: RLModule acting (issue 14) --------------------------------------------------------


class ModuleActingError(EnvRunnersError, ValueError):
    """An RLModule cannot act on what it was given, or its outputs name no action.

    Raised when a forward pass returns neither ``Columns.ACTIONS`` nor
    ``Columns.ACTION_DIST_INPUTS``, or a stateful module is asked to act without state.
    """


# -- connectors: ConnectorV2 pipelines (issue 14) ---------------------------------------------


class ConnectorError(EnvRunnersError, ValueError):
    """A connector broke the ConnectorV2 contract while a pipeline ran it.

    Raised when a connector's ``__call__`` returns ``None`` instead of the batch, or
    when a stock piece needs information (per-sub-env episode views) that the
    calling runner does not provide.
    """


# -- RLlib's exception classes (ray.rllib.utils.error) and their catchable bases (issue 15) ------


class EnvError(EnvRunnersError, ValueError):
    """An RL environment failed validation (RLlib's ``EnvError``; also a ``ValueError``)."""


class UnsupportedSpaceException(EnvRunnersError):
    """An action or observation space that a component cannot handle (as in RLlib)."""


class NotSerializable(EnvRunnersError):
    """An object that cannot be serialized to be sent to a remote actor (as in RLlib)."""


class UnknownOptionError(ConfigError, TypeError):
    """An unknown keyword was passed to a config builder method.

    A ``TypeError``, which Python (and so RLlib) raises for an unexpected keyword
    argument; a ``ConfigError`` too, so the did-you-mean message and ``except
    ConfigError`` keep working.
    """


class UnknownEnvError(EnvCreatorError, EnvError):
    """An env id that is neither a registered name nor a gymnasium id, or that gym cannot make.

    An ``EnvError`` and ``ValueError`` (what RLlib's ``Algorithm`` raises for an invalid
    env descriptor), and still an ``EnvCreatorError`` for code written against envrunners.
    """


# -- algorithms (issue 15: Algorithm drop-in) ----------------------------------------------


class NoAlgorithmClassError(ConfigError, TypeError):
    """``build_algo()`` on a config that names no algorithm class (a base ``AlgorithmConfig()``).

    A ``TypeError`` as in RLlib (which calls its ``algo_class`` of None and fails with
    "'NoneType' object is not callable"); a ``ConfigError`` with a message naming the fix.
    """


# -- EnvPool backend (env/vector/envpool_vector_env.py, session 7) --------------------------


class EnvPoolNotInstalledError(ConfigError, ImportError):
    """The EnvPool backend was asked for but ``envpool`` is not installed (names the extra).

    A ``ConfigError`` (the config chose a backend this install lacks) and an
    ``ImportError`` (what a missing optional package raises in RLlib).
    """


# -- experiment tracking (envrunners.callbacks.loggers) --------------------------------


class UnknownLoggerError(ConfigError):
    """A logger name (``--logger``, ``make_loggers``) that is not one of the loggers."""


class LoggerPackageMissingError(EnvRunnersError, ImportError):
    """A logger whose package is not installed; the message names the extra to install."""


# -- env runner group: runner faults raised to the caller (issue 15) ----------------------------


def _remote_env_runner_error_class() -> type:
    """Build ``RemoteEnvRunnerError``; it needs ``ray.exceptions``, so it is built on first use.

    Why: ``import ray`` costs ~0.35 s and ~50 MB, and this module is imported by
    every runner and env worker process; only the group (where Ray is loaded)
    raises this class.
    """
    from ray.exceptions import RayError

    class RemoteEnvRunnerError(EnvRunnerError, RayError):
        """A remote runner fault that is neither ignored nor restarted, as the caller gets it.

        A ``ray.exceptions.RayError`` (what RLlib raises for a failed runner) and an
        ``EnvRunnerError`` (``runner_index``, ``remote_traceback``). Import it from
        ``envrunners.errors`` (that loads Ray).
        """

    RemoteEnvRunnerError.__module__ = __name__
    RemoteEnvRunnerError.__qualname__ = "RemoteEnvRunnerError"
    return RemoteEnvRunnerError


def __getattr__(name: str) -> type:
    if name == "RemoteEnvRunnerError":
        cls = globals()[name] = _remote_env_runner_error_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- offline data (offline/): Parquet, Ray Data, Minari -------------------------------------


class OfflineSchemaError(OfflineDataError):
    """An offline file's columns do not have the layout expected; names the file and column."""

    def __init__(self, message: str, *, path: str | None = None, column: str | None = None):
        self.column = column
        super().__init__(f"column {column!r}: {message}" if column else message, path=path)


# -- poisoned data: non-finite observations, rewards, module outputs (issue 16, sampling core) ---


class NonFiniteValueError(EnvRunnersError, ValueError):
    """A NaN or infinite value where sampling needs finite numbers."""

    def __reduce__(self):  # keep the keyword attributes across processes (Ray)
        return (_rebuild_error, (type(self), self.args, self.__dict__))


def _rebuild_error(cls: type, args: tuple, attrs: dict) -> BaseException:
    err = Exception.__new__(cls)
    err.args = args
    err.__dict__.update(attrs)
    return err


class NonFiniteEnvDataError(NonFiniteValueError):
    """A sub-env returned a non-finite observation or reward; names where and when."""

    def __init__(self, message: str, *, sub_env_index: int, step: int, column: str):
        self.sub_env_index = sub_env_index
        self.step = step
        self.column = column
        super().__init__(message)


class NonFiniteModuleOutputError(NonFiniteValueError):
    """A module returned non-finite distribution inputs (logits, means); names the module."""

    def __init__(self, message: str, *, module_id: object):
        self.module_id = module_id
        super().__init__(message)


# -- env/vector: shared-memory vector env (issue 17) -------------------------------------------


class VectorEnvWorkerDiedError(SubEnvError):
    """A ``SharedMemoryVectorEnv`` worker process died; names the worker and its sub-envs.

    Attributes:
        worker_index: Which worker process.
        sub_env_indices: The sub-envs it stepped (``sub_env_index`` is the first).
    """

    def __init__(self, message: str, *, worker_index: int, sub_env_indices: list[int]):
        self.worker_index = worker_index
        self.sub_env_indices = list(sub_env_indices)
        super().__init__(message, sub_env_index=self.sub_env_indices[0])

    def __reduce__(self):  # keep the keyword attributes across processes (Ray)
        return (_rebuild_error, (type(self), self.args, self.__dict__))


# -- rllib plugin: envrunners' runners inside RLlib's own algorithms (issue 19) -----------------


class RLlibExtraMissingError(EnvRunnersError, ModuleNotFoundError):
    """``envrunners.rllib`` imported without a working ``ray[rllib]``; names the extra.

    A ``ModuleNotFoundError`` (an ``ImportError``) whose ``name`` is the RLlib module
    that failed, so code probing optional modules treats it as a missing package.
    """


# -- env/vector: shared-memory vector env robustness (issue 17) ---------------------------------


class VectorEnvWorkerHungError(VectorEnvWorkerDiedError):
    """A ``SharedMemoryVectorEnv`` worker process did not answer within ``timeout_s``.

    It was alive but stuck (e.g. a sub-env's ``step`` that blocks); it was killed.

    Attributes:
        timeout_s: The limit it exceeded (``worker_index``/``sub_env_indices`` as
            ``VectorEnvWorkerDiedError``).
    """

    def __init__(
        self, message: str, *, worker_index: int, sub_env_indices: list[int], timeout_s: float
    ):
        self.timeout_s = timeout_s
        super().__init__(message, worker_index=worker_index, sub_env_indices=sub_env_indices)
