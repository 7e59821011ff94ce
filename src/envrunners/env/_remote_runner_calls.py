"""Functions that run on a remote runner, sent through ``apply`` by ``EnvRunnerGroup``.

They apply a state or weights, rebuild the runner in place, stop it, visit its
sub-envs or policies, or merge connector states. Failures of the state calls
become ``EnvRunnerError`` (with the runner index and traceback), so the group
counts them as runner faults, not as errors of a user function.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from envrunners.core.rl_module._flat_storage import FlatState, adoptable_flat_state
from envrunners.env._runner_state import (
    E2M,
    M2E,
    RL_MODULE,
    SEQ_NO,
    is_object_ref,
    merge_connector_states,
    pipelines_of,
)
from envrunners.errors import EnvRunnerError
from envrunners.utils.cow_arrays import adoptable_state

__all__ = [
    "add_policy",
    "adoptable_weights",
    "apply_state",
    "apply_weights",
    "become_runner",
    "end_standby",
    "foreach_policy",
    "foreach_policy_to_train",
    "freeze_gc",
    "get_connector_states",
    "install_weights",
    "merge_on_runner",
    "module_state",
    "prepare_standby",
    "rebuild_runner",
    "restore_runner",
    "stop_runner",
    "visit_sub_envs",
    "warm_up_standby",
]

logger = logging.getLogger("envrunners")


def _runner_error(runner: Any, what: str, err: BaseException) -> EnvRunnerError:
    return EnvRunnerError(
        f"{what} raised {err!r}",
        runner_index=getattr(runner, "worker_index", None),
        remote_traceback=traceback.format_exc(),
    )


def apply_state(runner: Any, state: dict, global_vars: dict | None = None) -> int:
    """Runner side: ``set_state(state)`` (+ ``set_global_vars``); returns the runner's seq no.

    Pushed weights (an ObjectRef) reach the module as copy-on-write views of the
    object store's memory (``adoptable_weights``), not as a copy.
    """
    return _set_state(runner, adoptable_weights, state, global_vars)


def _set_state(
    runner: Any, prepare: Callable[[Any, Any], dict], state: Any, global_vars: dict | None
) -> int:
    """``set_state(prepare(runner, state))`` and ``set_global_vars``; returns the runner's
    seq no. Any error, in ``prepare`` too, is raised as an ``EnvRunnerError``."""
    try:
        runner.set_state(prepare(runner, state))
        if global_vars and hasattr(runner, "set_global_vars"):
            runner.set_global_vars(global_vars)
    except Exception as err:
        raise _runner_error(runner, "set_state()", err) from err
    return int(getattr(runner, "_weights_seq_no", 0) or 0)


def install_weights(
    runner: Any,
    weights: Any,
    weights_seq_no: int = 0,
    global_vars: dict | None = None,
    plain: bool = False,
) -> int:
    """Runner side of a weight push: ``set_state`` of the weights; returns the runner's seq no.

    The group passes the weights' ObjectRef as this call's own argument, so Ray
    resolves it before the call (as for any actor method taking a ref), and no
    ref travels inside a pickled dict (about 50 us less to send, no ``ray.get``
    here). Inside a Ray actor the module adopts copy-on-write views of them
    (``adoptable_state``) instead of copying. Same gating by ``weights_seq_no``
    and the same errors as ``apply_state``. The runner keeps the pushed weights
    (read-only, the object store's) until the next push.

    ``plain``: the runner's ``set_state`` is ``NewStackEnvRunner``'s own. A ``FlatState``
    (one array, see ``_flat_storage``) then goes straight to its ``_apply_weights``
    under the weights lock: the same steps, without building and reading a state
    dict (the call runs in a runner that was idle, where every step costs several
    times what it costs hot: 15-30 us of ~120 us here).
    """
    if plain and global_vars is None and type(weights) is FlatState:
        seq_no = _install_flat(runner, weights, int(weights_seq_no or 0))
    else:
        seq_no = _set_state(runner, _pushed_state, (weights, weights_seq_no), global_vars)
    # Keep the pushed object until the next push (its memory is the store's, never the
    # module's): the driver's free of it is then cheap, and the store deletes it
    # later, off both critical paths (~0.05-0.1 ms per sync and runner here). The
    # previous one is let go of on a thread of its own, after this call has answered.
    previous = getattr(runner, "_last_pushed_weights", None)
    runner._last_pushed_weights = weights
    if previous is not None:
        _release_later(previous)
    return seq_no


_releases: queue.SimpleQueue | None = None


def _release_later(obj: Any) -> None:
    """Let go of ``obj`` on a background thread instead of in this call.

    Why: releasing a pushed object (its views, its pin on the object store's memory)
    took ~40 us of a weight push's ~180 us in a runner idle since the last one; the
    thread only gets the GIL once this call has returned and its answer is on the way.
    """
    global _releases
    if _releases is None:
        _releases = queue.SimpleQueue()
        threading.Thread(
            target=_release_loop, args=(_releases,), name="envrunners-release", daemon=True
        ).start()
    _releases.put(obj)


def _release_loop(releases: queue.SimpleQueue) -> None:
    while True:
        obj = releases.get()
        del obj


def _install_flat(runner: Any, weights: FlatState, seq: int) -> int:
    """``install_weights`` of a ``FlatState`` into a runner whose ``set_state`` is the base
    class's: its ``_apply_weights`` (the gating ``set_state`` applies) under its lock."""
    try:
        with runner._weights_lock:
            runner._apply_weights(weights, seq, _adoptable)
    except Exception as err:
        raise _runner_error(runner, "set_state()", err) from err
    return int(runner._weights_seq_no)


def _pushed_state(runner: Any, push: tuple[Any, Any]) -> dict:
    """The runner state of a weight push: weights the runner will apply (a newer
    ``weights_seq_no``, or none) as views it may adopt."""
    weights, seq = push[0], int(push[1] or 0)
    if isinstance(weights, dict) and (
        seq == 0 or int(getattr(runner, "_weights_seq_no", 0) or 0) < seq
    ):
        weights = _adoptable(weights)
    return {RL_MODULE: weights, SEQ_NO: seq}


_in_actor = False  # set once this process is known to run a Ray actor (it stays one)


def _adoptable(weights: dict) -> Any:
    """``weights`` as views the module may adopt (inside a Ray actor), else as they are."""
    global _in_actor
    if not _in_actor:
        import ray

        if ray.get_runtime_context().get_actor_id() is None:
            return weights
        _in_actor = True
    if type(weights) is FlatState:
        adoptable = adoptable_flat_state(weights) if weights.flat is not None else None
    else:
        adoptable = adoptable_state(weights)
    return weights if adoptable is None else adoptable


def adoptable_weights(runner: Any, state: dict) -> dict:
    """``state`` with its weights ref resolved into views the module may adopt.

    Why: a remote runner copying 40 MB of weights into its module takes ~7 ms per
    sync; adopting copy-on-write views of the object store's pages takes ~0.1 ms,
    and a later in-place write to the module stays private to this process (see
    ``envrunners.utils.cow_arrays``). Only inside a Ray actor: a runner in the
    driver may share its module with a learner and keeps copying. Weights the
    runner would skip (an older ``weights_seq_no``) are left unresolved.
    """
    ref = state.get(RL_MODULE) if isinstance(state, dict) else None
    if not is_object_ref(ref):
        return state
    seq = int(state.get(SEQ_NO, 0) or 0)
    if seq and int(getattr(runner, "_weights_seq_no", 0) or 0) >= seq:
        return state
    import ray

    if ray.get_runtime_context().get_actor_id() is None:
        return state
    weights = ray.get(ref)
    return {**state, RL_MODULE: _adoptable(weights) if isinstance(weights, dict) else weights}


def apply_weights(
    runner: Any, weights: Any, global_vars: dict | None = None, weights_seq_no: int | None = None
) -> None:
    """Runner side (old stack): ``set_weights(weights, global_vars)``."""
    try:
        if is_object_ref(weights):
            import ray

            weights = ray.get(weights)
        if weights_seq_no is None:
            runner.set_weights(weights, global_vars)
        else:
            runner.set_weights(weights, global_vars, weights_seq_no)
    except Exception as err:
        raise _runner_error(runner, "set_weights()", err) from err


def freeze_gc(runner: Any = None) -> None:
    """Runner side: move every object alive now out of the garbage collector's way.

    Why: a runner process holds ~200k long-lived objects (torch, gymnasium, Ray);
    each full collection walks them all (~100 ms here), which stalls a sampling
    round. After ``gc.freeze()`` full collections only see new objects (~1 ms).
    """
    gc.freeze()


def become_runner(runner: Any, *, config: Any, ctor_kwargs: dict) -> None:
    """Runner side: run the runner class's constructor on this actor (again).

    A standby actor (see ``_ray_setup.standby_class``) becomes the runner this
    way; a runner with a broken env is rebuilt without a new process.
    """
    init = getattr(type(runner), "_runner_init", None) or type(runner).__init__
    init(runner, config=config, **{**ctor_kwargs, "recreated_worker": True})
    runner._standby = False
    freeze_gc()


def rebuild_runner(runner: Any, *, config: Any, ctor_kwargs: dict, delay_s: float = 0.0) -> str:
    """Runner side: stop the runner and run its constructor again, in the same process.

    Why: a runner whose env broke is rebuilt in well under a second this way (no
    new process, no re-import of torch). If the constructor itself fails, the
    process exits so that Ray restarts it from scratch.
    """
    if delay_s > 0:
        time.sleep(delay_s)
    try:
        runner.stop()
    except Exception as err:  # a broken env may fail to close; it is dropped anyway
        logger.warning("stop() before rebuilding raised %r", err)
    try:
        become_runner(runner, config=config, ctor_kwargs=ctor_kwargs)
    except BaseException:
        logger.exception("Rebuilding the env runner failed; exiting so that Ray restarts it.")
        os._exit(1)
    return "rebuilt"


def warm_up_standby(runner: Any, *, config: Any, ctor_kwargs: dict) -> bool:
    """Runner side: build a standby as a spare runner (``ctor_kwargs``' index is no runner's).

    Why: the first construction in a process pays lazy imports and first-use
    costs of torch, gymnasium and the env (a few hundred ms on a loaded
    machine); a standby that paid them becomes a real runner in tens of ms.
    The spare index keeps its env from clashing with a live runner's (ports,
    files). It stays a standby: taking a runner's place rebuilds it with that
    runner's arguments. A failure only logs (the standby stays usable, cold).

    Returns:
        Whether the spare runner was built.
    """
    if not getattr(runner, "_standby", False):
        return False
    try:
        _build_standby_for(runner, config, ctor_kwargs)
    except EnvRunnerError as err:
        logger.warning("Warming up the standby env runner failed (it stays cold): %s", err)
        return False
    return True


def prepare_standby(runner: Any, *, state: dict, config: Any, ctor_kwargs: dict) -> int:
    """Runner side: build a standby as the runner of ``ctor_kwargs`` and apply ``state``.

    It stays a standby until ``restore_runner`` (with the same arguments) makes
    it that runner without building it again. The group prepares its standby
    this way for a runner that missed a deadline, so the swap at the kill is
    immediate.
    """
    if not getattr(runner, "_standby", False):
        raise EnvRunnerError("prepare_standby() was sent to a runner that is not a standby")
    _build_standby_for(runner, config, ctor_kwargs)
    seq_no = apply_state(runner, state)
    freeze_gc()
    return seq_no


def _build_standby_for(runner: Any, config: Any, ctor_kwargs: dict) -> None:
    """Run the runner constructor on a standby for ``ctor_kwargs`` (unless already built so)."""
    index = ctor_kwargs.get("worker_index")
    built_for = getattr(runner, "_standby_built_for", None)
    if built_for is not None and built_for == index:
        return
    if built_for is not None:  # a spare (or prepared) runner: close its env first
        runner._standby_built_for = None
        try:
            runner.stop()
        except Exception as err:  # the old env is dropped anyway
            logger.warning("stop() of the standby's previous runner raised %r", err)
    try:
        become_runner(runner, config=config, ctor_kwargs=ctor_kwargs)
    except Exception as err:
        raise _runner_error(runner, "the runner constructor", err) from err
    finally:
        runner._standby = True
    runner._standby_built_for = index


def restore_runner(
    runner: Any, *, state: dict, config: Any = None, ctor_kwargs: dict | None = None
) -> int:
    """Runner side: (standby: become the runner, then) apply the group's latest state.

    A standby already built for ``ctor_kwargs``' index (warmed up or prepared)
    is not built again.
    """
    if getattr(runner, "_standby", False):
        if ctor_kwargs is None:
            raise EnvRunnerError("a standby runner was restored without its constructor arguments")
        _build_standby_for(runner, config, ctor_kwargs)
        runner._standby = False
    seq_no = apply_state(runner, state)
    freeze_gc()  # also after a process restart by Ray
    return seq_no


def end_standby(runner: Any) -> None:
    """Runner side: a prepared standby now serves as the runner it was built for."""
    runner._standby = False


def stop_runner(runner: Any) -> None:
    """Runner side: ``runner.stop()``."""
    runner.stop()


def get_connector_states(runner: Any) -> dict:
    """Runner side: the runner's connector states (no weights)."""
    return runner.get_state(components=[E2M, M2E])


def module_state(runner: Any) -> dict:
    """Runner side: the runner's module weights and ``weights_seq_no``."""
    return runner.get_state(components=[RL_MODULE])


def _sub_envs(runner: Any) -> list[Any]:
    env = getattr(runner, "env", None)
    if env is None:
        return []
    envs = getattr(env, "envs", None)
    if envs is None and hasattr(env, "env"):
        envs = getattr(env.env, "envs", None)
    return list(envs) if envs is not None else [env]


def visit_sub_envs(runner: Any, env_func: Callable[..., Any], with_context: bool = False) -> list:
    """Runner side: ``[env_func(sub_env) ...]`` (or ``env_func(sub_env, env_context)``).

    Uses the runner's own ``foreach_env``/``foreach_env_with_context`` when it has
    them (old stack), else the sub-envs of its vector env.
    """
    own = getattr(runner, "foreach_env_with_context" if with_context else "foreach_env", None)
    if own is not None:
        return own(env_func)
    envs = _sub_envs(runner)
    if not with_context:
        return [env_func(e) for e in envs]
    ctx = getattr(runner, "_env_context", None)
    out = []
    for i, e in enumerate(envs):
        sub_ctx = ctx.copy_with_overrides(vector_index=i) if ctx is not None else None
        out.append(env_func(e, sub_ctx))
    return out


def merge_on_runner(runner: Any, states: list[dict], base: dict) -> dict:
    """Runner side: merge connector states with this runner's pipelines."""
    e2m, m2e = pipelines_of(runner, None, None)
    return merge_connector_states(states, base=base, env_to_module=e2m, module_to_env=m2e)


def foreach_policy(runner: Any, policy_func: Callable[..., Any]) -> list[Any]:
    """Runner side (old stack): ``policy_func(policy, policy_id)`` for each policy."""
    return runner.foreach_policy(policy_func)


def foreach_policy_to_train(runner: Any, policy_func: Callable[..., Any]) -> list[Any]:
    """Runner side (old stack): ``policy_func(policy, policy_id)`` for each trained policy."""
    return runner.foreach_policy_to_train(policy_func)


def add_policy(runner: Any, **kwargs: Any) -> None:
    """Runner side (old stack): ``runner.add_policy(**kwargs)``."""
    runner.add_policy(**kwargs)
