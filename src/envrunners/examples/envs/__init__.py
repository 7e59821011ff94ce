"""envrunners.examples.envs: example environments."""
