"""``metrics.csv`` (one row per training iteration) and the learning-curve PNG.

Why: the two artefacts a user looks at after ``envrunners train``. The CSV is
appended to row by row (flushed), so it survives Ctrl-C and a resumed run
continues the same file; the PNG is redrawn from the CSV, so it always shows the
whole run, resumes included.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

__all__ = ["METRIC_COLUMNS", "MetricsCSV", "plot_learning_curve"]

#: Columns of ``metrics.csv``, in order.
METRIC_COLUMNS = (
    "iteration",
    "env_steps",
    "episodes",
    "time_s",
    "steps_per_s",
    "episode_return_mean",
    "episode_return_min",
    "episode_return_max",
    "episode_len_mean",
    "healthy_runners",
    "restarts",
    "policy_loss",
    "vf_loss",
    "entropy",
    "mean_kl",
    "explained_variance",
    "lr",
)


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return value


class MetricsCSV:
    """Append-only ``metrics.csv`` writer; writes the header only into a new file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = open(self.path, "a", newline="")  # noqa: SIM115 - closed in close()
        self._writer = csv.DictWriter(self._file, fieldnames=METRIC_COLUMNS, extrasaction="ignore")
        if new:
            self._writer.writeheader()
            self._file.flush()

    def write(self, row: dict[str, Any]) -> None:
        """Append one row (missing columns stay empty) and flush it to disk."""
        self._writer.writerow({k: _cell(v) for k, v in row.items()})
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def read_metrics(path: str | Path) -> list[dict[str, str]]:
    """The rows of a ``metrics.csv`` as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def plot_learning_curve(
    csv_path: str | Path, png_path: str | Path, *, title: str, target: float | None = None
) -> Path | None:
    """Draw mean return (and min/max band) over env steps from ``csv_path`` into ``png_path``.

    Returns:
        The PNG path, or None when matplotlib is missing or there is no row yet.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = read_metrics(csv_path)
    points = [
        (
            float(r["env_steps"]),
            float(r["episode_return_mean"]),
            float(r["episode_return_min"] or r["episode_return_mean"]),
            float(r["episode_return_max"] or r["episode_return_mean"]),
        )
        for r in rows
        if r.get("episode_return_mean")
    ]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if points:
        steps, mean, low, high = zip(*points)
        ax.fill_between(steps, low, high, alpha=0.2, label="min-max of the iteration's episodes")
        ax.plot(steps, mean, linewidth=2, label="mean return (last 20 episodes)")
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out = Path(png_path)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out)
    return out
