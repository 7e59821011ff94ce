"""``envrunners sample``: collect experience with a random or checkpointed policy.

Why: the quickest way to see the runners work on an env (single- or
multi-agent), measure throughput, and record offline data. It builds an
``EnvRunnerGroup`` (in-process, or remote runners on an embedded local Ray),
samples ``--timesteps`` env steps with ``synchronous_parallel_sample``, prints a
summary table and, with ``--output``, writes every episode chunk as JSON lines
(``envrunners.offline.episode_writer``; read them back with ``read_episodes`` or
``JsonReader``).

Multi-agent ``--env`` forms: a gymnasium id (each of ``--num-agents`` agents plays
its own copy, ``make_multi_agent``), a PettingZoo module (``pettingzoo.classic.
rps_v2``: its ``parallel_env()`` or ``env()``) or ``module:factory`` (any callable
returning a ``MultiAgentEnv`` or PettingZoo env; the current directory is importable).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from envrunners._cli import arguments, atari_env, input_checks
from envrunners._cli.embedded_ray import embedded_ray, quiet_loggers
from envrunners._cli.train import model_config
from envrunners._cli.train_checkpoint import load_checkpoint
from envrunners.errors import CliError

__all__ = ["add_sample_parser", "run_sample"]


def add_sample_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add ``sample`` to the subparsers ``sub``."""
    p = sub.add_parser(
        "sample",
        parents=parents,
        help="collect experience (random or checkpointed policy), print a summary, record JSON",
        description="Sample an env with EnvRunnerGroup and print episodes, return stats and "
        "throughput; optionally record the episodes as JSON offline files.",
    )
    p.add_argument("--env", required=True, help="gymnasium id (or multi-agent spec, see docs)")
    p.add_argument("--multi-agent", action="store_true", help="use MultiAgentEnvRunner")
    p.add_argument(
        "--num-agents", type=arguments.positive_int, default=2, help="agents for a gym id (2)"
    )
    arguments.add_runner_arguments(p, num_env_runners=0, num_envs_per_env_runner=8)
    p.add_argument(
        "--timesteps", type=arguments.positive_int, default=10_000, help="env steps (10000)"
    )
    p.add_argument("--output", metavar="DIR", help="record episodes as JSON lines into DIR")
    p.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="act with the policy of an `envrunners train` run (default: random actions)",
    )
    p.add_argument(
        "--greedy", action="store_true", help="with --checkpoint: best action, no exploration"
    )
    p.add_argument("--seed", type=arguments.non_negative_int, help="env seed")
    p.set_defaults(func=run_sample)
    return p


# ---------------------------------------------------------------------- configs
class PerAgentModules:
    """Policy mapping: agent ``a`` -> module ``agent_<a>`` (picklable, unlike a lambda)."""

    def __call__(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> str:
        return f"agent_{agent_id}"


def _import_module_attr(spec: str) -> Any:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise CliError(f"--env {spec!r}: cannot import {module_name!r} ({err})") from None
    if not attr:
        for name in ("parallel_env", "env"):
            if hasattr(module, name):
                return getattr(module, name)
        raise CliError(f"--env {spec!r}: module has no parallel_env() or env() factory")
    if not hasattr(module, attr):
        raise CliError(f"--env {spec!r}: module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


class _CallFactory:
    """Env creator calling a zero-arg PettingZoo factory or a ``factory(config)``."""

    def __init__(self, factory: Any):
        self.factory = factory

    def __call__(self, config: Any = None) -> Any:
        try:
            return self.factory(config)
        except TypeError:
            return self.factory()


def multi_agent_env(spec: str, num_agents: int) -> tuple[Any, dict, list]:
    """``(env, env_config, agent_ids)`` for a multi-agent ``--env`` value."""
    import gymnasium as gym

    from envrunners.env.multi_agent_env import make_multi_agent

    if ":" in spec or ("." in spec and spec not in gym.registry):
        env = _CallFactory(_import_module_attr(spec))
        env_config: dict = {}
    else:
        input_checks.check_env_id(spec)
        env, env_config = make_multi_agent(spec), {"num_agents": num_agents}
    try:
        probe = env(dict(env_config))
        agents = list(getattr(probe, "possible_agents", None) or probe.get_agent_ids())
        probe.close()
    except CliError:
        raise
    except Exception as err:
        raise CliError(f"cannot create env {spec!r}: {type(err).__name__}: {err}", 1) from None
    return env, env_config, agents


def build_config(args: argparse.Namespace, run: dict | None) -> Any:
    """The config of a ``sample`` call (``run``: a checkpoint's training settings)."""
    from envrunners.algorithms.ppo import PPOConfig

    runners, envs = args.num_env_runners, args.num_envs_per_env_runner
    fragment = min(1000, max(1, math.ceil(args.timesteps / (max(1, runners) * envs))))
    config = PPOConfig().env_runners(
        num_env_runners=runners,
        num_envs_per_env_runner=envs,
        rollout_fragment_length=fragment,
        explore=not args.greedy,
    )
    if args.multi_agent:
        env, env_config, agents = multi_agent_env(args.env, args.num_agents)
        mapping = PerAgentModules()
        config = config.environment(env, env_config=env_config).multi_agent(
            policies={mapping(a) for a in agents}, policy_mapping_fn=mapping
        )
    else:
        if atari_env.is_atari_id(args.env):
            atari_env.ensure_ale()
        input_checks.check_env_id(args.env)
        input_checks.probe_env(args.env)
        config = config.environment(atari_env.config_env(args.env))
    if run is not None:
        config = config.env_runners(observation_filter=run.get("obs_filter", "NoFilter"))
        config = config.rl_module(model_config=model_config({"hidden": [64], **run}))
    return config.debugging(seed=args.seed)


# ---------------------------------------------------------------------- the command
def run_sample(args: argparse.Namespace) -> int:
    """Entry point of ``envrunners sample``; returns the exit code."""
    saved = None
    if args.checkpoint:
        if args.multi_agent:
            raise CliError("--checkpoint works with single-agent envs only (no --multi-agent)")
        saved = load_checkpoint(Path(args.checkpoint), "--checkpoint")
    elif args.greedy:
        raise CliError("--greedy needs --checkpoint (random actions have no greedy mode)")
    out = (
        input_checks.prepare_output_dir(args.output, "--output directory") if args.output else None
    )
    config = build_config(args, saved["run"] if saved else None)
    if not args.multi_agent and atari_env.wrapping_note(args.env):
        print(f"Sampling {args.env}{atari_env.wrapping_note(args.env)}.", flush=True)
    debug = bool(getattr(args, "debug", False))
    ray_ctx: Any = embedded_ray(args.num_env_runners, debug=debug) if args.num_env_runners else None
    import contextlib

    with ray_ctx or contextlib.nullcontext():
        stats = _collect(args, config, saved, out, debug)
    _print_summary(args, stats)
    return 0


def _collect(args: argparse.Namespace, config: Any, saved: dict | None, out: Path | None,
             debug: bool) -> dict[str, Any]:  # fmt: skip
    from envrunners.env.env_runner_group import EnvRunnerGroup
    from envrunners.execution.rollout_ops import synchronous_parallel_sample

    writer = None
    if out is not None:
        from envrunners.offline.episode_writer import EpisodeWriter

        writer = EpisodeWriter(str(out))
    group = EnvRunnerGroup(config=config)
    partial: dict[str, float] = {}
    lengths: dict[str, int] = {}
    returns: list[float] = []
    episode_lens: list[int] = []
    env_steps = agent_steps = 0
    try:
        if saved is not None:
            _load_policy(group, saved)
        start = time.perf_counter()
        while env_steps < args.timesteps:
            episodes = synchronous_parallel_sample(
                worker_set=group,
                max_env_steps=args.timesteps - env_steps,
                random_actions=saved is None,
            )
            for e in episodes:
                env_steps += len(e)
                agent_steps += e.agent_steps()
                partial[e.id_] = partial.get(e.id_, 0.0) + float(e.get_return())
                lengths[e.id_] = lengths.get(e.id_, 0) + len(e)
                if e.is_done:
                    returns.append(partial.pop(e.id_))
                    episode_lens.append(lengths.pop(e.id_))
            if writer is not None:
                writer.write(episodes)
        elapsed = time.perf_counter() - start
    finally:
        with quiet_loggers(not debug):
            group.stop()
        if writer is not None:
            writer.close()
    return {
        "env_steps": env_steps,
        "agent_steps": agent_steps,
        "returns": returns,
        "lengths": episode_lens,
        "seconds": elapsed,
        "files": writer.published_files if writer is not None else [],
        "policy": "random" if saved is None else f"checkpoint {args.checkpoint}",
    }


def _load_policy(group: Any, saved: dict) -> None:
    """Put a train checkpoint's weights and filter state into every runner."""
    state = dict(saved.get("env_runner", {}))
    state.pop("num_env_steps_sampled_lifetime", None)
    state["rl_module"] = saved["learner"]["rl_module"]
    state["weights_seq_no"] = 0
    try:
        group.foreach_env_runner("set_state", kwargs={"state": state})
    except ValueError as err:
        raise CliError(f"--checkpoint does not fit this env: {str(err).splitlines()[0]}") from None


def _print_summary(args: argparse.Namespace, s: dict[str, Any]) -> None:
    returns = s["returns"]
    rows: list[tuple[str, str]] = [
        ("env", args.env + (" (multi-agent)" if args.multi_agent else "")),
        ("policy", s["policy"]),
        (
            "runners",
            "in-process"
            if args.num_env_runners == 0
            else f"{args.num_env_runners} remote (local Ray)",
        ),
        ("envs per runner", str(args.num_envs_per_env_runner)),
        ("env steps", f"{s['env_steps']:,}"),
    ]
    if args.multi_agent:
        rows.append(("agent steps", f"{s['agent_steps']:,}"))
    rows.append(("episodes finished", f"{len(returns):,}"))
    rows += return_rows(returns, s["lengths"])
    rate = s["env_steps"] / max(1e-9, s["seconds"])
    rows += [
        ("sampling time", f"{s['seconds']:.2f} s"),
        ("throughput", f"{rate:,.0f} env steps/s"),
    ]
    if s["files"]:
        rows.append(("recorded", f"{len(s['files'])} file(s) in {args.output}"))
    print_table(f"envrunners sample: {args.env}", ("", ""), rows)


def print_table(
    title: str, header: tuple[str, ...], rows: list[tuple[str, ...]], *, text_columns: int = 99
) -> None:
    """A rich table if rich is installed, else aligned plain text.

    Args:
        title: Printed above the table.
        header: Column names.
        rows: Cell texts.
        text_columns: The first this many columns are left-aligned, the rest
            (numbers) right-aligned.
    """
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        print(title)
        for row in [header, *rows]:
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
        return
    table = Table(title=title, title_justify="left", show_header=any(header))
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i < text_columns else "right")
    for row in rows:
        table.add_row(*row)
    console = Console()
    if not console.is_terminal:  # logs and pipes: wide enough not to wrap the numbers
        console = Console(width=120)
    console.print(table)


def return_rows(returns: list[float], lengths: list[int]) -> list[tuple[str, str]]:
    """Summary-table rows of finished episodes: return mean ± std, min / max, mean length."""
    if not returns:
        return []
    std = statistics.pstdev(returns) if len(returns) > 1 else 0.0
    return [
        ("return mean ± std", f"{statistics.fmean(returns):.2f} ± {std:.2f}"),
        ("return min / max", f"{min(returns):.2f} / {max(returns):.2f}"),
        ("episode length mean", f"{statistics.fmean(lengths):.1f}"),
    ]
