"""``SharedMemoryVectorEnv``: Python sub-envs stepped by worker processes over shared memory.

``num_workers`` processes each own a contiguous share of the sub-envs and step
that whole share per command. Observations, rewards, flags and actions live in
one shared buffer (a ``multiprocessing`` ``RawArray``, one row per sub-env per
field, ``Dict``/``Tuple`` observation and action spaces as one array per leaf),
so a step moves no array through a pipe. A command is a semaphore release per
worker; a finished share is a flag, a time stamp and one release of a shared
"done" semaphore: for a CartPole-sized result a semaphore round trip measured about
3x faster than a pipe's, an ``Event``'s slower still (``benchmarks/w1b_shared_memory.py``,
``signal_*``; on a loaded 2-core machine). Only non-empty infos, sub-env failures and the
answers to ``call``/``reset`` travel over each worker's pipe, after the results.
Idle waits block (with a timeout that checks the other side is still alive):
no core spins (on a loaded 2-core machine a bounded spin of the parent before blocking
lost where it kept a core from the workers, and came out even where it yielded the core
each turn). Stepping ready-first, the workers run
as ``SCHED_BATCH`` so that one woken by a command does not preempt the parent, which
is acting for the other sub-envs meanwhile; ``recv()`` waits for a worker that has not
even started its command 1 ms after it was sent (``_await_starved``), so that no share
is left behind while the parent keeps its core busy with the others.

It has the same API and episode rules as ``EnvPoolVectorEnv``: gymnasium's
``NEXT_STEP`` autoreset (the call after a sub-env's episode ended resets it,
ignores its action and returns its reset observation with reward 0 and both
flags False), ``infos`` as a list of per-sub-env dicts, and, when
``batch_size < num_envs``, ``async_reset()``/``recv()``/``send()`` acting on the
sub-envs that are ready first. Sub-env failures follow ``FastSyncVectorEnv``
(``restart_failed``, ``failed``, ``last_errors``, ``restart_sub_env``); a worker
process that dies, or hangs (no answer within ``timeout_s``: it is killed), is
replaced under ``restart_failed`` (its sub-envs reset, with the seeds of a reset it
died in, and reported as failed), else it is a ``VectorEnvWorkerDiedError``
(``VectorEnvWorkerHungError``) naming it and its sub-envs.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import multiprocessing as mp
import multiprocessing.synchronize as mp_synchronize
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import CloudpickleWrapper, batch_space

from envrunners.env.vector._sub_env_lifecycle import (
    parent_alive,
    process_alive,
    recreate_sub_env,
    stop_worker_processes,
    sub_env_seeds,
)
from envrunners.errors import (
    ConfigError,
    SubEnvError,
    VectorEnvWorkerDiedError,
    VectorEnvWorkerHungError,
)
from envrunners.sampling._overlap_choice import available_cpus
from envrunners.utils.failure_log import FAILURE_LOG

__all__ = [
    "SharedMemoryVectorEnv",
    "default_num_workers",
    "default_start_method",
]

logger = logging.getLogger("envrunners")

_STEP, _RESET, _RESTART, _CALL, _SET_ATTR, _CLOSE, _STEP_WITH = range(7)
_WORKER_POLL_S = 0.5  # an idle worker checks this often that its parent is alive
_PARENT_POLL_S = 0.2  # a waiting parent checks this often that its workers are alive
#: Ready-first receiving waits for a worker in flight this long (see ``_await_starved``).
_STARVED_S = 1e-3
#: At least this long for a worker to start: a forkserver's child unpickles its env
#: functions first, which imports their modules (``timeout_s`` then limits the build).
_START_S = 60.0
_ALIGN = 64
_NO_CONTEXT = contextlib.nullcontext()


# -- the shared buffer's layout ---------------------------------------------------------
def _leaves(space: gym.Space, what: str, path: tuple = ()) -> list[tuple[tuple, gym.Space]]:
    """``(path, leaf)`` of a possibly nested ``Dict``/``Tuple`` space of array leaves.

    Raises:
        ConfigError: a leaf that has no fixed shape and dtype (``Text``, ``Graph``,
            ``Sequence``...): it cannot have a row in shared memory.
    """
    if isinstance(space, gym.spaces.Dict):
        return [leaf for k, s in space.spaces.items() for leaf in _leaves(s, what, (*path, k))]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for i, s in enumerate(space.spaces) for leaf in _leaves(s, what, (*path, i))]
    if isinstance(
        space,
        gym.spaces.Box | gym.spaces.Discrete | gym.spaces.MultiDiscrete | gym.spaces.MultiBinary,
    ):
        return [(path, space)]
    where = "".join(f"[{p!r}]" for p in path)
    raise ConfigError(
        f"SharedMemoryVectorEnv: the {what} space{where and ' leaf at ' + where} {space!r} has "
        "no fixed shape and dtype; shared memory holds Box, Discrete, MultiDiscrete, "
        "MultiBinary and Dict/Tuple of those. Use gym_env_vectorize_mode='sync' or 'async'."
    )


def _nest(space: gym.Space, leaves: Any) -> Any:
    """The batch structure of ``space`` (dict / tuple / array) from its leaf arrays in order."""
    if isinstance(space, gym.spaces.Dict):
        return {k: _nest(s, leaves) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_nest(s, leaves) for s in space.spaces)
    return next(leaves)


def _flatten(space: gym.Space, value: Any) -> list:
    """``value``'s leaves in ``_leaves`` order."""
    if isinstance(space, gym.spaces.Dict):
        return [leaf for k, s in space.spaces.items() for leaf in _flatten(s, value[k])]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for s, v in zip(space.spaces, value, strict=True) for leaf in _flatten(s, v)]
    return [value]


class _Layout:
    """Where each shared array lives in the one byte buffer: per-sub-env rows of every
    observation and action leaf, rewards and flags, and per-worker control fields."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, num_envs: int, workers: int):
        self.obs_space, self.act_space = obs_space, act_space
        fields: list[tuple[str, np.dtype, tuple]] = []
        for n, (_, leaf) in enumerate(_leaves(obs_space, "observation")):
            fields.append((f"obs{n}", np.dtype(leaf.dtype), (num_envs, *leaf.shape)))
        for n, (_, leaf) in enumerate(_leaves(act_space, "action")):
            fields.append((f"act{n}", np.dtype(leaf.dtype), (num_envs, *leaf.shape)))
        fields += [
            ("rewards", np.dtype(np.float64), (num_envs,)),
            ("terms", np.dtype(np.bool_), (num_envs,)),
            ("truncs", np.dtype(np.bool_), (num_envs,)),
            ("cmd", np.dtype(np.int8), (workers,)),  # parent -> worker: what to do
            ("ready", np.dtype(np.int8), (workers,)),  # worker -> parent: results written
            ("has_msg", np.dtype(np.int8), (workers,)),  # a pipe message follows
            ("stamp", np.dtype(np.int64), (workers,)),  # when it finished (oldest first)
            ("picked", np.dtype(np.int8), (workers,)),  # worker -> parent: it took the command
        ]
        self.fields: list[tuple[str, np.dtype, tuple, int]] = []
        offset = 0
        for name, dtype, shape in fields:
            self.fields.append((name, dtype, shape, offset))
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            offset += -(-max(nbytes, 1) // _ALIGN) * _ALIGN
        self.nbytes = offset
        self.num_obs_leaves = len(_leaves(obs_space, "observation"))

    def views(self, buf: Any) -> dict[str, np.ndarray]:
        """Numpy arrays over ``buf`` (no copy), by field name."""
        out = {}
        for name, dtype, shape, offset in self.fields:
            count = int(np.prod(shape, dtype=np.int64))
            out[name] = np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(shape)
        return out

    def obs_leaves(self, views: dict) -> list[np.ndarray]:
        return [views[f"obs{n}"] for n in range(self.num_obs_leaves)]

    def act_leaves(self, views: dict) -> list[np.ndarray]:
        return [views[f"act{n}"] for n in range(len(_leaves(self.act_space, "action")))]


# -- the worker process -------------------------------------------------------------------
def _describe(err: BaseException) -> tuple[str, str, BaseException | None]:
    """``(type: message, traceback, the exception if it pickles)`` for the parent."""
    try:
        pickle.dumps(err)
        sent: BaseException | None = err
    except Exception:  # noqa: BLE001 - sent as text instead
        sent = None
    return f"{type(err).__name__}: {err}", "".join(traceback.format_exception(err)), sent


class _Worker:
    """One worker process's state: its sub-envs ``lo..hi-1`` and views of the buffer."""

    def __init__(self, index: int, lo: int, env_fns: list, views: dict, layout: _Layout):
        self.index, self.lo = index, lo
        self.env_fns = env_fns
        self.envs = [fn() for fn in env_fns]
        self.autoreset = [False] * len(self.envs)
        self.views = views
        self.obs_space = layout.obs_space
        self.act_space = layout.act_space
        self.obs_leaves = layout.obs_leaves(views)
        self.act_leaves = layout.act_leaves(views)
        self.flat_obs = len(self.obs_leaves) == 1 and not isinstance(
            layout.obs_space, gym.spaces.Dict | gym.spaces.Tuple
        )
        self.flat_act = not isinstance(layout.act_space, gym.spaces.Dict | gym.spaces.Tuple)
        self.restart_failed = False

    def write_obs(self, i: int, obs: Any) -> None:
        if self.flat_obs:
            self.obs_leaves[0][i] = obs
        else:
            for leaf, value in zip(self.obs_leaves, _flatten(self.obs_space, obs), strict=True):
                leaf[i] = value

    def action(self, i: int) -> Any:
        if self.flat_act:
            a = self.act_leaves[0][i]
            return a.copy() if isinstance(a, np.ndarray) else a
        rows = iter([leaf[i].copy() if leaf.ndim > 1 else leaf[i] for leaf in self.act_leaves])
        return _nest(self.act_space, rows)

    def restart(self, j: int, err: BaseException, phase: str, msg: dict) -> tuple[Any, dict]:
        """Recreate sub-env ``j`` after ``err`` (the parent logs it); note it in ``msg``."""
        self.envs[j], (obs, info) = recreate_sub_env(
            self.env_fns[j], self.envs[j], self.lo + j, err, phase=phase, log=False
        )
        self.autoreset[j] = False
        msg.setdefault("failed", []).append((j, phase, *_describe(err)))
        return obs, info

    def step(self, msg: dict) -> None:
        """Step (or autoreset) every sub-env of the share, writing rows in place."""
        v = self.views
        rewards, terms, truncs = v["rewards"], v["terms"], v["truncs"]
        autoreset, lo = self.autoreset, self.lo
        infos = None
        for j, env in enumerate(self.envs):
            i = lo + j
            try:
                if autoreset[j]:
                    phase = "reset"
                    obs, info = env.reset()
                    reward, term, trunc = 0.0, False, False
                else:
                    phase = "step"
                    obs, reward, term, trunc, info = env.step(self.action(i))
            except Exception as err:  # noqa: BLE001 - reported to the parent
                reward, term, trunc = 0.0, False, False
                if self.restart_failed:
                    obs, info = self.restart(j, err, phase, msg)
                else:  # the parent raises; the sub-env resets on its next step
                    msg.setdefault("errors", []).append((j, phase, *_describe(err)))
                    autoreset[j] = True
                    rewards[i], terms[i], truncs[i] = reward, term, trunc
                    continue
            self.write_obs(i, obs)
            rewards[i] = reward
            terms[i] = term
            truncs[i] = trunc
            autoreset[j] = term or trunc
            if info:
                if infos is None:
                    infos = msg["infos"] = []
                infos.append((j, info))

    def reset(self, seeds: list, options: dict | None, msg: dict) -> None:
        v = self.views
        infos = []
        for j, env in enumerate(self.envs):
            i = self.lo + j
            try:
                obs, info = env.reset(seed=seeds[j], options=options)
            except Exception as err:  # noqa: BLE001 - reported to the parent
                if not self.restart_failed:
                    msg.setdefault("errors", []).append((j, "reset", *_describe(err)))
                    infos.append({})
                    continue
                obs, info = self.restart(j, err, "reset", msg)
            self.write_obs(i, obs)
            infos.append(info)
        v["rewards"][self.lo : self.lo + len(self.envs)] = 0.0
        v["terms"][self.lo : self.lo + len(self.envs)] = False
        v["truncs"][self.lo : self.lo + len(self.envs)] = False
        self.autoreset = [False] * len(self.envs)
        nonempty = [(j, info) for j, info in enumerate(infos) if info]
        if nonempty:
            msg["infos"] = nonempty

    def call(self, name: str, args: tuple, kwargs: dict) -> list:
        results = []
        for env in self.envs:
            attr = env.get_wrapper_attr(name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        return results


def _no_wakeup_preemption() -> None:
    """Run this worker process as ``SCHED_BATCH`` (same nice level, same CPU share).

    A ``SCHED_BATCH`` process woken by a command does not preempt the task running on
    the core it lands on; it runs when a core frees (or at the next tick). Stepping
    ready-first, the parent sends one group's actions and goes on acting for the
    other group, so a woken worker that preempted it would stall the very inference
    it is meant to overlap. Where the OS has no such policy, nothing changes.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        pass


def _worker_main(
    index: int,
    lo: int,
    env_fns: CloudpickleWrapper,
    buf: Any,
    layout: _Layout,
    go: Any,
    done: Any,
    conn: Any,
    parent_conn: Any,
    ppid: int,
    restart_failed: bool,
    worker_cls: type = _Worker,
    yield_on_wake: bool = False,
) -> None:
    """Worker-process loop: build the share's sub-envs, then serve commands until told to close.

    ``worker_cls`` is ``_Worker`` or a subclass (``SharedMemoryVectorMultiAgentEnv``'s)
    that also takes ``_STEP_WITH``: a step whose per-sub-env data comes over the pipe.
    ``yield_on_wake``: run as ``SCHED_BATCH`` (``_no_wakeup_preemption``; the parent
    steps ready-first).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    parent_conn.close()
    conn.send(("started", None))  # (its arguments are unpickled: the build's clock starts)
    if yield_on_wake:
        _no_wakeup_preemption()
    views = layout.views(buf)
    try:
        worker = worker_cls(index, lo, list(env_fns.fn), views, layout)
        worker.restart_failed = restart_failed
        conn.send(("ok", None))
    except BaseException as err:  # noqa: BLE001 - reported to the parent
        conn.send(("err", _describe(err)[:2]))
        conn.close()
        return
    cmd_of, ready, has_msg, stamp = views["cmd"], views["ready"], views["has_msg"], views["stamp"]
    picked = views["picked"]
    while True:
        if not go.acquire(timeout=_WORKER_POLL_S):
            if not parent_alive(ppid):  # the parent died: do not linger as an orphan
                break
            continue
        picked[index] = 1
        cmd = int(cmd_of[index])
        if cmd == _CLOSE:
            break
        msg: dict = {}
        try:
            if cmd == _STEP:
                worker.step(msg)
            else:
                data = conn.recv()
                if cmd == _RESET:
                    worker.reset(data[0], data[1], msg)
                    if len(data) > 2:  # a respawned worker: its sub-envs count as failed
                        for j in range(len(worker.envs)):
                            text = f"{type(data[2]).__name__}: {data[2]}"
                            msg.setdefault("failed", []).append((j, "step", text, "", data[2]))
                elif cmd == _RESTART:
                    j, error = data
                    obs, info = worker.restart(j, error, "step", msg)
                    worker.write_obs(lo + j, obs)
                    msg["infos"] = [(j, info)]
                elif cmd == _CALL:
                    msg["result"] = worker.call(*data)
                elif cmd == _STEP_WITH:
                    worker.step_with(data, msg)
                elif cmd == _SET_ATTR:
                    name, values = data
                    for env, value in zip(worker.envs, values, strict=True):
                        env.set_wrapper_attr(name, value)
        except Exception as err:  # noqa: BLE001 - a command's own failure, reported
            msg["command_error"] = _describe(err)[:2]
        has_msg[index] = 1 if msg else 0
        stamp[index] = time.monotonic_ns()
        ready[index] = 1
        done.release()
        if msg:
            try:
                conn.send(msg)
            except (BrokenPipeError, OSError):
                break
            except Exception as err:  # noqa: BLE001 - an info that does not pickle
                conn.send({"command_error": (f"the worker's answer does not pickle: {err!r}", "")})
    for env in worker.envs:
        try:
            env.close()
        except Exception:  # noqa: BLE001
            pass
    conn.close()


# -- the parent side ------------------------------------------------------------------------
def default_start_method() -> str | None:
    """The ``multiprocessing`` start method for workers when none is given.

    ``"fork"`` where it is the platform's default and this process runs one thread
    (fast: nothing is pickled or imported again). Where other threads run (EnvPool's,
    OpenCV's or BLAS's pools, Ray's core worker, torch's) a forked child inherits
    their locks and half-built state without the threads, and can crash or hang in
    native code: a Pong worker forked after EnvPool had run in the process died with
    SIGSEGV while building its sub-envs. There ``"forkserver"``: workers are forked
    from a clean single-threaded server process. None (the platform's default) where
    threads cannot be counted or fork is not the default.
    """
    if mp.get_start_method(allow_none=True) not in (None, "fork"):
        return None
    if "fork" not in mp.get_all_start_methods() or "forkserver" not in mp.get_all_start_methods():
        return None
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        return None
    return "fork" if threads <= 1 else "forkserver"


def _start_method(context: str | None, env_fns: list) -> str | None:
    """``context``, or the default start method for these env functions: ``"fork"``
    where ``"forkserver"`` cannot pickle them (with a warning that says why)."""
    if context is not None:
        return context
    method = default_start_method()
    if method != "forkserver":
        return method
    try:
        CloudpickleWrapper(env_fns).__getstate__()
    except Exception as err:  # noqa: BLE001 - any pickling failure: fall back to fork
        logger.warning(
            "SharedMemoryVectorEnv: this process runs several threads, so its workers "
            "would start from a forkserver, but the env functions cannot be pickled "
            "(%s: %s); forking this process instead, which can crash a worker in native "
            "code. Make the env creator picklable (a module-level function or class).",
            type(err).__name__,
            err,
        )
        return "fork"
    mp.get_context("forkserver").set_forkserver_preload([__name__])
    return "forkserver"


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


#: Start of the names of our semaphores: ``envrunners-<pid namespace>-<pid>-<random>``.
_SEM_PREFIX = f"envrunners-{_pid_namespace()}-"


class _PidNamedSemaphore(mp_synchronize.Semaphore):
    """A ``multiprocessing`` semaphore whose name says which process made it.

    Why: outside fork, a semaphore is a named entry in ``/dev/shm`` until the
    object that made it is collected; if that process is killed, Python's resource
    tracker unlinks it, but a Ray node that shuts down kills the tracker too (a
    script ending without ``algo.stop()`` left one entry per worker and vector env).
    With the maker's pid in the name, ``_sweep_stale_semaphores`` removes the
    entries of processes that are gone.
    """

    @staticmethod
    def _make_name() -> str:
        return f"/{_SEM_PREFIX}{os.getpid()}-{next(mp_synchronize.SemLock._rand)}"


def _sweep_stale_semaphores(shm_dir: str = "/dev/shm") -> int:
    """Unlink the semaphores of our processes (this pid namespace's) that are gone; how many.

    Harmless for a live process: unlinking a name never closes an open semaphore,
    and only names of processes that no longer run are touched.
    """
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return 0
    from _multiprocessing import sem_unlink

    prefix = "sem." + _SEM_PREFIX  # (the file of semaphore "/x" is "sem.x")
    removed = 0
    for name in names:
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix) :].split("-", 1)[0]
        if not pid.isdigit() or process_alive(int(pid)):
            continue
        try:
            sem_unlink("/" + name[len("sem.") :])
            removed += 1
        except OSError:  # (another process swept it first)
            pass
    return removed


#: Serializes worker starts that hide the main module (see ``_main_module_hidden``).
_START_LOCK = threading.Lock()


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start processes (forkserver / spawn) without the parent's main module.

    ``multiprocessing`` runs the parent's ``__main__`` script again in each such child
    (as ``__mp_main__``) before its target: a training script without an
    ``if __name__ == "__main__"`` guard would build its runners once more in every
    worker, and fail there. The workers need nothing from it (their env creators
    come by value, through cloudpickle), so the main-module entries are left out of
    the preparation data while this is entered.
    """
    from multiprocessing import spawn

    original = spawn.get_preparation_data

    def without_main(name: str) -> dict:
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    with _START_LOCK:
        spawn.get_preparation_data = without_main
        try:
            yield
        finally:
            spawn.get_preparation_data = original


def default_num_workers(num_envs: int, batch_size: int | None = None) -> int:
    """Worker processes for ``num_envs`` sub-envs: one per CPU core this process may run
    on (its affinity, as ``taskset`` or a container's cpuset leaves it), at most one per
    sub-env.

    With ``batch_size < num_envs`` every worker gets an equal share that divides
    ``batch_size``: the fewest such workers that still use every core (16 envs,
    batch 8: 2 workers on 2 cores, 16 on 16 cores).
    """
    target = min(num_envs, available_cpus())
    if batch_size is None or batch_size >= num_envs:
        return target
    share = max(
        s
        for s in range(1, batch_size + 1)
        if num_envs % s == 0 and batch_size % s == 0 and num_envs // s >= target
    )
    return num_envs // share


class SharedMemoryVectorEnv(gym.vector.VectorEnv):
    """``len(env_fns)`` sub-envs stepped by ``num_workers`` processes over shared memory.

    Worker ``w`` owns the contiguous sub-envs ``shares[w]`` (``np.array_split`` of
    the ids) and steps them in order each time it is told to. With
    ``batch_size < num_envs`` (asynchronous) the shares must be equal and
    ``batch_size`` a multiple of the share: ``recv()`` returns the
    ``batch_size // share`` workers that finished first, oldest first.

    Args:
        env_fns: Zero-arg functions, each building one sub-env (pickled with
            cloudpickle when ``context`` is not ``"fork"``).
        num_workers: Worker processes (default: ``default_num_workers``).
        batch_size: Sub-envs per ``recv()`` (``None`` = ``num_envs``: synchronous).
        context: The ``multiprocessing`` start method (None: ``default_start_method``,
            ``"fork"`` for a single-threaded process, else ``"forkserver"``).
        restart_failed: Recreate a sub-env whose ``reset``/``step`` raises instead of
            raising; the call then reports it in ``failed``/``last_errors``.
        copy: Return copies (``False``: ``step``/``reset`` return views of the shared
            buffer, which the next command overwrites; ``recv`` always copies).
        observation_space, action_space: The single sub-env's spaces; when both are
            given, no sub-env is built in this process to read them.
        timeout_s: Seconds a worker may take to build its sub-envs or to answer a
            command (None: no limit; the runner passes ``sample_timeout_s``). A
            worker past it is killed, then replaced (``restart_failed``) or reported
            as ``VectorEnvWorkerHungError``. Checked while waiting, so a hang is
            noticed up to about 0.2 s after the limit.
        worker_cls: What steps a share in each worker: ``_Worker``, or a subclass whose
            ``step_with(data, msg)`` takes the ``payloads`` of ``step``/``send``
            (``SharedMemoryVectorMultiAgentEnv`` builds this env with its own).

    Raises:
        ConfigError: a bad ``num_workers``/``batch_size``/``timeout_s`` (naming what
            is expected), or a space with no fixed shape and dtype.
        SubEnvError: a sub-env could not be built in its worker.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        num_workers: int | None = None,
        batch_size: int | None = None,
        context: str | None = None,
        restart_failed: bool = False,
        copy: bool = True,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        timeout_s: float | None = None,
        worker_cls: type = _Worker,
    ):
        self.closed = False
        self._worker_cls = worker_cls
        self.processes: list[Any] = []
        self._conns: list[Any] = []
        n = self.num_envs = len(env_fns)
        if n < 1:
            raise ConfigError("SharedMemoryVectorEnv needs at least one env function, got none")
        self.batch_size = n if batch_size is None else int(batch_size)
        if not 1 <= self.batch_size <= n:
            raise ConfigError(
                f"SharedMemoryVectorEnv: batch_size must be in [1, num_envs={n}], "
                f"got {batch_size!r}"
            )
        w = default_num_workers(n, self.batch_size) if num_workers is None else int(num_workers)
        if not 1 <= w <= n:
            raise ConfigError(
                f"SharedMemoryVectorEnv: num_workers must be in [1, num_envs={n}], "
                f"got {num_workers!r}"
            )
        if self.batch_size < n:
            if n % w:
                raise ConfigError(
                    f"SharedMemoryVectorEnv: batch_size={self.batch_size} < num_envs={n} needs "
                    f"equal worker shares, but num_envs={n} does not split evenly over "
                    f"num_workers={w}; use a num_workers that divides {n}."
                )
            if self.batch_size % (n // w):
                raise ConfigError(
                    f"SharedMemoryVectorEnv: batch_size={self.batch_size} is not a multiple of "
                    f"the per-worker share {n // w} (num_envs={n} over num_workers={w}); a "
                    f"worker's sub-envs become ready together, so use a multiple of {n // w}, "
                    "or a num_workers whose share divides batch_size."
                )
        if timeout_s is not None and not (
            isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool) and timeout_s > 0
        ):
            raise ConfigError(
                f"SharedMemoryVectorEnv: timeout_s must be a positive number of seconds or "
                f"None (no limit), got {timeout_s!r}"
            )
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        #: Per busy worker: (its stamp when first seen busy, when that was); a stamp that
        #: has not moved for ``timeout_s`` means the worker is stuck on one command.
        self._busy_since: dict[int, tuple[int, float]] = {}
        self.num_workers = w
        self.copy = copy
        self.restart_failed = restart_failed
        self.env_fns = list(env_fns)
        self.shares = [s for s in np.array_split(np.arange(n), w)]
        #: ``worker_of[i]``: the worker that owns sub-env ``i``.
        self.worker_of = np.repeat(np.arange(w), [len(s) for s in self.shares])
        #: Per worker: the ``(seeds, options)`` of the last reset it was told to do (for a
        #: replacement of a worker that died during that reset).
        self._reset_payloads: list[Any] = [([None] * len(share), None) for share in self.shares]
        self._read_spaces(observation_space, action_space)
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self._layout = _Layout(self.single_observation_space, self.single_action_space, n, w)
        ctx = self._ctx = mp.get_context(_start_method(context, self.env_fns))
        self._buf = ctx.RawArray(ctypes.c_uint8, self._layout.nbytes)
        self._views = self._layout.views(self._buf)
        v = self._views
        self._cmd, self._ready, self._has_msg = v["cmd"], v["ready"], v["has_msg"]
        self._stamp, self._picked = v["stamp"], v["picked"]
        self._obs_leaves = self._layout.obs_leaves(v)
        self._act_leaves = self._layout.act_leaves(v)
        self._obs = _nest(self.single_observation_space, iter(self._obs_leaves))
        self._flat_act = len(self._act_leaves) == 1 and not isinstance(
            self.single_action_space, gym.spaces.Dict | gym.spaces.Tuple
        )
        if ctx.get_start_method() != "fork":
            _sweep_stale_semaphores()
        self._done = self._semaphore()
        self._go = [self._semaphore() for _ in range(w)]
        #: Per worker: told to step and not consumed by ``recv``/``step`` yet.
        self._in_flight = np.zeros(w, dtype=np.bool_)
        #: Per worker: when it was told to work (``time.monotonic()``), inf once consumed.
        self._sent_at = [math.inf] * w
        self._tokens = 0  # "done" releases acquired but not matched to a consumed worker
        self._checked_at = time.monotonic()  # when workers were last checked to be alive
        self._all_workers = list(range(w))
        self._first_rows = [int(share[0]) for share in self.shares]
        #: Per worker: its sub-envs' rows (a slice) and ids (as ``recv`` returns them).
        self._share_rows = [slice(int(s[0]), int(s[-1]) + 1) for s in self.shares]
        self._share_ids = [s.astype(np.int32) for s in self.shares]
        #: Workers per ``recv()`` (with ``batch_size < num_envs``; equal shares).
        self._recv_workers = self.batch_size // len(self.shares[0])
        #: ``(env_ids, workers, rows)`` of the last ``recv()`` until they are sent.
        self._last_recv: tuple[np.ndarray, list[int], Any] | None = None
        #: Sub-envs recreated (after an exception) during the last reset/step/recv.
        self.failed = np.zeros(n, dtype=np.bool_)
        #: Total number of sub-env failures recovered so far.
        self.num_failures = 0
        #: (index, exception) of every failure in the last call, for logging/metrics.
        self.last_errors: list[tuple[int, BaseException]] = []
        try:
            for k in range(w):
                self._conns.append(None)
                self.processes.append(None)
                self._start_worker(k)
            for k in range(w):
                self._await_built(k)
        except BaseException:
            self.close(terminate=True)
            raise

    def _semaphore(self) -> mp_synchronize.Semaphore:
        """A semaphore (value 0) of this env's start method, named after this process."""
        return _PidNamedSemaphore(0, ctx=self._ctx)

    def _start_worker(self, k: int) -> None:
        """Start worker ``k``'s process (it builds its share's sub-envs and says so)."""
        parent, child = self._ctx.Pipe(duplex=True)
        share = self.shares[k]
        proc = self._ctx.Process(
            target=_worker_main,
            name=f"SharedMemoryVectorEnv-worker-{k}",
            args=(
                k,
                int(share[0]),
                CloudpickleWrapper([self.env_fns[i] for i in share]),
                self._buf,
                self._layout,
                self._go[k],
                self._done,
                child,
                parent,
                os.getpid(),
                self.restart_failed,
                self._worker_cls,
                self.is_async,
            ),
            daemon=True,
        )
        with _main_module_hidden() if self._ctx.get_start_method() != "fork" else _NO_CONTEXT:
            proc.start()
        child.close()
        self._conns[k] = parent
        self.processes[k] = proc

    def _await_built(self, k: int) -> None:
        """Wait for worker ``k`` to have built its sub-envs.

        Raises:
            SubEnvError: one of them raised while being built.
            VectorEnvWorkerDiedError: the worker died first.
        """
        conn, timeout = self._conns[k], self.timeout_s
        for what, limit in (
            ("starting", None if timeout is None else max(timeout, _START_S)),
            ("building its sub-envs", timeout),
        ):
            try:
                if limit is not None and not conn.poll(limit):
                    self._worker_hung(k, what, respawn=False)
                status, payload = conn.recv()
            except (EOFError, OSError):
                self._worker_died(k, what, respawn=False)
        if status == "err":
            raise SubEnvError(
                f"raised {payload[0]} while being built (in worker {k})",
                sub_env_index=int(self.shares[k][0]),
                remote_traceback=payload[1],
            )

    def _read_spaces(self, obs_space: gym.Space | None, act_space: gym.Space | None) -> None:
        """Spaces and metadata from the caller, or from a sub-env built here and closed."""
        first = None
        if obs_space is None or act_space is None:
            first = self.env_fns[0]()
            obs_space = obs_space or first.observation_space
            act_space = act_space or first.action_space
        self.single_observation_space = obs_space
        self.single_action_space = act_space
        self.metadata = dict(getattr(first, "metadata", {}) or {})
        self.metadata["autoreset_mode"] = gym.vector.AutoresetMode.NEXT_STEP
        self.render_mode = getattr(first, "render_mode", None)
        self.spec = getattr(first, "spec", None)
        if first is not None:
            try:
                first.close()
            except Exception:  # noqa: BLE001
                logger.warning("closing the sub-env built to read the spaces failed", exc_info=True)

    @property
    def is_async(self) -> bool:
        """Whether ``recv()`` returns fewer than ``num_envs`` sub-envs (``batch_size < num_envs``)."""
        return self.batch_size < self.num_envs

    # -- commands and answers -------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("SharedMemoryVectorEnv is closed; create a new one.")

    def _command(self, workers: Sequence[int], cmd: int, payloads: Sequence[Any] | None) -> None:
        """Tell ``workers`` to run ``cmd`` (``payloads[k]`` over worker ``k``'s pipe first).

        A worker found dead while sent a ``_STEP_WITH`` is respawned under
        ``restart_failed`` (its reset answers for the step, as in ``_acquire``).
        """
        cmd_arr, go, in_flight, sent_at = self._cmd, self._go, self._in_flight, self._sent_at
        picked = self._picked
        now = time.monotonic()
        for n, k in enumerate(workers):
            if payloads is not None:
                try:
                    self._conns[k].send(payloads[n])
                except (BrokenPipeError, OSError):
                    self._worker_died(k, "receiving a command", respawn=cmd == _STEP_WITH)
                    continue
            cmd_arr[k] = cmd
            in_flight[k] = True
            sent_at[k] = now
            picked[k] = 0
            go[k].release()

    def _acquire(self, count: int, what: str) -> None:
        """Take ``count`` "done" releases, checking every poll that in-flight workers live.

        Ready-first receiving may never starve while one worker is dead (the others
        keep answering), so their liveness is also checked every ``_PARENT_POLL_S``.
        """
        done = self._done
        now = time.monotonic()
        if now - self._checked_at > _PARENT_POLL_S:
            self._checked_at = now
            self._check_alive(what)
        while self._tokens < count:
            if done.acquire(timeout=_PARENT_POLL_S):
                self._tokens += 1
                continue
            self._check_alive(what)

    def _await_starved(self, what: str) -> None:
        """Wait for a worker told to work over ``_STARVED_S`` ago that has not started yet.

        Why: with more processes than cores, a worker woken on the acting parent's core
        (``SCHED_BATCH``: it does not preempt) runs only when the parent blocks or at the
        next scheduler tick. When the other worker always answers in time, the parent
        never blocks: in 400-step calls of CartPole x 16 (2 workers, 2 cores) one share
        stepped 2-4 times while the other stepped 49. Blocking on it once lets it run, and
        the two then keep alternating. A worker that has started (``picked``) is not
        waited for, however slowly it steps: ready-first still takes the faster shares.
        """
        sent_at = self._sent_at
        now = time.monotonic()
        if now - min(sent_at) <= _STARVED_S:  # (the usual case, in well under a microsecond)
            return
        ready, picked = self._ready, self._picked
        late = [
            (sent, k)
            for k, sent in enumerate(sent_at)
            if now - sent > _STARVED_S and not ready[k] and not picked[k]
        ]
        if not late:
            return
        self._await_answer(min(late)[1], what)

    def _await_answer(self, k: int, what: str) -> None:
        """Wait until in-flight worker ``k`` has answered, taking one more "done" release
        at a time (other workers' answers meanwhile stay as tokens for later calls)."""
        in_flight, ready = self._in_flight, self._ready
        while in_flight[k] and not ready[k]:
            self._acquire(self._tokens + 1, what)

    def _check_alive(self, what: str) -> None:
        """Handle every worker that was told to work and has not answered: a dead one
        (``_worker_died``), or one stuck on its command for ``timeout_s`` (``_worker_hung``).

        A worker's stamp moves with every answer, so a busy worker whose stamp has not
        moved since it was first seen busy is still on that command: no per-command
        bookkeeping is needed.
        """
        busy = np.flatnonzero(self._in_flight & (self._ready == 0)).tolist()
        timeout, since = self.timeout_s, self._busy_since
        now = time.monotonic()
        for k in busy:
            if self.processes[k].exitcode is not None:
                since.pop(k, None)
                self._worker_died(k, what)
            elif timeout is not None:
                stamp = int(self._stamp[k])
                seen = since.get(k)
                if seen is None or seen[0] != stamp:
                    since[k] = (stamp, now)
                elif now - seen[1] > timeout:
                    del since[k]
                    self._worker_hung(k, what)

    def _worker_hung(self, k: int, what: str, *, respawn: bool = True) -> None:
        """Worker ``k`` has not answered within ``timeout_s``: kill it, then replace it or
        raise ``VectorEnvWorkerHungError`` (as ``_worker_died``)."""
        proc = self.processes[k]
        pid = proc.pid if proc is not None else None
        ids = self.shares[k]
        if self._ready[k] and respawn:  # it answered just now: nothing to replace
            return
        error = VectorEnvWorkerHungError(
            f"worker {k} (pid {pid}, sub-envs {int(ids[0])}..{int(ids[-1])}) did not answer "
            f"within timeout_s={self.timeout_s} while {what}; it was killed",
            worker_index=k,
            sub_env_indices=[int(i) for i in ids],
            timeout_s=float(self.timeout_s or 0.0),
        )
        if proc is not None and proc.exitcode is None:
            proc.kill()
            proc.join(5.0)
        self._replace_or_raise(k, error, respawn)

    def _worker_died(self, k: int, what: str, *, respawn: bool = True) -> None:
        """Worker ``k`` is gone: with ``restart_failed`` (and ``respawn``) start a new one
        whose reset sub-envs count as failed in the call that waits for them; otherwise
        shut the env down and raise ``VectorEnvWorkerDiedError``."""
        proc = self.processes[k] if k < len(self.processes) else None
        code = pid = None
        if proc is not None:
            proc.join(0.1)
            code, pid = proc.exitcode, proc.pid
        ids = self.shares[k]
        error = VectorEnvWorkerDiedError(
            f"worker {k} (pid {pid}, sub-envs {int(ids[0])}..{int(ids[-1])}) died with exit "
            f"code {code} while {what}",
            worker_index=k,
            sub_env_indices=[int(i) for i in ids],
        )
        self._replace_or_raise(k, error, respawn)

    def _replace_or_raise(self, k: int, error: VectorEnvWorkerDiedError, respawn: bool) -> None:
        """Start a new worker ``k`` (``restart_failed`` and ``respawn``), or shut the env
        down and raise ``error``."""
        if respawn and self.restart_failed and not self.closed:
            self._respawn(k, error)
            return
        self.close(terminate=True)
        error.args = (f"{error.args[0]}; the vector env was shut down.",)
        raise error

    def _respawn(self, k: int, error: VectorEnvWorkerDiedError) -> None:
        """Replace dead worker ``k``: a new process builds and resets its sub-envs, and
        reports each as failed with ``error`` when it answers (like a recreated sub-env).

        A worker that died during a reset is replaced by one that resets with that
        reset's seeds and options (the reset returns what an undisturbed one would);
        otherwise its sub-envs start unseeded episodes.
        """
        resetting = int(self._cmd[k]) == _RESET
        old = self.processes[k]
        try:
            self._conns[k].close()
            old.close()
        except (OSError, ValueError):  # pragma: no cover
            pass
        self._go[k] = self._semaphore()  # the dead worker may have left a token
        self._ready[k] = 0
        self._start_worker(k)
        self._await_built(k)
        self._busy_since.pop(k, None)
        if not resetting:  # (a replacement that dies in its own reset gets the same seeds)
            self._reset_payloads[k] = ([None] * len(self.shares[k]), None)
        seeds, options = self._reset_payloads[k]
        self._command([k], _RESET, [(seeds, options, error)])

    def _consume(self, workers: Sequence[int], infos: list, rows: Sequence[int], what: str) -> None:
        """Mark ``workers`` consumed and apply their pipe messages.

        ``infos`` is the returned list, ``rows[n]`` the row of ``workers[n]``'s first sub-env.
        """
        ready, in_flight, has_msg = self._ready, self._in_flight, self._has_msg
        sent_at = self._sent_at
        self._tokens -= len(workers)
        errors: list[tuple[int, str, str, str, Any]] = []
        lost: list[tuple[int, int]] = []
        for k, row in zip(workers, rows, strict=True):
            ready[k] = 0  # (a scalar store per worker: cheaper than indexing with the list)
            in_flight[k] = False
            sent_at[k] = math.inf
            if not has_msg[k]:
                continue
            try:
                msg = self._conns[k].recv()
            except (EOFError, OSError):  # it died after answering, before its message went
                if not self.restart_failed or self.closed:
                    self._worker_died(k, what, respawn=False)
                lost.append((k, row))
                continue
            lo = int(self.shares[k][0])
            for j, info in msg.get("infos", ()):
                infos[row + j] = info
            for j, phase, text, tb, err in msg.get("failed", ()):
                self._note_failure(lo + j, phase, text, tb, err)
            for j, phase, text, tb, err in msg.get("errors", ()):
                errors.append((lo + j, phase, text, tb, err))
            if "command_error" in msg:
                text, tb = msg["command_error"]
                errors.append((lo, what, text, tb, None))
            if "result" in msg:
                infos[row : row + len(self.shares[k])] = msg["result"]
        for k, row in lost:
            self._replace_answer(k, row, infos, what)
        if errors:
            i, phase, text, tb, err = errors[0]
            more = f" ({len(errors) - 1} other sub-env(s) failed too)" if len(errors) > 1 else ""
            raise SubEnvError(
                f"raised {text} in {phase}(){more}", sub_env_index=i, remote_traceback=tb
            ) from err

    def _replace_answer(self, k: int, row: int, infos: list, what: str) -> None:
        """Worker ``k`` died between answering and sending its message (``restart_failed``):
        replace it and wait for the replacement's reset, whose sub-envs count as failed and
        stand in this answer's rows (as when a worker dies while stepping).

        Why: the lost message may have held the sub-envs' infos or failures, so the
        stepped rows cannot be trusted; the caller reads the rows after this.
        """
        proc = self.processes[k]
        if proc is not None and proc.exitcode is None:  # (its pipe broke; it is not gone yet)
            proc.kill()
            proc.join(5.0)
        self._worker_died(k, what)
        self._await_answer(k, "resetting a replaced worker")
        self._consume([k], infos, [row], "resetting a replaced worker")

    def _note_failure(
        self, i: int, phase: str, text: str, tb: str, err: BaseException | None
    ) -> None:
        """Record that sub-env ``i`` was recreated after ``err`` (as ``FastSyncVectorEnv``)."""
        self.failed[i] = True
        self.num_failures += 1
        error = err if err is not None else SubEnvError(text, sub_env_index=i, remote_traceback=tb)
        self.last_errors.append((i, error))
        if not text.startswith("StepFailedRecreateEnvError"):
            FAILURE_LOG.report(
                f"sub-env {phase}",
                text.split(":", 1)[0],
                "Sub-environment %d raised %s in %s(); recreated it (its partial episode is "
                "dropped). Traceback in its worker process:",
                i,
                text,
                phase,
                traceback_text=tb,
            )

    def _clear_failures(self) -> None:
        if self.last_errors:
            self.failed[:] = False
            self.last_errors = []

    def _all(self, cmd: int, payloads: Sequence[Any] | None, what: str) -> list:
        """Run ``cmd`` on every worker and wait for all; the per-sub-env infos/results."""
        self._check_open()
        if self._in_flight.any():
            if self.is_async:
                raise RuntimeError(
                    f"SharedMemoryVectorEnv: {what} while sub-envs "
                    f"{np.flatnonzero(self._in_flight[self.worker_of]).tolist()} are stepping; "
                    "recv() them first."
                )
            self._drain()  # left by an interrupted call
        workers = self._all_workers
        self._command(workers, cmd, payloads)
        self._acquire(self.num_workers, what)
        infos: list = [{} for _ in range(self.num_envs)]
        self._consume(workers, infos, self._first_rows, what)
        return infos

    def _drain(self) -> None:
        """Wait for every stepping worker and drop its results (errors included)."""
        busy = np.flatnonzero(self._in_flight).tolist()
        if not busy:
            return
        self._acquire(len(busy), "finishing a step whose results are dropped")
        try:
            self._consume(busy, [{}] * self.num_envs, [0] * len(busy), "a dropped step")
        except VectorEnvWorkerDiedError:
            raise
        except SubEnvError:
            pass

    def _refuse_if_async(self, what: str) -> None:
        if self.is_async:
            raise ConfigError(
                f"SharedMemoryVectorEnv with batch_size={self.batch_size} < num_envs="
                f"{self.num_envs} is asynchronous: start it with async_reset(), then "
                f"recv()/send() (not {what})."
            )

    def _out(self, x: Any) -> Any:
        if not self.copy:
            return x
        if isinstance(x, np.ndarray):
            return x.copy()
        if isinstance(x, dict):
            return {k: self._out(v) for k, v in x.items()}
        return tuple(self._out(v) for v in x)

    def _write_actions(self, actions: Any, rows: Any) -> None:
        if self._flat_act:
            self._act_leaves[0][rows] = actions
            return
        for leaf, value in zip(
            self._act_leaves, _flatten(self.single_action_space, actions), strict=True
        ):
            leaf[rows] = value

    # -- gymnasium VectorEnv API ------------------------------------------------------------
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict | None = None
    ) -> tuple[Any, list[dict]]:
        """Reset every sub-env; an int seed gives sub-env ``i`` the seed ``seed + i``.

        Raises:
            ConfigError: asynchronous envs start with ``async_reset()``.
        """
        self._refuse_if_async("reset()")
        infos = self._reset_all(seed, options)
        return self._out(self._obs), infos

    def _reset_all(self, seed: Any, options: dict | None) -> list[dict]:
        seeds = sub_env_seeds(seed, self.num_envs)
        self._clear_failures()
        payloads = self._reset_payloads = [
            ([seeds[i] for i in share], options) for share in self.shares
        ]
        return self._all(_RESET, payloads, "resetting")

    def step(
        self, actions: Any, *, payloads: Sequence[Any] | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        """Step every sub-env in parallel; one whose last step ended its episode is reset
        instead (its action ignored, reward 0, flags False).

        ``payloads``: per sub-env, data a ``worker_cls`` with ``step_with`` steps with,
        sent over the pipes (then ``actions`` may be empty).
        """
        self._refuse_if_async("step()")
        self._clear_failures()
        self._write_actions(actions, slice(None))
        if payloads is None:
            infos = self._all(_STEP, None, "stepping")
        else:
            infos = self._all(
                _STEP_WITH, [list(payloads[s[0] : s[-1] + 1]) for s in self.shares], "stepping"
            )
        v = self._views
        return (
            self._out(self._obs),
            self._out(v["rewards"]),
            self._out(v["terms"]),
            self._out(v["truncs"]),
            infos,
        )

    # -- asynchronous API (EnvPool's send/recv) -----------------------------------------------
    def async_reset(self, *, seed: Any = None, options: dict | None = None) -> None:
        """Reset every sub-env without waiting; ``recv()`` returns them as they are ready
        (with reward 0 and flags False). ``seed`` as in ``reset``."""
        self._check_open()
        self._drain()
        seeds = sub_env_seeds(seed, self.num_envs)
        self._clear_failures()
        payloads = self._reset_payloads = [
            ([seeds[i] for i in share], options) for share in self.shares
        ]
        self._command(range(self.num_workers), _RESET, payloads)

    def recv(self) -> tuple[np.ndarray, Any, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        """The next ``batch_size`` ready sub-envs: ``(env_ids, obs, rewards, terminated,
        truncated, infos)``, row ``j`` belonging to sub-env ``env_ids[j]``.

        Whole worker shares, the longest-finished first; a worker that has not started
        its step 1 ms after it was sent is waited for (see ``_await_starved``), one that
        is stepping is not, however slowly. A sub-env whose previous result
        ended its episode comes back reset (reward 0, flags False) after its next
        ``send``, whatever action that carried. ``failed[env_ids]`` marks the returned
        sub-envs that were recreated after an error.

        Raises:
            RuntimeError: fewer than ``batch_size`` sub-envs are stepping (``send`` first).
            VectorEnvWorkerDiedError: a worker this call waits for died.
        """
        self._check_open()
        k = self._recv_workers
        if np.count_nonzero(self._in_flight) < k:
            raise RuntimeError(
                f"SharedMemoryVectorEnv.recv(): only {int(self._in_flight.sum()) * len(self.shares[0])}"
                f" sub-envs are stepping, fewer than batch_size={self.batch_size}; send() the "
                "actions of the sub-envs you received (or async_reset()) first."
            )
        self._clear_failures()
        self._await_starved("stepping")
        self._acquire(k, "stepping")
        in_flight = self._in_flight
        workers = [w for w, r in enumerate(self._ready.tolist()) if r and in_flight[w]]
        if len(workers) > k:  # the longest-finished first
            workers.sort(key=self._stamp.__getitem__)
            del workers[k:]
        if k == 1:
            rows: Any = self._share_rows[workers[0]]
            env_ids = self._share_ids[workers[0]].copy()
        else:
            env_ids = np.concatenate([self._share_ids[w] for w in workers])
            rows = env_ids
        infos: list = [{} for _ in range(len(env_ids))]
        share = len(self.shares[0])
        # (first: a worker replaced in ``_consume`` rewrites its rows)
        self._consume(workers, infos, [n * share for n in range(k)], "stepping")
        obs = _take(self._obs, rows)
        v = self._views
        rewards, terms, truncs = (
            v["rewards"][rows].copy(),
            v["terms"][rows].copy(),
            v["truncs"][rows].copy(),
        )
        self._last_recv = (env_ids, workers, rows)
        return env_ids, obs, rewards, terms, truncs, infos

    def send(self, actions: Any, env_ids: Any, *, payloads: Sequence[Any] | None = None) -> None:
        """Hand ``actions[j]`` to sub-env ``env_ids[j]`` and let their workers step.

        ``env_ids`` must be whole worker shares that ``recv()`` returned (and not yet
        sent), e.g. the ``env_ids`` of the last ``recv()``. ``payloads[j]``: sub-env
        ``env_ids[j]``'s data for a ``worker_cls`` with ``step_with`` (as in ``step``).

        Raises:
            ValueError: ids that are not whole received shares.
        """
        self._check_open()
        last = self._last_recv
        if last is not None and (env_ids is last[0] or np.array_equal(env_ids, last[0])):
            workers, rows = last[1], last[2]
        else:
            workers = self._workers_for(np.asarray(env_ids))
            rows = np.asarray(env_ids)
        self._last_recv = None
        self._write_actions(actions, rows)
        if payloads is None:
            self._command(workers, _STEP, None)
            return
        by_id = dict(zip(np.asarray(env_ids).tolist(), payloads, strict=True))
        per_worker = [[by_id[i] for i in self.shares[w].tolist()] for w in workers]
        self._command(workers, _STEP_WITH, per_worker)

    def _workers_for(self, env_ids: np.ndarray) -> list[int]:
        ids = env_ids.astype(np.int64).ravel()
        if len(ids) == 0 or ids.min() < 0 or ids.max() >= self.num_envs:
            raise ValueError(
                f"SharedMemoryVectorEnv.send(): env_ids must be sub-env ids in [0, "
                f"{self.num_envs}), got {env_ids.tolist()}"
            )
        workers = np.unique(self.worker_of[ids]).tolist()
        expected = np.concatenate([self.shares[w] for w in workers])
        if len(ids) != len(expected) or set(ids.tolist()) != set(expected.tolist()):
            raise ValueError(
                f"SharedMemoryVectorEnv.send(): env_ids {ids.tolist()} are not whole worker "
                f"shares; the shares of workers {workers} are {expected.tolist()} (send the "
                "env_ids recv() returned)."
            )
        busy = [w for w in workers if self._in_flight[w]]
        if busy:
            raise ValueError(
                f"SharedMemoryVectorEnv.send(): sub-envs of workers {busy} are already "
                "stepping; send only the env_ids recv() returned, once."
            )
        return workers

    # -- recovery ------------------------------------------------------------------------------
    def restart_sub_env(self, index: int, error: BaseException) -> tuple[Any, dict]:
        """Recreate sub-env ``index`` after ``error`` found in its last results.

        As if its ``step`` had raised ``error`` (``restart_failed`` must be set): its
        worker recreates and resets it, it is marked in ``failed`` and ``last_errors``,
        and its next step is a normal step. Returns the reset ``(obs, info)``.
        """
        if not self.restart_failed:
            raise error
        self._check_open()
        k = int(self.worker_of[index])
        if self._in_flight[k]:
            raise RuntimeError(
                f"SharedMemoryVectorEnv.restart_sub_env({index}): its worker is stepping"
            )
        try:
            pickle.dumps(error)
            sent = error
        except Exception:  # noqa: BLE001
            sent = RuntimeError(repr(error))
        lo = int(self.shares[k][0])
        self._command([k], _RESTART, [(index - lo, sent)])
        self._acquire(1, f"restarting sub-env {index}")
        infos: list = [{} for _ in range(len(self.shares[k]))]
        self._consume([k], infos, [0], f"restarting sub-env {index}")
        return _take(self._obs, index), infos[index - lo]

    # -- the rest of gymnasium's API -----------------------------------------------------------
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``name(*args, **kwargs)`` on every sub-env (or read it if not callable)."""
        payloads = [(name, args, kwargs)] * self.num_workers
        return tuple(self._all(_CALL, payloads, f"calling {name!r}"))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Read attribute ``name`` from every sub-env."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` on every sub-env (one value, or one per sub-env)."""
        if not isinstance(values, list | tuple):
            values = [values] * self.num_envs
        payloads = [(name, [values[i] for i in share]) for share in self.shares]
        self._all(_SET_ATTR, payloads, f"setting {name!r}")

    def render(self) -> tuple[Any, ...] | None:
        """Render every sub-env."""
        return self.call("render")

    def close_extras(self, *, terminate: bool = False, timeout: float = 5.0, **kwargs: Any) -> None:
        """Stop every worker (terminating those still alive after ``timeout``) and free the
        shared buffer."""
        self.processes = [p for p in self.processes if p is not None]
        self._conns = [c for c in self._conns if c is not None]
        if not terminate:
            for k, proc in enumerate(self.processes):
                if proc.is_alive():
                    self._cmd[k] = _CLOSE
                    self._go[k].release()
        stop_worker_processes(self.processes, self._conns, 0.0 if terminate else timeout)
        for proc in self.processes:
            try:
                proc.close()
            except ValueError:  # pragma: no cover - still running
                pass
        self._conns = []
        self._views = {}
        self._obs = self._obs_leaves = self._act_leaves = None
        self._buf = None
        # Outside "fork", a semaphore is a named one in /dev/shm, unlinked once its
        # last reference goes: the worker processes' arguments and ours.
        self.processes = []
        self._go, self._done = [], None

    def close(self, **kwargs: Any) -> None:
        """Stop the workers and free the shared memory (a second call does nothing)."""
        if self.closed:
            return
        self.close_extras(**kwargs)
        self.closed = True

    def __del__(self) -> None:
        try:
            if not getattr(self, "closed", True):
                self.close(terminate=True)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _take(batch: Any, rows: Any) -> Any:
    """Rows ``rows`` of a (nested) batch, copied."""
    if isinstance(batch, np.ndarray):
        out = batch[rows]  # fancy indexing copies; a slice or an int row is a view
        return out.copy() if isinstance(rows, slice | int) else out
    if isinstance(batch, dict):
        return {k: _take(v, rows) for k, v in batch.items()}
    return tuple(_take(v, rows) for v in batch)
