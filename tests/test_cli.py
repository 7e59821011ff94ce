"""The ``envrunners`` CLI: train / resume / sample / bench / offline, with tiny budgets.

Commands run as subprocesses through the installed console script (what a user
types); bad-input cases run in-process through ``cli.main`` (same code path, no
interpreter start-up) and pin the exit code and the one-line message. One test
starts the embedded Ray (remote runners), interrupts it like a terminal Ctrl-C
and checks that every process it spawned is gone.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from envrunners import cli
from envrunners.utils.checkpoints import load_state

REPO = Path(__file__).resolve().parents[1]
EXE = shutil.which("envrunners") or ""
TINY = [
    "--num-env-runners", "0", "--num-envs-per-env-runner", "4", "--train-batch-size", "256",
    "--minibatch-size", "64", "--num-epochs", "2", "--seed", "1",
]  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def run_cli(
    *args: str, timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """``envrunners ARGS`` in a subprocess (the console script if installed)."""
    cmd = [EXE] if EXE else [sys.executable, "-m", "envrunners.cli"]
    return subprocess.run(
        [*cmd, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        cwd=cwd or REPO,
        check=False,
    )


def run_settings(run_dir: Path) -> dict:
    """The settings a train run wrote beside its checkpoint (``run.json``)."""
    return json.loads((run_dir / "run.json").read_text())


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One tiny in-process training run (>= 2 iterations), with two loggers (repeated flag)."""
    out = tmp_path_factory.mktemp("train") / "run"
    proc = run_cli("train", "--env", "CartPole-v1", *TINY, "--stop-timesteps", "500",
                   "--out", str(out), "--logger", "csv", "--logger", "tensorboard")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return out


# ---------------------------------------------------------------------- train
def test_train_writes_csv_png_and_checkpoint(trained):
    rows = read_csv(trained / "metrics.csv")
    assert len(rows) >= 2
    assert [int(r["iteration"]) for r in rows] == list(range(1, len(rows) + 1))
    steps = [int(r["env_steps"]) for r in rows]
    assert steps == sorted(steps) and steps[-1] >= 500
    assert {"episode_return_mean", "steps_per_s", "healthy_runners", "restarts"} <= set(rows[0])
    png = (trained / "learning_curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    state, meta = load_state(trained / "checkpoint")  # plain JSON + npz, no pickle
    # Algorithm.save_to_path's format; the run's settings sit beside it in run.json.
    assert meta["format"] == "envrunners-algorithm-checkpoint"
    assert meta["config"]["env"] == "CartPole-v1" == run_settings(trained)["env"]
    assert state["progress"]["training_iteration"] == len(rows)
    assert state["progress"]["num_env_steps_sampled_lifetime"] == steps[-1]
    assert state["learner"]["weights_seq_no"] == len(rows)
    assert any(k.startswith("vf") for k in state["learner"]["rl_module"])  # full learner module
    assert "exp_avg" in state["learner"]["optimizer"]
    assert "env_to_module_connector" in state["env_runner"]
    assert not list((trained / "checkpoint").glob("*.pkl"))


def test_train_loggers_write_rllib_result_keys(trained):
    """``--logger csv --logger tensorboard``: progress.csv and event files, RLlib's key names."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = read_csv(trained / "progress.csv")
    assert len(rows) == len(read_csv(trained / "metrics.csv"))
    for key in ("env_runners/episode_return_mean", "learners/default_policy/policy_loss",
                "training_iteration", "num_env_steps_sampled_lifetime"):  # fmt: skip
        assert key in rows[0]
    assert not any(k.startswith("config") for k in rows[0])
    events = EventAccumulator(str(trained))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert "env_runners/episode_return_mean" in scalars
    assert "learners/default_policy/vf_loss" in scalars
    steps = [e.step for e in events.Scalars("env_runners/episode_return_mean")]
    assert steps == [int(r["training_iteration"]) for r in rows]


def test_resume_continues_step_count(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = read_csv(run / "metrics.csv")
    old_state, _ = load_state(run / "checkpoint")
    proc = run_cli("train", "--resume", str(run), "--stop-timesteps", "1000")
    assert proc.returncode == 0, proc.stderr
    assert "Resuming PPO on CartPole-v1" in proc.stdout
    rows = read_csv(run / "metrics.csv")
    new = rows[len(before) :]
    assert rows[: len(before)] == before and new  # appended, not rewritten
    assert int(new[0]["iteration"]) == int(before[-1]["iteration"]) + 1
    assert int(new[0]["env_steps"]) > int(before[-1]["env_steps"])
    state, _ = load_state(run / "checkpoint")
    assert state["progress"]["num_env_steps_sampled_lifetime"] == int(rows[-1]["env_steps"]) >= 1000
    assert state["learner"]["weights_seq_no"] == old_state["learner"]["weights_seq_no"] + len(new)
    assert run_settings(run)["num_envs_per_env_runner"] == 4  # settings came from the run


def test_pg_trains_in_process(tmp_path):
    proc = run_cli("train", "--env", "CartPole-v1", "--algo", "pg", *TINY,
                   "--stop-timesteps", "256", "--out", str(tmp_path / "pg"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Training PG on CartPole-v1" in proc.stdout
    assert (tmp_path / "pg" / "checkpoint" / "state.json").is_file()
    if importlib.util.find_spec("tensorboard"):  # TensorBoard is the default logger
        assert list((tmp_path / "pg").glob("events.out.tfevents.*"))
        assert "TensorBoard: tensorboard --logdir" in proc.stdout


def _marked_processes(marker: str) -> list[str]:
    import psutil

    found = []
    for proc in psutil.process_iter(["name"]):
        try:
            if proc.environ().get("ENVRUNNERS_TEST_MARKER") == marker:
                found.append(f"{proc.pid}:{proc.info['name']}")
        except (psutil.Error, OSError):
            continue
    return found


def _default_sigint() -> None:
    """In the child: SIGINT back to its default, so Python turns it into KeyboardInterrupt.

    Why: a test run started in the background (``nohup ... &``) inherits an ignored
    SIGINT, and a process that starts with SIGINT ignored keeps ignoring it.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_with_embedded_ray_keeps_checkpoint_and_stops_everything(tmp_path):
    """Remote runners on the embedded Ray; Ctrl-C (SIGINT to the process group)."""
    out = tmp_path / "run"
    marker = uuid.uuid4().hex
    cmd = [EXE] if EXE else [sys.executable, "-m", "envrunners.cli"]
    proc = subprocess.Popen(
        [*cmd, "train", "--env", "CartPole-v1", "--num-env-runners", "1",
         "--num-envs-per-env-runner", "2", "--train-batch-size", "256", "--minibatch-size", "64",
         "--num-epochs", "1", "--stop-timesteps", "10000000", "--stop-reward", "100000",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env=_env(ENVRUNNERS_TEST_MARKER=marker), start_new_session=True,
        preexec_fn=_default_sigint,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not (out / "checkpoint" / "state.json").is_file():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no checkpoint within 90 s"
            time.sleep(0.2)
        time.sleep(0.5)  # let it be in the middle of a later iteration
        spawned = _marked_processes(marker)
        assert any("raylet" in p for p in spawned), spawned  # Ray was started by the command
        os.killpg(proc.pid, signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # show where it hangs: the CLI dumps on SIGUSR1
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(2)
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            raise AssertionError(f"no exit 60 s after Ctrl-C; stderr:\n{stderr[-6000:]}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert "Interrupted:" in stdout and "Resume with: envrunners train --resume" in stdout
    assert "Traceback" not in stderr
    state, _ = load_state(out / "checkpoint")
    rows = read_csv(out / "metrics.csv")
    assert state["progress"]["training_iteration"] == len(rows) >= 1  # last finished iteration kept
    assert (out / "learning_curve.png").is_file()
    deadline = time.monotonic() + 20
    while _marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert _marked_processes(marker) == []  # runners, raylet, GCS: all gone


# ---------------------------------------------------------------------- sample
def test_sample_with_checkpoint_records_json(trained, tmp_path):
    from envrunners.offline.episode_writer import read_episodes

    out = tmp_path / "json"
    proc = run_cli("sample", "--env", "CartPole-v1", "--timesteps", "300",
                   "--num-envs-per-env-runner", "2", "--checkpoint", str(trained),
                   "--output", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for label in ("episodes finished", "return mean", "throughput", f"checkpoint {trained}"):
        assert label in proc.stdout
    episodes = list(read_episodes(str(out)))
    assert sum(len(e) for e in episodes) >= 300
    assert all("action_logp" in e.extra_model_outputs for e in episodes)  # policy, not random


def test_sample_multi_agent_random(tmp_path):
    proc = run_cli("sample", "--env", "CartPole-v1", "--multi-agent", "--num-agents", "3",
                   "--timesteps", "200", "--num-envs-per-env-runner", "2")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "CartPole-v1 (multi-agent)" in proc.stdout and "agent steps" in proc.stdout
    assert "random" in proc.stdout


def test_sample_multi_agent_from_module_factory(tmp_path):
    examples = str(REPO / "examples")
    (tmp_path / "my_pz_env.py").write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {examples!r})
            from multi_agent_pettingzoo import MeetOnALine

            def make(config=None):
                return MeetOnALine(size=5)
            """
        )
    )
    proc = run_cli("sample", "--env", "my_pz_env:make", "--multi-agent", "--timesteps", "100",
                   "--num-envs-per-env-runner", "2", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "my_pz_env:make (multi-agent)" in proc.stdout


# ---------------------------------------------------------------------- bad input
def _main(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--env", "CartPol-v1"], "unknown env 'CartPol-v1'; did you mean 'CartPole-v1'"),
        (["train", "--env", "cartpole-v1"], "did you mean 'CartPole-v1'"),
        (["sample", "--env", "Acrobat-v1"], "did you mean 'Acrobot-v1'"),
        (["train"], "--env"),
        (["train", "--env", "CartPole-v1", "--num-env-runners", "-1"], "expected an integer >= 0"),
        (["train", "--env", "CartPole-v1", "--num-env-runners", "two"], "got 'two'"),
        (["train", "--env", "CartPole-v1", "--stop-timesteps", "0"], "expected an integer >= 1"),
        (["train", "--env", "CartPole-v1", "--stop-reward", "inf"], "finite number"),
        (["train", "--env", "CartPole-v1", "--seed", "1.5"], "--seed"),
        (["train", "--env", "CartPole-v1", "--lr", "-3"], "number > 0"),
        (["train", "--env", "CartPole-v1", "--gamma", "1.5"], "--gamma"),
        (["train", "--env", "CartPole-v1", "--algo", "dqn"], "invalid choice: 'dqn'"),
        (["sample", "--env", "CartPole-v1", "--timesteps", "-5"], "expected an integer >= 1"),
        (["sample", "--env", "CartPole-v1", "--greedy"], "--greedy needs --checkpoint"),
        (["bench", "--workloads", "W99"], "unknown workload(s) W99"),
        (["bench", "--repeats", "0"], "expected an integer >= 1"),
        (["nosuchcommand"], "invalid choice"),
        (
            ["train", "--env", "CartPole-v1", "--num-env-runner", "2"],
            "envrunners train: error: unknown flag --num-env-runner; did you mean --num-env-runners?",
        ),
        (["train", "--env", "CartPole-v1", "--stop-time", "5"], "unknown flag --stop-time"),
        (["sample", "--env", "CartPole-v1", "--time=5"], "unknown flag --time; did you mean"),
        (["offline", "info", "x", "--jsn"], "unknown flag --jsn; did you mean --json?"),
        (
            ["train", "--env", "CartPole-v1", "--logger", "tensorbord"],
            "unknown logger 'tensorbord'; did you mean tensorboard?",
        ),
        (["train", "--env", "CartPole-v1", "--logger", "csv,none"], "'none' cannot be combined"),
        (["train", "--env", "CartPole-v1", "--config", "/no/such.yaml"], "no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(capsys, argv, message):
    code, _, err = _main(capsys, *argv)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_unwritable_output_dirs(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code, _, err = _main(capsys, "train", "--env", "CartPole-v1", "--out", str(blocker / "run"))
    assert code == 2 and "cannot write to --out directory" in err and "Not a directory" in err
    code, _, err = _main(capsys, "sample", "--env", "CartPole-v1", "--output", str(blocker))
    assert code == 2 and "is a file, not a directory" in err
    assert len(err.strip().splitlines()) == 1
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        code, _, err = _main(capsys, "train", "--env", "CartPole-v1", "--out", str(locked / "x"))
        assert code == 2 and "Permission denied" in err


def test_resume_needs_a_checkpoint(capsys, tmp_path):
    code, _, err = _main(capsys, "train", "--resume", str(tmp_path))
    assert code == 2 and "no envrunners train checkpoint there" in err
    code, _, err = _main(capsys, "sample", "--env", "CartPole-v1", "--checkpoint", str(tmp_path))
    assert code == 2 and "no envrunners train checkpoint" in err
    assert "--checkpoint" in err and "--resume" not in err


def _one_line_usage_error(code: int, err: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_checkpoints_are_one_line_errors(capsys, tmp_path, trained):
    from envrunners.utils.checkpoints import save_state

    old = tmp_path / "old"  # a run of the CLI before it trained through Algorithm
    save_state(old / "checkpoint", {"progress": {}}, {"format": "envrunners-train-checkpoint"})
    code, _, err = _main(capsys, "train", "--resume", str(old))
    _one_line_usage_error(code, err)
    assert "written by an older envrunners train" in err and "start a new run" in err
    broken = tmp_path / "broken"
    shutil.copytree(trained, broken)
    (broken / "checkpoint" / "arrays.npz").write_bytes(b"not a zip file")
    for argv in (["train", "--resume", str(broken)],
                 ["sample", "--env", "CartPole-v1", "--checkpoint", str(broken)]):  # fmt: skip
        code, _, err = _main(capsys, *argv)
        _one_line_usage_error(code, err)
        assert "cannot read the checkpoint" in err and argv[-2] in err
    (broken / "checkpoint" / "arrays.npz").write_bytes(
        (trained / "checkpoint" / "arrays.npz").read_bytes()
    )
    (broken / "run.json").write_text("{not json")
    code, _, err = _main(capsys, "train", "--resume", str(broken))
    _one_line_usage_error(code, err)
    assert "cannot read run.json" in err
    (broken / "run.json").write_text((trained / "run.json").read_text())
    code, _, err = _main(capsys, "train", "--resume", str(broken), "--hidden", "32")
    _one_line_usage_error(code, err)
    assert "--hidden 32 differs from the resumed run's --hidden 64,64" in err
    code, _, err = _main(capsys, "train", "--resume", str(broken), "--algo", "pg")
    _one_line_usage_error(code, err)
    assert "--algo pg differs from the resumed run's --algo ppo" in err


def _config_settings(tmp_path: Path, name: str, text: str, *flags: str):
    from envrunners._cli import train

    file = tmp_path / name
    file.write_text(text)
    args = cli.build_parser().parse_args(["train", "--env", "CartPole-v1", "--config", str(file),
                                          "--out", str(tmp_path / "out"), *flags])  # fmt: skip
    run, _, _ = train._settings(args)
    return run, train.build_config(run)


def test_config_file_sets_any_field_and_flags_win(tmp_path):
    yaml_text = "lr: 0.001\nentropy_coeff: 0.01\ntrain_batch_size: 512\nlambda: 0.9\n"
    run, config = _config_settings(tmp_path, "c.yaml", yaml_text, "--num-envs-per-env-runner", "4")
    assert (config.lr, config.entropy_coeff, config.train_batch_size) == (0.001, 0.01, 512)
    assert config.lambda_ == 0.9
    assert config.rollout_fragment_length == 64  # refitted: 512 steps / (2 runners x 4 envs)
    assert run["config_overrides"]["entropy_coeff"] == 0.01  # kept for --resume (run.json)
    toml_text = 'lr = 0.001\nobservation_filter = "MeanStdFilter"\n'
    run, config = _config_settings(tmp_path, "c.toml", toml_text, "--lr", "0.002")
    assert config.lr == 0.002 and run["lr"] == 0.002  # the flag wins over the file
    assert config.observation_filter == "MeanStdFilter" == run["obs_filter"]


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("c.yaml", "lrr: 0.1\n", "Unknown option 'lrr' for --config"),
        ("c.yaml", "lrr: 0.1\n", "Did you mean 'lr'?"),
        ("c.toml", "train_batch_size = -3\n", "train_batch_size must be an int > 0, got -3"),
        ("c.yaml", "- lr\n- 0.1\n", "expected a mapping of AlgorithmConfig fields, got list"),
        ("c.yaml", "lr: [0.1\n", "cannot parse it"),
        ("c.toml", "lr = \n", "cannot parse it"),
        ("c.ini", "lr = 0.1\n", "expected a .yaml, .yml or .toml file"),
    ],
)
def test_bad_config_file_is_one_line_and_exit_code_2(capsys, tmp_path, name, text, message):
    file = tmp_path / name
    file.write_text(text)
    code, _, err = _main(capsys, "train", "--env", "CartPole-v1", "--config", str(file),
                         "--out", str(tmp_path / "out"))  # fmt: skip
    _one_line_usage_error(code, err)
    assert message in err


def test_resume_refuses_a_different_env(capsys, trained):
    code, _, err = _main(capsys, "train", "--resume", str(trained), "--env", "Acrobot-v1")
    assert code == 2 and "differs from the resumed run's env 'CartPole-v1'" in err


def test_checkpoint_of_another_env_does_not_fit(capsys, trained):
    code, _, err = _main(capsys, "sample", "--env", "Acrobot-v1", "--checkpoint", str(trained),
                         "--timesteps", "10")  # fmt: skip
    assert code == 2 and "--checkpoint does not fit this env" in err


def test_debug_shows_the_traceback(capsys):
    code, _, err = _main(capsys, "train", "--env", "CartPol-v1", "--debug")
    assert code == 2 and "Traceback" in err and "did you mean 'CartPole-v1'" in err


def test_unregistered_ale_id_names_the_module_form():
    """A fresh process (ale_py not imported yet): ``ALE/...`` is not a gymnasium id there."""
    proc = run_cli("sample", "--env", "ALE/Pong-v5", "--multi-agent")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "envrunners sample: error: unknown env 'ALE/Pong-v5': ALE ids are registered by the "
        "ale_py package; --env ale_py:ALE/Pong-v5 imports it first (pip install ale-py)"
    ]


def test_console_script_bad_env_exit_code():
    proc = run_cli("train", "--env", "CartPol-v1")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "envrunners train: error: unknown env 'CartPol-v1'; did you mean 'CartPole-v1', "
        "'CartPole-v0', 'phys2d/CartPole-v1'? (see gymnasium.pprint_registry())"
    ]


# ---------------------------------------------------------------------- bench, offline, help
_FAKE_WORKLOAD = """
WORKLOAD = "W1"

def run(target, repeats=5):
    rate = {"envrunners": 3000.0, "ray.rllib": 1000.0}[target]
    yield {"workload": "W1", "target": target, "num_envs": 16, "env_steps_per_s": rate}
"""


def test_bench_table_with_ratio_from_rllib_python(capsys, tmp_path):
    """A stand-in benchmarks/ folder; ``--rllib-python`` runs its RLlib side in a subprocess."""
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    for name in ("run.py", "common.py"):
        shutil.copy(REPO / "benchmarks" / name, folder / name)
    (folder / "w1_fake.py").write_text(_FAKE_WORKLOAD)
    code, out, err = _main(
        capsys, "bench", "--benchmarks-dir", str(folder), "--workloads", "W1",
        "--repeats", "1", "--rllib-python", sys.executable, "--json",
    )  # fmt: skip
    assert code == 0, err
    assert "3.00x" in out and "3,000/s" in out and "1,000/s" in out and "num_envs=16" in out
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert {r["target"] for r in lines} == {"envrunners", "ray.rllib"}


def test_bench_runs_a_real_workload(capsys):
    code, out, err = _main(capsys, "bench", "--workloads", "W5", "--repeats", "1",
                           "--target", "envrunners")  # fmt: skip
    assert code == 0, err
    assert "W5" in out and "variant=lean" in out


def test_bench_without_a_checkout(capsys, tmp_path):
    code, _, err = _main(capsys, "bench", "--benchmarks-dir", str(tmp_path))
    assert code == 2 and "only in a source checkout" in err


def test_offline_subcommands_are_mounted(capsys, tmp_path):
    from envrunners.offline import JsonWriter
    from envrunners.policy.sample_batch import SampleBatch

    writer = JsonWriter(str(tmp_path))
    writer.write(SampleBatch({"obs": np.zeros((3, 2), np.float32), "rewards": np.ones(3)}))
    writer.close()
    code, out, err = _main(capsys, "offline", "info", str(tmp_path))
    assert code == 0, err
    assert "SampleBatch=1" in out


def test_offline_info_counts_a_malformed_record_and_goes_on(capsys, tmp_path):
    """A parsable record of the wrong shape (a list where policy_batches' dict belongs)
    is a corrupt line named by file and line, like an unparsable one; no crash."""
    from envrunners.offline import JsonWriter
    from envrunners.policy.sample_batch import SampleBatch

    writer = JsonWriter(str(tmp_path))
    writer.write(SampleBatch({"obs": np.zeros((3, 2), np.float32), "rewards": np.ones(3)}))
    writer.close()
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "MultiAgentBatch", "count": 5, "policy_batches": [1, 2]}\n')
    code, out, err = _main(capsys, "offline", "info", str(tmp_path))
    assert code == 0, err
    assert "SampleBatch=1" in out and "MultiAgentBatch" not in out.split("errors")[0]
    assert f"{bad}:1: AttributeError" in out
    assert "env steps:    3" in out  # the bad record's count was not added


def test_corrupt_offline_file_speaks_in_flags(capsys, tmp_path):
    """The reader's ``skip_corrupt=True`` hint reaches the user as ``--skip-corrupt``."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "SampleBatch", "obs": 3\n')
    code, _, err = _main(capsys, "offline", "convert", str(bad), "--to", "json",
                         "--out", str(tmp_path / "out"))  # fmt: skip
    _one_line_usage_error(code, err)
    assert "corrupt record" in err and "Pass --skip-corrupt to skip" in err
    assert "skip_corrupt" not in err


def test_help_lists_the_commands(capsys):
    code, out, _ = _main(capsys, "--help")
    assert code == 0
    for command in ("train", "sample", "bench", "offline"):
        assert command in out
