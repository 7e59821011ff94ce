"""envrunners.utils."""
