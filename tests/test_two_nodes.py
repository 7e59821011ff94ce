"""Two Ray nodes on 127.0.0.1: runners on both, the second node killed, the group goes on.

The cluster is started with ``ray start`` (a head and a second node joining it
over loopback, token auth on with a token made for the test) and joined through
``RAY_ADDRESS`` the way a CLI command joins it (``embedded_ray``): Ray's lines stay
off stdout, and ``cluster_summary`` names the cluster, its nodes and the runners
lost and replaced. All of it runs in a subprocess (this
file run as a script), so the suite's session Ray is never touched, and every
process of the two nodes is SIGKILLed at the end.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("psutil")

REPO = Path(__file__).resolve().parents[1]
FRAGMENT = 40


def _node_of_each_runner(group) -> dict[int, str]:
    """Which Ray node each remote runner lives on (runner index -> node id)."""
    results = group.foreach_env_runner(
        lambda runner: (runner.worker_index, _current_node_id()), local_env_runner=False
    )
    return dict(results)


def _current_node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _steps_per_runner(group) -> list[int]:
    """One ``sample()`` on every healthy remote runner: the env steps each returned."""
    return group.foreach_env_runner(
        lambda runner: sum(len(episode) for episode in runner.sample()),
        local_env_runner=False,
    )


def _drive() -> dict:
    """Start the two nodes, sample, kill the second node, sample again; report what happened."""
    os.environ["RAY_AUTH_MODE"] = "token"  # joining a token cluster: the user's own setting
    import ray

    from envrunners._cli.embedded_ray import cluster_summary, embedded_ray
    from envrunners.algorithms.ppo import PPOConfig
    from envrunners.env._local_ray_node import NODE_LOSS_DETECTION, LocalRayNode
    from envrunners.env.env_runner_group import EnvRunnerGroup

    report: dict = {}
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.environ["RAY_AUTH_TOKEN"]}
    t0 = time.monotonic()
    head = LocalRayNode(num_cpus=2, env=auth, system_config=NODE_LOSS_DETECTION).start()
    report["t_head"] = round(time.monotonic() - t0, 1)
    second = None
    group = None
    joined = None
    try:
        second = LocalRayNode(head.address, num_cpus=1, resources={"second_node": 1}, env=auth)
        second.start()
        report["t_second"] = round(time.monotonic() - t0, 1)
        os.environ["RAY_ADDRESS"] = head.address
        joined = embedded_ray(0)
        report["joined"] = joined.__enter__()
        config = (
            PPOConfig()
            .environment("CartPole-v1")
            .env_runners(
                num_env_runners=2,
                num_envs_per_env_runner=1,
                num_cpus_per_env_runner=1,
                rollout_fragment_length=FRAGMENT,
            )
            .fault_tolerance(restart_failed_env_runners=True)
        )
        group = EnvRunnerGroup(config=config, local_env_runner=False)
        report["t_group"] = round(time.monotonic() - t0, 1)
        nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
        report["nodes"] = len(nodes)
        report["node_ips"] = sorted({n["NodeManagerAddress"] for n in nodes.values()})
        second_id = next(i for i, n in nodes.items() if "second_node" in n["Resources"])
        placement = _node_of_each_runner(group)
        report["runner_nodes"] = len(set(placement.values()))
        report["runner_on_second"] = [i for i, n in placement.items() if n == second_id]
        report["before"] = _steps_per_runner(group)
        report["summary_before"] = cluster_summary()

        start = time.monotonic()
        second.kill()
        report["during"] = _steps_per_runner(group)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            group.probe_unhealthy_env_runners()
            if group.num_healthy_remote_env_runners() == 2:
                break
            time.sleep(0.2)
        report["recovery_s"] = round(time.monotonic() - start, 2)
        report["healthy"] = group.num_healthy_remote_env_runners()
        report["after"] = _steps_per_runner(group)
        report["after_again"] = _steps_per_runner(group)
        report["alive_nodes_after"] = sum(1 for n in ray.nodes() if n["Alive"])
        report["runner_nodes_after"] = sorted(set(_node_of_each_runner(group).values()))
        report["second_id"] = second_id
        lost = report["runner_on_second"]
        report["summary_after"] = cluster_summary(lost_runners=lost, replaced_runners=lost)
        report["t_done"] = round(time.monotonic() - t0, 1)
    finally:
        if group is not None:
            group.stop()
        if joined is not None:
            joined.__exit__(None, None, None)
        report["summary_outside"] = cluster_summary()
        report["ray_up_after"] = ray.is_initialized()
        if second is not None:
            second.stop()
        head.stop()
    leftover = [pid for node in (head, second) if node is not None for pid in node.pids()]
    report["leftover_pids"] = leftover
    return report


@pytest.mark.timeout(240)
def test_second_node_killed_group_goes_on():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    proc = subprocess.run(
        [sys.executable, __file__],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=230,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["nodes"] == 2 and report["node_ips"] == ["127.0.0.1"], report
    assert report["runner_nodes"] == 2 and len(report["runner_on_second"]) == 1, report
    assert report["before"] == [FRAGMENT, FRAGMENT], report
    # The runner on the killed node is lost for that round; every batch that comes is whole.
    assert all(steps == FRAGMENT for steps in report["during"]), report
    assert report["healthy"] == 2, report
    assert report["after"] == [FRAGMENT, FRAGMENT] == report["after_again"], report
    assert report["alive_nodes_after"] == 1, report
    assert report["second_id"] not in report["runner_nodes_after"], report
    assert report["leftover_pids"] == [], report
    assert report["joined"] is True and report["ray_up_after"] is False, report
    address = report["summary_before"].split(":", 2)
    assert report["summary_before"].startswith("Ray cluster 127.0.0.1:"), report
    assert report["summary_before"].endswith(": 2 of 2 nodes alive"), report
    on_second = report["runner_on_second"][0]
    assert report["summary_after"] == (
        f"{address[0]}:{address[1]}: 1 of 2 nodes alive; "
        f"runners lost: {on_second}; replaced: {on_second}"
    ), report
    assert report["summary_outside"] is None, report
    # Ray's own lines (worker/raylet died, logs of the node's processes) stay off stdout.
    ray_lines = [line for line in proc.stdout.splitlines()[:-1] if line.strip()]
    assert ray_lines == [], ray_lines[:20]


if __name__ == "__main__":
    print(json.dumps(_drive()), flush=True)
