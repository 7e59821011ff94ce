"""Any RLModule through SingleAgentEnvRunner: user modules, the default LSTM and CNN.

Stateful sampling: a per-sub-env state column carried between steps and across
``sample()`` calls, reset exactly when that sub-env's episode starts (autoreset,
sub-env restart, whole-env failure, forced reset), with ``Columns.STATE_OUT``
recorded per step in the episodes (RLlib's layout: nested like
``get_initial_state()``, one ``(1, cell)`` row per step) so a learner can rebuild
``state_in``. Real gymnasium envs: CartPole, Pendulum, a counting env and a tiny
image env.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from tests.envs.simple import CountingEnv, FailingEnv
from torch import nn

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core._nested import map_structure
from envrunners.core.columns import Columns
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.core.rl_module.torch.torch_rl_module import TorchRLModule
from envrunners.env.env_runner import ENV_STEP_FAILURE
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.env.vector.fast_sync_vector_env import FastSyncVectorEnv
from envrunners.errors import ConfigError, ModuleActingError
from envrunners.sampling.buffers import RecurrentState
from envrunners.sampling.single_agent import SingleAgentSampler

SO = Columns.STATE_OUT


# -- modules --------------------------------------------------------------------------
class CounterModule(TorchRLModule):
    """Stateful: its state counts the steps of the episode; outputs ACTIONS.

    ``count_in`` (the state it was given) therefore equals the step's index in
    the episode iff the sampler carries and resets the state correctly. With
    ``lstm_use_prev_action`` / ``lstm_use_prev_reward`` in the model config it
    echoes the ``prev_actions`` / ``prev_rewards`` it was fed.
    """

    def setup(self):
        self.dummy = nn.Linear(1, 1)

    def get_initial_state(self):
        return {"count": torch.zeros(1)}

    def _forward(self, batch, **kwargs):
        count = batch[Columns.STATE_IN]["count"]  # (B, 1)
        rows = count.shape[0]
        out = {
            Columns.ACTIONS: torch.randint(0, 2, (rows, 1)),
            Columns.ACTION_LOGP: torch.zeros(rows, 1),
            "count_in": count.clone(),  # (B, T=1)
            Columns.STATE_OUT: {"count": count + 1},
        }
        if "prev_actions" in batch:
            out["prev_a_seen"] = batch["prev_actions"].float()
        if "prev_rewards" in batch:
            out["prev_r_seen"] = batch["prev_rewards"].float()
        return out


class ActionsModule(TorchRLModule):
    """Stateless user module that returns ACTIONS (+ ACTION_LOGP) itself."""

    def setup(self):
        self.net = nn.Linear(self.observation_space.shape[0], self.action_space.n)

    def _forward(self, batch, **kwargs):
        logits = self.net(batch[Columns.OBS].float())
        return {
            Columns.ACTIONS: logits.argmax(-1),
            Columns.ACTION_LOGP: torch.full((logits.shape[0],), -0.5),
        }


class DistInputsModule(TorchRLModule):
    """Stateless user module that returns ACTION_DIST_INPUTS (diag Gaussian on Pendulum)."""

    def setup(self):
        self.net = nn.Linear(self.observation_space.shape[0], 2 * self.action_space.shape[0])
        self.forward_calls = 0

    def _forward(self, batch, **kwargs):
        self.forward_calls += 1
        return {Columns.ACTION_DIST_INPUTS: self.net(batch[Columns.OBS].float())}


class NoActionsModule(TorchRLModule):
    """Returns neither ACTIONS nor ACTION_DIST_INPUTS."""

    def setup(self):
        self.net = nn.Linear(self.observation_space.shape[0], 2)

    def _forward(self, batch, **kwargs):
        return {"features": self.net(batch[Columns.OBS].float())}


class TinyImageEnv(gym.Env):
    """10x10x3 uint8 frames (pixel value = step index), 8-step episodes."""

    def __init__(self, config=None):
        self.observation_space = gym.spaces.Box(0, 255, (10, 10, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.t = 0

    def _obs(self):
        return np.full((10, 10, 3), self.t * 20, np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= 8, False, {}


# -- helpers --------------------------------------------------------------------------
def make_runner(env, num_envs=2, spec=None, model_config=None, fragment=10, **fault):
    config = (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(env)
        .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=fragment)
        .debugging(seed=0)
    )
    if fault:
        config = config.fault_tolerance(**fault)
    if spec is not None or model_config is not None:
        config = config.rl_module(
            **({"rl_module_spec": spec} if spec is not None else {}),
            **({"model_config": model_config} if model_config is not None else {}),
        )
    return SingleAgentEnvRunner(config=config)


def counter_spec(**model_config):
    return RLModuleSpec(module_class=CounterModule, model_config=model_config)


def check_counts(episodes, counting_env=False):
    """count_in == step index in the episode, STATE_OUT == count_in + 1, every step.

    ``counting_env``: the observations count the episode's steps too (CountingEnv).
    """
    for e in episodes:
        count_in = e.get_extra_model_outputs("count_in")
        state_out = e.get_extra_model_outputs(SO)
        assert set(state_out) == {"count"}
        assert state_out["count"].shape == (len(e), 1)  # (T, *initial_state_leaf_shape)
        expected = np.arange(e.t_started, e.t_started + len(e), dtype=np.float32)
        np.testing.assert_array_equal(count_in, expected)
        np.testing.assert_array_equal(state_out["count"][:, 0], expected + 1)
        if counting_env:
            np.testing.assert_array_equal(e.get_observations()[:-1, 0], count_in)


# -- user modules -----------------------------------------------------------------------
def test_user_module_returning_actions_samples_cartpole():
    spec = RLModuleSpec(module_class=ActionsModule)
    runner = make_runner("CartPole-v1", num_envs=3, spec=spec)
    try:
        assert isinstance(runner.module, ActionsModule)
        eps = runner.sample(num_timesteps=60)
        assert sum(len(e) for e in eps) >= 60
        for e in eps:
            actions = e.get_actions()
            assert actions.dtype == np.int64 and set(np.unique(actions)) <= {0, 1}
            np.testing.assert_array_equal(e.get_extra_model_outputs(Columns.ACTION_LOGP), -0.5)
            assert SO not in e.extra_model_outputs
    finally:
        runner.stop()


def test_user_module_with_dist_inputs_one_forward_per_vector_step_pendulum():
    spec = RLModuleSpec(module_class=DistInputsModule)
    runner = make_runner("Pendulum-v1", num_envs=4, spec=spec)
    try:
        eps = runner.sample(num_timesteps=40)
        # 4 sub-envs, 40 timesteps: 10 vector steps, one forward each.
        assert runner.module.forward_calls == 10
        for e in eps:
            actions = e.get_actions()
            assert actions.dtype == np.float32 and actions.shape == (len(e), 1)
            assert e.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS).shape == (len(e), 2)
            logp = e.get_extra_model_outputs(Columns.ACTION_LOGP)
            assert logp.dtype == np.float32 and np.all(np.isfinite(logp))
    finally:
        runner.stop()


def test_output_without_actions_or_dist_inputs_fails_in_sample():
    runner = make_runner("CartPole-v1", spec=RLModuleSpec(module_class=NoActionsModule))
    try:
        with pytest.raises(ModuleActingError, match="returned neither Columns.ACTIONS"):
            runner.sample(num_timesteps=4)
    finally:
        runner.stop()


def test_use_lstm_with_custom_stateless_module_fails_at_build():
    spec = RLModuleSpec(module_class=ActionsModule, model_config={"use_lstm": True})
    with pytest.raises(ConfigError, match="use_lstm"):
        make_runner("CartPole-v1", spec=spec)


# -- state carried and reset ------------------------------------------------------------
def test_state_counts_episode_steps_across_sample_calls_cartpole():
    runner = make_runner("CartPole-v1", num_envs=3, spec=counter_spec())
    try:
        seen_continuations = 0
        for _ in range(8):
            eps = runner.sample(num_timesteps=30)
            check_counts(eps)
            seen_continuations += sum(e.t_started > 0 for e in eps)
        assert seen_continuations > 0  # chunks that continue across sample() calls
        # Episode mode resets the envs and the state.
        eps = runner.sample(num_episodes=2)
        check_counts(eps)
        assert all(e.t_started == 0 and e.is_done for e in eps)
    finally:
        runner.stop()


def test_state_reset_on_autoreset_row_counting_env():
    # 5-step episodes, 2 sub-envs: every boundary is a NEXT_STEP autoreset, and the
    # observation (the env's step count) must match the state's count on every row.
    runner = make_runner(CountingEnv, num_envs=2, spec=counter_spec())
    try:
        for _ in range(4):
            eps = runner.sample(num_timesteps=7)
            check_counts(eps, counting_env=True)
    finally:
        runner.stop()


def test_force_reset_resets_state():
    runner = make_runner("CartPole-v1", num_envs=2, spec=counter_spec())
    try:
        runner.sample(num_timesteps=6)
        eps = runner.sample(num_timesteps=6, force_reset=True)
        assert all(e.t_started == 0 for e in eps)
        check_counts(eps)
    finally:
        runner.stop()


def test_sub_env_restart_resets_only_that_sub_envs_state():
    FailingEnv.failures = 0
    env_config = {"episode_len": 50, "fail_at_step": 4}
    config = (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(FailingEnv, env_config=env_config)
        .env_runners(num_envs_per_env_runner=2)
        .fault_tolerance(restart_failed_sub_environments=True)
        .rl_module(rl_module_spec=counter_spec())
    )
    runner = SingleAgentEnvRunner(config=config)
    try:
        eps = runner.sample(num_timesteps=12)
        eps += runner.sample(num_timesteps=12)
        assert FailingEnv.failures == 1
        check_counts(eps, counting_env=True)
        # Sub-env 1 never failed: its one episode counted on without a reset.
        state = runner._sampler.recurrent.state["count"][:, 0]
        assert state[1] > state[0] >= 1
    finally:
        runner.stop()


def test_recreated_async_env_resets_every_state(tmp_path):
    """A sub-env raising in an async vector env: the runner recreates the whole env."""
    FailingEnv.failures = 0
    env_config = {"episode_len": 50, "fail_at_step": 4, "flag_file": str(tmp_path / "failed")}
    config = (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(FailingEnv, env_config=env_config)
        .env_runners(num_envs_per_env_runner=2, gym_env_vectorize_mode="async")
        .fault_tolerance(restart_failed_sub_environments=True)
        .rl_module(rl_module_spec=counter_spec())
    )
    runner = SingleAgentEnvRunner(config=config)
    try:
        eps = runner.sample(num_timesteps=10)
        assert (tmp_path / "failed").exists()
        assert runner.get_metrics()["num_env_step_failures"] == 1
        # 3 steps before the failure were lost; both sub-envs restarted from 0.
        np.testing.assert_array_equal(runner._sampler.recurrent.state["count"][:, 0], [5, 5])
        # The recreated env is reset once more by the next sample() (as RLlib's
        # make_env asks for), and the state with it.
        eps += runner.sample(num_timesteps=6)
        np.testing.assert_array_equal(runner._sampler.recurrent.state["count"][:, 0], [3, 3])
        check_counts(eps, counting_env=True)
    finally:
        runner.stop()


def test_whole_env_failure_resets_every_state():
    """Sampler level: ``step_fn`` reports a recreated vector env once."""
    env = FastSyncVectorEnv([lambda: CountingEnv({"episode_len": 50})] * 2, copy=False)
    calls = {"n": 0}

    def step_fn(actions):
        calls["n"] += 1
        return ENV_STEP_FAILURE if calls["n"] == 4 else env.step(actions)

    def act_fn(obs, explore, t, state, extra_inputs):
        count = state["count"]
        return (
            np.zeros(len(count), np.int64),
            {"count_in": count[:, 0].copy()},
            {"count": count + 1},
        )

    sampler = SingleAgentSampler(
        env,
        observation_space=env.single_observation_space,
        action_space=env.single_action_space,
        step_fn=step_fn,
    )
    sampler.recurrent = RecurrentState({"count": np.zeros(1, np.float32)}, 2)
    sampler.start(*env.reset())
    result = sampler.run(act_fn=act_fn, explore=True, num_timesteps=10)
    assert result.num_env_failures == 1
    check_counts(result.episodes, counting_env=True)
    assert all(e.t_started == 0 for e in result.episodes)


def test_prev_actions_and_rewards_fed_zero_at_episode_start():
    spec = counter_spec(lstm_use_prev_action=True, lstm_use_prev_reward=True)
    runner = make_runner(CountingEnv, num_envs=2, spec=spec)
    try:
        for _ in range(3):
            eps = runner.sample(num_timesteps=8)
            check_counts(eps)
            for e in eps:
                seen_a = e.get_extra_model_outputs("prev_a_seen")
                seen_r = e.get_extra_model_outputs("prev_r_seen")
                # Previous step's action/reward, incl. the carried lookback step.
                lb = int(e.t_started > 0)
                actions = e.get_actions(slice(-lb, len(e)), neg_index_as_lookback=True)
                rewards = e.get_rewards(slice(-lb, len(e)), neg_index_as_lookback=True)
                if e.t_started == 0:
                    assert seen_a[0] == 0 and seen_r[0] == 0
                    actions, rewards = np.r_[0, actions], np.r_[0.0, rewards]
                np.testing.assert_array_equal(seen_a, actions[: len(e)])
                np.testing.assert_array_equal(seen_r, rewards[: len(e)])
    finally:
        runner.stop()


# -- the default LSTM -----------------------------------------------------------------
@pytest.mark.parametrize("vf_share_layers", [True, False])
def test_default_lstm_state_out_rebuilds_state_in_across_chunks(vf_share_layers):
    model_config = {"use_lstm": True, "lstm_cell_size": 8, "vf_share_layers": vf_share_layers}
    runner = make_runner("CartPole-v1", num_envs=3, model_config=model_config)
    module = runner.module
    try:
        assert module.is_stateful()
        initial = map_structure(lambda t: t.numpy(), module.get_initial_state())
        last_state_out = {}
        checked_continuations = 0
        for _ in range(4):
            for e in runner.sample(num_timesteps=24):
                states = e.get_extra_model_outputs(SO)
                # RLlib's layout: nested like get_initial_state(), (T, 1, cell) leaves.
                n = len(e)
                map_structure(lambda s, i, n=n: _assert_shape(s, (n, *i.shape)), states, initial)
                if e.t_started == 0:
                    state_in = initial
                else:  # the carried lookback step holds the previous chunk's last state
                    state_in = e.get_extra_model_outputs(SO, -1, neg_index_as_lookback=True)
                    map_structure(np.testing.assert_array_equal, state_in, last_state_out[e.id_])
                    checked_continuations += 1
                obs = e.get_observations(slice(0, len(e)))
                for t in range(len(e)):
                    out = _forward_one(module, obs[t], state_in)
                    state_t = map_structure(lambda s, t=t: s[t], states)
                    map_structure(
                        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                        out,
                        state_t,
                    )
                    state_in = state_t  # state_in at t+1 = state_out at t
                if not e.is_done:
                    last_state_out[e.id_] = map_structure(lambda s: s[-1], states)
        assert checked_continuations > 0
    finally:
        runner.stop()


def _assert_shape(array, shape):
    assert array.shape == shape and array.dtype == np.float32


def _forward_one(module, obs, state_in):
    """The module's own forward on one step (B=1, T=1): its state_out as numpy."""
    batch = {
        Columns.OBS: torch.from_numpy(np.asarray(obs, np.float32)[None, None]),
        Columns.STATE_IN: map_structure(lambda s: torch.from_numpy(np.asarray(s)[None]), state_in),
    }
    with torch.no_grad():
        out = module.forward_inference(batch)
    return map_structure(lambda s: s[0].numpy(), out[SO])


def test_default_lstm_with_prev_action_and_reward_samples():
    model_config = {
        "use_lstm": True,
        "lstm_cell_size": 4,
        "lstm_use_prev_action": True,
        "lstm_use_prev_reward": True,
    }
    runner = make_runner("CartPole-v1", num_envs=2, model_config=model_config)
    try:
        assert runner._sampler.recurrent.extra_inputs is not None
        eps = runner.sample(num_timesteps=40)
        assert sum(len(e) for e in eps) >= 40
        assert all(SO in e.extra_model_outputs for e in eps)
    finally:
        runner.stop()


# -- images: uint8 stays uint8 ----------------------------------------------------------
@pytest.mark.parametrize("use_lstm", [False, True])
def test_default_cnn_on_uint8_images_keeps_uint8(use_lstm):
    model_config = {"use_lstm": use_lstm, "lstm_cell_size": 8}
    runner = make_runner(TinyImageEnv, num_envs=2, model_config=model_config)
    try:
        assert runner._sampler._obs is None or runner._sampler._obs.data.dtype == np.uint8
        for _ in range(2):
            eps = runner.sample(num_timesteps=20)
            for e in eps:
                obs = e.get_observations()
                assert obs.dtype == np.uint8 and obs.shape[1:] == (10, 10, 3)
                assert (SO in e.extra_model_outputs) == use_lstm
        assert runner._sampler._obs.data.dtype == np.uint8
        done = runner.sample(num_episodes=2)
        assert all(len(e) == 8 and e.get_observations().dtype == np.uint8 for e in done)
    finally:
        runner.stop()


def test_sampler_buffers_keep_uint8_frames():
    env = FastSyncVectorEnv([TinyImageEnv] * 3, copy=False)
    sampler = SingleAgentSampler(
        env,
        observation_space=env.single_observation_space,
        action_space=env.single_action_space,
        step_fn=env.step,
    )
    sampler.start(*env.reset(seed=0))
    result = sampler.run(act_fn=None, explore=True, num_timesteps=30)
    assert sampler._obs.data.dtype == np.uint8
    for e in result.episodes:
        obs = e.get_observations()
        assert obs.dtype == np.uint8
        np.testing.assert_array_equal(obs[:, 0, 0, 0], 20 * np.arange(e.t_started, e.t + 1))


def test_default_lstm_on_stateless_cartpole():
    classes = pytest.importorskip("envrunners.examples.envs.classes.stateless_cartpole")
    runner = make_runner(
        classes.StatelessCartPole, num_envs=4, model_config={"use_lstm": True, "lstm_cell_size": 16}
    )
    try:
        for _ in range(2):
            eps = runner.sample(num_timesteps=64)
            assert sum(len(e) for e in eps) >= 64
            for e in eps:
                assert e.get_observations().shape[1:] == (2,)
                n = len(e)
                map_structure(
                    lambda s, n=n: _assert_shape(s, (n, 1, 16)), e.get_extra_model_outputs(SO)
                )
    finally:
        runner.stop()
