"""Peer benchmarks: collection only, same env, same network, same number of envs.

    python benchmarks/peers/run_peers.py                       # every system, both workloads
    python benchmarks/peers/run_peers.py --systems sb3,envpool --workloads cartpole --repeats 3
    python benchmarks/peers/run_peers.py --rllib-python /path/to/rllib-venv/bin/python

Prints one JSON line per workload per system variant (median env steps/s over
``--repeats`` timed repeats after one warm-up), or one line with ``skipped`` saying
why a peer could not run here. Systems: ``envrunners`` (gymnasium and EnvPool
backends), ``reference`` (the envs alone, no policy), ``gymnasium`` (Sync/Async
vector env + lean loop), ``envpool`` (lean loop, sync and async), ``sb3``
(``collect_rollouts``), ``torchrl`` (``Collector``), ``rllib``. See README.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from workloads import WORKLOADS, PeerUnavailable, record  # noqa: E402

SYSTEMS = ("envrunners", "reference", "gymnasium", "envpool", "sb3", "torchrl", "rllib")


def emit(rec: dict) -> None:
    rec.setdefault("python", sys.version.split()[0])
    rec.setdefault("cpus", os.cpu_count())
    print(json.dumps(rec), flush=True)


def run_system(system: str, workload, repeats: int, rllib_python: str | None) -> None:
    import torch

    torch.set_num_threads(1)
    try:
        if system in ("envpool", "reference") or (system == "envrunners"):
            try:
                import envpool  # noqa: F401
            except ImportError as err:
                if system == "envpool":
                    raise PeerUnavailable(
                        "envpool is not installed: pip install 'envrunners[envpool]'"
                    ) from err
        module = importlib.import_module(f"{system}_peer")
        kwargs = {"rllib_python": rllib_python} if system == "rllib" else {}
        for rec in module.run(workload, repeats, **kwargs):
            emit(rec)
    except PeerUnavailable as err:
        emit(record(workload, system, "-", "-", skipped=str(err)))
    except Exception as err:  # one peer's failure must not hide the others' numbers
        traceback.print_exc()
        emit(record(workload, system, "-", "-", error=f"{type(err).__name__}: {err}"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rllib-python", default=None)
    args = parser.parse_args(argv)
    for name in args.workloads.split(","):
        if name not in WORKLOADS:
            raise SystemExit(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
        for system in args.systems.split(","):
            if system not in SYSTEMS:
                raise SystemExit(f"unknown system {system!r}; known: {', '.join(SYSTEMS)}")
            run_system(system, WORKLOADS[name], args.repeats, args.rllib_python)


if __name__ == "__main__":
    main()
