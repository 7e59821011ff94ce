"""``GetActions`` (module-to-env): sample ``actions`` from ``action_dist_inputs`` when missing.

RLlib puts this piece first in every module-to-env pipeline. Our runners act
through ``envrunners.core.rl_module._acting.act``, which already samples from
``ACTION_DIST_INPUTS`` when a module returns no ``ACTIONS``; this piece does the
same for batches that reach a pipeline without actions (a user pipeline, a
test), with the module's exploration (or deterministic inference) distribution.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envrunners.connectors.connector_v2 import ConnectorV2
from envrunners.core import _nested
from envrunners.core.columns import Columns
from envrunners.core.rl_module._acting import _sample_actions
from envrunners.core.rl_module._space_layout import cast_to_space
from envrunners.utils.torch_utils import convert_to_torch_tensor

__all__ = ["GetActions"]


def _numpy(value: Any) -> Any:
    return value.detach().cpu().numpy() if hasattr(value, "detach") else value


class GetActions(ConnectorV2):
    """Adds ``actions`` (and ``action_logp``) sampled from ``action_dist_inputs``."""

    reads_episodes = False

    def __call__(
        self, *, rl_module: Any, batch: dict[str, Any], explore: bool | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Sample only when ``batch`` has ``action_dist_inputs`` but no ``actions``."""
        if Columns.ACTIONS in batch or Columns.ACTION_DIST_INPUTS not in batch:
            return batch
        inputs = convert_to_torch_tensor(batch[Columns.ACTION_DIST_INPUTS])
        out = {Columns.ACTION_DIST_INPUTS: inputs}
        if Columns.ACTION_LOGP in batch:
            out[Columns.ACTION_LOGP] = batch[Columns.ACTION_LOGP]
        _sample_actions(rl_module, out, bool(explore), None)
        actions = _nested.map_structure(_numpy, out[Columns.ACTIONS])
        batch[Columns.ACTIONS] = cast_to_space(actions, getattr(rl_module, "action_space", None))
        if Columns.ACTION_LOGP not in batch:
            logp = _numpy(out[Columns.ACTION_LOGP])
            batch[Columns.ACTION_LOGP] = np.asarray(logp, dtype=np.float32)
        return batch
