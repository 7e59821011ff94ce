"""MultiAgentEnvRunner: spec §6.4/§18.2 cases, §18.3 parametrised, bad input, properties."""

from __future__ import annotations

from collections import defaultdict

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.envs.multi_agent import (
    BadMultiAgentEnv,
    BufferReusingEnv,
    ScheduleEnv,
    expected_counts,
    make_schedule,
)

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.algorithms.ppo import PPOConfig
from envrunners.core.rl_module.multi_rl_module import MultiRLModule
from envrunners.env.env_runner import EnvRunner
from envrunners.env.multi_agent_env import make_multi_agent
from envrunners.env.multi_agent_env_runner import MultiAgentEnvRunner
from envrunners.env.multi_agent_episode import MultiAgentEpisode
from envrunners.errors import (
    ConfigError,
    EnvCreatorError,
    EnvRunnerError,
    MultiAgentEnvError,
    UnknownPolicyError,
)

MultiAgentCartPole = make_multi_agent("CartPole-v1")


def parity(aid, episode, **kwargs):
    return f"p{aid % 2}"


def ma_config(num_agents=2, num_envs=1, fragment=10, env=MultiAgentCartPole, **ma_kw):
    env_config = {"num_agents": num_agents} if env is MultiAgentCartPole else {}
    ma_kw.setdefault("policies", {"p0", "p1"})
    ma_kw.setdefault("policy_mapping_fn", parity)
    return (
        PPOConfig()
        .environment(env, env_config=env_config)
        .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=fragment)
        .multi_agent(**ma_kw)
        .debugging(seed=0)
    )


def total(episodes):
    return sum(len(e) for e in episodes)


@pytest.fixture(params=[1, 3], ids=["1env", "3envs"])
def runner(request):
    r = MultiAgentEnvRunner(config=ma_config(num_envs=request.param))
    yield r
    r.stop()


# -- spec §6.4 / §18.2 ---------------------------------------------------------------
class TestSpecCases:
    def test_sample_timesteps(self):
        r = MultiAgentEnvRunner(ma_config())
        assert isinstance(r, EnvRunner) and isinstance(r.module, MultiRLModule)
        assert total(r.sample(num_timesteps=10)) == 10
        eps = r.sample(num_timesteps=200)
        assert len(eps) >= 2 and eps[0].is_terminated
        assert total(eps) == 200
        assert sum(e.env_t for e in eps) == 210
        for e in eps:
            assert isinstance(e, MultiAgentEpisode)
            for sa in e.agent_episodes.values():
                n = len(sa.get_actions())
                assert len(sa.get_extra_model_outputs("action_logp")) == n
                assert len(sa.get_extra_model_outputs("action_dist_inputs")) == n

    def test_sample_episodes(self):
        r = MultiAgentEnvRunner(ma_config())
        eps = r.sample(num_episodes=5)
        assert len(eps) == 5 and all(e.is_terminated for e in eps)

    @pytest.mark.parametrize("order", ["timesteps_first", "episodes_first"])
    def test_mixing_modes_resets(self, order):
        r = MultiAgentEnvRunner(ma_config())
        calls = [{"num_timesteps": 10}, {"num_episodes": 1}]
        if order == "episodes_first":
            calls.reverse()
        eps = [e for kw in calls for e in r.sample(**kw)]
        assert all(e.env_t_started == 0 for e in eps)

    def test_counting_by_agent_steps(self):
        config = ma_config(
            num_agents=4, num_envs=4, fragment=20, policies={"p0"},
            policy_mapping_fn=lambda aid, ep, **kw: "p0", count_steps_by="agent_steps",
        )  # fmt: skip
        eps = MultiAgentEnvRunner(config).sample()
        assert len(eps) == 4 and all(e.agent_steps() == 20 for e in eps)

    def test_not_multi_agent_raises(self):
        config = AlgorithmConfig().environment("CartPole-v1")
        with pytest.raises(ValueError, match="not multi-agent"):
            MultiAgentEnvRunner(config)


# -- spec §18.3, parametrised for multi-agent ------------------------------------------
class TestSampling:
    def test_num_episodes(self, runner):
        eps = runner.sample(num_episodes=3)
        assert len(eps) == 3 and all(e.is_done and e.env_t_started == 0 for e in eps)

    def test_num_timesteps_bounds(self, runner):
        for _ in range(3):
            assert 20 <= total(runner.sample(num_timesteps=20)) <= 20 + runner.num_envs

    def test_default_fragment(self, runner):
        n = runner.num_envs
        assert n * 10 <= total(runner.sample()) <= n * 10 + n

    def test_force_reset(self, runner):
        runner.sample(num_timesteps=7)
        eps = runner.sample(num_timesteps=7, force_reset=True)
        assert all(e.env_t_started == 0 for e in eps)
        eps = runner.sample(num_episodes=2, force_reset=True)
        assert len(eps) == 2 and all(e.env_t_started == 0 for e in eps)

    def test_zero_and_bad_counts(self, runner):
        assert runner.sample(num_timesteps=0) == []
        assert runner.sample(num_episodes=0) == []
        with pytest.raises(AssertionError, match="Both provided"):
            runner.sample(num_timesteps=1, num_episodes=1)
        with pytest.raises(AssertionError):
            runner.sample(num_timesteps=-1)
        with pytest.raises(AssertionError):
            runner.sample(num_episodes=-1)

    def test_finished_first_and_random_actions(self, runner):
        eps = runner.sample(num_timesteps=100, random_actions=True)
        flags = [e.is_done for e in eps]
        assert flags == sorted(flags, reverse=True)
        assert all(
            "action_logp" not in sa.extra_model_outputs
            for e in eps
            for sa in e.agent_episodes.values()
        )


class TestContinuation:
    def test_ids_continue(self, runner):
        first = runner.sample(num_timesteps=5)
        open_ids = {e.id_ for e in first if not e.is_done}
        second = runner.sample(num_timesteps=5)
        continued = {e.id_ for e in second if e.env_t_started > 0}
        assert continued and continued <= open_ids
        by_id = {e.id_: e for e in first}
        for e in second:
            if e.env_t_started > 0:
                assert e.env_t_started == by_id[e.id_].env_t

    def test_force_reset_and_episode_mode_break_continuity(self, runner):
        first = runner.sample(num_timesteps=5)
        forced = runner.sample(num_timesteps=5, force_reset=True)
        assert all(e.env_t_started == 0 for e in forced)
        assert not {e.id_ for e in first} & {e.id_ for e in forced}
        a, b = runner.sample(num_episodes=2), runner.sample(num_episodes=2)
        assert all(e.env_t_started == 0 for e in a + b)
        assert not {e.id_ for e in a} & {e.id_ for e in b}


class TestStateManagement:
    def test_state_roundtrip(self, runner):
        state = runner.get_state()
        assert "rl_module" in state and set(state["rl_module"]) == {"p0", "p1"}
        runner.sample(num_timesteps=5)
        assert "rl_module" in runner.get_state()
        other = MultiAgentEnvRunner(ma_config(num_envs=runner.num_envs).debugging(seed=1))
        other_state = other.get_state()
        assert set(other_state) == set(state)
        w0 = state["rl_module"]["p0"]
        k = next(iter(w0))
        assert not np.allclose(w0[k], other_state["rl_module"]["p0"][k])
        other.set_state(state)
        assert np.allclose(other.get_state()["rl_module"]["p0"][k], w0[k])
        assert set(other.get_state()) == set(state)

    def test_weights_seq_no_gating_and_subsets(self):
        r = MultiAgentEnvRunner(ma_config())
        w = r.get_weights()
        assert set(w) == {"p0", "p1"} and set(r.get_weights(["p1"])) == {"p1"}
        k = next(iter(w["p0"]))
        zeros = {m: {n: np.zeros_like(v) for n, v in sd.items()} for m, sd in w.items()}
        r.set_weights(zeros, weights_seq_no=2)
        assert np.all(r.get_weights()["p0"][k] == 0)
        r.set_weights(w, weights_seq_no=1)  # stale: ignored
        assert np.all(r.get_weights()["p0"][k] == 0)
        r.set_weights(w, weights_seq_no=0)  # 0 always applies
        assert np.allclose(r.get_weights()["p0"][k], w["p0"][k])
        only = r.get_state(components="rl_module/p1")
        assert set(only["rl_module"]) == {"p1"}
        assert "rl_module" not in r.get_state(not_components="rl_module")

    def test_save_restore(self, tmp_path):
        r = MultiAgentEnvRunner(ma_config())
        path = r.save_to_path(str(tmp_path / "ckpt"))
        fresh = MultiAgentEnvRunner.from_checkpoint(path, config=ma_config().debugging(seed=3))
        for m, sd in r.get_weights().items():
            for n, v in sd.items():
                assert np.allclose(fresh.get_weights()[m][n], v)

    def test_spaces_and_policies_to_train(self):
        r = MultiAgentEnvRunner(ma_config(policies_to_train=["p1"]))
        spaces = r.get_spaces()
        assert {"__env__", "__env_single__", "p0", "p1"} <= set(spaces)
        assert spaces["p0"][1] == gym.spaces.Discrete(2)
        assert r.get_policies_to_train() == {"p1"}
        r.assert_healthy()


class CallbackTracker:
    counts: dict = defaultdict(int)
    sample_sizes: list = []

    def on_episode_created(self, **kw):
        self.counts["created"] += 1

    def on_episode_start(self, **kw):
        assert kw["episode"].env_t == 0 and kw["env_runner"] is not None
        self.counts["start"] += 1

    def on_episode_step(self, **kw):
        self.counts["step"] += 1

    def on_episode_end(self, **kw):
        assert kw["episode"].is_done and isinstance(kw["prev_episode_chunks"], list)
        self.counts["end"] += 1

    def on_sample_end(self, **kw):
        self.counts["sample_end"] += 1
        self.sample_sizes.append(len(kw["samples"]))


class TestCallbacks:
    @pytest.fixture(autouse=True)
    def _clear(self):
        CallbackTracker.counts.clear()
        CallbackTracker.sample_sizes.clear()

    @pytest.mark.parametrize("n", [1, 8])
    def test_episode_mode_counts(self, n):
        r = MultiAgentEnvRunner(ma_config().callbacks(CallbackTracker))
        for call in range(1, 4):
            eps = r.sample(num_episodes=n)
            c = CallbackTracker.counts
            assert c["created"] == c["start"] == c["end"] == n * call == len(eps) * call
            assert c["sample_end"] == call and CallbackTracker.sample_sizes[-1] == len(eps)

    def test_timestep_mode_identity(self):
        r = MultiAgentEnvRunner(ma_config(num_envs=2).callbacks(CallbackTracker))
        eps = r.sample(num_timesteps=120)
        done = sum(e.is_done for e in eps)
        c = CallbackTracker.counts
        assert c["created"] == c["start"] == done + 2 and c["end"] == done
        assert c["step"] == total(eps)


class TestMetrics:
    def test_per_agent_and_module_metrics(self):
        sched = make_schedule(3, num_agents=3, length=8)
        config = ma_config(
            env=ScheduleEnv, policies={"even", "odd"},
            policy_mapping_fn=lambda aid, ep, **kw: "even" if int(aid[1:]) % 2 == 0 else "odd",
        ).environment(env_config={"schedule": sched})  # fmt: skip
        r = MultiAgentEnvRunner(config)
        for _ in range(4):
            r.sample(num_timesteps=3)  # chunks: metrics must merge them
        m = r.get_metrics()
        exp = expected_counts(sched)
        assert m["episode_len_mean"] == 8
        assert m["episode_return_mean"] == pytest.approx(sum(v[1] for v in exp.values()))
        for aid, (steps, ret) in exp.items():
            assert m["agent_steps"][aid] == steps
            assert m["agent_episode_returns_mean"][aid] == pytest.approx(ret)
        even = sum(ret for aid, (_, ret) in exp.items() if int(aid[1:]) % 2 == 0)
        assert m["module_episode_returns_mean"]["even"] == pytest.approx(even)
        assert m["num_env_steps_sampled"] == 12 and m["num_episodes"] == 1
        assert set(m["num_module_steps_sampled"]) <= {"even", "odd"}
        assert sum(m["num_agent_steps_sampled"].values()) == sum(
            m["num_module_steps_sampled"].values()
        )


class TestBadInput:
    def test_unknown_module_id(self):
        config = ma_config(policy_mapping_fn=lambda aid, ep, **kw: "p_typo" if aid else "p0")
        r = MultiAgentEnvRunner(config)
        with pytest.raises(UnknownPolicyError, match=r"'p_typo'.*agent 1.*\['p0', 'p1'\].*Fix"):
            r.sample(num_timesteps=3)

    def test_mapping_fn_signature(self):
        with pytest.raises(ConfigError, match="fn\\(agent_id, episode\\)"):
            MultiAgentEnvRunner(ma_config(policy_mapping_fn=lambda a, b, c: "p0"))

    @pytest.mark.parametrize(
        "bug, match",
        [
            ("ghost", r"'ghost'.*known agents: \['a0', 'a1'\]"),
            ("obs_after_done", "already done"),
            ("trunc_no_obs", "truncated .* without a last observation"),
            ("no_all", "__all__"),
        ],
    )
    def test_protocol_errors(self, bug, match):
        config = ma_config(
            env=BadMultiAgentEnv, policies={"p0"}, policy_mapping_fn=lambda a, e, **k: "p0"
        ).environment(env_config={"bug": bug})
        r = MultiAgentEnvRunner(config)
        with pytest.raises(MultiAgentEnvError, match=match):
            r.sample(num_timesteps=4)
        r.stop()

    def test_single_agent_env(self):
        with pytest.raises(EnvCreatorError, match="make_multi_agent"):
            MultiAgentEnvRunner(ma_config().environment("CartPole-v1", env_config={}))

    def test_step_error_and_restart(self):
        config = ma_config(
            env=BadMultiAgentEnv, policies={"p0"}, policy_mapping_fn=lambda a, e, **k: "p0"
        ).environment(env_config={"bug": "raise"})
        with pytest.raises(EnvRunnerError, match="sub-environment 0 raised .*boom"):
            MultiAgentEnvRunner(config).sample(num_timesteps=4)

    @pytest.mark.parametrize("mode", ["sync", "async"])
    def test_failed_sub_env_recreated_others_go_on(self, mode):
        config = ma_config(
            env=BadMultiAgentEnv, num_envs=2, policies={"p0"},
            policy_mapping_fn=lambda a, e, **k: "p0",
        ).environment(env_config={"bug": "raise"})  # fmt: skip
        config = config.fault_tolerance(restart_failed_sub_environments=True)
        BadMultiAgentEnv.raises_left = 1  # one sub-env raises once (in async: one per worker)
        try:
            r = MultiAgentEnvRunner(config.env_runners(gym_env_vectorize_mode=mode))
            eps = r.sample(num_timesteps=10)
            assert 10 <= total(eps) <= 11
            m = r.get_metrics()
            failures = m["num_env_step_failures"]
            assert failures == (1 if mode == "sync" else 2)
            assert m["num_episodes_dropped_lifetime"] == failures
            starts = sorted(e.env_t_started for e in eps)
            assert all(s == 0 for s in starts)
            assert len(eps) == 2  # one chunk per sub-env; the dropped one was never returned
            if mode == "sync":  # sub-env 1 stepped on without interruption
                assert sorted(len(e) for e in eps) == [4, 6]
            r.stop()
        finally:
            BadMultiAgentEnv.raises_left = 10**9

    def test_local_runner_without_env(self):
        spaces = MultiAgentEnvRunner(ma_config()).get_spaces()
        config = ma_config().env_runners(num_env_runners=2)
        local = MultiAgentEnvRunner(config, worker_index=0, spaces=spaces)
        assert local.env is None and set(local.module.keys()) == {"p0", "p1"}
        assert local.get_spaces()["p1"] == spaces["p1"]
        with pytest.raises(ValueError, match="doesn't have an env"):
            local.sample(num_timesteps=1)
        bare = MultiAgentEnvRunner(config, worker_index=0)
        assert bare.module is None
        with pytest.raises(AssertionError, match="env=missing"):
            bare.assert_healthy()

    def test_bad_module_spec(self):
        with pytest.raises(ConfigError, match="RLModuleSpec or a MultiRLModuleSpec"):
            MultiAgentEnvRunner(ma_config().rl_module(rl_module_spec="not a spec"))

    def test_multi_rl_module_spec_per_module(self):
        from envrunners.core.rl_module.multi_rl_module import MultiRLModuleSpec
        from envrunners.core.rl_module.rl_module import RLModuleSpec

        spec = MultiRLModuleSpec(
            rl_module_specs={
                "p0": RLModuleSpec(model_config={"fcnet_hiddens": [8]}),
                "p1": RLModuleSpec(model_config={"fcnet_hiddens": [16]}),
            }
        )
        r = MultiAgentEnvRunner(ma_config().rl_module(rl_module_spec=spec))
        sizes = {m: sd["encoder.layers.0.weight"].shape[0] for m, sd in r.get_weights().items()}
        assert sizes == {"p0": 8, "p1": 16}
        assert total(r.sample(num_timesteps=5)) == 5


class TestAsyncAndFilters:
    def test_async_matches_sync(self):
        out = {}
        for mode in ("sync", "async"):
            r = MultiAgentEnvRunner(ma_config(num_envs=2).env_runners(gym_env_vectorize_mode=mode))
            eps = r.sample(num_timesteps=60)
            out[mode] = [
                np.asarray(sa.get_observations()).tolist()
                for e in eps
                for sa in e.agent_episodes.values()
            ]
            procs = list(getattr(r.env, "processes", []))
            r.stop()
            assert not any(p.is_alive() for p in procs)
        assert out["sync"] == out["async"]

    def test_async_hung_sub_env_is_reported(self):
        config = ma_config(
            env=BadMultiAgentEnv, num_envs=2, policies={"p0"},
            policy_mapping_fn=lambda a, e, **k: "p0",
        ).environment(env_config={"bug": "slow", "sleep": 1.0})  # fmt: skip
        config = config.env_runners(gym_env_vectorize_mode="async", sample_timeout_s=0.2)
        r = MultiAgentEnvRunner(config)
        with pytest.raises(EnvRunnerError, match="sub-environment 0: no answer within"):
            r.sample(num_timesteps=2)
        assert not any(p.is_alive() for p in r.env.processes)
        r.stop()

    def test_mean_std_filter_and_box_actions(self):
        config = ma_config(env=make_multi_agent("Pendulum-v1"), num_envs=2).env_runners(
            observation_filter="MeanStdFilter"
        )
        config = config.environment(env_config={"num_agents": 2})
        r = MultiAgentEnvRunner(config)
        eps = r.sample(num_timesteps=40)
        assert total(eps) == 40
        state = r.get_state(components="env_to_module_connector")
        assert set(state["env_to_module_connector"]) == {"p0", "p1"}
        obs = np.concatenate([np.asarray(sa.get_observations()) for e in eps for sa in
                              e.agent_episodes.values()])  # fmt: skip
        assert np.abs(obs).max() <= 10.0  # filtered (clipped) observations are stored


# -- property-based: random agent-presence schedules through the runner ----------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    num_agents=st.integers(1, 4),
    num_envs=st.integers(1, 3),
    chunks=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    agent_steps=st.booleans(),
    length=st.integers(2, 9),
    p_obs=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
)
def test_schedule_invariants(seed, num_agents, num_envs, chunks, agent_steps, length, p_obs):
    sched = make_schedule(seed, num_agents=num_agents, length=length, p_obs=p_obs)
    config = ma_config(
        env=ScheduleEnv, num_envs=num_envs, policies={"p0", "p1"},
        policy_mapping_fn=lambda aid, ep, **kw: f"p{int(aid[1:]) % 2}",
        count_steps_by="agent_steps" if agent_steps else "env_steps",
    ).environment(env_config={"schedule": sched})  # fmt: skip
    r = MultiAgentEnvRunner(config)
    exp = expected_counts(sched)
    by_id: dict[str, list[MultiAgentEpisode]] = defaultdict(list)
    for n in chunks:
        eps = r.sample(num_timesteps=n)
        m = r.get_metrics()
        assert m["num_env_steps_sampled"] == total(eps)
        received = sum(m.get("num_agent_steps_sampled", {}).values())
        assert received == sum(m.get("num_module_steps_sampled", {}).values())
        if agent_steps:  # observations received count as agent steps
            assert n <= received <= n - 1 + num_envs * num_agents
        else:
            assert n <= total(eps) <= n + num_envs - 1
        for e in eps:
            e.validate()
            if by_id[e.id_]:
                assert e.env_t_started == by_id[e.id_][-1].env_t
            else:
                assert e.env_t_started == 0
            by_id[e.id_].append(e)
            for aid, sa in e.agent_episodes.items():
                assert len(sa) > 0  # zero-length agents are pruned
                ts = [int(o[0]) for o in sa.get_observations()]
                assert ts == sorted(ts) and set(ts) <= set(sched["agents"][aid]["observes"])
    for chunks_of_episode in by_id.values():
        last = chunks_of_episode[-1]
        if not last.is_done:
            continue
        assert last.is_terminated
        assert sum(len(c) for c in chunks_of_episode) == sched["length"]
        for aid, (steps, ret) in exp.items():
            sas = [c.agent_episodes[aid] for c in chunks_of_episode if aid in c.agent_episodes]
            assert sum(len(sa) for sa in sas) == steps
            assert sum(sa.get_return() for sa in sas) == pytest.approx(ret)
            end, spec = sas[-1], sched["agents"][aid]
            assert end.is_truncated == spec["truncate"]
            # the episode-level terminated flag also ends an agent that ends with it
            assert end.is_terminated == (not spec["truncate"] or spec["end"] == sched["length"])
    r.stop()


def test_all_agents_done_without_all_flag_is_an_error():
    sched = {
        "length": 4,
        "agents": {
            "a0": {"join": 0, "end": 1, "observes": [0, 1], "truncate": False},
            "a1": {"join": 2, "end": 4, "observes": [2, 4], "truncate": False},
        },
    }
    config = ma_config(
        env=ScheduleEnv, policies={"p0"}, policy_mapping_fn=lambda a, e, **k: "p0"
    ).environment(env_config={"schedule": sched})
    with pytest.raises(MultiAgentEnvError, match=r"sub-environment 0: every agent .*\['__all__'\]"):
        MultiAgentEnvRunner(config).sample(num_timesteps=4)


def test_under_env_runner_group_with_two_remote_runners(ray_session):
    group_mod = pytest.importorskip("envrunners.env.env_runner_group")
    # a lambda travels by value to the remote runners (a test-module function would not)
    config = ma_config(num_envs=2, policy_mapping_fn=lambda aid, ep, **kw: f"p{aid % 2}")
    group = group_mod.EnvRunnerGroup(config=config.env_runners(num_env_runners=2))
    try:
        local = group.local_env_runner
        assert isinstance(local, MultiAgentEnvRunner) and local.env is None
        assert set(local.module.keys()) == {"p0", "p1"}  # built from the remotes' spaces
        results = group.foreach_env_runner(
            lambda r: r.sample(num_timesteps=20), local_env_runner=False
        )
        assert len(results) == 2
        for eps in results:
            assert all(isinstance(e, MultiAgentEpisode) for e in eps)
            assert 20 <= total(eps) <= 21
        zeros = {m: {k: np.zeros_like(v) for k, v in sd.items()} for m, sd in
                 local.get_weights().items()}  # fmt: skip
        local.set_weights(zeros)
        group.sync_weights()
        remote = group.foreach_env_runner(lambda r: r.get_weights(), local_env_runner=False)
        for weights in remote:
            assert set(weights) == {"p0", "p1"}
            assert all(np.all(v == 0) for sd in weights.values() for v in sd.values())
        metrics = group.foreach_env_runner(lambda r: r.get_metrics(), local_env_runner=False)
        assert all(m["num_env_steps_sampled"] >= 20 for m in metrics)
    finally:
        group.stop()


def test_runner_records_episodes_when_output_is_set(tmp_path):
    from envrunners.offline.episode_writer import read_episodes

    config = ma_config(num_envs=2, fragment=5).offline_data(output=str(tmp_path / "out"))
    r = MultiAgentEnvRunner(config=config)
    sampled = r.sample(num_timesteps=10) + r.sample(num_timesteps=10)
    r.stop()
    read = list(read_episodes(str(tmp_path / "out")))
    assert [e.id_ for e in read] == [e.id_ for e in sampled]
    for a, b in zip(read, sampled):
        assert isinstance(a, MultiAgentEpisode)
        assert a.env_t_started == b.env_t_started and len(a) == len(b)
        assert a.agent_steps() == b.agent_steps()
        assert a.get_return() == pytest.approx(b.get_return())


@pytest.mark.parametrize("kind", ["box", "dict"])
@pytest.mark.parametrize("num_envs", [1, 2])
def test_envs_that_overwrite_their_observation_arrays_keep_every_observation(kind, num_envs):
    """An env may hand out its own arrays and overwrite them in the next step (RLlib's
    vector env deep-copies for this); recorded observations must keep their values."""
    config = (
        AlgorithmConfig()
        .environment(BufferReusingEnv, env_config={"obs_kind": kind, "length": 4})
        .env_runners(num_envs_per_env_runner=num_envs)
        .multi_agent(policies={"p"}, policy_mapping_fn=lambda aid, ep, **kw: "p")
    )
    runner = MultiAgentEnvRunner(config=config)
    # Dict observations have no default module: random actions only.
    for random_actions in (True,) if kind == "dict" else (True, False):
        episodes = runner.sample(num_episodes=num_envs, random_actions=random_actions)
        for episode in episodes:
            for sa in episode.agent_episodes.values():
                obs = sa.get_observations()
                pos = obs["pos"] if kind == "dict" else obs
                np.testing.assert_array_equal(pos[:, 0], np.arange(5, dtype=np.float32))
    runner.stop()


def test_base_config_without_module_samples_random_actions():
    config = (
        AlgorithmConfig()
        .environment(MultiAgentCartPole, env_config={"num_agents": 2})
        .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=parity)
    )
    r = MultiAgentEnvRunner(config)
    try:
        assert r.module is None
        episodes = r.sample(num_timesteps=10)
        assert total(episodes) >= 10
    finally:
        r.stop()
