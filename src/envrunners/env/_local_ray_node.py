"""A Ray node on this machine, started with ``ray start`` on 127.0.0.1 and killable at will.

Why: the two-node test and the chaos benchmark need a second raylet that joins a
loopback-only cluster (see ``_ray_setup.init_local_ray``) and can be SIGKILLed
like a lost machine. Plain ``ray start --address 127.0.0.1:port`` cannot join such
a cluster: Ray swaps 127.0.0.1 for the machine's outward IP, where nothing listens.
The node runs ``ray start --block`` in a process of its own, so every process of
the node descends from it and ``kill()`` ends exactly those (``ray stop`` would end
every Ray on the machine). ``ray start`` records its cluster in the head's temp dir
(``ray_current_cluster``, where any later ``ray.init()`` on the machine looks for a
cluster to join): a joining node puts back what was there when it ends.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Any

__all__ = ["NODE_LOSS_DETECTION", "LocalRayNode", "free_loopback_port"]

#: ``ray start`` with Ray's localhost-to-outward-IP swap turned off (it is what
#: makes a loopback address unusable), then Ray's own command line.
_RAY_START = (
    "import sys\n"
    "import ray._private.services as services\n"
    "services.resolve_ip_for_localhost = lambda host: host\n"
    "from ray.scripts.scripts import main\n"
    "sys.argv[0] = 'ray'\n"
    "main()\n"
)
#: GCS health checks of a cluster whose nodes all run on this machine: a lost node
#: is declared dead after ~3 s instead of Ray's ~20 s (3 missed checks, 1 s apart).
NODE_LOSS_DETECTION = {
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}
#: The line ``ray start --block`` prints once the node is up.
_STARTED = "This command will now block forever"


def free_loopback_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalRayNode:
    """One Ray node on 127.0.0.1: a head (``address=None``) or a node joining ``address``.

    Args:
        address: GCS address (``127.0.0.1:port``) of the cluster to join; None
            starts a head node on a free port (``self.address`` says which).
        num_cpus: CPUs the node offers.
        resources: Custom resources the node offers (e.g. to place an actor there).
        temp_dir: Ray's temp dir for a head node (default: a new one under /tmp,
            short enough for Ray's unix socket paths).
        env: Extra environment variables of the node's processes.
        system_config: Ray system config of a head node (``--system-config``), e.g.
            ``NODE_LOSS_DETECTION`` to see a lost node in seconds.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: int = 1,
        resources: dict[str, float] | None = None,
        temp_dir: str | None = None,
        env: dict[str, str] | None = None,
        system_config: dict[str, Any] | None = None,
    ):
        self.head = address is None
        self.address = address or f"127.0.0.1:{free_loopback_port()}"
        self.num_cpus = int(num_cpus)
        self.resources = dict(resources or {})
        self._own_temp_dir = self.head and temp_dir is None
        self.temp_dir = temp_dir or (
            tempfile.mkdtemp(prefix="er-", dir="/tmp") if self.head else None
        )
        self._env = dict(env or {})
        self._system_config = dict(system_config or {})
        self._proc: subprocess.Popen[str] | None = None
        self._lines: deque[str] = deque(maxlen=200)
        self._started = threading.Event()
        self._address_file: str | None = None
        self._address_before: str | None = None

    def _command(self) -> list[str]:
        args = [
            sys.executable, "-c", _RAY_START, "start", "--block", "--disable-usage-stats",
            "--node-ip-address=127.0.0.1", f"--num-cpus={self.num_cpus}",
        ]  # fmt: skip
        if self.resources:
            args.append("--resources=" + json.dumps(self.resources))
        if self.head:
            port = self.address.rsplit(":", 1)[1]
            args += ["--head", f"--port={port}", "--include-dashboard=false"]
            args.append(f"--temp-dir={self.temp_dir}")
            if self._system_config:
                args.append("--system-config=" + json.dumps(self._system_config))
        else:
            args.append(f"--address={self.address}")
        return args

    def _drain(self) -> None:
        """Read the node's output (so its pipe never fills); note when it is up."""
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.append(line.rstrip())
            if _STARTED in line:
                self._started.set()

    def start(self, timeout: float = 60.0) -> LocalRayNode:
        """Start the node and wait until it is up (raises RuntimeError with its output if not)."""
        env = {**os.environ, **self._env}
        env.pop("RAY_ADDRESS", None)
        if not self.head:
            from ray._common.utils import get_ray_address_file

            self._address_file = get_ray_address_file(None)
            try:
                with open(self._address_file) as f:
                    self._address_before = f.read()
            except OSError:
                self._address_before = None
        self._proc = subprocess.Popen(
            self._command(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        threading.Thread(target=self._drain, daemon=True, name="ray-node-output").start()
        deadline = time.monotonic() + timeout
        while not self._started.wait(0.1):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                output = "\n".join(self._lines)
                self.kill()
                raise RuntimeError(f"ray start {self._command()[3:]} failed:\n{output}")
        return self

    def pids(self) -> list[int]:
        """Process ids of the node: ``ray start`` and everything it started."""
        import psutil

        if self._proc is None:
            return []
        try:
            root = psutil.Process(self._proc.pid)
            return [root.pid] + [p.pid for p in root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL every process of the node at once, like a machine that is lost."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignored
                pass
        self._reap(pids)
        self._restore_address_file()

    def _restore_address_file(self) -> None:
        """Put back the machine's ``ray_current_cluster`` as it was before this node started."""
        path, self._address_file = self._address_file, None
        if path is None:
            return
        try:
            with open(path) as f:
                if f.read().strip() != self.address:
                    return  # not ours (never written, or another cluster's since)
            if self._address_before is None:
                os.remove(path)
            else:
                with open(path, "w") as f:
                    f.write(self._address_before)
        except OSError:
            pass

    @staticmethod
    def _reap(pids: list[int], timeout: float = 10.0) -> None:
        """Wait until the killed processes are gone (workers are reparented, not our children)."""
        import psutil

        procs = []
        for pid in pids:
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=timeout)

    def stop(self) -> None:
        """End the node (SIGKILL; a head's temp dir is removed when this object made it)."""
        self.kill()
        if self._own_temp_dir and self.temp_dir:
            import shutil

            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def output(self) -> str:
        """The last lines ``ray start`` printed."""
        return "\n".join(self._lines)

    def __enter__(self) -> LocalRayNode:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
