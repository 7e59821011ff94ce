"""``envrunners train`` on PettingZoo envs: shared, per-agent and file-mapped policies, end to end.

Runs in subprocesses with tiny budgets on ``pettingzoo.classic.rps_v2`` (two
agents, 15-step episodes; in every PettingZoo install): the CSV, plot,
checkpoint, ``--resume`` and ``evaluate`` paths of a multi-agent run, then the
one-line usage errors (exit code 2) in-process through ``cli.main``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from tests.test_cli import run_cli

from envrunners import cli
from envrunners._cli.multi_agent_training import (
    PolicyMapping,
    is_multi_agent_spec,
    multi_agent_settings,
)

pytest.importorskip("pettingzoo")

RPS = "pettingzoo:pettingzoo.classic.rps_v2"
TINY_MA = [
    "--num-env-runners", "0", "--num-envs-per-env-runner", "2", "--train-batch-size", "60",
    "--minibatch-size", "30", "--num-epochs", "1", "--hidden", "8", "--seed", "0",
    "--logger", "none", "--no-progress",
]  # fmt: skip


def _rows(out: Path) -> list[dict[str, str]]:
    with open(out / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_shared_policy_trains_resumes_and_evaluates(tmp_path):
    """One module for both agents; the return is the agents' sum (RPS is zero-sum: 0)."""
    out = tmp_path / "run"
    proc = run_cli("train", "--env", RPS, "--stop-timesteps", "60", "--out", str(out), *TINY_MA)
    assert proc.returncode == 0, proc.stderr
    assert "(2 agents, 1 policy: shared)" in proc.stdout
    rows = _rows(out)
    assert len(rows) == 1 and int(rows[0]["env_steps"]) >= 60
    assert float(rows[0]["episode_return_mean"]) == pytest.approx(0.0)  # sum over agents
    assert "policy_loss" in rows[0] and rows[0]["policy_loss"] != ""
    assert (out / "learning_curve.png").is_file() and (out / "checkpoint").is_dir()
    run = json.loads((out / "run.json").read_text())
    assert run["policy_ids"] == ["shared"] and run["agents"] == ["player_0", "player_1"]

    proc = run_cli("train", "--resume", str(out), "--stop-timesteps", "120", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Resuming PPO (2 agents, 1 policy: shared)")
    assert [int(r["iteration"]) for r in _rows(out)] == [1, 2]

    proc = run_cli("evaluate", str(out), "--episodes", "2")
    assert proc.returncode == 0, proc.stderr
    assert f"{RPS} (multi-agent)" in proc.stdout
    assert "episode length mean │ 15.0" in proc.stdout


def test_per_agent_and_mapping_file_policies(tmp_path):
    """``--policies per-agent``: one module per agent id (trained); a mapping file with an
    exact id and a glob: the exact id wins."""
    out = tmp_path / "per_agent"
    module_form = "pettingzoo.classic.rps_v2"  # the form `sample --multi-agent` takes
    proc = run_cli(
        "train", "--env", module_form, "--policies", "per-agent", "--stop-timesteps", "60",
        "--out", str(out), *TINY_MA,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "2 policies: player_0, player_1" in proc.stdout
    from envrunners.utils.checkpoints import load_state

    state, _ = load_state(out / "checkpoint")
    assert "player_0" in json.dumps(sorted(_keys(state))) and "player_1" in json.dumps(
        sorted(_keys(state))
    )

    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("player_0: first\n'player_*': rest\n")
    settings = multi_agent_settings(RPS, None, str(mapping), None)  # what train runs with
    assert settings["policy_ids"] == ["first", "rest"]
    fn = PolicyMapping([tuple(r) for r in settings["policy_rules"]])
    assert (fn("player_0"), fn("player_1")) == ("first", "rest")


def _keys(obj, prefix=""):
    """Every nested key path of a state dict (module ids appear in them)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"{prefix}/{k}"
            yield from _keys(v, f"{prefix}/{k}")


@pytest.mark.parametrize(
    "extra, file_text, message",
    [
        ([], "player_9: p\n", "unknown agent 'player_9'; the env's agents are player_0, player_1"),
        ([], "player_0: p\n", "agent 'player_1' matches no entry"),
        ([], "player_0: 3\n", "the policy of 'player_0' must be a policy id string, got 3"),
        (["--policies", "shared"], "'*': p\n", "--policies and --policy-mapping exclude each"),
    ],
)
def test_bad_mapping_file_is_one_line_exit_2(tmp_path, capsys, extra, file_text, message):
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(file_text)
    argv = ["train", "--env", RPS, "--policy-mapping", str(mapping), *extra]
    assert cli.main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_policies_on_single_agent_env_and_bad_values_exit_2(tmp_path, capsys):
    argv = ["train", "--env", "CartPole-v1", "--policies", "shared", "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "--policies needs a multi-agent --env" in err and len(err.splitlines()) == 1
    assert cli.main(["train", "--env", RPS, "--policies", "every"]) == 2
    assert "invalid choice: 'every'" in capsys.readouterr().err
    assert cli.main(["train", "--env", "pettingzoo:pettingzoo.classic.nope_v1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot import 'pettingzoo.classic.nope_v1'" in err and len(err.splitlines()) == 1


def test_env_spec_forms(tmp_path, monkeypatch):
    """PettingZoo modules and ``module:attr`` MultiAgentEnv classes are multi-agent specs;
    gymnasium ids, also in their ``module:Id`` form, are not."""
    (tmp_path / "my_ma_envs.py").write_text(
        "from envrunners.env.multi_agent_env import make_multi_agent\n"
        "TwoCartPoles = make_multi_agent('CartPole-v1')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert is_multi_agent_spec(RPS) and is_multi_agent_spec("pettingzoo.classic.rps_v2")
    assert is_multi_agent_spec("my_ma_envs:TwoCartPoles")
    for single in ("CartPole-v1", "ALE/Pong-v5", "gymnasium.envs.classic_control:CartPole-v1"):
        assert not is_multi_agent_spec(single), single
    settings = multi_agent_settings("my_ma_envs:TwoCartPoles", "per-agent", None, {"num_agents": 3})
    assert settings["policy_ids"] == ["0", "1", "2"]
