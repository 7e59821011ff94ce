"""``Algorithm.restore_env_runners`` and ``on_env_runners_recreated``, with a real killed runner.

RLlib brings failed runners back before each training step, times it as
``timers/restore_env_runners`` and fires ``on_env_runners_recreated`` with the
restored indices. Here ``train()`` does the same without waiting for a runner
that is still restarting; ``restore_env_runners()`` called directly waits like RLlib's.
"""

from __future__ import annotations

import sys

import ray
import ray.cloudpickle
from tests.waiting import wait_until

from envrunners.algorithms.ppo import PPOConfig

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECREATED: list[tuple[list[int], bool]] = []


class Recorder:
    """A callbacks class (any class with the hook methods: envrunners has no base class)."""

    def on_env_runners_recreated(
        self, *, algorithm, env_runner_group, env_runner_indices, is_evaluation, **kwargs
    ):
        assert env_runner_group is (
            algorithm.eval_env_runner_group if is_evaluation else algorithm.env_runner_group
        )
        RECREATED.append((list(env_runner_indices), is_evaluation))


def test_train_restores_a_killed_runner_fires_the_callback_and_times_it(ray_session):
    RECREATED.clear()
    functions: list[list[int]] = []
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=0, rollout_fragment_length=32)
        .training(train_batch_size=64, minibatch_size=32, num_epochs=1)
        .fault_tolerance(restart_failed_env_runners=True, delay_between_env_runner_restarts_s=0.0)
        .callbacks(
            Recorder,
            on_env_runners_recreated=lambda env_runner_indices, **kw: functions.append(
                list(env_runner_indices)
            ),
        )
    )
    algo = config.build_algo()
    try:
        result = algo.train()
        assert result["timers"]["restore_env_runners"] >= 0.0
        assert "restore_eval_env_runners" not in result["timers"]  # no evaluation group
        assert algo.restore_env_runners(algo.env_runner_group) == []  # all healthy
        assert RECREATED == [] and functions == []

        group = algo.env_runner_group
        group._recovery.kill_standby()  # no standby: Ray restarts the killed process
        ray.kill(group.remote_workers()[0], no_restart=False)  # runner 1

        def recreated() -> bool:
            algo.train()  # keeps training with the other runner meanwhile
            return bool(RECREATED)

        assert wait_until(recreated, timeout=90, interval=0.0)
        assert RECREATED == [([1], False)]
        assert functions == [[1]]
        assert group.num_healthy_remote_env_runners() == 2
    finally:
        algo.stop()
