"""The machinery under ``AlgorithmConfig``: key lookup, checks, freezing, dict I/O.

Why: kept apart from the builder methods so each module reads in one sitting.
``ConfigBase`` turns the field table of :mod:`._config_fields` into behaviour:
every set (builder keyword, attribute, dict key) goes through the key's check,
unknown keys raise ``ConfigError`` naming the closest known key, deprecated
names warn and map, and a frozen config refuses every change.
"""

from __future__ import annotations

import copy
import inspect
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

from envrunners.algorithms import _config_checks as c
from envrunners.algorithms._config_fields import (
    CBS,
    DBG,
    DICT_KEYS,
    ENV,
    EVAL,
    EXP,
    FT,
    FW,
    LRN,
    MA,
    MOD,
    MOVED,
    OFF,
    PYENV,
    RENAMED,
    REP,
    RES,
    RUN,
    TF_ONLY,
    TRAIN,
    UNSUPPORTED,
    _ConfigFields,
    default_value,
    finalize_fields,
)
from envrunners.errors import ConfigError, suggest

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["ConfigBase", "FrozenConfigError", "NotProvided"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_ATTR_FOR_DICT_KEY = {key: attr for attr, key in DICT_KEYS.items()}
_INTERNAL_ATTRS = frozenset({"_is_frozen", "algo_class"})


class _NotProvidedMeta(type):
    def __repr__(cls) -> str:
        return "NotProvided"


class NotProvided(metaclass=_NotProvidedMeta):
    """Default of every builder keyword: "leave this key unchanged" (as in RLlib)."""


class FrozenConfigError(ConfigError, AttributeError):
    """A frozen config was modified (also an ``AttributeError``, which RLlib raised)."""


def warn(message: str, category: type[Warning] = DeprecationWarning) -> None:
    """Warn with the stack level of the first caller outside ``envrunners.algorithms``."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_HERE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _equal(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # e.g. numpy arrays inside env_config
        return False


class ConfigBase(_ConfigFields):
    """Field storage with checked sets, freezing and dict I/O (base of ``AlgorithmConfig``)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        finalize_fields(cls)
        _attach_signatures(cls)

    def __init__(self, algo_class: type | None = None) -> None:
        object.__setattr__(self, "_is_frozen", False)
        object.__setattr__(self, "algo_class", algo_class)
        cls = type(self)
        for name, field in cls._FIELDS.items():
            object.__setattr__(self, name, default_value(cls, field))

    # ------------------------------------------------------------------ attributes
    def __setattr__(self, name: str, value: Any) -> None:
        """Set a key after its check; unknown names raise ``ConfigError`` with a close match."""
        if name == "_is_frozen":
            object.__setattr__(self, name, value)
            return
        self._check_not_frozen(name)
        cls = type(self)
        if name in cls._FIELDS:
            object.__setattr__(self, name, check_value(cls, name, value))
        elif name in RENAMED:
            warn(f"config.{name} is deprecated; use config.{RENAMED[name][0]} instead.")
            setattr(self, RENAMED[name][0], value)
        elif name == "model":
            object.__setattr__(self, "model_config", c.model_config(name, value))
        elif name in _INTERNAL_ATTRS or isinstance(getattr(cls, name, None), property):
            object.__setattr__(self, name, value)
        else:
            hint = suggest(name, cls._FIELDS, n=1) or (
                " New keys of a config subclass are declared as annotated class attributes."
            )
            raise ConfigError(f"Unknown option {name!r} for {cls.__name__}.{hint}")

    def __getattr__(self, name: str) -> Any:
        """Resolve deprecated key names (with a ``DeprecationWarning``); else ``AttributeError``."""
        if not name.startswith("__") and name in RENAMED:
            warn(f"config.{name} is deprecated; use config.{RENAMED[name][0]} instead.")
            return getattr(self, RENAMED[name][0])
        hint = suggest(name, type(self)._FIELDS, n=1) if not name.startswith("__") else ""
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}.{hint}")

    def __eq__(self, other: object) -> bool:
        """Configs are equal when they have the same type and equal keys."""
        if type(other) is not type(self):
            return NotImplemented
        return all(_equal(getattr(self, n), getattr(other, n)) for n in type(self)._FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        """Show only the keys that differ from the defaults."""
        cls = type(self)
        changed = [
            f"{name}={getattr(self, name)!r}"
            for name, field in cls._FIELDS.items()
            if not _equal(getattr(self, name), default_value(cls, field))
        ]
        return f"{cls.__name__}({', '.join(changed)})"

    # ------------------------------------------------------------------ lifecycle
    def freeze(self) -> None:
        """Make this config read-only: any later set raises ``FrozenConfigError``.

        Why: runners and groups share the caller's config; freezing catches code
        that would change it for everyone. Get a modifiable copy with
        ``config.copy(copy_frozen=False)``.
        """
        self._is_frozen = True
        if isinstance(self.evaluation_config, ConfigBase):
            self.evaluation_config.freeze()

    def copy(self, copy_frozen: bool | None = None) -> Self:
        """Return a deep copy; ``copy_frozen`` None keeps the frozen state, False/True sets it."""
        config = copy.deepcopy(self)
        if copy_frozen is not None:
            config._is_frozen = bool(copy_frozen)
        return config

    # ------------------------------------------------------------------ dict I/O
    def to_dict(self) -> dict[str, Any]:
        """Return every key as a plain dict (deep-copied), with RLlib's dict names.

        ``framework_str``/``input_``/``callbacks_class``/``lambda_`` appear as
        ``framework``/``input``/``callbacks``/``lambda``; ``model`` repeats
        ``model_config`` for old-stack code. ``from_dict`` reads it back.
        """
        result = {DICT_KEYS.get(name, name): getattr(self, name) for name in type(self)._FIELDS}
        result["model"] = self.model_config
        return copy.deepcopy(result)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> Self:
        """Build a config from a dict (``to_dict`` output or an RLlib-style dict)."""
        return cls().update_from_dict(config_dict, _where=f"{cls.__name__}.from_dict()")

    def update_from_dict(self, config_dict: dict[str, Any], *, _where: str | None = None) -> Self:
        """Set keys from a dict; all or nothing, with every bad key reported at once.

        Accepts attribute names, RLlib's dict names (``framework``, ``input``,
        ``lambda``, ``callbacks``, ``model``), deprecated names (with a warning),
        and a legacy nested ``"multiagent"`` dict.
        """
        where = _where or f"{type(self).__name__}.update_from_dict()"
        self._check_not_frozen(next(iter(config_dict), "?"))
        flat = {k: v for k, v in config_dict.items() if k != "multiagent"}
        values, problems = self._resolve(None, flat, where)
        nested = config_dict.get("multiagent")
        if nested:
            more, found = self._resolve(MA, nested, f"{where}['multiagent']")
            values.update(more)
            problems.extend(found)
        if problems:
            raise ConfigError(problems=problems)
        for name, value in values.items():
            object.__setattr__(self, name, value)
        return self

    @classmethod
    def overrides(cls, **kwargs: Any) -> dict[str, Any]:
        """Return ``kwargs`` as a dict of checked config overrides (e.g. for a ``PolicySpec``)."""
        _, problems = cls()._resolve(None, kwargs, f"{cls.__name__}.overrides()")
        if problems:
            raise ConfigError(problems=problems)
        return dict(kwargs)

    def _key_to_attr(self, key: str) -> str | None:
        name = _ATTR_FOR_DICT_KEY.get(key, key)
        if name in type(self)._FIELDS:
            return name
        return "model_config" if key == "model" else RENAMED.get(key, (None,))[0]

    def __getitem__(self, key: str) -> Any:
        """Dict-style read (``config["train_batch_size"]``, ``config["lambda"]``)."""
        name = self._key_to_attr(key)
        if name is None:
            raise KeyError(f"{key!r}.{suggest(key, self.keys(), n=1)}")
        return getattr(self, name)

    def __setitem__(self, key: str, value: Any) -> None:
        """Dict-style write; same checks as attribute assignment."""
        self.update_from_dict({key: value})

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._key_to_attr(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        """Dict-style read with a default for unknown keys."""
        return self[key] if key in self else default

    def keys(self) -> list[str]:
        """The keys of ``to_dict()``."""
        return [DICT_KEYS.get(n, n) for n in type(self)._FIELDS] + ["model"]

    def values(self) -> list[Any]:
        """The values of ``keys()`` (not copied)."""
        return [self[k] for k in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        """``(key, value)`` pairs of ``keys()`` (not copied)."""
        return [(k, self[k]) for k in self.keys()]

    def __iter__(self):
        return iter(self.keys())

    # ------------------------------------------------------------------ internals
    def _check_not_frozen(self, key: str) -> None:
        if self._is_frozen:
            raise FrozenConfigError(
                f"Cannot set {key!r}: the config is frozen; use config.copy(copy_frozen=False) "
                "to get a modifiable copy."
            )

    def _update(self, section: str, kwargs: dict[str, Any]) -> Self:
        """Check and set the builder ``section``'s kwargs: all or nothing."""
        given = {k: v for k, v in kwargs.items() if v is not NotProvided}
        if given:
            self._check_not_frozen(next(iter(given)))
        values, problems = self._resolve(section, given, f"{type(self).__name__}.{section}()")
        if problems:
            raise ConfigError(problems=problems)
        for name, value in values.items():
            object.__setattr__(self, name, value)
        return self

    def _resolve(
        self, section: str | None, kwargs: dict[str, Any], where: str
    ) -> tuple[dict[str, Any], list[str]]:
        """Map keys to attribute names and check values; return ``(values, problems)``.

        ``section=None`` accepts every key (dict I/O), a builder name only its keys.
        """
        cls, values, problems = type(self), {}, []
        for key, value in kwargs.items():
            try:
                if key == "model" and section in (None, TRAIN):
                    base = values.get("model_config", self.model_config)
                    values["model_config"] = {**base, **c.mapping("model", value)}
                    continue
                name = self._attr_for_key(section, key, where)
                if name is not None:
                    values[name] = check_value(cls, name, value)
            except ConfigError as e:
                problems.extend(e.problems)
        return values, problems

    def _attr_for_key(self, section: str | None, key: str, where: str) -> str | None:
        cls = type(self)
        if section is None:
            accepted = {DICT_KEYS.get(n, n): n for n in cls._FIELDS}
            accepted.update({n: n for n in cls._FIELDS})
        else:
            accepted = cls._KWARGS.get(section, {})
        if key in accepted:
            return accepted[key]
        if key in RENAMED and (section is None or section in RENAMED[key][1]):
            warn(f"{where}: option {key!r} is deprecated; use {RENAMED[key][0]!r} instead.")
            return RENAMED[key][0]
        if section in MOVED.get(key, ()):
            home = _home_section(cls, key)
            warn(f"{where}: option {key!r} moved; use {cls.__name__}.{home}({key}=...).")
            return key
        if key in TF_ONLY:
            warn(f"{where}: {key!r} only configures TensorFlow, which envrunners does "
                  "not support; it is ignored.", UserWarning)  # fmt: skip
            return None
        if key in UNSUPPORTED:
            raise ConfigError(
                f"Option {key!r} of {where} is not supported by envrunners: {UNSUPPORTED[key]}."
            )
        home = _home_section(cls, key)
        if home is None and key in cls._FIELDS:
            raise ConfigError(
                f"Option {key!r} is not set by a builder method; assign config.{key} instead."
            )
        if home is not None:
            raise ConfigError(
                f"Option {key!r} is not accepted by {where}; set it with "
                f"{cls.__name__}.{home}({key}=...)."
            )
        raise ConfigError(f"Unknown option {key!r} for {where}.{suggest(key, accepted, n=1)}")


def check_value(cls: type, name: str, value: Any) -> Any:
    """Run the declared check of key ``name`` on ``value``; return the value to store."""
    return cls._FIELDS[name].metadata["check"](name, value)


def _home_section(cls: type, key: str) -> str | None:
    """Return the builder that accepts ``key`` (or the key it was renamed to)."""
    key = RENAMED.get(key, (key,))[0]
    return next((s for s, kws in cls._KWARGS.items() if key in kws), None)


# builder method -> (section, positional parameters); used to publish signatures.
_BUILDERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "environment": (ENV, ("env",)), "env_runners": (RUN, ()), "fault_tolerance": (FT, ()),
    "multi_agent": (MA, ()), "offline_data": (OFF, ()), "rl_module": (MOD, ()),
    "training": (TRAIN, ()), "learners": (LRN, ()), "framework": (FW, ("framework",)),
    "debugging": (DBG, ()), "callbacks": (CBS, ("callbacks_class",)), "reporting": (REP, ()),
    "evaluation": (EVAL, ()), "resources": (RES, ()), "experimental": (EXP, ()),
    "python_environment": (PYENV, ()),
}  # fmt: skip


def _attach_signatures(cls: type) -> None:
    """Give the builders defined on ``cls`` a signature listing their keywords.

    Why: the keys live in one table, so ``help()``/``inspect.signature`` show
    the real keywords (those of ``cls``, e.g. PPO's ``training()`` keys) instead
    of ``**kwargs``.
    """
    kind = inspect.Parameter
    for method, (section, positional) in _BUILDERS.items():
        fn = cls.__dict__.get(method)
        if fn is None:
            continue
        params = [kind("self", kind.POSITIONAL_OR_KEYWORD)]
        params += [kind(p, kind.POSITIONAL_OR_KEYWORD, default=NotProvided) for p in positional]
        names = [k for k in cls._KWARGS.get(section, {}) if k not in positional]
        names += ["model"] if section == TRAIN else []
        params += [kind(k, kind.KEYWORD_ONLY, default=NotProvided) for k in names]
        fn.__signature__ = inspect.Signature(params, return_annotation=cls.__name__)
