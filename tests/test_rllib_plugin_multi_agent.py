"""``envrunners.rllib.MultiAgentEnvRunner`` inside RLlib 2.60's own PPO (issue 19, multi-agent).

Real RLlib (skipped unless ``ray[rllib]``'s requirements are installed), real
Ray, RLlib's ``MultiAgentCartPole`` with two agents mapped to two policies. The
import rule (only ``envrunners.rllib`` imports ``ray.rllib``) is checked everywhere.
"""

from __future__ import annotations

import ast
import logging
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

import envrunners

PACKAGE_DIR = Path(envrunners.__file__).parent


def _rllib_extra_missing() -> list[str]:
    """The requirements of ``ray[rllib]`` that are not installed here (empty: usable)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover
        return ["packaging"]
    try:
        requires = metadata.requires("ray") or []
    except metadata.PackageNotFoundError:
        return ["ray"]
    missing = []
    for text in requires:
        req = Requirement(text)
        marker = req.marker
        if marker is None or not marker.evaluate({"extra": "rllib"}):
            continue
        if marker.evaluate({"extra": ""}):
            continue  # a requirement of ray itself
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(req.name)
            continue
        if version not in req.specifier:
            missing.append(f"{req.name}{req.specifier} (installed: {version})")
    return missing


_MISSING = _rllib_extra_missing()
#: Each test trains or builds real RLlib algorithms (seconds on a free machine, minutes on
#: a loaded 2-core box).
pytestmark = pytest.mark.timeout(600)
needs_rllib = pytest.mark.skipif(
    bool(_MISSING), reason=f"ray[rllib] is not usable here (missing: {_MISSING})"
)


# -- the import rule (runs everywhere) --------------------------------------------
def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_only_envrunners_rllib_imports_ray_rllib():
    offenders = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR)
        if rel.parts[0] == "rllib":
            continue
        for name in _imports(path):
            if name == "ray.rllib" or name.startswith(("ray.rllib.", "envrunners.rllib")):
                offenders.append(f"{rel}: {name}")
    assert not offenders, f"only envrunners.rllib may import ray.rllib: {offenders}"


# -- with RLlib -------------------------------------------------------------------
def _config(num_env_runners: int = 0, *, seed: int = 0, ours: bool = True, **training):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    from envrunners.rllib import MultiAgentEnvRunner

    runners = {"num_env_runners": num_env_runners, "num_cpus_per_env_runner": 0.5}
    if ours:
        runners["env_runner_cls"] = MultiAgentEnvRunner
    train = {"train_batch_size_per_learner": 400, "minibatch_size": 200, "num_epochs": 1}
    train.update(training)
    return (
        PPOConfig()
        .environment(MultiAgentCartPole, env_config={"num_agents": 2})
        .multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=lambda aid, episode, **kw: f"p{aid}",
        )
        .env_runners(**runners)
        .training(**train)
        .debugging(seed=seed)
    )


@pytest.fixture(scope="module")
def local_algo(ray_session):
    """PPO with our runner as the only (local) runner; learns, then is checkpointed."""
    if _MISSING:
        pytest.skip(f"ray[rllib] is not usable here (missing: {_MISSING})")
    algo = _config(
        0, lr=3e-3, num_epochs=6, train_batch_size_per_learner=1000, minibatch_size=250
    ).build_algo()
    yield algo
    algo.stop()


@pytest.fixture(scope="module")
def remote_algo(ray_session):
    """PPO with 2 remote runners of ours (restarted by RLlib when they die)."""
    if _MISSING:
        pytest.skip(f"ray[rllib] is not usable here (missing: {_MISSING})")
    config = _config(2).fault_tolerance(
        restart_failed_env_runners=True, num_consecutive_env_runner_failures_tolerance=3
    )
    algo = config.build_algo()
    yield algo
    algo.stop()


_ENV_RUNNER_KEYS = {
    "agent_episode_returns_mean",
    "module_episode_returns_mean",
    "episode_return_mean",
    "episode_len_mean",
    "num_env_steps_sampled",
    "num_agent_steps_sampled",
    "num_module_steps_sampled",
    "num_episodes",
    "sample",
}


def _check_result(result: dict) -> None:
    learners = result["learners"]
    for mid in ("p0", "p1"):
        assert "policy_loss" in learners[mid], sorted(learners[mid])
        assert np.isfinite(learners[mid]["policy_loss"])
    runners = result["env_runners"]
    assert _ENV_RUNNER_KEYS <= set(runners), sorted(_ENV_RUNNER_KEYS - set(runners))
    assert set(runners["module_episode_returns_mean"]) == {"p0", "p1"}
    assert set(runners["agent_episode_returns_mean"]) == {"0", "1"}
    assert set(runners["num_module_steps_sampled"]) == {"p0", "p1"}


@needs_rllib
def test_local_runner_trains_and_learns(local_algo):
    from envrunners.rllib import MultiAgentEnvRunner

    runner = local_algo.env_runner
    assert type(runner) is MultiAgentEnvRunner
    first = local_algo.train()
    _check_result(first)
    assert runner._core_in_use  # our loop ran, not RLlib's
    best = first["env_runners"]["episode_return_mean"]
    for _ in range(7):
        result = local_algo.train()
        best = max(best, result["env_runners"]["episode_return_mean"])
        if best >= 100:
            break
    _check_result(result)
    # Random play returns ~45 (two agents); both policies must have learned.
    assert best >= 100, best
    modules = result["env_runners"]["module_episode_returns_mean"]
    first_modules = first["env_runners"]["module_episode_returns_mean"]
    assert all(modules[m] > first_modules[m] for m in ("p0", "p1")), (first_modules, modules)


@needs_rllib
def test_checkpoint_save_and_restore(local_algo, tmp_path):
    import torch

    path = local_algo.save_to_path(str(tmp_path / "ckpt"))
    saved = local_algo.env_runner.module.get_state()
    restored = _config(
        0, lr=3e-3, num_epochs=6, train_batch_size_per_learner=1000, minibatch_size=250
    ).build_algo()
    try:
        restored.restore_from_path(path)
        state = restored.env_runner.module.get_state()
        assert set(state) == {"p0", "p1"}
        for mid in ("p0", "p1"):
            for key, value in saved[mid].items():
                assert torch.equal(torch.as_tensor(state[mid][key]), torch.as_tensor(value)), key
        _check_result(restored.train())
    finally:
        restored.stop()


@needs_rllib
def test_remote_runners_train(remote_algo):
    for _ in range(2):
        result = remote_algo.train()
    _check_result(result)
    kinds = remote_algo.env_runner_group.foreach_env_runner(
        lambda r: (type(r).__module__, r._core_in_use), local_env_runner=False
    )
    assert kinds == [("envrunners.rllib.multi_agent_env_runner", True)] * 2


@needs_rllib
def test_killed_remote_runner_is_restored(remote_algo):
    import ray

    group = remote_algo.env_runner_group
    actor = group._worker_manager._actors[1]
    ray.kill(actor, no_restart=False)
    # Ray restarts the actor (RLlib sets max_restarts); each train() probes failed runners
    # and brings restarted ones back, with the current weights. Restarting takes as long
    # as building a runner: seconds here, minutes on a loaded box.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        remote_algo.train()
        if group.num_healthy_remote_workers() == 2 and group.num_remote_worker_restarts():
            break
    assert group.num_healthy_remote_workers() == 2
    assert group.num_remote_worker_restarts() >= 1
    _check_result(remote_algo.train())
    alive = group.foreach_env_runner(lambda r: r._core_in_use, local_env_runner=False)
    assert alive == [True, True]


# -- episodes: ours vs RLlib's own runner -----------------------------------------
def _runner_pair(num_envs: int = 2):
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner as RLlibRunner

    from envrunners.rllib import MultiAgentEnvRunner

    config = _config(0, seed=7).env_runners(num_envs_per_env_runner=num_envs)
    theirs = RLlibRunner(config=config)
    ours = MultiAgentEnvRunner(config=config)
    ours.set_state(theirs.get_state())  # same weights: explore=False acts the same
    return ours, theirs


def _same_agent_data(a, b, module_of=lambda aid: f"p{aid}") -> None:
    assert set(a.agent_episodes) == set(b.agent_episodes)
    assert len(a) == len(b) and a.env_t_started == b.env_t_started and a.env_t == b.env_t
    assert a.is_terminated == b.is_terminated and a.is_truncated == b.is_truncated
    for aid, sa in a.agent_episodes.items():
        sb = b.agent_episodes[aid]
        assert sa.module_id == sb.module_id == module_of(aid)
        assert (len(sa), sa.t_started, sa.t) == (len(sb), sb.t_started, sb.t)
        assert sa.observations.lookback == sb.observations.lookback
        np.testing.assert_array_equal(sa.observations.data, sb.observations.data)
        np.testing.assert_array_equal(sa.rewards.data, sb.rewards.data)
        np.testing.assert_array_equal(sa.actions.data, sb.actions.data)
        assert set(sa.extra_model_outputs) == set(sb.extra_model_outputs)
        for key, buf in sa.extra_model_outputs.items():
            _same_values(buf.data, sb.extra_model_outputs[key].data, key)


def _same_values(a, b, key) -> None:
    """Equal arrays (rtol 1e-5), or equal nested dicts of them (``state_out``: h and c)."""
    if isinstance(b, dict):
        assert isinstance(a, dict) and set(a) == set(b), (key, type(a))
        for name in b:
            _same_values(a[name], b[name], f"{key}/{name}")
        return
    np.testing.assert_allclose(a, b, rtol=1e-5, err_msg=key)


def _values(stats):
    """Plain floats from RLlib's reduced metrics (Stats objects, maybe nested in dicts)."""
    if isinstance(stats, dict):
        return {k: _values(v) for k, v in stats.items()}
    return float(stats)


_COUNTS = (
    "num_env_steps_sampled",
    "num_agent_steps_sampled",
    "num_module_steps_sampled",
    "num_episodes",
)
_EPISODE_STATS = (
    "episode_return_mean",
    "episode_len_mean",
    "agent_episode_returns_mean",
    "module_episode_returns_mean",
)


def _same_metrics(mine: dict, ref: dict, keys: tuple) -> None:
    for key in keys:
        assert (key in mine) == (key in ref), key
        if key in ref:
            assert _values(mine[key]) == pytest.approx(_values(ref[key])), key


@needs_rllib
def test_episodes_match_rllib_runner(ray_session):
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

    ours, theirs = _runner_pair()
    try:
        previous_ids = None
        for _ in range(3):  # chunks continue across calls
            mine = ours.sample(num_timesteps=60, explore=False)
            ref = theirs.sample(num_timesteps=60, explore=False)
            assert all(type(e) is MultiAgentEpisode for e in mine)
            assert len(mine) == len(ref)
            for a, b in zip(mine, ref):
                _same_agent_data(a, b)
            if previous_ids is not None:  # the cut chunks' ids continue
                assert previous_ids <= {e.id_ for e in mine}
            previous_ids = {e.id_ for e in mine if not e.is_done}
        _same_metrics(ours.get_metrics(), theirs.get_metrics(), _COUNTS + _EPISODE_STATS)
        done = ours.sample(num_episodes=3, explore=False)
        ref = theirs.sample(num_episodes=3, explore=False)
        assert [len(e) for e in done] == [len(e) for e in ref]
        for a, b in zip(done, ref):
            assert a.is_done
            _same_agent_data(a, b)
        # (Step counts differ here: in the last vector step RLlib also counts the steps
        # of sub-envs whose unfinished episodes it then drops; we do not.)
        _same_metrics(ours.get_metrics(), theirs.get_metrics(), _EPISODE_STATS)
    finally:
        ours.stop()
        theirs.stop()


@needs_rllib
def test_custom_connector_runs_rllib_loop(ray_session, caplog):
    from ray.rllib.connectors.env_to_module import FlattenObservations
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

    from envrunners.rllib import MultiAgentEnvRunner

    config = _config(0).env_runners(
        env_to_module_connector=lambda env, spaces, device: FlattenObservations(multi_agent=True)
    )
    runner = MultiAgentEnvRunner(config=config)
    try:
        with caplog.at_level(logging.INFO, logger="envrunners"):
            first = runner.sample(num_timesteps=20)
            runner.sample(num_timesteps=20)
        notes = [
            r.getMessage() for r in caplog.records if "env_to_module_connector" in r.getMessage()
        ]
        assert len(notes) == 1, notes  # logged once
        assert not runner._core_in_use
        assert "FlattenObservations" in runner.uses_rllib_sampling
        assert first and all(type(e) is MultiAgentEpisode for e in first)
    finally:
        runner.stop()


@needs_rllib
def test_random_actions_agent_steps_and_list_episodes(ray_session):
    from envrunners.rllib import MultiAgentEnvRunner

    config = _config(0).multi_agent(count_steps_by="agent_steps")
    config.env_runners(episodes_to_numpy=False)
    runner = MultiAgentEnvRunner(config=config)
    try:
        episodes = runner.sample(num_timesteps=50, random_actions=True)
        assert runner._core_in_use
        steps = sum(len(sa) for e in episodes for sa in e.agent_episodes.values())
        assert 50 <= steps < 52
        for e in episodes:
            for sa in e.agent_episodes.values():
                assert "action_logp" not in sa.extra_model_outputs  # no module ran
        # With the module, not numpy'd: RLlib's list-based episodes, extra outputs per step.
        episodes = runner.sample(num_timesteps=50)
        for e in episodes:
            assert not e.is_numpy
            e.validate()
            for sa in e.agent_episodes.values():
                extras = sa.extra_model_outputs
                assert {"action_dist_inputs", "action_logp", "weights_seq_no"} <= set(extras)
                assert len(extras["action_logp"]) == len(sa)
                assert isinstance(sa.actions.data, list)
    finally:
        runner.stop()


# -- stateful (LSTM) modules through our loop --------------------------------------
def _lstm(config, cell: int = 8):
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return config.rl_module(
        model_config=DefaultModelConfig(use_lstm=True, max_seq_len=10, lstm_cell_size=cell)
    )


def _tic_tac_toe_config():
    """Turn-based TicTacToe (``player2`` joins at the second step), LSTM modules p0 / p1."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.examples.envs.classes.multi_agent.tic_tac_toe import TicTacToe

    return _lstm(
        PPOConfig()
        .environment(TicTacToe)
        .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=_tic_tac_toe_module)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=2)
        .debugging(seed=3)
    )


def _tic_tac_toe_module(aid, episode=None, **kwargs):
    return "p0" if aid == "player1" else "p1"


def _sample_calls(runner_cls, config, state=None, episodes=2) -> tuple[list, dict]:
    """Three 25-step chunks, then ``episodes`` whole episodes (explore=False), and the
    runner's state.

    Python's ``random`` (TicTacToe's first player) is seeded the same for each runner.
    """
    import random

    saved = random.getstate()
    random.seed(5)
    runner = runner_cls(config=config)
    try:
        if state is not None:
            runner.set_state(state)  # the same weights
        calls = [runner.sample(num_timesteps=25, explore=False) for _ in range(3)]
        if episodes:
            calls.append(runner.sample(num_episodes=episodes, explore=False))
        if runner_cls.__module__.startswith("envrunners"):
            assert runner._core_in_use  # our loop ran, not RLlib's
        return calls, runner.get_state()
    finally:
        runner.stop()
        random.setstate(saved)


@needs_rllib
@pytest.mark.parametrize("env", ["cartpole", "tic_tac_toe"])
def test_lstm_episodes_match_rllib_runner(ray_session, env):
    """Recurrent modules sample through our loop; episodes (``state_out`` included) equal
    RLlib's runner's: state carried across chunks, reset for new episodes and for agents
    that join later, kept for agents that do not act in a step (turn-based)."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner as RLlibRunner

    from envrunners.rllib import MultiAgentEnvRunner

    # (Whole episodes only in TicTacToe: at most 30 steps, CartPole's may last 500.)
    if env == "cartpole":
        config, module_of = _lstm(_config(0, seed=7).env_runners(num_envs_per_env_runner=2)), None
        episodes = 0
    else:
        config, module_of, episodes = _tic_tac_toe_config(), _tic_tac_toe_module, 2
    theirs, state = _sample_calls(RLlibRunner, config, episodes=episodes)
    ours, _ = _sample_calls(MultiAgentEnvRunner, config, state, episodes=episodes)
    continued = False
    for mine, ref in zip(ours, theirs):
        assert len(mine) == len(ref)
        for a, b in zip(mine, ref):
            if module_of is None:
                _same_agent_data(a, b)
            else:
                _same_agent_data(a, b, module_of)
            for sa in a.agent_episodes.values():
                assert Columns.STATE_OUT in sa.extra_model_outputs
                continued |= sa.t_started > 0
    assert continued  # chunks continued an episode (state from the previous call)


@needs_rllib
def test_lstm_ppo_trains_through_our_loop(ray_session):
    algo = _lstm(_config(0, train_batch_size_per_learner=200, minibatch_size=100), 16)
    algo = algo.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
            _check_result(result)
        assert algo.env_runner._core_in_use
        assert algo.env_runner.module["p0"].is_stateful()
        assert algo.env_runner.uses_rllib_sampling is None
    finally:
        algo.stop()


def _cartpole_without_possible_agents(config=None):
    """MultiAgentCartPole that declares its agents only through its per-agent space dicts."""
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    env = MultiAgentCartPole(config)
    env.possible_agents = []
    return env


@needs_rllib
def test_env_without_possible_agents_runs_our_loop(ray_session):
    """Agents known from the env's ``observation_spaces`` / ``action_spaces``: our loop
    runs, with RLlib's runner's episodes."""
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner as RLlibRunner

    from envrunners.rllib import MultiAgentEnvRunner

    config = (
        _config(0, seed=7)
        .environment(_cartpole_without_possible_agents, env_config={"num_agents": 2})
        .env_runners(num_envs_per_env_runner=2)
    )
    theirs = RLlibRunner(config=config)
    ours = MultiAgentEnvRunner(config=config)
    try:
        ours.set_state(theirs.get_state())
        for _ in range(2):
            mine = ours.sample(num_timesteps=40, explore=False)
            ref = theirs.sample(num_timesteps=40, explore=False)
            assert ours._core_in_use and len(mine) == len(ref)
            for a, b in zip(mine, ref):
                _same_agent_data(a, b)
    finally:
        ours.stop()
        theirs.stop()


@needs_rllib
def test_connector_function_adding_no_pieces_runs_our_loop(ray_session, caplog):
    """An ``env_to_module_connector`` that adds no piece leaves RLlib's default pipeline:
    our loop runs (RLlib's loop runs only for pieces that are not RLlib's defaults)."""
    from envrunners.rllib import MultiAgentEnvRunner

    config = _config(0).env_runners(env_to_module_connector=lambda env, spaces, device: [])
    runner = MultiAgentEnvRunner(config=config)
    try:
        with caplog.at_level(logging.INFO, logger="envrunners"):
            assert runner.sample(num_timesteps=20)
        assert runner._core_in_use
        assert runner.uses_rllib_sampling is None
        assert not [r for r in caplog.records if "RLlib's own sampling loop" in r.getMessage()]
    finally:
        runner.stop()
