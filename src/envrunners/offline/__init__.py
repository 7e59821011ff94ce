"""envrunners.offline."""
