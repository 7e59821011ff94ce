"""envrunners.rllib: our single-agent runner inside RLlib 2.60's own algorithms (issue 19).

Real RLlib, real Ray, real envs. Without a working ``ray[rllib]`` (the shared
interpreter ships RLlib's source without its packages) only the import-error and
import-graph tests run; the rest skip.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

try:
    import envrunners.rllib as er
except ImportError:  # RLlibExtraMissingError: no working ray[rllib] here
    er = None

needs_rllib = pytest.mark.skipif(er is None, reason="needs a working ray[rllib] (extra 'rllib')")
#: Building an RLlib Algorithm starts its runner and learner actors: tens of seconds on a
#: loaded 2-core box, more than the suite's default per-test limit.
algorithm_timeout = pytest.mark.timeout(480)

SRC = Path(__file__).resolve().parents[1] / "src" / "envrunners"


# -- without RLlib -----------------------------------------------------------------------


def test_import_without_rllib_names_the_extra():
    """A missing (or unimportable) RLlib gives RLlibExtraMissingError naming the extra."""
    code = (
        "import sys; sys.modules['ray.rllib'] = None\n"
        "from envrunners.errors import RLlibExtraMissingError\n"
        "try:\n"
        "    import envrunners.rllib\n"
        "except RLlibExtraMissingError as err:\n"
        "    assert isinstance(err, ImportError)\n"
        "    print('ERR', err)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "ERR" in out.stdout, out.stdout + out.stderr
    assert "pip install 'envrunners[rllib]'" in out.stdout


def test_only_envrunners_rllib_imports_ray_rllib():
    """No other envrunners module imports ``ray.rllib`` or ``envrunners.rllib``."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.is_relative_to(SRC / "rllib"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                if name.startswith(("ray.rllib", "envrunners.rllib")):
                    offenders.append(f"{path.relative_to(SRC)}: {name}")
    assert not offenders, offenders


# -- with RLlib --------------------------------------------------------------------------


def _ppo(env="CartPole-v1", *, runners=0, envs=2, batch=256, **training):
    from ray.rllib.algorithms.ppo import PPOConfig

    return (
        PPOConfig()
        .environment(env)
        .env_runners(
            env_runner_cls=er.SingleAgentEnvRunner,
            num_env_runners=runners,
            num_envs_per_env_runner=envs,
        )
        .training(
            train_batch_size_per_learner=batch,
            minibatch_size=training.pop("minibatch_size", 64),
            num_epochs=training.pop("num_epochs", 1),
            **training,
        )
        .debugging(seed=0)
    )


def _runner_infos(algo):
    """(class name, why RLlib's loop is used) of every remote runner."""
    return algo.env_runner_group.foreach_env_runner(
        lambda r: (type(r).__module__, r.uses_rllib_sampling), local_env_runner=False
    )


@needs_rllib
@algorithm_timeout
def test_ppo_cartpole_two_remote_runners_report_env_runner_metrics(ray_session):
    algo = _ppo(runners=2).build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        assert _runner_infos(algo) == [("envrunners.rllib.single_agent_env_runner", None)] * 2
        env_runners = result["env_runners"]
        assert env_runners["num_env_steps_sampled"] >= 256
        assert env_runners["num_env_steps_sampled_lifetime"] >= 512
        for key in ("episode_return_mean", "episode_len_mean", "num_episodes", "sample"):
            assert key in env_runners, sorted(env_runners)
        assert env_runners["episode_return_mean"] > 0
    finally:
        algo.stop()


@needs_rllib
@algorithm_timeout
def test_ppo_cartpole_learns(ray_session):
    """Return >= 150 within 20k env steps (one local runner, 8 sub-envs; ~7k with seed 0)."""
    config = _ppo(envs=8, batch=1000, minibatch_size=100, num_epochs=6, lr=1e-3, vf_loss_coeff=0.01)
    algo = config.build_algo()
    try:
        best = 0.0
        for _ in range(20):
            result = algo.train()
            best = max(best, result["env_runners"].get("episode_return_mean", 0.0))
            if best >= 150:
                break
        assert best >= 150, best
    finally:
        algo.stop()


@needs_rllib
@algorithm_timeout
def test_ppo_lstm_stateless_cartpole(ray_session):
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.examples.envs.classes.stateless_cartpole import StatelessCartPole

    config = _ppo(StatelessCartPole, envs=2, batch=200).rl_module(
        model_config=DefaultModelConfig(use_lstm=True, max_seq_len=10, lstm_cell_size=16)
    )
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        assert result["env_runners"]["num_env_steps_sampled"] >= 200
        runner = algo.env_runner
        assert runner.uses_rllib_sampling is None
        episodes = runner.sample(num_timesteps=40, explore=True)
        state = episodes[0].get_extra_model_outputs(Columns.STATE_OUT)
        assert set(state) == {"h", "c"}
        # One (1, cell) row per step, as RLlib records it (its initial state is (1, cell)).
        assert state["h"].shape == (len(episodes[0]), 1, 16)
    finally:
        algo.stop()


@needs_rllib
@algorithm_timeout
def test_ppo_pong_atari_cnn(ray_session):
    import gymnasium as gym
    from ray import tune
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

    ale_py = pytest.importorskip("ale_py")
    gym.register_envs(ale_py)

    def pong(cfg):
        env = gym.make("ale_py:ALE/Pong-v5", **cfg)
        return wrap_atari_for_new_api_stack(env, dim=64, framestack=4)

    tune.register_env("envrunners-test-pong", pong)
    config = _ppo("envrunners-test-pong", envs=2, batch=64, minibatch_size=32)
    config.environment(env_config={"frameskip": 1, "full_action_space": False})
    algo = config.build_algo()
    try:
        result = algo.train()
        assert result["env_runners"]["num_env_steps_sampled"] >= 64
        assert algo.env_runner.uses_rllib_sampling is None
        assert algo.env_runner.env.single_observation_space.shape == (64, 64, 4)
    finally:
        algo.stop()


@needs_rllib
@algorithm_timeout
def test_dqn_epsilon_follows_the_runners_timestep(ray_session):
    """Exploration gets RLlib's ``t``: epsilon 1 at t=0, 0 past the schedule's end."""
    import torch
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.columns import Columns
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    config = (
        DQNConfig()
        .environment("CartPole-v1")
        .env_runners(env_runner_cls=er.SingleAgentEnvRunner, num_envs_per_env_runner=2)
        .training(
            train_batch_size_per_learner=32,
            num_steps_sampled_before_learning_starts=64,
            epsilon=[(0, 1.0), (1000, 0.0)],
        )
        .reporting(min_sample_timesteps_per_iteration=100)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] >= 200
        runner = algo.env_runner

        def greedy_share(lifetime_steps):
            runner.set_state({NUM_ENV_STEPS_SAMPLED_LIFETIME: lifetime_steps})
            episodes = runner.sample(num_timesteps=100, explore=True)
            obs = np.concatenate([e.get_observations()[:-1] for e in episodes])
            actions = np.concatenate([e.get_actions() for e in episodes])
            with torch.no_grad():
                q = runner.module.compute_q_values({Columns.OBS: torch.from_numpy(obs)})
            q = q["qf_preds"].numpy()
            taken, best = q[np.arange(len(actions)), actions], q.max(axis=1)
            # Greedy up to float32 rounding: the runner acted on batches of 2 rows, this
            # forward runs all rows at once (a near-tie may flip between the two).
            return float(np.mean(taken >= best - 1e-5 * (1.0 + np.abs(best))))

        assert greedy_share(10**6) == 1.0  # epsilon 0: every action greedy
        assert greedy_share(0) < 0.8  # epsilon ~1: about half the actions greedy
    finally:
        algo.stop()


@needs_rllib
@algorithm_timeout
def test_appo_cartpole_async_sampling(ray_session):
    from ray.rllib.algorithms.appo import APPOConfig

    config = (
        APPOConfig()
        .environment("CartPole-v1")
        .env_runners(
            env_runner_cls=er.SingleAgentEnvRunner,
            num_env_runners=2,
            num_envs_per_env_runner=2,
            num_cpus_per_env_runner=0.5,  # APPO's learner actor takes a CPU of the 2
            rollout_fragment_length=25,
        )
        .training(train_batch_size_per_learner=100)
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=100)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        assert _runner_infos(algo) == [("envrunners.rllib.single_agent_env_runner", None)] * 2
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] > 0
    finally:
        algo.stop()


@needs_rllib
@algorithm_timeout
def test_checkpoint_save_and_restore(ray_session, tmp_path):
    from ray.rllib.algorithms.algorithm import Algorithm

    algo = _ppo(runners=1).build_algo()
    try:
        algo.train()
        weights = _learner_weights(algo)
        algo.save_to_path(tmp_path / "ckpt")
    finally:
        algo.stop()
    restored = Algorithm.from_checkpoint(tmp_path / "ckpt")
    try:
        assert restored.config.env_runner_cls is er.SingleAgentEnvRunner
        got = _learner_weights(restored)
        for key, value in weights.items():
            np.testing.assert_allclose(np.asarray(got[key]), np.asarray(value))
        result = restored.train()
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] >= 512
        assert _runner_infos(restored) == [("envrunners.rllib.single_agent_env_runner", None)]
    finally:
        restored.stop()


def _learner_weights(algo):
    """The (local) learner's module weights, as numpy."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    return algo.learner_group._learner.module[DEFAULT_MODULE_ID].get_state(inference_only=True)


@needs_rllib
@algorithm_timeout
def test_killed_runner_is_restored_and_training_continues(ray_session):
    import ray

    config = _ppo(runners=2).fault_tolerance(restart_failed_env_runners=True)
    algo = config.build_algo()
    try:
        algo.train()
        manager = algo.env_runner_group._worker_manager
        victim = manager._actors[manager.actor_ids()[0]]
        ray.kill(victim, no_restart=False)  # a crash: Ray restarts it, RLlib restores it
        # The next iterations notice the dead actor, Ray restarts it (RLlib asks for
        # restarts), RLlib probes it back to healthy and syncs its state.
        for _ in range(15):
            result = algo.train()
            if algo.env_runner_group.num_healthy_remote_workers() == 2:
                break
            time.sleep(2)
        assert algo.env_runner_group.num_healthy_remote_workers() == 2
        assert result["env_runners"]["num_env_steps_sampled"] > 0
        assert _runner_infos(algo) == [("envrunners.rllib.single_agent_env_runner", None)] * 2
    finally:
        algo.stop()


@needs_rllib
def test_custom_env_to_module_connector_still_runs():
    from ray.rllib.connectors.connector_v2 import ConnectorV2

    class CountCalls(ConnectorV2):
        calls = 0

        def __call__(self, *, rl_module, batch, episodes, **kwargs):
            CountCalls.calls += 1
            return batch

    config = _ppo(envs=2).env_runners(
        env_to_module_connector=lambda env, spaces, device: CountCalls()
    )
    runner = er.SingleAgentEnvRunner(config=config)
    try:
        assert "CountCalls" in runner.uses_rllib_sampling
        assert type(runner.env).__name__ == "DictInfoToList"  # RLlib's own env for its loop
        episodes = runner.sample(num_timesteps=20, explore=True)
        assert sum(len(e) for e in episodes) >= 20
        assert CountCalls.calls >= 10
    finally:
        runner.stop()


@needs_rllib
@pytest.mark.parametrize("explore,lstm", [(False, False), (True, False), (True, True)])
def test_same_episodes_as_rllibs_runner(explore, lstm):
    """Same seed and module: our runner's episodes equal RLlib's own runner's."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner as RLlibRunner

    def run(cls):
        config = _ppo(envs=4).env_runners(env_runner_cls=cls)
        if lstm:
            config.rl_module(
                model_config=DefaultModelConfig(use_lstm=True, max_seq_len=10, lstm_cell_size=8)
            )
        runner = cls(config=config)
        try:
            first = runner.sample(num_timesteps=120, explore=explore)
            second = runner.sample(num_timesteps=120, explore=explore)
            metrics = runner.get_metrics()
            return first, second, metrics
        finally:
            runner.stop()

    our_first, our_second, our_metrics = run(er.SingleAgentEnvRunner)
    their_first, their_second, their_metrics = run(RLlibRunner)
    ours, theirs = our_first + our_second, their_first + their_second

    def key(episodes):
        return sorted(
            (
                len(e),
                e.t_started,
                e.is_terminated,
                e.is_truncated,
                e.get_observations().tobytes(),
                e.get_rewards().tobytes(),
                np.asarray(e.get_actions(), np.float64).tobytes(),  # values, not dtype
            )
            for e in episodes
        )

    assert key(ours) == key(theirs)
    for a in ours:  # the extra outputs RLlib's learner connectors read are there
        assert set(a.extra_model_outputs) == {
            Columns.ACTION_DIST_INPUTS,
            Columns.ACTION_LOGP,
            "weights_seq_no",
            *([Columns.STATE_OUT] if lstm else []),
        }
        assert a.is_numpy and len(a.get_extra_model_outputs(Columns.ACTION_LOGP)) == len(a)
    for ours_, theirs_ in zip(sorted(ours, key=_order), sorted(theirs, key=_order)):
        assert len(ours_.observations.data) == len(theirs_.observations.data)  # same lookback
        for column in ours_.extra_model_outputs:
            np.testing.assert_allclose(
                _flat(ours_.extra_model_outputs[column].data),  # lookback included
                _flat(theirs_.extra_model_outputs[column].data),
                rtol=1e-5,
                err_msg=column,
            )
    # Continuation chunks keep their episode's id and the lookback RLlib keeps.
    first_ids = {e.id_ for e in our_first}
    assert any(e.id_ in first_ids and e.t_started > 0 for e in our_second)
    for metric in ("episode_return_mean", "episode_len_mean", "num_episodes"):
        assert _value(our_metrics[metric]) == _value(their_metrics[metric]), metric


@needs_rllib
def test_remote_runner_calls_match_rllibs_runner_for_dqn_epsilon():
    """As one of 2 remote runners between weight syncs (APPO's and DQN's set-up), our
    runner returns RLlib's steps per default-sized ``sample()`` call, the same episode
    chunks, and passes RLlib's ``t`` (its estimate of the global env steps, which DQN's
    epsilon schedule reads) to every exploring forward."""
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner as RLlibRunner
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    def run(cls):
        config = (
            DQNConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=2, num_envs_per_env_runner=3, rollout_fragment_length=5)
            .debugging(seed=0)
        )
        runner = cls(config=config, worker_index=1, num_workers=2)
        ts_seen = []
        forward = runner.module._forward_exploration

        def recording_forward(batch, t, **kwargs):
            ts_seen.append(t)
            return forward(batch, t=t, **kwargs)

        runner.module._forward_exploration = recording_forward
        try:
            steps, chunks, lifetime = [], [], 0
            for _ in range(12):
                episodes = runner.sample()
                steps.append(sum(len(e) for e in episodes))
                chunks += sorted(
                    (e.t_started, len(e), e.is_done, e.get_observations().tobytes())
                    for e in episodes
                )
                # The algorithm's sync: both runners' steps, an odd total on purpose.
                lifetime += 2 * steps[-1] + 1
                runner.set_state({NUM_ENV_STEPS_SAMPLED_LIFETIME: lifetime})
            return steps, chunks, ts_seen
        finally:
            runner.stop()

    our_steps, our_chunks, our_ts = run(er.SingleAgentEnvRunner)
    their_steps, their_chunks, their_ts = run(RLlibRunner)
    assert our_steps == their_steps and min(their_steps) >= 15
    assert our_chunks == their_chunks
    assert our_ts == their_ts and their_ts[-1] > their_ts[0]


@needs_rllib
def test_sampled_episodes_pickle_column_wise_into_rllib_episodes():
    """``sample()``'s list pickles as a few column arrays and comes back as RLlib's episodes."""
    import pickle

    from ray import cloudpickle
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode

    runner = er.SingleAgentEnvRunner(config=_ppo(envs=4))
    try:
        first = runner.sample(num_timesteps=200)
        second = runner.sample(num_timesteps=200)
    finally:
        runner.stop()
    buffers = []
    data = cloudpickle.dumps(first, protocol=5, buffer_callback=buffers.append)
    back = pickle.loads(data, buffers=buffers)
    assert type(back) is list and len(back) == len(first) > 4
    plain: list = []
    cloudpickle.dumps(list(first), protocol=5, buffer_callback=plain.append)
    assert len(buffers) < len(plain) // 2  # one array per column, not a few per episode
    for ours, theirs in zip(first, back):
        assert type(theirs) is RLlibEpisode
        for slot in RLlibEpisode.__slots__:
            a, b = getattr(ours, slot), getattr(theirs, slot)
            if slot in ("observations", "actions", "rewards", "infos"):
                a, b = dict(a.__dict__), dict(b.__dict__)
                np.testing.assert_array_equal(a.pop("data"), b.pop("data"), err_msg=slot)
            elif slot == "extra_model_outputs":
                assert list(a) == list(b)
                for key in a:
                    np.testing.assert_array_equal(a[key].data, b[key].data, err_msg=key)
                    assert a[key].lookback == b[key].lookback
                continue
            assert a == b, slot
        theirs.validate()
    # RLlib's own episode methods on the unpickled episodes.
    continued = {e.id_: e for e in pickle.loads(cloudpickle.dumps(second))}
    ongoing = [e for e in back if not e.is_done and e.id_ in continued]
    assert ongoing
    chunk = ongoing[0]
    chunk.concat_episode(continued[chunk.id_])
    chunk.validate()
    restored = RLlibEpisode.from_state(chunk.get_state())
    np.testing.assert_array_equal(restored.get_observations(), chunk.get_observations())
    ongoing_back = [e for e in back if not e.is_done]
    assert ongoing_back[0].cut().t_started == ongoing_back[0].t


def _order(episode):
    return (episode.get_observations().tobytes(), episode.t_started, len(episode))


def _flat(value):
    if isinstance(value, dict):
        return np.concatenate([np.ravel(v) for _, v in sorted(value.items())])
    return np.ravel(value)


def _value(stat):
    """A reduced metric's value (RLlib's ``Stats`` or a plain number)."""
    return stat.peek() if hasattr(stat, "peek") else stat


@needs_rllib
def test_envpool_id_steps_envpools_pool():
    """An ``"envpool:"`` id (which RLlib's own runner cannot build) steps EnvPool's pool."""
    pytest.importorskip("envpool")
    config = _ppo("envpool:CartPole-v1", envs=4)
    runner = er.SingleAgentEnvRunner(config=config)
    try:
        assert type(runner.env).__name__ == "EnvPoolVectorEnv"
        assert runner.uses_rllib_sampling is None
        episodes = runner.sample(num_timesteps=200, explore=True)
        assert sum(len(e) for e in episodes) >= 200
        assert _value(runner.get_metrics()["episode_return_mean"]) > 0
    finally:
        runner.stop()


@needs_rllib
def test_episodes_to_numpy_false_gives_rllibs_list_episodes():
    """``episodes_to_numpy=False``: list-backed, unfinalized episodes, as RLlib's runner
    returns them (rows equal to its runner's, nested ``state_out`` rows included)."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner as RLlibRunner

    def run(cls):
        config = _ppo(envs=2).env_runners(env_runner_cls=cls, episodes_to_numpy=False)
        config.rl_module(
            model_config=DefaultModelConfig(use_lstm=True, max_seq_len=10, lstm_cell_size=4)
        )
        runner = cls(config=config)
        try:
            return runner.sample(num_timesteps=40, explore=False) + runner.sample(
                num_timesteps=40, explore=False
            )
        finally:
            runner.stop()

    ours, theirs = run(er.SingleAgentEnvRunner), run(RLlibRunner)
    assert len(ours) == len(theirs)
    assert any(e.t_started > 0 for e in ours)  # continuation chunks (with lookback) too
    for a, b in zip(sorted(ours, key=_list_order), sorted(theirs, key=_list_order)):
        assert not a.is_numpy and (a.t_started, len(a), a.is_done) == (
            b.t_started,
            len(b),
            b.is_done,
        )
        columns = [("observations", a.observations, b.observations)]
        columns += [(n, getattr(a, n), getattr(b, n)) for n in ("actions", "rewards", "infos")]
        assert set(a.extra_model_outputs) == set(b.extra_model_outputs)
        columns += [(k, v, b.extra_model_outputs[k]) for k, v in a.extra_model_outputs.items()]
        for name, mine, ref in columns:
            assert type(mine.data) is list and not mine.finalized, name
            assert (len(mine.data), mine.lookback) == (len(ref.data), ref.lookback), name
            if name != "infos":
                np.testing.assert_allclose(
                    [_flat(x) for x in mine.data], [_flat(x) for x in ref.data], rtol=1e-5
                )
        a.validate()
        a.to_numpy()  # what RLlib's learner connectors do with them
        assert a.is_numpy and len(a.get_observations()) == len(a) + 1


def _list_order(episode):
    return (np.asarray(episode.observations.data).tobytes(), episode.t_started, len(episode))
