"""The sampling core: one loop per agent kind (``single_agent``, ``multi_agent``),
preallocated column ``buffers`` and the one ``sample_result`` type both loops return."""
