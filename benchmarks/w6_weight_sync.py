"""W6: ``sync_weights()`` from the local runner to remote runners, against the bare-Ray floor.

Sizes: the default CartPole module, and MLPs of about 1M and 10M parameters
(``fcnet_hiddens`` [1000, 1000] and [3162, 3162]; runners hold the
inference-only module), each with 1 and 2 remote runners. Three things are timed
alternately in one run, on the same Ray instance and the same weights dict:

- ``sync_ms``: ``group.sync_weights(timeout_seconds=60)``, which returns once
  every runner has applied the weights (one ``ray.put``, one call per runner);
- ``floor_ms``: the bare-Ray floor of that: ``ray.put(weights)``, one call per
  plain actor that keeps the (deserialized) weights as its own, ``ray.get`` of all;
- ``put_get_ms``: ``ray.get(ray.put(weights))`` in the driver.

- ``floor_load_ms``: a hand-written Ray sync that also applies the weights: the
  same put and calls, to plain actors holding torch parameters of the same shapes,
  each copying the pushed arrays in (what ``nn.Module.load_state_dict`` does);

``sync_vs_floor`` is the ratio of the medians; the target is at most 1.10.
``sync_vs_floor_load`` compares with the hand-written sync that applies them.

The floor is the same transport (one ``ray.put``, the ref as each call's own
argument, resolved by Ray before the call), but less work, which the target has
to absorb: per sync the group reads the local runner's weights (views of the
module's memory, no copy); calls each runner's own install method and keeps the
manager's bookkeeping (in-flight calls, health, pending pushes), then waits with
``ray.wait`` plus one ``ray.get`` per runner; and each runner installs the weights
into its module (copied below 1 MB, else adopted as copy-on-write views) and
checks ``weights_seq_no``, where the floor's actor only keeps a reference. The
group lets go of the previous weights once the runners have answered.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from common import api

WORKLOAD = "W6"
SIZES = {"default": None, "1M": [1000, 1000], "10M": [3162, 3162]}
RUNNERS = (1, 2)
WARMUP = 30
#: Warm up at least this long after building the group: its standby runner (built
#: about 5 s after the runners, with restarts on) is then up and idle.
SETTLE_S = 15.0


def _config(target: str, hiddens, num_runners: int):
    PPOConfig = api(target, "envrunners.algorithms.ppo").PPOConfig
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=num_runners, num_envs_per_env_runner=1)
    )
    if hiddens is not None:
        config = config.rl_module(model_config={"fcnet_hiddens": hiddens})
    if target == "ray.rllib":
        config = config.api_stack(
            enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True
        )
    return config


class _Holder:
    """The floor's runner: one call installs the weights (keeps them) and answers."""

    def __init__(self) -> None:
        self.weights = None
        self.seq_no = 0

    def install(self, weights, seq_no: int) -> int:
        self.weights, self.seq_no = weights, seq_no
        return seq_no


class _TorchHolder:
    """The hand-written sync's runner: torch parameters that each push is copied into."""

    def __init__(self, shapes: dict) -> None:
        import warnings

        import torch

        # (the pushed arrays are the object store's, read-only: torch warns once)
        warnings.filterwarnings("ignore", message=".*not writable.*")
        self.params = {k: torch.nn.Parameter(torch.zeros(s)) for k, s in shapes.items()}
        self.seq_no = 0

    def install(self, weights, seq_no: int) -> int:
        import torch

        with torch.no_grad():
            for name, param in self.params.items():
                param.copy_(torch.from_numpy(weights[name]))
        self.seq_no = seq_no
        return seq_no


def _measure(
    fns: list, repeats: int, warmup: int = WARMUP, settle_until: float = 0.0
) -> list[list[float]]:
    """Time ``fns`` round-robin (after ``warmup`` rounds, going on until ``settle_until``
    on the ``time.monotonic()`` clock); seconds per call, per fn.

    Why the long warm-up: the object store's memory is mapped lazily, so the first
    few dozen 40 MB puts pay page faults that a running job no longer sees; and a
    group with restarts on builds its standby runner a few seconds after the start,
    a one-off cost (CPU of the same cores) that a running job has behind it.
    """
    done = 0
    while done < warmup or time.monotonic() < settle_until:
        for fn in fns:
            fn()
        done += 1
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats):
        order = list(enumerate(fns))
        if r % 2:  # alternate who goes first: neither always follows the other
            order.reverse()
        for n, fn in order:
            t = time.perf_counter()
            fn()
            times[n].append(time.perf_counter() - t)
    return times


def run(target: str, repeats: int = 5, sizes=tuple(SIZES), runners=RUNNERS):
    """One record per module size and runner count."""
    import ray

    EnvRunnerGroup = api(target, "envrunners.env.env_runner_group").EnvRunnerGroup
    if ray.is_initialized():
        ray.shutdown()
    import sys

    from ray import cloudpickle

    # The actors' processes need not find this file on their path: ship _Holder by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    holder_cls = ray.remote(num_cpus=0)(_Holder)
    torch_holder_cls = ray.remote(num_cpus=0)(_TorchHolder)
    for size in sizes:
        for num_runners in runners:
            config = _config(target, SIZES[size], num_runners)
            group = EnvRunnerGroup(config=config, local_env_runner=True)
            settle_until = time.monotonic() + SETTLE_S
            local = group.local_env_runner
            weights = local.get_state(components=["rl_module"], inference_only=True)["rl_module"]
            flat = _flat(weights)
            num_params = int(sum(np.asarray(a).size for a in flat.values()))
            holders = [holder_cls.remote() for _ in range(num_runners)]
            ray.get([h.install.remote(None, 0) for h in holders])
            shapes = {k: tuple(np.shape(v)) for k, v in flat.items()}
            loaders = [torch_holder_cls.remote(shapes) for _ in range(num_runners)]
            ray.get([h.install.remote(flat, 0) for h in loaders])
            seq = [0]

            def sync(group=group) -> None:
                group.sync_weights(timeout_seconds=60.0)

            def floor(weights=weights, holders=holders, seq=seq) -> None:
                seq[0] += 1
                ref = ray.put(weights)
                ray.get([h.install.remote(ref, seq[0]) for h in holders])

            def floor_load(weights=flat, loaders=loaders, seq=seq) -> None:
                seq[0] += 1
                ref = ray.put(weights)
                ray.get([h.install.remote(ref, seq[0]) for h in loaders])

            def put_get(weights=weights) -> None:
                ray.get(ray.put(weights))

            sync_s, floor_s, load_s, base_s = _measure(
                [sync, floor, floor_load, put_get], max(3 * repeats, 15), settle_until=settle_until
            )
            for h in holders + loaders:
                ray.kill(h)
            group.stop()
            sync_ms = 1000 * statistics.median(sync_s)
            floor_ms = 1000 * statistics.median(floor_s)
            base_ms = 1000 * statistics.median(base_s)
            load_ms = 1000 * statistics.median(load_s)
            yield {
                "workload": WORKLOAD,
                "target": target,
                "size": size,
                "num_runners": num_runners,
                "num_params": num_params,
                "mb": 4 * num_params / 2**20,
                "sync_ms": sync_ms,
                "sync_ms_min": 1000 * min(sync_s),
                "floor_ms": floor_ms,
                "floor_ms_min": 1000 * min(floor_s),
                "sync_vs_floor": sync_ms / floor_ms,
                "floor_load_ms": load_ms,
                "sync_vs_floor_load": sync_ms / load_ms,
                "put_get_ms": base_ms,
                "sync_vs_put_get": sync_ms / base_ms,
                "per_s": 1000.0 / sync_ms,
                "repeats": len(sync_s),
            }
    if ray.is_initialized():
        ray.shutdown()


def _flat(tree, prefix: str = "") -> dict:
    """``{"a/b": array}`` of a nested weights dict (the hand-written sync's flat state)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--runners", default=",".join(map(str, RUNNERS)))
    args = parser.parse_args()
    for record in run(
        "envrunners",
        args.repeats,
        tuple(args.sizes.split(",")),
        tuple(int(n) for n in args.runners.split(",")),
    ):
        print(json.dumps(record), flush=True)
