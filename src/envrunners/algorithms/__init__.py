"""envrunners.algorithms."""
