"""RLModule, MultiRLModule, specs, the default MLP module and its numpy acting path."""

from __future__ import annotations

import contextlib
import copy
import json
import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import distributions as td

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core import DEFAULT_MODULE_ID, _nested
from envrunners.core.columns import Columns
from envrunners.core.distributions import TorchCategorical
from envrunners.core.rl_module.default_model_config import DefaultModelConfig
from envrunners.core.rl_module.default_torch_rl_module import (
    DefaultTorchRLModule,
    compute_actions_numpy,
    default_rl_module_spec,
)
from envrunners.core.rl_module.multi_rl_module import MultiRLModule, MultiRLModuleSpec
from envrunners.core.rl_module.rl_module import RLModule, RLModuleSpec
from envrunners.errors import ConfigError, UnknownPolicyError
from envrunners.utils.torch_utils import convert_to_torch_tensor, set_torch_threads

BOX4 = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
OBS_SPACES = {
    "box": BOX4,
    "box2d": gym.spaces.Box(0.0, 1.0, (2, 3), np.float32),
    "discrete": gym.spaces.Discrete(5),
    "multi_discrete": gym.spaces.MultiDiscrete([3, 4]),
    "multi_binary": gym.spaces.MultiBinary(3),
}
ACT_SPACES = {
    "discrete": (gym.spaces.Discrete(3), (), np.int64, 3),
    "multi_discrete": (gym.spaces.MultiDiscrete([2, 3]), (2,), np.int64, 5),
    "box": (gym.spaces.Box(-2.0, 2.0, (2,), np.float32), (2,), np.float32, 4),
}
SMALL = {"fcnet_hiddens": [16, 16]}


def _module(obs="box", act="discrete", **kwargs) -> DefaultTorchRLModule:
    torch.manual_seed(0)
    kwargs.setdefault("model_config", SMALL)
    return DefaultTorchRLModule(
        observation_space=OBS_SPACES[obs], action_space=ACT_SPACES[act][0], **kwargs
    )


def _obs(obs: str, batch: int) -> np.ndarray:
    space = OBS_SPACES[obs]
    space.seed(0)
    return np.stack([space.sample() for _ in range(batch)])


# ---------------------------------------------------------------------------- default module
@pytest.mark.parametrize("obs", sorted(OBS_SPACES))
@pytest.mark.parametrize("act", sorted(ACT_SPACES))
@pytest.mark.parametrize("explore", [True, False])
def test_fast_path_shapes_dtypes_and_consistency(obs, act, explore):
    module = _module(obs, act)
    _, act_shape, act_dtype, dist_dim = ACT_SPACES[act]
    batch = _obs(obs, 5)
    out = module.compute_actions_numpy(batch, explore=explore, with_values=True)
    assert out[Columns.ACTIONS].shape == (5, *act_shape)
    assert out[Columns.ACTIONS].dtype == act_dtype
    assert out[Columns.ACTION_LOGP].shape == (5,) and out[Columns.ACTION_LOGP].dtype == np.float32
    assert out[Columns.ACTION_DIST_INPUTS].shape == (5, dist_dim)
    assert out[Columns.ACTION_DIST_INPUTS].dtype == np.float32
    assert out[Columns.VF_PREDS].shape == (5,) and out[Columns.VF_PREDS].dtype == np.float32
    assert all(ACT_SPACES[act][0].contains(a) for a in out[Columns.ACTIONS]) or act == "box"

    # The fast path computes what the torch path computes.
    with torch.no_grad():
        ref = module.forward_train({Columns.OBS: torch.from_numpy(batch)})
    np.testing.assert_allclose(
        out[Columns.ACTION_DIST_INPUTS], ref[Columns.ACTION_DIST_INPUTS].numpy(), atol=1e-5
    )
    np.testing.assert_allclose(out[Columns.VF_PREDS], ref[Columns.VF_PREDS].numpy(), atol=1e-5)
    dist = module.get_train_action_dist_cls().from_logits(ref[Columns.ACTION_DIST_INPUTS])
    if explore:
        expected_logp = dist.logp(torch.from_numpy(out[Columns.ACTIONS])).numpy()
        np.testing.assert_allclose(out[Columns.ACTION_LOGP], expected_logp, atol=1e-4)
    else:
        greedy = dist.to_deterministic().sample().numpy().reshape(out[Columns.ACTIONS].shape)
        np.testing.assert_allclose(out[Columns.ACTIONS], greedy, atol=1e-6)
        np.testing.assert_array_equal(out[Columns.ACTION_LOGP], np.zeros(5, np.float32))


@pytest.mark.parametrize("nested", ["dict", "tuple"])
def test_nested_observations_take_the_numpy_layers_with_the_torch_numbers(nested):
    """Dict/Tuple observations (Box, Discrete, MultiDiscrete, MultiBinary leaves) are
    encoded on numpy (one-hot, concatenated) and run by the numpy layers: the same
    distribution inputs and values as the torch forward."""
    leaves = {
        "pos": gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32),
        "d": gym.spaces.Discrete(4, start=1),
        "md": gym.spaces.MultiDiscrete([2, 3]),
        "mb": gym.spaces.MultiBinary(2),
    }
    space = gym.spaces.Dict(leaves) if nested == "dict" else gym.spaces.Tuple(leaves.values())
    torch.manual_seed(0)
    module = DefaultTorchRLModule(
        observation_space=space, action_space=gym.spaces.Discrete(3), model_config=SMALL
    )
    assert module._fast_plan()["numpy"] is not None
    space.seed(0)
    samples = [space.sample() for _ in range(6)]
    batch = _nested.map_structure(lambda *xs: np.stack(xs), *samples)
    out = module.compute_actions_numpy(batch, explore=True, with_values=True)
    with torch.no_grad():
        ref = module.forward_train({Columns.OBS: _nested.map_structure(torch.from_numpy, batch)})
    np.testing.assert_allclose(
        out[Columns.ACTION_DIST_INPUTS], ref[Columns.ACTION_DIST_INPUTS].numpy(), atol=1e-5
    )
    np.testing.assert_allclose(out[Columns.VF_PREDS], ref[Columns.VF_PREDS].numpy(), atol=1e-5)
    encoded = module._obs_layout.encode_numpy(batch)
    np.testing.assert_array_equal(
        encoded, module._obs_layout.encode(_nested.map_structure(torch.from_numpy, batch)).numpy()
    )


def test_forward_methods_and_value_head_shapes():
    module = _module()
    batch = {Columns.OBS: torch.from_numpy(_obs("box", 7))}
    for method in (module.forward_inference, module.forward_exploration):
        assert method(batch)[Columns.ACTION_DIST_INPUTS].shape == (7, 3)
    train = module.forward_train(batch)
    assert set(train) == {Columns.ACTION_DIST_INPUTS, Columns.VF_PREDS}
    assert train[Columns.VF_PREDS].shape == (7,)
    assert module.compute_values(batch).shape == (7,)
    assert module(batch)[Columns.VF_PREDS].shape == (7,)  # nn.Module call = forward_train


def test_gumbel_max_fast_path_frequencies_match_softmax():
    module = _module(act="discrete")
    last = module.pi.layers[-1]
    with torch.no_grad():  # make the policy ignore the observation
        last.weight.zero_()
        last.bias.copy_(torch.tensor([0.5, -1.0, 1.5]))
    torch.manual_seed(42)
    out = module.compute_actions_numpy(np.zeros((30_000, 4), np.float32), explore=True)
    counts = np.bincount(out[Columns.ACTIONS], minlength=3)
    probs = torch.softmax(torch.tensor([0.5, -1.0, 1.5]), -1).numpy()
    chi2 = float(((counts - probs * counts.sum()) ** 2 / (probs * counts.sum())).sum())
    assert chi2 < 13.8  # 2 degrees of freedom, p ~ 0.001
    np.testing.assert_allclose(out[Columns.ACTION_LOGP], np.log(probs)[out[Columns.ACTIONS]], 1e-5)


def test_gaussian_fast_path_matches_density_and_moments():
    module = _module(act="box", model_config={**SMALL, "free_log_std": True})
    with torch.no_grad():
        module.pi.layers[-1].weight.zero_()
        module.pi.layers[-1].bias.copy_(torch.tensor([1.0, -1.0]))
        module.log_std.copy_(torch.tensor([np.log(0.5), 0.0]))
    torch.manual_seed(0)
    out = module.compute_actions_numpy(np.zeros((20_000, 4), np.float32), explore=True)
    actions = out[Columns.ACTIONS]
    np.testing.assert_allclose(actions.mean(0), [1.0, -1.0], atol=0.03)
    np.testing.assert_allclose(actions.std(0), [0.5, 1.0], rtol=0.03)
    ref = td.Independent(td.Normal(torch.tensor([1.0, -1.0]), torch.tensor([0.5, 1.0])), 1)
    np.testing.assert_allclose(
        out[Columns.ACTION_LOGP], ref.log_prob(torch.from_numpy(actions)).numpy(), atol=1e-4
    )
    greedy = module.compute_actions_numpy(np.zeros((3, 4), np.float32), explore=False)
    np.testing.assert_allclose(greedy[Columns.ACTIONS], [[1.0, -1.0]] * 3)


def test_fast_path_is_reproducible_with_seed_and_generator():
    module, batch = _module(), _obs("box", 64)
    torch.manual_seed(5)
    first = module.compute_actions_numpy(batch, explore=True)[Columns.ACTIONS]
    torch.manual_seed(5)
    np.testing.assert_array_equal(
        first, module.compute_actions_numpy(batch, explore=True)[Columns.ACTIONS]
    )
    runs = [
        module.compute_actions_numpy(
            batch, explore=True, generator=torch.Generator().manual_seed(9)
        )[Columns.ACTIONS]
        for _ in range(2)
    ]
    np.testing.assert_array_equal(runs[0], runs[1])


def test_fast_path_runs_under_inference_mode(monkeypatch):
    # An activation numpy has no ufunc for (elu) takes the torch layers, not the numpy
    # forward.
    module, seen = _module(obs="discrete", model_config={**SMALL, "fcnet_activation": "elu"}), []
    assert module._fast_plan()["numpy"] is None
    real_linear = torch.nn.functional.linear

    def spy(*args, **kwargs):
        seen.append(torch.is_inference_mode_enabled())
        return real_linear(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "linear", spy)
    out = module.compute_actions_numpy(_obs("discrete", 4), explore=True)
    assert seen and all(seen)
    assert all(isinstance(v, np.ndarray) for v in out.values())
    assert all(p.grad is None for p in module.parameters())


def _torch_path(module, batch, **kwargs):
    """``compute_actions_numpy`` with the numpy forward switched off (the torch layers)."""
    fast = module._fast or module._fast_plan()
    saved, fast["numpy"] = fast["numpy"], None
    try:
        return module.compute_actions_numpy(batch, **kwargs)
    finally:
        fast["numpy"] = saved


@pytest.mark.parametrize("act", sorted(ACT_SPACES))
@pytest.mark.parametrize("activation", ["tanh", "relu", "linear"])
def test_numpy_forward_equals_the_torch_layers(act, activation):
    module = _module("box2d", act, model_config={**SMALL, "fcnet_activation": activation})
    assert module._fast_plan()["numpy"] is not None
    batch = _obs("box2d", 9)
    torch.manual_seed(3)
    fast = module.compute_actions_numpy(batch, explore=True, with_values=True)
    torch.manual_seed(3)
    ref = _torch_path(module, batch, explore=True, with_values=True)
    np.testing.assert_array_equal(fast[Columns.ACTIONS].shape, ref[Columns.ACTIONS].shape)
    for key in ref:
        np.testing.assert_allclose(fast[key], ref[key], atol=1e-5, err_msg=key)


def test_numpy_forward_only_where_numpy_can_run_it():
    assert _module(model_config={**SMALL, "fcnet_activation": "elu"})._fast_plan()["numpy"] is None
    # One-hot and concatenated leaves are encoded on numpy, then the same numpy layers.
    assert _module(obs="discrete")._fast_plan()["numpy"] is not None
    assert _module(act="discrete", obs="box")._fast_plan()["encode_numpy"] is None
    double = _module().double()
    assert double._fast_plan()["numpy"] is None
    shared = _module(model_config={**SMALL, "vf_share_layers": True})
    assert shared._fast_plan()["numpy"].vf_encoder is None
    infer = _module(inference_only=True)
    assert infer._fast_plan()["numpy"].vf is None
    with pytest.raises(RuntimeError, match="inference_only"):
        infer.compute_actions_numpy(_obs("box", 2), explore=False, with_values=True)


@pytest.mark.parametrize(
    "change",
    ["optimizer", "data_copy", "numpy_write", "replace_storage", "load_state_dict", "set_state"],
)
def test_numpy_forward_sees_every_kind_of_weight_change(change):
    """The numpy forward reads the parameters' own storage: no stale copies."""
    module, batch = _module(), _obs("box", 6)
    module.compute_actions_numpy(batch, explore=False)  # builds the views
    donor = _module()
    with torch.no_grad():
        for p in donor.parameters():
            p.add_(torch.randn_like(p))
    target = dict(module.named_parameters())
    if change == "optimizer":
        opt = torch.optim.SGD(module.parameters(), lr=0.5)
        for p, d in zip(module.parameters(), donor.parameters()):
            p.grad = p.detach() - d.detach()  # one step of lr 1 lands on the donor ...
        opt.param_groups[0]["lr"] = 1.0
        opt.step()
    elif change == "data_copy":
        for name, d in donor.named_parameters():
            target[name].data.copy_(d.data)  # no version bump
    elif change == "numpy_write":
        for name, d in donor.named_parameters():
            target[name].detach().numpy()[...] = d.detach().numpy()
    elif change == "replace_storage":
        for name, d in donor.named_parameters():
            target[name].data = d.detach().clone()
    elif change == "load_state_dict":
        module.load_state_dict(donor.state_dict())
    else:
        module.set_state(donor.get_state())
    got = module.compute_actions_numpy(batch, explore=False, with_values=True)
    want = _torch_path(donor, batch, explore=False, with_values=True)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=1e-5, err_msg=key)


def test_fast_path_outputs_are_fresh_arrays():
    module, batch = _module(), _obs("box", 4)
    first = module.compute_actions_numpy(batch, explore=True)
    kept = {k: v.copy() for k, v in first.items()}
    module.compute_actions_numpy(batch * 0.5, explore=True)
    for key, value in kept.items():
        np.testing.assert_array_equal(first[key], value)


def test_fast_path_accepts_float64_readonly_and_sees_weight_updates():
    module = _module()
    batch = _obs("box", 3).astype(np.float64)
    batch.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        before = module.compute_actions_numpy(batch, explore=False)[Columns.ACTION_DIST_INPUTS]
    other = _module()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    module.set_state(other.get_state())
    after = module.compute_actions_numpy(batch, explore=False)[Columns.ACTION_DIST_INPUTS]
    assert not np.allclose(before, after)
    module.to("cpu")  # re-collects parameter references
    again = module.compute_actions_numpy(batch, explore=False)[Columns.ACTION_DIST_INPUTS]
    np.testing.assert_array_equal(after, again)


def test_inference_only_module_has_no_value_branch():
    module = _module(inference_only=True)
    assert not any(k.startswith(("vf.", "vf_encoder.")) for k in module.get_state())
    with pytest.raises(RuntimeError, match="inference_only=True"):
        module.compute_actions_numpy(_obs("box", 2), explore=True, with_values=True)
    with pytest.raises(RuntimeError, match="inference_only=True"):
        module.forward_train({Columns.OBS: torch.zeros(2, 4)})


def test_model_config_options():
    shared = _module(model_config={**SMALL, "vf_share_layers": True})
    assert not hasattr(shared, "vf_encoder")
    assert shared.compute_values({Columns.OBS: torch.zeros(2, 4)}).shape == (2,)
    relu = _module(model_config=DefaultModelConfig(fcnet_hiddens=[8], fcnet_activation="relu"))
    assert relu.encoder.layers[0].out_features == 8
    out = relu.compute_actions_numpy(_obs("box", 2), explore=True)
    with torch.no_grad():
        ref = relu.forward_inference({Columns.OBS: torch.from_numpy(_obs("box", 2))})
    np.testing.assert_allclose(
        out[Columns.ACTION_DIST_INPUTS], ref[Columns.ACTION_DIST_INPUTS], atol=1e-6
    )
    default = DefaultTorchRLModule(observation_space=BOX4, action_space=gym.spaces.Discrete(2))
    assert [layer.out_features for layer in default.encoder.layers] == [256, 256]
    with pytest.raises(ConfigError, match="fcnet_activation"):
        _module(model_config={"fcnet_activation": "gelu"})
    # use_lstm was refused before issue 14; it now wraps the encoder in an LSTM.
    assert _module(model_config={**SMALL, "use_lstm": True, "lstm_cell_size": 8}).is_stateful()


# ---------------------------------------------------------------------------- state
def test_state_round_trip_is_plain_numpy():
    source, target = _module(), _module()
    with torch.no_grad():
        for p in source.parameters():
            p.mul_(2.0)
    state = source.get_state()
    assert state and all(type(v) is np.ndarray for v in state.values())
    target.set_state(state)
    batch = {Columns.OBS: torch.from_numpy(_obs("box", 3))}
    with torch.no_grad():
        torch.testing.assert_close(target.forward_train(batch), source.forward_train(batch))
    # Snapshots: training the source later does not change the dict already taken.
    snapshot = {k: v.copy() for k, v in state.items()}
    with torch.no_grad():
        next(source.parameters()).add_(1.0)
    for key in snapshot:
        np.testing.assert_array_equal(state[key], snapshot[key])


def test_set_state_accepts_tensors_and_readonly_arrays():
    source, target = _module(), _module()
    target.set_state({k: torch.from_numpy(v) for k, v in source.get_state().items()})
    readonly = source.get_state()
    for value in readonly.values():
        value.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        target.set_state(readonly)


def test_set_state_errors_name_the_problem():
    module = _module()
    with pytest.raises(ValueError, match="lacks"):
        module.set_state({"nope": np.zeros(1)})
    state = module.get_state()
    key = next(iter(state))
    before = module.get_state()
    state = {k: v + 1.0 for k, v in state.items()}
    state[key] = np.zeros((1, 1), np.float32)
    with pytest.raises(ValueError, match=f"{key!r} has shape"):
        module.set_state(state)
    for name, value in module.get_state().items():  # a rejected state changes nothing
        np.testing.assert_array_equal(value, before[name])


@pytest.mark.parametrize(
    "change", ["new_parameter", "dict_entry", "data", "float64", "deleted", "hook", "copy"]
)
def test_state_follows_every_kind_of_module_change(change):
    """``get_state``/``set_state`` keep their entries and numpy views between calls: each
    change of what the module holds must still be read and written."""
    module = _module()
    state = module.get_state()
    module.set_state(state)  # (entries and views are kept from here on)
    name = next(iter(state))
    prefix, _, local = name.rpartition(".")
    owner = module.get_submodule(prefix)
    fill = {k: np.full_like(v, 3.0) for k, v in state.items()}
    if change == "new_parameter":
        setattr(owner, local, torch.nn.Parameter(torch.zeros_like(getattr(owner, local))))
    elif change == "dict_entry":  # no registration hook sees this one
        owner._parameters[local] = torch.nn.Parameter(torch.zeros_like(getattr(owner, local)))
    elif change == "data":  # new storage, same parameter object
        getattr(owner, local).data = torch.zeros_like(getattr(owner, local).data)
    elif change == "float64":
        module.double()
        fill = {k: np.full(v.shape, 3.0) for k, v in state.items()}
    elif change == "deleted":
        setattr(owner, local, None)
        del fill[name]
    elif change == "hook":
        module.register_state_dict_post_hook(lambda m, sd, prefix, meta: sd.__delitem__(name))
        del fill[name]
    elif change == "copy":
        module = copy.deepcopy(pickle.loads(pickle.dumps(module)))
        owner = module.get_submodule(prefix)
    param = getattr(owner, local)
    version = param._version if param is not None else 0
    before = None if param is None else param.detach().clone()
    module.set_state(fill)
    got = module.get_state()
    assert set(got) == set(fill)
    for key, value in got.items():
        np.testing.assert_array_equal(value, fill[key])
        assert value.dtype == dict(module.state_dict())[key].numpy().dtype
    if change == "hook":  # not in the state: left alone
        assert torch.equal(param, before)
    elif param is not None:
        assert torch.all(param == 3.0) and param._version > version  # autograd sees the write
    got[next(iter(got))][...] = -1.0  # get_state copies by default
    assert module.get_state()[next(iter(got))].flat[0] == 3.0


def test_full_state_loads_into_inference_only_module():
    full, runner = _module(), _module(inference_only=True)
    with torch.no_grad():
        for p in full.parameters():
            p.add_(0.5)
    slim = full.get_state(inference_only=True)
    assert set(slim) == set(runner.get_state())
    runner.set_state(full.get_state())  # extra value-branch entries are ignored
    batch = _obs("box", 4)
    np.testing.assert_allclose(
        runner.compute_actions_numpy(batch, explore=False)[Columns.ACTION_DIST_INPUTS],
        full.compute_actions_numpy(batch, explore=False)[Columns.ACTION_DIST_INPUTS],
    )


def test_save_and_load_state_path(tmp_path):
    module = _module()
    path = module.save_to_path(tmp_path / "ckpt")
    spec = RLModuleSpec(
        DefaultTorchRLModule, BOX4, ACT_SPACES["discrete"][0], model_config=SMALL,
        load_state_path=path,
    )  # fmt: skip
    torch.manual_seed(99)
    loaded = spec.build()
    for key, value in module.get_state().items():
        np.testing.assert_array_equal(loaded.get_state()[key], value)


# ---------------------------------------------------------------------------- specs
def test_spec_build_update_and_serialization():
    spec = default_rl_module_spec(BOX4, gym.spaces.Discrete(2), model_config=SMALL)
    module = spec.build()
    assert isinstance(module, DefaultTorchRLModule) and not module.inference_only
    assert module.model_config == SMALL

    spec.update(RLModuleSpec(inference_only=True, model_config={"vf_share_layers": True}))
    assert spec.inference_only and spec.module_class is DefaultTorchRLModule
    assert spec.model_config == {**SMALL, "vf_share_layers": True}
    keep = RLModuleSpec(module_class=RLModule)
    keep.update(spec, override=False)
    assert keep.module_class is RLModule and keep.observation_space == BOX4

    data = json.loads(json.dumps(spec.to_serializable_dict()))
    restored = RLModuleSpec.from_dict(data)
    assert restored == spec
    assert restored.build().inference_only

    with pytest.raises(ConfigError, match="module_class, observation_space"):
        RLModuleSpec().build()
    with pytest.raises(ConfigError, match="another RLModuleSpec"):
        spec.update({"inference_only": True})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("obs_space", "act_space", "match"),
    [
        # Dict/Tuple spaces are read since issue 14; their unsupported leaves are named.
        (gym.spaces.Dict({"a": BOX4, "t": gym.spaces.Text(5)}), gym.spaces.Discrete(2), r"cannot read the observation leaf Text\(.*\) at \['t'\] of observation space Dict"),
        (BOX4, gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Box(-1, 1, (2, 2))]), r"cannot act in the action leaf Box\(.*\) at \[1\] of action space Tuple"),
        (BOX4, gym.spaces.Discrete(3, start=1), r"cannot act in action space Discrete\(3, start=1\)"),
        (BOX4, gym.spaces.Box(-1, 1, (2, 2)), r"Box must be 1-D"),
    ],
)  # fmt: skip
def test_unsupported_spaces_raise_config_error(obs_space, act_space, match):
    with pytest.raises(ConfigError, match=match) as info:
        default_rl_module_spec(obs_space, act_space)
    assert "RLModuleSpec(module_class=MyModule)" in str(info.value)
    assert "Supported by the default module" in str(info.value)


# ---------------------------------------------------------------------------- generic path
class TinyModule(RLModule):
    """A user module: a single linear layer producing categorical logits."""

    def setup(self):
        self.net = torch.nn.Linear(4, 2)
        self.action_dist_cls = TorchCategorical
        self.seen_kwargs = {}

    def _forward(self, batch, **kwargs):
        self.seen_kwargs = kwargs
        return {Columns.ACTION_DIST_INPUTS: self.net(batch[Columns.OBS])}


class SelfSamplingModule(RLModule):
    def _forward(self, batch, **kwargs):
        n = batch[Columns.OBS].shape[0]
        return {Columns.ACTIONS: torch.ones(n, dtype=torch.int64), "extra": torch.zeros(n)}


def test_generic_compute_actions_for_custom_modules():
    module = TinyModule(observation_space=BOX4, action_space=gym.spaces.Discrete(2))
    batch = _obs("box", 6).astype(np.float64)
    out = compute_actions_numpy(module, batch, True, t=12)
    assert module.seen_kwargs == {"t": 12}
    assert out[Columns.ACTIONS].shape == (6,) and out[Columns.ACTIONS].dtype == np.int64
    logits = torch.from_numpy(out[Columns.ACTION_DIST_INPUTS])
    expected = TorchCategorical.from_logits(logits).logp(torch.from_numpy(out[Columns.ACTIONS]))
    np.testing.assert_allclose(out[Columns.ACTION_LOGP], expected.numpy(), atol=1e-6)
    greedy = compute_actions_numpy(module, batch, False)
    np.testing.assert_array_equal(greedy[Columns.ACTIONS], logits.argmax(-1).numpy())

    custom = SelfSamplingModule(observation_space=BOX4, action_space=gym.spaces.Discrete(2))
    out = compute_actions_numpy(custom, batch, True)
    np.testing.assert_array_equal(out[Columns.ACTIONS], np.ones(6, np.int64))
    assert "extra" in out and Columns.ACTION_LOGP not in out

    default = _module()
    np.testing.assert_array_equal(
        compute_actions_numpy(default, _obs("box", 3), False)[Columns.ACTIONS],
        default.compute_actions_numpy(_obs("box", 3), explore=False)[Columns.ACTIONS],
    )


def test_base_module_without_forward_or_dist_is_explicit():
    bare = RLModule(observation_space=BOX4, action_space=gym.spaces.Discrete(2))
    with pytest.raises(NotImplementedError, match="_forward"):
        bare.forward_inference({Columns.OBS: torch.zeros(1, 4)})
    assert bare.get_exploration_action_dist_cls() is TorchCategorical
    multi = RLModule(observation_space=BOX4, action_space=gym.spaces.MultiDiscrete([2, 3]))
    assert multi.get_train_action_dist_cls().from_logits(torch.zeros(1, 5)).sample().shape == (1, 2)
    odd = RLModule(observation_space=BOX4, action_space=gym.spaces.Tuple([BOX4]))
    with pytest.raises(NotImplementedError, match="action_dist_cls"):
        odd.get_inference_action_dist_cls()


# ---------------------------------------------------------------------------- multi module
def test_multi_rl_module_container_api():
    multi = MultiRLModule.from_modules({"p0": _module(), "p.1": _module(act="box")})
    assert "p0" in multi and "p.1" in multi and len(multi) == 2
    assert sorted(multi.keys()) == ["p.1", "p0"] and sorted(multi) == ["p.1", "p0"]
    assert dict(multi.items())["p0"] is multi["p0"]
    n_params = sum(p.numel() for p in multi.parameters())
    assert n_params == sum(p.numel() for m in multi.values() for p in m.parameters())
    with pytest.raises(UnknownPolicyError, match=r"Did you mean 'p\.1'"):
        multi["p1"]  # noqa: B018
    with pytest.raises(ValueError, match="already exists"):
        multi.add_module("p0", _module())
    replacement = _module()
    multi.add_module("p0", replacement, override=True)
    assert multi["p0"] is replacement
    assert multi.foreach_module(lambda mid, m: mid, return_dict=True) == {"p0": "p0", "p.1": "p.1"}
    multi.remove_module("p.1")
    assert "p.1" not in multi and len(list(multi.parameters())) == len(
        list(replacement.parameters())
    )
    with pytest.raises(UnknownPolicyError):
        multi.remove_module("p.1")
    multi.remove_module("p.1", raise_err_if_not_found=False)
    assert isinstance(multi.observation_space, gym.spaces.Dict)


def test_multi_rl_module_forward_dispatch_and_state():
    multi = MultiRLModule.from_modules({"a": _module(), "b": _module(act="box")})
    batch = {"a": {Columns.OBS: torch.zeros(2, 4)}, "b": {Columns.OBS: torch.zeros(3, 4)}}
    out = multi.forward_exploration(batch)
    assert out["a"][Columns.ACTION_DIST_INPUTS].shape == (2, 3)
    assert out["b"][Columns.ACTION_DIST_INPUTS].shape == (3, 4)
    assert set(multi.forward_train(batch)["a"]) == {Columns.ACTION_DIST_INPUTS, Columns.VF_PREDS}
    with pytest.raises(UnknownPolicyError):
        multi.forward_inference({"zzz": {Columns.OBS: torch.zeros(1, 4)}})

    state = multi.get_state()
    assert set(state) == {"a", "b"} and all(isinstance(v, np.ndarray) for v in state["a"].values())
    assert set(multi.get_state(components="a")) == {"a"}
    assert set(multi.get_state(components=["b/encoder"])) == {"b"}
    assert set(multi.get_state(not_components="a")) == {"b"}

    other = MultiRLModule.from_modules({"a": _module(), "b": _module(act="box")})
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    multi.set_state({**other.get_state(components="a"), "unknown_policy": {}})
    np.testing.assert_array_equal(multi["a"].get_state()["pi.layers.0.bias"],
                                  other["a"].get_state()["pi.layers.0.bias"])  # fmt: skip
    assert not np.array_equal(multi["b"].get_state()["pi.layers.0.bias"],
                              other["b"].get_state()["pi.layers.0.bias"])  # fmt: skip
    with pytest.raises(UnknownPolicyError, match="none of the state's keys"):
        multi.set_state({"x": {}})


def test_multi_rl_module_spec_build_and_serialization(tmp_path):
    specs = {
        "p0": default_rl_module_spec(BOX4, gym.spaces.Discrete(2), model_config=SMALL),
        "p1": default_rl_module_spec(BOX4, gym.spaces.Discrete(3), model_config=SMALL),
    }
    spec = MultiRLModuleSpec(rl_module_specs=specs)
    multi = spec.build()
    assert isinstance(multi, MultiRLModule) and sorted(multi.keys()) == ["p0", "p1"]
    assert isinstance(spec.build("p1"), DefaultTorchRLModule)
    assert "p0" in spec and spec["p0"] is specs["p0"]
    with pytest.raises(UnknownPolicyError):
        spec["p2"]  # noqa: B018
    spec.add_modules({"p2": specs["p0"]})
    spec.remove_modules("p2")
    assert "p2" not in spec

    restored = MultiRLModuleSpec.from_dict(json.loads(json.dumps(spec.to_serializable_dict())))
    assert sorted(restored.build().keys()) == ["p0", "p1"]

    path = multi.save_to_path(tmp_path / "multi")
    loaded = MultiRLModuleSpec(rl_module_specs=specs, load_state_path=path, modules_to_load={"p1"})
    built = loaded.build()
    np.testing.assert_array_equal(built["p1"].get_state()["vf.layers.0.weight"],
                                  multi["p1"].get_state()["vf.layers.0.weight"])  # fmt: skip

    single = specs["p0"].as_multi_rl_module_spec()
    assert list(single.rl_module_specs) == [DEFAULT_MODULE_ID]
    assert list(_module().as_multi_rl_module().keys()) == [DEFAULT_MODULE_ID]


# ---------------------------------------------------------------------------- torch utils
def _blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


def test_runner_thread_limit_covers_torch_and_numpy_blas():
    from threadpoolctl import threadpool_limits

    from envrunners.env.runner_setup import torch_threads

    config = (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .env_runners(num_cpus_per_env_runner=1)
    )
    with threadpool_limits(2, user_api="blas"), set_torch_threads_ctx(2):
        outside = _blas_threads()
        with torch_threads(config, 0):
            assert torch.get_num_threads() == 1
            assert _blas_threads() and set(_blas_threads()) == {1}
        assert torch.get_num_threads() == 2 and _blas_threads() == outside


def test_fractional_cpu_share_runs_on_one_thread():
    """num_cpus_per_env_runner=0.5 once asked torch for 0 threads (every sample() failed)."""
    from envrunners.algorithms.ppo import PPOConfig
    from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner

    config = PPOConfig().environment("CartPole-v1").env_runners(num_cpus_per_env_runner=0.5)
    runner = SingleAgentEnvRunner(config=config)
    try:
        assert sum(len(e) for e in runner.sample(num_timesteps=10)) >= 10
    finally:
        runner.stop()


class _ThreadWatchEnv(gym.Env):
    """Records the BLAS thread counts its steps see (the runner acts between steps)."""

    seen: list = []

    def __init__(self, config=None):
        self.observation_space = BOX4
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(4, np.float32), {}

    def step(self, action):
        _ThreadWatchEnv.seen.append(tuple(_blas_threads()))
        return np.zeros(4, np.float32), 1.0, False, False, {}


def test_sampling_runs_blas_on_the_runner_cpus():
    from threadpoolctl import threadpool_limits

    from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner

    config = (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(_ThreadWatchEnv)
        .env_runners(num_envs_per_env_runner=2)
    )
    runner = SingleAgentEnvRunner(config=config)
    _ThreadWatchEnv.seen.clear()
    with threadpool_limits(2, user_api="blas"):
        runner.sample(num_timesteps=6)
        assert set(_blas_threads()) == {2}
    runner.stop()
    assert _ThreadWatchEnv.seen and all(set(t) == {1} for t in _ThreadWatchEnv.seen)


@contextlib.contextmanager
def set_torch_threads_ctx(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_set_torch_threads():
    before = torch.get_num_threads()
    try:
        assert set_torch_threads(1) == before
        assert torch.get_num_threads() == 1
        assert set_torch_threads(None) == 1 and torch.get_num_threads() == 1
        with pytest.raises(ConfigError, match="positive int"):
            set_torch_threads(0)
    finally:
        torch.set_num_threads(before)


def test_convert_to_torch_tensor_nested():
    readonly = np.arange(3, dtype=np.int64)
    readonly.flags.writeable = False
    struct = {"a": np.ones((2, 2)), "b": [readonly, 1.5, None], "c": ("x", np.float32(2.0))}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = convert_to_torch_tensor(struct)
    assert out["a"].dtype == torch.float32 and out["a"].shape == (2, 2)
    assert out["b"][0].dtype == torch.int64 and out["b"][1].dtype == torch.float32
    assert out["b"][2] is None and out["c"][0] == "x"
    assert convert_to_torch_tensor(torch.zeros(2, dtype=torch.float64)).dtype == torch.float32


@pytest.mark.parametrize("act", sorted(ACT_SPACES))
def test_modules_pickle_and_deepcopy(act):
    module = _module(act=act, model_config={**SMALL, "fcnet_activation": "silu"})
    batch = _obs("box", 3)
    expected = module.compute_actions_numpy(batch, explore=False)  # builds the acting cache
    for clone in (pickle.loads(pickle.dumps(module)), copy.deepcopy(module)):
        got = clone.compute_actions_numpy(batch, explore=False)
        np.testing.assert_allclose(got[Columns.ACTIONS], expected[Columns.ACTIONS])
        assert clone.get_train_action_dist_cls() is module.get_train_action_dist_cls()
    multi = pickle.loads(pickle.dumps(MultiRLModule.from_modules({"p": module})))
    assert isinstance(multi["p"], DefaultTorchRLModule)


def test_categorical_draws_per_thread_buffers_do_not_mix():
    """Concurrent samplers (threads) get exactly their own generator's draws."""
    import threading

    from envrunners.core.rl_module.default_torch_rl_module import _sample_categorical_cpu

    logits = torch.zeros(6, 4)

    def draws(seed: int) -> list:
        gen = torch.Generator().manual_seed(seed)
        return [_sample_categorical_cpu(logits, gen)[0].tolist() for _ in range(300)]

    expected = {seed: draws(seed) for seed in (1, 2)}
    got: dict = {}
    threads = [threading.Thread(target=lambda s=s: got.update({s: draws(s)})) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected


def test_state_views_of_a_large_module_keep_their_values_on_huge_pages():
    """``get_state(copy=False)`` moves large entries onto huge pages (where the kernel
    can): the views and the module keep their values, and the module still trains."""
    spec = RLModuleSpec(
        module_class=DefaultTorchRLModule,
        observation_space=gym.spaces.Box(-1, 1, (4,), np.float32),
        action_space=gym.spaces.Discrete(2),
        model_config={"fcnet_hiddens": [1024, 1024]},
    )
    module = spec.build()
    before = module.get_state()
    views = module.get_state(copy=False)
    again = module.get_state(copy=False)
    for name, value in before.items():
        np.testing.assert_array_equal(views[name], value)
        np.testing.assert_array_equal(again[name], value)
    param = next(p for p in module.parameters() if p.numel() >= 1024 * 1024)
    with torch.no_grad():
        param.add_(1.0)
    name = next(n for n, v in views.items() if v.size == param.numel())
    np.testing.assert_array_equal(views[name], before[name] + 1.0)
