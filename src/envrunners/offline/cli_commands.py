"""``envrunners offline info | convert | recover``: look at offline files and convert them.

Why: people who record offline data need to see what is in it (records, steps,
columns with dtype and shape, corrupt or pickled lines, unfinished files) and to
take it elsewhere: Parquet for pandas/polars/DuckDB and RLlib's new stack, our
pickle-free JSON for RLlib files with cloudpickle columns, Minari and D4RL HDF5 for
other offline-RL code. ``convert`` reads its output back and checks that the steps
match. Nothing here unpickles unless ``--allow-pickle``.

Run it today as ``python -m envrunners.offline.cli_commands info PATH``; the
``envrunners`` CLI mounts the same commands with :func:`add_offline_subcommands`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from typing import Any

import numpy as np

from envrunners.errors import OfflineDataError, PickleNotAllowedError
from envrunners.offline import _plain_data
from envrunners.offline._input_files import iter_lines, parse_line, resolve_inputs
from envrunners.offline._rolling_file import TMP_SUFFIX, recover_partial_files
from envrunners.offline.json_codec import loads
from envrunners.policy.sample_batch import MultiAgentBatch, SampleBatch

__all__ = ["add_offline_subcommands", "main", "offline_convert", "offline_info", "offline_recover"]

_MAX_ERRORS = 10


def _describe(value: Any) -> dict[str, Any]:
    """dtype/shape/format of one column value without decoding arrays."""
    if isinstance(value, str):
        if value.startswith(_plain_data.ARRAY_PREFIX):
            _, codec, dtype, shape, _ = value.split(":", 4)
            dims = [int(d) for d in shape.split(",")] if shape else []
            return {"format": f"codec/{codec}", "dtype": dtype, "shape": dims}
        return {"format": "rllib-cloudpickle (refused unless allow_pickle)"}
    if isinstance(value, list):
        return {"format": "list", "shape": [len(value)]}
    if isinstance(value, dict):
        if len(value) == 1 and next(iter(value)) in _plain_data.TAGS:
            tag, payload = next(iter(value.items()))
            if tag == "__objects__":
                return {"format": "objects", "shape": list(payload[0])}
            return {"format": tag.strip("_")}
        return {"format": "nested", "keys": sorted(value)}
    return {"format": type(value).__name__}


def _rows(cols: dict[str, Any]) -> int:
    for key, value in cols.items():
        if key in ("type", "infos", "seq_lens") or key.startswith("state_"):
            continue
        shape = _describe(value).get("shape")
        if shape:
            return int(shape[0])
    return 0


def _add_columns(into: dict[str, Any], cols: dict[str, Any], prefix: str = "") -> None:
    for key, value in cols.items():
        name = prefix + str(key)
        if key == "type" and not prefix or name in into:
            continue
        d = _describe(value)
        if d["format"] == "nested":
            _add_columns(into, value, name + ".")
        else:
            into[name] = d


def offline_info(path: str | list[str]) -> dict[str, Any]:
    """Summarise offline files: records per type, steps, columns, problems.

    Arrays are not decoded (dtype and shape come from the codec header) and nothing
    is unpickled, so this is safe on untrusted files and fast on large ones.

    Returns:
        A JSON-able dict (``format_info`` renders it as text).

    Raises:
        OfflineInputNotFoundError: if ``path`` matches no file.
    """
    files = resolve_inputs(path, "offline info")
    info: dict[str, Any] = {
        "files": files,
        "num_files": len(files),
        "total_bytes": sum(os.path.getsize(f) for f in files if os.path.exists(f)),
        "records": {},
        "env_steps": 0,
        "agent_steps": 0,
        "columns": {},
        "policies": {},
        "num_corrupt_lines": 0,
        "errors": [],
    }
    records: Counter[str] = Counter()
    dirs = {os.path.dirname(f) for f in files}
    info["unfinished_files"] = sorted(
        os.path.join(d, n) for d in dirs for n in os.listdir(d) if n.endswith(".json" + TMP_SUFFIX)
    )
    for f in files:
        for where, lineno, line in iter_lines(f):
            if not line.strip():
                continue
            # A record of the wrong shape (a list where a dict belongs, ...) is a corrupt
            # line like an unparsable one: counted and named, never a crash.
            step_counts = (info["env_steps"], info["agent_steps"])
            try:
                kind = _summarise_record(info, loads(line))
            except Exception as e:
                info["env_steps"], info["agent_steps"] = step_counts
                info["num_corrupt_lines"] += 1
                if len(info["errors"]) < _MAX_ERRORS:
                    info["errors"].append(f"{where}:{lineno}: {type(e).__name__}: {e}")
                continue
            records[kind] += 1
    info["records"] = dict(records)
    return info


def _summarise_record(info: dict[str, Any], rec: Any) -> str:
    """Add one decoded record's steps, columns and policies to ``info``; return its type."""
    kind = rec["type"]
    if kind == "SampleBatch":
        n = _rows(rec)
        info["env_steps"] += n
        info["agent_steps"] += n
        _add_columns(info["columns"], rec)
    elif kind == "MultiAgentBatch":
        info["env_steps"] += int(rec.get("count", 0))
        for pid, cols in (rec.get("policy_batches") or {}).items():
            pol = info["policies"].setdefault(str(pid), {"agent_steps": 0, "columns": {}})
            n = _rows(cols)
            pol["agent_steps"] += n
            info["agent_steps"] += n
            _add_columns(pol["columns"], cols)
    elif kind in ("SingleAgentEpisode", "MultiAgentEpisode"):
        state = rec.get("state") or {}
        t0, t1 = ("t_started", "t") if kind == "SingleAgentEpisode" else ("env_t_started", "env_t")
        n = int(state.get(t1, 0)) - int(state.get(t0, 0))
        info["env_steps"] += n
        info["agent_steps"] += n
    return str(kind)


def format_info(info: dict[str, Any]) -> str:
    """Render :func:`offline_info` output as human-readable text."""
    lines = [
        f"files:        {info['num_files']} ({info['total_bytes'] / 1e6:.2f} MB)",
        f"records:      {', '.join(f'{k}={v}' for k, v in info['records'].items()) or 'none'}",
        f"env steps:    {info['env_steps']}",
        f"agent steps:  {info['agent_steps']}",
    ]

    def columns(cols: dict[str, Any], indent: str) -> None:
        for name, d in cols.items():
            shape = d.get("shape")
            lines.append(
                f"{indent}{name:<24} {d.get('dtype', ''):<8} "
                f"{'x'.join(map(str, shape)) if shape else '':<12} {d['format']}"
            )

    if info["columns"]:
        lines.append("columns (name, dtype, shape of the first record, format):")
        columns(info["columns"], "  ")
    for pid, pol in info["policies"].items():
        lines.append(f"policy {pid!r}: {pol['agent_steps']} agent steps")
        columns(pol["columns"], "  ")
    if info["num_corrupt_lines"]:
        lines.append(f"corrupt lines: {info['num_corrupt_lines']}")
        lines.extend("  " + e for e in info["errors"])
    if info["unfinished_files"]:
        lines.append(
            f"unfinished files (a writer still running, or killed; see `recover`): "
            f"{len(info['unfinished_files'])}"
        )
        lines.extend("  " + f for f in info["unfinished_files"])
    return "\n".join(lines)


def _default_out(path: Any, to: str) -> str:
    first = path if isinstance(path, str) else path[0]
    base = first.rstrip("/") if os.path.isdir(first) else os.path.dirname(os.path.abspath(first))
    return os.path.join(base, to)


FORMATS = ("json", "parquet", "parquet-episodes", "minari", "d4rl")
_CORE = ("obs", "actions", "rewards", "terminateds", "truncateds")


def detect_format(path: str | list[str]) -> str:
    """Guess the format of an offline input: ``json``, ``parquet``, ``minari`` or ``d4rl``.

    Raises:
        OfflineInputNotFoundError: if ``path`` is neither a file, a directory nor a glob.
    """
    first = os.path.expanduser(path if isinstance(path, str) else path[0])
    if first.lower().endswith((".hdf5", ".h5", ".he5")):
        return "d4rl"
    if first.lower().endswith(".parquet"):
        return "parquet"
    if os.path.isdir(first):
        if any(os.path.isfile(os.path.join(first, *p, "metadata.json")) for p in [[], ["data"]]):
            return "minari"
        for _, _, names in os.walk(first):
            if any(n.endswith(".parquet") for n in names):
                return "parquet"
    return "json"


def offline_convert(
    path: str | list[str],
    to: str = "parquet",
    out: str | None = None,
    *,
    allow_pickle: bool = False,
    skip_corrupt: bool = False,
    source: str | None = None,
    dataset_id: str = "envrunners/converted-v0",
    check: bool = True,
) -> list[str]:
    """Convert offline data between JSON, Parquet (steps or episodes), Minari and D4RL HDF5.

    Args:
        path: Input files, glob or directory (a Minari dataset directory or local id).
        to: ``"parquet"`` (one row per step: ``<out>/<policy id>.parquet``; single-agent
            data is ``default_policy``), ``"parquet-episodes"`` (RLlib's episode layout,
            one episode per row), ``"json"`` (pickle-free JSON lines, e.g. from RLlib
            files), ``"minari"`` (dataset ``dataset_id`` under ``out``) or ``"d4rl"``
            (``<out>/dataset.hdf5``).
        out: Output directory (default: ``<input dir>/<to>``).
        allow_pickle: Read RLlib cloudpickle columns (runs code from the file!).
        skip_corrupt: Skip corrupt JSON lines instead of failing.
        source: The input format (default: guessed by :func:`detect_format`).
        dataset_id: The Minari dataset id written with ``to="minari"``.
        check: Read the written data back and check that its steps (obs, actions,
            rewards, terminateds, truncateds) equal the input's.

    Returns:
        The written files (the dataset directory for Minari). Files are complete or
        absent: they are written under a temporary name and renamed at the end.

    Raises:
        OfflineDataError: for a corrupt input, a pickled column without
            ``allow_pickle``, columns that change between records, or rows that do
            not match after conversion.
        ValueError: for an unknown ``to`` or ``source``.
    """
    if to not in FORMATS:
        raise ValueError(
            f"offline convert: to must be 'parquet' or 'json' (or 'parquet-episodes', "
            f"'minari', 'd4rl'), got {to!r}"
        )
    source = source or detect_format(path)
    if source not in ("json", "parquet", "minari", "d4rl"):
        raise ValueError(
            f"offline convert: source must be 'json', 'parquet', 'minari' or 'd4rl', got {source!r}"
        )
    out = os.path.abspath(out or _default_out(path, to))
    if source == "json" and to in ("json", "parquet"):
        files = resolve_inputs(path, "offline convert")
        batches = _iter_batches(files, allow_pickle, skip_corrupt)
        if to == "json":
            from envrunners.offline.json_writer import JsonWriter

            with JsonWriter(out) as writer:
                for _, batch in batches:
                    writer.write(batch)
            written = writer.published_files
        else:
            written = _to_parquet(batches, out)
    else:
        written = _write(
            to, _step_columns(path, source, allow_pickle, skip_corrupt), out, dataset_id
        )
    if check and written:
        _check_same_steps(path, source, written, to, allow_pickle, skip_corrupt)
    return written


def _step_columns(path: Any, source: str, allow_pickle: bool, skip_corrupt: bool) -> Any:
    """Yield single-agent step columns (dicts of arrays) read from ``path``."""
    if source == "json":
        for where, batch in _iter_batches(
            resolve_inputs(path, "offline convert"), allow_pickle, skip_corrupt
        ):
            if isinstance(batch, MultiAgentBatch):
                if set(batch.policy_batches) != {"default_policy"}:
                    raise OfflineDataError(
                        "multi-agent batches convert to 'parquet' or 'json' only", path=where
                    )
                batch = batch.policy_batches["default_policy"]
            yield {k: v for k, v in dict.items(batch) if k != SampleBatch.SEQ_LENS}
    elif source == "parquet":
        from envrunners.offline.parquet_reader import read_parquet_batches

        for batch in read_parquet_batches(path, allow_pickle=allow_pickle):
            yield dict(dict.items(batch))
    elif source == "minari":
        from envrunners.offline._parquet import episode_batch
        from envrunners.offline.minari_io import read_minari_episodes

        for ep in read_minari_episodes(path if isinstance(path, str) else path[0]):
            yield dict(dict.items(episode_batch(ep)))
    else:
        from envrunners.offline.d4rl_reader import load_d4rl_hdf5

        for f in resolve_inputs(path, "offline convert"):
            yield _d4rl_columns(load_d4rl_hdf5(f), f)


def _d4rl_columns(data: dict[str, Any], where: str) -> dict[str, Any]:
    n = len(data["rewards"])
    terms = np.asarray(data["terminals"]).astype(bool)
    truncs = np.asarray(data["timeouts"]).astype(bool) if "timeouts" in data else np.zeros(n, bool)
    ends = np.flatnonzero(terms | truncs)
    eps = np.searchsorted(ends, np.arange(n))  # episode k ends at row ends[k]
    cols = {
        "obs": np.asarray(data["observations"]),
        "actions": np.asarray(data["actions"]),
        "rewards": np.asarray(data["rewards"]),
        "terminateds": terms,
        "truncateds": truncs,
        "eps_id": np.array([f"d4rl-{k}" for k in eps], dtype=object),
    }
    if "next_observations" in data:
        cols["new_obs"] = np.asarray(data["next_observations"])
    return cols


def _write(to: str, stream: Any, out: str, dataset_id: str) -> list[str]:
    from envrunners.offline._parquet import episodes_from_columns

    if to == "parquet":
        return _to_parquet(
            ((f"step batch {i}", SampleBatch(cols)) for i, cols in enumerate(stream)), out
        )
    if to == "json":
        from envrunners.offline.json_writer import JsonWriter

        with JsonWriter(out) as writer:
            for cols in stream:
                writer.write(SampleBatch(cols))
        return writer.published_files
    if to == "parquet-episodes":
        from envrunners.offline.parquet_writer import ParquetEpisodeWriter

        with ParquetEpisodeWriter(out, write_episodes=True, max_rows_per_file=1000) as w:
            for cols in stream:
                w.write(episodes_from_columns(cols))
        return w.published_files
    if to == "minari":
        from envrunners.offline.minari_io import write_minari

        episodes = (ep for cols in stream for ep in episodes_from_columns(cols))
        return [write_minari(episodes, out, dataset_id)]
    return [_to_d4rl(stream, out)]


def _to_d4rl(stream: Any, out: str) -> str:
    import h5py

    parts: dict[str, list[Any]] = {}
    for cols in stream:
        for key in (*_CORE, "new_obs"):
            if cols.get(key) is not None:
                parts.setdefault(key, []).append(np.asarray(cols[key]))
    names = {"obs": "observations", "actions": "actions", "rewards": "rewards",
             "terminateds": "terminals", "truncateds": "timeouts",
             "new_obs": "next_observations"}  # fmt: skip
    os.makedirs(out, exist_ok=True)
    final = os.path.join(out, "dataset.hdf5")
    tmp = os.path.join(out, f".dataset.hdf5{TMP_SUFFIX}")
    try:
        with h5py.File(tmp, "w") as f:
            for key, chunks in parts.items():
                f.create_dataset(names[key], data=np.concatenate(chunks))
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return final


def _digest(stream: Any) -> dict[str, tuple[int, str]]:
    """Per core column: (rows, sha256 of the values as float64 / bool)."""
    import hashlib

    hashes = {k: hashlib.sha256() for k in _CORE}
    rows = dict.fromkeys(_CORE, 0)
    for cols in stream:
        for k in _CORE:
            v = cols.get(k)
            if v is None:
                continue
            v = np.asarray(v)
            v = v.astype(bool) if k in ("terminateds", "truncateds") else v.astype(np.float64)
            hashes[k].update(np.ascontiguousarray(v).tobytes())
            rows[k] += len(v)
    return {k: (rows[k], hashes[k].hexdigest()) for k in _CORE if rows[k]}


def _check_same_steps(
    path: Any, source: str, written: list[str], to: str, allow_pickle: bool, skip: bool
) -> None:
    if to == "parquet" and [os.path.basename(w) for w in written] != ["default_policy.parquet"]:
        return  # multi-agent data (one file per policy): steps are not single-agent columns
    target = {"parquet-episodes": "parquet", "minari": "minari"}.get(to, to)
    before = _digest(_step_columns(path, source, allow_pickle, skip))
    after = _digest(_step_columns(written, target, False, False))
    common = sorted(set(before) & set(after))
    bad = [k for k in common if before[k] != after[k]]
    if bad or not common:
        raise OfflineDataError(
            f"the converted data ({to}) does not match the input ({source}) in columns "
            f"{bad or 'all'}: rows before {dict((k, before[k][0]) for k in before)}, "
            f"after {dict((k, after[k][0]) for k in after)}",
            path=written[0],
        )


def _iter_batches(files: list[str], allow_pickle: bool, skip_corrupt: bool) -> Any:
    for f in files:
        for where, lineno, line in iter_lines(f):
            try:
                batch = parse_line(line, where, lineno, allow_pickle=allow_pickle)
            except PickleNotAllowedError:
                raise
            except OfflineDataError:
                if skip_corrupt:
                    continue
                raise
            if batch is not None:
                yield f"{where}:{lineno}", batch


def _to_parquet(batches: Any, out: str) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from envrunners.offline._parquet import METADATA_KEY, batch_to_table

    os.makedirs(out, exist_ok=True)
    writers: dict[str, Any] = {}
    tmp_paths: dict[str, str] = {}
    try:
        for where, batch in batches:
            parts = (
                batch.policy_batches.items()
                if isinstance(batch, MultiAgentBatch)
                else [("default_policy", batch)]
            )
            for pid, sub in parts:
                if not isinstance(sub, SampleBatch) or sub.count == 0:
                    continue
                table, meta = batch_to_table(sub)
                key = str(pid)
                if key not in writers:
                    schema = table.schema.with_metadata({METADATA_KEY: json.dumps(meta)})
                    tmp_paths[key] = os.path.join(out, f".{key}.parquet{TMP_SUFFIX}")
                    writers[key] = pq.ParquetWriter(tmp_paths[key], schema)
                writer = writers[key]
                try:
                    table = table.select(writer.schema.names).cast(writer.schema)
                except (KeyError, ValueError, pa.ArrowInvalid) as e:
                    raise OfflineDataError(
                        f"policy {key!r}: the columns differ from the first record's "
                        f"({writer.schema.names}): {e}",
                        path=where,
                    ) from None
                writer.write_table(table)
        finals = []
        for key, writer in writers.items():
            writer.close()
            final = os.path.join(out, f"{key}.parquet")
            os.replace(tmp_paths[key], final)
            finals.append(final)
        return finals
    finally:
        for key, writer in writers.items():
            if os.path.exists(tmp_paths[key]):
                writer.close()
                os.unlink(tmp_paths[key])


def offline_recover(directory: str) -> list[str]:
    """Publish the unfinished files a killed writer left in ``directory`` (complete lines only)."""
    return recover_partial_files(directory)


# ---------------------------------------------------------------------- argparse


def _cmd_info(args: argparse.Namespace) -> int:
    info = offline_info(args.path)
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    written = offline_convert(
        args.path, to=args.to, out=args.out, allow_pickle=args.allow_pickle,
        skip_corrupt=args.skip_corrupt, source=args.source, dataset_id=args.dataset_id,
        check=not args.no_check,
    )  # fmt: skip
    for path in written:
        print(path)
    return 0


def _cmd_recover(args: argparse.Namespace) -> int:
    for path in offline_recover(args.directory):
        print(path)
    return 0


def _add_commands(sub: Any) -> None:
    info = sub.add_parser("info", help="summarise offline files (records, steps, columns)")
    info.add_argument("path", nargs="+", help="files, globs or directories")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.set_defaults(func=_cmd_info)
    conv = sub.add_parser(
        "convert", help="convert offline data between JSON, Parquet, Minari and D4RL HDF5"
    )
    conv.add_argument("path", nargs="+", help="files, globs or directories")
    conv.add_argument("--to", choices=list(FORMATS), default="parquet")
    conv.add_argument(
        "--from", dest="source", choices=["json", "parquet", "minari", "d4rl"], default=None,
        help="input format (default: guessed from the path)",
    )  # fmt: skip
    conv.add_argument("--dataset-id", default="envrunners/converted-v0", help="Minari output id")
    conv.add_argument(
        "--no-check", action="store_true", help="do not re-read the output to compare its steps"
    )
    conv.add_argument("--out", default=None, help="output directory (default: <input dir>/<to>)")
    conv.add_argument(
        "--allow-pickle", action="store_true",
        help="read RLlib cloudpickle columns (runs code from the file: trusted files only)",
    )  # fmt: skip
    conv.add_argument("--skip-corrupt", action="store_true", help="skip corrupt lines")
    conv.set_defaults(func=_cmd_convert)
    rec = sub.add_parser("recover", help="publish files a killed writer left unfinished")
    rec.add_argument("directory")
    rec.set_defaults(func=_cmd_recover)


def add_offline_subcommands(subparsers: Any) -> argparse.ArgumentParser:
    """Mount ``offline info|convert|recover`` on a CLI: ``add_offline_subcommands(sub)``.

    Each leaf parser sets ``func``; dispatch with ``sys.exit(args.func(args))``.
    """
    offline = subparsers.add_parser("offline", help="inspect and convert offline data files")
    _add_commands(offline.add_subparsers(dest="offline_command", required=True))
    return offline


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m envrunners.offline.cli_commands``; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="envrunners offline", description="Inspect and convert offline data files."
    )
    _add_commands(parser.add_subparsers(dest="offline_command", required=True))
    args = parser.parse_args(argv)
    path = getattr(args, "path", None)
    if isinstance(path, list) and len(path) == 1:
        args.path = path[0]
    try:
        return args.func(args)
    except (OfflineDataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
