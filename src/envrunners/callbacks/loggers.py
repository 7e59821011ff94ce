"""Experiment tracking of training results: CSV, TensorBoard, Weights & Biases, MLflow.

Why: ``algo.train()`` returns RLlib's nested result dict once per iteration; these
loggers write it where people look at runs, with RLlib's metric names flattened with
``/`` (``env_runners/episode_return_mean``, ``learners/default_policy/policy_loss``),
the names RLlib's Tune loggers write. The ``envrunners train`` command uses the same
classes (``--logger``). Two ways to use them from the API::

    from envrunners.callbacks.loggers import LoggerCallback, TensorBoardLogger

    # 1. call per result
    with TensorBoardLogger("runs/cartpole") as tb:
        for _ in range(10):
            tb.log_result(algo.train())

    # 2. as an RLlib callbacks class (``on_train_result``)
    config.callbacks(LoggerCallback.to("runs/cartpole", loggers=["tensorboard", "csv"]))

W&B runs offline unless ``WANDB_MODE`` says otherwise; MLflow writes a local file
store (``file://<logdir>/mlruns``) unless given a tracking URI. Both are optional
extras (``pip install 'envrunners[wandb]'`` / ``'envrunners[mlflow]'``).
"""

from __future__ import annotations

import csv
import math
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from envrunners.errors import LoggerPackageMissingError, UnknownLoggerError, suggest

__all__ = [
    "LOGGERS",
    "CSVLogger",
    "LoggerCallback",
    "MLflowLogger",
    "ResultLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "flatten_result",
    "make_loggers",
]

#: Result keys no logger writes as a metric (the whole config, host facts, flags).
_NOT_METRICS = frozenset(
    {"config", "date", "hostname", "pid", "trial_id", "done", "timestamp", "node_ip"}
)


def flatten_result(result: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
    """Flatten a nested result dict into ``{"a/b/c": value}`` (``config`` and host facts left out).

    Numbers stay numbers (numpy scalars become Python ones, bools 0/1); strings stay;
    lists, None and other objects are left out.
    """
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, sub in value.items():
                walk(f"{prefix}{sep}{key}" if prefix else str(key), sub)
        elif isinstance(value, bool):
            flat[prefix] = int(value)
        elif isinstance(value, int | float):
            flat[prefix] = value
        elif hasattr(value, "dtype") and getattr(value, "shape", None) == ():  # numpy scalar
            flat[prefix] = value.item()
        elif isinstance(value, str):
            flat[prefix] = value

    for key, value in result.items():
        if key not in _NOT_METRICS:
            walk(str(key), value)
    return flat


def _numbers(flat: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in flat.items() if isinstance(v, int | float)}


def _step(result: Mapping[str, Any]) -> int:
    return int(result.get("training_iteration", 0) or 0)


class ResultLogger:
    """Base of the loggers: ``log_result(result)`` per iteration, ``close()`` at the end.

    Files and clients open on the first result, so a logger can be built (and
    pickled into a config) before training starts. Usable as a context manager and
    as an ``on_train_result`` callback function (``config.callbacks(on_train_result=
    logger.on_train_result)``).

    Args:
        logdir: Directory the logger writes into (created when needed).
    """

    #: The ``--logger`` name of this logger.
    name = ""

    def __init__(self, logdir: str | os.PathLike) -> None:
        self.logdir = Path(logdir).expanduser()
        self._opened = False

    def log_result(self, result: Mapping[str, Any]) -> None:
        """Write one ``train()`` result (its step is ``training_iteration``)."""
        if not self._opened:
            self.logdir.mkdir(parents=True, exist_ok=True)
            self._open(result)
            self._opened = True
        self._write(flatten_result(result), _step(result))

    def on_train_result(self, *, result: Mapping[str, Any], **kwargs: Any) -> None:
        """RLlib's ``on_train_result(algorithm=..., metrics_logger=..., result=...)`` hook."""
        self.log_result(result)

    def close(self) -> None:
        """Flush and close what ``log_result`` opened (idempotent)."""
        if self._opened:
            self._close()
            self._opened = False

    def __enter__(self) -> ResultLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the settings only (a config copied to runners carries no open files)."""
        return {"logdir": self.logdir, **self._settings(), "_opened": False}

    # -- what subclasses implement ------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        return {}

    def _open(self, result: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _write(self, flat: dict[str, Any], step: int) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        pass


class CSVLogger(ResultLogger):
    """``progress.csv``: one row per result, every flattened key (Tune's CSV file).

    The header is the first result's keys (a later key that is new is left out, as
    Tune does); an existing file is appended to with its own header.
    """

    name = "csv"

    def __init__(self, logdir: str | os.PathLike, filename: str = "progress.csv") -> None:
        super().__init__(logdir)
        self.filename = filename

    def _settings(self) -> dict[str, Any]:
        return {"filename": self.filename}

    def _open(self, result: Mapping[str, Any]) -> None:
        path = self.logdir / self.filename
        header: list[str] | None = None
        if path.is_file() and path.stat().st_size:
            with open(path, newline="") as f:
                header = next(csv.reader(f), None)
        self._file = open(path, "a", newline="")  # noqa: SIM115 - closed in _close()
        fields = header or list(flatten_result(result))
        self._writer = csv.DictWriter(self._file, fieldnames=fields, extrasaction="ignore")
        if header is None:
            self._writer.writeheader()

    def _write(self, flat: dict[str, Any], step: int) -> None:
        row = {k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in flat.items()}
        self._writer.writerow(row)
        self._file.flush()

    def _close(self) -> None:
        self._file.close()


class TensorBoardLogger(ResultLogger):
    """TensorBoard event files (``torch.utils.tensorboard``): one scalar per numeric key.

    Needs the ``tensorboard`` package (``pip install 'envrunners[tensorboard]'``).
    View with ``tensorboard --logdir <logdir>``.
    """

    name = "tensorboard"

    def __init__(self, logdir: str | os.PathLike) -> None:
        super().__init__(logdir)
        require_package(self.name)

    def _open(self, result: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(self.logdir))

    def _write(self, flat: dict[str, Any], step: int) -> None:
        for key, value in _numbers(flat).items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def _close(self) -> None:
        self._writer.close()


class WandbLogger(ResultLogger):
    """A Weights & Biases run; offline (``WANDB_MODE=offline``) unless ``mode`` or the env says.

    Offline runs go to ``<logdir>/wandb``; upload later with ``wandb sync``.

    Args:
        logdir: Directory of the run's files.
        project: W&B project name.
        run_name: Display name of the run (default: W&B's).
        mode: ``"offline"``, ``"online"`` or ``"disabled"`` (default: ``$WANDB_MODE``,
            else ``"offline"``).
    """

    name = "wandb"

    def __init__(
        self,
        logdir: str | os.PathLike,
        project: str = "envrunners",
        run_name: str | None = None,
        mode: str | None = None,
    ) -> None:
        super().__init__(logdir)
        require_package(self.name)
        self.project, self.run_name, self.mode = project, run_name, mode

    def _settings(self) -> dict[str, Any]:
        return {"project": self.project, "run_name": self.run_name, "mode": self.mode}

    def _open(self, result: Mapping[str, Any]) -> None:
        import wandb

        config = result.get("config")
        self._run = wandb.init(
            project=self.project,
            name=self.run_name,
            dir=str(self.logdir),
            mode=self.mode or os.environ.get("WANDB_MODE", "offline"),
            config=dict(config) if isinstance(config, Mapping) else None,
            reinit=True,
        )

    def _write(self, flat: dict[str, Any], step: int) -> None:
        self._run.log(_numbers(flat), step=step)

    def _close(self) -> None:
        self._run.finish()


class MLflowLogger(ResultLogger):
    """An MLflow run in a local file store (``file://<logdir>/mlruns``) or ``tracking_uri``.

    The default file store sets ``MLFLOW_ALLOW_FILE_STORE=true`` for the process
    (MLflow 3 asks for that opt-in) unless it is set already; pass
    ``tracking_uri="sqlite:///<path>/mlflow.db"`` for MLflow's database store.

    Args:
        logdir: Directory of the default file store.
        tracking_uri: Where to log (default: the local file store under ``logdir``).
        experiment_name: MLflow experiment (created when missing).
        run_name: Display name of the run.
    """

    name = "mlflow"

    def __init__(
        self,
        logdir: str | os.PathLike,
        tracking_uri: str | None = None,
        experiment_name: str = "envrunners",
        run_name: str | None = None,
    ) -> None:
        super().__init__(logdir)
        require_package(self.name)
        self.tracking_uri = tracking_uri
        self.experiment_name, self.run_name = experiment_name, run_name

    def _settings(self) -> dict[str, Any]:
        return {
            "tracking_uri": self.tracking_uri,
            "experiment_name": self.experiment_name,
            "run_name": self.run_name,
        }

    def _open(self, result: Mapping[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        uri = self.tracking_uri
        if uri is None:
            uri = (self.logdir / "mlruns").resolve().as_uri()
            # MLflow 3 refuses its file store unless asked; asking is what this default means
            # (an explicit MLFLOW_ALLOW_FILE_STORE=false still wins).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = MlflowClient(tracking_uri=uri)
        found = self._client.get_experiment_by_name(self.experiment_name)
        experiment = (
            found.experiment_id if found else self._client.create_experiment(self.experiment_name)
        )
        self._run_id = self._client.create_run(experiment, run_name=self.run_name).info.run_id

    def _write(self, flat: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(key, value, now, step)
            for key, value in _numbers(flat).items()
            if math.isfinite(value)
        ]
        for start in range(0, len(metrics), 1000):  # MLflow's log_batch limit
            self._client.log_batch(self._run_id, metrics=metrics[start : start + 1000])

    def _close(self) -> None:
        self._client.set_terminated(self._run_id)


#: ``--logger`` names -> logger classes.
LOGGERS: dict[str, type[ResultLogger]] = {
    cls.name: cls for cls in (CSVLogger, TensorBoardLogger, WandbLogger, MLflowLogger)
}
#: The package each logger imports, and the extra that installs it.
_PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}


def require_package(name: str) -> None:
    """Fail with the install command when logger ``name`` lacks its package.

    Raises:
        LoggerPackageMissingError: The package is not installed (an ``ImportError``).
    """
    import importlib.util

    if name not in _PACKAGES:
        return
    module, extra = _PACKAGES[name]
    if importlib.util.find_spec(module) is None:
        raise LoggerPackageMissingError(
            f"the {name} logger needs the {module!r} package: pip install 'envrunners[{extra}]'"
        )


def logger_available(name: str) -> bool:
    """Whether logger ``name``'s package is installed."""
    try:
        require_package(name)
    except LoggerPackageMissingError:
        return False
    return True


def make_loggers(names: Iterable[str], logdir: str | os.PathLike) -> list[ResultLogger]:
    """Build the loggers ``names`` (``csv``, ``tensorboard``, ``wandb``, ``mlflow``) on ``logdir``.

    Raises:
        UnknownLoggerError: A name that is not a logger (a ``ValueError``, with a
            did-you-mean).
        LoggerPackageMissingError: A logger's package is not installed.
    """
    names = list(dict.fromkeys(names))
    for name in names:
        if name not in LOGGERS:
            raise UnknownLoggerError(
                f"unknown logger {name!r}; expected one of {', '.join(LOGGERS)}."
                f"{suggest(name, LOGGERS, n=1)}"
            )
    return [LOGGERS[name](logdir) for name in names]


class LoggerCallback:
    """An RLlib callbacks class that hands each ``train()`` result to loggers.

    Runners build callbacks classes with no arguments, so the settings are class
    attributes; ``LoggerCallback.to(logdir, loggers=[...])`` makes a configured
    subclass for ``config.callbacks(...)``. Only the driver's ``on_train_result``
    writes; the copies built in env runners stay idle.

    Attributes:
        logdir: Where the loggers write (None: ``runs/<algo>-<env>-<time>``).
        loggers: Logger names (``csv``, ``tensorboard``, ``wandb``, ``mlflow``).
    """

    logdir: str | None = None
    loggers: tuple[str, ...] = ("tensorboard",)

    def __init__(self) -> None:
        self._loggers: list[ResultLogger] | None = None

    @classmethod
    def to(cls, logdir: str | os.PathLike, loggers: Iterable[str] = ("tensorboard",)) -> type:
        """A subclass writing to ``logdir`` with ``loggers`` (checked now, not at the first result)."""
        names = tuple(loggers)
        make_loggers(names, logdir)  # unknown names and missing packages fail here
        return type(cls.__name__, (cls,), {"logdir": str(logdir), "loggers": names})

    def on_train_result(
        self, *, algorithm: Any = None, result: Mapping[str, Any], **kwargs: Any
    ) -> None:
        """Log ``result`` with every logger (built on the first call)."""
        if self._loggers is None:
            self._loggers = make_loggers(self.loggers, self.logdir or _default_logdir(algorithm))
        for logger in self._loggers:
            logger.log_result(result)

    def close(self) -> None:
        """Close the loggers."""
        for logger in self._loggers or []:
            logger.close()


def _default_logdir(algorithm: Any) -> str:
    config = getattr(algorithm, "config", None)
    env = str(getattr(config, "env", None) or "env").replace("/", "_").replace(":", "_")
    algo = type(algorithm).__name__ if algorithm is not None else "algo"
    return str(Path("runs") / f"{algo}-{env}-{time.strftime('%Y%m%d-%H%M%S')}")
