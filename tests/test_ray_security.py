"""A Ray that envrunners starts listens on 127.0.0.1 only and keeps token auth on.

Reads the listening sockets (psutil) of every process of the Ray and fails on any
address that is not loopback: the Ray an ``EnvRunnerGroup`` starts and the one a
CLI command starts (both in a subprocess, this file run as a script, so each
starts a Ray of its own) and the suite's session Ray (tests/conftest.py, started
the same way). Token auth is checked on the wire: a GCS call without the token,
or with a wrong one, is refused.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")

from envrunners.env import _ray_setup  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def listening_addresses(root) -> list[dict]:
    """Every listening TCP/UDP socket of ``root`` and its descendants (pid, name, ip, port)."""
    found = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            connections = proc.net_connections(kind="inet")
            name = proc.name()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        for conn in connections:
            unconnected_udp = conn.type == socket.SOCK_DGRAM and not conn.raddr
            if conn.status == psutil.CONN_LISTEN or unconnected_udp:
                found.append(
                    {"pid": proc.pid, "name": name, "ip": conn.laddr.ip, "port": conn.laddr.port}
                )
    return found


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1, or IPv4-mapped loopback (``::ffff:127.0.0.1``)."""
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def gcs_auth_codes(gcs_address: str) -> dict[str, str]:
    """The gRPC status of one GCS call without a token, with a wrong one and with the right one."""
    import grpc
    from ray._private.authentication.authentication_token_setup import _get_default_token_path

    token = os.environ.get("RAY_AUTH_TOKEN") or _get_default_token_path().read_text().strip()
    call = grpc.insecure_channel(gcs_address).unary_unary(
        "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
        request_serializer=lambda x: x,
        response_deserializer=lambda x: x,
    )
    codes = {}
    for label, metadata in (
        ("none", None),
        ("wrong", [("authorization", "Bearer " + "0" * 64)]),
        ("right", [("authorization", "Bearer " + token)]),
    ):
        try:
            call(b"", timeout=10, metadata=metadata)
            codes[label] = "OK"
        except grpc.RpcError as error:
            codes[label] = error.code().name
    return codes


def _current_ray_report() -> dict:
    import ray

    return {
        "listening": listening_addresses(psutil.Process()),
        "auth": gcs_auth_codes(ray.get_runtime_context().gcs_address),
        "auth_mode": os.environ.get("RAY_AUTH_MODE"),
    }


def _drive() -> dict:
    """Start Ray the two ways envrunners does; report sockets and auth of each."""
    import ray

    from envrunners._cli.embedded_ray import embedded_ray
    from envrunners.algorithms.ppo import PPOConfig
    from envrunners.env.env_runner_group import EnvRunnerGroup

    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=1, rollout_fragment_length=8)
    )
    group = EnvRunnerGroup(config=config, local_env_runner=False, standby_env_runner=True)
    try:
        steps = group.foreach_env_runner(
            lambda runner: sum(len(e) for e in runner.sample()), local_env_runner=False
        )
        report = {"group": {**_current_ray_report(), "steps": steps}}
    finally:
        group.stop()
    report["group_shut_down"] = not ray.is_initialized()

    @ray.remote(num_cpus=0)
    class Probe:
        def ping(self) -> str:
            return "pong"

    with embedded_ray(1) as started:
        probe = Probe.remote()
        report["cli"] = {**_current_ray_report(), "started": started}
        report["cli"]["ping"] = ray.get(probe.ping.remote())
    return report


def _assert_loopback_only(listening: list[dict]) -> None:
    assert listening, "no listening socket found: the check would pass vacuously"
    exposed = [entry for entry in listening if not is_loopback(entry["ip"])]
    assert not exposed, f"Ray processes listen beyond loopback: {exposed}"


@pytest.mark.timeout(180)
def test_ray_started_by_envrunners_listens_on_loopback_with_token_auth():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, __file__], capture_output=True, text=True, env=env, cwd=REPO, timeout=170
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for how in ("group", "cli"):
        _assert_loopback_only(report[how]["listening"])
        names = {entry["name"] for entry in report[how]["listening"]}
        assert {"gcs_server", "raylet"} <= names, (how, names)
        assert report[how]["auth_mode"] == "token", report[how]
        assert report[how]["auth"] == {
            "none": "UNAUTHENTICATED",
            "wrong": "UNAUTHENTICATED",
            "right": "OK",
        }, report[how]
    assert report["group"]["steps"] == [8, 8]
    assert report["group_shut_down"] is True
    assert report["cli"]["started"] is True and report["cli"]["ping"] == "pong"


def test_session_ray_listens_on_loopback_only(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0)
    class Probe:
        def ping(self) -> str:
            return "pong"

    probe = Probe.remote()
    assert ray.get(probe.ping.remote()) == "pong"
    listening = listening_addresses(psutil.Process())
    ray.kill(probe)
    _assert_loopback_only(listening)
    assert {"gcs_server", "raylet"} <= {entry["name"] for entry in listening}
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        codes = gcs_auth_codes(ray.get_runtime_context().gcs_address)
        assert codes["none"] == "UNAUTHENTICATED" and codes["right"] == "OK", codes


def test_auth_disabled_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(_ray_setup, "_auth_warned", threading.Event())
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with caplog.at_level(logging.WARNING, logger="envrunners"):
        _ray_setup.warn_if_auth_disabled()
        _ray_setup.warn_if_auth_disabled()
    warnings = [r for r in caplog.records if "RAY_AUTH_MODE=disabled" in r.getMessage()]
    assert len(warnings) == 1
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setattr(_ray_setup, "_auth_warned", threading.Event())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="envrunners"):
        _ray_setup.warn_if_auth_disabled()
    assert not caplog.records


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:6379", True),
        ("localhost:6379", True),
        ("[::1]:6379", True),
        ("ray://127.0.0.1:10001", True),
        ("auto", True),
        ("10.0.0.5:6379", False),
        ("head.example.com:6379", False),
        ("ray://10.0.0.5:10001", False),
    ],
)
def test_is_loopback_address(address, loopback):
    assert _ray_setup.is_loopback_address(address) is loopback


if __name__ == "__main__":
    print(json.dumps(_drive()), flush=True)
