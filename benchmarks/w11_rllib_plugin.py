"""W11: RLlib's own PPO with its own runners vs envrunners' runners plugged in (one line).

Each case builds RLlib 2.60's ``PPOConfig`` with 2 remote runners and trains it for
``--warmup`` untimed plus ``--iterations`` timed iterations, once with RLlib's default
runner class and once with ``env_runner_cls=envrunners.rllib.SingleAgentEnvRunner``;
everything else (learner, connectors, config) is RLlib's and identical.

- ``cartpole``: CartPole-v1, 8 envs per runner, 4000 steps per iteration, default
  MLP, 6 epochs of 128-row minibatches (lr 3e-4, vf_loss_coeff 0.01).
- ``pong``: ``ale_py:ALE/Pong-v5`` through RLlib's ``wrap_atari_for_new_api_stack``
  (64x64 grayscale, frameskip 4, framestack 4, reward clipping), RLlib's default CNN
  for 64x64 frames, 4 envs per runner, 4000 steps per iteration, 1 epoch of 500 rows.

Per (case, runner) one record: the mean wall time of ``algo.train()`` and the mean
sampling time per iteration, read from RLlib's result timers
(``timers/env_runner_sampling_timer``, the time ``training_step`` spends in
``synchronous_parallel_sample``; ``timers/learner_update_timer`` likewise). RLlib
reports timers as an EMA (coefficient 0.01) over iterations, so each iteration's own
value is recovered from two consecutive EMAs (one ``training_step`` per iteration,
checked). ``env_steps_per_s`` is env steps sampled per second of sampling time, so
``run.py --target both`` prints the sampling speed-up as its ratio. Run directly, the
script runs both runners per case and adds ``envrunners_vs_rllib`` records with the
sampling and iteration speed-ups (targets: sampling >= 3x, iterations faster).

``--sample-only N`` measures ``sample()`` alone instead: one local runner of each
class (the ``cartpole`` case's settings, sized as one of its 2 runners: 8 envs,
2000 steps per call) in this process, without Ray; the two classes' calls
alternate ``N`` times, and one ``sample_only`` record gives the median wall and
CPU seconds per call of each (plus ``pickle_s``: the reply's pickling as a remote
runner's would be, and its unpickling) and RLlib's over ours.

Needs ``ray[rllib]`` 2.60 in this interpreter (``pip install -e ".[rllib]"``); RLlib is
imported only when a case runs. A runner class that cannot be imported gives an
``error`` record for that variant instead of a measurement.

    python benchmarks/w11_rllib_plugin.py --iterations 3 --cases cartpole
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback
from typing import Any

from common import emit

WORKLOAD = "W11"
NUM_RUNNERS = 2
CASES = ("cartpole", "pong")
RUNNERS = ("rllib", "envrunners")
#: The runner measured for each run.py target (``--target ray.rllib`` needs no envrunners).
TARGET_RUNNER = {"ray.rllib": "rllib", "envrunners": "envrunners"}
OUR_RUNNER = "envrunners.rllib.SingleAgentEnvRunner"
#: RLlib's ``MetricsLogger.log_time`` default: an EMA with this coefficient.
RLLIB_TIMER_EMA = 0.01
PONG_ENV = "w11-pong"
ALE_ID = "ale_py:ALE/Pong-v5"
#: RLlib's Atari setup: its wrapper does the frame skipping, so ALE's is off.
ALE_KWARGS = {"frameskip": 1, "full_action_space": False, "repeat_action_probability": 0.0}
#: Generous, so a loaded machine gives slow numbers rather than empty iterations
#: (RLlib's default, 60 s, returns no samples when the runners miss it).
SAMPLE_TIMEOUT_S = 600.0
#: Per case: env, ``environment()`` extras, envs per runner and ``training()`` settings.
CASE_SETTINGS: dict[str, dict[str, Any]] = {
    "cartpole": {
        "env": "CartPole-v1",
        "environment": {},
        "num_envs_per_env_runner": 8,
        "training": {"train_batch_size_per_learner": 4000, "minibatch_size": 128,
                     "num_epochs": 6, "lr": 3e-4, "vf_loss_coeff": 0.01},
    },
    "pong": {
        "env": PONG_ENV,
        "environment": {"clip_rewards": True},
        "num_envs_per_env_runner": 4,
        "training": {"train_batch_size_per_learner": 4000, "minibatch_size": 500,
                     "num_epochs": 1, "lr": 1.5e-4, "grad_clip": 100.0,
                     "grad_clip_by": "global_norm"},
    },
}  # fmt: skip


def make_pong(env_config: Any = None) -> Any:
    """Pong wrapped by RLlib's ``wrap_atari_for_new_api_stack`` (64x64x4 float frames)."""
    import gymnasium as gym
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

    return wrap_atari_for_new_api_stack(gym.make(ALE_ID, **ALE_KWARGS), dim=64, framestack=4)


def runner_class(runner: str) -> Any:
    """``None`` for RLlib's default runner class, else envrunners' plug-in class."""
    if runner == "rllib":
        return None
    import importlib

    module_name, _, name = OUR_RUNNER.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


def build_config(case: str, runner_cls: Any) -> Any:
    """RLlib's ``PPOConfig`` for ``case``; ``runner_cls`` None keeps RLlib's runners."""
    from ray.rllib.algorithms.ppo import PPOConfig

    if case not in CASE_SETTINGS:
        raise SystemExit(f"unknown W11 case {case!r}; expected one of {CASES}")
    settings = CASE_SETTINGS[case]
    config = PPOConfig()
    if case == "pong":
        from ray.tune.registry import register_env

        register_env(PONG_ENV, make_pong)
    config.environment(settings["env"], **settings["environment"])
    config.env_runners(
        num_env_runners=NUM_RUNNERS,
        num_envs_per_env_runner=settings["num_envs_per_env_runner"],
        sample_timeout_s=SAMPLE_TIMEOUT_S,
    )
    config.training(**settings["training"])
    if runner_cls is not None:
        config.env_runners(env_runner_cls=runner_cls)
    return config


def _own_values(emas: list[float]) -> list[float]:
    """Each iteration's own timer value from RLlib's per-iteration EMAs of it."""
    values, previous = [], None
    for ema in emas:
        if previous is None:
            values.append(ema)  # the EMA starts at its first value
        else:
            values.append((ema - (1.0 - RLLIB_TIMER_EMA) * previous) / RLLIB_TIMER_EMA)
        previous = ema
    return values


def measure(case: str, runner: str, iterations: int, warmup: int) -> dict:
    """Train ``warmup + iterations`` PPO iterations with ``runner``; one record."""
    record: dict[str, Any] = {"workload": WORKLOAD, "case": case, "variant": "ppo"}
    record |= {"runner": runner, "num_runners": NUM_RUNNERS}
    record["runner_cls"] = OUR_RUNNER if runner == "envrunners" else "ray.rllib (default)"
    try:
        runner_cls = runner_class(runner)
    except Exception as exc:  # noqa: BLE001 - the variant is reported, not raised
        return record | {"error": f"{OUR_RUNNER} not available: {exc!r}"}
    import ray

    # The Pong env creator is a function of this module: ship it by value to the
    # runner actors, which may not have benchmarks/ on their path.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", include_dashboard=False, log_to_driver=False,
             num_cpus=max(os.cpu_count() or 1, NUM_RUNNERS + 1))  # fmt: skip
    algo = None
    try:
        start = time.perf_counter()
        algo = build_config(case, runner_cls).build_algo()
        record["setup_s"] = time.perf_counter() - start
        walls, sampling, learner, steps, calls = [], [], [], [], []
        last: dict = {}
        for _ in range(warmup + iterations):
            start = time.perf_counter()
            last = algo.train()
            walls.append(time.perf_counter() - start)
            timers = last.get("timers", {})
            sampling.append(float(timers.get("env_runner_sampling_timer", float("nan"))))
            learner.append(float(timers.get("learner_update_timer", float("nan"))))
            steps.append(int(last.get("env_runners", {}).get("num_env_steps_sampled", 0)))
            calls.append(int(last.get("num_training_step_calls_per_iteration", 1)))
        if not all(steps):
            raise RuntimeError(f"an iteration sampled no env steps: {steps}")
        timed = slice(warmup, None)
        sampling_s = _own_values(sampling)[timed]
        learner_s = _own_values(learner)[timed]
        walls, steps = walls[timed], steps[timed]
        record["iterations"] = iterations
        record["warmup_iterations"] = warmup
        record["iteration_s_mean"] = statistics.fmean(walls)
        record["sampling_s_mean"] = statistics.fmean(sampling_s)
        record["learner_s_mean"] = statistics.fmean(learner_s)
        record["sampling_share"] = record["sampling_s_mean"] / record["iteration_s_mean"]
        record["env_steps_per_iteration"] = statistics.fmean(steps)
        record["env_steps_per_s"] = sum(steps) / sum(sampling_s)
        record["iteration_s"] = walls
        record["sampling_s"] = sampling_s
        # The per-iteration recovery assumes one sample per iteration and can be checked.
        record["timers_exact"] = all(c == 1 for c in calls) and all(
            0.0 <= s <= w * 1.01 for s, w in zip(sampling_s, walls)
        )
        runners = last.get("env_runners", {})
        record["episode_return_mean"] = runners.get("episode_return_mean")
        record["env_steps_sampled_lifetime"] = last.get("num_env_steps_sampled_lifetime")
    except Exception as exc:  # noqa: BLE001 - one failed variant must not hide the others
        record["error"] = f"{exc!r}"
        record["traceback"] = traceback.format_exc()[-2000:]
    finally:
        if algo is not None:
            algo.stop()
        ray.shutdown()
    return {k: float(v) if hasattr(v, "item") else v for k, v in record.items()}


def sample_only(repeats: int) -> dict:
    """``sample()`` alone, RLlib's runner class and ours alternating: one record."""
    import pickle

    import torch
    from ray import cloudpickle
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner as RLlibRunner

    torch.set_num_threads(1)  # as in a Ray actor (OMP_NUM_THREADS=1)
    runners = {}
    for runner in RUNNERS:
        cls = runner_class(runner) or RLlibRunner
        config = build_config("cartpole", cls)
        runners[runner] = cls(config=config, worker_index=1, num_workers=NUM_RUNNERS)
    times: dict[str, dict[str, list[float]]] = {
        r: {"wall": [], "cpu": [], "pickle": []} for r in runners
    }
    try:
        for i in range(repeats + 2):  # two untimed calls each first
            for runner, env_runner in runners.items():
                wall, cpu = time.perf_counter(), time.process_time()
                episodes = env_runner.sample()
                metrics = env_runner.get_metrics()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                start, buffers = time.perf_counter(), []
                data = cloudpickle.dumps(
                    (episodes, metrics), protocol=5, buffer_callback=buffers.append
                )
                pickle.loads(data, buffers=buffers)
                if i >= 2:
                    times[runner]["wall"].append(wall)
                    times[runner]["cpu"].append(cpu)
                    times[runner]["pickle"].append(time.perf_counter() - start)
    finally:
        for env_runner in runners.values():
            env_runner.stop()
    record: dict[str, Any] = {"workload": WORKLOAD, "case": "cartpole", "variant": "sample_only"}
    record["repeats"] = repeats
    for runner, values in times.items():
        for name, series in values.items():
            record[f"{runner}_{name}_s"] = statistics.median(series)
    for name in ("wall", "cpu"):
        record[f"{name}_speedup"] = record[f"rllib_{name}_s"] / record[f"envrunners_{name}_s"]
    return record


def ratio(ours: dict, theirs: dict) -> dict:
    """``envrunners_vs_rllib``: RLlib's times over ours (> 1: ours is faster)."""
    out: dict[str, Any] = {"workload": WORKLOAD, "case": ours["case"]}
    out |= {"variant": "envrunners_vs_rllib", "num_runners": NUM_RUNNERS}
    if "error" in ours or "error" in theirs:
        return out | {"error": "a variant failed; no ratio"}
    out["sampling_speedup"] = theirs["sampling_s_mean"] / ours["sampling_s_mean"]
    out["iteration_speedup"] = theirs["iteration_s_mean"] / ours["iteration_s_mean"]
    out["sampling_target_met"] = out["sampling_speedup"] >= 3.0
    return out


def run(target: str, repeats: int = 5):
    """run.py's entry: each case with the runner of ``target``, ``repeats`` timed iterations."""
    runner = TARGET_RUNNER.get(target)
    if runner is None:
        raise SystemExit(f"unknown --target {target!r}; expected one of {tuple(TARGET_RUNNER)}")
    for case in CASES:
        record = measure(case, runner, iterations=max(repeats, 1), warmup=1)
        yield record | {"target": target}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=5, help="timed iterations (5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed first iterations (1)")
    parser.add_argument("--cases", default=",".join(CASES), help="cartpole,pong")
    parser.add_argument("--runners", default=",".join(RUNNERS), help="rllib,envrunners")
    parser.add_argument("--sample-only", type=int, default=0, metavar="N",
                        help="time sample() alone, N alternating calls per runner class")  # fmt: skip
    args = parser.parse_args(argv)
    if args.sample_only:
        emit(sample_only(args.sample_only))
        return 0
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    runners = [r.strip() for r in args.runners.split(",") if r.strip()]
    bad = [c for c in cases if c not in CASES] + [r for r in runners if r not in RUNNERS]
    if bad or args.iterations < 1 or args.warmup < 0:
        parser.error(f"bad value(s) {bad or (args.iterations, args.warmup)}; cases {CASES}, "
                     f"runners {RUNNERS}, --iterations >= 1, --warmup >= 0")  # fmt: skip
    for case in cases:
        records = {}
        for runner in runners:
            records[runner] = measure(case, runner, args.iterations, args.warmup)
            emit(records[runner])
        if set(RUNNERS) <= set(records):
            emit(ratio(records["envrunners"], records["rllib"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
