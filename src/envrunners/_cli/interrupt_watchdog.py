"""Last resort for Ctrl-C: a run that has not stopped soon after SIGINT exits anyway.

Why: Ctrl-C reaches Python only between bytecodes. If it lands while the main
thread is blocked inside a Ray call that does not return (seen once in CI: a
``ray.wait`` after the terminal's SIGINT also hit Ray's processes), the command
would hang with no way out but ``kill -9``. The signal still wakes a file
descriptor (``signal.set_wakeup_fd``); a daemon thread reading it gives the
normal shutdown ``grace_s`` seconds, then calls ``on_force`` (summary, stop Ray's
processes) and ends the process with ``os._exit``. The checkpoint of the last
finished iteration is already complete on disk, so nothing is lost.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["FORCE_EXIT_S", "InterruptWatchdog", "kill_embedded_ray"]

#: Seconds the normal shutdown gets after Ctrl-C before the watchdog ends the process.
FORCE_EXIT_S = 30.0


class InterruptWatchdog:
    """Context manager: within it, SIGINT arms a ``grace_s`` timer to a forced exit.

    Leaving the block (normal shutdown finished) disarms it. Outside the main
    thread, or where ``set_wakeup_fd`` is unavailable, it does nothing.
    """

    def __init__(self, on_force: Callable[[], None], exit_code: int, grace_s: float = FORCE_EXIT_S):
        self.on_force = on_force
        self.exit_code = exit_code
        self.grace_s = grace_s
        self._done = threading.Event()
        self._fds: tuple[int, int] | None = None
        self._old_fd = -1

    def __enter__(self) -> InterruptWatchdog:
        if threading.current_thread() is not threading.main_thread():
            return self
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        try:
            self._old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(read_fd)
            os.close(write_fd)
            return self
        self._fds = (read_fd, write_fd)
        threading.Thread(target=self._watch, name="envrunners-ctrl-c", daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        if self._fds is not None:
            signal.set_wakeup_fd(self._old_fd)
            os.close(self._fds[1])  # ends the watcher's read

    def _watch(self) -> None:
        read_fd = self._fds[0]
        try:
            while not self._done.is_set():
                data = os.read(read_fd, 64)
                if not data:
                    return
                if signal.SIGINT in data:
                    break
            else:
                return
        finally:
            if self._done.is_set():
                os.close(read_fd)
        if self._done.wait(self.grace_s):
            return
        try:
            self.on_force()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.exit_code)


def kill_embedded_ray() -> None:
    """Kill the processes of the Ray this process started (no-op for a joined cluster)."""
    try:
        from ray._private import worker

        node = getattr(worker, "_global_node", None)
        if node is not None and getattr(node, "head", False):
            node.kill_all_processes(check_alive=False, allow_graceful=False)
    except Exception:  # best effort: we are exiting anyway
        pass
