"""TorchRL: its ``Collector`` (direct backend) over the same gymnasium vector env.

TorchRL's documented set-up for a cheap batched env: one collector in this process on
a batched env (``GymWrapper`` of a gymnasium ``SyncVectorEnv`` with ``SAME_STEP``
autoreset, which TorchRL requires; categorical actions),
a ``ProbabilisticActor`` with the same policy network, ``frames_per_batch`` = the
workload's timesteps, one batch per timed repeat.
"""

from __future__ import annotations

import logging

import gymnasium as gym
import torch
from workloads import PeerUnavailable, Workload, env_fns, median_rate, policy_net, record


def run(workload: Workload, repeats: int):
    try:
        import torchrl
        from tensordict.nn import TensorDictModule
        from torchrl.collectors import Collector
        from torchrl.envs import GymWrapper
        from torchrl.modules import ProbabilisticActor
    except ImportError as err:
        raise PeerUnavailable(
            f"torchrl is not installed or does not import here ({err}); "
            "pip install 'envrunners[peers]'"
        ) from err
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # its INFO lines go to stdout
    # TorchRL takes gymnasium vector envs with SAME_STEP autoreset (or none), not NEXT_STEP.
    vector_env = gym.vector.SyncVectorEnv(
        env_fns(workload), autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    env = GymWrapper(vector_env, categorical_action_encoding=True)
    net = policy_net(workload, int(env.action_spec.space.n))
    actor = ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        spec=env.action_spec,
        return_log_prob=True,
    )
    collector = Collector(
        env, actor, frames_per_batch=workload.vector_steps * workload.num_envs, total_frames=-1
    )
    batches = iter(collector)

    def once() -> int:
        batch = next(batches)
        return int(batch.numel())

    stats = median_rate(once, repeats)
    collector.shutdown()
    settings = (
        f"Collector(GymWrapper(SyncVectorEnv)), ProbabilisticActor, TorchRL {torchrl.__version__}"
    )
    yield record(workload, "torchrl", "collector", settings, **stats)
