"""envrunners.core.distribution (``ray.rllib.core.distribution``)."""
