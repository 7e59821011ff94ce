"""Run benchmark workloads and print one JSON line per measurement.

    python benchmarks/run.py --target envrunners --workloads W1,W5
    python benchmarks/run.py --target both --rllib-python /path/to/rllib-venv/bin/python

``--target both`` runs each workload on envrunners here and on ``ray.rllib``
(in ``--rllib-python`` when given, else in this interpreter), then prints a
``ratio`` line per matching measurement (envrunners / RLlib, medians).
Workloads are the ``w*_*.py`` modules next to this file (see README.md). W11
(RLlib's PPO with RLlib's runners for ``ray.rllib``, with ``envrunners.rllib``'s for
``envrunners``) needs ``ray.rllib`` importable for both targets.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import emit, target_available  # noqa: E402

_KEY_FIELDS = ("workload", "num_envs", "variant", "size", "case", "num_runners")


def discover() -> dict[str, object]:
    """``{"W1": module, ...}`` for every workload module in this folder."""
    found = {}
    for path in sorted(HERE.glob("w*_*.py")):
        module = importlib.import_module(path.stem)
        found[module.WORKLOAD] = module
    return found


def run_here(target: str, names: list[str], repeats: int) -> list[dict]:
    workloads = discover()
    records = []
    for name in names:
        if name not in workloads:
            raise SystemExit(f"unknown workload {name!r}; known: {', '.join(workloads)}")
        for record in workloads[name].run(target, repeats=repeats):
            emit(record)
            records.append(record)
    return records


def run_elsewhere(python: str, names: list[str], repeats: int) -> list[dict]:
    cmd = [python, str(HERE / "run.py"), "--target", "ray.rllib", "--repeats", str(repeats)]
    cmd += ["--workloads", ",".join(names)]
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    records = []
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            print(line, flush=True)
            records.append(json.loads(line))
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-4000:])
    return records


def key(record: dict) -> tuple:
    return tuple(record.get(k) for k in _KEY_FIELDS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--target", default="envrunners", choices=["envrunners", "ray.rllib", "both"]
    )
    parser.add_argument("--workloads", default="W1,W5")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rllib-python", default=os.environ.get("RLLIB_PYTHON"))
    args = parser.parse_args(argv)
    names = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    # An explicit --rllib-python wins: a ray wheel ships ray.rllib's source, so it may import
    # here without RLlib's own dependencies (msgpack_numpy, ...) installed.
    if args.target == "ray.rllib" and args.rllib_python:
        run_elsewhere(args.rllib_python, names, args.repeats)
        return 0
    if args.target != "both":
        run_here(args.target, names, args.repeats)
        return 0
    ours = run_here("envrunners", names, args.repeats)
    comparable = [n for n in names if n != "W5"]
    if args.rllib_python:
        theirs = run_elsewhere(args.rllib_python, comparable, args.repeats)
    elif target_available("ray.rllib"):
        theirs = run_here("ray.rllib", comparable, args.repeats)
    else:
        emit({"note": "ray.rllib not importable and no --rllib-python given; no ratios"})
        return 0
    by_key = {key(r): r for r in theirs}
    for record in ours:
        # A variant RLlib lacks (e.g. W1's EnvPool backend) names the RLlib variant to match.
        lookup = (
            {**record, "variant": record["rllib_key_variant"]}
            if "rllib_key_variant" in record
            else record
        )
        other = by_key.get(key(lookup))
        metric = next((m for m in ("env_steps_per_s", "per_s", "mb_per_s") if m in record), None)
        if other and metric and other.get(metric):
            emit(
                {
                    "ratio": record[metric] / other[metric],
                    "metric": metric,
                    **{k: record.get(k) for k in _KEY_FIELDS if record.get(k) is not None},
                    **({"vs": "rllib default backend"} if lookup is not record else {}),
                }
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
