"""``InputReader``: the interface every experience source of a ``RolloutWorker`` implements.

Why: a worker reads its training data through one method, ``next()``, whether the
data comes from its own env (``SamplerInput``), from files (``JsonReader``,
``D4RLReader``) or from a mix of both (``MixedInput``). Subclasses implement
``next()``; everything that only needs "give me the next batch" takes an
``InputReader`` (or any object with a ``next()`` method).

TensorFlow is out of scope, so ``tf_input_ops`` raises ``NotImplementedError``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["InputReader"]


class InputReader:
    """A source of experience batches: ``next()`` returns a ``SampleBatch``/``MultiAgentBatch``.

    Why: the one method the old-stack sampling loop calls to get data, so files,
    envs and mixtures of both are interchangeable.
    """

    def next(self) -> Any:
        """Return the next batch of experience (``SampleBatch`` or ``MultiAgentBatch``).

        Raises:
            NotImplementedError: always, in this abstract base.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement next(), returning the next SampleBatch "
            "or MultiAgentBatch"
        )

    def tf_input_ops(self, queue_size: int = 1) -> dict[str, Any]:
        """RLlib's TensorFlow queue over ``next()``: not available (envrunners is torch-only).

        Raises:
            NotImplementedError: always; call ``next()`` and feed the batch to torch instead.
        """
        raise NotImplementedError(
            "InputReader.tf_input_ops() builds a TensorFlow input queue, and envrunners "
            "does not support TensorFlow; call reader.next() to get numpy batches "
            "(batch.to_device(...) moves them to torch)."
        )
