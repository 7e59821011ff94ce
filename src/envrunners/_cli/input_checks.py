"""Checks of the CLI's inputs that need more than parsing: env ids, envs, output directories.

Why: a command fails on an unknown env id (with close ids suggested), an env
that cannot be built or an unwritable directory before it starts anything
expensive, as one line with exit code 2 (``CliError``).
"""

from __future__ import annotations

import difflib
import importlib
import os
import tempfile
from pathlib import Path
from typing import Any

from envrunners.errors import CliError

__all__ = ["check_env_id", "prepare_output_dir", "probe_env"]

#: Id namespaces -> the module whose import registers them with gymnasium.
_NAMESPACE_MODULES = {"ALE": "ale_py"}


def check_env_id(env_id: str) -> None:
    """Fail with close gymnasium ids when ``env_id`` is neither registered nor importable.

    Accepts gymnasium ids (``CartPole-v1``), gymnasium's ``module:Id`` form and names
    given to ``envrunners.register_env``.

    Raises:
        CliError: Unknown id (exit code 2), with up to three close ids suggested.
    """
    import gymnasium as gym

    from envrunners.env import registry

    if env_id in gym.registry or env_id in getattr(registry, "_REGISTRY", {}):
        return
    if ":" in env_id:
        module = env_id.split(":", 1)[0]
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise CliError(
                f"unknown env {env_id!r}: cannot import module {module!r} ({err})"
            ) from None
        if env_id.split(":", 1)[1] in gym.registry or env_id in gym.registry:
            return
    namespace = env_id.split("/", 1)[0] if "/" in env_id and ":" not in env_id else ""
    if namespace in _NAMESPACE_MODULES:  # ids a package registers when it is imported
        module = _NAMESPACE_MODULES[namespace]
        raise CliError(
            f"unknown env {env_id!r}: {namespace} ids are registered by the {module} package; "
            f"--env {module}:{env_id} imports it first (pip install {module.replace('_', '-')})"
        )
    close = difflib.get_close_matches(env_id, list(gym.registry.keys()), n=3, cutoff=0.6)
    if not close:  # case slips ("cartpole-v1") are common
        lowered = {k.lower(): k for k in gym.registry.keys()}
        close = [lowered[m] for m in difflib.get_close_matches(env_id.lower(), list(lowered), 3)]
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise CliError(f"unknown env {env_id!r}{hint} (see gymnasium.pprint_registry())")


def probe_env(env_id: str) -> Any:
    """Build one env to fail early (missing extras) and read its spec; returns the spec.

    Raises:
        CliError: The env cannot be built (exit code 1, the reason in the message).
    """
    import gymnasium as gym

    try:
        env = gym.make(env_id, disable_env_checker=True)
    except gym.error.DependencyNotInstalled as err:
        raise CliError(f"env {env_id!r} needs extra packages: {err}") from None
    except Exception as err:
        raise CliError(f"cannot create env {env_id!r}: {type(err).__name__}: {err}", 1) from None
    spec = env.spec
    env.close()
    return spec


def prepare_output_dir(path: str | os.PathLike, what: str = "output dir") -> Path:
    """Create ``path`` (and parents) and prove it is writable by writing a temp file.

    Raises:
        CliError: It cannot be created or written (exit code 2).
    """
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise CliError(f"cannot write to {what} {str(target)!r}: it is a file, not a directory")
    try:
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target, prefix=".write-test-"):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise CliError(f"cannot write to {what} {str(target)!r}: {reason}") from None
    return target
