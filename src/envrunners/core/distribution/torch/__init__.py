"""envrunners.core.distribution.torch (``ray.rllib.core.distribution.torch``)."""
