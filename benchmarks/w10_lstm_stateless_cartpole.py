"""W10: StatelessCartPole, default LSTM (cell 256), one local runner, 16 envs.

``runner``: ``SingleAgentEnvRunner`` with PPO's default module and
``model_config={"use_lstm": True, "lstm_cell_size": 256}``,
``sample(num_timesteps=4000)`` env steps/s and the process RSS. Beside it, in the
same process, ``lean``: the same 16-env gymnasium ``SyncVectorEnv`` and RLlib's
default LSTM actor path (MLP tokenizer [256, 256] tanh, LSTM 256, linear policy
head), one torch thread, one forward per step, the (h, c) state carried per sub-env
and zeroed when its episode resets, Gumbel-max actions, no episodes.
``runner_vs_lean`` is the runner's rate over the lean loop's (target >= 0.85).
"""

from __future__ import annotations

import sys
from functools import partial

import gymnasium as gym
import numpy as np
import torch
from common import TorchThreads, api, emit, local_ppo_runner, median_rate, runner_record

WORKLOAD = "W10"
ENV = "StatelessCartPole"
NUM_ENVS = 16
TIMESTEPS = 4000
CELL = 256


def env_class(target: str) -> type:
    """The target's ``StatelessCartPole`` (no time limit, as RLlib's class)."""
    return api(target, "envrunners.examples.envs.classes.stateless_cartpole").StatelessCartPole


class LSTMActor(torch.nn.Module):
    """RLlib's default LSTM module as acting uses it: tokenizer MLP, one LSTM layer, pi head."""

    def __init__(self, obs_dim: int, num_actions: int, cell: int = CELL):
        super().__init__()
        nn = torch.nn
        self.tokenizer = nn.Sequential(
            nn.Linear(obs_dim, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh()
        )
        self.lstm = nn.LSTM(256, cell, batch_first=True)
        self.pi = nn.Linear(cell, num_actions)

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        out, (h, c) = self.lstm(self.tokenizer(obs)[:, None], (h, c))
        return self.pi(out[:, 0]), h, c


def build_runner(target: str, num_envs: int = NUM_ENVS):
    """A local runner on StatelessCartPole with the default LSTM module."""
    model_config = {"use_lstm": True, "lstm_cell_size": CELL}
    return local_ppo_runner(
        target, env_class(target), num_envs, model_config=model_config, layer=torch.nn.LSTM
    )


def lean_record(target: str, repeats: int) -> dict:
    """The lean recurrent loop on the same 16 envs, one torch thread."""
    cls = env_class(target)
    env = gym.vector.SyncVectorEnv([cls for _ in range(NUM_ENVS)])
    obs, _ = env.reset(seed=0)
    net = LSTMActor(obs.shape[1], int(env.single_action_space.n))
    steps = -(-TIMESTEPS // NUM_ENVS)
    obs_buf = np.zeros((steps + 1, *obs.shape), np.float32)
    act_buf = np.zeros((steps, NUM_ENVS), np.int64)
    logp_buf = np.zeros((steps, NUM_ENVS), np.float32)
    rew_buf = np.zeros((steps, NUM_ENVS), np.float32)
    obs_buf[steps] = obs
    h = torch.zeros(1, NUM_ENVS, CELL)
    c = torch.zeros(1, NUM_ENVS, CELL)
    state = {"h": h, "c": c, "done": np.zeros(NUM_ENVS, bool)}

    def lean() -> int:
        obs_buf[0] = obs_buf[steps]
        h, c, done = state["h"], state["c"], state["done"]
        with torch.inference_mode():
            for t in range(steps):
                logits, h, c = net(torch.from_numpy(obs_buf[t]), h, c)
                u = torch.rand_like(logits)
                a = torch.argmax(logits - torch.log(-torch.log(u)), dim=-1)
                logp_buf[t] = torch.log_softmax(logits, -1).gather(-1, a[:, None])[:, 0].numpy()
                act_buf[t] = a.numpy()
                o2, r, te, tr, _ = env.step(act_buf[t])
                obs_buf[t + 1] = o2
                rew_buf[t] = r
                # Sub-envs that ended last step were just reset (gymnasium's next-step
                # autoreset): their next forward starts a new episode from a zero state.
                if done.any():
                    reset = torch.from_numpy(done)
                    h[:, reset] = 0.0
                    c[:, reset] = 0.0
                done = te | tr
        state.update(h=h, c=c, done=done)
        return steps * NUM_ENVS

    with TorchThreads(1):
        stats = median_rate(lean, repeats=repeats)
    env.close()
    return {
        "workload": WORKLOAD,
        "target": target,
        "variant": "lean",
        "env": ENV,
        "num_envs": NUM_ENVS,
        "num_timesteps": steps * NUM_ENVS,
        "env_steps_per_s": stats.pop("per_s_median"),
        **stats,
    }


def run(target: str, repeats: int = 5):
    """Yield the runner's record, the lean loop's and the runner / lean ratio."""
    base = {"workload": WORKLOAD, "target": target, "variant": "runner", "env": ENV}
    base |= {"num_envs": NUM_ENVS, "num_timesteps": TIMESTEPS, "lstm_cell_size": CELL}
    runner = runner_record(base, partial(build_runner, target), TIMESTEPS, repeats)
    yield runner
    lean = lean_record(target, repeats)
    yield lean
    if "env_steps_per_s" in runner:
        ratio = runner["env_steps_per_s"] / lean["env_steps_per_s"]
        yield {"workload": WORKLOAD, "target": target, "variant": "runner_vs_lean", "ratio": ratio}


if __name__ == "__main__":  # pragma: no cover - use run.py
    for rec in run(sys.argv[1] if len(sys.argv) > 1 else "envrunners", repeats=3):
        emit(rec)
