"""Does RLlib learn as well with envrunners' runners? Env steps to a return, both runners.

For each RLlib 2.60 algorithm the same config (same seed) trains once with RLlib's
own runner class and once with ``envrunners.rllib``'s (``env_runner_cls=...``) until
the mean return of the last 20+ episodes (``_RecentReturns``) reaches the case's
threshold or the step budget runs out. One record per (case, runner): env steps
sampled (lifetime) and env steps trained (the learner's lifetime count) when the
threshold was first reached (None if never), iterations, wall time, sampling time
per iteration; then one ``envrunners_vs_rllib`` record per case with
``steps_ratio`` = ours / RLlib's (issue 19: within 0.8-1.2) and
``trained_steps_ratio``. RL returns vary between seeds and RLlib's own runs are not
reproducible (DQN's replay buffer draws from an unseeded generator, APPO's async
learner depends on timing), so compare medians over ``--seeds``; ``--runners
rllib,rllib`` shows RLlib's own spread.

Not a ``run.py`` workload (it trains for minutes). Cases (CartPole-class, so they
learn in minutes on 2 CPUs; Pong does not):
``ppo`` (CartPole-v1), ``ppo_lstm`` (StatelessCartPole, use_lstm), ``dqn``
(CartPole-v1), ``appo`` (CartPole-v1, async sampling), ``ppo_multi_agent``
(MultiAgentCartPole, 2 agents, 2 policies; the threshold is on the sum of both
agents' returns, as RLlib's episode_return_mean reports it).

    python benchmarks/rllib_plugin_learning.py --cases ppo,dqn --seeds 0
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any

CASES = ("ppo", "ppo_lstm", "dqn", "appo", "ppo_multi_agent")
RUNNERS = ("rllib", "envrunners")
#: Episodes the threshold's mean return is over (at least; whole iterations).
SMOOTHING = 20
#: APPO's ``min_time_s_per_iteration`` here (RLlib's default: 10 s).
APPO_ITERATION_S = 1
#: The learner's lifetime count of env steps it trained on (a step trained twice counts twice).
TRAINED = "num_env_steps_trained_lifetime"
#: Per case: the return to reach and the env-step budget.
TARGETS = {
    "ppo": (150.0, 100_000),
    "ppo_lstm": (100.0, 300_000),
    "dqn": (150.0, 60_000),
    "appo": (150.0, 200_000),
    "ppo_multi_agent": (300.0, 200_000),
}


def _config(case: str, runner: str, seed: int) -> Any:
    """The RLlib config of ``case`` with RLlib's runner or ours."""
    import envrunners.rllib as plug

    if case in ("ppo", "ppo_lstm", "ppo_multi_agent"):
        from ray.rllib.algorithms.ppo import PPOConfig

        config = PPOConfig().training(lr=3e-4, num_epochs=6, minibatch_size=128, vf_loss_coeff=0.01)
    elif case == "dqn":
        from ray.rllib.algorithms.dqn import DQNConfig

        config = DQNConfig()
    else:
        from ray.rllib.algorithms.appo import APPOConfig

        config = APPOConfig()
    config = config.debugging(seed=seed).reporting(metrics_num_episodes_for_smoothing=SMOOTHING)
    runner_cls = None
    if case == "ppo_multi_agent":
        from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

        config = config.environment(MultiAgentCartPole, env_config={"num_agents": 2})
        config = config.multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=lambda aid, *a, **k: f"p{aid}",
        )
        if runner == "envrunners":
            runner_cls = plug.MultiAgentEnvRunner
    else:
        if case == "ppo_lstm":
            from ray.rllib.examples.envs.classes.stateless_cartpole import StatelessCartPole

            config = config.environment(StatelessCartPole)
            config = config.rl_module(
                model_config={"use_lstm": True, "lstm_cell_size": 64, "max_seq_len": 20}
            )
        else:
            config = config.environment("CartPole-v1")
        if runner == "envrunners":
            runner_cls = plug.SingleAgentEnvRunner
    remote = 2 if case == "appo" else 1
    keys: dict[str, Any] = {"num_env_runners": remote, "num_envs_per_env_runner": 4}
    if case == "appo":
        keys["num_cpus_per_env_runner"] = 0.5
        # 1 s iterations instead of APPO's default 10 s (~20k env steps here): the
        # threshold is checked per iteration, so 10 s would quantise the count by ~30%.
        config = config.reporting(min_time_s_per_iteration=APPO_ITERATION_S)
    if runner_cls is not None:
        keys["env_runner_cls"] = runner_cls
    return config.env_runners(**keys)


def _get(result: dict, *path: str) -> Any:
    for key in path:
        if not isinstance(result, dict) or key not in result:
            return None
        result = result[key]
    return result


def _number(value: Any) -> float | None:
    """A result's number as a float; None for a missing or NaN one (an iteration's
    mean or count without any finished episode)."""
    if value is None or value != value:
        return None
    return float(value)


class _RecentReturns:
    """The mean return of at least the last ``n`` episodes, over whole iterations.

    RLlib 2.60's ``episode_return_mean`` is the mean over one iteration's finished
    episodes (NaN without any), however large ``metrics_num_episodes_for_smoothing``:
    with short iterations (APPO's 1 s here, DQN's 1000 env steps) one lucky episode
    would cross the threshold. ``add`` keeps (mean, count) per iteration and returns
    the episode-weighted mean of the latest iterations that hold ``n`` episodes.
    """

    def __init__(self, n: int):
        self.n = n
        self._iterations: list[tuple[float, int]] = []

    def add(self, mean: Any, count: Any) -> float | None:
        if mean is not None and count:
            self._iterations.append((float(mean), int(count)))
        total = weighted = 0.0
        for mean_, count_ in reversed(self._iterations):
            total, weighted = total + count_, weighted + mean_ * count_
            if total >= self.n:
                return weighted / total
        return None


def run_case(case: str, runner: str, seed: int, trace: bool = False) -> dict:
    threshold, budget = TARGETS[case]
    algo = _config(case, runner, seed).build_algo()
    start = time.perf_counter()
    iterations, steps, trained, best, sampling = 0, 0, 0, float("-inf"), []
    dropped = None
    recent = _RecentReturns(SMOOTHING)
    reached_at = trained_at = None
    try:
        while steps < budget:
            result = algo.train()
            iterations += 1
            steps = int(_get(result, "env_runners", "num_env_steps_sampled_lifetime") or 0)
            trained = int(_get(result, "learners", "__all_modules__", TRAINED) or 0)
            dropped = _get(result, "learner_group", "learner_group_ts_dropped_lifetime")
            it_ret = _number(_get(result, "env_runners", "episode_return_mean"))
            it_episodes = int(_number(_get(result, "env_runners", "num_episodes")) or 0)
            ret = recent.add(it_ret, it_episodes)
            timer = _get(result, "timers", "env_runner_sampling_timer")
            if timer is not None:
                sampling.append(float(timer))
            if trace:
                print(json.dumps({"trace": case, "runner": runner, "seed": seed,
                                  "iteration": iterations, "env_steps": steps,
                                  "env_steps_trained": trained, "dropped": dropped,
                                  "episodes": it_episodes, "iteration_return": it_ret,
                                  "return": ret}, default=float), flush=True)  # fmt: skip
            if ret is not None and ret == ret:
                best = max(best, float(ret))
                if ret >= threshold:
                    reached_at, trained_at = steps, trained
                    break
    finally:
        algo.stop()
    return {
        "workload": "RLLIB_LEARNING",
        "case": case,
        "runner": runner,
        "seed": seed,
        "threshold": threshold,
        "budget_env_steps": budget,
        "env_steps_to_threshold": reached_at,
        "env_steps_trained_to_threshold": trained_at,
        "best_return": best,
        "iterations": iterations,
        "env_steps": steps,
        "env_steps_trained": trained,
        # Async algorithms (APPO): env steps the LearnerGroup dropped with its learner busy.
        "env_steps_dropped_by_learner_group": dropped,
        "wall_s": time.perf_counter() - start,
        "sampling_timer_last_s": sampling[-1] if sampling else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument(
        "--runners",
        default=",".join(RUNNERS),
        help="comma-separated runner classes to train with, in order (rllib,rllib: RLlib's "
        "own run-to-run spread at one seed)",
    )
    parser.add_argument("--trace", action="store_true", help="one line per iteration")
    args = parser.parse_args()
    runners = args.runners.split(",")
    bad = [r for r in runners if r not in RUNNERS]
    if bad:
        parser.error(f"--runners: unknown {bad}; expected names from {list(RUNNERS)}")
    import ray

    from envrunners.env._ray_setup import init_local_ray  # bound to 127.0.0.1, as envrunners

    init_local_ray(os.cpu_count() or 2)
    for case in args.cases.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            records = {}
            for runner in runners:
                try:
                    rec = run_case(case, runner, seed, trace=args.trace)
                except Exception as err:  # one case's failure must not hide the others
                    traceback.print_exc()
                    rec = {"workload": "RLLIB_LEARNING", "case": case, "runner": runner, "seed": seed,
                           "error": f"{type(err).__name__}: {err}"}  # fmt: skip
                records.setdefault(runner, rec)
                print(json.dumps(rec, default=float), flush=True)
            if "rllib" in records and "envrunners" in records:
                print(json.dumps(_comparison(case, seed, records)), flush=True)
    ray.shutdown()


def _comparison(case: str, seed: int, records: dict) -> dict:
    """The ``envrunners_vs_rllib`` record of one case and seed: ours / RLlib's."""
    ours, theirs = records["envrunners"], records["rllib"]

    def ratio(key: str) -> float | None:
        a, b = ours.get(key), theirs.get(key)
        return (a / b) if a and b else None

    steps_ratio = ratio("env_steps_to_threshold")
    return {
        "workload": "RLLIB_LEARNING",
        "case": case,
        "seed": seed,
        "variant": "envrunners_vs_rllib",
        "steps_ratio": steps_ratio,
        "trained_steps_ratio": ratio("env_steps_trained_to_threshold"),
        "within_20_percent": bool(steps_ratio and 0.8 <= steps_ratio <= 1.2),
        "wall_ratio": ratio("wall_s"),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }


if __name__ == "__main__":
    main()
