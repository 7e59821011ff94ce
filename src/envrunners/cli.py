"""The ``envrunners`` command: ``train``, ``sample``, ``bench`` and ``offline``.

Why: after ``pip install``, one command should do something real and visible on
one machine. ``envrunners train --env CartPole-v1`` trains PPO on an
``EnvRunnerGroup`` (remote runners on an embedded local Ray that the command
starts and stops) with a live progress bar, and writes ``metrics.csv``, a
learning-curve PNG and a resumable checkpoint.

Error policy: bad input (unknown env id, invalid numbers, an unwritable output
directory, a missing checkpoint) is one line on stderr and exit code 2; any other
failure is one line and exit code 1; Ctrl-C exits with 130 after a clean stop.
``--debug`` shows tracebacks and Ray's own logs.

Examples::

    envrunners train --env CartPole-v1
    envrunners train --resume runs/CartPole-v1-ppo-20250101-120000 --stop-timesteps 300000
    envrunners sample --env CartPole-v1 --timesteps 20000 --output /tmp/cartpole-json
    envrunners sample --env CartPole-v1 --multi-agent --num-agents 4
    envrunners bench --workloads W1,W3
    envrunners offline info /tmp/cartpole-json
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Any, NoReturn

from envrunners._cli.exit_codes import EXIT_INTERRUPTED, EXIT_USAGE
from envrunners.errors import CliError

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """``ArgumentParser`` whose errors are one line (no usage block), exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(EXIT_USAGE)


def _debug_flag() -> argparse.ArgumentParser:
    parent = _Parser(add_help=False)
    parent.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show tracebacks and Ray's logs",
    )
    return parent


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (``train``, ``sample``, ``bench``, ``offline``)."""
    import envrunners
    from envrunners._cli.bench import add_bench_parser
    from envrunners._cli.evaluate import add_evaluate_parser
    from envrunners._cli.sample import add_sample_parser
    from envrunners._cli.train import add_train_parser
    from envrunners.offline.cli_commands import add_offline_subcommands

    parents = [_debug_flag()]
    parser = _Parser(
        prog="envrunners",
        description="Fast, fault-tolerant RL experience collection with RLlib's sampling API.",
        epilog="Start with: envrunners train --env CartPole-v1",
        parents=parents,
    )
    parser.add_argument("--version", action="version", version=envrunners.__version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_train_parser(sub, parents)
    add_evaluate_parser(sub, parents)
    add_sample_parser(sub, parents)
    add_bench_parser(sub, parents)
    add_offline_subcommands(sub)
    return parser


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def _stack_dumps_on_sigusr1() -> None:
    """``kill -USR1 <pid>`` prints every thread's stack to stderr (for a hung run)."""
    import faulthandler
    import signal

    if hasattr(signal, "SIGUSR1"):
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        except (RuntimeError, ValueError, OSError):  # no usable stderr: no dumps
            pass


def main(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    debug = bool(getattr(args, "debug", False))
    if not debug:
        _quiet_warnings()
    _stack_dumps_on_sigusr1()
    path = getattr(args, "path", None)  # offline commands take one or more paths
    if args.command == "offline" and isinstance(path, list) and len(path) == 1:
        args.path = path[0]
    try:
        return int(args.func(args) or 0)
    except CliError as err:
        if debug:
            traceback.print_exc()
        sys.stderr.write(f"envrunners {args.command}: error: {err}\n")
        return err.code
    except KeyboardInterrupt:
        sys.stderr.write("envrunners: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `envrunners ... | head`: the reader left; stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as err:
        from envrunners.errors import ConfigError, EnvCreatorError, EnvRunnersError

        if debug:
            traceback.print_exc()
        ours = isinstance(err, EnvRunnersError)  # designed messages: no type name, no hint
        code = EXIT_USAGE if isinstance(err, ConfigError | EnvCreatorError) else 1
        kind = "" if ours else f"{type(err).__name__}: "
        hint = "" if debug or ours else " (run with --debug for the traceback)"
        sys.stderr.write(f"envrunners {args.command}: error: {kind}{_one_line(err)}{hint}\n")
        return code


def _quiet_warnings() -> None:
    """Hide library warnings (gymnasium, torch, ray) from the progress display."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("ray").setLevel(logging.ERROR)


def _entry() -> Any:  # pragma: no cover - console_scripts wrapper
    raise SystemExit(main())


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
