"""Atari ids on the command line: RLlib's new-stack wrapping, and the words that say so.

Why: ``--env ale_py:ALE/Pong-v5`` (or ``ALE/Pong-v5``) given raw would hand the
module 210x160x3 RGB frames, which the default module refuses (no conv filters for
that size). ``train`` and ``sample`` instead build each env as RLlib's Atari
examples do, ``wrap_atari_for_new_api_stack(gym.make(id, frameskip=1, ...), dim=84,
framestack=4, normalize=False)`` (uint8 frames), so the default CNN (84x84 filters from the table) gets
``(84, 84, 4)`` frames, and both commands print that they did.
"""

from __future__ import annotations

from typing import Any

from envrunners.errors import CliError

__all__ = ["ALE_KWARGS", "AtariEnvCreator", "config_env", "ensure_ale", "wrapping_note"]

#: Frame size and stack depth of the wrapping (RLlib's Atari settings).
DIM = 84
FRAMESTACK = 4
#: ``gym.make`` keywords: the wrapper skips frames itself, so ALE must not (RLlib's examples).
ALE_KWARGS = {"frameskip": 1, "full_action_space": False, "repeat_action_probability": 0.0}


def is_atari_id(env_id: str) -> bool:
    """Whether the command line's ``--env`` names an ALE game (``ALE/...`` or ``ale_py:...``)."""
    from envrunners.env.wrappers.atari_wrappers import is_atari

    return isinstance(env_id, str) and is_atari(env_id)


def ensure_ale() -> None:
    """Import ale-py and register its ids with gymnasium (``ALE/Pong-v5`` needs it).

    Raises:
        CliError: ale-py is not installed (exit code 2), naming the extra to install.
    """
    import gymnasium as gym

    try:
        import ale_py
    except ImportError:
        raise CliError(
            "Atari envs need ale-py: pip install 'envrunners[atari]' (or pip install ale-py)"
        ) from None
    gym.register_envs(ale_py)


class AtariEnvCreator:
    """Env creator ``(env_config) -> wrapped Atari env``; picklable for remote runners.

    Args:
        env_id: The ALE id, e.g. ``"ale_py:ALE/Pong-v5"``.
    """

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id

    def __call__(self, env_config: Any = None) -> Any:
        import gymnasium as gym

        from envrunners.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

        ensure_ale()
        kwargs = {**ALE_KWARGS, **dict(env_config or {})}
        env = gym.make(self.env_id, **kwargs)
        # uint8 frames (a quarter of the memory); the default CNN maps them to x/128 - 1,
        # exactly what the normalizing wrapper would give it.
        return wrap_atari_for_new_api_stack(env, dim=DIM, framestack=FRAMESTACK, normalize=False)

    def __repr__(self) -> str:
        return f"AtariEnvCreator({self.env_id!r})"


def config_env(env_id: str) -> Any:
    """What ``config.environment()`` gets for ``--env``: the id, or for Atari its creator."""
    if is_atari_id(env_id):
        ensure_ale()
        return AtariEnvCreator(env_id)
    return env_id


def wrapping_note(env_id: str) -> str:
    """A phrase for the command's first line: how an Atari env is wrapped ('' otherwise)."""
    if not is_atari_id(env_id):
        return ""
    return (
        f" with Atari wrapping (wrap_atari_for_new_api_stack: {DIM}x{DIM} grayscale, "
        f"frameskip 4, framestack {FRAMESTACK}, uint8 frames; default CNN)"
    )
