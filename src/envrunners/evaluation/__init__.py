"""envrunners.evaluation."""
