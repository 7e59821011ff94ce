"""``envrunners train``: PPO (or PG) through ``Algorithm``, with progress, plots, loggers, checkpoints.

Why: the command a newcomer runs first, on the API's one training path. The flags
(and ``--config FILE``) become a ``PPOConfig``/``PGConfig`` (multi-agent envs get
their policies and mapping from ``_cli/multi_agent_training.py``); ``config.build_algo()``
then ``train()`` runs until the mean return of the last 20 episodes reaches
``--stop-reward`` or ``--stop-timesteps`` env steps are sampled. Each iteration
writes a ``metrics.csv`` row, the ``--logger`` outputs (TensorBoard by default)
and ``Algorithm.save_to_path`` into ``checkpoint/``; ``--resume`` restores that
checkpoint with ``restore_from_path``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import difflib
import math
import sys
from pathlib import Path
from typing import Any

from envrunners._cli import (
    arguments,
    atari_env,
    config_file,
    input_checks,
    multi_agent_training,
    presets,
)
from envrunners._cli.train_checkpoint import load_checkpoint, save_run_settings
from envrunners._cli.trainer import RETURN_WINDOW, Trainer
from envrunners.errors import CliError

__all__ = ["add_train_parser", "model_config", "run_train"]

#: Defaults chosen to solve CartPole-v1 quickly on two CPU cores (see README).
DEFAULTS: dict[str, Any] = {
    "algo": "ppo",
    "num_env_runners": 2,
    "num_envs_per_env_runner": 8,
    "stop_reward": None,  # None: the env's reward_threshold (CartPole-v1: 475)
    "stop_timesteps": 500_000,
    "seed": None,
    "train_batch_size": 2048,
    "lr": None,  # per algo: ppo 3e-4, pg 1e-3
    "num_epochs": None,  # per algo: ppo 10, pg 1
    "minibatch_size": None,  # per algo: ppo 256, pg the whole batch
    "gamma": 0.99,
    "lambda_": 0.95,
    "hidden": [64, 64],
    "obs_filter": "NoFilter",
    "use_lstm": False,
    "lstm_cell_size": 256,
    "max_seq_len": 20,
}
_ALGO_DEFAULTS = {
    "ppo": {"lr": 3e-4, "num_epochs": 10, "minibatch_size": 256},
    "pg": {"lr": 1e-3, "num_epochs": 1, "minibatch_size": None},
}
#: What a resumed run takes from the checkpoint unless given again.
RESUMABLE_KEYS = tuple(k for k in DEFAULTS if k not in ("stop_reward", "stop_timesteps")) + (
    "env",
    "config_overrides",
    # multi-agent runs (_cli/multi_agent_training.py)
    "multi_agent",
    "policies_mode",
    "policy_rules",
    "agents",
    "policy_ids",
)
#: Run settings -> the config fields they set (a ``--config`` file may set them too).
_CONFIG_FIELDS = {
    "env": "env",
    "num_env_runners": "num_env_runners",
    "num_envs_per_env_runner": "num_envs_per_env_runner",
    "train_batch_size": "train_batch_size",
    "lr": "lr",
    "num_epochs": "num_epochs",
    "minibatch_size": "minibatch_size",
    "gamma": "gamma",
    "lambda_": "lambda_",
    "seed": "seed",
    "obs_filter": "observation_filter",
}
#: Loggers written unless ``--logger`` says otherwise (each only if its package is there).
DEFAULT_LOGGERS = ("tensorboard",)


def add_train_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add ``train`` to the subparsers ``sub``."""
    p = sub.add_parser(
        "train",
        parents=parents,
        help="train PPO/PG on a gymnasium or PettingZoo env (progress bar, metrics.csv, plot, "
        "checkpoint)",
        description="Train a policy with PPO (default) or PG on EnvRunnerGroup and write "
        "metrics.csv, learning_curve.png and a checkpoint into --out. Multi-agent envs "
        "(--env pettingzoo:<module>) train one shared module, one per agent "
        "(--policies per-agent) or those of a --policy-mapping file.",
    )
    p.add_argument(
        "--env",
        help="gymnasium env id, e.g. CartPole-v1, or a multi-agent env: "
        "pettingzoo:<module> (pettingzoo:mpe2.simple_spread_v3), a PettingZoo module path "
        "or module:attr naming a MultiAgentEnv (required unless --resume)",
    )
    p.add_argument("--algo", choices=sorted(_ALGO_DEFAULTS), help="learner (default: ppo)")
    arguments.add_runner_arguments(
        p,
        DEFAULTS["num_env_runners"],
        DEFAULTS["num_envs_per_env_runner"],
        store_defaults=False,  # unset flags: the resumed run's settings, else DEFAULTS
    )
    p.add_argument(
        "--stop-reward",
        type=arguments.finite_float,
        help="stop when the mean return of the last 20 episodes reaches this "
        "(default: the env's reward_threshold, CartPole-v1: 475)",
    )
    p.add_argument(
        "--stop-timesteps",
        type=arguments.positive_int,
        help="stop after this many env steps (500k)",
    )
    p.add_argument("--seed", type=arguments.non_negative_int, help="seed of envs and weights")
    p.add_argument("--out", help="output directory (default: runs/<env>-<algo>-<time>)")
    p.add_argument(
        "--resume", metavar="DIR", help="continue the run in DIR (its checkpoint, CSV and plot)"
    )
    p.add_argument("--train-batch-size", type=arguments.positive_int, help="env steps per update")
    p.add_argument("--lr", type=arguments.positive_float, help="Adam learning rate")
    p.add_argument("--num-epochs", type=arguments.positive_int, help="passes over each batch")
    p.add_argument("--minibatch-size", type=arguments.positive_int, help="SGD minibatch size")
    p.add_argument("--gamma", type=arguments.finite_float, help="discount (0.99)")
    p.add_argument("--hidden", type=arguments.int_list, help="hidden layer sizes (64,64)")
    p.add_argument("--obs-filter", choices=["NoFilter", "MeanStdFilter"], help="observation filter")
    p.add_argument(
        "--use-lstm",
        action="store_true",
        default=None,
        help="recurrent policy: an LSTM after the encoder, trained by BPTT over --max-seq-len "
        "sequences (for partially observed envs, e.g. envrunners/StatelessCartPole-v1)",
    )
    p.add_argument(
        "--lstm-cell-size", type=arguments.positive_int, help="with --use-lstm: LSTM size (256)"
    )
    p.add_argument(
        "--max-seq-len",
        type=arguments.positive_int,
        help="with --use-lstm: time steps per training sequence (20)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="YAML or TOML file of AlgorithmConfig fields (e.g. lr: 0.001, "
        "entropy_coeff: 0.01); flags given on the command line win",
    )
    p.add_argument(
        "--logger",
        action="append",
        metavar="NAMES",
        help="experiment trackers, comma-separated or repeated: csv (progress.csv), "
        "tensorboard, wandb (offline), mlflow (file store in --out), none "
        "(default: tensorboard if installed)",
    )
    p.add_argument(
        "--policies",
        choices=multi_agent_training.POLICY_MODES,
        help="multi-agent envs: one module for all agents (shared, the default) "
        "or one per agent id (per-agent)",
    )
    p.add_argument(
        "--policy-mapping",
        metavar="FILE",
        help="multi-agent envs: YAML/TOML mapping {agent id or glob: policy id}, "
        "e.g. 'adversary_*: adversary' and 'agent_*: good'",
    )
    p.add_argument("--no-progress", action="store_true", help="plain lines instead of a live bar")
    p.set_defaults(func=run_train)
    return p


# ---------------------------------------------------------------------- settings
def _settings(args: argparse.Namespace) -> tuple[dict[str, Any], dict | None, Path]:
    """Merge defaults, a resumed run's settings and the given flags; check them."""
    saved: dict | None = None
    run: dict[str, Any] = dict(DEFAULTS)
    if args.resume:
        saved = load_checkpoint(Path(args.resume), "--resume")
        run.update({k: v for k, v in saved["run"].items() if k in RESUMABLE_KEYS})
        if args.env and args.env != run.get("env"):
            raise CliError(
                f"--env {args.env} differs from the resumed run's env {run.get('env')!r}"
            )
    elif not args.env:
        raise CliError("the following arguments are required: --env (or --resume DIR)")
    if saved is None:  # the env's tuned settings (_cli/presets.py); flags still win
        run.update(presets.train_settings(args.env, args.algo or DEFAULTS["algo"]))
    for key in (*DEFAULTS, "env"):
        value = getattr(args, key, None)
        if value is not None:
            run[key] = value
    if getattr(args, "config", None):
        run["config_overrides"] = config_file.load(args.config, _algo_config_class(run["algo"]))
    overrides = dict(run.get("config_overrides") or {})
    for key, field in _CONFIG_FIELDS.items():  # a flag given wins over the file
        if getattr(args, key, None) is not None:
            overrides.pop(field, None)
        elif field in overrides:
            run[key] = overrides[field]
    run["config_overrides"] = overrides
    for key, value in _ALGO_DEFAULTS[run["algo"]].items():
        if run.get(key) is None:
            run[key] = value
    if saved is not None:  # the checkpoint's weights only fit the network they came from
        for key in ("algo", "use_lstm", "lstm_cell_size", "hidden"):
            before = saved["run"].get(key, DEFAULTS[key])
            if run[key] != before and (key != "lstm_cell_size" or run["use_lstm"]):
                raise CliError(
                    f"{_as_flag(key, run[key])} differs from the resumed run's "
                    f"{_as_flag(key, before)} (its weights fit that network only)"
                )
    _check_env(args, run, saved)
    if not 0.0 <= run["gamma"] <= 1.0:
        raise CliError(f"argument --gamma: expected a number in [0, 1], got {run['gamma']}")
    if args.out:
        out = Path(args.out)
    elif args.resume:
        out = Path(args.resume)
    else:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = (
            Path("runs") / f"{run['env'].replace(':', '_').replace('/', '_')}-{run['algo']}-{stamp}"
        )
    out = input_checks.prepare_output_dir(out, "--out directory")
    return run, saved, out


def _check_env(args: argparse.Namespace, run: dict[str, Any], saved: dict | None) -> None:
    """Check ``--env`` (and, for a multi-agent env, its policies); the env's stop reward."""
    policies, mapping = getattr(args, "policies", None), getattr(args, "policy_mapping", None)
    if multi_agent_training.is_multi_agent_spec(run["env"]):
        if saved is None or policies or mapping:
            env_config = (run.get("config_overrides") or {}).get("env_config")
            run.update(
                multi_agent_training.multi_agent_settings(run["env"], policies, mapping, env_config)
            )
            if saved is not None and run["policy_ids"] != saved["run"].get("policy_ids"):
                raise CliError(
                    f"the policies {', '.join(run['policy_ids'])} differ from the resumed "
                    f"run's {', '.join(saved['run'].get('policy_ids') or [])} "
                    "(its weights fit those modules only)"
                )
        return
    if policies or mapping:
        flag = "--policies" if policies else "--policy-mapping"
        raise CliError(
            f"{flag} needs a multi-agent --env (pettingzoo:<module> or module:attr), "
            f"got the single-agent env {run['env']!r}"
        )
    if atari_env.is_atari_id(run["env"]):
        atari_env.ensure_ale()
    input_checks.check_env_id(run["env"])
    spec = input_checks.probe_env(run["env"])
    if run["stop_reward"] is None and spec is not None:
        run["stop_reward"] = spec.reward_threshold


def _as_flag(key: str, value: Any) -> str:
    """A setting as the flag that gives it (``--hidden 64,64``, ``no --use-lstm``)."""
    flag = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return flag if value else f"no {flag}"
    if isinstance(value, list):
        return f"{flag} {','.join(str(v) for v in value)}"
    return f"{flag} {value}"


def _algo_config_class(algo: str) -> type:
    if algo == "pg":
        from envrunners.algorithms.pg import PGConfig

        return PGConfig
    from envrunners.algorithms.ppo import PPOConfig

    return PPOConfig


def build_config(run: dict[str, Any]) -> Any:
    """The ``PPOConfig`` (``PGConfig`` for ``algo="pg"``) of a run's settings.

    The ``--config`` file's fields (``run["config_overrides"]``) are applied last;
    ``rollout_fragment_length`` is then fitted to the batch unless the file sets it.
    """
    config = (
        _algo_config_class(run["algo"])()
        .environment(atari_env.config_env(run["env"]))
        .env_runners(
            num_env_runners=run["num_env_runners"],
            num_envs_per_env_runner=run["num_envs_per_env_runner"],
            observation_filter=run["obs_filter"],
        )
        .training(
            train_batch_size=run["train_batch_size"],
            lr=run["lr"],
            num_epochs=run["num_epochs"],
            minibatch_size=run["minibatch_size"],
            gamma=run["gamma"],
        )
        .rl_module(model_config=model_config(run))
        .fault_tolerance(restart_failed_env_runners=True)
        .reporting(metrics_num_episodes_for_smoothing=RETURN_WINDOW)
        .debugging(seed=run["seed"])
    )
    if run.get("multi_agent"):
        config = multi_agent_training.apply_multi_agent(config, run)
    if run["algo"] == "ppo":
        config = config.training(
            lambda_=run["lambda_"],
            clip_param=0.2,
            vf_clip_param=float("inf"),
            vf_loss_coeff=0.5,
            entropy_coeff=0.0,
            use_kl_loss=False,
        )
    config = config.training(**presets.training_settings(run))  # tuned per env; flags win
    overrides = dict(run.get("config_overrides") or {})
    if overrides:
        config = config_file.apply(config, overrides, "--config")
    if "rollout_fragment_length" not in overrides:
        slots = max(1, config.num_env_runners) * config.num_envs_per_env_runner
        fragment = max(1, math.ceil(config.train_batch_size / slots))
        config = config.env_runners(rollout_fragment_length=fragment)
    return config


def model_config(run: dict[str, Any]) -> dict[str, Any]:
    """The default module's ``model_config`` of a run's settings (also ``sample``'s, for a
    checkpoint): ``fcnet_hiddens``, and the LSTM's keys when ``use_lstm``; an
    ``Algorithm`` checkpoint's own ``model_config`` when it came from the API."""
    if isinstance(run.get("model_config"), dict):
        return dict(run["model_config"])
    config: dict[str, Any] = {"fcnet_hiddens": list(run.get("hidden", DEFAULTS["hidden"]))}
    if run.get("use_lstm"):
        config.update(
            use_lstm=True,
            lstm_cell_size=int(run.get("lstm_cell_size", DEFAULTS["lstm_cell_size"])),
            max_seq_len=int(run.get("max_seq_len", DEFAULTS["max_seq_len"])),
        )
    config.update(presets.model_settings(run))
    return config


# ---------------------------------------------------------------------- the command
def run_train(args: argparse.Namespace) -> int:
    """Entry point of ``envrunners train``; returns the exit code."""
    logger_names = _logger_names(args.logger)  # before anything is created
    run, saved, out = _settings(args)
    if note := presets.start_note(run):  # stderr: stdout's first line stays "Training ..."
        print(note, file=sys.stderr, flush=True)
    config = build_config(run)
    try:
        config.validate()
    except ValueError as err:
        raise CliError(config_file.one_line(err)) from None
    from envrunners.callbacks.loggers import make_loggers

    loggers = make_loggers(logger_names, out)
    save_run_settings(out, run)
    trainer = Trainer(
        run, config, out, saved, debug=bool(getattr(args, "debug", False)), loggers=loggers
    )
    return trainer.main(live=False if args.no_progress else None)


def _logger_names(flags: list[str] | None) -> list[str]:
    """The ``--logger`` names, checked (default: TensorBoard when it is installed)."""
    from envrunners.callbacks.loggers import LOGGERS, logger_available, require_package
    from envrunners.errors import LoggerPackageMissingError

    if flags is None:
        return [n for n in DEFAULT_LOGGERS if logger_available(n)]
    names = list(dict.fromkeys(n.strip() for flag in flags for n in flag.split(",") if n.strip()))
    if "none" in names:
        if names != ["none"]:
            raise CliError("argument --logger: 'none' cannot be combined with other loggers")
        return []
    for name in names:
        if name not in LOGGERS:
            close = difflib.get_close_matches(name, [*LOGGERS, "none"], n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise CliError(
                f"argument --logger: unknown logger {name!r}{hint} "
                "(expected csv, tensorboard, wandb, mlflow or none)"
            )
        try:
            require_package(name)
        except LoggerPackageMissingError as err:
            raise CliError(f"argument --logger: {err}") from None
    return names
