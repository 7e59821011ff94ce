"""EnvRunnerGroup with RolloutWorker as its runner class (old API stack), on real Ray actors."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from gymnasium.spaces import Box, Discrete
from tests.envs.old_stack import MockEnv

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.algorithms.pg import PGTorchPolicy
from envrunners.evaluation.rollout_worker import RolloutWorker
from envrunners.utils.filter_manager import FilterManager

SMALL = {"fcnet_hiddens": [8]}


def old_stack_config(**env_runners) -> AlgorithmConfig:
    return (
        AlgorithmConfig()
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .env_runners(
            num_env_runners=2,
            num_cpus_per_env_runner=0,
            rollout_fragment_length=10,
            **env_runners,
        )
        .fault_tolerance(delay_between_env_runner_restarts_s=0.0)
        .rl_module(model_config=SMALL)
    )


@pytest.fixture
def group(ray_session):
    from envrunners.env.env_runner_group import EnvRunnerGroup

    made = []

    def build(**env_runners):
        g = EnvRunnerGroup(
            env_creator=lambda ctx: MockEnv(7),
            default_policy_class=PGTorchPolicy,
            config=old_stack_config(**env_runners),
        )
        made.append(g)
        return g

    yield build
    for g in made:
        g.stop()


def test_group_of_rolloutworkers_samples_adds_policies_and_syncs_weights(group):
    g = group()
    assert isinstance(g.local_env_runner, RolloutWorker)
    counts = g.foreach_env_runner(lambda w: w.sample().count)
    assert counts == [10, 10, 10]
    indices = g.foreach_env_runner(lambda w: w.worker_index)
    assert indices == [0, 1, 2]
    assert g.foreach_policy(lambda p, pid: pid) == ["default_policy"] * 3
    assert g.foreach_policy_to_train(lambda p, pid: pid) == ["default_policy"] * 3
    g.add_policy(
        "p2",
        PGTorchPolicy,
        observation_space=Box(-1e6, 1e6, (1,), np.float32),
        action_space=Discrete(2),
    )
    ids = g.foreach_env_runner(lambda w: sorted(w.policy_map.keys()))
    assert ids == [["default_policy", "p2"]] * 3
    local = g.local_env_runner
    weights = {k: np.full_like(v, 0.25) for k, v in local.get_weights()["default_policy"].items()}
    local.set_weights({"default_policy": weights})
    g.sync_weights(policies=["default_policy"])
    remote = g.foreach_env_runner(
        lambda w: w.get_weights(["default_policy"])["default_policy"], local_env_runner=False
    )
    for w in remote:
        for k, v in weights.items():
            np.testing.assert_array_equal(w[k], v)


def test_group_filters_sync_and_survive_a_restart(group):
    """Pain point P7: a restarted runner gets the merged MeanStdFilter back."""
    import ray

    g = group(observation_filter="MeanStdFilter")
    g.foreach_env_runner(lambda w: w.sample(), local_env_runner=False)
    local = g.local_env_runner
    FilterManager.synchronize(local.filters, g)
    n_local = local.filters["default_policy"].running_stats.n
    assert n_local >= 20  # both remotes' observations were merged
    remote_n = g.foreach_env_runner(
        lambda w: w.filters["default_policy"].running_stats.n, local_env_runner=False
    )
    assert remote_n == [n_local, n_local]

    def probe(w):
        return w.worker_index, os.getpid(), w.filters["default_policy"].running_stats.n

    before = dict((i, pid) for i, pid, _ in g.foreach_env_runner(probe, local_env_runner=False))
    ray.kill(g._worker_manager.actors()[1], no_restart=False)
    deadline = time.monotonic() + 120
    after: list = []
    while time.monotonic() < deadline:
        g.probe_unhealthy_env_runners(timeout_seconds=5)
        after = g.foreach_env_runner(probe, local_env_runner=False)
        if len(after) == 2 and dict((i, p) for i, p, _ in after)[1] != before[1]:
            break
        time.sleep(0.2)
    assert sorted(i for i, _, _ in after) == [1, 2]
    assert dict((i, p) for i, p, _ in after)[1] != before[1]  # really a new process
    assert [n for _, _, n in after] == [n_local, n_local]
