"""The training loop behind ``envrunners train``: iterations, checkpoints, Ctrl-C, summary.

Why a module of its own: ``train.py`` turns flags into settings; this one runs
them. One iteration samples ``train_batch_size`` env steps from the group,
updates the learner, syncs weights and runner state back, then writes the CSV
row and the checkpoint together while Ctrl-C is held back, so an interrupt never
leaves a checkpoint that disagrees with the CSV or is half replaced.
"""

from __future__ import annotations

import collections
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
from envrunners._cli.train_checkpoint import CHECKPOINT_DIR, save_checkpoint

__all__ = ["Trainer"]

#: Episodes averaged for "mean return" and the stop condition.
RETURN_WINDOW = 20


class Trainer:
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
                png = plot_learning_curve(
                    self.out / "metrics.csv",
                    self.out / "learning_curve.png",
                    title=f"{run['algo'].upper()} on {run['env']}",
                    target=target,
                )
        self._summary(interrupted, png)
        return EXIT_INTERRUPTED if interrupted else 0

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
            with _sigint_ignored(), quiet_loggers(not self.debug):
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
        }
        save_checkpoint(self.out, state, self.run)

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
