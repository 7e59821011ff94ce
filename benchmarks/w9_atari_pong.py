"""W9: ALE Pong with Atari wrapping (84x84x4), default CNN, one local runner, 8 envs.

``runner``: ``SingleAgentEnvRunner`` with PPO's default module (for 84x84x4 frames
the library's default CNN), ``sample(num_timesteps=2000)`` env steps/s and the
process RSS. Beside it, in the same process, the physical references on the same
vector env (gymnasium ``SyncVectorEnv`` of 8 wrapped Pongs): ``env_only`` (fixed
random actions, no policy) and ``lean`` (RLlib's default 84x84 CNN, one torch
thread, one forward per step, Gumbel-max actions, preallocated buffers, no episodes).
``runner_vs_lean`` is the runner's rate over the lean loop's (target >= 0.9).
``runner_lstm``: the same runner with ``use_lstm=True`` (RLlib's default 256-cell LSTM
over the CNN's 30,976 features, actor and critic each), ``LSTM_TIMESTEPS`` per call.
"""

from __future__ import annotations

import sys
from functools import partial

import gymnasium as gym
import numpy as np
import torch
from common import TorchThreads, api, emit, local_ppo_runner, median_rate, runner_record

WORKLOAD = "W9"
ENV_ID = "ale_py:ALE/Pong-v5"
NUM_ENVS = 8
TIMESTEPS = 2000
LSTM_TIMESTEPS = 400
# RLlib's Atari setup: the wrapper does the frame skipping, so ALE's is off.
ALE_KWARGS = {"frameskip": 1, "full_action_space": False, "repeat_action_probability": 0.0}


def make_pong(target: str, env_context=None) -> gym.Env:
    """One Pong env wrapped by the target's ``wrap_atari_for_new_api_stack`` (84x84x4).

    envrunners keeps the frames uint8 (``normalize=False``; its default CNN maps them to
    RLlib's ``x / 128 - 1`` itself); RLlib's wrapper has no such option (float frames).
    """
    wrappers = api(target, "envrunners.env.wrappers.atari_wrappers")
    kwargs = {"normalize": False} if target == "envrunners" else {}
    return wrappers.wrap_atari_for_new_api_stack(
        gym.make(ENV_ID, **ALE_KWARGS), dim=84, framestack=4, **kwargs
    )


def default_cnn(num_actions: int) -> torch.nn.Module:
    """RLlib's default module for 84x84x4 frames as sampling uses it: the filter table
    [[16, 8, 4], [32, 4, 2], [256, 11, 1]] with "same" padding and ReLU, then a linear
    policy head over the flattened 11x11x256 features. Inputs are channels-last frames
    (uint8 ones are mapped to ``x / 128 - 1`` first, as the env's normalisation would),
    made one contiguous NCHW float copy; symmetric pads are the convs' own padding
    (torch's fastest CPU form of the same numbers, as the envrunners CNN runs it)."""

    class CNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            nn = torch.nn
            self.cnn = nn.Sequential(
                nn.Conv2d(4, 16, 8, 4, padding=2),
                nn.ReLU(),
                nn.ZeroPad2d((1, 2, 1, 2)),
                nn.Conv2d(16, 32, 4, 2),
                nn.ReLU(),
                nn.Conv2d(32, 256, 11, 1, padding=5),
                nn.ReLU(),
                nn.Flatten(),
            )
            self.pi = nn.Linear(256 * 11 * 11, num_actions)

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            x = obs.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
            if obs.dtype == torch.uint8:  # uint8 frames: the normalisation the env skipped
                x = x.mul_(1.0 / 128.0).sub_(1.0)
            return self.pi(self.cnn(x))

    return CNN()


def build_runner(target: str, num_envs: int = NUM_ENVS, model_config: dict | None = None):
    """A local runner on wrapped Pong with PPO's default module (a CNN for these frames)."""
    return local_ppo_runner(
        target, partial(make_pong, target), num_envs, model_config, layer=torch.nn.Conv2d
    )


def reference_records(target: str, repeats: int):
    """``env_only`` and ``lean`` on the same 8 wrapped Pongs, one torch thread."""
    env = gym.vector.SyncVectorEnv([partial(make_pong, target) for _ in range(NUM_ENVS)])
    obs, _ = env.reset(seed=0)
    num_actions = int(env.single_action_space.n)
    steps = -(-TIMESTEPS // NUM_ENVS)
    obs_buf = np.zeros((steps + 1, *obs.shape), obs.dtype)
    act_buf = np.zeros((steps, NUM_ENVS), np.int64)
    logp_buf = np.zeros((steps, NUM_ENVS), np.float32)
    rew_buf = np.zeros((steps, NUM_ENVS), np.float32)
    obs_buf[steps] = obs
    rng = np.random.default_rng(0)
    random_actions = rng.integers(0, num_actions, (steps, NUM_ENVS))
    net = default_cnn(num_actions)

    def lean() -> int:
        obs_buf[0] = obs_buf[steps]
        with torch.inference_mode():
            for t in range(steps):
                logits = net(torch.from_numpy(obs_buf[t]))
                u = torch.rand_like(logits)
                a = torch.argmax(logits - torch.log(-torch.log(u)), dim=-1)
                logp_buf[t] = torch.log_softmax(logits, -1).gather(-1, a[:, None])[:, 0].numpy()
                act_buf[t] = a.numpy()
                o2, r, _, _, _ = env.step(act_buf[t])
                obs_buf[t + 1] = o2
                rew_buf[t] = r
        return steps * NUM_ENVS

    def env_only() -> int:
        for t in range(steps):
            env.step(random_actions[t])
        return steps * NUM_ENVS

    with TorchThreads(1):
        for name, fn in (("env_only", env_only), ("lean", lean)):
            stats = median_rate(fn, repeats=repeats)
            yield {
                "workload": WORKLOAD,
                "target": target,
                "variant": name,
                "env": ENV_ID,
                "num_envs": NUM_ENVS,
                "num_timesteps": steps * NUM_ENVS,
                "env_steps_per_s": stats.pop("per_s_median"),
                **stats,
            }
    env.close()


def run(target: str, repeats: int = 5):
    """Yield the runner's record, the two references and the runner / lean ratio."""
    base = {"workload": WORKLOAD, "target": target, "variant": "runner", "env": ENV_ID}
    base |= {"num_envs": NUM_ENVS, "num_timesteps": TIMESTEPS}
    runner = runner_record(base, partial(build_runner, target), TIMESTEPS, repeats)
    yield runner
    refs = {}
    for record in reference_records(target, repeats):
        refs[record["variant"]] = record
        yield record
    if "env_steps_per_s" in runner:
        ratio = runner["env_steps_per_s"] / refs["lean"]["env_steps_per_s"]
        yield {"workload": WORKLOAD, "target": target, "variant": "runner_vs_lean", "ratio": ratio}
    lstm = base | {"variant": "runner_lstm", "num_timesteps": LSTM_TIMESTEPS}
    build = partial(build_runner, target, model_config={"use_lstm": True})
    yield runner_record(lstm, build, LSTM_TIMESTEPS, repeats)


if __name__ == "__main__":  # pragma: no cover - use run.py
    for rec in run(sys.argv[1] if len(sys.argv) > 1 else "envrunners", repeats=3):
        emit(rec)
