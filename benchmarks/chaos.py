"""Chaos: PPO keeps training while runners are killed, envs fail, a runner hangs, a node dies.

    python benchmarks/chaos.py --minutes 2

Setup: a local Ray started the way envrunners starts one (127.0.0.1 only, token
auth) with ``--head-cpus`` CPUs (default 4), plus one extra node joined with
``ray start --address`` on 127.0.0.1 (1 CPU). PPO on CartPole-v1 with 3 remote
runners x 4 envs, 1 CPU each (Ray's default scheduling puts two on the head and
one on the extra node; stderr logs where they were), and the group's standby
runner (1 CPU) on the head. The head's fourth CPU is room for the next standby
once the first one has replaced the runner of the lost node; with
``--head-cpus 3`` there is none, and later kills wait for Ray's process
restarts. ``MeanStdFilter``,
``fault_tolerance(restart_failed_env_runners=True,
restart_failed_sub_environments=True)`` and ``sample_timeout_s=10``. Chaos, on a
seeded schedule:

- ``sigkill``: every ``--kill-every-s`` (jittered) a random runner's process gets
  SIGKILL (never the hung runner while it hangs);
- env errors: every env step raises with ``--env-error-p`` (0.5 %);
- ``hang``: at 25 % of the run one runner's env (a runner on the head node)
  blocks in ``step()`` for good;
- ``node``: at 50 % of the run every process of the extra node gets SIGKILL.

Measured per ``train()``: env steps the learner trained on against
``total_train_batch_size`` (``short`` below it, ``over_long`` above it plus
RLlib's own overshoot of up to ``NUM_ENVS - 1`` steps per runner), ``lost``
(``train()`` raised or trained nothing). A fault is recovered once the runner it
hit is back in service in a new process (the group put the standby or Ray's
restart of it into service, with the latest state, after the fault) and answers
a call; its recovery time runs from the fault to then (the group's own
timestamp, so it depends neither on how long an iteration takes nor on other
runners still being out). A runner that comes back in service in its own process
(its shared-memory env replaced the worker whose env hung) recovers when it
answers again. A fault whose runner is not known (a node without runners) is recovered
at the end of the first iteration that trained a full batch with every runner
healthy and Ray's restart count past its value at the fault. Recoveries are
checked after every iteration; after each, every runner's module weights and
observation-filter state are compared with the local runner's (``consistent``).
One JSON line at the end.
Targets: 0 lost, 0 short, p50 recovery <= 2 s (with the standby runner).

``--vectorize-mode shared_memory`` steps each runner's envs in worker processes,
``--continuous`` samples with ``sample_continuously=True`` (the async core); a
continuous batch is whole results (``NUM_ENVS x FRAGMENT`` steps each), so it
counts as over-long only above ``BATCH`` plus one result per runner.
``--multi-agent``: two agents, each on its own chaos CartPole, modules ``p0``/``p1``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import emit  # noqa: E402

WORKLOAD = "CHAOS"
NUM_RUNNERS = 3
NUM_ENVS = 4
FRAGMENT = 50
BATCH = NUM_RUNNERS * NUM_ENVS * FRAGMENT
#: RLlib's own overshoot: a runner ends ``sample()`` with a whole vector step, and
#: a sub-env that was just reset adds no step, so each runner may return up to
#: ``NUM_ENVS - 1`` steps more than asked for. Top-up rounds (after a failure) ask
#: each runner for its share of the missing steps, so they keep this bound, which
#: is tighter than the issue's N + NUM_ENVS x NUM_RUNNERS - 1.
MAX_BATCH = BATCH + NUM_RUNNERS * (NUM_ENVS - 1)


def _register_by_value() -> None:
    """Ship this module's env and runner functions to the workers by value."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def chaos_cartpole(env_config: dict) -> Any:
    """CartPole-v1 whose ``step`` raises with probability ``p_error`` and, once the
    ``hang_flag`` file names this runner, blocks for good in the env that claims it."""
    import gymnasium as gym

    class ChaosCartPole(gym.Wrapper):
        def __init__(self, env: Any, p_error: float, hang_flag: str, worker_index: int):
            super().__init__(env)
            self._p = p_error
            self._flag = hang_flag
            self._index = worker_index
            self._rng = random.Random()
            self._n = 0

        def _claims_hang(self) -> bool:
            """The flag names the runner that hangs; its first env to see it claims it."""
            try:
                with open(self._flag) as f:
                    if f.read().strip() != str(self._index):
                        return False
                os.remove(self._flag)  # only one env wins the claim
            except OSError:
                return False
            return True

        def step(self, action: Any) -> Any:
            self._n += 1
            if self._n % 64 == 0 and os.path.exists(self._flag) and self._claims_hang():
                while True:
                    time.sleep(3600)
            if self._rng.random() < self._p:
                raise RuntimeError("chaos: injected env error")
            return self.env.step(action)

    return ChaosCartPole(
        gym.make("CartPole-v1"),
        float(env_config["p_error"]),
        str(env_config["hang_flag"]),
        int(getattr(env_config, "worker_index", -1)),
    )


def _pid(runner: Any) -> int:
    return os.getpid()


def _node_id(runner: Any) -> tuple[int, str]:
    import ray

    return runner.worker_index, ray.get_runtime_context().get_node_id()


def _digest(value: Any) -> str:
    """A stable hash of nested dicts/lists of arrays, tensors and numbers."""
    import numpy as np

    h = hashlib.sha1()

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for k in sorted(v, key=str):
                h.update(str(k).encode())
                walk(v[k])
        elif isinstance(v, list | tuple):
            for item in v:
                walk(item)
        elif hasattr(v, "detach"):
            h.update(np.ascontiguousarray(v.detach().cpu().numpy()).tobytes())
        elif isinstance(v, np.ndarray):
            h.update(np.ascontiguousarray(v).tobytes())
        elif isinstance(v, int | float | bool | np.number | str) or v is None:
            h.update(repr(v).encode())

    walk(value)
    return h.hexdigest()[:16]


def _state_digests(runner: Any) -> tuple[str, str]:
    """(module weights, env-to-module connector state) digests of one runner."""
    state = runner.get_state()
    return _digest(state.get("rl_module")), _digest(state.get("env_to_module_connector"))


def _agent_module(agent_id: Any, episode: Any, **kwargs: Any) -> str:
    """``--multi-agent``: agent ``i`` acts with module ``p<i>``."""
    return f"p{agent_id}"


def _config(
    p_error: float,
    hang_flag: str,
    vectorize_mode: str = "sync",
    continuous: bool = False,
    multi_agent: bool = False,
):
    from envrunners.algorithms.ppo import PPOConfig
    from envrunners.env.multi_agent_env import make_multi_agent

    env_config: dict[str, Any] = {"p_error": p_error, "hang_flag": hang_flag}
    env: Any = chaos_cartpole
    if multi_agent:  # two agents, each playing its own chaos CartPole
        env, env_config = make_multi_agent(chaos_cartpole), {**env_config, "num_agents": 2}
    config = (
        PPOConfig()
        .environment(env, env_config=env_config)
        .env_runners(
            num_env_runners=NUM_RUNNERS,
            num_envs_per_env_runner=NUM_ENVS,
            num_cpus_per_env_runner=1,
            rollout_fragment_length=FRAGMENT,
            observation_filter="MeanStdFilter",
            sample_timeout_s=10.0,
            gym_env_vectorize_mode=vectorize_mode,
            sample_continuously=continuous,
        )
        .training(train_batch_size=BATCH, minibatch_size=BATCH // 2, num_epochs=1)
        .fault_tolerance(restart_failed_env_runners=True, restart_failed_sub_environments=True)
    )
    if multi_agent:
        config = config.multi_agent(policies={"p0", "p1"}, policy_mapping_fn=_agent_module)
    return config


class Fault:
    """One injected fault and when it was recovered."""

    def __init__(self, kind: str, at: float, restarts: int, runner: int | None):
        self.kind, self.at, self.restarts, self.runner = kind, at, restarts, runner
        self.recovered_s: float | None = None
        self.consistent: bool | None = None
        #: Seen out of service (a runner that comes back without a new process).
        self.seen_out = False


def _trained_steps(result: dict) -> int:
    """Env steps the learner trained on in this iteration."""
    learners = result.get("learners", {}).get("__all_modules__", {})
    return int(learners.get("num_env_steps_trained", 0))


def _consistent(group: Any) -> bool:
    """Every remote runner's weights and filter equal the local runner's."""
    local = _state_digests(group.local_env_runner)
    remote = group.foreach_env_runner(_state_digests, local_env_runner=False)
    return bool(remote) and all(tuple(d) == local for d in remote)


def run_chaos(
    minutes: float,
    seed: int,
    p_error: float,
    kill_every_s: float,
    head_cpus: int = NUM_RUNNERS + 1,
    vectorize_mode: str = "sync",
    continuous: bool = False,
    multi_agent: bool = False,
) -> dict:
    import ray

    from envrunners.env._local_ray_node import LocalRayNode
    from envrunners.env._ray_setup import EMBEDDED_SYSTEM_CONFIG, init_local_ray

    _register_by_value()
    rng = random.Random(seed)
    flag = os.path.join(tempfile.mkdtemp(prefix="chaos-"), "hang")
    init_local_ray(head_cpus, log_to_driver=False, _system_config=dict(EMBEDDED_SYSTEM_CONFIG))
    node = LocalRayNode(ray.get_runtime_context().gcs_address, num_cpus=1)
    node.start()
    algo = None
    faults: list[Fault] = []
    counts: dict[str, Any] = {
        "iterations": 0,
        "lost": 0,
        "short": 0,
        "over_long": 0,
        "errors": {},
        "steps": [],
    }
    try:
        algo = _config(p_error, flag, vectorize_mode, continuous, multi_agent).build_algo()
        # Continuous sampling trains whole results (a runner's NUM_ENVS x FRAGMENT steps)
        # and every result that would otherwise get too stale: over-long is beyond one
        # more result per runner.
        max_batch = MAX_BATCH if not continuous else BATCH + NUM_RUNNERS * (NUM_ENVS * FRAGMENT)
        counts.update(
            max_batch=max_batch,
            vectorize_mode=vectorize_mode,
            continuous=continuous,
            multi_agent=multi_agent,
        )
        group = algo.env_runner_group
        extra_node = [n["NodeID"] for n in ray.nodes() if n["Alive"] and not _is_head(n)]
        placement = group.foreach_env_runner(_node_id, local_env_runner=False, timeout_seconds=30)
        on_head = sorted(i for i, n in placement if n not in extra_node)
        print(f"chaos: runners on the head node: {on_head} of {len(placement)}", file=sys.stderr)
        start = time.monotonic()
        end = start + minutes * 60.0
        hang_at, node_at = start + 0.25 * (end - start), start + 0.5 * (end - start)
        next_kill = start + kill_every_s * rng.uniform(0.5, 1.5)
        hung: Fault | None = None
        lifetime = sampled = 0.0
        while time.monotonic() < end:
            now = time.monotonic()
            restarts = group.num_remote_worker_restarts()
            if hung is None and now >= hang_at:
                hang_runner = rng.choice(on_head or group.healthy_env_runner_ids())
                Path(flag).write_text(str(hang_runner))
                hung = Fault("hang", now, restarts, hang_runner)
                faults.append(hung)
                _log(start, f"runner {hang_runner} set to hang")
            if now >= node_at and node is not None:
                placement = group.foreach_env_runner(
                    _node_id, local_env_runner=False, timeout_seconds=5.0
                )
                on_node = [i for i, n in placement if n in extra_node]
                node.kill()
                node = None
                victim = on_node[0] if on_node else None
                faults.append(Fault("node", time.monotonic(), restarts, victim))
                _log(start, f"extra node killed (runners on it: {on_node})")
            if now >= next_kill:
                next_kill = now + kill_every_s * rng.uniform(0.5, 1.5)
                candidates = [i for i in group.healthy_env_runner_ids() if not _hanging(hung, i)]
                if candidates:
                    victim = rng.choice(candidates)
                    try:
                        pid = group.foreach_env_runner(
                            _pid,
                            remote_worker_ids=[victim],
                            local_env_runner=False,
                            timeout_seconds=5.0,
                        )[0]
                        os.kill(pid, signal.SIGKILL)
                        faults.append(Fault("sigkill", time.monotonic(), restarts, victim))
                        _log(start, f"SIGKILL runner {victim} (pid {pid})")
                    except Exception as err:  # the victim died on its own meanwhile
                        print(f"chaos: kill of runner {victim} skipped: {err!r}", file=sys.stderr)
            try:
                result = algo.train()
                steps = _trained_steps(result)
                sampled += float(result["num_env_steps_sampled_lifetime"]) - lifetime
                lifetime = float(result["num_env_steps_sampled_lifetime"])
            except Exception as err:
                name = type(err).__name__
                counts["errors"][name] = counts["errors"].get(name, 0) + 1
                print(f"chaos: train() raised {name}: {err}", file=sys.stderr)
                steps = 0
            counts["iterations"] += 1
            counts["steps"].append(steps)
            if steps <= 0:
                counts["lost"] += 1
            elif steps < BATCH:
                counts["short"] += 1
            elif steps > max_batch:
                counts["over_long"] += 1
            healthy = group.num_healthy_remote_env_runners() == NUM_RUNNERS
            pending = [f for f in faults if f.recovered_s is None]
            if pending:
                done = time.monotonic()
                restarts_now = group.num_remote_worker_restarts()
                replaced_at = group._recovery.replaced_at
                recovered = []
                for f in pending:
                    if f.runner is None:
                        if healthy and steps >= BATCH and restarts_now > f.restarts:
                            recovered.append((f, done))
                    elif replaced_at.get(f.runner, f.at) > f.at and _answers(group, f.runner):
                        recovered.append((f, replaced_at[f.runner]))
                    elif f.runner not in group.healthy_env_runner_ids():
                        f.seen_out = True
                    elif f.seen_out and _answers(group, f.runner):
                        # Back in service in its own process: e.g. its shared-memory env
                        # replaced the worker whose env hung, and its late call returned.
                        recovered.append((f, done))
                if recovered:
                    consistent = _consistent(group)
                    for f, at in recovered:
                        f.recovered_s = at - f.at
                        f.consistent = consistent
                        _log(start, f"{f.kind} recovered in {f.recovered_s:.2f} s, {consistent=}")
        elapsed = time.monotonic() - start
        healthy_at_end = group.num_healthy_remote_env_runners()
    finally:
        if algo is not None:
            algo.stop()
        if node is not None:
            node.stop()
        if ray.is_initialized():
            ray.shutdown()
        for path in (flag, os.path.dirname(flag)):
            try:
                os.rmdir(path) if os.path.isdir(path) else os.remove(path)
            except OSError:
                pass
    counts["sampled"] = int(sampled)
    counts["healthy_at_end"] = healthy_at_end
    counts["head_cpus"] = head_cpus
    return _summary(counts, faults, elapsed, minutes, seed, p_error)


def _answers(group: Any, runner: int | None) -> bool:
    """Whether the runner a fault hit (if known) answers a call within 2 s."""
    if runner is None:
        return True
    try:
        got = group.foreach_env_runner(
            _pid, remote_worker_ids=[runner], local_env_runner=False, timeout_seconds=2.0
        )
    except Exception:
        return False
    return len(got) == 1


def _spread(values: list[int]) -> dict[str, float]:
    if not values:
        return {}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _log(start: float, message: str) -> None:
    print(f"chaos t={time.monotonic() - start:6.1f}s: {message}", file=sys.stderr, flush=True)


def _is_head(node_info: dict) -> bool:
    return any(k.startswith("node:__internal_head__") for k in node_info.get("Resources", {}))


def _hanging(hung: Fault | None, runner: int) -> bool:
    """Whether ``runner`` may be the hung one (never killed by the chaos while it hangs)."""
    if hung is None or hung.recovered_s is not None:
        return False
    return hung.runner is None or hung.runner == runner


def _summary(
    counts: dict, faults: list[Fault], elapsed: float, minutes: float, seed: int, p: float
) -> dict:
    times = [f.recovered_s for f in faults if f.recovered_s is not None]
    by_kind: dict[str, dict] = {}
    for f in faults:
        entry = by_kind.setdefault(f.kind, {"n": 0, "recovered": 0, "recovery_s": []})
        entry["n"] += 1
        if f.recovered_s is not None:
            entry["recovered"] += 1
            entry["recovery_s"].append(round(f.recovered_s, 2))
    return {
        "workload": WORKLOAD,
        "target": "envrunners",
        "minutes": minutes,
        "seconds": round(elapsed, 1),
        "seed": seed,
        "env_error_p": p,
        "head_cpus": counts.get("head_cpus"),
        "batch": BATCH,
        "max_batch": counts.get("max_batch", MAX_BATCH),
        "vectorize_mode": counts.get("vectorize_mode", "sync"),
        "continuous": counts.get("continuous", False),
        "multi_agent": counts.get("multi_agent", False),
        "env_steps_sampled": counts.get("sampled", 0),
        "iterations": counts["iterations"],
        "lost_batches": counts["lost"],
        "short_batches": counts["short"],
        "over_long_batches": counts["over_long"],
        "train_errors": counts["errors"],
        "steps_per_iteration": _spread(counts["steps"]),
        "faults": len(faults),
        "healthy_runners_at_end": counts.get("healthy_at_end"),
        "recovered": len(times),
        "recovery_p50_s": round(statistics.median(times), 2) if times else None,
        "recovery_max_s": round(max(times), 2) if times else None,
        "consistent_after_recovery": sum(1 for f in faults if f.consistent),
        "inconsistent_after_recovery": sum(1 for f in faults if f.consistent is False),
        "by_fault": by_kind,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env-error-p", type=float, default=0.005)
    parser.add_argument("--kill-every-s", type=float, default=20.0)
    parser.add_argument("--head-cpus", type=int, default=NUM_RUNNERS + 1)
    parser.add_argument(
        "--vectorize-mode", default="sync", choices=("sync", "async", "shared_memory")
    )
    parser.add_argument(
        "--continuous", action="store_true", help="sample_continuously=True (the async core)"
    )
    parser.add_argument("--multi-agent", action="store_true", help="two agents, modules p0 and p1")
    args = parser.parse_args(argv)
    os.environ.pop("RAY_ADDRESS", None)  # the benchmark starts its own Ray
    from envrunners._cli.embedded_ray import ray_errors_logged

    with ray_errors_logged():  # Ray's "worker/raylet died" lines stay off stdout
        record = run_chaos(
            args.minutes,
            args.seed,
            args.env_error_p,
            args.kill_every_s,
            args.head_cpus,
            args.vectorize_mode,
            args.continuous,
            args.multi_agent,
        )
    emit(record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
