"""Value checks for single ``AlgorithmConfig`` fields, run when a field is set.

Why: a wrong value should fail where it is written (``config.env_runners(...)``,
attribute assignment, ``from_dict``), naming the key, the value and what was
expected, not minutes later inside a remote runner. Every check has the form
``check(name, value) -> value``: it returns the value to store (possibly
normalised, e.g. an enum turned into its string) or raises ``ConfigError``.
``AlgorithmConfig.validate()`` runs them all again and collects every problem.
"""

from __future__ import annotations

import dataclasses
import enum
import numbers
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from envrunners.errors import ConfigError, suggest
from envrunners.policy.policy_spec import _coerce_policy_spec

Check = Callable[[str, Any], Any]

MODEL_DEFAULTS: dict[str, Any] = {
    "fcnet_hiddens": [256, 256],
    "fcnet_activation": "tanh",
    "fcnet_kernel_initializer": None,
    "fcnet_bias_initializer": None,
    "vf_share_layers": False,
    "free_log_std": False,
    "log_std_clip_param": 20.0,
    "conv_filters": None,
    "conv_activation": "relu",
    "post_fcnet_hiddens": [],
    "post_fcnet_activation": "relu",
    "head_fcnet_hiddens": [],
    "head_fcnet_activation": "relu",
    "use_lstm": False,
    "max_seq_len": 20,
    "lstm_cell_size": 256,
    "lstm_use_prev_action": False,
    "lstm_use_prev_reward": False,
    "dim": 84,
    "grayscale": False,
    "zero_mean": True,
    "framestack": True,
    "custom_model": None,
    "custom_model_config": {},
    "custom_action_dist": None,
}

_OBSERVATION_FILTERS = ("NoFilter", "MeanStdFilter", "ConcurrentMeanStdFilter")
_LOG_LEVELS = ("DEBUG", "INFO", "WARN", "WARNING", "ERROR", "CRITICAL")


def fail(name: str, expected: str, value: Any) -> NoReturn:
    """Raise the standard ``ConfigError``: ``"<name> must be <expected>, got <value>."``."""
    raise ConfigError(f"{name} must be {expected}, got {value!r}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def boolean(name: str, value: Any) -> bool:
    """Accept ``True``/``False`` (numpy bools too)."""
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_":
        return bool(value)
    fail(name, "True or False", value)


def integer(low: int, *, allow_none: bool = False) -> Check:
    """Return a check for an int ``>= low`` (bools rejected), optionally ``None``."""
    expected = "an int > 0" if low == 1 else f"an int >= {low}"
    if allow_none:
        expected += " or None"

    def check(name: str, value: Any) -> int | None:
        if value is None and allow_none:
            return None
        if not _is_int(value) or value < low:
            fail(name, expected, value)
        return int(value)

    return check


def number(low: float = 0.0, *, strict: bool = False, allow_none: bool = False) -> Check:
    """Return a check for a real number ``>= low`` (``> low`` if ``strict``)."""
    expected = f"a number {'>' if strict else '>='} {low:g}" + (" or None" if allow_none else "")

    def check(name: str, value: Any) -> Any:
        if value is None and allow_none:
            return None
        if not _is_number(value) or value < low or (strict and value == low):
            fail(name, expected, value)
        return value

    return check


def choice(*options: Any) -> Check:
    """Return a check that the value is one of ``options`` (with a close-match hint)."""
    shown = ", ".join(repr(o) for o in options)

    def check(name: str, value: Any) -> Any:
        if isinstance(value, bool) and not any(isinstance(o, bool) for o in options):
            fail(name, f"one of {shown}", value)
        if any(value == o and type(value) is type(o) for o in options):
            return value
        raise ConfigError(
            f"{name} must be one of {shown}, got {value!r}."
            + (
                suggest(value, [o for o in options if isinstance(o, str)], n=1)
                if isinstance(value, str)
                else ""
            )
        )

    return check


def mapping(name: str, value: Any) -> dict:
    """Accept a dict (kept as is, so an ``EnvContext`` stays one) or any mapping."""
    if isinstance(value, dict):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    fail(name, "a dict", value)


def optional_mapping(name: str, value: Any) -> dict | None:
    """Accept ``None`` or a dict."""
    return None if value is None else mapping(name, value)


def any_value(name: str, value: Any) -> Any:
    """Accept anything (fields read by code outside the sampling layer)."""
    return value


def optional_callable(name: str, value: Any) -> Any:
    """Accept ``None`` or a callable."""
    if value is not None and not callable(value):
        fail(name, "a callable or None", value)
    return value


def optional_class(name: str, value: Any) -> type | None:
    """Accept ``None`` or a class."""
    if value is not None and not isinstance(value, type):
        fail(name, "a class or None", value)
    return value


def optional_string(name: str, value: Any) -> str | None:
    """Accept ``None`` or a str."""
    if value is not None and not isinstance(value, str):
        fail(name, "a str or None", value)
    return value


def space(name: str, value: Any) -> Any:
    """Accept ``None`` or a ``gymnasium.spaces.Space``."""
    if value is None:
        return None
    import gymnasium as gym

    if not isinstance(value, gym.spaces.Space):
        fail(name, "a gymnasium.spaces.Space or None", value)
    return value


def env(name: str, value: Any) -> Any:
    """Accept ``None``, a gymnasium id / registered name (str), or a class/creator callable."""
    if value is None or isinstance(value, str) or callable(value):
        return value
    if hasattr(value, "step") and hasattr(value, "reset"):
        raise ConfigError(
            f"env must be a gymnasium id (str), an env class or a creator function, got an env "
            f"instance ({type(value).__name__}); every runner builds its own env copies, so pass "
            f"{type(value).__name__} (the class) or a function that builds it."
        )
    fail(name, "a gymnasium id (str), a gymnasium.Env subclass or a creator callable", value)


def rollout_fragment_length(name: str, value: Any) -> int | str:
    """Accept an int > 0 or ``"auto"``."""
    if value == "auto" and isinstance(value, str):
        return value
    if not _is_int(value) or value < 1:
        fail(name, "an int > 0 or 'auto'", value)
    return int(value)


def vectorize_mode(name: str, value: Any) -> str:
    """Accept ``"sync"``, ``"async"``, ``"vector_entry_point"``, ``"envpool"``,
    ``"shared_memory"`` or a ``gymnasium.VectorizeMode``."""
    if isinstance(value, enum.Enum):
        value = value.value
    modes = ("sync", "async", "vector_entry_point", "envpool", "shared_memory")
    if isinstance(value, str) and value.lower() in modes:
        return value.lower()
    hint = suggest(value, modes, n=1) if isinstance(value, str) else ""
    raise ConfigError(
        f"{name} must be one of 'sync', 'async', 'vector_entry_point', 'envpool', "
        "'shared_memory' "
        f"(or a gymnasium.VectorizeMode), got {value!r}.{hint}"
    )


def framework(name: str, value: Any) -> str:
    """Accept only ``"torch"``; TensorFlow names get an explicit not-supported message."""
    if value == "torch":
        return "torch"
    if value in ("tf", "tf2", "tfe", "tensorflow"):
        raise ConfigError(
            f"framework {value!r} is not supported: TensorFlow is not supported by envrunners, "
            "which runs on PyTorch only; use config.framework('torch')."
        )
    raise ConfigError(f"framework must be 'torch', got {value!r}.{suggest(value, ['torch'])}")


def observation_filter(name: str, value: Any) -> Any:
    """Accept a filter name or a callable ``(shape) -> Filter``."""
    if callable(value) or (isinstance(value, str) and value in _OBSERVATION_FILTERS):
        return value
    hint = suggest(value, _OBSERVATION_FILTERS, n=1) if isinstance(value, str) else ""
    raise ConfigError(
        f"{name} must be one of {', '.join(map(repr, _OBSERVATION_FILTERS))} or a callable "
        f"(shape) -> Filter, got {value!r}.{hint}"
    )


def merge_env_runner_states(name: str, value: Any) -> bool | str:
    """Accept ``True``, ``False`` or ``"training_only"``."""
    if isinstance(value, bool) or value == "training_only":
        return value
    fail(name, "True, False or 'training_only'", value)


def log_level(name: str, value: Any) -> str:
    """Accept a logging level name (any case); stored upper-case."""
    if isinstance(value, str) and value.upper() in _LOG_LEVELS:
        return value.upper()
    fail(name, f"one of {', '.join(_LOG_LEVELS)}", value)


def seed(name: str, value: Any) -> int | None:
    """Accept ``None`` or an int."""
    if value is None:
        return None
    if not _is_int(value):
        fail(name, "an int or None", value)
    return int(value)


def learning_rate(name: str, value: Any) -> Any:
    """Accept a number >= 0 or a schedule (a list of ``[timestep, value]`` pairs)."""
    if _is_number(value) and value >= 0:
        return value
    if isinstance(value, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 for p in value
    ):
        return value
    fail(name, "a number >= 0 or a list of [timestep, value] pairs", value)


def int_or_auto(low: int) -> Check:
    """Return a check for an int ``>= low`` or ``"auto"``."""
    inner = integer(low)

    def check(name: str, value: Any) -> Any:
        if value == "auto" and isinstance(value, str):
            return value
        try:
            return inner(name, value)
        except ConfigError:
            fail(name, f"an int >= {low} or 'auto'", value)

    return check


def model_config(name: str, value: Any) -> dict:
    """Accept a dict or a ``DefaultModelConfig`` (as RLlib does; stored as its dict).

    Missing keys are filled from the model defaults.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return {**MODEL_DEFAULTS, **mapping(name, value)}


def policies(name: str, value: Any) -> dict:
    """Normalise policies to ``{policy_id: PolicySpec}``.

    Accepts a dict of id -> PolicySpec | 4-tuple | None, or a list/set/tuple of
    ids (each becomes ``PolicySpec()``). Ids must be str.
    """
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (set, frozenset)):
        items = [(pid, None) for pid in sorted(value, key=str)]
    elif isinstance(value, (list, tuple)):
        items = [(pid, None) for pid in value]
    else:
        fail(name, "a dict {policy_id: PolicySpec | 4-tuple | None} or a list/set of ids", value)
    result = {}
    for pid, spec in items:
        if not isinstance(pid, str):
            raise ConfigError(
                f"policy ids must be str, got {pid!r} (type {type(pid).__name__}) in {name}."
            )
        result[pid] = _coerce_policy_spec(pid, spec)
    return result


def policies_to_train(name: str, value: Any) -> Any:
    """Accept ``None``, a callable ``(policy_id, batch) -> bool`` or a collection of ids."""
    if value is None or callable(value):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        bad = [p for p in value if not isinstance(p, str)]
        if bad:
            fail(name, "a list/set of policy ids (str)", value)
        return value
    fail(name, "None, a list/set of policy ids or a callable (policy_id, batch) -> bool", value)


def callbacks_class(name: str, value: Any) -> list[type]:
    """Normalise to a list of callback classes (``None`` -> ``[]``)."""
    classes = [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]
    for cls in classes:
        if not isinstance(cls, type):
            raise ConfigError(
                f"{name} must be a callbacks class or a list of classes, got {cls!r}"
                + ("; pass the class, not an instance." if not callable(cls) else ".")
            )
    return classes


def callback_functions(name: str, value: Any) -> list | None:
    """Normalise to ``None`` or a list of callables (one callable -> a list of one)."""
    if value is None:
        return None
    fns = list(value) if isinstance(value, (list, tuple)) else [value]
    for fn in fns:
        if not callable(fn):
            fail(name, "a callable, a list of callables or None", value)
    return fns


def input_(name: str, value: Any) -> Any:
    """Accept ``"sampler"``, a path/glob/name (str), a list of paths, a dict or a callable."""
    if isinstance(value, (str, dict)) or callable(value):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(p, str) for p in value):
        return list(value)
    fail(name, "a str, a list of paths, a dict {input: probability} or a callable", value)


def output(name: str, value: Any) -> Any:
    """Accept ``None``, a str (``"logdir"``, a path) or a callable ``(ioctx) -> writer``."""
    if value is None or isinstance(value, str) or callable(value):
        return value
    fail(name, "None, 'logdir', a path or a callable (ioctx) -> OutputWriter", value)


def evaluation_config(name: str, value: Any) -> Any:
    """Accept ``None``, a dict of overrides or a config object (keys are checked in validate)."""
    if value is None or isinstance(value, dict) or hasattr(value, "to_dict"):
        return value
    fail(name, "None, a dict of config overrides or an AlgorithmConfig", value)
