"""Smoke tests of ``examples/``: each script runs end to end with a tiny budget.

They run as subprocesses, exactly as a user would start them, so a broken import
or a changed API fails here before it reaches a reader of the README.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, *args: str, timeout: float = 120) -> str:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=EXAMPLES.parent,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_quickstart():
    out = run_example("quickstart.py", "--num-envs", "2", "--timesteps", "200")
    assert "env steps" in out


def test_single_agent_ppo():
    out = run_example(
        "single_agent.py", "--num-env-runners", "0", "--iterations", "2",
        "--train-batch-size", "256",
    )  # fmt: skip
    assert out.count("iter ") == 2 and "mean return" in out


def test_stateless_cartpole_lstm():
    out = run_example(
        "stateless_cartpole_lstm.py", "--num-env-runners", "0", "--iterations", "2",
        "--num-envs-per-env-runner", "2", "--train-batch-size", "128", "--lstm-cell-size", "8",
    )  # fmt: skip
    assert out.count("iter ") == 2 and "mean return" in out


def test_multi_agent_pettingzoo():
    out = run_example("multi_agent_pettingzoo.py", "--timesteps", "200")
    assert "walker_0: mean return" in out and "walker_1: mean return" in out


def test_old_stack_rollout_worker():
    out = run_example(
        "old_stack_rollout_worker.py", "--iterations", "1", "--rollout-fragment-length", "50"
    )
    assert "iter   1  batch" in out


def test_offline_record_read(tmp_path):
    out = run_example("offline_record_read.py", "--timesteps", "100", "--out", str(tmp_path))
    assert "identical chunks" in out and "identical ones" in out
    assert list((tmp_path / "episodes").glob("*.json")) and list(
        (tmp_path / "batches").glob("*.json")
    )


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_every_example_has_a_docstring_with_run_line(script):
    text = (EXAMPLES / script).read_text()
    assert text.startswith('"""') and "Run: python examples/" in text


def _readme_snippets() -> list[str]:
    text = (EXAMPLES.parent / "README.md").read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


@pytest.mark.parametrize("index", range(len(_readme_snippets())))
def test_readme_snippets_run(index):
    """The README's API-stack examples run (2 iterations, in-process instead of remote)."""
    code = _readme_snippets()[index]
    for long, short in (("range(60)", "range(2)"), ("range(30)", "range(2)"),
                        ("num_env_runners=2", "num_env_runners=0")):  # fmt: skip
        code = code.replace(long, short)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout.strip().splitlines()) == 2


def test_action_masking():
    out = run_example("action_masking.py", "--timesteps", "200", "--num-envs", "2")
    assert "no masked action" in out
