"""W1: one local SingleAgentEnvRunner on CartPole-v1, default module, explore=True.

``sample(num_timesteps=4000)`` env steps/s at 1, 16 and 128 vector envs, on the
default backend; for envrunners also on the EnvPool backend (``"envpool:CartPole-v1"``,
``overlap_inference="auto"``) at 16 and 128 envs when ``envpool`` is installed
(variant ``envpool``; ``run.py --target both`` compares it with RLlib's default
backend: RLlib has no EnvPool backend).
"""

from __future__ import annotations

from common import api, median_rate

WORKLOAD = "W1"
DEFAULT_NUM_ENVS = (1, 16, 128)


ENVPOOL_NUM_ENVS = (16, 128)


def build_runner(target: str, num_envs: int, env: str = "CartPole-v1"):
    """A local runner with the default module (PPO's, the same MLP on both targets)."""
    PPOConfig = api(target, "envrunners.algorithms.ppo").PPOConfig
    runner_mod = api(target, "envrunners.env.single_agent_env_runner")
    config = (
        PPOConfig()
        .environment(env)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=num_envs)
    )
    if target == "ray.rllib":
        config = config.api_stack(
            enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True
        )
    return runner_mod.SingleAgentEnvRunner(config=config)


def _envpool_installed() -> bool:
    try:
        import envpool  # noqa: F401
    except ImportError:
        return False
    return True


def run(target: str, repeats: int = 5, num_envs_list=DEFAULT_NUM_ENVS, timesteps: int = 4000):
    """Yield one record per vector size (and per EnvPool vector size, envrunners only)."""
    cases = [(n, "CartPole-v1", None) for n in num_envs_list]
    if target == "envrunners" and _envpool_installed():
        cases += [(n, "envpool:CartPole-v1", "envpool") for n in ENVPOOL_NUM_ENVS]
    for num_envs, env, variant in cases:
        runner = build_runner(target, num_envs, env)

        def once(runner=runner) -> int:
            episodes = runner.sample(num_timesteps=timesteps, explore=True)
            return sum(len(e) for e in episodes)

        stats = median_rate(once, repeats=repeats)
        acted = getattr(runner.env, "batch_size", num_envs)
        runner.stop()
        record = {
            "workload": WORKLOAD,
            "target": target,
            "env": env,
            "num_envs": num_envs,
            "num_timesteps": timesteps,
            "env_steps_per_s": stats["per_s_median"],
            **{k: v for k, v in stats.items() if k != "per_s_median"},
        }
        if variant is not None:
            # Compared with RLlib's default-backend record of the same num_envs.
            record.update(variant=variant, acted_per_step=acted, rllib_key_variant=None)
        yield record
