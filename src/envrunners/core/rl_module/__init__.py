"""envrunners.core.rl_module."""
