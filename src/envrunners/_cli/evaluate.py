"""``envrunners evaluate``: run a checkpointed policy for N episodes; print returns, record videos.

Why: after training, the question is "how good is it, and what does it do?".
The command loads an ``Algorithm`` checkpoint (``Algorithm.save_to_path``'s
directory, or a run directory with one in ``checkpoint/``), rebuilds the
algorithm with the evaluation's runner layout (``--num-env-runners``, one env
per runner), restores its state (weights and observation-filter statistics)
with ``restore_from_path``, samples ``--episodes`` whole episodes with greedy or
stochastic actions and prints a summary table. ``--video DIR`` wraps each env in
gymnasium's ``RecordVideo`` (one mp4 per episode with every frame, written with
imageio: ``_cli/video_recorder.py``; needs ``envrunners[video]``);
``--render human`` opens the env's window.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pkgutil
import sys
import time
from pathlib import Path
from typing import Any

from envrunners._cli import arguments, input_checks
from envrunners._cli.embedded_ray import embedded_ray, quiet_loggers
from envrunners._cli.sample import print_table, return_rows
from envrunners.errors import CliError, EnvRunnersError

__all__ = ["EvalEnvCreator", "add_evaluate_parser", "find_checkpoint", "run_evaluate"]

#: ``metadata.json`` format tag of ``Algorithm.save_to_path`` (``algorithms/algorithm.py``).
ALGORITHM_FORMAT = "envrunners-algorithm-checkpoint"
#: The tag of the checkpoints ``envrunners train`` wrote before it saved Algorithm checkpoints.
OLD_TRAIN_FORMAT = "envrunners-train-checkpoint"


def add_evaluate_parser(
    sub: Any, parents: list[argparse.ArgumentParser]
) -> argparse.ArgumentParser:
    """Add ``evaluate`` to the subparsers ``sub``."""
    p = sub.add_parser(
        "evaluate",
        parents=parents,
        help="run a checkpointed policy for N episodes: return table, mp4 videos, live window",
        description="Load an Algorithm checkpoint (a save_to_path directory or an `envrunners "
        "train` run directory), run --episodes episodes and print the returns.",
    )
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint or run directory")
    p.add_argument(
        "--episodes", type=arguments.positive_int, default=10, help="episodes to run (10)"
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--explore",
        dest="explore",
        action="store_true",
        default=False,
        help="sample actions from the policy's distribution",
    )
    mode.add_argument(
        "--greedy",
        dest="explore",
        action="store_false",
        help="take the most likely action (the default)",
    )
    p.add_argument(
        "--num-env-runners",
        type=arguments.non_negative_int,
        default=0,
        help="remote env runners on an embedded local Ray; 0 runs in-process (default: 0)",
    )
    p.add_argument("--seed", type=arguments.non_negative_int, help="seed of the envs")
    p.add_argument(
        "--video",
        metavar="DIR",
        help="record one mp4 per episode into DIR (gymnasium RecordVideo; needs envrunners[video])",
    )
    p.add_argument("--render", choices=["human"], help="show the env in a window (needs a display)")
    p.set_defaults(func=run_evaluate)
    return p


# ---------------------------------------------------------------------- checkpoint
def find_checkpoint(path: str | os.PathLike) -> tuple[Path, dict, dict]:
    """Resolve and read the checkpoint at ``path``; returns ``(directory, state, metadata)``.

    ``path`` is a ``save_to_path`` directory or a run directory holding one in
    ``checkpoint/``.

    Raises:
        CliError: Nothing there, not a checkpoint, unreadable, or not an
            ``Algorithm`` checkpoint (exit code 2).
    """
    from envrunners.utils.checkpoints import load_state

    given = Path(path).expanduser()
    if not given.exists():
        raise CliError(f"checkpoint {str(path)!r}: no such file or directory")
    ckpt = _checkpoint_dir(given)
    if ckpt is None:
        raise CliError(
            f"checkpoint {str(path)!r}: not a checkpoint directory (expected metadata.json, "
            "state.json and arrays.npz, as Algorithm.save_to_path writes, or a run directory "
            "with them in checkpoint/)"
        )
    try:
        state, meta = load_state(ckpt)
    except (EnvRunnersError, OSError, ValueError, KeyError, EOFError) as err:
        raise CliError(
            f"checkpoint {str(path)!r} is unreadable or corrupt: {_first(err)}"
        ) from None
    except Exception as err:  # zipfile.BadZipFile and friends from a damaged arrays.npz
        raise CliError(
            f"checkpoint {str(path)!r} is unreadable or corrupt: {type(err).__name__}: "
            f"{_first(err)}"
        ) from None
    fmt = meta.get("format")
    if fmt == OLD_TRAIN_FORMAT:
        raise CliError(
            f"checkpoint {str(path)!r} was written by an older `envrunners train` (format "
            f"{fmt!r}); act with it through `envrunners sample --checkpoint`"
        )
    if fmt != ALGORITHM_FORMAT or "algo_class" not in meta or "config" not in meta:
        raise CliError(
            f"checkpoint {str(path)!r}: metadata format {fmt!r} is not an Algorithm checkpoint "
            f"(expected {ALGORITHM_FORMAT!r}, written by Algorithm.save_to_path)"
        )
    return ckpt, state, meta


def _checkpoint_dir(given: Path) -> Path | None:
    """``given`` if it holds ``metadata.json``, else its ``checkpoint/`` or its only
    subdirectory that does (a run directory); None if there is none."""
    if (given / "metadata.json").is_file():
        return given
    if (given / "checkpoint" / "metadata.json").is_file():
        return given / "checkpoint"
    found = (
        sorted(d for d in given.iterdir() if (d / "metadata.json").is_file())
        if given.is_dir()
        else []
    )
    if len(found) > 1:
        names = ", ".join(d.name for d in found)
        raise CliError(f"checkpoint {str(given)!r}: several checkpoints in it ({names}); name one")
    return found[0] if found else None


def _resolve(meta: dict, key: str) -> Any:
    """The class a checkpoint's metadata names under ``key`` (``"module:QualName"``)."""
    name = str(meta.get(key))
    try:
        return pkgutil.resolve_name(name)
    except (ImportError, AttributeError, ValueError) as err:
        raise CliError(
            f"the checkpoint's {key} {name!r} cannot be imported: {_first(err)}"
        ) from None


def _first(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


# ---------------------------------------------------------------------- env
class EvalEnvCreator:
    """Env creator ``(env_config) -> env`` with a render mode and, optionally, ``RecordVideo``.

    Picklable (remote runners build their envs with it). Each runner's env
    records its first ``episodes`` episodes into ``video_dir`` as
    ``runner<worker index>-episode-<n>.mp4``; the reset frame is the first frame,
    so a video has episode length + 1 frames.

    Args:
        env: The checkpoint's env: a gymnasium id or an env creator.
        render_mode: ``"rgb_array"`` (videos), ``"human"`` or None.
        video_dir: Where videos go; None: no recording.
        episodes: Per worker index, how many episodes to record.
    """

    def __init__(
        self,
        env: Any,
        render_mode: str | None,
        video_dir: str | None = None,
        episodes: dict[int, int] | None = None,
    ) -> None:
        self.env = env
        self.render_mode = render_mode
        self.video_dir = video_dir
        self.episodes = dict(episodes or {})

    def __call__(self, env_config: Any = None) -> Any:
        from envrunners.env.env_context import EnvContext
        from envrunners.env.registry import resolve_env_creator

        context = (
            env_config
            if isinstance(env_config, EnvContext)
            else EnvContext(dict(env_config or {}), worker_index=0)
        )
        if self.render_mode is not None:
            context = context.copy_with_overrides(
                env_config={**context, "render_mode": self.render_mode}
            )
        env = resolve_env_creator(self.env, context)()
        if self.video_dir is None:
            return env
        from envrunners._cli.video_recorder import ExactFramesRecordVideo

        index = int(context.worker_index or 0)
        count = self.episodes.get(index, 0)
        return ExactFramesRecordVideo(
            env,
            video_folder=self.video_dir,
            name_prefix=f"runner{index}",
            episode_trigger=lambda episode_id: episode_id < count,
            disable_logger=True,
        )

    def __repr__(self) -> str:
        return f"EvalEnvCreator({self.env!r}, render_mode={self.render_mode!r})"


# ---------------------------------------------------------------------- the command
def _check_outputs(args: argparse.Namespace) -> Path | None:
    """Check ``--render``/``--video`` before anything starts; returns the video directory."""
    if args.render and args.video:
        raise CliError("--render human and --video DIR exclude each other; choose one")
    if args.render == "human" and sys.platform.startswith("linux"):
        if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            raise CliError(
                "--render human needs a display, but DISPLAY is not set "
                "(record mp4 files with --video DIR instead)"
            )
    if not args.video:
        return None
    for module in ("moviepy", "imageio_ffmpeg"):  # RecordVideo's requirement; our mp4 writer
        try:
            importlib.import_module(module)
        except ImportError:
            raise CliError(
                f"--video needs {module} (not installed): pip install 'envrunners[video]'"
            ) from None
    return input_checks.prepare_output_dir(args.video, "--video directory")


def _episode_shares(episodes: int, num_env_runners: int) -> dict[int, int]:
    """``{worker index: episodes}``: the local runner (0) alone, or remote runners 1..K."""
    if num_env_runners == 0:
        return {0: episodes}
    base, extra = divmod(episodes, num_env_runners)
    return {i: base + (1 if i <= extra else 0) for i in range(1, num_env_runners + 1)}


def _eval_config(
    meta: dict,
    args: argparse.Namespace,
    video_dir: Path | None,
    shares: dict[int, int],
    run: dict | None = None,
) -> Any:
    """The checkpoint's config with the evaluation's runners, env and exploration."""
    config_cls = _resolve(meta, "config_class")
    config = config_cls().update_from_dict(meta["config"])
    if run is not None and run.get("multi_agent"):  # env and mapping are not JSON data
        from envrunners._cli.multi_agent_training import apply_multi_agent

        if video_dir is not None:
            raise CliError("--video records single-agent envs only; this run is multi-agent")
        config = apply_multi_agent(config, run)
    if not config.env:
        raise CliError(
            "the checkpoint does not name its env (a creator that was not saved: "
            f"{meta.get('config_not_saved')}); evaluate it from Python"
        )
    render_mode = "rgb_array" if video_dir is not None else args.render
    creator = EvalEnvCreator(
        config.env, render_mode, str(video_dir) if video_dir is not None else None, shares
    )
    config.environment(creator)
    config.env_runners(
        num_env_runners=args.num_env_runners,
        num_envs_per_env_runner=1,
        explore=args.explore,
    )
    config.update_from_dict({"evaluation_interval": None, "evaluation_num_env_runners": 0})
    if args.seed is not None:
        config.debugging(seed=args.seed)
    return config


def _run_settings(ckpt: Path) -> dict | None:
    """The ``run.json`` beside an ``envrunners train`` checkpoint (None without one)."""
    import json

    file = ckpt.parent / "run.json"
    try:
        return json.loads(file.read_text()) if file.is_file() else None
    except (OSError, ValueError):
        return None


def _run_episodes(runner: Any, shares: dict[int, int], explore: bool) -> list[tuple[float, int]]:
    """Runner side: sample this runner's share of whole episodes; ``[(return, length)]``."""
    count = shares.get(int(getattr(runner, "worker_index", 0) or 0), 0)
    if count == 0:
        return []
    episodes = runner.sample(num_episodes=count, explore=explore)
    return [(float(e.get_return()), len(e)) for e in episodes if e.is_done]


def run_evaluate(args: argparse.Namespace) -> int:
    """Entry point of ``envrunners evaluate``; returns the exit code."""
    debug = bool(getattr(args, "debug", False))
    ckpt, _, meta = find_checkpoint(args.checkpoint)
    video_dir = _check_outputs(args)
    shares = _episode_shares(args.episodes, args.num_env_runners)
    run = _run_settings(ckpt)
    config = _eval_config(meta, args, video_dir, shares, run)
    if run is not None and run.get("multi_agent"):  # the table names the env; returns: sums
        meta = {**meta, "config": {**meta["config"], "env": f"{run['env']} (multi-agent)"}}
    algo_cls = _resolve(meta, "algo_class")
    ray_ctx = (
        embedded_ray(args.num_env_runners + 1, debug=debug)
        if args.num_env_runners > 0
        else contextlib.nullcontext()
    )
    with ray_ctx:
        algo = algo_cls(config=config)
        try:
            algo.restore_from_path(ckpt)
            start = time.perf_counter()
            results = algo.env_runner_group.foreach_env_runner(
                _run_episodes,
                kwargs={"shares": shares, "explore": args.explore},
                local_env_runner=args.num_env_runners == 0,
            )
            seconds = time.perf_counter() - start
        finally:
            with quiet_loggers(not debug):
                algo.stop()  # closes the envs: RecordVideo writes the last video
    episodes = [pair for part in results for pair in part]
    _print_summary(args, meta, episodes, seconds, video_dir)
    return 0


def _print_summary(
    args: argparse.Namespace,
    meta: dict,
    episodes: list[tuple[float, int]],
    seconds: float,
    video_dir: Path | None,
) -> None:
    returns = [r for r, _ in episodes]
    lengths = [n for _, n in episodes]
    env = meta["config"].get("env", "?")
    runners = args.num_env_runners
    rows: list[tuple[str, str]] = [
        ("checkpoint", str(args.checkpoint)),
        ("env", str(env)),
        ("algorithm", meta["algo_class"].rpartition(":")[2]),
        ("actions", "explore (sampled)" if args.explore else "greedy"),
        ("runners", "in-process" if runners == 0 else f"{runners} remote (local Ray)"),
        ("episodes", f"{len(returns):,}"),
    ]
    rows += return_rows(returns, lengths)
    rows.append(("time", f"{seconds:.2f} s"))
    if video_dir is not None:
        videos = sorted(video_dir.glob("*.mp4"))
        rows.append(("videos", f"{len(videos)} mp4 file(s) in {video_dir}"))
    print_table(f"envrunners evaluate: {env}", ("", ""), rows)
