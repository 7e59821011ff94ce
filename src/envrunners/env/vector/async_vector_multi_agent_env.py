"""``AsyncVectorMultiAgentEnv``: multi-agent sub-envs in worker processes.

Why: RLlib refuses async vectorisation for multi-agent envs, so an expensive
multi-agent env can only be parallelised by adding whole runners. Here each
sub-env lives in its own process, talking over a ``multiprocessing`` pipe; all
sub-envs step in parallel and the runner waits for the slowest. Worth it when a
sub-env step costs more than the round trip (~100 µs).

Guarantees:
- an exception in a sub-env is re-raised in the parent as ``SubEnvError`` with
  the sub-env index and the child's traceback, after every other sub-env
  answered (the pipes stay in step, the env stays usable);
- a worker that dies, or does not answer within ``timeout_s``, is reported by
  index and the vector env is shut down;
- with ``restart_failed=True`` a worker recreates its sub-env when ``step``
  raises and answers with the reset observation (``failed`` marks it);
- ``close()`` stops every worker (terminating those that do not exit in time);
  workers also exit on their own when the parent process dies, so none leak.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from gymnasium.vector.utils import CloudpickleWrapper

from envrunners.env.vector._sub_env_lifecycle import parent_alive, stop_worker_processes
from envrunners.env.vector.vector_multi_agent_env import (
    VectorMultiAgentEnv,
    autoreset_step,
    restart_sub_env,
    single_spaces_of,
)
from envrunners.errors import SubEnvError
from envrunners.utils.failure_log import FAILURE_LOG

__all__ = ["AsyncVectorMultiAgentEnv"]

_POLL_S = 0.5  # how often an idle worker checks that its parent is still alive


def _describe(err: BaseException) -> tuple[str, str]:
    return f"{type(err).__name__}: {err}", traceback.format_exc()


def _worker(
    index: int,
    env_fn: CloudpickleWrapper,
    pipe: Any,
    parent_pipe: Any,
    ppid: int,
    restart_failed: bool = False,
) -> None:
    """Worker-process loop: build the env, then serve commands until told to close."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    parent_pipe.close()
    env = None
    try:
        env = env_fn.fn()
        obs_spaces, act_spaces, agents = single_spaces_of(env)
        pipe.send(("ok", (obs_spaces, act_spaces, agents)))
    except BaseException as err:  # noqa: BLE001 - reported to the parent
        pipe.send(("err", _describe(err)))
        pipe.close()
        return
    needs_reset = False
    while True:
        try:
            if not pipe.poll(_POLL_S):
                if not parent_alive(ppid):  # the parent died: do not linger as an orphan
                    break
                continue
            cmd, data = pipe.recv()
        except (EOFError, OSError):
            break
        try:
            if cmd == "step":
                try:
                    result, needs_reset = autoreset_step(env, agents, data, needs_reset)
                except Exception as err:
                    if not restart_failed:
                        raise
                    info = _describe(err)
                    env, result = restart_sub_env(env_fn.fn, env, index, err, log=False)
                    needs_reset = False
                    pipe.send(("restarted", (result, info)))
                    continue
            elif cmd == "reset":
                result = env.reset(seed=data[0], options=data[1])
                needs_reset = False
            elif cmd == "call":
                name, args, kwargs = data
                target = getattr(env, name) if hasattr(env, name) else getattr(env.unwrapped, name)
                result = target(*args, **kwargs) if callable(target) else target
            elif cmd == "get_attr":
                result = getattr(env.unwrapped, data)
            elif cmd == "set_attr":
                setattr(env.unwrapped, data[0], data[1])
                result = None
            elif cmd == "close":
                pipe.send(("ok", None))
                break
            else:
                raise ValueError(f"unknown command {cmd!r}")
            pipe.send(("ok", result))
        except Exception as err:  # noqa: BLE001 - reported to the parent
            pipe.send(("err", _describe(err)))
    try:
        env.close()
    except Exception:  # noqa: BLE001
        pass
    pipe.close()


class AsyncVectorMultiAgentEnv(VectorMultiAgentEnv):
    """Runs each ``MultiAgentEnv`` sub-env in its own worker process.

    Args:
        env_fns: Zero-argument functions, each building one ``MultiAgentEnv``
            (pickled with cloudpickle, so closures and lambdas work).
        context: The ``multiprocessing`` start method (``"fork"``, ``"spawn"``,
            ``"forkserver"``); None uses the platform default.
        daemon: Start the workers as daemon processes.
        timeout_s: Seconds to wait for each answer (None: no limit). A worker
            that exceeds it is reported by index and the env is shut down.
        autoreset_mode: Only ``"next_step"`` is supported.
        restart_failed: A worker whose sub-env's ``step`` raises recreates it and
            returns its reset observation instead; the parent marks it in ``failed``.

    Raises:
        SubEnvError: A sub-env could not be built.
        ValueError: An unsupported ``autoreset_mode``.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        *,
        context: str | None = None,
        daemon: bool = True,
        timeout_s: float | None = None,
        autoreset_mode: str = "next_step",
        restart_failed: bool = False,
    ):
        self._check_autoreset_mode(autoreset_mode)
        self.num_envs = len(env_fns)
        self.timeout_s = timeout_s
        self.restart_failed = restart_failed
        #: Per sub-env: recreated during the last ``step`` (``restart_failed``).
        self.failed = [False] * self.num_envs
        self.num_failures = 0
        self.closed = False
        self._waiting = False
        self._pipes: list[Any] = []
        self.processes: list[Any] = []
        ctx = mp.get_context(context)
        try:
            for i, fn in enumerate(env_fns):
                parent, child = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_worker,
                    name=f"AsyncVectorMultiAgentEnv-{i}",
                    args=(i, CloudpickleWrapper(fn), child, parent, os.getpid(), restart_failed),
                    daemon=daemon,
                )
                proc.start()
                child.close()
                self._pipes.append(parent)
                self.processes.append(proc)
            spaces = self._receive_all("building the env")
        except BaseException:
            self.close(terminate=True)
            raise
        self._set_spaces(*spaces[0])

    # -- communication ------------------------------------------------------------
    def _send_all(self, cmd: str, payloads: Sequence[Any]) -> None:
        if self.closed:
            raise RuntimeError(f"{type(self).__name__} is closed; create a new one.")
        if self._waiting:
            raise RuntimeError("a step is still pending: call step_wait() before a new command.")
        for i, (pipe, payload) in enumerate(zip(self._pipes, payloads)):
            try:
                pipe.send((cmd, payload))
            except (BrokenPipeError, OSError) as err:
                self._fail(i, f"its worker process is gone ({err!r}) while sending {cmd!r}")

    def _receive_all(self, what: str) -> list[Any]:
        """Collect one answer from every worker; raise the first error after all answered."""
        results: list[Any] = []
        errors: list[tuple[int, str, str]] = []
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        for i, pipe in enumerate(self._pipes):
            try:
                if deadline is not None and not pipe.poll(max(0.0, deadline - time.monotonic())):
                    self._fail(i, f"no answer within timeout_s={self.timeout_s} while {what}")
                status, payload = pipe.recv()
            except (EOFError, OSError) as err:
                code = self.processes[i].exitcode if i < len(self.processes) else None
                self._fail(i, f"its worker process died (exit code {code}) while {what} ({err!r})")
            if status == "err":
                errors.append((i, *payload))
                results.append(None)
            elif status == "restarted":
                result, (message, tb) = payload
                FAILURE_LOG.report(
                    "sub-env step",
                    message.split(":", 1)[0],
                    "Sub-environment %d raised %s in step(); recreated it (its partial episode "
                    "is dropped). Traceback in its worker process:",
                    i,
                    message,
                    traceback_text=tb,
                )
                self.failed[i] = True
                self.num_failures += 1
                results.append(result)
            else:
                results.append(payload)
        if errors:
            i, message, tb = errors[0]
            more = f" ({len(errors) - 1} other sub-env(s) failed too)" if len(errors) > 1 else ""
            raise SubEnvError(
                f"raised {message} while {what}{more}", sub_env_index=i, remote_traceback=tb
            )
        return results

    def _fail(self, index: int, message: str) -> NoReturn:
        self._waiting = False
        self.close(terminate=True)
        raise SubEnvError(message + "; the vector env was shut down.", sub_env_index=index)

    # -- the vector env API -------------------------------------------------------
    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict | None = None
    ) -> tuple[list[dict], list[dict]]:
        """Reset every sub-env in parallel (``seed`` int: sub-env i gets ``seed + i``)."""
        seeds = self._seeds(seed)
        self._send_all("reset", [(s, options) for s in seeds])
        results = self._receive_all("resetting")
        return [r[0] for r in results], [r[1] for r in results]

    def step_async(self, actions: Sequence[dict]) -> None:
        """Send each sub-env its action dict; collect the results with ``step_wait``."""
        if len(actions) != self.num_envs:
            raise ValueError(f"step() got {len(actions)} action dicts for {self.num_envs} sub-envs")
        self._send_all("step", actions)
        self._waiting = True
        if self.num_failures:
            self.failed = [False] * self.num_envs

    def step_wait(self) -> tuple[list, list, list, list, list]:
        """Wait for the step results of every sub-env."""
        if not self._waiting:
            raise RuntimeError("step_wait() without a pending step_async()")
        self._waiting = False
        results = self._receive_all("stepping")
        obs, rew, term, trunc, info = zip(*results)
        return list(obs), list(rew), list(term), list(trunc), list(info)

    def step(self, actions: Sequence[dict]) -> tuple[list, list, list, list, list]:
        """Step every sub-env in parallel (a sub-env that just ended is reset instead)."""
        self.step_async(actions)
        return self.step_wait()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple:
        """Call method ``name`` (or read attribute ``name``) on every sub-env."""
        self._send_all("call", [(name, args, kwargs)] * self.num_envs)
        return tuple(self._receive_all(f"calling {name!r}"))

    def get_attr(self, name: str) -> tuple:
        """Attribute ``name`` of every sub-env."""
        self._send_all("get_attr", [name] * self.num_envs)
        return tuple(self._receive_all(f"reading {name!r}"))

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` on every sub-env (one value, or one per sub-env)."""
        if not isinstance(values, list | tuple):
            values = [values] * self.num_envs
        self._send_all("set_attr", [(name, v) for v in values])
        self._receive_all(f"setting {name!r}")

    def render(self) -> tuple:
        """Render every sub-env."""
        return self.call("render")

    def close(self, *, terminate: bool = False, timeout: float = 5.0) -> None:  # type: ignore[override]
        """Stop every worker: ask them to exit, terminate those still alive after ``timeout``."""
        if self.closed:
            return
        self.closed = True
        if self._waiting and not terminate:
            try:
                for pipe in self._pipes:
                    if pipe.poll(timeout):
                        pipe.recv()
            except (EOFError, OSError):
                pass
        self._waiting = False
        if not terminate:
            for pipe, proc in zip(self._pipes, self.processes):
                if proc.is_alive():
                    try:
                        pipe.send(("close", None))
                    except (BrokenPipeError, OSError):
                        pass
        stop_worker_processes(self.processes, self._pipes, 0.0 if terminate else timeout)

    def __del__(self) -> None:
        try:
            if not getattr(self, "closed", True):
                self.close(terminate=True)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
