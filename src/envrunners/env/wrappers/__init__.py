"""envrunners.env.wrappers."""
