"""W1: one local SingleAgentEnvRunner on CartPole-v1, default module, explore=True.

``sample(num_timesteps=4000)`` env steps/s at 1, 16 and 128 vector envs.
"""

from __future__ import annotations

from common import api, median_rate

WORKLOAD = "W1"
DEFAULT_NUM_ENVS = (1, 16, 128)


def build_runner(target: str, num_envs: int):
    """A local runner with the default module (PPO's, the same MLP on both targets)."""
    PPOConfig = api(target, "envrunners.algorithms.ppo").PPOConfig
    runner_mod = api(target, "envrunners.env.single_agent_env_runner")
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=num_envs)
    )
    if target == "ray.rllib":
        config = config.api_stack(
            enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True
        )
    return runner_mod.SingleAgentEnvRunner(config=config)


def run(target: str, repeats: int = 5, num_envs_list=DEFAULT_NUM_ENVS, timesteps: int = 4000):
    """Yield one record per vector size."""
    for num_envs in num_envs_list:
        runner = build_runner(target, num_envs)

        def once(runner=runner) -> int:
            episodes = runner.sample(num_timesteps=timesteps, explore=True)
            return sum(len(e) for e in episodes)

        stats = median_rate(once, repeats=repeats)
        runner.stop()
        yield {
            "workload": WORKLOAD,
            "target": target,
            "env": "CartPole-v1",
            "num_envs": num_envs,
            "num_timesteps": timesteps,
            "env_steps_per_s": stats["per_s_median"],
            **{k: v for k, v in stats.items() if k != "per_s_median"},
        }
