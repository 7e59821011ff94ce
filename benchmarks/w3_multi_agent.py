"""W3: one local MultiAgentEnvRunner, RLlib's MultiAgentCartPole layout.

4 agents, each its own CartPole-v1 (``make_multi_agent("CartPole-v1")``), mapped
to 2 modules (``p0``/``p1``) by agent index parity; PPO's default module,
explore=True; ``sample(num_timesteps=4000)`` at 1 and 8 vector envs. Reports env
steps/s (the ratio metric) and agent steps/s.
"""

from __future__ import annotations

from common import api, median_rate

WORKLOAD = "W3"
DEFAULT_NUM_ENVS = (1, 8)
NUM_AGENTS = 4


def parity_mapping(agent_id, episode, **kwargs):
    """Agents 0, 2 -> ``p0``; 1, 3 -> ``p1``."""
    return f"p{agent_id % 2}"


def build_runner(target: str, num_envs: int):
    """A local multi-agent runner with two default (PPO) modules."""
    PPOConfig = api(target, "envrunners.algorithms.ppo").PPOConfig
    make_multi_agent = api(target, "envrunners.env.multi_agent_env").make_multi_agent
    runner_mod = api(target, "envrunners.env.multi_agent_env_runner")
    config = (
        PPOConfig()
        .environment(make_multi_agent("CartPole-v1"), env_config={"num_agents": NUM_AGENTS})
        .env_runners(num_env_runners=0, num_envs_per_env_runner=num_envs)
        .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=parity_mapping)
    )
    if target == "ray.rllib":
        config = config.api_stack(
            enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True
        )
    return runner_mod.MultiAgentEnvRunner(config=config)


def run(target: str, repeats: int = 5, num_envs_list=DEFAULT_NUM_ENVS, timesteps: int = 4000):
    """Yield one record per vector size."""
    for num_envs in num_envs_list:
        runner = build_runner(target, num_envs)
        agent_steps = []

        def once(runner=runner, agent_steps=agent_steps) -> int:
            episodes = runner.sample(num_timesteps=timesteps, explore=True)
            agent_steps.append(sum(e.agent_steps() for e in episodes))
            return sum(len(e) for e in episodes)

        stats = median_rate(once, repeats=repeats)
        runner.stop()
        steps_per_env_step = sum(agent_steps) / max(1, timesteps * len(agent_steps))
        yield {
            "workload": WORKLOAD,
            "target": target,
            "env": f"MultiAgentCartPole({NUM_AGENTS} agents, 2 modules)",
            "num_envs": num_envs,
            "num_timesteps": timesteps,
            "env_steps_per_s": stats["per_s_median"],
            "agent_steps_per_s": stats["per_s_median"] * steps_per_env_step,
            **{k: v for k, v in stats.items() if k != "per_s_median"},
        }
