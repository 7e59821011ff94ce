"""Build a worker's input reader and output writer from its config (RLlib's rules).

Why: ``RolloutWorker`` (and anything else that samples on the old stack) reads
through ``config.input_`` and records through ``config.output``; these two
functions hold the selection rules in one tested place::

    ioctx = IOContext(log_dir, config, worker_index, worker)
    reader = input_reader_from_config(config, ioctx, sampler=my_sampler)
    writer = output_writer_from_config(config, ioctx)

``config.input_`` (checked in this order):

- a function ``(ioctx) -> reader``: called;
- ``"sampler"``: the worker's sampler (``sampler=`` argument, else
  ``ioctx.default_sampler_input()``), None for a worker without env;
- a dict ``{source: probability}``: ``ShuffledInput(MixedInput(dict), shuffle_buffer_size)``;
- a registered input name (``envrunners.offline.input_registry``): its creator;
- ``"d4rl.<env id>"`` or an ``*.hdf5``/``*.h5`` file: ``D4RLReader``;
- an importable class path ``"pkg.mod.Class"`` (``ray.rllib.`` is read as
  ``envrunners.``) or an ``InputReader`` subclass: ``ShuffledInput(Class(ioctx=ioctx,
  **input_config), shuffle_buffer_size)``;
- otherwise a path, glob, directory or list: ``ShuffledInput(JsonReader(input_, ioctx),
  shuffle_buffer_size)``.

``config.output``: None → ``NoopOutput``; a function → ``output(ioctx)``;
``"logdir"`` → ``JsonWriter(ioctx.log_dir, ...)``; another str → ``JsonWriter(output, ...)``
with ``output_max_file_size``/``output_compress_columns`` and the writer options
in ``output_config`` (``drop_non_json_infos``, ``fsync``).

Deliberate differences from RLlib: class-path inputs are shuffled with
``shuffle_buffer_size`` (RLlib passes 0); only ``"d4rl.*"`` ids and HDF5 files go to
``D4RLReader`` (RLlib sends any string containing "d4rl", e.g. a JSON directory
named ``d4rl_runs``); ``"dataset"`` (ray.data) is not supported.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
from typing import Any

from envrunners.errors import ConfigError
from envrunners.offline.d4rl_reader import D4RLReader
from envrunners.offline.input_registry import registry_contains_input, registry_get_input
from envrunners.offline.io_context import IOContext, _get
from envrunners.offline.json_reader import JsonReader
from envrunners.offline.json_writer import JsonWriter
from envrunners.offline.mixed_input import MixedInput
from envrunners.offline.output_writer import NoopOutput, OutputWriter
from envrunners.offline.shuffled_input import ShuffledInput

__all__ = ["input_reader_from_config", "output_writer_from_config"]

logger = logging.getLogger("envrunners")
_WRITER_OPTIONS = ("drop_non_json_infos", "fsync")
_NO_DATASET = (
    "{key}='dataset' reads/writes through ray.data, which envrunners does not include; use "
    "a path (JSON lines via JsonReader/JsonWriter) instead"
)


def _is_function(value: Any) -> bool:
    return callable(value) and not isinstance(value, (str, dict, type))


def _import_class(path: str) -> type | None:
    """The class named by a dotted path, or None if ``path`` is not an importable class."""
    if os.sep in path or "/" in path or os.path.exists(path) or path.count(".") < 1:
        return None
    if path.startswith("ray.rllib."):
        path = "envrunners." + path[len("ray.rllib.") :]
    module_name, _, name = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    obj = getattr(module, name, None)
    return obj if inspect.isclass(obj) else None


def _d4rl_target(input_: str) -> str | None:
    if input_.startswith("d4rl."):
        return input_[len("d4rl.") :]
    if input_.lower().endswith((".hdf5", ".h5", ".he5")):
        return input_
    return None


def input_reader_from_config(config: Any, ioctx: IOContext, sampler: Any = None) -> Any:
    """Build the input reader ``config.input_`` asks for (rules in the module docstring).

    Args:
        config: The ``AlgorithmConfig`` (or an RLlib-style dict with ``"input"``).
        ioctx: The worker's ``IOContext``.
        sampler: The worker's sampler input (``SyncSampler``), used for ``"sampler"``
            (also inside a dict); if None, ``ioctx.default_sampler_input()``.

    Returns:
        An ``InputReader`` (or any object with ``next()``); None for ``"sampler"``
        when the worker has no sampler.

    Raises:
        ConfigError: for ``"dataset"`` or an input of an unsupported type.
        OfflineDataError: for a path that matches no file (from ``JsonReader``).
    """
    if sampler is not None:
        ioctx._sampler = sampler
    input_ = _get(config, "input", "sampler")
    shuffle = int(_get(config, "shuffle_buffer_size", 0) or 0)
    if _is_function(input_):
        return input_(ioctx)
    if inspect.isclass(input_):
        return ShuffledInput(input_(ioctx=ioctx, **ioctx.input_config), shuffle)
    if input_ == "sampler":
        return sampler if sampler is not None else _sampler_or_none(ioctx)
    if input_ == "dataset":
        raise ConfigError(_NO_DATASET.format(key="input_"))
    if isinstance(input_, dict):
        return ShuffledInput(MixedInput(input_, ioctx), shuffle)
    if isinstance(input_, str):
        if registry_contains_input(input_):
            return registry_get_input(input_)(ioctx)
        d4rl = _d4rl_target(input_)
        if d4rl is not None:
            return D4RLReader(d4rl, ioctx)
        cls = _import_class(input_)
        if cls is not None:
            return ShuffledInput(cls(ioctx=ioctx, **dict(ioctx.input_config)), shuffle)
    if isinstance(input_, (str, list, tuple)):
        return ShuffledInput(JsonReader(input_, ioctx), shuffle)
    raise ConfigError(
        f"config.input_={input_!r} is not supported; use 'sampler', a path/glob/list of "
        "JSON files, a dict {input: probability}, a registered name, 'd4rl.<env id>', a "
        "class path, or a function (ioctx) -> InputReader"
    )


def _sampler_or_none(ioctx: IOContext) -> Any:
    try:
        return ioctx.default_sampler_input()
    except AttributeError:
        return None


def output_writer_from_config(config: Any, ioctx: IOContext) -> OutputWriter | Any:
    """Build the output writer ``config.output`` asks for (rules in the module docstring).

    Raises:
        ConfigError: for ``"dataset"`` or an output of an unsupported type.
    """
    output = _get(config, "output", None)
    if output is None:
        return NoopOutput()
    if callable(output) and not isinstance(output, str):
        return output(ioctx)
    if output == "dataset":
        raise ConfigError(_NO_DATASET.format(key="output"))
    if not isinstance(output, str):
        raise ConfigError(
            f"config.output={output!r}: expected None, 'logdir', a path or a function"
        )
    options = dict(_get(config, "output_config", None) or {})
    unknown = sorted(set(options) - set(_WRITER_OPTIONS))
    if unknown:
        logger.warning(
            "output_config keys %s are not JsonWriter options (known: %s); ignored",
            unknown,
            list(_WRITER_OPTIONS),
        )
    kwargs = {k: options[k] for k in _WRITER_OPTIONS if k in options}
    path = ioctx.log_dir if output == "logdir" else output
    return JsonWriter(
        path,
        ioctx,
        max_file_size=int(_get(config, "output_max_file_size", 64 * 1024 * 1024)),
        compress_columns=_get(config, "output_compress_columns", ["obs", "new_obs"]),
        **kwargs,
    )
