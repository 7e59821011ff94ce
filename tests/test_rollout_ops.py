"""synchronous_parallel_sample: counting, concat, metrics, and never an empty batch."""

from __future__ import annotations

import types

import pytest

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.env.env_runner_group import EnvRunnerGroup
from envrunners.errors import ConfigError, EnvRunnerError
from envrunners.execution.rollout_ops import synchronous_parallel_sample


def make_config(n: int) -> AlgorithmConfig:
    return (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment("CartPole-v1")
        .env_runners(num_env_runners=n, num_cpus_per_env_runner=0, rollout_fragment_length=10)
        .debugging(seed=0)
    )


def steps(episodes) -> int:
    return sum(len(e) for e in episodes)


@pytest.fixture(scope="module")
def remote_group(ray_session):
    g = EnvRunnerGroup(config=make_config(2), standby_env_runner=False)
    yield g
    g.stop()


def test_local_only_group():
    with EnvRunnerGroup(config=make_config(0)) as g:
        assert steps(synchronous_parallel_sample(worker_set=g)) >= 10  # one round
        eps = synchronous_parallel_sample(worker_set=g, max_env_steps=35, random_actions=True)
        assert steps(eps) >= 35
        chunks = synchronous_parallel_sample(worker_set=g, max_agent_steps=25, concat=False)
        assert isinstance(chunks[0], list) and steps(sum(chunks, [])) >= 25
        data, metrics = synchronous_parallel_sample(worker_set=g, _return_metrics=True)
        assert steps(data) >= 10 and len(metrics) == 1
        with pytest.raises(ConfigError, match="not both"):
            synchronous_parallel_sample(worker_set=g, max_env_steps=5, max_agent_steps=5)


def test_remote_rounds_reach_the_maximum(remote_group):
    eps = synchronous_parallel_sample(worker_set=remote_group, max_env_steps=55)
    assert 55 <= steps(eps) < 55 + 2 * 10 + 2
    runners = {e.id_ for e in eps}
    assert len(runners) >= 2
    one_round = synchronous_parallel_sample(worker_set=remote_group, concat=False)
    assert len(one_round) == 2  # one chunk per remote runner
    data, metrics = synchronous_parallel_sample(
        worker_set=remote_group, max_env_steps=20, _return_metrics=True, _uses_new_env_runners=True
    )
    assert steps(data) >= 20 and all(isinstance(m, dict) for m in metrics)


class _FakeGroup:
    """Just enough of a group to drive the error paths without Ray."""

    def __init__(self, healthy: int, restart: bool):
        self._healthy = healthy
        self._remote_config = types.SimpleNamespace(
            env_runner_health_probe_timeout_s=0.01,
            restart_failed_env_runners=restart,
            sample_timeout_s=1.5,
        )

    def num_remote_env_runners(self) -> int:
        return 2

    def num_healthy_remote_env_runners(self) -> int:
        return self._healthy

    def healthy_env_runner_ids(self) -> list[int]:
        return [1, 2][: self._healthy]

    def foreach_env_runner(self, *args, **kwargs) -> list:
        return []  # everybody timed out

    def num_env_runners_dropped_lifetime(self) -> int:
        return 2

    def _await_healthy(self, timeout: float) -> bool:
        return False


def test_all_runners_late_is_an_error_not_an_empty_batch():
    with pytest.raises(EnvRunnerError, match=r"No samples returned .* sample_timeout_s=1.5"):
        synchronous_parallel_sample(worker_set=_FakeGroup(healthy=2, restart=True))


def test_no_healthy_runner_left_is_an_error():
    with pytest.raises(EnvRunnerError, match="No healthy remote env runners left"):
        synchronous_parallel_sample(worker_set=_FakeGroup(healthy=0, restart=True))


def test_pickled_results_load_with_gc_paused_and_restored():
    import gc
    import pickle

    from envrunners.execution.rollout_ops import _Pickled

    payload = pickle.dumps([{"a": [1, 2]}] * 3, protocol=5)
    try:
        assert _Pickled(payload).load() == [{"a": [1, 2]}] * 3
        assert gc.isenabled()
        gc.disable()
        _Pickled(payload).load()
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()
