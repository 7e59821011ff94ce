"""The ``envrunners`` command: ``train``, ``sample``, ``bench`` and ``offline``.

Why: after ``pip install``, one command should do something real and visible on
one machine. ``envrunners train --env CartPole-v1`` trains PPO on an
``EnvRunnerGroup`` (remote runners on an embedded local Ray that the command
starts and stops) with a live progress bar, and writes ``metrics.csv``, a
learning-curve PNG and a resumable checkpoint.

Error policy: bad input (unknown env id, an unknown flag, invalid numbers, a bad
``--config`` key, an unwritable output directory, a missing or damaged checkpoint,
a corrupt offline file) is one line on stderr and exit code 2, in the CLI's
spellings (flags, not Python keywords); any other failure is one line and exit
code 1; Ctrl-C exits with 130 after a clean stop.
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
    """``ArgumentParser`` whose errors are one line (no usage block), exit code 2.

    Flags must be spelled out (``allow_abbrev=False``: ``--num-env`` is not
    ``--num-envs-per-env-runner``); subcommand parsers are of this class too.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

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
        args, extras = parser.parse_known_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if extras:
        sys.stderr.write(unknown_arguments_message(parser, args, extras) + "\n")
        return EXIT_USAGE
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
        sys.stderr.write(f"envrunners {args.command}: error: {cli_spelling(str(err), args)}\n")
        return err.code
    except KeyboardInterrupt:
        sys.stderr.write("envrunners: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `envrunners ... | head`: the reader left; stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as err:
        from envrunners.errors import (
            ConfigError,
            EnvCreatorError,
            EnvRunnersError,
            OfflineDataError,
        )

        if debug:
            traceback.print_exc()
        ours = isinstance(err, EnvRunnersError)  # designed messages: no type name, no hint
        bad_input = isinstance(err, ConfigError | EnvCreatorError | OfflineDataError)
        code = EXIT_USAGE if bad_input else 1
        kind = "" if ours else f"{type(err).__name__}: "
        hint = "" if debug or ours else " (run with --debug for the traceback)"
        line = cli_spelling(_one_line(err), args)
        sys.stderr.write(f"envrunners {args.command}: error: {kind}{line}{hint}\n")
        return code


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """The parser of the command ``args`` ran (``train``, ``offline info``, ...)."""
    current = parser
    names = [getattr(args, "command", None), getattr(args, "offline_command", None)]
    for name in names:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not name or not subs or name not in subs[0].choices:
            break
        current = subs[0].choices[name]
    return current


def unknown_arguments_message(
    parser: argparse.ArgumentParser, args: argparse.Namespace, extras: list[str]
) -> str:
    """One line for arguments no parser took: the first unknown flag and the closest known one."""
    import difflib

    command = _command_parser(parser, args)
    flags = [f for f in extras if f.startswith("-")]
    if not flags:
        return f"{command.prog}: error: unexpected argument(s): {' '.join(extras)}"
    flag = flags[0].split("=", 1)[0]
    known = [o for a in command._actions for o in a.option_strings if o.startswith("--")]
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else f" (see {command.prog} --help)"
    return f"{command.prog}: error: unknown flag {flag}{hint}"


#: Python keyword spellings in library messages -> the flag that does the same.
_CLI_SPELLINGS = {
    "skip_corrupt=True": "--skip-corrupt",
    "allow_pickle=True": "--allow-pickle",
}


def cli_spelling(message: str, args: argparse.Namespace) -> str:
    """``message`` with Python keyword spellings (``skip_corrupt=True``) as flags.

    A sentence naming a keyword whose flag this command does not have is dropped,
    so the message never suggests something the user cannot type.
    """
    import re

    if not any(py in message for py in _CLI_SPELLINGS):
        return message
    flags = {o for o in vars(args)}
    sentences = re.split(r"(?<=[.;])\s+", message)
    kept = []
    for sentence in sentences:
        for py, flag in _CLI_SPELLINGS.items():
            if py in sentence:
                has = flag[2:].replace("-", "_") in flags
                sentence = sentence.replace(f"``{py}``", flag).replace(py, flag) if has else ""
        if sentence:
            kept.append(sentence)
    return " ".join(kept).strip()


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
