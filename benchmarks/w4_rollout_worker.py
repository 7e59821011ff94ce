"""W4: old-stack RolloutWorker + PPOTorchPolicy on CartPole-v1, rollout_fragment_length=200.

``sample()`` env steps/s at 1 and 16 vector envs (batch_mode truncate_episodes,
explore=True; each sample() includes PPO's GAE postprocessing). On
``ray.rllib`` the old API stack is enabled for the same config.
"""

from __future__ import annotations

from common import api, median_rate

WORKLOAD = "W4"
DEFAULT_NUM_ENVS = (1, 16)
FRAGMENT = 200


def build_worker(target: str, num_envs: int):
    """A local RolloutWorker with PPO's torch policy and the default model."""
    import gymnasium as gym

    PPOConfig = api(target, "envrunners.algorithms.ppo").PPOConfig
    PPOTorchPolicy = api(target, "envrunners.algorithms.ppo.ppo_torch_policy").PPOTorchPolicy
    RolloutWorker = api(target, "envrunners.evaluation.rollout_worker").RolloutWorker
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(
            num_env_runners=0,
            num_envs_per_env_runner=num_envs,
            rollout_fragment_length=FRAGMENT,
        )
    )
    if target == "ray.rllib":
        config = config.api_stack(
            enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False
        )
    return RolloutWorker(
        env_creator=lambda _ctx: gym.make("CartPole-v1"),
        config=config,
        default_policy_class=PPOTorchPolicy,
    )


def run(target: str, repeats: int = 5, num_envs_list=DEFAULT_NUM_ENVS, samples_per_repeat=None):
    """Yield one record per vector size (each repeat: >= 4000 steps and >= 2 sample() calls)."""
    for num_envs in num_envs_list:
        worker = build_worker(target, num_envs)
        calls = samples_per_repeat or max(2, -(-4000 // (FRAGMENT * num_envs)))

        def once(worker=worker, calls=calls) -> int:
            return sum(worker.sample().env_steps() for _ in range(calls))

        stats = median_rate(once, repeats=repeats)
        worker.stop()
        yield {
            "workload": WORKLOAD,
            "target": target,
            "env": "CartPole-v1",
            "num_envs": num_envs,
            "rollout_fragment_length": FRAGMENT,
            "sample_calls_per_repeat": calls,
            "env_steps_per_s": stats["per_s_median"],
            **{k: v for k, v in stats.items() if k != "per_s_median"},
        }
