"""ConnectorV2 contract, pipelines, the config hook and the stock pieces, through real runners."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from tests.envs.simple import MarkedEnv

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from envrunners.connectors.connector_v2 import ConnectorV2
from envrunners.connectors.env_to_module import (
    EnvToModulePipeline,
    FlattenObservations,
    FrameStackingEnvToModule,
    MeanStdFilter,
    ObservationPreprocessor,
    PrevActionsPrevRewards,
)
from envrunners.connectors.module_to_env import GetActions, NormalizeAndClipActions
from envrunners.connectors.vector_episodes import VectorEpisodes
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.errors import ConfigError, ConnectorError

# -- small envs ---------------------------------------------------------------------------
NESTED_SPACE = gym.spaces.Dict(
    {
        "a": gym.spaces.Box(-10.0, 10.0, (), np.float32),
        "b": gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Box(-1.0, 1.0, (2, 1))]),
        "c": gym.spaces.MultiDiscrete([2, 3]),
    }
)


class NestedObsEnv(gym.Env):
    """Dict (or Tuple, ``tuple_obs``) observations of mixed leaves; 5-step episodes."""

    def __init__(self, config=None):
        self.tuple_obs = bool((config or {}).get("tuple_obs", False))
        self.observation_space = (
            gym.spaces.Tuple([gym.spaces.Discrete(4), gym.spaces.Box(0.0, 1.0, (3,))])
            if self.tuple_obs
            else NESTED_SPACE
        )
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), 1.0, self.t >= 5, False, {}


def _runner(env=MarkedEnv, num_envs=2, env_config=None, **env_runners):
    config = (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(env, env_config=env_config or {})
        .env_runners(num_envs_per_env_runner=num_envs, **env_runners)
    )
    return SingleAgentEnvRunner(config=config)


# -- the keyword contract -----------------------------------------------------------------
class OnlyBatch(ConnectorV2):
    calls = 0

    def __call__(self, *, batch):
        type(self).calls += 1
        return batch


class BatchAndKwargs(ConnectorV2):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = None

    def __call__(self, *, batch, **kwargs):
        self.seen = dict(kwargs)
        return batch


class BatchAndExplore(ConnectorV2):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.explores = []

    def __call__(self, *, batch, explore):
        self.explores.append(explore)
        return batch


class ReturnsNone(ConnectorV2):
    def __call__(self, *, batch, **kwargs):
        batch["obs"] = batch["obs"] * 1


class TestKeywordContract:
    def test_piece_declaring_only_batch_works(self):
        pipe = ConnectorPipelineV2(connectors=[OnlyBatch()])
        out = pipe(rl_module=None, batch={"obs": 1}, episodes=[], explore=True, shared_data={})
        assert out == {"obs": 1}

    def test_piece_with_kwargs_gets_every_keyword(self):
        piece = BatchAndKwargs()
        pipe = ConnectorPipelineV2(connectors=[piece])
        pipe(rl_module="m", batch={}, episodes=[], explore=False, shared_data={"x": 1}, metrics=7)
        assert piece.seen == {
            "rl_module": "m",
            "episodes": [],
            "explore": False,
            "shared_data": {"x": 1},
            "metrics": 7,
        }

    def test_runner_calls_user_pieces_with_their_keywords(self):
        OnlyBatch.calls = 0
        kw_piece, explore_piece = BatchAndKwargs(), BatchAndExplore()
        r = _runner(env_to_module_connector=lambda env: [OnlyBatch(), kw_piece, explore_piece])
        r.sample(num_timesteps=10)
        assert OnlyBatch.calls > 5
        assert kw_piece.seen["rl_module"] is r.module
        assert kw_piece.seen["metrics"] is r.metrics
        assert isinstance(kw_piece.seen["episodes"], VectorEpisodes)
        assert isinstance(kw_piece.seen["shared_data"], dict)
        assert set(explore_piece.explores) == {True}

    def test_returning_none_names_the_piece(self):
        pipe = ConnectorPipelineV2(connectors=[OnlyBatch(), ReturnsNone()])
        message = (
            "ConnectorV2 ReturnsNone returned None from __call__: a connector must return the "
            "batch (the `batch` argument it was given, changed in place or replaced by a new "
            "dict). Add `return batch` at the end of its __call__."
        )
        with pytest.raises(ConnectorError) as info:
            pipe(batch={"obs": np.zeros((2, 1))})
        assert str(info.value) == message
        r = _runner(env_to_module_connector=lambda env, spaces, device: ReturnsNone())
        with pytest.raises(ConnectorError, match="ConnectorV2 ReturnsNone returned None"):
            r.sample(num_timesteps=4)


# -- pipelines ------------------------------------------------------------------------------
class AddOne(ConnectorV2):
    reads_episodes = False

    def recompute_output_observation_space(self, input_observation_space, input_action_space):
        s = input_observation_space
        return gym.spaces.Box(s.low + 1, s.high + 1, s.shape, s.dtype)

    def __call__(self, *, batch, **kwargs):
        batch["obs"] = batch["obs"] + 1
        return batch


class Double(AddOne):
    def recompute_output_observation_space(self, input_observation_space, input_action_space):
        s = input_observation_space
        return gym.spaces.Box(s.low * 2, s.high * 2, s.shape, s.dtype)

    def __call__(self, *, batch, **kwargs):
        batch["obs"] = batch["obs"] * 2
        return batch


class TestPipeline:
    def test_edit_operations_and_spaces(self):
        space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        pipe = ConnectorPipelineV2(space, gym.spaces.Discrete(2), [AddOne()])
        pipe.append(Double())  # (x + 1) * 2
        assert pipe.observation_space.high[0] == 4.0
        assert pipe(batch={"obs": np.array([1.0])})["obs"][0] == 4.0
        pipe.prepend(Double())  # (2x + 1) * 2
        assert [c.name for c in pipe] == ["Double", "AddOne", "Double"]
        assert len(pipe) == 3
        assert pipe(batch={"obs": np.array([1.0])})["obs"][0] == 6.0
        pipe.insert_after("AddOne", AddOne())
        pipe.insert_before(AddOne, MeanStdFilter(update_stats=False))
        assert [c.name for c in pipe] == ["Double", "MeanStdFilter", "AddOne", "AddOne", "Double"]
        pipe.remove(AddOne)
        pipe.remove("MeanStdFilter")
        assert [c.name for c in pipe] == ["Double", "AddOne", "Double"]
        assert pipe.observation_space.high[0] == 6.0  # (2 * 1 + 1) * 2
        assert pipe[0] is pipe.connectors[0] and pipe["AddOne"] is pipe.connectors[1]
        with pytest.raises(ValueError, match="no connector 'Nope'"):
            pipe.insert_after("Nope", AddOne())
        pipe.remove("Nope")  # a warning only, as in RLlib
        assert len(pipe) == 3

    def test_setting_input_space_recomputes_outputs(self):
        piece = AddOne()
        assert piece.observation_space is None
        piece.input_observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        assert piece.observation_space.high[0] == 2.0
        pipe = ConnectorPipelineV2(connectors=[AddOne(), Double()])
        pipe.input_observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        assert pipe.observation_space.high[0] == 4.0

    def test_state_of_members_and_merge(self):
        space = gym.spaces.Box(-5.0, 5.0, (2,), np.float32)
        pipes = [EnvToModulePipeline(space, None, [AddOne(), MeanStdFilter()]) for _ in range(2)]
        rng = np.random.default_rng(0)
        data = [rng.normal(size=(50, 2)), rng.normal(3.0, 2.0, size=(70, 2))]
        for pipe, x in zip(pipes, data):
            pipe(batch={"obs": x})
        states = [p.get_state() for p in pipes]
        assert set(states[0]) == {"MeanStdFilter"}
        merged = pipes[0].merge_states(states)
        fresh = EnvToModulePipeline(space, None, [AddOne(), MeanStdFilter()])
        fresh.set_state(merged)
        stats = fresh["MeanStdFilter"].filter.running_stats
        both = np.concatenate(data) + 1
        assert stats.n == 120
        np.testing.assert_allclose(stats.mean, both.mean(0), rtol=1e-6)
        np.testing.assert_allclose(stats.std, both.std(0, ddof=1), rtol=1e-6)
        assert fresh.get_state(not_components="MeanStdFilter") == {}


# -- the config hook ------------------------------------------------------------------------
class TestConfigHook:
    def test_three_argument_function_gets_env_spaces_device(self):
        seen = {}

        def make(env, spaces, device):
            seen.update(env=env, spaces=spaces, device=device)
            return [AddOne()]

        r = _runner(env_to_module_connector=make)
        assert seen["env"] is r.env
        assert seen["spaces"]["__env_single__"] == (
            r.env.single_observation_space,
            r.env.single_action_space,
        )
        assert seen["spaces"]["__env__"][0] == r.env.observation_space
        assert str(seen["device"]) == "cpu"
        eps = r.sample(num_timesteps=4)
        assert eps[0].get_observations(0)[0] == 2.0  # the first obs (1) + 1

    def test_one_argument_function_falls_back(self):
        r = _runner(
            env_to_module_connector=lambda env: EnvToModulePipeline(connectors=[Double()]),
            module_to_env_connector=lambda env: BatchAndExplore(),
        )
        eps = r.sample(num_timesteps=4)
        assert eps[0].get_observations(0)[0] == 2.0
        assert [c.name for c in r._module_to_env] == ["BatchAndExplore"]

    def test_bad_return_value(self):
        with pytest.raises(ConfigError, match="must return a ConnectorV2 object or a list"):
            _runner(env_to_module_connector=lambda env, spaces, device: "nope")

    def test_default_module_to_env_pieces_can_be_left_out(self):
        r = _runner(env="Pendulum-v1", num_envs=1)
        assert [c.name for c in r._module_to_env] == ["NormalizeAndClipActions"]
        r = _runner(
            env="Pendulum-v1",
            num_envs=1,
            module_to_env_connector=lambda env, spaces: [BatchAndExplore()],
            add_default_connectors_to_module_to_env_pipeline=False,
        )
        assert [c.name for c in r._module_to_env] == ["BatchAndExplore"]


# -- stock pieces ---------------------------------------------------------------------------
class TestFlattenObservations:
    def test_values_like_rllib(self):
        piece = FlattenObservations(NESTED_SPACE, gym.spaces.Discrete(2))
        obs = {
            "a": np.array([-10.0, 10.0], np.float32),
            "b": (np.array([1, 0]), np.array([[[-1.0], [-1.0]], [[1.0], [1.0]]], np.float32)),
            "c": np.array([[0, 2], [1, 1]]),
        }
        out = piece(batch={"obs": obs})["obs"]
        # RLlib 2.60's FlattenObservations docstring example, both rows.
        np.testing.assert_array_equal(
            out,
            [
                [-10.0, 0.0, 1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 0.0, 1.0],
                [10.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0],
            ],
        )
        assert piece.observation_space == gym.spaces.Box(-np.inf, np.inf, (10,), np.float32)
        drop_a = FlattenObservations(NESTED_SPACE, None, keys_to_remove=["a"])
        np.testing.assert_array_equal(
            drop_a(batch={"obs": obs})["obs"][0], [0.0, 1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
        )

    def test_multi_agent_agent_ids(self):
        space = gym.spaces.Dict({"agent_1": NESTED_SPACE, "agent_2": NESTED_SPACE})
        piece = FlattenObservations(space, None, multi_agent=True, agent_ids=["agent_1"])
        assert piece.observation_space["agent_1"].shape == (10,)
        assert piece.observation_space["agent_2"] == NESTED_SPACE
        obs = {aid: NESTED_SPACE.sample() for aid in ("agent_1", "agent_2")}
        batched = {
            aid: {
                "a": o["a"][None],
                "b": (np.array([o["b"][0]]), o["b"][1][None]),
                "c": o["c"][None],
            }
            for aid, o in obs.items()
        }
        out = piece(batch={"obs": batched})["obs"]
        assert out["agent_1"].shape == (1, 10)
        assert out["agent_2"] is batched["agent_2"]

    @pytest.mark.parametrize("tuple_obs,width", [(False, 10), (True, 7)])
    def test_through_runner(self, tuple_obs, width):
        r = _runner(
            env=NestedObsEnv,
            env_config={"tuple_obs": tuple_obs},
            env_to_module_connector=lambda env, spaces, device: FlattenObservations(),
        )
        flat = gym.spaces.Box(-np.inf, np.inf, (width,), np.float32)
        assert r._env_to_module.observation_space == flat
        assert r.get_spaces()["default_policy"][0] == flat
        assert r.module.observation_space == flat
        eps = r.sample(num_timesteps=20)
        obs = np.concatenate([e.get_observations() for e in eps])
        assert obs.shape[1:] == (width,) and obs.dtype == np.float32
        if tuple_obs:  # one-hot Discrete(4) then the Box(3)
            np.testing.assert_array_equal(obs[:, :4].sum(1), 1.0)


class TestFrameStacking:
    def test_content_and_reset_at_episode_start(self):
        r = _runner(
            num_envs=2,
            env_to_module_connector=lambda env: FrameStackingEnvToModule(num_frames=3),
        )
        assert r.module.observation_space.shape == (3,)
        eps = r.sample(num_episodes=4)
        for ep in eps:
            obs = ep.get_observations()
            base = obs[0][-1] - 1  # 1000 * episode index
            # Oldest frame first; zeros before the episode's first observation.
            expected = [[0, 0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]]
            expected = np.where(np.array(expected) > 0, np.array(expected) + base, 0)
            np.testing.assert_array_equal(obs, expected)

    def test_continues_across_sample_calls_and_autoreset(self):
        r = _runner(
            num_envs=1,
            env_to_module_connector=lambda env: FrameStackingEnvToModule(num_frames=2),
        )
        chunks = [r.sample(num_timesteps=3), r.sample(num_timesteps=3)]
        obs = [o for eps in chunks for e in eps for o in e.get_observations()[1:]]
        obs = [r._env_to_module.observation_space.contains(o) for o in obs]
        assert all(obs)
        second = chunks[1]
        # Chunk 2 holds the end of episode 0 (obs 4, 5) and the start of episode 1.
        finished = [e for e in second if e.is_done][0]
        np.testing.assert_array_equal(finished.get_observations(-1), [4.0, 5.0])
        started = [e for e in second if not e.is_done][0]
        np.testing.assert_array_equal(started.get_observations(0), [0.0, 1001.0])

    @pytest.mark.parametrize("ready_first", [False, True])
    def test_image_frames_match_a_per_sub_env_history(self, ready_first):
        """(H, W, 1) frames, random episode starts (and random ready subsets): each row is
        its own sub-env's last 3 frames, oldest first, zeros before its episode's first."""
        rng = np.random.default_rng(0)
        n, shape = 5, (6, 7, 1)
        piece = FrameStackingEnvToModule(
            gym.spaces.Box(0, 255, shape, np.uint8), None, num_frames=3
        )
        history = [[] for _ in range(n)]
        for step in range(40):
            ids = rng.permutation(n)[: rng.integers(1, n + 1)] if ready_first else np.arange(n)
            obs = rng.integers(1, 255, (len(ids), *shape), dtype=np.uint8)
            starts = np.ones(len(ids), bool) if step == 0 else rng.random(len(ids)) < 0.2
            for j, i in enumerate(ids):
                seen = [] if starts[j] or not history[i] else history[i]
                history[i] = (seen + [obs[j, ..., 0]])[-3:]
            out = piece(
                batch={"obs": obs},
                episodes=VectorEpisodes(
                    obs,
                    starts,
                    np.zeros(len(ids)),
                    np.zeros(len(ids), bool),
                    None,
                    None,
                    ids if ready_first else None,
                    n,
                ),
            )["obs"]
            assert out.shape == (len(ids), 6, 7, 3) and out.dtype == np.uint8
            for j, i in enumerate(ids):
                zeros = [np.zeros((6, 7), np.uint8)] * (3 - len(history[i]))
                np.testing.assert_array_equal(out[j], np.stack(zeros + history[i], axis=-1))

    def test_needs_episode_views(self):
        piece = FrameStackingEnvToModule(gym.spaces.Box(0, 1, (1,)), None, num_frames=2)
        with pytest.raises(ConnectorError, match="needs to know where each sub-env's episode"):
            piece(batch={"obs": np.zeros((2, 1))}, episodes=[])


class TestPrevActionsPrevRewards:
    def test_values(self):
        actions_sent = []

        class Record(ConnectorV2):
            def __call__(self, *, batch, **kwargs):
                actions_sent.append(np.array(batch["actions"]))
                return batch

        r = _runner(
            num_envs=1,
            env_to_module_connector=lambda env: PrevActionsPrevRewards(
                n_prev_actions=2, n_prev_rewards=2
            ),
            module_to_env_connector=lambda env, spaces: Record(),
        )
        space = r.module.observation_space
        assert space["prev_n_actions"].shape == (6,)  # 2 x one-hot Discrete(3)
        assert space["prev_n_rewards"].shape == (2,)
        (ep,) = r.sample(num_episodes=1)
        obs = ep.get_observations()
        acts = np.asarray(ep.get_actions())
        one_hot = np.eye(3, dtype=np.float32)
        for t in range(len(ep) + 1):
            prev_a = [one_hot[acts[t - k]] if t - k >= 0 else np.zeros(3) for k in (2, 1)]
            prev_r = [float(t - k + 1) if t - k >= 0 else 0.0 for k in (2, 1)]
            np.testing.assert_array_equal(obs["prev_n_actions"][t], np.concatenate(prev_a))
            np.testing.assert_array_equal(obs["prev_n_rewards"][t], prev_r)
            assert obs["_orig_obs"][t][0] == t + 1
        np.testing.assert_array_equal(np.concatenate(actions_sent)[: len(acts)], acts)


class TestObservationPreprocessor:
    def test_per_sub_env_preprocess_with_episode_view(self):
        class Scale(ObservationPreprocessor):
            def recompute_output_observation_space(self, in_obs, in_act):
                return gym.spaces.Box(0.0, 2e9, (2,), np.float32)

            def preprocess(self, observation, episode):
                return np.array([observation[0] * 2, len(episode)], np.float32)

        r = _runner(num_envs=2, env_to_module_connector=lambda env: Scale())
        (ep, *_) = r.sample(num_episodes=2)
        obs = ep.get_observations()
        np.testing.assert_array_equal(obs[:, 1], np.arange(5))  # len(episode) per step
        np.testing.assert_array_equal(obs[:, 0] % 2000, 2 * np.arange(1, 6))


class TestMeanStdFilterAndActions:
    def test_filter_state_merges_across_runners(self):
        runners = [_runner(observation_filter="MeanStdFilter") for _ in range(2)]
        for i, r in enumerate(runners):
            r.sample(num_timesteps=10 * (i + 1))
        states = [r.get_state(components="env_to_module_connector") for r in runners]
        parts = [s["env_to_module_connector"] for s in states]
        merged = runners[0]._env_to_module.merge_states(parts)
        n = [p["MeanStdFilter"]["running_stats"]["num_pushes"] for p in parts]
        assert n[0] > 0 and n[1] > n[0]
        assert merged["MeanStdFilter"]["running_stats"]["num_pushes"] == sum(n)
        fresh = _runner(observation_filter="MeanStdFilter")
        fresh.set_state({"env_to_module_connector": merged})
        assert fresh._env_to_module["MeanStdFilter"].filter.running_stats.n == sum(n)

    def test_normalize_and_clip_on_pendulum(self):
        """The default piece unsquashes after the user's pieces; without defaults, a user
        NormalizeAndClipActions(clip_actions=True) clips and the episode keeps the raw action."""
        sent = []

        class Recorder(gym.Wrapper):
            def step(self, action):
                sent.append(np.array(action))
                return super().step(action)

        class Scale(ConnectorV2):  # module actions x 3: some leave [-1, 1] and [-2, 2]
            def __call__(self, *, batch, **kwargs):
                batch["actions"] = batch["actions"] * 3.0
                return batch

        def run(**kw):
            sent.clear()
            r = _runner(env=lambda ctx: Recorder(gym.make("Pendulum-v1")), num_envs=1, **kw)
            eps = r.sample(num_timesteps=60)
            stored = np.concatenate([e.get_actions() for e in eps]).astype(np.float64)
            return r, stored[: len(sent)], np.stack(sent)[: len(stored)]

        r, stored, env_actions = run(module_to_env_connector=lambda env, spaces: [Scale()])
        assert [c.name for c in r._module_to_env] == ["Scale", "NormalizeAndClipActions"]
        unsquashed = -2.0 + (np.clip(3.0 * stored, -1, 1) + 1.0) * 2.0
        np.testing.assert_allclose(env_actions, unsquashed, atol=1e-5)
        r, stored, env_actions = run(
            module_to_env_connector=lambda env, spaces: [
                Scale(),
                NormalizeAndClipActions(normalize_actions=False, clip_actions=True),
            ],
            add_default_connectors_to_module_to_env_pipeline=False,
        )
        assert np.abs(3.0 * stored).max() > 2.0  # some actions needed the clip
        np.testing.assert_allclose(env_actions, np.clip(3.0 * stored, -2.0, 2.0), atol=1e-5)

    def test_normalize_and_clip_nested_action_spaces(self):
        """Each Box leaf of a Dict / Tuple action space by its own bounds; others pass."""
        space = gym.spaces.Dict(
            {
                "d": gym.spaces.Discrete(3),
                "b": gym.spaces.Box(0.0, 10.0, (2,), np.float32),
                "t": gym.spaces.Tuple(
                    (gym.spaces.Box(-2.0, 2.0, (1,), np.float64), gym.spaces.Discrete(2))
                ),
            }
        )
        actions = {
            "d": np.array([0, 2]),
            "b": np.array([[-1.0, 0.0], [1.0, 3.0]], np.float32),
            "t": (np.array([[0.5], [-4.0]]), np.array([1, 0])),
        }
        out = NormalizeAndClipActions(None, space)(batch={"actions": actions})
        env = out["actions_for_env"]
        assert out["actions"] is actions  # what episodes record stays the module's
        np.testing.assert_array_equal(env["d"], [0, 2])
        np.testing.assert_allclose(env["b"], [[0.0, 5.0], [10.0, 10.0]])
        assert env["b"].dtype == np.float32 and env["t"][0].dtype == np.float64
        np.testing.assert_allclose(env["t"][0], [[1.0], [-2.0]])
        np.testing.assert_array_equal(env["t"][1], [1, 0])
        clipped = NormalizeAndClipActions(None, space, normalize_actions=False, clip_actions=True)
        env = clipped(batch={"actions": actions})["actions_for_env"]
        np.testing.assert_allclose(env["b"], [[0.0, 0.0], [1.0, 3.0]])
        np.testing.assert_allclose(env["t"][0], [[0.5], [-2.0]])
        assert space.contains(
            {k: (v[1] if k != "t" else (v[0][1], v[1][1])) for k, v in env.items()}
        )
        discrete_only = gym.spaces.Dict({"d": gym.spaces.Discrete(3)})
        out = NormalizeAndClipActions(None, discrete_only)(batch={"actions": {"d": np.ones(2)}})
        assert out["actions_for_env"] is out["actions"]


class TestGetActions:
    def test_samples_from_dist_inputs_only_when_actions_missing(self):
        r = _runner(env="CartPole-v1", num_envs=1)
        logits = np.array([[50.0, -50.0], [-50.0, 50.0]], np.float32)
        out = GetActions()(rl_module=r.module, batch={"action_dist_inputs": logits}, explore=True)
        np.testing.assert_array_equal(out["actions"], [0, 1])
        assert out["action_logp"].shape == (2,)
        kept = GetActions()(rl_module=r.module, batch={"actions": np.array([1, 1])})
        np.testing.assert_array_equal(kept["actions"], [1, 1])


# -- action masking (examples/action_masking.py) ---------------------------------------------
def _action_masking_example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "action_masking.py"
    spec = importlib.util.spec_from_file_location("action_masking_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TestActionMasking:
    @pytest.mark.parametrize("explore", [True, False])
    def test_never_takes_a_masked_action(self, explore):
        example = _action_masking_example()
        r = example.make_runner(num_envs=3)
        assert isinstance(r.module, example.ActionMaskingTorchRLModule)
        eps = r.sample(num_timesteps=1500, explore=explore)  # the env raises on a masked one
        steps = 0
        for ep in eps:
            masks = ep.get_observations()["action_mask"][:-1]
            actions = np.asarray(ep.get_actions())
            assert masks[np.arange(len(actions)), actions].all()
            steps += len(actions)
        assert steps >= 1500

    def test_without_the_mask_the_env_refuses(self):
        example = _action_masking_example()

        class Unmasked(example.ActionMaskingTorchRLModule):
            def _forward(self, batch, **kwargs):
                logits = self.net(batch["obs"]["observations"].float())
                return {"action_dist_inputs": torch.zeros_like(logits)}

        config = (
            AlgorithmConfig()
            .rl_module(rl_module_spec=RLModuleSpec())
            .environment(example.MaskedActionsEnv)
            .env_runners(num_envs_per_env_runner=3)
            .rl_module(rl_module_spec=RLModuleSpec(module_class=Unmasked))
        )
        r = SingleAgentEnvRunner(config=config)
        with pytest.raises(Exception, match="masked action"):
            r.sample(num_timesteps=300)


# -- multi-agent: per-module pipelines ----------------------------------------------------------
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pettingzoo's old env API
def test_multi_agent_runner_flattens_per_module():
    from tests.test_pettingzoo import _config, _import_tictactoe

    from envrunners.env.multi_agent_env_runner import MultiAgentEnvRunner

    tictactoe_v3 = _import_tictactoe()
    kw_pieces = []

    def make(env, spaces, device):
        kw_pieces.append(BatchAndKwargs())
        return [FlattenObservations(), kw_pieces[-1]]

    config = _config(lambda cfg: tictactoe_v3.env(), num_envs=2)
    config.env_runners(env_to_module_connector=make)
    r = MultiAgentEnvRunner(config)
    assert set(r._env_to_module) == {"p1", "p2"}
    for mid in ("p1", "p2"):  # Dict(action_mask 9, observation 3x3x2) -> 27 floats
        flat = gym.spaces.Box(-np.inf, np.inf, (27,), np.float32)
        assert r._env_to_module[mid].observation_space == flat
        assert r.module[mid].observation_space == flat
    eps = r.sample(num_timesteps=20)
    obs = np.concatenate(
        [np.asarray(sa.get_observations()) for e in eps for sa in e.agent_episodes.values()]
    )
    assert obs.shape[1:] == (27,)
    seen = [p.seen for p in kw_pieces if p.seen is not None]
    assert seen and all(s["rl_module"] is r.module and s["episodes"] == [] for s in seen)


def test_pipeline_action_space_setter_reaches_the_pieces():
    piece = NormalizeAndClipActions(normalize_actions=True)
    pipe = ConnectorPipelineV2(connectors=[piece])
    pipe.input_action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    assert piece.input_action_space == pipe.action_space == pipe.input_action_space
    out = pipe(batch={"actions": np.array([[1.0], [-1.0]])})
    np.testing.assert_array_equal(out["actions_for_env"], [[2.0], [-2.0]])
