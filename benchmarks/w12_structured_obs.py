"""W12: Dict observations from ``PrevActionsPrevRewards``, the default module, CartPole x 16.

RLlib's recipe for a policy that sees its last action and reward: the
``PrevActionsPrevRewards`` env-to-module piece turns each observation into a ``Dict``
(``_orig_obs``, ``prev_n_actions``, ``prev_n_rewards``), which the default module reads
by one-hot encoding and concatenating its leaves. Per backend (``gymnasium``: the
default in-process one; ``envpool``: ``"envpool:CartPole-v1"``, ready-first half the
envs, where EnvPool is installed) and module (the MLP, and the LSTM with 64 cells),
three runners are timed round-robin in one process, ``sample(num_timesteps)`` each:

- ``plain``: CartPole without the piece (Box observations);
- ``dict_numpy``: with the piece; the module encodes the Dict on numpy and acts with
  its numpy layers (the default);
- ``dict_torch``: with the piece and the numpy path switched off, so the module encodes
  and acts with torch's layers, op by op (what it did before session 15).

``numpy_vs_torch`` is ``dict_numpy`` over ``dict_torch``; ``dict_vs_plain`` is what the
piece and the Dict observations cost. envrunners only: RLlib's default module does not
read Dict observations (its recipe adds ``FlattenObservations``).

    python benchmarks/w12_structured_obs.py [--repeats 5] [--backends gymnasium,envpool]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

from common import emit

WORKLOAD = "W12"
NUM_ENVS = 16
MODULES = {
    "mlp": None,
    "lstm": {"use_lstm": True, "lstm_cell_size": 64, "fcnet_hiddens": [64]},
}


def _runner(backend: str, model_config: dict | None, with_piece: bool):
    from envrunners.algorithms.ppo import PPOConfig
    from envrunners.connectors.env_to_module import PrevActionsPrevRewards
    from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner

    keys: dict = {"num_env_runners": 0, "num_envs_per_env_runner": NUM_ENVS}
    if backend == "envpool":
        keys["overlap_inference"] = True
    if with_piece:
        keys["env_to_module_connector"] = lambda env, spaces, device: PrevActionsPrevRewards()
    env = "envpool:CartPole-v1" if backend == "envpool" else "CartPole-v1"
    config = PPOConfig().environment(env).env_runners(**keys)
    if model_config:
        config = config.rl_module(model_config=model_config)
    return SingleAgentEnvRunner(config=config)


def _torch_only(runner) -> None:
    """Switch the module's numpy acting paths off (it then acts with torch's layers)."""
    module = runner.module
    if module._stateful:
        module._fast_recurrent = False
    else:
        module._fast = module._fast_plan()
        module._fast["numpy"] = None


def run(backend: str, module: str, repeats: int) -> dict:
    timesteps = 8192 if module == "mlp" else 4096
    runners = {
        "plain": _runner(backend, MODULES[module], False),
        "dict_numpy": _runner(backend, MODULES[module], True),
        "dict_torch": _runner(backend, MODULES[module], True),
    }
    rates: dict[str, list[float]] = {name: [] for name in runners}
    try:
        for _ in range(repeats + 1):  # the first round warms up
            for name, runner in runners.items():
                if name == "dict_torch":
                    _torch_only(runner)
                start = time.perf_counter()
                steps = sum(len(e) for e in runner.sample(num_timesteps=timesteps, explore=True))
                rates[name].append(steps / (time.perf_counter() - start))
    finally:
        for runner in runners.values():
            runner.stop()
    med = {name: statistics.median(r[1:]) for name, r in rates.items()}
    return {
        "workload": WORKLOAD,
        "backend": backend,
        "module": module,
        "num_envs": NUM_ENVS,
        **{f"{name}_steps_per_s": rate for name, rate in med.items()},
        "numpy_vs_torch": med["dict_numpy"] / med["dict_torch"],
        "dict_vs_plain": med["dict_numpy"] / med["plain"],
        "repeats": repeats,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backends", default="gymnasium,envpool")
    parser.add_argument("--modules", default=",".join(MODULES))
    args = parser.parse_args()
    for backend in args.backends.split(","):
        if backend == "envpool" and importlib.util.find_spec("envpool") is None:
            emit({"workload": WORKLOAD, "backend": backend, "skipped": "envpool not installed"})
            continue
        for module in args.modules.split(","):
            emit(run(backend, module, args.repeats))
