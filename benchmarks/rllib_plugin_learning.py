"""Does RLlib learn as well with envrunners' runners? Env steps to a return, both runners.

For each RLlib 2.60 algorithm the same config (same seed) trains once with RLlib's
own runner class and once with ``envrunners.rllib``'s (``env_runner_cls=...``) until
``env_runners/episode_return_mean`` reaches the case's threshold or the step budget
runs out. One record per (case, runner): env steps sampled (lifetime) when the
threshold was first reached (None if never), iterations, wall time, sampling time
per iteration; then one ``envrunners_vs_rllib`` record per case with
``steps_ratio`` = ours / RLlib's (issue 19: within 0.8-1.2) and the sampling
speed-up. One seed per case: RL returns vary between seeds, so a ratio outside the
band is a reason to rerun with ``--seeds``, not proof by itself.

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
    config = config.debugging(seed=seed).reporting(metrics_num_episodes_for_smoothing=20)
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
    if runner_cls is not None:
        keys["env_runner_cls"] = runner_cls
    return config.env_runners(**keys)


def _get(result: dict, *path: str) -> Any:
    for key in path:
        if not isinstance(result, dict) or key not in result:
            return None
        result = result[key]
    return result


def run_case(case: str, runner: str, seed: int) -> dict:
    threshold, budget = TARGETS[case]
    algo = _config(case, runner, seed).build_algo()
    start = time.perf_counter()
    iterations, steps, reached_at, best, sampling = 0, 0, None, float("-inf"), []
    try:
        while steps < budget:
            result = algo.train()
            iterations += 1
            steps = int(_get(result, "env_runners", "num_env_steps_sampled_lifetime") or 0)
            ret = _get(result, "env_runners", "episode_return_mean")
            timer = _get(result, "timers", "env_runner_sampling_timer")
            if timer is not None:
                sampling.append(float(timer))
            if ret is not None and ret == ret:
                best = max(best, float(ret))
                if ret >= threshold:
                    reached_at = steps
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
        "best_return": best,
        "iterations": iterations,
        "env_steps": steps,
        "wall_s": time.perf_counter() - start,
        "sampling_timer_last_s": sampling[-1] if sampling else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    args = parser.parse_args()
    import ray

    from envrunners.env._ray_setup import init_local_ray  # bound to 127.0.0.1, as envrunners

    init_local_ray(os.cpu_count() or 2)
    for case in args.cases.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            records = {}
            for runner in RUNNERS:
                try:
                    rec = run_case(case, runner, seed)
                except Exception as err:  # one case's failure must not hide the others
                    traceback.print_exc()
                    rec = {"workload": "RLLIB_LEARNING", "case": case, "runner": runner, "seed": seed,
                           "error": f"{type(err).__name__}: {err}"}  # fmt: skip
                records[runner] = rec
                print(json.dumps(rec), flush=True)
            ours, theirs = records["envrunners"], records["rllib"]
            a, b = ours.get("env_steps_to_threshold"), theirs.get("env_steps_to_threshold")
            print(
                json.dumps(
                    {
                        "workload": "RLLIB_LEARNING",
                        "case": case,
                        "seed": seed,
                        "variant": "envrunners_vs_rllib",
                        "steps_ratio": (a / b) if a and b else None,
                        "within_20_percent": bool(a and b and 0.8 <= a / b <= 1.2),
                        "wall_ratio": ours.get("wall_s", 0) / theirs["wall_s"]
                        if theirs.get("wall_s")
                        else None,
                        "python": sys.version.split()[0],
                        "cpus": os.cpu_count(),
                    }
                ),
                flush=True,
            )
    ray.shutdown()


if __name__ == "__main__":
    main()
