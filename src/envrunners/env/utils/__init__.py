"""envrunners.env.utils."""
