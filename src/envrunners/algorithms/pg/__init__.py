"""Vanilla policy gradient (REINFORCE): ``PG``, ``PGConfig`` and ``PGTorchPolicy``."""

from envrunners.algorithms.pg.pg import PG, PGConfig, PGTorchPolicy

__all__ = ["PG", "PGConfig", "PGTorchPolicy"]
