"""Private helpers of the ``envrunners`` command line (see ``envrunners.cli``)."""
