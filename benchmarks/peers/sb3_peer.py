"""Stable-Baselines3: ``PPO.collect_rollouts`` into its ``RolloutBuffer``, ``DummyVecEnv``.

SB3's fast settings for cheap envs: ``DummyVecEnv`` (in-process), ``device="cpu"``.
Same networks: the MLP policy as ``net_arch=dict(pi=[256, 256], vf=[256, 256])``, tanh;
for Pong the default CNN's conv trunk as the features extractor (shared by the policy
and value heads, SB3's default for images, which it transposes to channels-first and
scales to [0, 1]). ``collect_rollouts`` also runs the value net every step (SB3's design).
"""

from __future__ import annotations

import torch
from workloads import PeerUnavailable, Workload, default_cnn, env_fns, median_rate, record


def _import():
    try:
        import stable_baselines3
    except ImportError as err:
        raise PeerUnavailable(
            "stable-baselines3 is not installed (pip install 'envrunners[peers]')"
        ) from err
    return stable_baselines3


def _policy_kwargs(workload: Workload) -> tuple[str, dict]:
    if workload.name == "cartpole":
        return "MlpPolicy", {
            "net_arch": {"pi": [256, 256], "vf": [256, 256]},
            "activation_fn": torch.nn.Tanh,
        }
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class DefaultCNN(BaseFeaturesExtractor):
        """RLlib's default 84x84 CNN trunk (11x11x256 features) on SB3's NCHW frames."""

        def __init__(self, observation_space):
            super().__init__(observation_space, features_dim=256 * 11 * 11)
            self.cnn = default_cnn(6).cnn

        def forward(self, obs):
            return self.cnn(obs)

    return "CnnPolicy", {"features_extractor_class": DefaultCNN, "net_arch": []}


def run(workload: Workload, repeats: int):
    sb3 = _import()
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import DummyVecEnv

    policy, kwargs = _policy_kwargs(workload)
    env = DummyVecEnv(env_fns(workload))
    model = sb3.PPO(
        policy,
        env,
        n_steps=workload.vector_steps,
        batch_size=workload.vector_steps * workload.num_envs,
        policy_kwargs=kwargs,
        device="cpu",
        seed=0,
        verbose=0,
    )
    # A logger with no outputs: SB3's default (verbose=0) makes a /tmp/SB3-<time> folder
    # per run that nothing writes to and nothing removes.
    model.set_logger(Logger(folder=None, output_formats=[]))
    _, callback = model._setup_learn(total_timesteps=10**9)

    def once() -> int:
        model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
        return model.n_steps * workload.num_envs

    stats = median_rate(once, repeats)
    env.close()
    settings = f"PPO.collect_rollouts, DummyVecEnv, {policy}, SB3 {sb3.__version__}"
    yield record(workload, "sb3", "collect_rollouts", settings, **stats)
