"""``ConnectorPipelineV2``: pieces run in order, each on the previous piece's batch.

RLlib's pipeline always passes every keyword; a user piece declaring only some
keywords without ``**kwargs`` then fails with a TypeError. Here each piece gets
exactly the keywords its ``__call__`` declares (all of them when it takes
``**kwargs``), worked out once when the piece joins the pipeline. A piece that
returns ``None`` (or anything but a dict) stops the pipeline with a
``ConnectorError`` naming the piece.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Collection, Iterable, Iterator
from typing import Any

import gymnasium as gym

from envrunners.connectors.connector_v2 import ConnectorV2
from envrunners.errors import ConnectorError

__all__ = ["ConnectorPipelineV2"]

logger = logging.getLogger("envrunners")


def accepted_keywords(connector: Any) -> tuple[str, ...] | None:
    """The keywords ``connector.__call__`` declares; ``None`` when it takes ``**kwargs``."""
    try:
        params = inspect.signature(connector.__call__).parameters.values()
    except (TypeError, ValueError):  # no introspectable signature: pass everything
        return None
    names = []
    for p in params:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    return tuple(names)


def returned_no_batch(connector: Any, out: Any) -> ConnectorError:
    """The error for a piece whose ``__call__`` returned ``out`` (not a dict)."""
    got = "None" if out is None else f"a {type(out).__name__}"
    return ConnectorError(
        f"ConnectorV2 {type(connector).__name__} returned {got} from __call__: a connector "
        "must return the batch (the `batch` argument it was given, changed in place or "
        "replaced by a new dict). Add `return batch` at the end of its __call__."
    )


class ConnectorPipelineV2(ConnectorV2):
    """Runs its connector pieces in order; its state is ``{piece name: piece state}``.

    Edit it with ``append``/``prepend``/``insert_before``/``insert_after``/``remove``
    (they rewire the spaces and note each piece's keywords), not through
    ``connectors`` directly.

    Args:
        input_observation_space: The observation space entering the first piece.
        input_action_space: The action space entering the first piece.
        connectors: The pieces, in order (more can be added later).
    """

    reads_episodes = False  # recomputed from the pieces in _rewire

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        connectors: Iterable[ConnectorV2] | None = None,
        **kwargs: Any,
    ):
        self.connectors: list[ConnectorV2] = list(connectors or [])
        self._calls: list[tuple[Any, tuple[str, ...] | None]] = []
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self._rewire()

    # -- spaces and wiring -----------------------------------------------------------
    def _pass_spaces(self, obs: gym.Space | None, act: gym.Space | None) -> tuple:
        """Set each piece's input spaces from the previous piece's outputs; the last outputs."""
        for conn in getattr(self, "connectors", ()):
            conn.input_action_space = act
            conn.input_observation_space = obs
            obs, act = conn.observation_space, conn.action_space
        return obs, act

    def _rewire(self) -> None:
        """Pass the spaces down the pieces and note which keywords each one takes."""
        self._pass_spaces(self.input_observation_space, self.input_action_space)
        self._calls = [(c, accepted_keywords(c)) for c in self.connectors]
        self.reads_episodes = any(getattr(c, "reads_episodes", True) for c in self.connectors)

    @property
    def supports_ready_first(self) -> bool:  # type: ignore[override]
        """Whether every piece that reads ``episodes`` takes ready-first batches (read
        from the pieces each time: a piece's own flag may be set after it was added)."""
        return not self.pieces_refusing_ready_first()

    def pieces_refusing_ready_first(self) -> list[ConnectorV2]:
        """The pieces that read ``episodes`` but cannot take a ready-first batch."""
        return [
            c
            for c in self.connectors
            if getattr(c, "reads_episodes", True) and not getattr(c, "supports_ready_first", False)
        ]

    def recompute_output_observation_space(self, input_observation_space, input_action_space):
        """The observation space after the last piece."""
        return self._pass_spaces(input_observation_space, input_action_space)[0]

    def recompute_output_action_space(self, input_observation_space, input_action_space):
        """The action space after the last piece."""
        return self._pass_spaces(input_observation_space, input_action_space)[1]

    @property
    def observation_space(self) -> gym.Space | None:
        """The observation space after the last piece."""
        if self.connectors:
            return self.connectors[-1].observation_space
        return self._observation_space

    @property
    def action_space(self) -> gym.Space | None:
        """The action space after the last piece."""
        if self.connectors:
            return self.connectors[-1].action_space
        return self._action_space

    def __len__(self) -> int:
        return len(self.connectors)

    def __iter__(self) -> Iterator[ConnectorV2]:
        return iter(self.connectors)

    # -- the call --------------------------------------------------------------------
    def __call__(
        self,
        *,
        rl_module: Any = None,
        batch: dict[str, Any],
        episodes: Any = None,
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Run every piece on ``batch`` in order; each gets the keywords it declares."""
        full = {
            "rl_module": rl_module,
            "batch": batch,
            "episodes": episodes if episodes is not None else [],
            "explore": explore,
            "shared_data": shared_data if shared_data is not None else {},
            "metrics": metrics,
            **kwargs,
        }
        for conn, names in self._calls:
            full["batch"] = batch
            if names is None:
                out = conn(**full)
            else:
                out = conn(**{k: full[k] for k in names if k in full})
            if not isinstance(out, dict):
                raise returned_no_batch(conn, out)
            batch = out
        return batch

    # -- editing ---------------------------------------------------------------------
    def _index_of(self, name_or_class: str | type) -> int:
        for i, conn in enumerate(self.connectors):
            if isinstance(name_or_class, type):
                if type(conn) is name_or_class:
                    return i
            elif conn.name == name_or_class:
                return i
        return -1

    def _require(self, name_or_class: str | type) -> int:
        index = self._index_of(name_or_class)
        if index < 0:
            raise ValueError(
                f"no connector {getattr(name_or_class, '__name__', name_or_class)!r} in "
                f"pipeline {[c.name for c in self.connectors]}"
            )
        return index

    def append(self, connector: ConnectorV2) -> ConnectorPipelineV2:
        """Add a piece at the end."""
        self.connectors.append(connector)
        self._rewire()
        return self

    def prepend(self, connector: ConnectorV2) -> ConnectorPipelineV2:
        """Add a piece at the front."""
        self.connectors.insert(0, connector)
        self._rewire()
        return self

    def insert_before(self, name_or_class: str | type, connector: ConnectorV2) -> ConnectorV2:
        """Insert ``connector`` right before the first piece with this name or class.

        Raises:
            ValueError: No such piece.
        """
        self.connectors.insert(self._require(name_or_class), connector)
        self._rewire()
        return connector

    def insert_after(self, name_or_class: str | type, connector: ConnectorV2) -> ConnectorV2:
        """Insert ``connector`` right after the first piece with this name or class.

        Raises:
            ValueError: No such piece.
        """
        self.connectors.insert(self._require(name_or_class) + 1, connector)
        self._rewire()
        return connector

    def remove(self, name_or_class: str | type) -> None:
        """Remove the first piece with this name or class (a warning if there is none)."""
        index = self._index_of(name_or_class)
        if index < 0:
            logger.warning("Trying to remove a non-existent connector %s.", name_or_class)
            return
        del self.connectors[index]
        self._rewire()

    def __getitem__(self, key: str | int | type) -> ConnectorV2:
        """The piece at an index, or the first piece with this name or class."""
        if isinstance(key, int):
            return self.connectors[key]
        for conn in self.connectors:
            if conn.name == key or (isinstance(key, type) and isinstance(conn, key)):
                return conn
        raise KeyError(f"no connector {key!r} in pipeline {[c.name for c in self.connectors]}")

    # -- state -----------------------------------------------------------------------
    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """``{piece name: piece state}`` for every stateful piece (optionally selected)."""
        wanted = [components] if isinstance(components, str) else components
        unwanted = [not_components] if isinstance(not_components, str) else not_components or ()
        state = {}
        for conn in self.connectors:
            if (wanted is not None and conn.name not in wanted) or conn.name in unwanted:
                continue
            if s := conn.get_state():
                state[conn.name] = s
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Give each piece its part of ``state`` (unknown names are ignored)."""
        for conn in self.connectors:
            if conn.name in state:
                conn.set_state(state[conn.name])

    def reset_state(self) -> None:
        """Reset every piece."""
        for conn in self.connectors:
            conn.reset_state()

    def merge_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """Merge pipeline states piece by piece with each piece's own ``merge_states``."""
        merged: dict[str, Any] = {}
        for conn in self.connectors:
            parts = [s[conn.name] for s in states if conn.name in s]
            if parts:
                merged[conn.name] = conn.merge_states(parts)
        return merged

    def __repr__(self) -> str:
        return f"{type(self).__name__}({[c.name for c in self.connectors]})"

    def __str__(self, indentation: int = 0) -> str:
        return "\n".join(
            [" " * indentation + type(self).__name__]
            + [c.__str__(indentation + 4) for c in self.connectors]
        )
