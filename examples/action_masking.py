"""Action masking: a custom TorchRLModule reads ``action_mask`` from a Dict observation.

The env below offers 5 actions, of which only some are allowed at each step; its
observation is ``{"action_mask": 0/1 per action, "observations": 4 floats}`` and
it raises if it gets a masked action. ``ActionMaskingTorchRLModule`` computes
logits from ``observations`` and pushes the logits of masked actions to the
lowest float, so neither sampling (``explore=True``) nor the greedy action
(``explore=False``) can pick them. The module plugs into
``SingleAgentEnvRunner`` through ``config.rl_module(rl_module_spec=...)``, as in
RLlib.

Run: python examples/action_masking.py [--timesteps 2000] [--num-envs 4]
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core.columns import Columns
from envrunners.core.distribution.torch.torch_distribution import TorchCategorical
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.core.rl_module.torch import TorchRLModule
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner

FLOAT_MIN = torch.finfo(torch.float32).min


class MaskedActionsEnv(gym.Env):
    """5 actions, a random non-empty subset allowed per step; reward 1 per step; 20 steps."""

    def __init__(self, config: dict | None = None):
        self.n = 5
        self.observation_space = gym.spaces.Dict(
            {
                "action_mask": gym.spaces.Box(0.0, 1.0, (self.n,), np.float32),
                "observations": gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
            }
        )
        self.action_space = gym.spaces.Discrete(self.n)
        self.t = 0
        self.mask = np.ones(self.n, np.float32)

    def _obs(self) -> dict:
        self.mask = (self.np_random.random(self.n) < 0.4).astype(np.float32)
        self.mask[self.np_random.integers(self.n)] = 1.0  # at least one allowed action
        features = self.np_random.uniform(-1.0, 1.0, 4).astype(np.float32)
        return {"action_mask": self.mask.copy(), "observations": features}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if not self.mask[int(action)]:
            raise ValueError(f"masked action {action} taken (mask {self.mask})")
        self.t += 1
        return self._obs(), 1.0, False, self.t >= 20, {}


class ActionMaskingTorchRLModule(TorchRLModule):
    """An MLP on ``observations`` whose masked-out logits are set to the lowest float."""

    def setup(self) -> None:
        hidden = int(self.model_config.get("hidden", 32))
        n_in = self.observation_space["observations"].shape[0]
        self.net = torch.nn.Sequential(
            torch.nn.Linear(n_in, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 5)
        )

    def _forward(self, batch: dict, **kwargs) -> dict:
        obs = batch[Columns.OBS]
        logits = self.net(obs["observations"].float())
        mask = obs["action_mask"].float()
        # log(1) = 0 keeps a logit; log(0) = -inf, clamped to the lowest float, masks it.
        masked = logits + torch.clamp(torch.log(mask), min=FLOAT_MIN)
        return {Columns.ACTION_DIST_INPUTS: masked}

    def get_exploration_action_dist_cls(self):
        return TorchCategorical

    def get_inference_action_dist_cls(self):
        return TorchCategorical


def make_runner(num_envs: int = 4) -> SingleAgentEnvRunner:
    """A local runner on ``MaskedActionsEnv`` with the masking module."""
    config = (
        AlgorithmConfig()
        .environment(MaskedActionsEnv)
        .env_runners(num_envs_per_env_runner=num_envs)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=ActionMaskingTorchRLModule))
    )
    return SingleAgentEnvRunner(config=config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=2000)
    parser.add_argument("--num-envs", type=int, default=4)
    args = parser.parse_args(argv)

    runner = make_runner(args.num_envs)
    taken = 0
    for explore in (True, False):
        episodes = runner.sample(num_timesteps=args.timesteps, explore=explore)
        for ep in episodes:
            masks = ep.get_observations()["action_mask"][:-1]
            actions = np.asarray(ep.get_actions())
            assert masks[np.arange(len(actions)), actions].all(), "a masked action was taken"
            taken += len(actions)
        print(f"explore={explore}: {sum(len(e) for e in episodes)} env steps, no masked action")
    print(f"{taken} actions checked against their masks")
    runner.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
