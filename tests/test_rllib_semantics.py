"""RLlib 2.60's user-visible behaviour where envrunners used to differ (issue 15, items 2-4).

Each test pins what real RLlib does on the same snippet: the exception class a user
catches, and the values returned; our messages (did-you-mean hints) are kept.
"""

from __future__ import annotations

import numpy as np
import pytest

from envrunners import errors


# -- envrunners.utils.error at RLlib's path --------------------------------------------------
def test_utils_error_path_has_rllibs_classes_and_texts():
    from envrunners.utils import error

    for name in ("EnvError", "MultiAgentEnvError", "UnsupportedSpaceException", "NotSerializable"):
        cls = getattr(error, name)
        assert cls is getattr(errors, name)
        assert issubclass(cls, Exception) and issubclass(cls, errors.EnvRunnersError)
    # The existing multi-agent protocol error is RLlib's class at its path.
    assert error.MultiAgentEnvError is errors.MultiAgentEnvError
    assert issubclass(error.EnvError, ValueError)
    assert "The env string you provided ('Foo-v0') is:" in (
        error.ERR_MSG_INVALID_ENV_DESCRIPTOR.format("Foo-v0")
    )
    assert error.ERR_MSG_NO_GPUS.startswith("Found {} GPUs on your machine")
    for name in (
        "ERR_MSG_OLD_GYM_API",
        "ERR_MSG_TF_POLICY_CANNOT_SAVE_KERAS_MODEL",
        "ERR_MSG_TORCH_POLICY_CANNOT_SAVE_MODEL",
        "HOWTO_CHANGE_CONFIG",
    ):
        assert isinstance(getattr(error, name), str)
    with pytest.raises(error.EnvError, match="bad env"):
        raise error.EnvError("bad env")


# -- the exception class a user catches is RLlib's ----------------------------------------------
def test_unknown_builder_keyword_is_a_type_error_with_a_hint():
    from envrunners.algorithms.ppo import PPOConfig

    config = PPOConfig()
    with pytest.raises(TypeError, match=r"Unknown option 'num_env_runner' .*'num_env_runners'"):
        config.env_runners(num_env_runner=2)
    with pytest.raises(errors.ConfigError, match="Did you mean 'num_env_runners'"):
        config.env_runners(num_env_runner=2)
    # A key of another builder method: RLlib's signature rejects it too.
    with pytest.raises(TypeError, match=r"set it with PPOConfig\.training\(lr=\.\.\.\)"):
        config.env_runners(lr=0.1)
    # A bad value of a known key stays a plain ConfigError (a ValueError, not a TypeError).
    with pytest.raises(errors.ConfigError) as info:
        config.env_runners(num_env_runners=-1)
    assert not isinstance(info.value, TypeError)
    assert config.num_env_runners == 2  # all or nothing: PPO's default is kept


def test_unknown_env_id_is_rllibs_env_error_and_a_value_error():
    from envrunners.env.registry import resolve_env_creator

    with pytest.raises(ValueError, match=r"Unknown env 'CartPol-v1'.*'CartPole-v1'") as info:
        resolve_env_creator("CartPol-v1", {})
    from envrunners.utils.error import EnvError

    assert isinstance(info.value, EnvError)
    assert isinstance(info.value, errors.EnvCreatorError)  # still ours


# -- every accepted key is used or refused -----------------------------------------------------
def test_typod_model_config_key_of_the_default_module_is_refused_with_a_hint():
    from envrunners.algorithms.ppo import PPOConfig
    from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner

    config = PPOConfig().environment("CartPole-v1").rl_module(model_config={"fcnet_hidden": [8]})
    with pytest.raises(
        errors.ConfigError,
        match=r"Unknown model_config key 'fcnet_hidden' .*'fcnet_hiddens'.*Known keys: \[",
    ):
        SingleAgentEnvRunner(config=config)
    # RLlib's own keys (old-stack MODEL_DEFAULTS, DefaultModelConfig) stay accepted.
    ok = PPOConfig().environment("CartPole-v1")
    ok = ok.rl_module(model_config={"fcnet_hiddens": [8], "dim": 42, "use_attention": False})
    runner = SingleAgentEnvRunner(config=ok)
    runner.stop()


def test_custom_module_may_read_its_own_model_config_keys():
    import gymnasium as gym

    from envrunners.core.rl_module.default_torch_rl_module import default_rl_module_spec
    from envrunners.core.rl_module.rl_module import RLModuleSpec

    space = gym.spaces.Box(-1.0, 1.0, (3,))
    with pytest.raises(errors.ConfigError, match="Unknown model_config key 'hidden_dim'"):
        default_rl_module_spec(space, gym.spaces.Discrete(2), model_config={"hidden_dim": 4})
    spec = RLModuleSpec(model_config={"hidden_dim": 4})  # checked only for the default module
    assert spec.model_config == {"hidden_dim": 4}


# -- InfiniteLookbackBuffer ------------------------------------------------------------------
@pytest.mark.parametrize("finalized", [False, True])
def test_lookback_buffer_list_with_an_out_of_range_index_raises(finalized):
    from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

    buf = InfiniteLookbackBuffer(data=[0, 1, 2, 3, 4, 5], lookback=2)
    if finalized:
        buf.finalize()
    with pytest.raises(IndexError, match="Index 10 is out of range: the buffer has 4 items"):
        buf.get([0, 10])
    with pytest.raises(IndexError, match="Index -10 is out of range"):
        buf.get([0, -10])
    with pytest.raises(IndexError, match="Index -5 is out of range"):
        buf.get([-1, -5], neg_index_as_lookback=True)
    # With fill the out-of-range index is padded, as in RLlib.
    assert [int(x) for x in buf.get([0, 10], fill=-1)] == [2, -1]
    # Reversed slices with fill (RLlib gives the same values).
    got = buf.get(slice(2, -5, -1), fill=-1, neg_index_as_lookback=True)
    assert [int(x) for x in got] == [4, 3, 2, 1, 0, -1, -1]
    assert [int(x) for x in buf.get(slice(3, 0, -1), fill=-1)] == [5, 4, 3]


# -- FastSyncVectorEnv ---------------------------------------------------------------------------
def test_fast_sync_vector_env_close_after_a_failed_constructor_does_not_raise():
    from envrunners.env.vector.fast_sync_vector_env import FastSyncVectorEnv

    def broken_env():
        raise RuntimeError("cannot build")

    with pytest.raises(RuntimeError, match="cannot build"):
        FastSyncVectorEnv([broken_env])
    # What gymnasium's VectorEnv.__del__ (gymnasium < 1.3) runs on the half-built object.
    half_built = FastSyncVectorEnv.__new__(FastSyncVectorEnv)
    half_built.closed = False
    half_built.close()
    if hasattr(half_built, "__del__"):
        half_built.__del__()


# -- MultiAgentEpisode getters and hanging values ------------------------------------------------
def _episode_with_a_hanging_action():
    """a1 acts at env step 1 and observes no more: its action 20 (and rewards 2.0 + 0.5) hang."""
    from envrunners.env.multi_agent_episode import MultiAgentEpisode

    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={"a0": 0, "a1": 0}, infos={"a0": {}, "a1": {}})
    ep.add_env_step(
        observations={"a0": 1, "a1": 1},
        actions={"a0": 10, "a1": 10},
        rewards={"a0": 1.0, "a1": 1.0},
        extra_model_outputs={"a0": {"x": 1}, "a1": {"x": 1}},
    )
    ep.add_env_step(
        observations={"a0": 2},
        actions={"a0": 20, "a1": 20},
        rewards={"a0": 2.0, "a1": 2.0},
        extra_model_outputs={"a0": {"x": 2}, "a1": {"x": 2}},
    )
    ep.add_env_step(
        observations={"a0": 3},
        actions={"a0": 30},
        rewards={"a0": 3.0, "a1": 0.5},
        extra_model_outputs={"a0": {"x": 3}},
    )
    return ep


def test_multi_agent_getters_include_hanging_values_as_rllib():
    # Expected values: RLlib 2.60 on the same episode.
    ep = _episode_with_a_hanging_action()
    assert ep.get_actions([0, 1, 2]) == {"a0": [10, 20, 30], "a1": [10, 20]}
    assert ep.get_rewards([0, 1, 2]) == {"a0": [1.0, 2.0, 3.0], "a1": [1.0, 2.5]}
    assert ep.get_extra_model_outputs("x", [0, 1, 2]) == {"a0": [1, 2, 3], "a1": [1, 2]}
    assert ep.get_actions([1, 2]) == {"a0": [20, 30], "a1": [20]}
    assert ep.get_actions([2, 1]) == {"a0": [30, 20], "a1": [20]}
    assert ep.get_actions([-1]) == {"a0": [30]}
    assert ep.get_actions(1) == {"a0": 20, "a1": 20}
    assert ep.get_rewards(1) == {"a0": 2.0, "a1": 2.5}
    assert ep.get_actions() == {"a0": [10, 20, 30], "a1": [10, 20]}
    assert ep.get_actions(slice(1, 3)) == {"a0": [20, 30], "a1": [20]}
    assert ep.get_actions([0, 1, 2], return_list=True) == [
        {"a0": 10, "a1": 10},
        {"a0": 20, "a1": 20},
        {"a0": 30},
    ]
    filled = ep.get_actions([0, 1, 2], fill=-1)
    assert [int(x) for x in filled["a1"]] == [10, 20, -1]
    # Agent steps: explicit indices reach the hanging value one past the end.
    assert ep.get_actions(env_steps=False) == {"a0": [10, 20, 30], "a1": [10]}
    assert ep.get_actions([-1], env_steps=False) == {"a0": [30], "a1": [20]}
    assert ep.get_actions(1, env_steps=False) == {"a0": 20, "a1": 20}
    assert ep.get_rewards([0, 1], env_steps=False) == {"a0": [1.0, 2.0], "a1": [1.0, 2.5]}


@pytest.mark.parametrize("indices", [[0, 5], [5], 5, [-5]])
def test_multi_agent_getters_out_of_range_agent_step_raises(indices):
    ep = _episode_with_a_hanging_action()
    with pytest.raises(IndexError, match=r"Index -?5 is out of range"):
        ep.get_actions(indices, env_steps=False)
    with pytest.raises(IndexError, match=r"Index -?5 is out of range"):
        ep.get_rewards(indices, env_steps=False)
    with pytest.raises(IndexError, match=r"Index -?5 is out of range"):
        ep.get_extra_model_outputs("x", indices, env_steps=False)


# -- gym_env_vectorize_mode="vector_entry_point" -------------------------------------------------
def test_vector_entry_point_mode_builds_gymnasiums_vector_env():
    import gymnasium as gym

    from envrunners.algorithms.ppo import PPOConfig
    from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner

    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(
            num_envs_per_env_runner=3, gym_env_vectorize_mode=gym.VectorizeMode.VECTOR_ENTRY_POINT
        )
    )
    runner = SingleAgentEnvRunner(config=config)
    try:
        assert type(runner.env.unwrapped).__name__ == "CartPoleVectorEnv"
        assert runner.env.num_envs == 3
        episodes = runner.sample(num_timesteps=30, random_actions=True)
        assert sum(len(e) for e in episodes) >= 30
    finally:
        runner.stop()


@pytest.mark.parametrize("finalized", [False, True])
def test_lookback_buffer_slice_wholly_outside_with_fill_gives_fill_values(finalized):
    # RLlib's own unit test cases (buffer.get(slice(-10, -12), fill=0.0), slice(100, 98), ...).
    import gymnasium as gym

    from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

    buf = InfiniteLookbackBuffer(data=[0, 1, 2, 3, 4, 5], lookback=3, space=gym.spaces.Discrete(6))
    if finalized:
        buf.finalize()
    for bounds, neg in [
        ((-10, -12), False),
        ((-10, -12), True),
        ((100, 98), False),
        ((100, 98), True),
    ]:
        got = buf.get(slice(*bounds), fill=7, neg_index_as_lookback=neg)
        assert [int(x) for x in got] == [7, 7]
    got = buf.get(slice(-9, -4, -1), fill=7, neg_index_as_lookback=True)
    assert [int(x) for x in got] == [7] * 5
    hot = buf.get(slice(100, 98), fill=0, one_hot_discrete=True)
    assert np.asarray(hot).shape == (2, 6) and not np.asarray(hot).any()
    # Without fill such a slice is empty, as before.
    assert len(buf.get(slice(100, 98))) == 0


@pytest.mark.parametrize(
    ("builder", "kwargs", "message"),
    [
        (
            "framework",
            {"torch_compile_learner": True},
            "torch_compile_learner=True is not supported",
        ),
        ("framework", {"torch_compile_worker": True}, "torch.compile is not applied"),
        ("framework", {"torch_ddp_kwargs": {"find_unused_parameters": True}}, "DistributedData"),
        ("learners", {"num_aggregator_actors_per_learner": 2}, "no aggregator actors"),
        ("env_runners", {"use_env_runner_state_server": True}, "without a server"),
        ("training", {"learner_connector": print}, "no learner pipeline"),
        ("resources", {"_fake_gpus": True}, "no fake-GPU mode"),
        ("training", {"grad_clip": 1.0, "grad_clip_by": "value"}, "grad_clip_by='value'"),
    ],
)
def test_keys_envrunners_has_no_code_for_are_refused_by_validate(builder, kwargs, message):
    from envrunners.algorithms.ppo import PPOConfig

    config = getattr(PPOConfig().environment("CartPole-v1"), builder)(**kwargs)  # stored
    with pytest.raises(errors.ConfigError, match=message):
        config.validate()


def test_default_values_of_unsupported_keys_pass_validate_and_round_trip():
    from envrunners.algorithms.ppo import PPOConfig

    config = PPOConfig().environment("CartPole-v1").training(grad_clip=1.0)
    config.validate()
    PPOConfig.from_dict(config.to_dict()).validate()
