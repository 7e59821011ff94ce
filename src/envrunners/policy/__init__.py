"""envrunners.policy."""
