"""Vanilla policy gradient (REINFORCE): ``PGConfig`` and ``PGTorchPolicy``."""

from envrunners.algorithms.pg.pg import PGConfig, PGTorchPolicy

__all__ = ["PGConfig", "PGTorchPolicy"]
