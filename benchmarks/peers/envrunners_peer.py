"""envrunners' ``SingleAgentEnvRunner`` (and RLlib's, same code) on a peer workload.

``sample(num_timesteps=..., explore=True)`` with PPO's default module, one local runner,
one torch thread (``num_cpus_per_env_runner=1``). Backends: ``gymnasium`` (the default
``FastSyncVectorEnv``, the config's defaults), ``envpool`` (``EnvPoolVectorEnv``, defaults:
``overlap_inference="auto"`` decides), and, envrunners only, the explicit overlap variants
``envpool_overlap`` / ``shared_memory_overlap`` (``overlap_inference=True``: the policy acts
on half the envs while the other half steps) and ``shared_memory`` (worker processes,
all envs per step). Pong only: ``envpool_framestack_connector``, RLlib's own Atari
recipe on EnvPool: single frames from the env (``stack_num=1``) stacked by a
``FrameStackingEnvToModule(num_frames=4)`` env-to-module piece (``"auto"`` decides).
"""

from __future__ import annotations

import importlib
from functools import partial
from typing import Any

import torch
from workloads import Workload, make_pong, median_rate, record

SETTINGS = (
    "SingleAgentEnvRunner.sample(num_timesteps, explore=True), PPO default module "
    "(inference-only: policy forward), 1 torch thread, episodes built"
)


#: envrunners' backends: (env id prefix or mode, extra ``env_runners`` keys).
BACKENDS = {
    "gymnasium": ("gymnasium", {}),
    "envpool": ("envpool", {}),
    "envpool_overlap": ("envpool", {"overlap_inference": True}),
    "shared_memory": ("gymnasium", {"gym_env_vectorize_mode": "shared_memory"}),
    "shared_memory_overlap": (
        "gymnasium",
        {"gym_env_vectorize_mode": "shared_memory", "overlap_inference": True},
    ),
    "envpool_framestack_connector": ("envpool", {}),
}
#: Backends that only apply to frames (the frame-stacking piece needs one channel).
PONG_ONLY = ("envpool_framestack_connector",)


def build_runner(target: str, workload: Workload, backend: str) -> Any:
    """A local runner on the workload's env with the given vector-env backend."""
    source, keys = BACKENDS[backend]
    ppo = importlib.import_module(f"{target}.algorithms.ppo")
    runner_mod = importlib.import_module(f"{target}.env.single_agent_env_runner")
    if source == "envpool":
        env: Any = "envpool:" + ("CartPole-v1" if workload.name == "cartpole" else "Pong-v5")
    else:
        env = "CartPole-v1" if workload.name == "cartpole" else partial(make_pong, target)
    env_config: dict = {}
    if backend == "envpool_framestack_connector":
        pieces = importlib.import_module(f"{target}.connectors.env_to_module")
        env_config = {"stack_num": 1}
        keys = {
            **keys,
            "env_to_module_connector": lambda env, spaces, device: pieces.FrameStackingEnvToModule(
                num_frames=4
            ),
        }
    config = (
        ppo.PPOConfig()
        .environment(env=env, env_config=env_config)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=workload.num_envs, **keys)
    )
    if target == "ray.rllib":
        config = config.api_stack(
            enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True
        )
    return runner_mod.SingleAgentEnvRunner(config=config)


def run(workload: Workload, repeats: int, target: str = "envrunners", backends=None):
    """One record per backend: the runner's env steps/s."""
    system = "envrunners" if target == "envrunners" else "rllib"
    for backend in backends or (tuple(BACKENDS) if target == "envrunners" else ("gymnasium",)):
        if backend in PONG_ONLY and workload.name != "pong":
            continue
        runner = build_runner(target, workload, backend)
        if target == "envrunners":
            layer = torch.nn.Linear if workload.name == "cartpole" else torch.nn.Conv2d
            assert any(isinstance(m, layer) for m in runner.module.modules())

        def once(runner=runner) -> int:
            episodes = runner.sample(num_timesteps=workload.timesteps, explore=True)
            return sum(len(e) for e in episodes)

        stats = median_rate(once, repeats)
        vector_env = {"vector_env": type(runner.env).__name__}
        if target == "envrunners":  # how many envs the policy acted on per step (auto rule)
            vector_env["acted_per_step"] = getattr(runner.env, "batch_size", workload.num_envs)
        runner.stop()
        version = importlib.import_module(target.split(".")[0]).__version__
        yield record(
            workload,
            system,
            f"runner_{backend}",
            f"{SETTINGS}, {target} {version}",
            **vector_env,
            **stats,
        )
