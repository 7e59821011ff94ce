"""Small deterministic envs for tests."""
