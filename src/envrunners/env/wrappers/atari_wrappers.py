"""Atari preprocessing wrappers at RLlib's path (``ray.rllib.env.wrappers.atari_wrappers``).

The classic DeepMind wrappers (no-op starts, frame skip with max-pooling, life loss as
episode end, FIRE on reset, grayscale + resize, frame stacking, reward clipping) and
RLlib's two recipes built from them: ``wrap_atari_for_new_api_stack`` (frames as
float32 in [-1, 1)) and ``wrap_deepmind`` (uint8 frames). Behaviour follows RLlib 2.60,
including its quirks, so a policy sees the same observations on both libraries.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envrunners.utils.images import resize, rgb2gray

__all__ = [
    "ClipRewardEnv",
    "EpisodicLifeEnv",
    "FireResetEnv",
    "FrameStack",
    "FrameStackTrajectoryView",
    "GrayScaleAndResize",
    "MaxAndSkipEnv",
    "MonitorEnv",
    "NoopResetEnv",
    "NormalizedImageEnv",
    "WarpFrame",
    "get_wrapper_by_cls",
    "is_atari",
    "wrap_atari_for_new_api_stack",
    "wrap_deepmind",
]


def is_atari(env: gym.Env | str) -> bool:
    """Whether ``env`` (an env object or an id such as ``"ale_py:ALE/Pong-v5"``) is Atari.

    An id counts when it starts with ``"ALE/"`` or ``"ale_py:"``. An env object counts
    when its observations are images (3+ dims) and its wrapper chain ends in ale-py's
    ``AtariEnv``; RAM-observation Atari envs (1-D) do not count.
    """
    if isinstance(env, str):
        return env.startswith(("ALE/", "ale_py:"))
    shape = getattr(env.observation_space, "shape", None)
    if shape is not None and len(shape) <= 2:
        return False
    return "AtariEnv<ALE" in str(env)


def get_wrapper_by_cls(env: Any, cls: type) -> Any:
    """The first wrapper of type ``cls`` going inwards from ``env``, or None."""
    current = env
    while not isinstance(current, cls):
        if not isinstance(current, gym.Wrapper):
            return None
        current = current.env
    return current


class ClipRewardEnv(gym.RewardWrapper):
    """Rewards replaced by their sign: -1, 0 or +1."""

    def __init__(self, env: gym.Env):
        super().__init__(env)

    def reward(self, reward: Any) -> Any:
        return np.sign(reward)


class EpisodicLifeEnv(gym.Wrapper):
    """Losing a life ends the episode (``terminated``); the game itself resets only at game over.

    After a life-loss termination, ``reset`` does not restart the game: it takes one NOOP
    step and goes on from there, so later lives stay reachable.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.was_real_terminated = True

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.was_real_terminated = terminated
        lives = self.env.unwrapped.ale.lives()
        # lives == 0 can last a few frames in some games (Qbert) before the game
        # reports game over; only a drop to a positive count is a life loss here.
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any):
        if self.was_real_terminated:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, _, _, info = self.env.step(0)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireResetEnv(gym.Wrapper):
    """Presses FIRE (action 1), then action 2, after every reset: games that wait for FIRE start."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        if len(meanings) < 3 or meanings[1] != "FIRE":
            raise ValueError(
                f"FireResetEnv needs action 1 to be FIRE and at least 3 actions; {env} has "
                f"{meanings}. Wrap only games whose action meanings include FIRE."
            )

    def reset(self, **kwargs: Any):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, _ = self.env.step(1)
        if terminated or truncated:
            self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(2)
        if terminated or truncated:
            self.env.reset(**kwargs)
        return obs, info

    def step(self, action: Any):
        return self.env.step(action)


class FrameStack(gym.Wrapper):
    """The last ``k`` observations concatenated on the channel axis, newest last.

    After a reset all ``k`` slots hold the reset observation.
    """

    def __init__(self, env: gym.Env, k: int):
        super().__init__(env)
        self.k = k
        self.frames: deque = deque([], maxlen=k)
        space = env.observation_space
        height, width, channels = space.shape
        self.observation_space = spaces.Box(
            low=np.repeat(space.low, repeats=k, axis=-1),
            high=np.repeat(space.high, repeats=k, axis=-1),
            shape=(height, width, channels * k),
            dtype=space.dtype,
        )

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, infos = self.env.reset(seed=seed, options=options)
        for _ in range(self.k):
            self.frames.append(obs)
        return self._get_ob(), infos

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.frames.append(obs)
        return self._get_ob(), reward, terminated, truncated, info

    def _get_ob(self) -> np.ndarray:
        return np.concatenate(self.frames, axis=2)


class FrameStackTrajectoryView(gym.ObservationWrapper):
    """``(H, W, 1)`` frames squeezed to ``(H, W)``; stacking is left to the consumer."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        height, width, channels = env.observation_space.shape
        if channels != 1:
            raise ValueError(
                f"FrameStackTrajectoryView needs single-channel frames (H, W, 1); got "
                f"{env.observation_space.shape}. Apply a grayscale wrapper (WarpFrame) first."
            )
        self.observation_space = spaces.Box(
            low=0, high=255, shape=(height, width), dtype=env.observation_space.dtype
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.squeeze(observation, axis=-1)


class MaxAndSkipEnv(gym.Wrapper):
    """Repeats each action ``skip`` times, sums the rewards, returns the pixel-wise max of the
    last two frames (Atari sprites flicker between frames).

    If the episode ends before the second-to-last repeat, the returned frame is built from
    the frames kept from earlier steps, as in RLlib (that observation ends the episode).
    """

    def __init__(self, env: gym.Env, skip: int = 4):
        super().__init__(env)
        space = env.observation_space
        self._obs_buffer = np.zeros((2, *space.shape), dtype=space.dtype)
        self._skip = skip

    def step(self, action: Any):
        total_reward = 0.0
        terminated = truncated = info = None
        for i in range(self._skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if i == self._skip - 2:
                self._obs_buffer[0] = obs
            elif i == self._skip - 1:
                self._obs_buffer[1] = obs
            total_reward += reward
            if terminated or truncated:
                break
        return self._obs_buffer.max(axis=0), total_reward, terminated, truncated, info

    def reset(self, **kwargs: Any):
        return self.env.reset(**kwargs)


class MonitorEnv(gym.Wrapper):
    """Records the true episode returns and lengths (wrap it before ``EpisodicLifeEnv``)."""

    def __init__(self, env: gym.Env | None = None):
        super().__init__(env)
        self._current_reward: float | None = None
        self._num_steps: int | None = None
        self._total_steps: int | None = None
        self._episode_rewards: list[float] = []
        self._episode_lengths: list[int] = []
        self._num_episodes = 0
        self._num_returned = 0

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        if self._total_steps is None:
            self._total_steps = sum(self._episode_lengths)
        if self._current_reward is not None:
            self._episode_rewards.append(self._current_reward)
            self._episode_lengths.append(self._num_steps)
            self._num_episodes += 1
        self._current_reward = 0
        self._num_steps = 0
        return obs, info

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._current_reward += reward
        self._num_steps += 1
        self._total_steps += 1
        return obs, reward, terminated, truncated, info

    def get_episode_rewards(self) -> list[float]:
        return self._episode_rewards

    def get_episode_lengths(self) -> list[int]:
        return self._episode_lengths

    def get_total_steps(self) -> int | None:
        return self._total_steps

    def next_episode_results(self):
        """Yield ``(return, length)`` of each episode finished since the last call."""
        for i in range(self._num_returned, len(self._episode_rewards)):
            yield self._episode_rewards[i], self._episode_lengths[i]
        self._num_returned = len(self._episode_rewards)


class NoopResetEnv(gym.Wrapper):
    """After each reset, takes between 1 and ``noop_max`` NOOP actions (drawn from the env's
    ``np_random``) so episodes start from varied states; ``override_num_noops`` fixes the count.
    """

    def __init__(self, env: gym.Env, noop_max: int = 30):
        super().__init__(env)
        self.noop_max = noop_max
        self.override_num_noops: int | None = None
        self.noop_action = 0
        meanings = env.unwrapped.get_action_meanings()
        if meanings[0] != "NOOP":
            raise ValueError(f"NoopResetEnv needs action 0 to be NOOP; {env} has {meanings}.")

    def reset(self, **kwargs: Any):
        self.env.reset(**kwargs)
        if self.override_num_noops is not None:
            noops = self.override_num_noops
        else:
            noops = int(self.unwrapped.np_random.integers(1, self.noop_max + 1))
        if noops <= 0:
            raise ValueError(f"NoopResetEnv: the number of no-ops must be >= 1, got {noops}")
        obs = info = None
        for _ in range(noops):
            obs, _, terminated, truncated, info = self.env.step(self.noop_action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info

    def step(self, action: Any):
        return self.env.step(action)


class NormalizedImageEnv(gym.ObservationWrapper):
    """uint8 pixels mapped to float32 ``pixel / 128 - 1`` (range [-1, 0.992])."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.observation_space = spaces.Box(
            -1.0, 1.0, shape=self.observation_space.shape, dtype=np.float32
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return (observation.astype(np.float32) / 128.0) - 1.0


class GrayScaleAndResize(gym.ObservationWrapper):
    """RGB frames resized to ``dim`` x ``dim`` uint8, grayscale ``(dim, dim, 1)`` by default
    or RGB ``(dim, dim, 3)``.
    """

    def __init__(self, env: gym.Env, dim: int, grayscale: bool = True):
        super().__init__(env)
        self.width = dim
        self.height = dim
        self.grayscale = grayscale
        self.observation_space = spaces.Box(
            low=0,
            high=255,
            shape=(self.height, self.width, 1 if grayscale else 3),
            dtype=np.uint8,
        )

    def observation(self, frame: np.ndarray) -> np.ndarray:
        if self.grayscale:
            return resize(rgb2gray(frame), height=self.height, width=self.width)[:, :, None]
        return resize(frame, height=self.height, width=self.width)


WarpFrame = GrayScaleAndResize


def wrap_atari_for_new_api_stack(
    env: gym.Env,
    dim: int = 64,
    frameskip: int = 4,
    framestack: int | None = None,
    grayscale: bool = True,
) -> gym.Env:
    """Wrap an Atari env (RGB frames, ideally made with ``frameskip=1``) for new-stack sampling.

    From the inside out: a 108,000-step time limit, grayscale + resize to ``dim`` x ``dim``,
    pixels to float32 in [-1, 1), ``frameskip`` repeats with max over the last two frames,
    1-30 NOOPs after reset, a lost life ends the episode, FIRE after reset where the game
    has it, and the last ``framestack`` frames stacked on the channel axis. Rewards are
    not clipped (a learner's business).

    Example: ``wrap_atari_for_new_api_stack(gym.make("ALE/Pong-v5", frameskip=1), dim=84,
    framestack=4)`` gives observations of shape (84, 84, 4), float32.
    """
    env = gym.wrappers.TimeLimit(env, max_episode_steps=108000)
    env = WarpFrame(env, dim=dim, grayscale=grayscale)
    env = NormalizedImageEnv(env)
    if frameskip > 1:
        env = MaxAndSkipEnv(env, skip=frameskip)
    env = NoopResetEnv(env, noop_max=30)
    env = EpisodicLifeEnv(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireResetEnv(env)
    if framestack:
        env = FrameStack(env, k=framestack)
    return env


def wrap_deepmind(
    env: gym.Env, dim: int = 84, framestack: bool = True, noframeskip: bool = False
) -> gym.Env:
    """The DeepMind DQN preprocessing: uint8 ``(dim, dim, 4)`` grayscale frames.

    Episode stats are recorded first (``MonitorEnv``), then NOOP starts, a 4-frame max-skip
    when ``noframeskip`` is True (for an env that does not skip frames itself), life loss
    as episode end, FIRE on reset where the game has it, grayscale + resize, and 4 stacked
    frames when ``framestack``. Rewards are not clipped.
    """
    env = MonitorEnv(env)
    env = NoopResetEnv(env, noop_max=30)
    if env.spec is not None and noframeskip is True:
        env = MaxAndSkipEnv(env, skip=4)
    env = EpisodicLifeEnv(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireResetEnv(env)
    env = WarpFrame(env, dim)
    if framestack is True:
        env = FrameStack(env, 4)
    return env
