"""The training loop behind ``envrunners train``: ``Algorithm.train()`` until a stop, with files.

Why a module of its own: ``train.py`` turns flags into a config; this one runs
it. The algorithm is ``config.build_algo()`` (the API's one training path); each
``train()`` result becomes a ``metrics.csv`` row, goes to the experiment loggers
(``--logger``) and is followed by ``save_to_path`` into ``checkpoint/``. The CSV
row and its checkpoint are written while Ctrl-C is held back, so an interrupt
never leaves a checkpoint that disagrees with the CSV or is half replaced.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from envrunners._cli.atari_env import wrapping_note
from envrunners._cli.embedded_ray import embedded_ray, quiet_loggers
from envrunners._cli.exit_codes import EXIT_INTERRUPTED
from envrunners._cli.train_checkpoint import CHECKPOINT_DIR

__all__ = ["RETURN_WINDOW", "Trainer", "csv_row"]

#: Episodes averaged for "mean return" and the stop condition
#: (the config's ``metrics_num_episodes_for_smoothing``).
RETURN_WINDOW = 20
#: ``metrics.csv`` learner columns -> RLlib's names under ``learners/default_policy``.
_LEARNER_COLUMNS = {
    "policy_loss": "policy_loss",
    "vf_loss": "vf_loss",
    "entropy": "entropy",
    "mean_kl": "mean_kl_loss",
    "explained_variance": "vf_explained_var",
    "lr": "default_optimizer_learning_rate",
}


def _learner_stats(result: dict[str, Any]) -> dict[str, Any]:
    """``default_policy``'s learner stats; with several modules (multi-agent), their mean."""
    learners = result.get("learners", {})
    if "default_policy" in learners:
        return learners["default_policy"]
    modules = [v for k, v in learners.items() if k != "__all_modules__" and isinstance(v, dict)]
    keys = set(_LEARNER_COLUMNS.values())
    stats: dict[str, Any] = {}
    for key in keys:
        values = [float(m[key]) for m in modules if isinstance(m.get(key), (int, float))]
        if values:
            stats[key] = sum(values) / len(values)
    return stats


def csv_row(result: dict[str, Any], steps_this_iter: float) -> dict[str, Any]:
    """The ``metrics.csv`` row of one ``Algorithm.train()`` result.

    ``episode_return_mean`` of a multi-agent env is the sum over its agents (as
    RLlib reports it); the learner columns are then the mean over the modules.
    """
    runners = result.get("env_runners", {})
    learner = _learner_stats(result)
    faults = result.get("fault_tolerance", {})
    nan = math.nan
    return {
        "iteration": result["training_iteration"],
        "env_steps": int(result["num_env_steps_sampled_lifetime"]),
        "episodes": int(runners.get("num_episodes_lifetime", 0)),
        "time_s": float(result.get("time_total_s", nan)),
        "steps_per_s": steps_this_iter / max(1e-9, float(result.get("time_this_iter_s", nan))),
        "episode_return_mean": runners.get("episode_return_mean", nan),
        "episode_return_min": runners.get("episode_return_min", nan),
        "episode_return_max": runners.get("episode_return_max", nan),
        "episode_len_mean": runners.get("episode_len_mean", nan),
        "healthy_runners": faults.get("num_healthy_workers", 0),
        "restarts": faults.get("num_remote_worker_restarts", 0),
        **{col: learner[key] for col, key in _LEARNER_COLUMNS.items() if key in learner},
    }


class Trainer:
    """State of one ``train`` invocation: counters, files, loggers and the algorithm."""

    def __init__(
        self,
        run: dict,
        config: Any,
        out: Path,
        saved: dict | None,
        debug: bool,
        loggers: list | None = None,
    ):
        self.run, self.config, self.out, self.debug = run, config, out, debug
        self.saved = saved
        self.loggers = list(loggers or [])
        progress = (saved or {}).get("progress", {})
        self.iteration = int(progress.get("training_iteration", 0))
        self.env_steps = int(progress.get("num_env_steps_sampled_lifetime", 0))
        self.mean_return = math.nan
        self.window_episodes = 0  # episodes finished in this process (the runners' window)
        self.algo: Any = None
        self.cluster_line: str | None = None  # the joined cluster's summary (RAY_ADDRESS)
        self.reason = ""

    # -- lifecycle -------------------------------------------------------------------
    def main(self, live: bool | None) -> int:
        from envrunners._cli.plots import MetricsCSV, plot_learning_curve
        from envrunners._cli.progress import make_progress

        self._t_command = time.perf_counter()
        run = self.run
        target = run["stop_reward"]
        goal = (
            f"mean return >= {target:g} (last {RETURN_WINDOW} episodes) or "
            if target is not None
            else ""
        )
        where = (
            "in-process (no Ray)"
            if run["num_env_runners"] == 0
            else f"{run['num_env_runners']} env runners x {run['num_envs_per_env_runner']} envs "
            "on a local Ray"
        )
        verb = "Resuming" if self.saved else "Training"
        lstm = " (LSTM policy)" if run.get("use_lstm") else ""
        if run.get("multi_agent"):
            ids = run["policy_ids"]
            lstm += (
                f" ({len(run['agents'])} agents, {len(ids)} "
                f"{'policy' if len(ids) == 1 else 'policies'}: {', '.join(ids)})"
            )
        print(
            f"{verb} {run['algo'].upper()}{lstm} on {run['env']}{wrapping_note(run['env'])} "
            f"until {goal}"
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
                for logger in self.loggers:
                    logger.close()
                png = plot_learning_curve(
                    self.out / "metrics.csv",
                    self.out / "learning_curve.png",
                    title=f"{run['algo'].upper()} on {run['env']}",
                    target=target,
                )
        self._summary(interrupted, png)
        return EXIT_INTERRUPTED if interrupted else 0

    def _loop(self) -> None:
        self.algo = self.config.build_algo()
        try:
            if self.saved:
                self.algo.restore_from_path(self.saved["path"])
            while not self._should_stop():
                self._iterate()
        finally:
            with _sigint_ignored(), quiet_loggers(not self.debug):
                self.cluster_line = _cluster_line(self.algo)
                self.algo.stop()

    def _should_stop(self) -> bool:
        target = self.run["stop_reward"]
        if target is not None and self.window_episodes >= RETURN_WINDOW:
            if self.mean_return >= target:
                self.reason = "solved"
                return True
        if self.env_steps >= self.run["stop_timesteps"]:
            self.reason = "budget"
            return True
        return False

    # -- one iteration -----------------------------------------------------------------
    def _iterate(self) -> None:
        from envrunners._cli.progress import ProgressSnapshot

        result = self.algo.train()
        steps = result["num_env_steps_sampled_lifetime"] - self.env_steps
        row = csv_row(result, steps)
        self.iteration = int(row["iteration"])
        self.env_steps = int(row["env_steps"])
        self.window_episodes += int(result.get("env_runners", {}).get("num_episodes", 0))
        self.mean_return = float(row["episode_return_mean"])
        with _sigint_deferred():  # the CSV row and its checkpoint go together
            self.csv.write(row)
            self.algo.save_to_path(self.out / CHECKPOINT_DIR)
        for logger in self.loggers:
            logger.log_result(result)
        self.progress.update(
            ProgressSnapshot(
                iteration=self.iteration,
                env_steps=self.env_steps,
                steps_per_s=row["steps_per_s"],
                mean_return=self.mean_return,
                healthy_runners=row["healthy_runners"],
                num_runners=self.algo.env_runner_group.num_remote_env_runners(),
                restarts=row["restarts"],
            )
        )

    # -- report ------------------------------------------------------------------------
    def _summary(self, interrupted: bool, png: Path | None) -> None:
        mean = self.mean_return
        shown = "-" if math.isnan(mean) else f"{mean:.1f}"
        wall = time.perf_counter() - self._t_command
        head = (
            f"{self.env_steps:,} env steps, {self.iteration} iterations, "
            f"mean return {shown} (last {min(RETURN_WINDOW, self.window_episodes)} episodes); "
            f"{wall:.1f} s wall time (startup included)"
        )
        if interrupted:
            line = f"Interrupted: {head}."
        elif self.reason == "solved":
            line = f"Solved {self.run['env']}: {head}."
        else:
            line = f"Stopped at --stop-timesteps: {head}."
        print(line, flush=True)
        if self.cluster_line:
            print(self.cluster_line, flush=True)
        ckpt = self.out / CHECKPOINT_DIR
        if ckpt.is_dir():
            print(f"Checkpoint (iteration {self._saved_iteration()}): {ckpt}")
            print(f"Resume with: envrunners train --resume {self.out}")
        print(f"Metrics: {self.out / 'metrics.csv'}")
        if png is not None:
            print(f"Learning curve: {png}")
        if any(logger.name == "tensorboard" for logger in self.loggers):
            print(f"TensorBoard: tensorboard --logdir {self.out}")

    def _saved_iteration(self) -> int:
        from envrunners.utils.checkpoints import load_state

        try:
            state, _ = load_state(self.out / CHECKPOINT_DIR)
            return int(state["progress"]["training_iteration"])
        except Exception:
            return self.iteration


# ---------------------------------------------------------------------- signals, Ray
@contextlib.contextmanager
def _ray_if_needed(run: dict[str, Any], debug: bool) -> Iterator[None]:
    if run["num_env_runners"] == 0:
        yield
        return
    with embedded_ray(run["num_env_runners"], debug=debug):
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


def _cluster_line(algo: Any) -> str | None:
    """The joined cluster's summary line (nodes alive, runners lost and replaced), else None."""
    from envrunners._cli.embedded_ray import cluster_summary

    group = getattr(algo, "env_runner_group", None)
    lost, replaced = group.lost_and_replaced_env_runners() if group is not None else ([], [])
    return cluster_summary(lost_runners=lost, replaced_runners=replaced)
