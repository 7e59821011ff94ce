"""RolloutWorker (old API stack): seed examples, spec §18.8 cases, every public method."""

from __future__ import annotations

import os
import random

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces import Box, Discrete
from tests.envs.old_stack import (
    BasicMultiAgent,
    BoxActionEnv,
    MockEnv,
    MockEnv2,
    MockPolicy,
    MultiAgentTrafficGrid,
    OutOfBoundsPolicy,
)

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.algorithms.pg import PGTorchPolicy
from envrunners.algorithms.ppo.ppo_torch_policy import PPOTorchPolicy
from envrunners.errors import ConfigError, UnknownPolicyError
from envrunners.evaluation.metrics import RolloutMetrics
from envrunners.evaluation.rollout_worker import RolloutWorker, get_global_worker
from envrunners.policy.sample_batch import (
    MultiAgentBatch,
    SampleBatch,
    convert_ma_batch_to_sample_batch,
)

SMALL = {"fcnet_hiddens": [16]}


def mock_worker(env_fn=lambda _: MockEnv(10), **env_runners) -> RolloutWorker:
    config = AlgorithmConfig().env_runners(**env_runners)
    return RolloutWorker(env_creator=env_fn, config=config, default_policy_class=MockPolicy)


# -- the seed page's examples, imports changed only -------------------------------------
def test_seed_example_single_agent(capsys):
    worker = RolloutWorker(
        env_creator=lambda _: gym.make("CartPole-v1"), default_policy_class=PPOTorchPolicy
    )
    print(worker.sample())
    out = capsys.readouterr().out
    assert out.startswith("SampleBatch(200:")
    batch = worker.sample()
    for key in ("obs", "actions", "rewards", "terminateds", "truncateds", "new_obs"):
        assert key in batch
    assert get_global_worker() is worker


def test_seed_example_multi_agent():
    worker = RolloutWorker(
        env_creator=lambda _: MultiAgentTrafficGrid(num_cars=25),
        config=AlgorithmConfig().multi_agent(
            policies={
                # Use an ensemble of two policies for car agents
                "car_policy1": (
                    PGTorchPolicy,
                    Box(-1.0, 1.0, (3,), np.float32),
                    Discrete(3),
                    AlgorithmConfig.overrides(gamma=0.99),
                ),
                "car_policy2": (
                    PGTorchPolicy,
                    Box(-1.0, 1.0, (3,), np.float32),
                    Discrete(3),
                    AlgorithmConfig.overrides(gamma=0.95),
                ),
                # Use a single shared policy for all traffic lights
                "traffic_light_policy": (
                    PGTorchPolicy,
                    Box(-1.0, 1.0, (2,), np.float32),
                    Discrete(2),
                    {},
                ),
            },
            policy_mapping_fn=(
                lambda agent_id, episode, **kwargs: (
                    random.choice(["car_policy1", "car_policy2"])
                    if agent_id.startswith("car_")
                    else "traffic_light_policy"
                )
            ),
        ),
    )
    batch = worker.sample()
    print(batch)
    assert isinstance(batch, MultiAgentBatch)
    assert set(batch.policy_batches) == {"car_policy1", "car_policy2", "traffic_light_policy"}
    assert batch.env_steps() == 200
    assert len(batch.policy_batches["traffic_light_policy"]) == 2 * 200
    cars = len(batch.policy_batches["car_policy1"]) + len(batch.policy_batches["car_policy2"])
    assert cars == 25 * 200
    assert worker.get_policy("car_policy2").config["gamma"] == 0.95
    assert worker.get_policy("car_policy1").config["gamma"] == 0.99
    lights = batch.policy_batches["traffic_light_policy"]
    assert set(np.unique(lights["agent_index"])) == {25, 26}
    assert "advantages" in lights


# -- spec §18.8 ---------------------------------------------------------------------------
def test_basic():
    worker = RolloutWorker(
        env_creator=lambda _: gym.make("CartPole-v1"),
        config=AlgorithmConfig().env_runners(rollout_fragment_length=200),
        default_policy_class=MockPolicy,
    )
    batch = convert_ma_batch_to_sample_batch(worker.sample())
    for key in ("obs", "actions", "rewards", "terminateds", "advantages", "prev_rewards"):
        assert np.abs(np.mean(batch[key])) > 0, key
    assert "prev_actions" in batch
    assert np.array_equal(batch["dones"], batch["terminateds"])
    rewards, prev_r = batch["rewards"], batch["prev_rewards"]
    actions, prev_a = batch["actions"], batch["prev_actions"]
    first = np.concatenate([[True], batch["eps_id"][1:] != batch["eps_id"][:-1]])
    assert np.all(prev_r[1:][~first[1:]] == rewards[:-1][~first[1:]])
    assert np.all(prev_a[1:][~first[1:]] == actions[:-1][~first[1:]])
    assert np.all(prev_r[first] == 0) and np.all(prev_a[first] == 0)
    assert batch["advantages"][0] > 1


def test_batch_ids():
    # Seeded: with unseeded resets, an episode spanning the whole second fragment
    # (one unroll id) happens now and then under random actions.
    config = AlgorithmConfig().env_runners(rollout_fragment_length=100).debugging(seed=0)
    worker = RolloutWorker(
        env_creator=lambda _: gym.make("CartPole-v1"),
        config=config,
        default_policy_class=MockPolicy,
    )
    b1, b2 = worker.sample(), worker.sample()
    ids1, ids2 = set(b1["unroll_id"]), set(b2["unroll_id"])
    assert not ids1 & ids2
    assert len(ids1) > 1 and len(ids2) > 1
    assert len(set(b1["eps_id"])) > 1


def test_query_evaluators():
    worker = mock_worker(num_envs_per_env_runner=2, rollout_fragment_length=5)
    assert worker.total_rollout_fragment_length == 10
    assert worker.foreach_env(lambda env: 1) == [1, 1]
    contexts = worker.foreach_env_with_context(lambda env, ctx: ctx.vector_index)
    assert contexts == [0, 1]


def test_truncate_episodes():
    batch = mock_worker(rollout_fragment_length=15).sample()
    assert isinstance(batch, SampleBatch)
    assert batch.count == 15


def test_complete_episodes():
    worker = mock_worker(rollout_fragment_length=5, batch_mode="complete_episodes")
    assert worker.sample().count == 10
    worker = mock_worker(rollout_fragment_length=15, batch_mode="complete_episodes")
    batch = worker.sample()
    assert batch.count == 20
    assert batch["t"].tolist() == list(range(10)) * 2
    assert batch["terminateds"].sum() == 2


def test_complete_episodes_packing_vectorized():
    worker = mock_worker(
        lambda _: MockEnv(7),
        rollout_fragment_length=3,
        num_envs_per_env_runner=3,
        batch_mode="complete_episodes",
    )
    batch = worker.sample()
    assert batch.count == 14  # whole episodes until >= 9 steps
    assert batch["t"].tolist() == list(range(7)) * 2


def test_auto_vectorization():
    worker = mock_worker(
        lambda ctx: MockEnv(20, config=ctx), rollout_fragment_length=2, num_envs_per_env_runner=8
    )
    for _ in range(8):
        assert worker.sample().count == 16
    assert len(worker.get_metrics()) == 0
    for _ in range(8):
        assert worker.sample().count == 16
    assert len(worker.get_metrics()) == 8
    indices = worker.foreach_env(lambda env: (env.config.vector_index, env.config.worker_index))
    assert indices == [(i, 0) for i in range(8)]


def test_batches_larger_when_vectorized():
    worker = mock_worker(lambda _: MockEnv(8), rollout_fragment_length=4, num_envs_per_env_runner=4)
    assert worker.sample().count == 16
    assert len(worker.get_metrics()) == 0
    assert worker.sample().count == 16
    assert len(worker.get_metrics()) == 4


def test_multi_env_seed():
    config = AlgorithmConfig().env_runners(num_envs_per_env_runner=3).debugging(seed=1)
    worker = RolloutWorker(
        env_creator=lambda _: MockEnv(10), config=config, default_policy_class=MockPolicy
    )
    worker.sample()
    assert worker.foreach_env(lambda env: env.seeds[0]) == [1, 2, 3]


def test_extra_python_envs():
    config = AlgorithmConfig().python_environment(
        extra_python_environs_for_driver={"env_key_1": "env_value_1", "env_key_2": "env_value_2"}
    )
    RolloutWorker(env_creator=lambda _: MockEnv(10), config=config, default_policy_class=MockPolicy)
    assert os.environ["env_key_1"] == "env_value_1"
    assert os.environ["env_key_2"] == "env_value_2"


@pytest.mark.parametrize(("clip", "expected_max"), [(True, 1.0), (2.0, 2.0), (False, 100.0)])
def test_reward_clipping(clip, expected_max):
    config = (
        AlgorithmConfig()
        .environment(clip_rewards=clip)
        .env_runners(rollout_fragment_length=10, batch_mode="complete_episodes")
    )
    worker = RolloutWorker(
        env_creator=lambda _: MockEnv2(10), config=config, default_policy_class=MockPolicy
    )
    batch = worker.sample()
    assert batch["rewards"].max() == expected_max
    # Metrics report the env's own (unclipped) rewards.
    assert worker.get_metrics()[0].episode_reward == 1000.0


def box_worker(**env) -> tuple[RolloutWorker, BoxActionEnv]:
    made: list[BoxActionEnv] = []

    def creator(_):
        made.append(BoxActionEnv())
        return made[-1]

    config = AlgorithmConfig().environment(**env).env_runners(rollout_fragment_length=5)
    worker = RolloutWorker(
        env_creator=creator, config=config, default_policy_class=OutOfBoundsPolicy
    )
    return worker, made[0]


def test_action_clipping():
    worker, env = box_worker(clip_actions=True, normalize_actions=False)
    batch = worker.sample()
    assert batch["actions"].max() == 5.0 and batch["actions"].min() == -5.0
    assert np.all(np.stack(env.received) <= 1.0) and np.all(np.stack(env.received) >= -2.0)
    worker, _ = box_worker(clip_actions=False, normalize_actions=False)
    with pytest.raises(ValueError, match="Illegal action"):
        worker.sample()


def test_action_normalization():
    worker, env = box_worker(clip_actions=False, normalize_actions=True)
    batch = worker.sample()
    assert batch["actions"].max() == 5.0  # stored in the policy's (normalised) space
    received = np.stack(env.received)
    assert received.min() >= -2.0 and received.max() <= 1.0  # unsquashed for the env


def test_metrics():
    worker = mock_worker(rollout_fragment_length=100, batch_mode="complete_episodes")
    worker.sample()
    metrics = worker.get_metrics()
    assert len(metrics) == 10
    assert all(isinstance(m, RolloutMetrics) for m in metrics)
    assert np.mean([m.episode_reward for m in metrics]) == 10.0
    assert metrics[0].episode_length == 10
    assert metrics[0].agent_rewards == {("default_agent", "default_policy"): 10.0}
    assert worker.get_metrics() == []


def test_multi_agent_two_policies_and_step_counting():
    def config(count_by: str) -> AlgorithmConfig:
        return (
            AlgorithmConfig()
            .multi_agent(
                policies={"p0", "p1"},
                policy_mapping_fn=lambda aid, episode, **kw: f"p{aid % 2}",
                count_steps_by=count_by,
            )
            .env_runners(rollout_fragment_length=301)
            .rl_module(model_config=SMALL)
        )

    worker = RolloutWorker(
        env_creator=lambda _: BasicMultiAgent(4),
        config=config("env_steps"),
        default_policy_class=PGTorchPolicy,
    )
    batch = worker.sample()
    assert batch.env_steps() == 301 and batch.agent_steps() > 301
    assert set(batch.policy_batches) == {"p0", "p1"}
    assert set(np.unique(batch.policy_batches["p0"]["agent_index"])) == {0, 2}
    info = worker.learn_on_batch(batch)
    assert set(info) == {"p0", "p1"}
    worker = RolloutWorker(
        env_creator=lambda _: BasicMultiAgent(4),
        config=config("agent_steps"),
        default_policy_class=PGTorchPolicy,
    )
    batch = worker.sample()
    assert batch.env_steps() < 301 <= batch.agent_steps()


def test_multi_agent_complete_episodes():
    config = (
        AlgorithmConfig()
        .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda aid, ep, **kw: f"p{aid % 2}")
        .env_runners(rollout_fragment_length=30, batch_mode="complete_episodes")
    )
    worker = RolloutWorker(
        env_creator=lambda _: BasicMultiAgent(2), config=config, default_policy_class=MockPolicy
    )
    batch = worker.sample()
    assert batch.env_steps() == 50  # two whole 25-step episodes
    p0 = batch.policy_batches["p0"]
    assert p0["t"].tolist() == list(range(25)) * 2
    assert len(worker.get_metrics()) == 2


# -- bad input ----------------------------------------------------------------------------
def test_unknown_policy_id_names_known_ids():
    worker = mock_worker()
    with pytest.raises(
        UnknownPolicyError,
        match=r"PolicyID 'nope' not found in this PolicyMap! IDs stored in this map: "
        r"\['default_policy'\]",
    ):
        worker.for_policy(lambda p: p, policy_id="nope")
    with pytest.raises(UnknownPolicyError, match="PolicyID 'nope' not found"):
        worker.get_weights(["nope"])
    with pytest.raises(ValueError, match=r"Policy ID 'nope' not in policy map!"):
        worker.remove_policy(policy_id="nope")
    assert worker.get_policy("nope") is None


def test_policy_mapping_fn_returning_unknown_id():
    config = AlgorithmConfig().multi_agent(
        policies={"p0": (MockPolicy, Box(-1, 1, (2,), np.float32), Discrete(2), None)},
        policy_mapping_fn=lambda aid, episode, **kw: "ghost",
    )
    worker = RolloutWorker(env_creator=lambda _: BasicMultiAgent(2), config=config)
    with pytest.raises(
        UnknownPolicyError,
        match=r"policy_mapping_fn returned policy id 'ghost' for agent 0, but this worker's "
        r"policy ids are \['p0'\]",
    ):
        worker.sample()


def test_wrong_policy_spec_tuple():
    with pytest.raises(ConfigError, match="a policy given as a tuple must have 4 items"):
        AlgorithmConfig().multi_agent(policies={"p0": (MockPolicy, None)})
    with pytest.raises(ConfigError, match=r"policies\['p0'\] is a tuple of length 2"):
        RolloutWorker(
            env_creator=lambda _: MockEnv(),
            config={"policies": {"p0": (MockPolicy, None)}},
        )


def test_bad_setup_messages():
    with pytest.raises(ConfigError, match="policy 'default_policy' has no policy class"):
        RolloutWorker(env_creator=lambda _: MockEnv())
    config = AlgorithmConfig().multi_agent(policies={"a", "b"})
    with pytest.raises(ConfigError, match="You are running a multi-agent setup"):
        RolloutWorker(
            env_creator=lambda _: MockEnv(), config=config, default_policy_class=MockPolicy
        )
    worker = mock_worker()
    with pytest.raises(ValueError, match="`policy_mapping_fn` must be a callable!"):
        worker.set_policy_mapping_fn("not callable")
    with pytest.raises(KeyError, match="Policy ID 'default_policy' already exists"):
        worker.add_policy("default_policy", MockPolicy)
    with pytest.raises(ValueError, match="Only one of `policy_cls` or `policy`"):
        worker.add_policy("new", MockPolicy, worker.get_policy())
    with pytest.raises(ValueError, match="RLModule API"):
        worker.add_policy("new", module_spec=object())


def test_no_env_worker():
    config = AlgorithmConfig().env_runners(num_env_runners=2, create_local_env_runner=False)
    spaces = {"default_policy": (Box(-1, 1, (1,), np.float32), Discrete(2))}
    worker = RolloutWorker(
        env_creator=lambda _: MockEnv(),
        config=config,
        spaces=spaces,
        default_policy_class=MockPolicy,
    )
    assert worker.env is None and worker.foreach_env(lambda e: 1) == []
    assert worker.get_metrics() == []
    with pytest.raises(ValueError, match="RolloutWorker has no `input_reader` object!"):
        worker.sample()
    with pytest.raises(AssertionError, match="not healthy"):
        worker.assert_healthy()
    assert set(worker.get_spaces()) == {"default_policy"}


# -- filters --------------------------------------------------------------------------------
def filter_worker(num_envs: int = 1, fragment: int = 25) -> RolloutWorker:
    config = AlgorithmConfig().env_runners(
        observation_filter="MeanStdFilter",
        rollout_fragment_length=fragment,
        num_envs_per_env_runner=num_envs,
    )
    return RolloutWorker(
        env_creator=lambda _: MockEnv(7), config=config, default_policy_class=MockPolicy
    )


def test_mean_std_filter_statistics_match_numpy():
    worker = filter_worker(num_envs=3)
    batch = worker.sample()
    seen = np.concatenate(worker.foreach_env(lambda env: np.asarray(env.obs_log)))
    stats = worker.filters["default_policy"].running_stats
    assert stats.n == len(seen)
    np.testing.assert_allclose(stats.mean, [seen.mean()], rtol=1e-6)
    np.testing.assert_allclose(stats.var, [seen.var(ddof=1)], rtol=1e-5)
    # Observations in the batch are normalised (raw obs are integers 0..7).
    assert np.abs(batch["obs"]).max() < 3.0 and not np.allclose(batch["obs"], batch["obs"].round())


def test_get_and_sync_filters():
    from envrunners.utils.filter import MeanStdFilter

    worker = filter_worker()
    worker.sample()
    snap = worker.get_filters(flush_after=True)["default_policy"]
    assert snap.running_stats.n != 0 and snap.buffer.n != 0
    assert worker.filters["default_policy"].buffer.n == 0  # flushed
    worker.sample()
    later = worker.get_filters()["default_policy"]
    assert later.running_stats.n >= snap.running_stats.n
    other = MeanStdFilter((1,), clip=None)
    for _ in range(100):
        other(np.ones(1))
    other.reset_buffer()
    worker.sync_filters({"default_policy": other})
    assert worker.filters["default_policy"].running_stats.n >= 100
    assert worker.filters["default_policy"].buffer.n <= 20
    with pytest.raises(AssertionError, match="no filter given"):
        worker.sync_filters({})


def test_state_round_trip_keeps_filters_and_weights():
    """Pain point P7: a rebuilt worker restored from get_state() has the same filter."""
    config = (
        AlgorithmConfig()
        .env_runners(observation_filter="MeanStdFilter", rollout_fragment_length=20)
        .rl_module(model_config=SMALL)
    )
    worker = RolloutWorker(
        env_creator=lambda _: MockEnv(7), config=config, default_policy_class=PGTorchPolicy
    )
    worker.sample()
    running_n = worker.filters["default_policy"].running_stats.n
    state = worker.get_state()
    assert set(state) == {
        "policy_ids",
        "policy_states",
        "policy_mapping_fn",
        "is_policy_to_train",
        "filters",
    }
    fresh = RolloutWorker(
        env_creator=lambda _: MockEnv(7), config=config, default_policy_class=PGTorchPolicy
    )
    fresh.set_state(state)
    assert fresh.filters["default_policy"].running_stats.n == running_n
    np.testing.assert_allclose(
        fresh.filters["default_policy"].running_stats.mean,
        worker.filters["default_policy"].running_stats.mean,
    )
    for k, v in worker.get_weights()["default_policy"].items():
        np.testing.assert_array_equal(fresh.get_weights()["default_policy"][k], v)
    # A policy only known from the state is added from its spec.
    worker.add_policy("extra", PGTorchPolicy)
    fresh.set_state(worker.get_state())
    assert "extra" in fresh.policy_map


# -- every other public method --------------------------------------------------------------
def test_policy_management():
    worker = mock_worker()
    added = worker.add_policy(
        "p2",
        MockPolicy,
        observation_space=Box(-1, 1, (1,), np.float32),
        action_space=Discrete(2),
        policies_to_train=["default_policy"],
        policy_mapping_fn=lambda aid, ep, **kw: "default_policy",
    )
    assert worker.get_policy("p2") is added
    assert worker.get_policies_to_train() == {"default_policy"}
    assert sorted(worker.foreach_policy(lambda p, pid: pid)) == ["default_policy", "p2"]
    assert worker.foreach_policy_to_train(lambda p, pid, x=0: (pid, x), x=1) == [
        ("default_policy", 1)
    ]
    assert worker.for_policy(lambda p, k: (p is added, k), policy_id="p2", k=3) == (True, 3)
    worker.set_is_policy_to_train(lambda pid, batch=None: pid == "p2")
    assert worker.get_policies_to_train() == {"p2"}
    with pytest.raises(ConfigError, match="list/set/tuple"):
        worker.set_is_policy_to_train("p2")
    instance = MockPolicy(Box(-1, 1, (1,), np.float32), Discrete(2), {})
    worker.add_policy("p3", policy=instance, policy_state={"weights": {"w": np.ones(1)}})
    assert worker.get_policy("p3") is instance and instance.weights["w"][0] == 1.0
    worker.remove_policy(policy_id="p2", policies_to_train=["default_policy"])
    assert "p2" not in worker.policy_map and "p2" not in worker.filters
    assert worker.get_policies_to_train() == {"default_policy"}


def test_weights_and_global_vars(caplog):
    worker = mock_worker()
    weights = worker.get_weights()
    assert list(weights) == ["default_policy"]
    worker.set_weights({"default_policy": {"w": np.full(1, 3.0)}}, weights_seq_no=5)
    assert worker.get_weights()["default_policy"]["w"][0] == 3.0
    worker.set_weights({"default_policy": {"w": np.full(1, 4.0)}}, weights_seq_no=5)
    assert worker.get_weights()["default_policy"]["w"][0] == 3.0  # same seq no: skipped
    worker.set_weights({"ghost": {}}, global_vars={"timestep": 77})
    assert "'ghost' is not on this worker" in caplog.text
    assert worker.get_global_vars()["timestep"] == 77
    assert worker.get_policy().global_timestep == 77
    worker.set_global_vars({"timestep": 100, "num_grad_updates_per_policy": {"default_policy": 4}})
    assert worker.get_policy().num_grad_updates == 4
    assert worker.get_global_vars()["num_grad_updates_per_policy"]["default_policy"] == 4


def test_learning_methods():
    worker = mock_worker(rollout_fragment_length=200)
    batch = worker.sample()
    assert worker.learn_on_batch(batch) == {"default_policy": {"learned": 200}}
    ma_info = worker.learn_on_batch(batch.as_multi_agent())
    assert set(ma_info) == {"default_policy"}
    grads, info = worker.compute_gradients(batch, single_agent=True)
    assert info["batch_count"] == 200 and grads[0].tolist() == [1.0]
    grads_ma, info_ma = worker.compute_gradients(batch)
    assert set(grads_ma) == {"default_policy"} and info_ma["batch_count"] == 200
    worker.apply_gradients(grads)
    worker.apply_gradients(grads_ma)
    assert worker.get_weights()["default_policy"]["w"][0] == 2.0
    worker.set_is_policy_to_train([])
    assert worker.learn_on_batch(batch) == {}


def test_sample_and_learn_with_pg():
    config = AlgorithmConfig().env_runners(rollout_fragment_length=50).rl_module(model_config=SMALL)
    worker = RolloutWorker(
        env_creator=lambda _: gym.make("CartPole-v1"),
        config=config,
        default_policy_class=PGTorchPolicy,
    )
    before = worker.get_weights()["default_policy"]
    info, count = worker.sample_and_learn(50, 2, 25, ["advantages"])
    assert count == 50
    assert worker.get_policy().num_grad_updates == 4
    assert "policy_loss" in info["default_policy"]["learner_stats"]
    after = worker.get_weights()["default_policy"]
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    with pytest.raises(AssertionError, match="Batch size possibly out of sync"):
        worker.sample_and_learn(49, 1, 25, [])


def test_par_iter_methods():
    worker = mock_worker(rollout_fragment_length=5)
    worker.par_iter_init([])
    assert worker.par_iter_next().count == 5
    assert len(worker.par_iter_next_batch(0)) == 1
    assert len(worker.par_iter_next_batch(20)) >= 1
    worker.par_iter_init([lambda it: (b.count * 2 for b in it)])
    assert worker.par_iter_next() == 10
    worker.par_iter_init([])
    first = worker.par_iter_slice(2, 0)
    second = worker.par_iter_slice(2, 1)
    assert first["unroll_id"][0] != second["unroll_id"][0]
    assert len(worker.par_iter_slice_batch(2, 0, 0)) == 1


def test_misc_methods():
    worker = mock_worker(num_envs_per_env_runner=2, rollout_fragment_length=10)
    assert worker.ping() == "pong"
    assert worker.apply(lambda w, x: (w is worker, x), 7) == (True, 7)
    worker.lock()
    assert worker._lock.locked()
    worker.unlock()
    assert not worker._lock.locked()
    assert worker.creation_args()["worker_index"] == 0
    assert worker.creation_args()["default_policy_class"] is MockPolicy
    assert isinstance(worker.get_host(), str) and worker.get_host()
    assert isinstance(worker.get_node_ip(), str)
    port = worker.find_free_port()
    assert 0 < port < 65536
    batch, count = worker.sample_with_count()
    assert count == batch.count == 20
    spaces = worker.get_spaces()
    assert set(spaces) == {"default_policy", "__env__"}
    worker.assert_healthy()
    with pytest.raises(NotImplementedError):
        worker.make_env()
    with pytest.raises(ValueError, match="not a TorchPolicy"):
        worker.setup_torch_data_parallel("tcp://127.0.0.1:1", 0, 1, "gloo")
    worker.stop()


# -- distributed data parallel -------------------------------------------------------------
def test_setup_torch_data_parallel_two_workers(ray_session):
    """Two Ray actors join a gloo group; DDP keeps their weights identical while learning."""
    ray = ray_session
    actor_cls = ray.remote(num_cpus=0)(RolloutWorker)

    def make(index: int):
        config = (
            AlgorithmConfig()
            .env_runners(rollout_fragment_length=64, num_cpus_per_env_runner=0)
            .rl_module(model_config=SMALL)
            .debugging(seed=100 * index)
        )
        return actor_cls.remote(
            env_creator=lambda _: gym.make("CartPole-v1"),
            config=config,
            worker_index=index,
            num_workers=2,
            default_policy_class=PGTorchPolicy,
        )

    workers = [make(1), make(2)]
    try:
        w0 = ray.get(workers[0].get_weights.remote(), timeout=120)["default_policy"]
        w1 = ray.get(workers[1].get_weights.remote(), timeout=120)["default_policy"]
        assert any(not np.array_equal(w0[k], w1[k]) for k in w0)  # different seeds
        ip = ray.get(workers[0].get_node_ip.remote())
        port = ray.get(workers[0].find_free_port.remote())
        url = f"tcp://{ip}:{port}"
        ray.get(
            [
                w.setup_torch_data_parallel.remote(url, rank, 2, "gloo")
                for rank, w in enumerate(workers)
            ],
            timeout=120,
        )
        synced = [ray.get(w.get_weights.remote())["default_policy"] for w in workers]
        for k in synced[0]:
            np.testing.assert_array_equal(synced[0][k], synced[1][k])  # DDP broadcast rank 0
        ray.get(
            [w.apply.remote(lambda w: w.learn_on_batch(w.sample())) for w in workers], timeout=120
        )
        after = [ray.get(w.get_weights.remote())["default_policy"] for w in workers]
        for k in after[0]:
            np.testing.assert_allclose(after[0][k], after[1][k], rtol=0, atol=1e-6)
        assert any(not np.array_equal(after[0][k], synced[0][k]) for k in after[0])
        world = ray.get(
            workers[1].for_policy.remote(lambda p: p.distributed_world_size), timeout=60
        )
        assert world == 2
    finally:
        for w in workers:
            ray.kill(w)


def test_output_writer_and_offline_input(tmp_path):
    out_dir = tmp_path / "out"
    config = (
        AlgorithmConfig().env_runners(rollout_fragment_length=10).offline_data(output=str(out_dir))
    )
    writer = RolloutWorker(
        env_creator=lambda _: MockEnv(10), config=config, default_policy_class=MockPolicy
    )
    written = [writer.sample() for _ in range(3)]
    writer.stop()
    assert any(out_dir.iterdir())
    config = (
        AlgorithmConfig()
        .env_runners(rollout_fragment_length=10)
        .offline_data(input_=str(out_dir))
        .environment(observation_space=Box(-1e6, 1e6, (1,), np.float32), action_space=Discrete(2))
    )
    reader = RolloutWorker(
        env_creator=lambda _: MockEnv(10), config=config, default_policy_class=MockPolicy
    )
    batch = reader.sample()
    assert batch.count >= 10
    seen = {tuple(b["eps_id"]) for b in written}
    assert tuple(batch["eps_id"][:10]) in seen


def test_fake_sampler_and_compression():
    config = (
        AlgorithmConfig()
        .env_runners(rollout_fragment_length=10, compress_observations=True)
        .debugging(fake_sampler=True)
    )
    worker = RolloutWorker(
        env_creator=lambda _: MockEnv(10), config=config, default_policy_class=MockPolicy
    )
    first = worker.sample()
    assert worker.sample() is first
    first.decompress_if_needed()
    assert first["obs"].shape == (10, 1)


def test_multi_agent_envs_that_overwrite_their_observation_arrays_keep_every_observation():
    """The old-stack multi-agent path records copies too (see the runner's test)."""
    from tests.envs.multi_agent import BufferReusingEnv

    worker = RolloutWorker(
        env_creator=lambda _: BufferReusingEnv({"length": 4}),
        config=AlgorithmConfig()
        .multi_agent(
            policies={"p": (PGTorchPolicy, Box(0.0, 1000.0, (2,), np.float32), Discrete(2), {})},
            policy_mapping_fn=lambda aid, *args, **kwargs: "p",
        )
        .env_runners(rollout_fragment_length=8, batch_mode="complete_episodes"),
    )
    batch = worker.sample().policy_batches["p"]
    np.testing.assert_array_equal(batch["obs"][:, 0], np.tile(np.arange(4.0), 4))
    np.testing.assert_array_equal(batch["new_obs"][:, 0], np.tile(np.arange(1.0, 5.0), 4))
    worker.stop()
