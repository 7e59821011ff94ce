"""envrunners.env.wrappers.atari_wrappers: RLlib 2.60's Atari wrappers, on real ALE games.

Exact counting checks run on a small fake Atari-like env (frames hold the step
number); the rest on ``ALE/Pong-v5`` and ``ALE/Breakout-v5`` from ale-py.
"""

from __future__ import annotations

import hashlib
import sys

import ale_py
import gymnasium as gym
import numpy as np
import pytest

from envrunners.env.wrappers.atari_wrappers import (
    ClipRewardEnv,
    EpisodicLifeEnv,
    FireResetEnv,
    FrameStack,
    FrameStackTrajectoryView,
    GrayScaleAndResize,
    MaxAndSkipEnv,
    MonitorEnv,
    NoopResetEnv,
    NormalizedImageEnv,
    WarpFrame,
    get_wrapper_by_cls,
    is_atari,
    wrap_atari_for_new_api_stack,
    wrap_deepmind,
)
from envrunners.utils import images

gym.register_envs(ale_py)

# RLlib's Atari setup: the wrappers skip frames, so ALE does not.
ALE_KWARGS = {"frameskip": 1, "repeat_action_probability": 0.0}

# sha256 of the observations of a seeded Pong rollout through RLlib 2.60's
# wrap_atari_for_new_api_stack(dim=84, framestack=4) (OpenCV 4.12 and 5.0 agree).
RLLIB_PONG_DIGEST = "850087146665c594fb707da213418ed8d2f2bc6789a05e641c6278b0187280eb"


def pong(**kwargs) -> gym.Env:
    return gym.make("ALE/Pong-v5", **{**ALE_KWARGS, **kwargs})


class _Lives:
    def __init__(self, n: int):
        self.n = n

    def lives(self) -> int:
        return self.n


class CounterEnv(gym.Env):
    """Atari-like fake: every frame is filled with the step number since reset.

    Reward at step t is ``rewards[t - 1]`` (1.0 by default); one life is lost every
    ``life_every`` steps; the game ends when lives run out or after ``episode_len`` steps.
    """

    def __init__(self, shape=(4, 4, 1), episode_len=100, life_every=None, rewards=None, lives=3):
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.episode_len, self.life_every, self.rewards = episode_len, life_every, rewards
        self.start_lives = lives
        self.ale = _Lives(lives)
        self.t = 0
        self.resets = 0
        self.actions: list[int] = []

    def get_action_meanings(self) -> list[str]:
        return ["NOOP", "FIRE", "RIGHT", "LEFT"]

    def _obs(self) -> np.ndarray:
        return np.full(self.observation_space.shape, self.t % 256, np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.resets += 1
        self.ale.n = self.start_lives
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.actions.append(int(action))
        if self.life_every and self.t % self.life_every == 0:
            self.ale.n -= 1
        reward = self.rewards[self.t - 1] if self.rewards else 1.0
        terminated = self.ale.n == 0 or self.t >= self.episode_len
        return self._obs(), reward, terminated, False, {"t": self.t}


# --- is_atari ---------------------------------------------------------------


@pytest.mark.parametrize(
    "env_id, expected",
    [
        ("ALE/Pong-v5", True),
        ("ale_py:ALE/Breakout-v5", True),
        ("CartPole-v1", False),
        ("envrunners/StatelessCartPole-v1", False),
    ],
)
def test_is_atari_on_ids(env_id, expected):
    assert is_atari(env_id) is expected


def test_is_atari_on_env_objects():
    raw = pong()
    assert is_atari(raw)
    assert is_atari(wrap_atari_for_new_api_stack(pong(), dim=84, framestack=4))
    assert not is_atari(gym.make("CartPole-v1"))
    # RAM observations (1-D) are not image Atari envs, as in RLlib.
    assert not is_atari(gym.make("ALE/Pong-v5", obs_type="ram"))


# --- wrap_atari_for_new_api_stack -------------------------------------------


def test_new_api_stack_wrapping_gives_normalized_float_frames_84x84x4():
    env = wrap_atari_for_new_api_stack(pong(), dim=84, framestack=4)
    space = env.observation_space
    assert space.shape == (84, 84, 4) and space.dtype == np.float32
    assert np.all(space.low == -1.0) and np.all(space.high == 1.0)
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        obs, *_ = env.step(env.action_space.sample())
    assert obs.shape == (84, 84, 4) and obs.dtype == np.float32
    assert space.contains(obs)
    # pixel / 128 - 1: every value is an 8-bit grey level mapped into [-1, 1).
    pixels = (obs + 1.0) * 128.0
    assert np.array_equal(pixels, np.round(pixels))
    assert pixels.min() >= 0 and pixels.max() <= 255
    # The recipe's wrappers, in RLlib's order (outermost first), no reward clipping.
    chain = []
    current = env
    while isinstance(current, gym.Wrapper):
        chain.append(type(current))
        current = current.env
    assert chain[:8] == [
        FrameStack,
        FireResetEnv,
        EpisodicLifeEnv,
        NoopResetEnv,
        MaxAndSkipEnv,
        NormalizedImageEnv,
        GrayScaleAndResize,
        gym.wrappers.TimeLimit,
    ]
    assert get_wrapper_by_cls(env, ClipRewardEnv) is None
    assert get_wrapper_by_cls(env, gym.wrappers.TimeLimit)._max_episode_steps == 108000


def test_new_api_stack_defaults_match_rllib():
    """RLlib 2.60's defaults: dim=64, no frame stacking, grayscale, frameskip 4."""
    env = wrap_atari_for_new_api_stack(pong())
    assert env.observation_space.shape == (64, 64, 1)
    assert get_wrapper_by_cls(env, FrameStack) is None
    assert get_wrapper_by_cls(env, MaxAndSkipEnv)._skip == 4
    color = wrap_atari_for_new_api_stack(pong(), dim=42, frameskip=1, grayscale=False)
    assert color.observation_space.shape == (42, 42, 3)
    assert get_wrapper_by_cls(color, MaxAndSkipEnv) is None


def test_new_api_stack_frames_match_rllib_pixel_for_pixel():
    env = wrap_atari_for_new_api_stack(pong(), dim=84, framestack=4)
    digest = hashlib.sha256()
    obs, _ = env.reset(seed=3)
    digest.update(obs.tobytes())
    for action in [0, 1, 2, 3, 4, 5] * 5:
        obs, *_ = env.step(action)
        digest.update(obs.tobytes())
    assert digest.hexdigest() == RLLIB_PONG_DIGEST


def test_wrapped_pong_in_a_vector_env():
    def make():
        return wrap_atari_for_new_api_stack(pong(), dim=84, framestack=4)

    vec = gym.vector.SyncVectorEnv([make, make])
    obs, _ = vec.reset(seed=0)
    assert obs.shape == (2, 84, 84, 4) and obs.dtype == np.float32
    obs, rewards, *_ = vec.step(np.array([0, 1]))
    assert obs.shape == (2, 84, 84, 4) and rewards.shape == (2,)
    vec.close()


def test_wrap_deepmind_keeps_uint8_frames():
    env = wrap_deepmind(pong(), dim=84)
    assert env.observation_space.shape == (84, 84, 4)
    assert env.observation_space.dtype == np.uint8
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.uint8 and obs.shape == (84, 84, 4)
    assert get_wrapper_by_cls(env, MonitorEnv) is not None


# --- the single wrappers -----------------------------------------------------


def test_frame_stack_puts_the_newest_frame_last():
    env = FrameStack(CounterEnv(), k=4)
    assert env.observation_space.shape == (4, 4, 4)
    obs, _ = env.reset(seed=0)
    assert [int(obs[0, 0, i]) for i in range(4)] == [0, 0, 0, 0]
    env.step(0)
    obs, *_ = env.step(0)
    assert [int(obs[0, 0, i]) for i in range(4)] == [0, 0, 1, 2]
    for _ in range(3):
        obs, *_ = env.step(0)
    assert [int(obs[0, 0, i]) for i in range(4)] == [2, 3, 4, 5]


def test_frame_stack_on_pong_shifts_by_one_frame_per_step():
    env = wrap_atari_for_new_api_stack(pong(), dim=84, framestack=4)
    first, _ = env.reset(seed=0)
    assert all(np.array_equal(first[..., 0], first[..., i]) for i in range(4))
    prev = first
    for action in (2, 3, 2):
        obs, *_ = env.step(action)
        assert np.array_equal(obs[..., :3], prev[..., 1:])
        prev = obs


def test_noop_reset_takes_between_1_and_noop_max_noops():
    counts = set()
    for seed in range(60):
        inner = CounterEnv()
        env = NoopResetEnv(inner, noop_max=5)
        obs, _ = env.reset(seed=seed)
        assert 1 <= inner.t <= 5 and int(obs[0, 0, 0]) == inner.t
        assert set(inner.actions) == {0}
        counts.add(inner.t)
    assert counts == {1, 2, 3, 4, 5}
    # Same seed, same number of no-ops; a fixed override wins.
    a, b = CounterEnv(), CounterEnv()
    NoopResetEnv(a, noop_max=30).reset(seed=7)
    NoopResetEnv(b, noop_max=30).reset(seed=7)
    assert a.t == b.t
    fixed = CounterEnv()
    env = NoopResetEnv(fixed, noop_max=30)
    env.override_num_noops = 3
    env.reset(seed=0)
    assert fixed.t == 3


def test_noop_reset_on_pong_stays_within_30_frames():
    for seed in (0, 1, 2):
        env = NoopResetEnv(pong(), noop_max=30)
        env.reset(seed=seed)
        assert 1 <= env.unwrapped.ale.getEpisodeFrameNumber() <= 30


def test_noop_reset_needs_noop_as_action_0():
    class NoNoop(CounterEnv):
        def get_action_meanings(self):
            return ["FIRE", "NOOP"]

    with pytest.raises(ValueError, match="NOOP"):
        NoopResetEnv(NoNoop())


def test_max_and_skip_sums_rewards_and_maxes_the_last_two_frames():
    inner = CounterEnv(rewards=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    env = MaxAndSkipEnv(inner, skip=4)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(2)
    assert inner.actions == [2, 2, 2, 2]
    assert int(obs[0, 0, 0]) == 4 and reward == 10.0 and info == {"t": 4}
    # An episode that ends mid-skip stops stepping at once.
    short = CounterEnv(episode_len=6)
    env = MaxAndSkipEnv(short, skip=4)
    env.reset(seed=0)
    env.step(0)
    _, reward, terminated, _, _ = env.step(0)
    assert terminated and short.t == 6 and reward == 2.0


def test_clip_reward_keeps_only_the_sign():
    env = ClipRewardEnv(CounterEnv(rewards=[-3.0, 0.0, 0.5, 7.0]))
    env.reset(seed=0)
    assert [env.step(0)[1] for _ in range(4)] == [-1.0, 0.0, 1.0, 1.0]


def test_episodic_life_ends_the_episode_per_life_but_resets_only_at_game_over():
    inner = CounterEnv(life_every=3, lives=3)
    env = EpisodicLifeEnv(inner)
    env.reset(seed=0)
    assert env.lives == 3 and inner.resets == 1
    results = [env.step(1) for _ in range(3)]
    assert [r[2] for r in results] == [False, False, True]  # life lost -> terminated
    assert env.lives == 2 and not env.was_real_terminated
    obs, _ = env.reset()
    # No real reset: one NOOP step continues the same game.
    assert inner.resets == 1 and inner.actions[-1] == 0 and int(obs[0, 0, 0]) == 4
    for _ in range(50):
        _, _, terminated, _, _ = env.step(1)
        if terminated and env.was_real_terminated:
            break
        if terminated:
            env.reset()
    assert env.was_real_terminated and inner.ale.n == 0
    env.reset()
    assert inner.resets == 2 and env.lives == 3


def test_episodic_life_on_breakout():
    env = EpisodicLifeEnv(gym.make("ALE/Breakout-v5", repeat_action_probability=0.0))
    env.reset(seed=0)
    ale = env.unwrapped.ale
    assert env.lives == 5
    rng = np.random.default_rng(0)
    for _ in range(3000):
        _, _, terminated, truncated, _ = env.step(int(rng.integers(4)))
        if terminated or truncated:
            break
    assert terminated and not env.was_real_terminated and env.lives == 4
    frame = ale.getEpisodeFrameNumber()
    env.reset()
    # The game goes on (same episode in ALE), with the remaining lives.
    assert ale.getEpisodeFrameNumber() > frame and env.lives == 4


def test_fire_reset_presses_fire_then_2_after_reset():
    inner = CounterEnv()
    env = FireResetEnv(inner)
    obs, _ = env.reset(seed=0)
    assert inner.actions == [1, 2] and int(obs[0, 0, 0]) == 2
    real = FireResetEnv(pong())
    real.reset(seed=0)
    assert real.unwrapped.ale.getEpisodeFrameNumber() == 2

    class NoFire(CounterEnv):
        def get_action_meanings(self):
            return ["NOOP", "RIGHT", "LEFT"]

    with pytest.raises(ValueError, match="FIRE"):
        FireResetEnv(NoFire())


def test_warp_frame_and_normalization():
    env = WarpFrame(pong(), dim=84)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (84, 84, 1) and obs.dtype == np.uint8
    color = GrayScaleAndResize(pong(), dim=42, grayscale=False)
    assert color.reset(seed=0)[0].shape == (42, 42, 3)
    norm = NormalizedImageEnv(CounterEnv())
    norm.reset(seed=0)
    for _ in range(127):
        norm.step(0)
    obs, *_ = norm.step(0)
    assert obs.dtype == np.float32 and float(obs[0, 0, 0]) == 0.0  # 128 / 128 - 1
    view = FrameStackTrajectoryView(CounterEnv())
    assert view.observation_space.shape == (4, 4)
    assert view.reset(seed=0)[0].shape == (4, 4)


def test_monitor_env_records_true_episode_returns():
    env = MonitorEnv(CounterEnv(episode_len=3))
    env.reset(seed=0)
    for _ in range(3):
        env.step(0)
    env.reset()
    assert env.get_episode_rewards() == [3.0] and env.get_episode_lengths() == [3]
    assert list(env.next_episode_results()) == [(3.0, 3)]
    assert list(env.next_episode_results()) == []


def test_missing_opencv_names_the_atari_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)
    monkeypatch.setattr(images, "_loaded", [])
    with pytest.raises(ModuleNotFoundError, match=r"envrunners\[atari\]"):
        images.resize(np.zeros((8, 8), np.uint8), 4, 4)
