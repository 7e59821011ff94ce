"""Tuned PPO settings per env for ``envrunners train`` (Pendulum and the MuJoCo envs).

Why: the command's defaults are tuned for CartPole; continuous control needs
other settings (a small discount on Pendulum, state-independent action noise,
separate policy and value networks, observation normalisation on MuJoCo).
``envrunners train --env Pendulum-v1`` picks them up by env id; flags given on
the command line still win.

Source: RL Baselines3 Zoo, ``hyperparams/ppo.yml`` (DLR-RM/rl-baselines3-zoo,
commit 00128b5d46d497b772f3bd891ae9f520919e8971), translated to our keys:

- ``n_steps * n_envs`` -> ``train_batch_size``; ``batch_size`` -> ``minibatch_size``;
  ``n_epochs`` -> ``num_epochs``; ``learning_rate`` -> ``lr``; ``gae_lambda`` -> ``lambda_``;
  ``clip_range`` -> ``clip_param``; ``ent_coef`` -> ``entropy_coeff``;
  ``vf_coef`` -> ``vf_loss_coeff``; ``max_grad_norm`` -> ``grad_clip``;
  ``n_timesteps`` -> the step budget (``stop_timesteps``). SB3's defaults fill
  what an entry leaves out (n_steps 2048, batch_size 64, n_epochs 10, lr 3e-4,
  gamma 0.99, gae_lambda 0.95, clip_range 0.2, vf_coef 0.5, max_grad_norm 0.5).
- ``MlpPolicy``: separate 64-64 tanh policy and value networks
  (``vf_share_layers=False``) and a state-independent log-std (``free_log_std``);
  ``net_arch`` pi/vf 256-256 with ``activation_fn=nn.ReLU`` -> ``hidden=[256, 256]``,
  ``fcnet_activation="relu"``.
- ``normalize: true`` (VecNormalize) -> ``obs_filter="MeanStdFilter"``; its reward
  normalisation has no counterpart here.
- Not translated (no counterpart in our PPO): ``use_sde``/``sde_sample_freq``
  (Pendulum reaches a mean return of -250 without it), ``log_std_init`` (ours
  starts at 0), ``ortho_init=False`` (ours uses torch's default init anyway).
- MuJoCo entries were tuned on the ``-v3`` envs (mujoco-py); they apply to every
  version of the family here (``HalfCheetah-v5``, ...). ``n_envs: 1`` becomes one
  env per runner.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["PRESETS", "Preset", "find_preset", "model_settings", "start_note", "train_settings",
           "training_settings"]  # fmt: skip

#: The source named in the command's first lines.
SOURCE = "RL Baselines3 Zoo hyperparams/ppo.yml"


@dataclasses.dataclass(frozen=True)
class Preset:
    """Tuned settings of one env (family) for PPO.

    Attributes:
        run: ``envrunners train`` settings (the keys of ``train.DEFAULTS``).
        training: Further ``config.training()`` keys the command has no flags for.
        model: Further ``model_config`` keys of the default module.
    """

    run: dict[str, Any]
    training: dict[str, Any]
    model: dict[str, Any]


#: SB3's ``MlpPolicy`` for a Box action space: separate 64-64 tanh nets, state-free log-std.
_MLP = {"fcnet_activation": "tanh", "vf_share_layers": False, "free_log_std": True}
#: ``policy_kwargs: net_arch=[dict(pi=[256, 256], vf=[256, 256])], activation_fn=nn.ReLU``.
_MLP_256_RELU = {"fcnet_activation": "relu", "vf_share_layers": False, "free_log_std": True}


def _mujoco(
    *,
    n_steps: int = 2048,
    batch_size: int = 64,
    n_epochs: int = 10,
    lr: float = 3e-4,
    gamma: float = 0.99,
    gae_lambda: float = 0.95,
    clip_range: float = 0.2,
    ent_coef: float = 0.0,
    vf_coef: float = 0.5,
    max_grad_norm: float = 0.5,
    n_timesteps: int = 1_000_000,
    big_net: bool = False,
) -> Preset:
    """A MuJoCo entry (``normalize: true``, ``n_envs: 1``); defaults are SB3's."""
    return Preset(
        run={
            "num_envs_per_env_runner": 1,
            "train_batch_size": n_steps,
            "minibatch_size": batch_size,
            "num_epochs": n_epochs,
            "lr": lr,
            "gamma": gamma,
            "lambda_": gae_lambda,
            "hidden": [256, 256] if big_net else [64, 64],
            "obs_filter": "MeanStdFilter",
            "stop_timesteps": n_timesteps,
        },
        training={
            "clip_param": clip_range,
            "entropy_coeff": ent_coef,
            "vf_loss_coeff": vf_coef,
            "grad_clip": max_grad_norm,
        },
        model=dict(_MLP_256_RELU if big_net else _MLP),
    )


#: Env id (``Pendulum-v1``) or MuJoCo family name (``HalfCheetah``: every version) -> preset.
PRESETS: dict[str, Preset] = {
    # ppo.yml "Pendulum-v1" (tuned): n_envs 4, n_steps 1024, gamma 0.9, lr 1e-3, 1e5 steps.
    "Pendulum-v1": Preset(
        run={
            "num_envs_per_env_runner": 2,  # x 2 runners (the default): n_envs 4
            "train_batch_size": 4096,
            "minibatch_size": 64,
            "num_epochs": 10,
            "lr": 1e-3,
            "gamma": 0.9,
            "lambda_": 0.95,
            "hidden": [64, 64],
            "obs_filter": "NoFilter",
            "stop_timesteps": 100_000,
        },
        training={"clip_param": 0.2, "entropy_coeff": 0.0, "vf_loss_coeff": 0.5, "grad_clip": 0.5},
        model=dict(_MLP),
    ),
    # ppo.yml "# Tuned / 10 mujoco envs" entries (-v3), and "Ant-v3"/"Swimmer-v3" (defaults).
    "HalfCheetah": _mujoco(
        n_steps=512,
        batch_size=64,
        gamma=0.98,
        lr=2.0633e-05,
        ent_coef=0.000401762,
        clip_range=0.1,
        n_epochs=20,
        gae_lambda=0.92,
        max_grad_norm=0.8,
        vf_coef=0.58096,
        big_net=True,
    ),  # fmt: skip
    "Hopper": _mujoco(
        n_steps=512,
        batch_size=32,
        gamma=0.999,
        lr=9.80828e-05,
        ent_coef=0.00229519,
        clip_range=0.2,
        n_epochs=5,
        gae_lambda=0.99,
        max_grad_norm=0.7,
        vf_coef=0.835671,
        big_net=True,
    ),  # fmt: skip
    "Walker2d": _mujoco(
        n_steps=512,
        batch_size=32,
        gamma=0.99,
        lr=5.05041e-05,
        ent_coef=0.000585045,
        clip_range=0.1,
        n_epochs=20,
        gae_lambda=0.95,
        max_grad_norm=1.0,
        vf_coef=0.871923,
    ),  # fmt: skip
    "Humanoid": _mujoco(
        n_steps=512,
        batch_size=256,
        gamma=0.95,
        lr=3.56987e-05,
        ent_coef=0.00238306,
        clip_range=0.3,
        n_epochs=5,
        gae_lambda=0.9,
        max_grad_norm=2.0,
        vf_coef=0.431892,
        n_timesteps=10_000_000,
        big_net=True,
    ),  # fmt: skip
    "Reacher": _mujoco(
        n_steps=512,
        batch_size=32,
        gamma=0.9,
        lr=0.000104019,
        ent_coef=7.52585e-08,
        clip_range=0.3,
        n_epochs=5,
        gae_lambda=1.0,
        max_grad_norm=0.9,
        vf_coef=0.950368,
    ),  # fmt: skip
    "InvertedPendulum": _mujoco(
        n_steps=32,
        batch_size=64,
        gamma=0.999,
        lr=0.000222425,
        ent_coef=1.37976e-07,
        clip_range=0.4,
        n_epochs=5,
        gae_lambda=0.9,
        max_grad_norm=0.3,
        vf_coef=0.19816,
    ),  # fmt: skip
    "InvertedDoublePendulum": _mujoco(
        n_steps=128,
        batch_size=512,
        gamma=0.98,
        lr=0.000155454,
        ent_coef=1.05057e-06,
        clip_range=0.4,
        n_epochs=10,
        gae_lambda=0.8,
        max_grad_norm=0.5,
        vf_coef=0.695929,
    ),  # fmt: skip
    "Ant": _mujoco(),
    "Swimmer": _mujoco(gamma=0.9999),
}


def find_preset(env_id: str | None) -> Preset | None:
    """The preset of ``env_id``: by exact id, else by its family (``Hopper-v5`` -> ``Hopper``)."""
    if not env_id:
        return None
    if env_id in PRESETS:
        return PRESETS[env_id]
    family, sep, _ = env_id.partition("-v")
    return PRESETS.get(family) if sep and "/" not in family and ":" not in family else None


def _ppo_preset(run: dict[str, Any]) -> Preset | None:
    return find_preset(run.get("env")) if run.get("algo", "ppo") == "ppo" else None


def train_settings(env_id: str, algo: str) -> dict[str, Any]:
    """The ``train`` settings of ``env_id``'s preset (PPO only; ``{}`` without one).

    A minibatch larger than the batch (``InvertedPendulum``: 64 of 32) becomes the batch.
    """
    preset = find_preset(env_id) if algo == "ppo" else None
    if preset is None:
        return {}
    run = {k: (list(v) if isinstance(v, list) else v) for k, v in preset.run.items()}
    run["minibatch_size"] = min(run["minibatch_size"], run["train_batch_size"])
    return run


def training_settings(run: dict[str, Any]) -> dict[str, Any]:
    """The extra ``config.training()`` keys of the run's preset (``{}`` without one)."""
    preset = _ppo_preset(run)
    return dict(preset.training) if preset is not None else {}


def model_settings(run: dict[str, Any]) -> dict[str, Any]:
    """The extra ``model_config`` keys of the run's preset (``{}`` without one)."""
    preset = _ppo_preset(run)
    return dict(preset.model) if preset is not None else {}


def start_note(run: dict[str, Any]) -> str | None:
    """One line for the start of ``train``: the preset used and, without a reward
    threshold (``stop_reward`` None), the step budget that ends the run."""
    parts = []
    if _ppo_preset(run) is not None:
        parts.append(f"Tuned PPO settings for {run['env']} from {SOURCE}")
    if run.get("stop_reward") is None:
        parts.append(
            f"{run['env']} has no reward threshold: the run stops after "
            f"{int(run['stop_timesteps']):,} env steps (--stop-timesteps; --stop-reward R "
            "stops it at a mean return)"
        )
    return "; ".join(parts) + "." if parts else None
