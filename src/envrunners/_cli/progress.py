"""Live progress for long commands: a rich bar on a terminal, plain lines otherwise.

Why: a newcomer should see that training works (steps, speed, return, runner
health) while it runs; logs and CI want one readable line per update instead of
terminal escape codes. Both show the same fields.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["ProgressSnapshot", "make_progress"]


@dataclass
class ProgressSnapshot:
    """What the bar shows after one iteration."""

    iteration: int
    env_steps: int
    steps_per_s: float
    mean_return: float
    healthy_runners: int
    num_runners: int
    restarts: int

    def fields(self) -> dict[str, str]:
        """The formatted fields, shared by both displays."""
        ret = "-" if math.isnan(self.mean_return) else f"{self.mean_return:.1f}"
        runners = "local" if self.num_runners == 0 else f"{self.healthy_runners}/{self.num_runners}"
        return {
            "iter": str(self.iteration),
            "steps": f"{self.env_steps:,}",
            "rate": f"{self.steps_per_s:,.0f}/s",
            "ret": ret,
            "runners": runners,
            "restarts": str(self.restarts),
        }


class _PlainProgress:
    """One line per update, at most every ``interval_s`` seconds (the last always)."""

    def __init__(self, description: str, total: int | None, interval_s: float = 1.0):
        self.description = description
        self.total = total
        self.interval_s = interval_s
        self._last = -math.inf
        self._pending: ProgressSnapshot | None = None

    def __enter__(self) -> _PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._pending is not None:
            self._print(self._pending)

    def update(self, snap: ProgressSnapshot) -> None:
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._print(snap)
            self._last = now
            self._pending = None
        else:
            self._pending = snap

    def _print(self, snap: ProgressSnapshot) -> None:
        f = snap.fields()
        total = f"/{self.total:,}" if self.total else ""
        runners = "local runner" if f["runners"] == "local" else f"runners {f['runners']} healthy"
        print(
            f"{self.description} | iter {f['iter']} | env steps {f['steps']}{total} | "
            f"{f['rate']} | mean return {f['ret']} | {runners} | restarts {f['restarts']}",
            flush=True,
        )

    def log(self, message: str) -> None:
        print(message, flush=True)


class _RichProgress:
    """A rich bar over env steps (line 1) with the snapshot's fields below it (line 2)."""

    def __init__(self, description: str, total: int | None, initial: int = 0):
        from rich.console import Group
        from rich.live import Live
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("[bold cyan]{task.description}"),
            BarColumn(bar_width=None),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} env steps"),
            TimeElapsedColumn(),
            expand=False,
        )
        self._task = self._progress.add_task(description, total=total, completed=initial)
        self._stats = "  waiting for the first iteration (starting runners) ..."
        self._live = Live(Group(self._progress, self), refresh_per_second=4, transient=False)

    def __rich__(self) -> Any:
        from rich.text import Text

        return Text.from_markup(self._stats)

    def __enter__(self) -> _RichProgress:
        self._live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._live.stop()

    def update(self, snap: ProgressSnapshot) -> None:
        f = snap.fields()
        runners = "local runner" if f["runners"] == "local" else f"runners {f['runners']} healthy"
        self._stats = (
            f"  iter {f['iter']} · [green]{f['rate']}[/] · mean return [bold]{f['ret']}[/] · "
            f"{runners} · restarts {f['restarts']}"
        )
        self._progress.update(self._task, completed=snap.env_steps)

    def log(self, message: str) -> None:
        self._live.console.print(message, highlight=False, markup=False)


def make_progress(
    description: str, total: int | None, *, initial: int = 0, live: bool | None = None
) -> Any:
    """A progress display: rich on an interactive terminal (if installed), else plain lines.

    Args:
        description: Left-hand label (e.g. ``"CartPole-v1 ppo"``).
        total: The step budget the bar fills towards (None: no bar length).
        initial: Steps already done (a resumed run).
        live: Force (True) or refuse (False) the live bar; None: only on a TTY.
    """
    if live is None:
        live = sys.stdout.isatty()
    if live:
        try:
            return _RichProgress(description, total, initial)
        except ImportError:
            pass
    return _PlainProgress(description, total)
