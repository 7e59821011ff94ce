"""RLlib 2.x's ``SingleAgentEnvRunner`` on the peer workloads (the code of ``envrunners_peer``
with ``ray.rllib`` imports), in this interpreter if it imports ``ray.rllib``, else in
``--rllib-python``; skipped with a message when neither is there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import envrunners_peer
from workloads import PeerUnavailable, Workload


def run(workload: Workload, repeats: int, rllib_python: str | None = None):
    try:
        import ray.rllib  # noqa: F401

        here = True
    except ImportError:
        here = False
    if not here:
        if not rllib_python:
            raise PeerUnavailable(
                "ray[rllib] does not import here (it pins an older gymnasium, so it is not "
                "installed beside envrunners); pass --rllib-python /path/to/venv/bin/python"
            )
        cmd = [rllib_python, str(Path(__file__).with_name("run_peers.py")), "--systems", "rllib"]
        cmd += ["--workloads", workload.name, "--repeats", str(repeats)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise PeerUnavailable(f"{rllib_python} printed no record: {out.stderr[-500:]}")
        for line in lines:
            yield json.loads(line)
        return
    yield from envrunners_peer.run(workload, repeats, target="ray.rllib")
    print(f"ran ray.rllib from {sys.executable}", file=sys.stderr)
