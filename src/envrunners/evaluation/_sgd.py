"""Minibatch SGD over a sampled batch (RLlib's ``do_minibatch_sgd``, for ``sample_and_learn``).

Why: old-stack training loops sample, standardise some columns and then run
several epochs of minibatch updates per trainable policy; torch policies do the
epochs and minibatches in their own ``learn_on_batch`` (one tensor conversion).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envrunners.policy.sample_batch import SampleBatch
from envrunners.policy.torch_policy import TorchPolicy

__all__ = ["do_minibatch_sgd"]


def do_minibatch_sgd(
    samples: Any,
    policies: Any,
    local_worker: Any,
    num_sgd_iter: int,
    sgd_minibatch_size: int,
    standardize_fields: list[str],
) -> dict[str, Any]:
    """``num_sgd_iter`` epochs of ``sgd_minibatch_size`` minibatches for each trainable policy.

    Fields in ``standardize_fields`` are standardised (over each policy's batch) first.
    """
    ma = samples.as_multi_agent() if isinstance(samples, SampleBatch) else samples
    info: dict[str, Any] = {}
    for pid, batch in ma.policy_batches.items():
        if pid not in local_worker.get_policies_to_train(ma):
            continue
        batch = batch.copy(shallow=True)
        for field in standardize_fields or []:
            if field in batch:
                col = np.asarray(batch[field], dtype=np.float32)
                batch[field] = (col - col.mean()) / max(float(col.std()), 1e-4)
        policy = policies[pid]
        if isinstance(policy, TorchPolicy):
            info[pid] = policy.learn_on_batch(
                batch, num_epochs=num_sgd_iter, minibatch_size=sgd_minibatch_size or None
            )
            continue
        size = sgd_minibatch_size or batch.count
        for _ in range(num_sgd_iter):
            for start in range(0, batch.count, size):
                info[pid] = policy.learn_on_batch(batch[start : start + size])
    return info
