"""User TorchRLModules, structured spaces in the default module, and the acting API (``_acting.act``)."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch

from envrunners.core.columns import Columns
from envrunners.core.distribution.torch.torch_distribution import (
    TorchCategorical,
    TorchDiagGaussian,
    TorchMultiCategorical,
    TorchMultiDistribution,
)
from envrunners.core.rl_module import apis
from envrunners.core.rl_module._acting import act, initial_state_batch, reset_state_rows
from envrunners.core.rl_module.apis.value_function_api import ValueFunctionAPI
from envrunners.core.rl_module.default_torch_rl_module import (
    DefaultTorchRLModule,
    compute_actions_numpy,
    default_rl_module_spec,
)
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.core.rl_module.torch import TorchRLModule
from envrunners.core.rl_module.torch.torch_rl_module import TorchRLModule as TorchRLModuleAtPath
from envrunners.errors import ConfigError, ModuleActingError

BOX4 = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)


# ---------------------------------------------------------------------------- user modules
class LogitsModule(TorchRLModule, ValueFunctionAPI):
    """Outputs ACTION_DIST_INPUTS; the runner samples from its distribution class."""

    def setup(self):
        hidden = self.model_config.get("hidden", 8)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh())
        self.pi = torch.nn.Linear(hidden, int(self.action_space.n))
        self.vf = torch.nn.Linear(hidden, 1)

    def _forward(self, batch, **kwargs):
        return {Columns.ACTION_DIST_INPUTS: self.pi(self.net(batch[Columns.OBS]))}

    def compute_values(self, batch, embeddings=None):
        return self.vf(self.net(batch[Columns.OBS])).squeeze(-1)

    def get_exploration_action_dist_cls(self):
        return TorchCategorical

    def get_inference_action_dist_cls(self):
        return TorchCategorical


class ActionsModule(TorchRLModule):
    """Returns ACTIONS (and ACTION_LOGP) itself: always action 1, logp 0."""

    def _forward(self, batch, **kwargs):
        rows = batch[Columns.OBS].shape[0]
        return {
            Columns.ACTIONS: torch.ones(rows, dtype=torch.int64),
            Columns.ACTION_LOGP: torch.zeros(rows),
            "extra": torch.full((rows,), 7.0),
        }


class CounterModule(TorchRLModule):
    """A stateful module: its state counts steps; the action is the count mod 2."""

    def setup(self):
        self.scale = torch.nn.Parameter(torch.ones(1))

    def get_initial_state(self):
        return {"count": torch.zeros(1)}

    def _forward(self, batch, **kwargs):
        obs = batch[Columns.OBS]  # (B, T, 4)
        count = batch[Columns.STATE_IN]["count"]  # (B, 1)
        steps = torch.arange(1, obs.shape[1] + 1, dtype=torch.float32)
        counts = count + steps  # (B, T)
        logits = torch.stack([(counts % 2 == 0).float(), (counts % 2 == 1).float()], -1) * 50
        return {
            Columns.ACTION_DIST_INPUTS: logits * self.scale,
            Columns.STATE_OUT: {"count": counts[:, -1:]},
        }


class NothingModule(TorchRLModule):
    def _forward(self, batch, **kwargs):
        return {"something_else": batch[Columns.OBS]}


def _spec(cls, **model_config):
    return RLModuleSpec(
        module_class=cls,
        observation_space=BOX4,
        action_space=gym.spaces.Discrete(2),
        model_config=model_config,
    )


def test_torch_rl_module_paths():
    assert TorchRLModule is TorchRLModuleAtPath
    assert apis.ValueFunctionAPI is ValueFunctionAPI
    assert issubclass(DefaultTorchRLModule, TorchRLModule)
    assert issubclass(DefaultTorchRLModule, ValueFunctionAPI)


def test_user_module_with_dist_inputs_acts_and_computes_values():
    module = _spec(LogitsModule, hidden=5).build()
    assert module.net[0].out_features == 5  # model_config reached setup()
    obs = np.random.default_rng(0).uniform(-1, 1, (6, 4)).astype(np.float64)
    actions, extras, state_out = act(module, obs, explore=True, with_values=True)
    assert actions.shape == (6,) and actions.dtype == np.int64 and state_out is None
    assert extras[Columns.ACTION_DIST_INPUTS].shape == (6, 2)
    assert (
        extras[Columns.ACTION_LOGP].shape == (6,)
        and extras[Columns.ACTION_LOGP].dtype == np.float32
    )
    assert extras[Columns.VF_PREDS].shape == (6,)
    greedy, greedy_extras, _ = act(module, obs, explore=False)
    np.testing.assert_array_equal(greedy, greedy_extras[Columns.ACTION_DIST_INPUTS].argmax(-1))
    np.testing.assert_array_equal(greedy_extras[Columns.ACTION_LOGP], 0.0)
    # numpy batches reach user forwards as tensors (float64 as float32).
    out = module.forward_inference({Columns.OBS: obs})
    assert out[Columns.ACTION_DIST_INPUTS].dtype == torch.float32


def test_user_module_with_actions_output():
    module = _spec(ActionsModule).build()
    actions, extras, _ = act(module, np.zeros((3, 4), np.float32), explore=True)
    np.testing.assert_array_equal(actions, [1, 1, 1])
    np.testing.assert_array_equal(extras["extra"], [7.0, 7.0, 7.0])
    assert Columns.ACTION_DIST_INPUTS not in extras


def test_output_with_neither_actions_nor_dist_inputs_is_a_clear_error():
    module = _spec(NothingModule).build()
    match = (
        r"NothingModule's forward pass returned neither Columns.ACTIONS \('actions'\) nor "
        r"Columns.ACTION_DIST_INPUTS \('action_dist_inputs'\); it returned \['something_else'\]"
    )
    with pytest.raises(ModuleActingError, match=match):
        act(module, np.zeros((2, 4), np.float32), explore=True)


def test_stateful_user_module_carries_state_with_a_time_axis_of_one():
    module = _spec(CounterModule).build()
    assert module.is_stateful()
    state = initial_state_batch(module, 3)
    assert state["count"].shape == (3, 1)
    seen = []
    for _ in range(3):
        actions, extras, state = act(module, np.zeros((3, 4), np.float32), True, state)
        seen.append(actions.copy())
        assert extras[Columns.ACTION_DIST_INPUTS].shape == (3, 2)  # time axis removed
    np.testing.assert_array_equal(np.stack(seen)[:, 0], [1, 0, 1])
    np.testing.assert_array_equal(state["count"], [[3.0], [3.0], [3.0]])
    reset_state_rows(state, module.get_initial_state(), [1])
    np.testing.assert_array_equal(state["count"], [[3.0], [0.0], [3.0]])
    with pytest.raises(ModuleActingError, match="is stateful.*initial_state_batch"):
        act(module, np.zeros((3, 4), np.float32), True)


def test_use_lstm_with_a_custom_non_stateful_module_fails_at_build():
    match = (
        r"model_config\['use_lstm'\]=True, but LogitsModule is not stateful .* Drop use_lstm, "
        r"use the default module"
    )
    with pytest.raises(ConfigError, match=match):
        _spec(LogitsModule, use_lstm=True).build()
    assert _spec(CounterModule, use_lstm=True).build().is_stateful()


# ---------------------------------------------------------------------------- default module
def test_act_delegates_to_the_fast_numpy_path_for_flat_mlps(monkeypatch):
    module = DefaultTorchRLModule(
        observation_space=BOX4,
        action_space=gym.spaces.Discrete(3),
        model_config={"fcnet_hiddens": [8]},
    )
    calls = []
    original = module.compute_actions_numpy

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, "compute_actions_numpy", spy)
    monkeypatch.setattr(module, "forward_exploration", None)  # must not be used
    actions, extras, state = act(module, np.zeros((5, 4), np.float32), True, with_values=True)
    assert len(calls) == 1 and state is None
    assert actions.shape == (5,) and extras[Columns.VF_PREDS].shape == (5,)


def test_act_with_the_default_lstm_module_equals_a_time_ranked_forward():
    torch.manual_seed(0)
    module = DefaultTorchRLModule(
        observation_space=BOX4,
        action_space=gym.spaces.Box(-1, 1, (2,), np.float32),
        model_config={"fcnet_hiddens": [8], "use_lstm": True, "lstm_cell_size": 4},
    )
    obs = np.random.default_rng(0).uniform(-1, 1, (3, 2, 4)).astype(np.float32)
    state = initial_state_batch(module, 3)
    assert {k: v.shape for k, v in state.items()} == {"h": (3, 1, 4), "c": (3, 1, 4)}
    dist_inputs = []
    for t in range(2):
        actions, extras, state = act(module, obs[:, t], False, state)
        assert actions.shape == (3, 2) and actions.dtype == np.float32
        dist_inputs.append(extras[Columns.ACTION_DIST_INPUTS])
    with torch.no_grad():
        ref = module.forward_inference(
            {Columns.OBS: obs, Columns.STATE_IN: initial_state_batch(module, 3)}
        )
    np.testing.assert_allclose(np.stack(dist_inputs, 1), ref[Columns.ACTION_DIST_INPUTS], atol=1e-6)
    np.testing.assert_allclose(state["h"], ref[Columns.STATE_OUT]["h"], atol=1e-6)


def test_act_with_prev_actions_and_rewards_as_extra_inputs():
    module = DefaultTorchRLModule(
        observation_space=BOX4,
        action_space=gym.spaces.Discrete(3),
        model_config={"fcnet_hiddens": [8], "use_lstm": True, "lstm_cell_size": 4,
                      "lstm_use_prev_action": True, "lstm_use_prev_reward": True},
    )  # fmt: skip
    extra = {"prev_actions": np.array([0, 2]), "prev_rewards": np.array([0.0, 1.0], np.float32)}
    actions, _, state = act(
        module,
        np.zeros((2, 4), np.float32),
        True,
        initial_state_batch(module, 2),
        extra_inputs=extra,
    )
    assert actions.shape == (2,) and state["c"].shape == (2, 1, 4)


STRUCTURED_ACTIONS = {
    "multi_discrete": gym.spaces.MultiDiscrete([2, 3, 4]),
    "tuple": gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,), np.float32)]),
    "dict": gym.spaces.Dict(
        {
            "move": gym.spaces.MultiDiscrete([2, 2]),
            "turn": gym.spaces.Discrete(4),
            "nested": gym.spaces.Tuple([gym.spaces.Discrete(2)]),
        }
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", sorted(STRUCTURED_ACTIONS))
@pytest.mark.parametrize("explore", [True, False])
def test_multi_action_spaces_sample_inside_their_space(name, explore):
    space = STRUCTURED_ACTIONS[name]
    torch.manual_seed(1)
    module = default_rl_module_spec(BOX4, space, {"fcnet_hiddens": [8]}).build()
    if name != "multi_discrete":
        assert module.get_exploration_action_dist_cls()._partial_base is TorchMultiDistribution
    obs = np.random.default_rng(0).uniform(-1, 1, (16, 4)).astype(np.float32)
    actions, extras, _ = act(module, obs, explore)
    assert extras[Columns.ACTION_LOGP].shape == (16,)
    if not explore:
        np.testing.assert_array_equal(extras[Columns.ACTION_LOGP], 0.0)
    for row in range(16):
        if isinstance(space, gym.spaces.Dict):
            sample = {k: _row(v, row) for k, v in actions.items()}
            sample["nested"] = tuple(sample["nested"])
        elif isinstance(space, gym.spaces.Tuple):
            sample = tuple(_row(v, row) for v in actions)
        else:
            sample = actions[row]
        if isinstance(space, gym.spaces.Tuple):
            sample = (sample[0], np.clip(sample[1], -1, 1))  # Gaussian draws are unbounded
        assert space.contains(sample), (row, sample)
    # The module's outputs score the same sample (the learner's view).
    with torch.no_grad():
        inputs = module.forward_train({Columns.OBS: torch.from_numpy(obs)})[
            Columns.ACTION_DIST_INPUTS
        ]
    dist = module.get_train_action_dist_cls().from_logits(inputs)
    if explore:
        logp = dist.logp(_as_tensors(actions))
        np.testing.assert_allclose(logp.numpy(), extras[Columns.ACTION_LOGP], rtol=1e-4, atol=1e-4)


def _row(value, row):
    if isinstance(value, tuple):
        return tuple(v[row] for v in value)
    return value[row]


def _as_tensors(actions):
    if isinstance(actions, dict):
        return {k: _as_tensors(v) for k, v in actions.items()}
    if isinstance(actions, tuple):
        return tuple(_as_tensors(v) for v in actions)
    return torch.from_numpy(np.asarray(actions))


def test_multi_distribution_pickles_and_has_entropy_kl():
    dist_cls = TorchMultiDistribution.get_partial_dist_cls(
        child_distribution_cls_struct={"a": TorchCategorical, "b": TorchDiagGaussian},
        input_lens=[3, 4],
    )
    assert pickle.loads(pickle.dumps(dist_cls)) is dist_cls
    p = dist_cls.from_logits(torch.zeros(5, 7))
    q = dist_cls.from_logits(torch.ones(5, 7))
    assert p.entropy().shape == (5,) and p.kl(q).shape == (5,)
    sample = p.sample()
    assert sample["a"].shape == (5,) and sample["b"].shape == (5, 2)
    det = p.to_deterministic().sample()
    np.testing.assert_array_equal(det["b"].numpy(), 0.0)
    mc = TorchMultiCategorical.get_partial_dist_cls(input_lens=[2, 3])
    assert mc.from_logits(torch.zeros(4, 5)).sample().shape == (4, 2)


@pytest.mark.parametrize(
    "obs_space",
    [
        gym.spaces.Dict(
            {
                "pos": gym.spaces.Box(-1, 1, (2,), np.float32),
                "mode": gym.spaces.Discrete(3),
                "grid": gym.spaces.MultiBinary([2, 2]),
            }
        ),  # fmt: skip
        gym.spaces.Tuple(
            [gym.spaces.MultiDiscrete([2, 3]), gym.spaces.Dict({"x": gym.spaces.Box(0, 1, (3,))})]
        ),
    ],
)
def test_dict_and_tuple_observations_are_flattened_by_the_module(obs_space):
    module = default_rl_module_spec(
        obs_space, gym.spaces.Discrete(2), {"fcnet_hiddens": [8]}
    ).build()
    expected = 2 + 3 + 4 if isinstance(obs_space, gym.spaces.Dict) else 5 + 3
    assert module.encoder.layers[0].in_features == expected
    obs_space.seed(0)
    rows = [obs_space.sample() for _ in range(5)]
    if isinstance(obs_space, gym.spaces.Dict):
        batch = {k: np.stack([r[k] for r in rows]) for k in obs_space.spaces}
    else:
        batch = (np.stack([r[0] for r in rows]), {"x": np.stack([r[1]["x"] for r in rows])})
    actions, extras, _ = act(module, batch, True, with_values=True)
    assert actions.shape == (5,) and extras[Columns.VF_PREDS].shape == (5,)
    out = compute_actions_numpy(module, batch, explore=False)
    assert out[Columns.ACTION_DIST_INPUTS].shape == (5, 2)


def test_unsupported_leaf_names_space_and_path():
    obs_space = gym.spaces.Dict({"a": BOX4, "b": gym.spaces.Tuple([gym.spaces.Text(4)])})
    with pytest.raises(
        ConfigError, match=r"observation leaf Text\(.*\) at \['b'\]\[0\] of observation space Dict"
    ):
        default_rl_module_spec(obs_space, gym.spaces.Discrete(2))
    act_space = gym.spaces.Dict(
        {"ok": gym.spaces.Discrete(2), "bad": gym.spaces.Discrete(3, start=1)}
    )
    with pytest.raises(
        ConfigError, match=r"action leaf Discrete\(3, start=1\) at \['bad'\] of action space Dict"
    ):
        default_rl_module_spec(BOX4, act_space)


def test_partial_multi_distributions_with_different_children_are_different_classes():
    def make(nvec):
        child = TorchMultiCategorical.get_partial_dist_cls(input_lens=nvec)
        return TorchMultiDistribution.get_partial_dist_cls(
            child_distribution_cls_struct=(child, TorchCategorical), input_lens=[sum(nvec), 2]
        )

    small, large = make([2, 2]), make([3, 3])
    assert small is not large and small is make([2, 2])
    assert pickle.loads(pickle.dumps(large)) is large
    assert large.from_logits(torch.zeros(1, 8)).sample()[0].shape == (1, 2)


def test_default_modules_with_structured_spaces_pickle():
    for obs, action in [
        (gym.spaces.Box(0, 255, (10, 10, 1), np.uint8), STRUCTURED_ACTIONS["dict"]),
        (gym.spaces.Dict({"a": BOX4, "b": gym.spaces.Discrete(2)}), gym.spaces.Discrete(2)),
    ]:
        module = default_rl_module_spec(obs, action, {"fcnet_hiddens": [4]}).build()
        copy = pickle.loads(pickle.dumps(module))
        obs.seed(0)
        sample = obs.sample()
        batch = (
            {k: np.stack([v]) for k, v in sample.items()}
            if isinstance(sample, dict)
            else sample[None]
        )
        a = act(module, batch, False)[1][Columns.ACTION_DIST_INPUTS]
        b = act(copy, batch, False)[1][Columns.ACTION_DIST_INPUTS]
        np.testing.assert_array_equal(a, b)
