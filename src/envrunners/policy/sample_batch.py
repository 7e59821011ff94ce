"""Experience batches of the old API stack (``ray.rllib.policy.sample_batch``).

Why: the public import path for ``SampleBatch``, ``MultiAgentBatch`` and the
functions that combine them. The classes are defined in private modules
(``_sample_batch``, ``_multi_agent_batch``; leaf and sequence arithmetic in
``_batch_ops`` and ``_seq_ops``) and re-exported here, under this module's name,
so pickles and reprs name this stable path.
"""

from __future__ import annotations

from envrunners.core import DEFAULT_POLICY_ID
from envrunners.policy._multi_agent_batch import (
    MultiAgentBatch,
    SampleBatchType,
    concat_samples,
    concat_samples_into_ma_batch,
    convert_ma_batch_to_sample_batch,
)
from envrunners.policy._sample_batch import SampleBatch, attempt_count_timesteps

for _obj in (
    SampleBatch,
    MultiAgentBatch,
    attempt_count_timesteps,
    concat_samples,
    concat_samples_into_ma_batch,
    convert_ma_batch_to_sample_batch,
):
    _obj.__module__ = __name__
del _obj

__all__ = [
    "DEFAULT_POLICY_ID",
    "MultiAgentBatch",
    "SampleBatch",
    "SampleBatchType",
    "attempt_count_timesteps",
    "concat_samples",
    "concat_samples_into_ma_batch",
    "convert_ma_batch_to_sample_batch",
]
