"""``--config FILE``: AlgorithmConfig fields from a YAML or TOML file, checked as the API checks them.

Why: any config field can be set from the command line without a flag per field.
The file is a flat mapping of ``AlgorithmConfig`` field names (RLlib's dict names
such as ``lambda`` work too) to values; it goes through
``AlgorithmConfig.update_from_dict``, so an unknown key or a bad value fails with
the API's message (did-you-mean included), as one line with exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envrunners.errors import CliError, ConfigError

__all__ = ["apply", "load", "one_line", "parse_file", "read_file"]


def one_line(err: BaseException) -> str:
    """A config error as one line: its problems joined with ``; ``."""
    problems = getattr(err, "problems", None)
    if problems:
        return "; ".join(str(p).strip() for p in problems)
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def read_file(path: Path, flag: str = "--config") -> Any:
    """The parsed YAML (``.yaml``/``.yml``/``.json``) or TOML file at ``path``."""
    suffix = path.suffix.lower()
    text = path.read_text()
    if suffix == ".toml":
        import tomllib

        return tomllib.loads(text)
    if suffix in (".yaml", ".yml", ".json"):
        import yaml

        return yaml.safe_load(text)
    raise CliError(
        f"{flag} {str(path)!r}: expected a .yaml, .yml or .toml file, got {suffix or 'no suffix'!r}"
    )


def parse_file(file: str, flag: str) -> tuple[Any, str]:
    """``(parsed content, "FLAG 'path'")`` of the YAML/TOML file a flag names.

    Raises:
        CliError: The file is missing or cannot be parsed (exit code 2).
    """
    path = Path(file).expanduser()
    where = f"{flag} {str(path)!r}"
    if not path.is_file():
        raise CliError(f"{where}: no such file")
    try:
        return read_file(path, flag), where
    except CliError:
        raise
    except Exception as err:  # yaml/toml syntax errors, undecodable bytes
        raise CliError(f"{where}: cannot parse it: {one_line(err)}") from None


def load(file: str, config_class: type) -> dict[str, Any]:
    """Read ``file`` and check its keys and values against a fresh ``config_class()``.

    Returns:
        The file's mapping (applied later with ``apply``).

    Raises:
        CliError: The file is missing, unreadable, not a mapping, or has an unknown
            key or bad value (exit code 2).
    """
    data, where = parse_file(file, "--config")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CliError(
            f"{where}: expected a mapping of AlgorithmConfig fields, got {type(data).__name__}"
        )
    apply(config_class(), data, where)
    return data


def apply(config: Any, overrides: dict[str, Any], where: str) -> Any:
    """``config.update_from_dict(overrides)`` with its errors as one-line ``CliError``."""
    try:
        return config.update_from_dict(overrides, _where=where)
    except ConfigError as err:
        raise CliError(one_line(err)) from None
    except (TypeError, ValueError) as err:
        raise CliError(f"{where}: {one_line(err)}") from None
