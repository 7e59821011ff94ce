"""envrunners.examples: example envs and modules shipped with the package (RLlib's path)."""
