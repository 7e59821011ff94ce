"""Exit codes of the ``envrunners`` command besides 0 (success) and 1 (a failure)."""

from __future__ import annotations

__all__ = ["EXIT_INTERRUPTED", "EXIT_USAGE"]

#: Exit code of bad input (argparse's convention; ``CliError``'s default code).
EXIT_USAGE = 2
#: Exit code after Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130
