"""envrunners.sampling."""
