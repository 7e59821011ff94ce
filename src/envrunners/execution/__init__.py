"""envrunners.execution."""
