"""Callbacks that training results go through (experiment-tracking loggers)."""
