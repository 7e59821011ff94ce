"""``envrunners bench``: run the repository's ``benchmarks/`` workloads and print a table.

Why: the speed claims in the README must be reproducible with one command. The
workloads live in the source checkout (``benchmarks/w*_*.py``, driven by
``benchmarks/run.py``), not in the installed package, so this command finds
that folder (next to ``src/`` of an editable install, the current directory, or
``--benchmarks-dir``), runs the workloads on envrunners and, when RLlib is
available (importable here, or through ``--rllib-python``), on ``ray.rllib`` too,
and prints both numbers and their ratio side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from envrunners._cli import arguments
from envrunners.errors import CliError

__all__ = ["add_bench_parser", "run_bench"]

_KEY_FIELDS = ("num_envs", "num_runners", "variant", "size", "case")
_METRICS = ("env_steps_per_s", "per_s", "mb_per_s")


def add_bench_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add ``bench`` to the subparsers ``sub``."""
    p = sub.add_parser(
        "bench",
        parents=parents,
        help="run benchmarks/ workloads; envrunners vs ray.rllib ratios when both are available",
        description="Run the benchmark workloads of a source checkout and print a table.",
    )
    p.add_argument(
        "--target",
        choices=["envrunners", "ray.rllib", "both"],
        default="both",
        help="what to measure (default both: RLlib too when it is available)",
    )
    p.add_argument("--workloads", default="W1,W5", help="comma-separated, e.g. W1,W3 (W1,W5)")
    p.add_argument("--repeats", type=arguments.positive_int, default=3, help="timed repeats (3)")
    p.add_argument(
        "--rllib-python",
        default=os.environ.get("RLLIB_PYTHON"),
        help="python of a virtualenv with ray[rllib] (env RLLIB_PYTHON)",
    )
    p.add_argument("--benchmarks-dir", help="the benchmarks/ folder (default: found)")
    p.add_argument("--json", action="store_true", help="also print the raw JSON lines")
    p.set_defaults(func=run_bench)
    return p


def find_benchmarks(explicit: str | None) -> Path:
    """The ``benchmarks/`` folder holding ``run.py``.

    Raises:
        CliError: None found (benchmarks ship with the source checkout only).
    """
    import envrunners

    if explicit:
        candidates = [Path(explicit)]
    else:
        package = Path(envrunners.__file__).resolve().parent
        candidates = [package.parents[1] / "benchmarks", Path.cwd() / "benchmarks"]
    for folder in candidates:
        if (folder / "run.py").is_file():
            return folder
    shown = ", ".join(str(c) for c in candidates)
    raise CliError(
        f"no benchmarks/run.py found (looked in {shown}); the benchmarks are only in a "
        "source checkout: git clone the repository, pip install -e . there, or pass "
        "--benchmarks-dir"
    )


def _load_runner(folder: Path) -> Any:
    spec = importlib.util.spec_from_file_location("envrunners_benchmarks_run", folder / "run.py")
    if spec is None or spec.loader is None:
        raise CliError(f"cannot load {folder / 'run.py'}", 1)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_bench(args: argparse.Namespace) -> int:
    """Entry point of ``envrunners bench``; returns the exit code."""
    folder = find_benchmarks(args.benchmarks_dir)
    # Workload modules are imported by name (``w2_group``); Ray workers started by a
    # workload inherit PYTHONPATH, so they can unpickle functions defined there.
    paths = [str(folder), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    bench = _load_runner(folder)
    known = bench.discover()
    names = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise CliError(
            f"unknown workload(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(known)}"
        )
    ours: list[dict] = []
    theirs: list[dict] = []
    note = ""
    if args.target in ("envrunners", "both"):
        for name in names:
            ours += _quietly(args, f"{name} on envrunners", bench.run_here, "envrunners", [name])
    if args.target in ("ray.rllib", "both"):
        comparable = [n for n in names if n != "W5"]  # W5 is the library-free ceiling
        if not comparable:
            pass
        # An explicit --rllib-python wins, as in run.py: ray.rllib importable here may be
        # the ray wheel's source without RLlib's own dependencies.
        elif args.rllib_python:
            for name in comparable:
                theirs += _quietly(
                    args, f"{name} on ray.rllib ({args.rllib_python})", bench.run_elsewhere,
                    args.rllib_python, [name],
                )  # fmt: skip
        elif bench.target_available("ray.rllib"):
            for name in comparable:
                theirs += _quietly(
                    args, f"{name} on ray.rllib", bench.run_here, "ray.rllib", [name]
                )
        else:
            note = (
                "ray.rllib is not importable here and no --rllib-python was given: no ratios "
                '(pip install -e ".[compare]" or point --rllib-python at a venv with ray[rllib])'
            )
            if args.target == "ray.rllib":
                raise CliError(note)
    _print_table(ours, theirs)
    if note:
        print(note)
    return 0


def _quietly(args: argparse.Namespace, label: str, fn: Any, *fn_args: Any) -> list[dict]:
    """Run a benchmark function with its JSON lines captured (echoed with --json)."""
    print(f"running {label} ...", file=sys.stderr, flush=True)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        records = fn(*fn_args, args.repeats)
    if args.json:
        sys.stdout.write(buffer.getvalue())
    return [r for r in records if isinstance(r, dict)] or [
        json.loads(line) for line in buffer.getvalue().splitlines() if line.startswith("{")
    ]


def _key(record: dict) -> tuple:
    return (record.get("workload"),) + tuple(record.get(k) for k in _KEY_FIELDS)


def _case(record: dict) -> str:
    parts = [f"{k}={record[k]}" for k in _KEY_FIELDS if record.get(k) is not None]
    if record.get("target") == "ceiling":
        parts.append("(no library)")
    return " ".join(parts) or "-"


def _metric(record: dict) -> str | None:
    return next((m for m in _METRICS if record.get(m)), None)


def _fmt(record: dict | None, metric: str) -> str:
    """The measurement as people read it: a rate, or a time where the workload is a latency."""
    if not record or not record.get(metric):
        return "-"
    if record.get("sync_ms") is not None:
        return f"{record['sync_ms']:,.1f} ms"
    if record.get("restore_s") is not None:
        return f"{record['restore_s']:,.2f} s"
    value = record[metric]
    return f"{value:,.1f} MB/s" if metric == "mb_per_s" else f"{value:,.0f}/s"


def _print_table(ours: list[dict], theirs: list[dict]) -> None:
    from envrunners._cli.sample import print_table

    theirs_by_key = {_key(r): r for r in theirs}
    rows = []
    seen = set()
    for record in ours + [r for r in theirs if _key(r) not in {_key(o) for o in ours}]:
        key = _key(record)
        if key in seen:
            continue
        seen.add(key)
        mine = record if record in ours else None
        other = theirs_by_key.get(key)
        metric = _metric(mine or other or {})
        if metric is None:
            continue
        a = mine.get(metric) if mine else None
        b = other.get(metric) if other else None
        ratio = f"{a / b:.2f}x" if a and b else "-"
        rows.append((str(record.get("workload")), _case(record), _fmt(mine, metric),
                     _fmt(other, metric), ratio))  # fmt: skip
    print_table(
        "envrunners bench (medians; ratio = envrunners speed / ray.rllib speed, same run)",
        ("workload", "case", "envrunners", "ray.rllib", "ratio"),
        rows,
        text_columns=2,
    )
