"""``PPOLearner`` on a stateful module (``use_lstm``): max_seq_len sequences, STATE_IN, loss mask.

The episodes are built by hand, with ``state_out`` per step as a sampler records
it, and every expectation is written out from the rule: chunk ``len + 1``
positions (steps plus the bootstrap observation) into sequences of ``T``,
zero-pad, start each sequence from the ``STATE_OUT`` one step before it (the
lookback's for a continued chunk, the initial state for a fresh episode).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from envrunners.algorithms.ppo import PPOConfig
from envrunners.algorithms.ppo.ppo_learner import (
    PGLearner,
    PPOLearner,
    compute_gae,
    sequence_layout,
)
from envrunners.core.columns import Columns
from envrunners.env.single_agent_episode import SingleAgentEpisode

T = 3
CELL = 2
OBS_SPACE = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
ACT_SPACE = gym.spaces.Discrete(2)


def _learner(cls=PPOLearner, share=True, prev=False, **training):
    config = (
        PPOConfig()
        .training(minibatch_size=6, num_epochs=2, lr=1e-2, gamma=0.9, lambda_=0.8, **training)
        .rl_module(
            model_config={
                "use_lstm": True,
                "lstm_cell_size": CELL,
                "max_seq_len": T,
                "fcnet_hiddens": [4],
                "vf_share_layers": share,
                "lstm_use_prev_action": prev,
                "lstm_use_prev_reward": prev,
            }
        )
        .debugging(seed=0)
    )
    return cls(config, observation_space=OBS_SPACE, action_space=ACT_SPACE)


def _state(v):
    return {"h": np.full((1, CELL), v, np.float32), "c": np.full((1, CELL), -v, np.float32)}


def _episode(tag, n, *, t_started=0, terminated=False, lookback_state=None, state=_state):
    """``n`` steps; obs ``tag + p`` (both dims), state_out of step ``t`` is ``tag + t + 0.5``."""
    obs = [np.full(2, tag + p, np.float32) for p in range(n + 1)]
    actions = [p % 2 for p in range(n)]
    rewards = [1.0 + p for p in range(n)]
    logp = [-0.69 for _ in range(n)]
    outs = [state(tag + t + 0.5) for t in range(n)]
    lookback = 0
    if lookback_state is not None:  # one step of the previous chunk before this one
        obs = [np.full(2, tag - 1, np.float32), *obs]
        actions, rewards, logp = [1, *actions], [9.0, *rewards], [-0.69, *logp]
        outs = [lookback_state, *outs]
        lookback = 1
    return SingleAgentEpisode(
        observations=obs,
        observation_space=OBS_SPACE,
        actions=actions,
        action_space=ACT_SPACE,
        rewards=rewards,
        extra_model_outputs={Columns.STATE_OUT: outs, Columns.ACTION_LOGP: logp},
        terminated=terminated,
        t_started=t_started,
        len_lookback_buffer=lookback,
    )


def _episodes():
    return [
        _episode(100, 4),  # fresh: positions 0..4 -> [0 1 2] [3 4(boot) pad]
        _episode(200, 3, t_started=7, lookback_state=_state(-7)),  # [0 1 2] [3(boot)] dropped
        _episode(300, 6, terminated=True),  # [0 1 2] [3 4 5] [6(boot)] dropped
    ]


def test_sequence_layout_by_hand():
    rows, cols, seq_lens = sequence_layout(np.array([3, 5, 1]), 2)
    np.testing.assert_array_equal(rows, [0, 0, 1, 2, 2, 3, 3, 4, 5])
    np.testing.assert_array_equal(cols, [0, 1, 0, 0, 1, 0, 1, 0, 0])
    np.testing.assert_array_equal(seq_lens, [2, 1, 2, 2, 1, 1])


def test_sequence_batch_layout_state_in_and_mask():
    learner = _learner()
    batch = learner.build_batch(_episodes())
    # Five sequences survive: A0, A1, B0, C0, C1 (bootstrap-only sequences are dropped).
    obs = batch[Columns.OBS][..., 0]
    want_obs = [
        [100, 101, 102],
        [103, 104, 0],
        [200, 201, 202],
        [300, 301, 302],
        [303, 304, 305],
    ]
    np.testing.assert_array_equal(obs, want_obs)
    mask = batch[Columns.LOSS_MASK]
    np.testing.assert_array_equal(mask, [[1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]])
    # STATE_IN: initial (zeros) for a fresh episode, the lookback's last state_out for a
    # continued chunk, else the state_out of the step before the sequence's first step.
    h = batch[Columns.STATE_IN]["h"]
    c = batch[Columns.STATE_IN]["c"]
    assert h.shape == (5, 1, CELL) and h.dtype == np.float32
    np.testing.assert_array_equal(h[:, 0, 0], [0.0, 102.5, -7.0, 0.0, 302.5])
    np.testing.assert_array_equal(c[:, 0, 0], [0.0, -102.5, 7.0, 0.0, -302.5])
    np.testing.assert_array_equal(
        batch[Columns.ACTIONS], [[0, 1, 0], [1, 0, 0], [0, 1, 0], [0, 1, 0], [1, 0, 1]]
    )
    np.testing.assert_allclose(batch[Columns.ACTION_LOGP], -0.69 * mask, rtol=1e-6)
    # Padded steps carry zeros in every per-step column.
    for key in (Columns.VF_PREDS, "advantages", "value_targets"):
        assert not batch[key][~mask].any(), key


def _values_by_hand(learner, obs_rows, state_rows):
    """compute_values on sequences written out by hand (obs value v in both dims)."""
    obs = np.array([[[v, v] for v in row] for row in obs_rows], np.float32)
    h = np.array([[[s] * CELL] for s in state_rows], np.float32)
    with torch.no_grad():
        values = learner.module.compute_values(
            {
                Columns.OBS: torch.from_numpy(obs),
                Columns.STATE_IN: {"h": torch.from_numpy(h), "c": torch.from_numpy(-h)},
            }
        )
    return values.numpy()


def test_gae_reads_values_of_the_sequences_and_bootstraps_from_them():
    learner = _learner()
    batch = learner.build_batch(_episodes())
    # Chunk A (not terminated): steps at (0,0..2) and (1,0); its bootstrap obs at (1,1).
    v = _values_by_hand(learner, [[100, 101, 102], [103, 104, 0]], [0.0, 102.5])
    values_a = np.array([v[0, 0], v[0, 1], v[0, 2], v[1, 0]])
    adv, targets = compute_gae(
        np.array([[1.0, 2.0, 3.0, 4.0]], np.float32),
        values_a[None].astype(np.float32),
        np.array([v[1, 1]], np.float32),
        np.array([4]),
        gamma=0.9,
        lambda_=0.8,
    )
    got_vf = np.concatenate([batch[Columns.VF_PREDS][0], batch[Columns.VF_PREDS][1, :1]])
    np.testing.assert_allclose(got_vf, values_a, rtol=1e-5, atol=1e-6)
    got_adv = np.concatenate([batch["advantages"][0], batch["advantages"][1, :1]])
    np.testing.assert_allclose(got_adv, adv[0], rtol=1e-5, atol=1e-5)
    got_targets = np.concatenate([batch["value_targets"][0], batch["value_targets"][1, :1]])
    np.testing.assert_allclose(got_targets, targets[0], rtol=1e-5, atol=1e-5)
    # Chunk C terminated: its last step's target is its reward alone.
    assert batch["value_targets"][4, 2] == pytest.approx(6.0, rel=1e-5)
    # Chunk B continues an episode: its bootstrap value comes from a sequence that
    # starts at its position 3 from the state_out of its step 2.
    v_b = _values_by_hand(learner, [[200, 201, 202], [203, 0, 0]], [-7.0, 202.5])
    last_target = 3.0 + 0.9 * v_b[1, 0]
    assert batch["value_targets"][2, 2] == pytest.approx(last_target, rel=1e-4, abs=1e-4)


def test_numpy_episodes_give_the_same_batch():
    learner = _learner()
    from_lists = learner.build_batch(_episodes())
    from_numpy = learner.build_batch([e.to_numpy() for e in _episodes()])
    for key in (Columns.OBS, Columns.ACTIONS, "advantages", Columns.LOSS_MASK):
        np.testing.assert_array_equal(from_lists[key], from_numpy[key])
    np.testing.assert_array_equal(
        from_lists[Columns.STATE_IN]["h"], from_numpy[Columns.STATE_IN]["h"]
    )


def test_episodes_without_state_out_start_every_sequence_from_the_initial_state():
    learner = _learner()
    episode = _episode(100, 4)
    del episode.extra_model_outputs[Columns.STATE_OUT]
    batch = learner.build_batch([episode])
    assert not batch[Columns.STATE_IN]["h"].any()


def test_loss_ignores_padded_steps():
    learner = _learner()
    batch = learner.build_batch(_episodes())
    tensors = {k: v for k, v in batch.items() if k != Columns.STATE_IN}
    mb = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}
    mb[Columns.STATE_IN] = {k: torch.from_numpy(v) for k, v in batch[Columns.STATE_IN].items()}
    loss, stats = learner.loss(mb, entropy_coeff=0.01)
    # Garbage in the padded slots (the LSTM runs past the real steps only forwards in
    # time, so the real steps' outputs cannot see it) leaves the loss unchanged.
    pad = ~mb[Columns.LOSS_MASK]
    mb2 = dict(mb)
    mb2[Columns.ACTIONS] = torch.where(pad, 1 - mb[Columns.ACTIONS], mb[Columns.ACTIONS])
    mb2["advantages"] = torch.where(pad, torch.full_like(mb["advantages"], 99.0), mb["advantages"])
    mb2["value_targets"] = torch.where(
        pad, torch.full_like(mb["value_targets"], -50.0), mb["value_targets"]
    )
    mb2[Columns.ACTION_LOGP] = torch.where(
        pad, torch.full_like(mb[Columns.ACTION_LOGP], 3.0), mb[Columns.ACTION_LOGP]
    )
    obs = mb[Columns.OBS].clone()
    obs[pad] = 7.0
    mb2[Columns.OBS] = obs
    loss2, stats2 = learner.loss(mb2, entropy_coeff=0.01)
    assert loss2.item() == pytest.approx(loss.item(), rel=1e-6)
    assert stats2 == pytest.approx(stats, rel=1e-6)
    # ... and it is the plain mean over the 13 real steps.
    out = learner.module.forward_train(
        {Columns.OBS: mb[Columns.OBS], Columns.STATE_IN: mb[Columns.STATE_IN]}
    )
    vf_err = ((out[Columns.VF_PREDS] - mb["value_targets"]) ** 2).clamp(
        max=float(learner.config.vf_clip_param)
    )
    real = mb[Columns.LOSS_MASK]
    assert int(real.sum()) == 13
    assert stats["vf_loss"] == pytest.approx(vf_err[real].mean().item(), rel=1e-5)


@pytest.mark.parametrize("cls", [PPOLearner, PGLearner])
def test_update_trains_on_sequences(cls):
    learner = _learner(cls)
    before = [p.detach().clone() for p in learner.module.parameters()]
    stats = learner.update(_episodes())
    assert stats["num_env_steps_trained"] == 13.0  # real steps, not padded slots
    assert stats["num_minibatch_steps"] == 6.0  # 5 sequences: 2 + 2 + 1 per epoch, 2 epochs
    assert np.isfinite(stats["policy_loss"])
    names = [name for name, _ in learner.module.named_parameters()]
    i = names.index("lstm.weight_hh_l0")
    assert not torch.equal(before[i], list(learner.module.parameters())[i])  # BPTT reached it


def test_separate_critic_lstm_gets_its_own_state_in():
    learner = _learner(share=False)

    def nested(v):
        return {"actor": _state(v), "critic": _state(v + 1000)}

    episode = _episode(100, 4, state=nested)
    batch = learner.build_batch([episode])
    state_in = batch[Columns.STATE_IN]
    np.testing.assert_array_equal(state_in["actor"]["h"][:, 0, 0], [0.0, 102.5])
    np.testing.assert_array_equal(state_in["critic"]["h"][:, 0, 0], [0.0, 1102.5])
    assert learner.update([episode])["num_env_steps_trained"] == 4.0


def test_prev_actions_and_rewards_per_position():
    learner = _learner(prev=True)
    batch = learner.build_batch(_episodes())
    # Zeros at an episode's start, the lookback's at a continued chunk's start, then the
    # step before each position; padding 0.
    np.testing.assert_array_equal(
        batch["prev_actions"], [[0, 0, 1], [0, 1, 0], [1, 0, 1], [0, 0, 1], [0, 1, 0]]
    )
    np.testing.assert_array_equal(
        batch["prev_rewards"], [[0, 1, 2], [3, 4, 0], [9, 1, 2], [0, 1, 2], [3, 4, 5]]
    )
    assert batch["prev_rewards"].dtype == np.float32
    assert learner.update(_episodes())["num_env_steps_trained"] == 13.0


@pytest.mark.parametrize("share, prev", [(True, False), (False, True)])
def test_sequences_reproduce_the_samplers_log_probs(share, prev):
    """End to end: rebuilt from the recorded STATE_OUT (and previous actions / rewards),
    the learner's sequences give back the sampler's own action log-probs, also for
    chunks that continue an episode from an earlier ``sample()`` call."""
    from envrunners.env.env_runner_group import EnvRunnerGroup

    config = (
        PPOConfig()
        .environment("envrunners/StatelessCartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=3)
        .rl_module(
            model_config={
                "use_lstm": True,
                "lstm_cell_size": 8,
                "max_seq_len": 4,
                "fcnet_hiddens": [8],
                "vf_share_layers": share,
                "lstm_use_prev_action": prev,
                "lstm_use_prev_reward": prev,
            }
        )
        .debugging(seed=1)
    )
    group = EnvRunnerGroup(config=config)
    try:
        learner = PPOLearner.from_group(config, group)
        group.sync_weights(from_worker_or_learner_group=learner)
        group.local_env_runner.sample(num_timesteps=30)  # so that later chunks continue
        episodes = group.local_env_runner.sample(num_timesteps=60)
    finally:
        group.stop()
    assert any(e.t_started > 0 for e in episodes)
    batch = learner.build_batch(episodes)
    inputs = {k: batch[k] for k in (Columns.OBS, "prev_actions", "prev_rewards") if k in batch}
    inputs = {k: torch.from_numpy(v) for k, v in inputs.items()}
    inputs[Columns.STATE_IN] = _to_torch(batch[Columns.STATE_IN])
    with torch.no_grad():
        out = learner.module.forward_train(inputs)
    dist = learner.dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
    logp = dist.logp(torch.from_numpy(batch[Columns.ACTIONS])).numpy()
    mask = batch[Columns.LOSS_MASK]
    np.testing.assert_allclose(logp[mask], batch[Columns.ACTION_LOGP][mask], atol=1e-5)


def _to_torch(state):
    if isinstance(state, dict):
        return {k: _to_torch(v) for k, v in state.items()}
    return torch.from_numpy(state)
