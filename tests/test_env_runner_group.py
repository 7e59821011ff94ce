"""EnvRunnerGroup on a real local Ray: calls, ordering, async, weight/state sync, lifecycle."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest
import ray.cloudpickle
from tests.waiting import wait_until

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.env.env_runner import EnvRunner
from envrunners.env.env_runner_group import EnvRunnerGroup
from envrunners.errors import ConfigError
from envrunners.evaluation.worker_set import WorkerSet

# Ray workers cannot import this test module by name: ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def make_config(num_env_runners=2, **env_runners):
    return (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment("CartPole-v1")
        .env_runners(
            num_env_runners=num_env_runners,
            num_cpus_per_env_runner=0,
            rollout_fragment_length=10,
            **env_runners,
        )
        .debugging(seed=0)
    )


def module_weights(runner) -> dict:
    return runner.get_state(components="rl_module")["rl_module"]


def scaled(weights: dict, factor: float) -> dict:
    return {k: np.asarray(v) * 0 + factor for k, v in weights.items()}


@pytest.fixture(scope="module")
def group(ray_session):
    """Two remote runners and a local one (no env), shared by the read-mostly tests."""
    g = EnvRunnerGroup(
        config=make_config(max_requests_in_flight_per_env_runner=1), standby_env_runner=False
    )
    yield g
    g.stop()


class TestCalls:
    def test_local_flag_ids_and_order(self, group):
        index = lambda w: w.worker_index  # noqa: E731
        assert group.foreach_env_runner(index) == [0, 1, 2]
        assert group.foreach_env_runner(index, local_env_runner=False) == [1, 2]
        assert group.foreach_env_runner(index, remote_worker_ids=[2, 1, 2]) == [0, 2, 1, 2]
        assert group.foreach_env_runner("ping") == ["pong"] * 3  # strings are called locally too
        add = lambda w, x: w.worker_index + x  # noqa: E731
        assert group.foreach_env_runner(add, kwargs={"x": 10}) == [10, 11, 12]
        per_call = group.foreach_env_runner(
            add, kwargs=[{"x": 1}, {"x": 2}], local_env_runner=False
        )
        assert per_call == [2, 4]
        assert group.num_healthy_env_runners() == 3 == group.num_healthy_workers()
        assert group.healthy_env_runner_ids() == [1, 2] == group.healthy_worker_ids()
        assert group.num_remote_env_runners() == 2 == group.num_remote_workers()

    def test_return_obj_refs(self, ray_session, group):
        refs = group.foreach_env_runner(
            lambda w: w.worker_index, local_env_runner=False, return_obj_refs=True
        )
        assert all(isinstance(r, ray_session.ObjectRef) for r in refs)
        assert ray_session.get(refs) == [1, 2]
        with pytest.raises(ConfigError, match="Can not return ObjectRef from local worker"):
            group.foreach_env_runner(lambda w: 1, return_obj_refs=True)

    def test_unknown_ids_are_named(self, group):
        with pytest.raises(
            ConfigError, match=r"Unknown env runner id\(s\) \[5\]; known ids: \[1, 2\]"
        ):
            group.foreach_env_runner(lambda w: 1, remote_worker_ids=[1, 5])
        with pytest.raises(ConfigError, match=r"\[9\]"):
            group.sync_weights(to_worker_indices=[9])

    def test_user_error_reaches_caller_and_runner_stays(self, group):
        with pytest.raises(KeyError, match="env runner 2 raised KeyError") as info:
            group.foreach_env_runner(
                lambda w: {}["missing"], remote_worker_ids=[2], local_env_runner=False
            )
        assert "missing" in str(info.value)
        assert group.healthy_env_runner_ids() == [1, 2]
        assert group.num_remote_worker_restarts() == 0

    def test_async_tags_and_in_flight_limit(self, group):
        assert group.foreach_env_runner_async(lambda w: w.worker_index, tag="a") == 2
        assert group.foreach_env_runner_async(lambda w: w.worker_index, tag="a") == 0  # limit 1
        assert group.num_in_flight_async_reqs("a") == 2
        assert group.foreach_env_runner_async(lambda w: -w.worker_index, tag="b") == 2
        got = group.fetch_ready_async_reqs(tags="a", timeout_seconds=None)
        assert sorted(got) == [(1, 1), (2, 2)]
        assert sorted(group.fetch_ready_async_reqs(timeout_seconds=None)) == [(1, -1), (2, -2)]
        assert group.num_in_flight_async_reqs() == 0
        assert group.foreach_env_runner_async_fetch_ready(lambda w: w.sample(), tag="s") == []
        assert wait_until(
            lambda: len(group.foreach_env_runner_async_fetch_ready(lambda w: 1, tag="s")) > 0
        )
        group.fetch_ready_async_reqs(tags="s", timeout_seconds=None)

    def test_get_spaces_and_foreach_env(self, group):
        spaces = group.get_spaces()
        assert spaces["default_policy"][1].n == 2
        names = group.foreach_env(lambda env: type(env.unwrapped).__name__)
        assert names == [[], ["CartPoleEnv"], ["CartPoleEnv"]]  # the local runner has no env
        ctx = group.foreach_env_with_context(lambda env, c: c.worker_index)
        assert ctx == [[], [1], [2]]

    def test_worker_set_is_the_same_class(self, group):
        assert WorkerSet is EnvRunnerGroup
        assert group.local_worker() is group.local_env_runner
        assert len(group.remote_workers()) == 2
        pairs = group.foreach_worker_with_id(lambda i, w: (i, w.worker_index))
        assert pairs == [(0, 0), (1, 1), (2, 2)]
        assert group.foreach_worker(lambda w: w.worker_index, local_env_runner=False) == [1, 2]
        assert group.foreach_worker_async(lambda w: 7) == 2
        assert sorted(group.fetch_ready_async_reqs(timeout_seconds=None)) == [(1, 7), (2, 7)]
        assert group.probe_unhealthy_workers() == []


class TestWeights:
    def test_sync_weights_versions_and_back_to_back(self, group):
        local = group.local_env_runner
        base = module_weights(local)
        # Keep the runners busy so that the first push is still in flight at the second.
        assert group.foreach_env_runner_async(lambda w: time.sleep(0.5), tag="busy") == 2
        local.set_state({"rl_module": scaled(base, 1.0), "weights_seq_no": 5})
        group.sync_weights()
        local.set_state({"rl_module": scaled(base, 2.0), "weights_seq_no": 6})
        group.sync_weights()  # back to back: RLlib drops this one while the first is in flight
        assert group._worker_manager.num_pending_calls("__sync_weights__") == 2  # not dropped
        states = group.foreach_env_runner(
            lambda w: (w.get_state(components="rl_module"), w._weights_seq_no),
            local_env_runner=False,
        )
        for state, seq in states:
            assert seq == 6
            for key, value in state["rl_module"].items():
                np.testing.assert_array_equal(value, base[key] * 0 + 2.0)
        group.fetch_ready_async_reqs(tags="busy", timeout_seconds=None)

    def test_sync_weights_to_some_runners_awaited(self, group):
        local = group.local_env_runner
        base = module_weights(local)
        local.set_state({"rl_module": scaled(base, 3.0), "weights_seq_no": 7})
        group.sync_weights(to_worker_indices=[2], timeout_seconds=None, global_vars={"t": 1})
        seqs = group.foreach_env_runner(lambda w: w._weights_seq_no, local_env_runner=False)
        assert seqs == [6, 7]
        group.sync_weights(timeout_seconds=5.0)
        assert group.foreach_env_runner(lambda w: w._weights_seq_no, local_env_runner=False) == [
            7,
            7,
        ]

    def test_sync_weights_from_a_learner_like_source(self, group):
        class Learner:
            def __init__(self, weights):
                self.weights = weights

            def get_state(self, components=None, inference_only=False):
                return {"rl_module": self.weights, "weights_seq_no": 11}

        base = module_weights(group.local_env_runner)
        group.sync_weights(from_worker_or_learner_group=Learner(scaled(base, 4.0)))
        assert group.local_env_runner._weights_seq_no == 11
        values = group.foreach_env_runner(
            lambda w: float(
                next(iter(w.get_state(components="rl_module")["rl_module"].values())).flat[0]
            )
        )
        assert values == [4.0, 4.0, 4.0]

    def test_sync_weights_after_parameters_are_replaced(self, group):
        """Both ends keep their module's entries between syncs: a replaced parameter (or
        its storage) on the source and on a runner still gets the synced weights."""
        import torch

        local = group.local_env_runner
        base = module_weights(local)
        local.set_state({"rl_module": scaled(base, 1.0), "weights_seq_no": 30})
        group.sync_weights(timeout_seconds=None)  # (entries kept on every runner now)
        name = next(iter(base))
        prefix, _, attr = name.rpartition(".")

        def replace(runner, how):
            owner = runner.module.get_submodule(prefix)
            if how == "parameter":
                param = torch.nn.Parameter(torch.zeros_like(getattr(owner, attr)))
                setattr(owner, attr, param)
            else:
                getattr(owner, attr).data = torch.zeros_like(getattr(owner, attr).data)

        replace(local, "parameter")
        with torch.no_grad():
            getattr(local.module.get_submodule(prefix), attr).fill_(5.0)
        local._weights_seq_no = 31
        group.foreach_env_runner(
            replace, kwargs=[{"how": "parameter"}, {"how": "data"}], local_env_runner=False
        )
        group.sync_weights(timeout_seconds=None)

        def held(runner):  # what torch holds, not what get_state reads
            return float(getattr(runner.module.get_submodule(prefix), attr).detach().flatten()[0])

        assert group.foreach_env_runner(held) == [5.0, 5.0, 5.0]
        assert group.foreach_env_runner(lambda w: w._weights_seq_no) == [31, 31, 31]


class TestStateSync:
    def test_merged_filter_state_and_steps_reach_every_runner(self, ray_session):
        config = make_config(observation_filter="MeanStdFilter")
        with EnvRunnerGroup(config=config, standby_env_runner=False) as g:
            g.foreach_env_runner(lambda w: w.sample(), local_env_runner=False)
            seen = g.foreach_env_runner(
                lambda w: w.get_state(components="env_to_module_connector"), local_env_runner=False
            )
            g.sync_env_runner_states(config=config, env_steps_sampled=123)
            states = g.foreach_env_runner(lambda w: w.get_state(not_components="rl_module"))
            local_state, remote_states = states[0], states[1:]
            assert all(s["num_env_steps_sampled_lifetime"] == 123 for s in states)
            merged = local_state["env_to_module_connector"]
            for s in remote_states:
                assert _plain(s["env_to_module_connector"]) == _plain(merged)
            n_merged = _count_n(merged)
            assert n_merged == sum(_count_n(s["env_to_module_connector"]) for s in seen) > 0
            merged_again = g.get_merged_env_runner_state(
                config=config, rl_module_state={"weights_seq_no": 0}, connector_states=[]
            )
            assert merged_again["weights_seq_no"] == 0
            with pytest.raises(ValueError, match="weights_seq_no"):
                g.get_merged_env_runner_state(config=config, rl_module_state={})


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    return x


def _count_n(state) -> int:
    """The sample count of the (only) MeanStdFilter in a pipeline state."""
    (filter_state,) = state.values()
    return int(filter_state["running_stats"]["num_pushes"])


class TestLifecycle:
    def test_bad_input(self, ray_session):
        with pytest.raises(ConfigError, match="num_env_runners must be >= 0"):
            EnvRunnerGroup(config=make_config(), num_env_runners=-1)
        with pytest.raises(ConfigError, match="num_workers.*deprecated"):
            EnvRunnerGroup(config=make_config(), num_workers=2)

    def test_no_remote_runners_no_ray_objects(self):
        with EnvRunnerGroup(config=make_config(num_env_runners=0)) as g:
            assert g.num_remote_env_runners() == 0 and g._remote_config_obj_ref is None
            assert g.foreach_env_runner(lambda w: w.worker_index) == [0]
            g.sync_weights()
            assert g.local_env_runner.env is not None
            from envrunners.execution.rollout_ops import synchronous_parallel_sample

            eps = synchronous_parallel_sample(worker_set=g, max_env_steps=25)
            assert sum(len(e) for e in eps) >= 25

    def test_add_workers_reset_stop_leave_nothing(self, ray_session):
        import psutil

        from envrunners.utils.actor_manager import actor_state_in_gcs

        g = EnvRunnerGroup(
            config=make_config(num_env_runners=1), local_env_runner=False, standby_env_runner=True
        )
        assert g.local_env_runner is None
        with pytest.raises(TypeError, match="Must provide `from_worker_or_learner_group`"):
            g.sync_weights()
        g.add_workers(1, validate=True)
        assert g.foreach_env_runner(lambda w: (w.worker_index, w.num_workers)) == [(1, 1), (2, 2)]
        old = g.remote_workers()
        g.reset([old[1]])
        assert g.healthy_env_runner_ids() == [3]
        assert wait_until(lambda: actor_state_in_gcs(old[0]) == "DEAD")
        g.add_workers(1)
        assert g.healthy_env_runner_ids() == [3, 4]
        assert g._recovery.standby is not None  # a standby waits
        handles = g.remote_workers() + [g._recovery.standby]
        pids = g.foreach_env_runner(lambda w: os.getpid())
        pids.append(ray_session.get(g._recovery.standby.apply.remote(lambda w: os.getpid())))
        g.stop()
        assert g.num_remote_env_runners() == 0
        assert wait_until(lambda: all(actor_state_in_gcs(h) == "DEAD" for h in handles))
        assert wait_until(lambda: not any(psutil.pid_exists(p) for p in pids))


class PolicyRunner(EnvRunner):
    """The smallest old-stack-like runner: a policy map and no env."""

    def __init__(self, *, config, **kwargs):
        super().__init__(config=config, **kwargs)
        self.policy_map = {"default_policy": "built-in"}
        self.trainable = {"default_policy"}

    def assert_healthy(self):
        pass

    def sample(self, **kwargs):
        return []

    def get_spaces(self):
        return {}

    def add_policy(self, policy_id, policy_cls=None, policy=None, **kwargs):
        self.policy_map[policy_id] = policy if policy is not None else policy_cls.__name__
        if kwargs.get("policies_to_train") is not None:
            self.trainable = set(kwargs["policies_to_train"])

    def foreach_policy(self, func):
        return [func(p, pid) for pid, p in self.policy_map.items()]

    def foreach_policy_to_train(self, func):
        return [func(self.policy_map[pid], pid) for pid in sorted(self.trainable)]

    def is_policy_to_train(self, policy_id, batch=None):
        return policy_id in self.trainable


class Linear:
    pass


def test_any_env_runner_class_and_policy_pass_throughs(ray_session):
    config = (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .env_runners(env_runner_cls=PolicyRunner, num_env_runners=1, num_cpus_per_env_runner=0)
    )
    with EnvRunnerGroup(config=config, standby_env_runner=False) as g:
        assert isinstance(g.local_env_runner, PolicyRunner)
        assert g.foreach_policy(lambda p, pid: pid) == ["default_policy"] * 2
        g.add_policy("p1", policy_cls=Linear, policies_to_train=["p1"])
        assert (
            g.foreach_policy(lambda p, pid: (pid, p))
            == [
                ("default_policy", "built-in"),
                ("p1", "Linear"),
            ]
            * 2
        )
        assert g.foreach_policy_to_train(lambda p, pid: pid) == ["p1", "p1"]
        assert g.is_policy_to_train("p1") and not g.is_policy_to_train("default_policy")
        with pytest.raises(KeyError, match="Policy ID 'p1' already exists"):
            g.add_policy("p1", policy_cls=Linear)
        with pytest.raises(ValueError, match="Only one of `policy_cls` or `policy`"):
            g.add_policy("p2")
        assert g.foreach_env(lambda env: 1) == [[], []]  # runners without envs
    no_local = EnvRunnerGroup(config=config, local_env_runner=False, standby_env_runner=False)
    try:
        with pytest.raises(NotImplementedError, match="needs a local env runner"):
            no_local.is_policy_to_train("default_policy")
    finally:
        no_local.stop()
