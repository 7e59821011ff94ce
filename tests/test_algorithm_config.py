"""AlgorithmConfig / PPOConfig / PolicySpec: defaults, builders, checks, freezing, dict I/O."""

from __future__ import annotations

import inspect
import pickle
import warnings

import gymnasium as gym
import pytest

from envrunners.algorithms.algorithm_config import AlgorithmConfig, FrozenConfigError, NotProvided
from envrunners.algorithms.ppo import PPOConfig
from envrunners.errors import ConfigError
from envrunners.policy.policy_spec import PolicySpec

# --------------------------------------------------------------------------- defaults

SPEC_DEFAULTS = {
    "env": None,
    "env_config": {},
    "num_env_runners": 0,
    "create_local_env_runner": True,
    "create_env_on_local_worker": False,
    "num_envs_per_env_runner": 1,
    "gym_env_vectorize_mode": "sync",
    "remote_worker_envs": False,
    "remote_env_batch_wait_ms": 0,
    "rollout_fragment_length": 200,
    "batch_mode": "truncate_episodes",
    "explore": True,
    "episode_lookback_horizon": 1,
    "episodes_to_numpy": True,
    "count_steps_by": "env_steps",
    "policies": {"default_policy": PolicySpec()},
    "policies_to_train": None,
    "policy_map_capacity": 100,
    "policy_states_are_swappable": False,
    "observation_filter": "NoFilter",
    "update_worker_filter_stats": True,
    "use_worker_filter_stats": True,
    "merge_env_runner_states": "training_only",
    "broadcast_env_runner_states": True,
    "use_env_runner_state_server": False,
    "sample_timeout_s": 60.0,
    "max_requests_in_flight_per_env_runner": 1,
    "validate_env_runners_after_construction": True,
    "restart_failed_env_runners": True,
    "ignore_env_runner_failures": False,
    "max_num_env_runner_restarts": 1000,
    "restart_failed_sub_environments": False,
    "num_consecutive_env_runner_failures_tolerance": 100,
    "env_runner_health_probe_timeout_s": 30.0,
    "env_runner_restore_timeout_s": 1800.0,
    "sync_filters_on_rollout_workers_timeout_s": 10.0,
    "num_cpus_per_env_runner": 1,
    "num_gpus_per_env_runner": 0,
    "custom_resources_per_env_runner": {},
    "seed": None,
    "in_evaluation": False,
    "metrics_num_episodes_for_smoothing": 100,
    "disable_env_checking": False,
    "env_runner_cls": None,
    "enable_env_runner_and_connector_v2": True,
    "enable_rl_module_and_learner": True,
    "input_": "sampler",
    "input_config": {},
    "output": None,
    "output_config": {},
    "shuffle_buffer_size": 0,
    "postprocess_inputs": False,
    "compress_observations": False,
    "sampler_perf_stats_ema_coef": None,
    "fake_sampler": False,
    "offline_sampling": False,
    "clip_rewards": None,
    "normalize_actions": True,
    "clip_actions": False,
    "render_env": False,
    "checkpoint_trainable_policies_only": False,
    "extra_python_environs_for_driver": {},
    "extra_python_environs_for_worker": {},
    "gamma": 0.99,
    "lr": 0.001,
    "train_batch_size": 4000,
    "framework_str": "torch",
    "log_level": "WARN",
    "callbacks_class": [],
    "callbacks_on_episode_start": None,
    "env_to_module_connector": None,
    "module_to_env_connector": None,
    "rl_module_spec": None,
}


@pytest.mark.parametrize(("key", "expected"), sorted(SPEC_DEFAULTS.items()))
def test_defaults_match_the_spec_table(key, expected):
    assert getattr(AlgorithmConfig(), key) == expected


def test_restart_delay_default_is_a_deliberate_one_second():
    assert AlgorithmConfig().delay_between_env_runner_restarts_s == 1.0


def test_default_model_config_and_mapping_fn():
    config = AlgorithmConfig()
    assert config.model_config["fcnet_hiddens"] == [256, 256]
    assert config.model_config["fcnet_activation"] == "tanh"
    assert config.model_config["vf_share_layers"] is False
    assert config.policy_mapping_fn("agent_0", None) == "default_policy"
    assert config.policy_mapping_fn("agent_0", None, None, extra=1) == "default_policy"
    assert config.is_multi_agent is False
    assert config.total_train_batch_size == 4000


def test_mutable_defaults_are_not_shared():
    a, b = AlgorithmConfig(), AlgorithmConfig()
    a.env_config["x"] = 1
    a.model_config["fcnet_hiddens"].append(8)
    assert b.env_config == {}
    assert b.model_config["fcnet_hiddens"] == [256, 256]


# --------------------------------------------------------------------------- builders


def _changed(value):
    """A valid non-default value for bool/int/float defaults, else None."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5
    return None


def _builder_cases():
    cases = []
    for section, kwargs in AlgorithmConfig._KWARGS.items():
        for kwarg, attr in kwargs.items():
            if section != "exploration":
                cases.append(pytest.param(section, kwarg, attr, id=f"{section}-{kwarg}"))
    return cases


@pytest.mark.parametrize(("section", "kwarg", "attr"), _builder_cases())
def test_every_builder_kwarg_round_trips(section, kwarg, attr):
    config = AlgorithmConfig()
    default = getattr(config, attr)
    value = _changed(default)
    value = default if value is None else value
    assert getattr(config, section)(**{kwarg: value}) is config
    assert getattr(config, attr) == value


SAMPLES = [
    ("environment", {"env": "CartPole-v1", "env_config": {"a": 1}}, {"env": "CartPole-v1"}),
    ("environment", {"observation_space": gym.spaces.Discrete(3)}, {}),
    ("env_runners", {"rollout_fragment_length": "auto", "batch_mode": "complete_episodes"}, {}),
    ("env_runners", {"gym_env_vectorize_mode": "async", "observation_filter": "MeanStdFilter"}, {}),
    ("env_runners", {"merge_env_runner_states": False, "sample_timeout_s": None}, {}),
    ("env_runners", {"env_to_module_connector": print, "module_to_env_connector": print}, {}),
    ("multi_agent", {"count_steps_by": "agent_steps", "policies_to_train": ["p0"]}, {}),
    ("offline_data", {"input_": "/tmp/data", "output": "logdir", "input_config": {"a": 1}}, {}),
    ("rl_module", {"rl_module_spec": object}, {}),
    ("training", {"lr": [[0, 0.1], [100, 0.01]], "grad_clip": 40.0, "minibatch_size": 64}, {}),
    ("debugging", {"seed": 42, "log_level": "INFO"}, {}),
    ("evaluation", {"evaluation_duration": "auto", "evaluation_config": {"explore": False}}, {}),
    ("evaluation", {"evaluation_duration_unit": "timesteps", "evaluation_interval": 2}, {}),
    ("resources", {"num_gpus": 1, "placement_strategy": "SPREAD"}, {}),
    ("framework", {"framework": "torch", "torch_compile_worker": True}, {"framework_str": "torch"}),
]


@pytest.mark.parametrize(("method", "kwargs", "attrs"), SAMPLES)
def test_builder_sample_values(method, kwargs, attrs):
    config = getattr(AlgorithmConfig(), method)(**kwargs)
    expected = attrs or kwargs
    for key, value in expected.items():
        assert getattr(config, key) == value


def test_builders_chain_and_accept_positional_first_arguments():
    config = (
        AlgorithmConfig()
        .environment("CartPole-v1")
        .framework("torch")
        .api_stack(False, False)
        .checkpointing(True, True)
    )
    assert config.env == "CartPole-v1"
    assert config.enable_rl_module_and_learner is False
    assert config.enable_env_runner_and_connector_v2 is False
    assert config.checkpoint_trainable_policies_only is True
    config.api_stack(enable_env_runner_and_connector_v2=True)
    assert config.enable_rl_module_and_learner is False  # None leaves it unchanged


def test_builder_signatures_list_rllib_keywords():
    params = inspect.signature(AlgorithmConfig.env_runners).parameters
    for name in ("num_env_runners", "num_envs_per_env_runner", "rollout_fragment_length"):
        assert params[name].default is NotProvided
    env_params = inspect.signature(AlgorithmConfig.environment).parameters
    assert list(env_params)[:2] == ["self", "env"]
    assert "on_episode_start" in inspect.signature(AlgorithmConfig.callbacks).parameters
    assert "lambda_" in inspect.signature(PPOConfig.training).parameters
    assert "lambda_" not in inspect.signature(AlgorithmConfig.training).parameters


def test_callbacks_are_stored_as_lists():
    class A:
        pass

    class B:
        pass

    def fn(**kwargs):
        return None

    config = AlgorithmConfig().callbacks(A, on_episode_start=fn, on_sample_end=[fn, fn])
    assert config.callbacks_class == [A]
    assert config.callbacks_on_episode_start == [fn]
    assert config.callbacks_on_sample_end == [fn, fn]
    assert config.callbacks([A, B]).callbacks_class == [A, B]
    with pytest.raises(ConfigError, match="not an instance"):
        config.callbacks(A())


def test_model_config_merges_with_defaults():
    config = AlgorithmConfig().rl_module(model_config={"fcnet_hiddens": [64]})
    assert config.model_config["fcnet_hiddens"] == [64]
    assert config.model_config["fcnet_activation"] == "tanh"
    config.training(model={"fcnet_activation": "relu"})
    assert config.model_config["fcnet_hiddens"] == [64]
    assert config.model == config.model_config
    assert config.model["fcnet_activation"] == "relu"


def test_model_config_accepts_a_default_model_config_like_rllib():
    from envrunners.core.rl_module.default_model_config import DefaultModelConfig

    config = AlgorithmConfig().rl_module(
        model_config=DefaultModelConfig(use_lstm=True, lstm_cell_size=32, fcnet_hiddens=[8])
    )
    assert isinstance(config.model_config, dict)
    assert config.model_config["use_lstm"] is True
    assert config.model_config["lstm_cell_size"] == 32
    assert config.model_config["fcnet_hiddens"] == [8]
    # The dataclass's own defaults come along (RLlib 2.60: vf_share_layers=True).
    assert config.model_config["vf_share_layers"] is True
    with pytest.raises(ConfigError, match="model_config"):
        AlgorithmConfig().rl_module(model_config=DefaultModelConfig)  # the class, not one


# --------------------------------------------------------------------------- errors


def test_unknown_builder_kwarg_suggests_close_match():
    with pytest.raises(
        ConfigError,
        match=r"^Unknown option 'num_env_runner' for AlgorithmConfig\.env_runners\(\)\. "
        r"Did you mean 'num_env_runners'\?$",
    ):
        AlgorithmConfig().env_runners(num_env_runner=2)
    with pytest.raises(
        ConfigError, match=r"'gama' for PPOConfig\.training\(\)\. Did you mean 'gamma'"
    ):
        PPOConfig().training(gama=0.9)


def test_kwarg_of_another_builder_names_the_right_one():
    with pytest.raises(
        ConfigError, match=r"set it with AlgorithmConfig\.env_runners\(num_env_runners"
    ):
        AlgorithmConfig().training(num_env_runners=2)


def test_out_of_scope_rllib_keys_say_so():
    # (input_read_method is supported since issue 20: OfflineData reads Parquet via Ray Data)
    with pytest.raises(ConfigError, match="'input_filesystem'.*not supported by envrunners"):
        AlgorithmConfig().offline_data(input_filesystem="s3")


def test_tensorflow_only_options_warn_and_are_ignored():
    with pytest.warns(UserWarning, match="'eager_tracing' only configures TensorFlow"):
        config = AlgorithmConfig().framework("torch", eager_tracing=True)
    assert not hasattr(config, "eager_tracing")


@pytest.mark.parametrize("name", ["tf", "tf2"])
def test_tensorflow_framework_is_a_clear_error(name):
    with pytest.raises(
        ConfigError, match=r"TensorFlow is not supported by envrunners.*framework\('torch'\)"
    ):
        AlgorithmConfig().framework(name)


def test_unknown_framework_suggests_torch():
    with pytest.raises(ConfigError, match="Did you mean 'torch'"):
        AlgorithmConfig().framework("torchh")


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_num_envs_per_env_runner_must_be_positive_int(bad):
    with pytest.raises(
        ConfigError, match=rf"num_envs_per_env_runner must be an int > 0, got {bad!r}"
    ):
        AlgorithmConfig().env_runners(num_envs_per_env_runner=bad)


@pytest.mark.parametrize("bad", [0, -5, "autoo", 2.5])
def test_rollout_fragment_length_must_be_positive_int_or_auto(bad):
    with pytest.raises(ConfigError, match="rollout_fragment_length must be an int > 0 or 'auto'"):
        AlgorithmConfig().env_runners(rollout_fragment_length=bad)


def test_choice_checks_suggest():
    with pytest.raises(ConfigError, match="Did you mean 'truncate_episodes'"):
        AlgorithmConfig().env_runners(batch_mode="truncate_episode")
    with pytest.raises(ConfigError, match="Did you mean 'agent_steps'"):
        AlgorithmConfig().multi_agent(count_steps_by="agent_step")
    with pytest.raises(ConfigError, match="Did you mean 'async'"):
        AlgorithmConfig().env_runners(gym_env_vectorize_mode="asyncc")


def test_vectorize_mode_accepts_gymnasium_enum_and_case():
    config = AlgorithmConfig().env_runners(gym_env_vectorize_mode=gym.VectorizeMode.ASYNC)
    assert config.gym_env_vectorize_mode == "async"
    config.env_runners(gym_env_vectorize_mode="VECTOR_ENTRY_POINT")
    assert config.gym_env_vectorize_mode == "vector_entry_point"
    assert gym.VectorizeMode(config.gym_env_vectorize_mode) is gym.VectorizeMode.VECTOR_ENTRY_POINT


def test_env_kinds():
    def creator(ctx):
        return gym.make("CartPole-v1")

    config = AlgorithmConfig()
    assert config.environment(creator).env is creator
    from gymnasium.envs.classic_control import CartPoleEnv as cls

    assert config.environment(cls).env is cls
    with pytest.raises(ConfigError, match="env instance.*pass CartPoleEnv"):
        config.environment(cls())
    with pytest.raises(ConfigError, match="env must be"):
        config.environment(42)


def test_builder_is_all_or_nothing():
    config = AlgorithmConfig()
    with pytest.raises(ConfigError):
        config.env_runners(num_env_runners=3, num_envs_per_env_runner=0)
    assert config.num_env_runners == 0


def test_unknown_attribute_assignment_and_lookup():
    config = AlgorithmConfig()
    with pytest.raises(
        ConfigError,
        match="Unknown option 'num_env_runner' for AlgorithmConfig. Did you mean 'num_env_runners'",
    ):
        config.num_env_runner = 2
    with pytest.raises(
        AttributeError, match="no attribute 'num_env_runner'. Did you mean 'num_env_runners'"
    ):
        config.num_env_runner  # noqa: B018
    with pytest.raises(ConfigError, match="num_envs_per_env_runner must be an int > 0, got 0"):
        config.num_envs_per_env_runner = 0


def test_subclass_declares_keys_by_annotation():
    class MyConfig(AlgorithmConfig):
        my_key: int = 3
        lr = 0.5  # plain override of an inherited default

    config = MyConfig()
    assert (config.my_key, config.lr) == (3, 0.5)
    assert config.training(my_key=4).my_key == 4
    assert MyConfig.from_dict(config.to_dict()) == config

    class Legacy(AlgorithmConfig):
        def __init__(self):
            super().__init__()
            self.undeclared = 1

    with pytest.raises(ConfigError, match="declared as annotated class attributes"):
        Legacy()


# --------------------------------------------------------------------------- validate


def test_validate_reports_every_problem_at_once():
    config = AlgorithmConfig()
    config.policies["bad"] = ("only", "two")  # in-place edit no setter saw
    config.policies_to_train = ["default_policy", "p0"]
    config.evaluation_config = {"num_env_runner": 2}
    with pytest.raises(ConfigError, match="3 problems in the config") as info:
        config.validate()
    problems = info.value.problems
    assert len(problems) == 3
    assert "policies['bad'] is a tuple of length 2" in problems[0]
    assert "policies_to_train names 'p0', which is not in policies" in problems[1]
    assert problems[2] == (
        "evaluation_config: Unknown option 'num_env_runner' for "
        "AlgorithmConfig.evaluation_config. Did you mean 'num_env_runners'?"
    )


def test_validate_collects_value_problems_and_normalises():
    config = AlgorithmConfig()
    config.policies["p1"] = (None, None, None, {"gamma": 0.5})
    config.validate()
    assert config.policies["p1"] == PolicySpec(config={"gamma": 0.5})
    vars(config).update(num_envs_per_env_runner=0, batch_mode="foo", framework_str="tf2")
    with pytest.raises(ConfigError, match="3 problems in the config") as info:
        config.validate()
    text = "\n".join(info.value.problems)
    assert "num_envs_per_env_runner must be an int > 0, got 0" in text
    assert "batch_mode must be one of" in text
    assert "TensorFlow is not supported" in text


def test_batch_vs_fragment_mismatch_is_a_warning_with_the_arithmetic():
    config = AlgorithmConfig().env_runners(
        num_env_runners=3, num_envs_per_env_runner=2, rollout_fragment_length=1000
    )
    with pytest.warns(UserWarning) as record:
        config.validate()  # warns, does not raise
    message = str(record[0].message)
    assert "3 env runner(s) x 2 env(s) x rollout_fragment_length=1000 = 6000" in message
    assert "collect 6000 steps, 50% more than 4000" in message
    assert "rollout_fragment_length='auto' (or 667)" in message
    with pytest.warns(UserWarning, match="6000 steps per round"):
        config.validate_train_batch_size_vs_rollout_fragment_length()


@pytest.mark.parametrize("fragment", ["auto", 500, 100])
def test_no_warning_when_rounds_fit(fragment):
    config = AlgorithmConfig().env_runners(
        num_env_runners=2, num_envs_per_env_runner=4, rollout_fragment_length=fragment
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.validate()


def test_minibatch_larger_than_batch_is_a_warning():
    config = PPOConfig().training(train_batch_size=100, minibatch_size=128)
    config.env_runners(rollout_fragment_length="auto")
    with pytest.warns(
        UserWarning, match=r"minibatch_size \(128\) is larger than the train batch \(100\)"
    ):
        config.validate()


# --------------------------------------------------------------------------- fragment length


def test_fragment_length_examples_from_the_spec():
    config = AlgorithmConfig().env_runners(
        num_env_runners=2, num_envs_per_env_runner=2, rollout_fragment_length="auto"
    )
    config.training(train_batch_size=2000)
    assert [config.get_rollout_fragment_length(i) for i in (0, 1, 2)] == [500, 500, 500]
    config.env_runners(num_env_runners=4, num_envs_per_env_runner=3).training(train_batch_size=2500)
    assert [config.get_rollout_fragment_length(i) for i in (1, 2, 3, 4)] == [209, 209, 208, 208]
    assert 3 * sum(config.get_rollout_fragment_length(i) for i in (1, 2, 3, 4)) >= 2500


def test_fragment_length_int_and_tiny_batches():
    config = AlgorithmConfig()
    assert config.get_rollout_fragment_length(3) == 200
    config.env_runners(rollout_fragment_length="auto", num_envs_per_env_runner=8)
    config.training(train_batch_size=4)
    assert config.get_rollout_fragment_length(0) == 1  # never 0


def test_total_train_batch_size_per_learner():
    config = AlgorithmConfig().training(train_batch_size_per_learner=500)
    assert config.total_train_batch_size == 500
    assert config.learners(num_learners=2).total_train_batch_size == 1000


# --------------------------------------------------------------------------- multi-agent


def test_policies_normalisation():
    obs, act = gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2)
    config = AlgorithmConfig().multi_agent(
        policies={"p0": None, "p1": (None, obs, act, {"gamma": 0.9}), "p2": PolicySpec()},
        policy_mapping_fn=lambda aid, episode, **kw: f"p{aid}",
    )
    assert config.policies["p0"] == PolicySpec()
    assert config.policies["p1"] == PolicySpec(None, obs, act, {"gamma": 0.9})
    assert config.is_multi_agent
    assert AlgorithmConfig().multi_agent(policies={"b", "a"}).policies == {
        "a": PolicySpec(),
        "b": PolicySpec(),
    }
    assert list(AlgorithmConfig().multi_agent(policies=["x", "y"]).policies) == ["x", "y"]
    two = AlgorithmConfig().multi_agent(policies=["default_policy", "p1"])
    assert two.is_multi_agent


def test_bad_policy_tuple_names_id_tuple_and_layout():
    with pytest.raises(
        ConfigError,
        match=r"policies\['p0'\] is a tuple of length 3: \(None, None, None\); .*"
        r"\(policy_class, observation_space, action_space, config\)",
    ):
        AlgorithmConfig().multi_agent(policies={"p0": (None, None, None)})


def test_policy_tuple_in_the_wrong_order_is_named():
    obs, act = gym.spaces.Discrete(2), gym.spaces.Discrete(3)
    with pytest.raises(ConfigError, match=r"policies\['p0'\]: policy_class must be a Policy class"):
        AlgorithmConfig().multi_agent(policies={"p0": (obs, act, None, None)})
    with pytest.raises(ConfigError, match=r"policies\['p0'\]: action_space must be a gymnasium"):
        AlgorithmConfig().multi_agent(policies={"p0": PolicySpec(None, obs, "act")})


def test_bad_policy_values():
    with pytest.raises(ConfigError, match="policy ids must be str, got 1"):
        AlgorithmConfig().multi_agent(policies={1: None})
    with pytest.raises(ConfigError, match=r"policies\['p'\] must be a PolicySpec"):
        AlgorithmConfig().multi_agent(policies={"p": 5})
    with pytest.raises(ConfigError, match="policy_mapping_fn must be a callable"):
        AlgorithmConfig().multi_agent(policy_mapping_fn="p0")
    with pytest.raises(ConfigError, match="policies_to_train must be"):
        AlgorithmConfig().multi_agent(policies_to_train=3)
    fn = AlgorithmConfig().multi_agent(policies_to_train=lambda pid, batch=None: pid == "a")
    assert fn.policies_to_train("a")


def test_policy_spec_is_a_comparable_dataclass():
    assert PolicySpec() == PolicySpec(None, None, None, None)
    assert PolicySpec(config={"a": 1}) != PolicySpec()


# --------------------------------------------------------------------------- freeze / copy


def test_frozen_config_refuses_every_change():
    config = AlgorithmConfig().environment("CartPole-v1")
    config.freeze()
    assert config.is_frozen
    message = r"config is frozen; use config\.copy\(copy_frozen=False\)"
    with pytest.raises(FrozenConfigError, match=message):
        config.num_env_runners = 2
    with pytest.raises(ConfigError, match=message):
        config.env_runners(num_env_runners=2)
    with pytest.raises(AttributeError, match=message):  # RLlib raised AttributeError
        config.update_from_dict({"gamma": 0.5})
    assert config.num_env_runners == 0


def test_copy_semantics():
    config = AlgorithmConfig().environment("CartPole-v1", env_config={"a": [1]})
    config.freeze()
    assert config.copy().is_frozen
    thawed = config.copy(copy_frozen=False)
    assert not thawed.is_frozen and thawed == config
    thawed.env_config["a"].append(2)
    thawed.num_env_runners = 3
    assert config.env_config == {"a": [1]} and config.num_env_runners == 0
    assert thawed.copy(copy_frozen=True).is_frozen
    assert not thawed.is_frozen


def test_pickle_round_trip_keeps_frozen_state():
    config = PPOConfig().environment("CartPole-v1").multi_agent(policies=["a", "b"])
    config.freeze()
    restored = pickle.loads(pickle.dumps(config))
    assert restored == config and restored.is_frozen


# --------------------------------------------------------------------------- dict I/O


def test_to_dict_from_dict_round_trip():
    class Callbacks:
        pass

    config = (
        AlgorithmConfig()
        .environment("CartPole-v1", env_config={"size": 3})
        .env_runners(num_env_runners=2, rollout_fragment_length="auto")
        .multi_agent(policies={"p0": (None, gym.spaces.Discrete(2), gym.spaces.Discrete(3), {})})
        .callbacks(Callbacks)
        .offline_data(input_="/tmp/x")
    )
    data = config.to_dict()
    assert data["framework"] == "torch" and data["input"] == "/tmp/x"
    assert data["callbacks"] == [Callbacks] and data["model"] == data["model_config"]
    assert "framework_str" not in data and "input_" not in data
    restored = AlgorithmConfig.from_dict(data)
    assert restored == config
    data["env_config"]["size"] = 99  # a copy
    assert config.env_config == {"size": 3}


def test_ppo_round_trip_and_lambda_key():
    config = PPOConfig().training(lambda_=0.95, clip_param=0.1)
    data = config.to_dict()
    assert data["lambda"] == 0.95 and config["lambda"] == 0.95
    assert PPOConfig.from_dict(data) == config


def test_from_dict_reports_every_unknown_key():
    with pytest.raises(ConfigError) as info:
        AlgorithmConfig.from_dict({"num_env_runner": 1, "gama": 0.5, "gamma": 0.9})
    assert len(info.value.problems) == 2
    assert info.value.problems[0] == (
        "Unknown option 'num_env_runner' for AlgorithmConfig.from_dict(). "
        "Did you mean 'num_env_runners'?"
    )
    assert "Did you mean 'gamma'?" in info.value.problems[1]


def test_update_from_dict_is_all_or_nothing_and_reads_legacy_keys():
    config = AlgorithmConfig()
    with pytest.raises(ConfigError):
        config.update_from_dict({"gamma": 0.5, "num_envs_per_env_runner": 0})
    assert config.gamma == 0.99
    with pytest.warns(
        DeprecationWarning, match="'num_workers' is deprecated; use 'num_env_runners'"
    ):
        config.update_from_dict({"num_workers": 2, "multiagent": {"policies": ["a", "b"]}})
    assert config.num_env_runners == 2 and set(config.policies) == {"a", "b"}


def test_dict_style_access():
    config = AlgorithmConfig()
    assert config["train_batch_size"] == 4000
    assert config.get("framework") == "torch"
    assert config.get("input_config", {}) == {}
    assert config.get("no_such_key", 7) == 7
    assert "custom_vector_env" not in config
    assert "lambda" not in config and "lambda" in PPOConfig()
    config["gamma"] = 0.5
    assert config.gamma == 0.5
    assert dict(config)["gamma"] == 0.5
    with pytest.raises(KeyError, match="Did you mean 'gamma'"):
        config["gama"]  # noqa: B018


def test_overrides_checks_keys():
    assert AlgorithmConfig.overrides(gamma=0.9, explore=False) == {"gamma": 0.9, "explore": False}
    with pytest.raises(ConfigError, match="Did you mean 'gamma'"):
        AlgorithmConfig.overrides(gama=0.9)


def test_repr_shows_changed_keys():
    assert (
        repr(AlgorithmConfig().env_runners(num_env_runners=2))
        == "AlgorithmConfig(num_env_runners=2)"
    )


# --------------------------------------------------------------------------- evaluation


def test_evaluation_config_object():
    config = (
        AlgorithmConfig()
        .env_runners(num_env_runners=4, explore=True)
        .evaluation(evaluation_num_env_runners=1, evaluation_config={"explore": False})
    )
    config.freeze()
    eval_config = config.get_evaluation_config_object()
    assert eval_config.in_evaluation and not eval_config.is_frozen
    assert eval_config.num_env_runners == 1 and eval_config.explore is False
    assert eval_config.evaluation_config is None
    assert config.num_env_runners == 4 and config.in_evaluation is False


# --------------------------------------------------------------------------- deprecated names


def test_num_workers_alias_warns_and_maps():
    config = AlgorithmConfig()
    with pytest.warns(
        DeprecationWarning, match="num_workers is deprecated; use config.num_env_runners"
    ):
        config.num_workers = 3
    assert config.num_env_runners == 3
    with pytest.warns(DeprecationWarning):
        assert config.num_workers == 3


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [
        ("num_envs_per_worker", "num_envs_per_env_runner", 4),
        ("create_env_on_driver", "create_env_on_local_worker", True),
        ("recreate_failed_workers", "restart_failed_env_runners", False),
        ("ignore_worker_failures", "ignore_env_runner_failures", True),
    ],
)
def test_old_attribute_names(old, new, value):
    config = AlgorithmConfig()
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated"):
        setattr(config, old, value)
    assert getattr(config, new) == value


def test_rollouts_is_a_deprecated_env_runners():
    with pytest.warns(DeprecationWarning) as record:
        config = AlgorithmConfig().rollouts(num_rollout_workers=2, num_envs_per_worker=3)
    assert (config.num_env_runners, config.num_envs_per_env_runner) == (2, 3)
    messages = [str(w.message) for w in record]
    assert any("rollouts() is deprecated" in m for m in messages)
    assert any("'num_rollout_workers' is deprecated; use 'num_env_runners'" in m for m in messages)


def test_old_builder_keywords():
    config = AlgorithmConfig()
    with pytest.warns(DeprecationWarning):
        config.fault_tolerance(
            recreate_failed_workers=False, ignore_worker_failures=True, worker_restore_timeout_s=5.0
        )
    assert config.restart_failed_env_runners is False
    assert config.ignore_env_runner_failures is True
    assert config.env_runner_restore_timeout_s == 5.0
    with pytest.warns(DeprecationWarning):
        config.fault_tolerance(recreate_failed_env_runners=True)
    assert config.restart_failed_env_runners is True
    with pytest.warns(DeprecationWarning, match="exploration"):
        config.exploration(explore=False)
    assert config.explore is False
    with pytest.warns(DeprecationWarning, match="moved"):
        config.env_runners(restart_failed_sub_environments=True)
    assert config.restart_failed_sub_environments is True
    with pytest.warns(DeprecationWarning):
        config.resources(num_cpus_per_worker=2)
    assert config.num_cpus_per_env_runner == 2
    with pytest.warns(DeprecationWarning):
        config.evaluation(evaluation_num_workers=2)
    assert config.evaluation_num_env_runners == 2


def test_deprecation_warning_points_at_the_caller():
    with pytest.warns(DeprecationWarning) as record:
        AlgorithmConfig().env_runners(num_rollout_workers=1)
    assert record[0].filename == __file__


# --------------------------------------------------------------------------- PPO


def test_ppo_defaults_and_keys():
    config = PPOConfig()
    assert (config.lr, config.train_batch_size, config.lambda_) == (5e-5, 4000, 1.0)
    assert (config.clip_param, config.vf_clip_param, config.vf_loss_coeff) == (0.3, 10.0, 1.0)
    assert (config.entropy_coeff, config.kl_coeff, config.kl_target) == (0.0, 0.2, 0.01)
    assert (config.num_epochs, config.minibatch_size) == (30, 128)
    assert config.use_gae and config.use_critic and config.shuffle_batch_per_epoch
    config.training(lambda_=0.95, vf_clip_param=5.0, entropy_coeff=0.01, use_gae=False)
    assert (config.lambda_, config.vf_clip_param, config.entropy_coeff) == (0.95, 5.0, 0.01)
    with pytest.warns(DeprecationWarning):
        config.training(num_sgd_iter=5, sgd_minibatch_size=64)
    assert (config.num_epochs, config.minibatch_size) == (5, 64)
    with pytest.raises(
        ConfigError, match="Unknown option 'clip_param' for AlgorithmConfig.training"
    ):
        AlgorithmConfig().training(clip_param=0.2)
    with pytest.raises(ConfigError, match="clip_param must be a number > 0"):
        config.training(clip_param=0)


def test_ppo_validate_checks_gae_needs_critic():
    config = PPOConfig().training(use_critic=False)
    with pytest.raises(ConfigError, match="use_gae=True needs use_critic=True"):
        config.validate()
    config.training(use_gae=False)
    config.validate()


# ----------------------------------------------------------------------- RLlib's defaults
#: Keys whose default differs from RLlib 2.60 on purpose, or whose value is an object
#: of each library (so its repr differs): README's "Deliberate differences".
_OWN_DEFAULTS = {
    "delay_between_env_runner_restarts_s",  # 1 s, not 60 s (README)
    "callbacks",  # RLlib's callback class / our empty list: both "no callbacks"
    "policies",  # {"default_policy": PolicySpec()} of each library
    "policy_mapping_fn",  # each library's default mapping function
    "model",  # old-stack model dict: the keys each library reads
    "train_batch_size",  # base class only: 4000 here, RLlib's base 32 (its PPO: 4000)
}


@pytest.mark.parametrize("which", ["PPOConfig", "AlgorithmConfig"])
def test_defaults_are_rllibs(which):
    """Every key both configs have defaults to RLlib 2.60's value (run side by side).

    PPO's ``num_env_runners=2`` and ``rollout_fragment_length="auto"`` were 0 and 200
    here: a script that set neither sampled in the driver, and a train batch that the
    200-step fragments overshoot (256 from 2 envs: 400 steps) sampled more than RLlib.
    """
    rllib_ppo = pytest.importorskip("ray.rllib.algorithms.ppo")
    rllib_base = pytest.importorskip("ray.rllib.algorithms.algorithm_config")
    if which == "PPOConfig":
        theirs, ours = rllib_ppo.PPOConfig().to_dict(), PPOConfig().to_dict()
    else:
        theirs, ours = rllib_base.AlgorithmConfig().to_dict(), AlgorithmConfig().to_dict()
    common = (set(theirs) & set(ours)) - _OWN_DEFAULTS
    assert len(common) > 150  # the comparison compares something
    differ = {k: (theirs[k], ours[k]) for k in sorted(common) if theirs[k] != ours[k]}
    assert differ == {}
    if which == "PPOConfig":
        assert ours["num_env_runners"] == 2 and ours["rollout_fragment_length"] == "auto"
        assert ours["train_batch_size"] == theirs["train_batch_size"] == 4000
