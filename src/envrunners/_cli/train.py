"""``envrunners train``: PPO (or PG) on the new API stack, with progress, plots and checkpoints.

Why: the command a newcomer runs first. One iteration is the whole algorithm:

1. ``synchronous_parallel_sample`` collects ``train_batch_size`` env steps from the
   ``EnvRunnerGroup`` (remote runners on an embedded local Ray, or the local
   runner alone with ``--num-env-runners 0``);
2. ``PPOLearner.update`` turns the episodes into new weights;
3. ``sync_weights`` / ``sync_env_runner_states`` push weights, filter state and the
   step count back to the runners;
4. a row goes into ``metrics.csv`` and the checkpoint is rewritten (atomically, plain
   files), so Ctrl-C at any point keeps the last finished iteration.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as _dt
import math
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from envrunners._cli import common
from envrunners._cli.common import CliError

__all__ = ["add_train_parser", "run_train"]

#: Episodes averaged for "mean return" and the stop condition.
RETURN_WINDOW = 20
CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_FORMAT = "envrunners-train-checkpoint"

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
}
_ALGO_DEFAULTS = {
    "ppo": {"lr": 3e-4, "num_epochs": 10, "minibatch_size": 256},
    "pg": {"lr": 1e-3, "num_epochs": 1, "minibatch_size": None},
}
#: What a resumed run takes from the checkpoint unless given again.
_RESUMABLE = tuple(k for k in DEFAULTS if k not in ("stop_reward", "stop_timesteps")) + ("env",)


def add_train_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add ``train`` to the subparsers ``sub``."""
    p = sub.add_parser(
        "train",
        parents=parents,
        help="train PPO/PG on a gymnasium env (progress bar, metrics.csv, plot, checkpoint)",
        description="Train a policy with PPO (default) or PG on EnvRunnerGroup and write "
        "metrics.csv, learning_curve.png and a checkpoint into --out.",
    )
    p.add_argument("--env", help="gymnasium env id, e.g. CartPole-v1 (required unless --resume)")
    p.add_argument("--algo", choices=sorted(_ALGO_DEFAULTS), help="learner (default: ppo)")
    p.add_argument(
        "--num-env-runners",
        type=common.non_negative_int,
        help="remote env runners on an embedded local Ray; 0 samples in-process without Ray "
        "(default: 2)",
    )
    p.add_argument(
        "--num-envs-per-env-runner", type=common.positive_int, help="vector envs per runner (8)"
    )
    p.add_argument(
        "--stop-reward",
        type=common.finite_float,
        help="stop when the mean return of the last 20 episodes reaches this "
        "(default: the env's reward_threshold, CartPole-v1: 475)",
    )
    p.add_argument(
        "--stop-timesteps", type=common.positive_int, help="stop after this many env steps (500k)"
    )
    p.add_argument("--seed", type=common.non_negative_int, help="seed of envs and weights")
    p.add_argument("--out", help="output directory (default: runs/<env>-<algo>-<time>)")
    p.add_argument(
        "--resume", metavar="DIR", help="continue the run in DIR (its checkpoint, CSV and plot)"
    )
    p.add_argument("--train-batch-size", type=common.positive_int, help="env steps per update")
    p.add_argument("--lr", type=common.positive_float, help="Adam learning rate")
    p.add_argument("--num-epochs", type=common.positive_int, help="passes over each batch")
    p.add_argument("--minibatch-size", type=common.positive_int, help="SGD minibatch size")
    p.add_argument("--gamma", type=common.finite_float, help="discount (0.99)")
    p.add_argument("--hidden", type=common.int_list, help="hidden layer sizes (64,64)")
    p.add_argument("--obs-filter", choices=["NoFilter", "MeanStdFilter"], help="observation filter")
    p.add_argument("--no-progress", action="store_true", help="plain lines instead of a live bar")
    p.set_defaults(func=run_train)
    return p


# ---------------------------------------------------------------------- settings
def _settings(args: argparse.Namespace) -> tuple[dict[str, Any], dict | None, Path]:
    """Merge defaults, a resumed run's settings and the given flags; check them."""
    saved: dict | None = None
    run: dict[str, Any] = dict(DEFAULTS)
    if args.resume:
        saved = _load_checkpoint(Path(args.resume))
        run.update({k: v for k, v in saved["run"].items() if k in _RESUMABLE})
        if args.env and args.env != run.get("env"):
            raise CliError(
                f"--env {args.env} differs from the resumed run's env {run.get('env')!r}"
            )
    elif not args.env:
        raise CliError("the following arguments are required: --env (or --resume DIR)")
    for key in (*DEFAULTS, "env"):
        value = getattr(args, key, None)
        if value is not None:
            run[key] = value
    for key, value in _ALGO_DEFAULTS[run["algo"]].items():
        if run.get(key) is None:
            run[key] = value
    common.check_env_id(run["env"])
    spec = common.probe_env(run["env"])
    if run["stop_reward"] is None and spec is not None:
        run["stop_reward"] = spec.reward_threshold
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
    out = common.prepare_output_dir(out, "--out directory")
    return run, saved, out


def _load_checkpoint(path: Path) -> dict:
    from envrunners.errors import EnvRunnersError
    from envrunners.utils.checkpoints import load_state

    ckpt = path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path
    try:
        state, meta = load_state(ckpt)
    except (EnvRunnersError, OSError, ValueError) as err:
        raise CliError(
            f"--resume {str(path)!r}: no envrunners train checkpoint there ({err})"
        ) from None
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise CliError(f"--resume {str(path)!r}: {ckpt} is not an `envrunners train` checkpoint")
    return state


def build_config(run: dict[str, Any]) -> Any:
    """The ``PPOConfig`` of a run's settings."""
    from envrunners.algorithms.ppo import PPOConfig

    runners = run["num_env_runners"]
    envs = run["num_envs_per_env_runner"]
    fragment = max(1, math.ceil(run["train_batch_size"] / (max(1, runners) * envs)))
    return (
        PPOConfig()
        .environment(run["env"])
        .env_runners(
            num_env_runners=runners,
            num_envs_per_env_runner=envs,
            rollout_fragment_length=fragment,
            observation_filter=run["obs_filter"],
        )
        .training(
            train_batch_size=run["train_batch_size"],
            lr=run["lr"],
            num_epochs=run["num_epochs"],
            minibatch_size=run["minibatch_size"],
            gamma=run["gamma"],
            lambda_=run["lambda_"],
            clip_param=0.2,
            vf_clip_param=float("inf"),
            vf_loss_coeff=0.5,
            entropy_coeff=0.0,
            use_kl_loss=False,
        )
        .rl_module(model_config={"fcnet_hiddens": list(run["hidden"])})
        .fault_tolerance(restart_failed_env_runners=True)
        .debugging(seed=run["seed"])
    )


# ---------------------------------------------------------------------- the command
def run_train(args: argparse.Namespace) -> int:
    """Entry point of ``envrunners train``; returns the exit code."""
    run, saved, out = _settings(args)
    config = build_config(run)
    try:
        config.validate()
    except ValueError as err:
        raise CliError(str(err).splitlines()[0]) from None
    trainer = _Trainer(run, config, out, saved, debug=bool(getattr(args, "debug", False)))
    return trainer.main(live=False if args.no_progress else None)


class _Trainer:
    """State of one ``train`` invocation (counters, files, group and learner)."""

    def __init__(self, run: dict, config: Any, out: Path, saved: dict | None, debug: bool):
        self.run, self.config, self.out, self.debug = run, config, out, debug
        progress = (saved or {}).get("progress", {})
        self.iteration = int(progress.get("iteration", 0))
        self.env_steps = int(progress.get("env_steps", 0))
        self.episodes = int(progress.get("episodes", 0))
        self.time_s = float(progress.get("time_s", 0.0))
        self.returns: collections.deque = collections.deque(
            progress.get("recent_returns", []), maxlen=RETURN_WINDOW
        )
        self.saved = saved
        self._partial: dict[str, float] = {}
        self._lengths: dict[str, int] = {}
        self.group: Any = None
        self.learner: Any = None
        self.reason = ""

    # -- lifecycle -------------------------------------------------------------------
    def main(self, live: bool | None) -> int:
        from envrunners._cli.plots import MetricsCSV, plot_learning_curve
        from envrunners._cli.progress import make_progress

        self._t_command = time.perf_counter()
        run = self.run
        target = run["stop_reward"]
        goal = f"mean return >= {target:g} (last {RETURN_WINDOW} episodes) or " if target else ""
        where = (
            "in-process (no Ray)"
            if run["num_env_runners"] == 0
            else f"{run['num_env_runners']} env runners x {run['num_envs_per_env_runner']} envs "
            "on a local Ray"
        )
        verb = "Resuming" if self.saved else "Training"
        print(
            f"{verb} {run['algo'].upper()} on {run['env']} until {goal}"
            f"{run['stop_timesteps']:,} env steps; {where}. Output: {self.out}",
            flush=True,
        )
        self.csv = MetricsCSV(self.out / "metrics.csv")
        interrupted = False
        progress = make_progress(
            f"{run['env']} {run['algo']}", run["stop_timesteps"], initial=self.env_steps, live=live
        )
        try:
            with _ray_if_needed(run, self.debug), progress:
                self.progress = progress
                self._loop()
        except KeyboardInterrupt:
            interrupted = True
        finally:
            with _sigint_ignored():
                self.csv.close()
                png = plot_learning_curve(
                    self.out / "metrics.csv",
                    self.out / "learning_curve.png",
                    title=f"{run['algo'].upper()} on {run['env']}",
                    target=target,
                )
        self._summary(interrupted, png)
        return common.EXIT_INTERRUPTED if interrupted else 0

    def _loop(self) -> None:
        from envrunners.env.env_runner_group import EnvRunnerGroup

        start = time.perf_counter() - self.time_s
        self.group = EnvRunnerGroup(config=self.config)
        try:
            self.learner = self._make_learner()
            if self.saved:
                self._restore(self.saved)
            self.group.sync_weights(from_worker_or_learner_group=self.learner, inference_only=True)
            while not self._should_stop():
                self._iterate(start)
        finally:
            with _sigint_ignored(), common.quiet_loggers(not self.debug):
                self.group.stop()

    def _make_learner(self) -> Any:
        from envrunners.algorithms.ppo.ppo_learner import PGLearner, PPOLearner

        cls = PGLearner if self.run["algo"] == "pg" else PPOLearner
        return cls.from_group(self.config, self.group)

    def _restore(self, saved: dict) -> None:
        self.learner.set_state(saved["learner"])
        runner_state = dict(saved.get("env_runner", {}))
        runner_state["num_env_steps_sampled_lifetime"] = self.env_steps
        self.group.foreach_env_runner("set_state", kwargs={"state": runner_state})

    def _should_stop(self) -> bool:
        target = self.run["stop_reward"]
        if target is not None and len(self.returns) >= RETURN_WINDOW:
            if self._mean_return() >= target:
                self.reason = "solved"
                return True
        if self.env_steps >= self.run["stop_timesteps"]:
            self.reason = "budget"
            return True
        return False

    # -- one iteration -----------------------------------------------------------------
    def _iterate(self, start: float) -> None:
        from envrunners.execution.rollout_ops import synchronous_parallel_sample

        t0 = time.perf_counter()
        episodes = synchronous_parallel_sample(
            worker_set=self.group, max_env_steps=self.config.train_batch_size
        )
        steps = sum(len(e) for e in episodes)
        finished = self._track_returns(episodes)
        stats = self.learner.update(episodes)
        self.env_steps += steps
        self.group.sync_weights(from_worker_or_learner_group=self.learner, inference_only=True)
        self.group.sync_env_runner_states(config=self.config, env_steps_sampled=self.env_steps)
        self.iteration += 1
        self.time_s = time.perf_counter() - start
        rate = steps / max(1e-9, time.perf_counter() - t0)
        healthy = self.group.num_healthy_remote_env_runners()
        restarts = self.group.num_remote_worker_restarts()
        rets = [r for r, _ in finished]
        row = {
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "time_s": self.time_s,
            "steps_per_s": rate,
            "episode_return_mean": self._mean_return(),
            "episode_return_min": min(rets) if rets else math.nan,
            "episode_return_max": max(rets) if rets else math.nan,
            "episode_len_mean": sum(n for _, n in finished) / len(finished)
            if finished
            else math.nan,
            "healthy_runners": healthy,
            "restarts": restarts,
            **stats,
        }
        with _sigint_deferred():  # the CSV row and its checkpoint go together
            self.csv.write(row)
            self._save_checkpoint()
        from envrunners._cli.progress import ProgressSnapshot

        self.progress.update(
            ProgressSnapshot(
                iteration=self.iteration,
                env_steps=self.env_steps,
                steps_per_s=rate,
                mean_return=self._mean_return(),
                healthy_runners=healthy,
                num_runners=self.group.num_remote_env_runners(),
                restarts=restarts,
            )
        )

    def _track_returns(self, episodes: list) -> list[tuple[float, int]]:
        """Sum chunk returns per episode id; returns (return, length) of finished episodes."""
        finished = []
        seen = set()
        for e in episodes:
            key = e.id_
            seen.add(key)
            self._partial[key] = self._partial.get(key, 0.0) + float(e.get_return())
            self._lengths[key] = self._lengths.get(key, 0) + len(e)
            if e.is_done:
                finished.append((self._partial.pop(key), self._lengths.pop(key)))
        for key in [k for k in self._partial if k not in seen]:  # chunks we never see again
            self._partial.pop(key)
            self._lengths.pop(key, None)
        self.returns.extend(r for r, _ in finished)
        self.episodes += len(finished)
        return finished

    def _mean_return(self) -> float:
        return sum(self.returns) / len(self.returns) if self.returns else math.nan

    # -- checkpoint ----------------------------------------------------------------------
    def _save_checkpoint(self) -> None:
        import envrunners
        from envrunners.utils.checkpoints import save_state

        local = self.group.local_env_runner
        runner_state = local.get_state(
            components=["env_to_module_connector", "module_to_env_connector"]
        )
        runner_state["num_env_steps_sampled_lifetime"] = self.env_steps
        state = {
            "learner": self.learner.get_state(),
            "env_runner": runner_state,
            "progress": {
                "iteration": self.iteration,
                "env_steps": self.env_steps,
                "episodes": self.episodes,
                "time_s": self.time_s,
                "recent_returns": list(self.returns),
            },
            "run": {k: v for k, v in self.run.items() if k in (*_RESUMABLE, "stop_reward")},
        }
        metadata = {
            "format": CHECKPOINT_FORMAT,
            "version": 1,
            "envrunners_version": envrunners.__version__,
            "env": self.run["env"],
            "algo": self.run["algo"],
            "saved_at": _dt.datetime.now().isoformat(timespec="seconds"),
        }
        save_state(self.out / CHECKPOINT_DIR, state, metadata)

    # -- report ------------------------------------------------------------------------
    def _summary(self, interrupted: bool, png: Path | None) -> None:
        mean = self._mean_return()
        shown = "-" if math.isnan(mean) else f"{mean:.1f}"
        wall = time.perf_counter() - self._t_command
        head = (
            f"{self.env_steps:,} env steps, {self.iteration} iterations, "
            f"mean return {shown} (last {len(self.returns)} episodes); "
            f"{wall:.1f} s wall time (startup included)"
        )
        if interrupted:
            line = f"Interrupted: {head}."
        elif self.reason == "solved":
            line = f"Solved {self.run['env']}: {head}."
        else:
            line = f"Stopped at --stop-timesteps: {head}."
        print(line, flush=True)
        ckpt = self.out / CHECKPOINT_DIR
        if ckpt.is_dir():
            print(f"Checkpoint (iteration {self._saved_iteration()}): {ckpt}")
            print(f"Resume with: envrunners train --resume {self.out}")
        print(f"Metrics: {self.out / 'metrics.csv'}")
        if png is not None:
            print(f"Learning curve: {png}")

    def _saved_iteration(self) -> int:
        from envrunners.utils.checkpoints import load_state

        try:
            state, _ = load_state(self.out / CHECKPOINT_DIR)
            return int(state["progress"]["iteration"])
        except Exception:
            return self.iteration


# ---------------------------------------------------------------------- signals, Ray
@contextlib.contextmanager
def _ray_if_needed(run: dict[str, Any], debug: bool) -> Iterator[None]:
    if run["num_env_runners"] == 0:
        yield
        return
    with common.embedded_ray(run["num_env_runners"], debug=debug):
        yield


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore Ctrl-C while cleaning up, so a second press cannot leave Ray running."""
    if not _main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold a Ctrl-C until the block is done (a checkpoint is never half replaced)."""
    if not _main_thread():
        yield
        return
    hit: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: hit.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if hit:
        raise KeyboardInterrupt
