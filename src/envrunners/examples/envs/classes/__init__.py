"""envrunners.examples.envs.classes: example environment classes."""
