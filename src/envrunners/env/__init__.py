"""envrunners.env."""
