"""What every benchmark shares: the machine it ran on, the command that reproduces it, timing statistics,
a printed table, its rows as they finish (RowLog) and the JSON file under ``results/benchmarks/``.

Numbers are only worth committing from a quiet machine: every result carries the load average at its
start and end, so a reader can tell a loaded run from a clean one.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from env.appearance import APPEARANCE_VERSION

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "results" / "benchmarks"
QUICK_DIR = ROOT / "runs" / "benchmarks"  # --quick dry runs: their numbers mean nothing, so never under results/
SCHEMA = "shape-assembly-bench/benchmark/1"


class BenchmarkError(RuntimeError):
    """Bad input or a part that cannot run here (one line)."""


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # not on every OS
        return None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine() -> dict[str, Any]:
    """eval.records.machine_info, the cores this process may use, and the 1/5/15-minute load average now."""
    from eval.records import machine_info

    return {**machine_info(), "usable_cores": usable_cores(), "load_average_start": load_average()}


def command(module: str, argv: Sequence[str] | None) -> str:
    """The command line that reproduces this run."""
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", "-m", module, *args])


def parser(module: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    p.add_argument("--quick", action="store_true", help="a dry run of a few seconds to check the benchmark "
                   "works; its numbers mean nothing")
    p.add_argument("--out-dir", default=None, help=f"where the JSON goes (default {RESULTS_DIR}; with --quick "
                   f"{QUICK_DIR}, and never under results/)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def stats_ms(samples_ms: Sequence[float]) -> dict[str, float | int | None]:
    """n, mean, p50, p99, min, max of a list of milliseconds (None when empty)."""
    x = np.asarray(samples_ms, np.float64)
    if x.size == 0:
        return {"n": 0, "mean": None, "p50": None, "p99": None, "min": None, "max": None}
    return {"n": int(x.size), "mean": round(float(x.mean()), 4), "p50": round(float(np.percentile(x, 50)), 4),
            "p99": round(float(np.percentile(x, 99)), 4), "min": round(float(x.min()), 4),
            "max": round(float(x.max()), 4)}


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A rich table when rich is installed, else plain aligned text."""
    cells = [[_cell(v) for v in r] for r in rows]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(columns)]
        print(f"\n{title}")
        print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
        for r in cells:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
        return
    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in cells:
        table.add_row(*r)
    Console(width=None if sys.stdout.isatty() else 160).print(table)  # piped: not rich's 80 columns


def result_path(name: str, out_dir: str | Path | None, quick: bool, suffix: str = ".json") -> Path:
    """<out>/<name>[.quick]<suffix>, its folder made; a --quick result under results/ is a BenchmarkError."""
    out = Path(out_dir) if out_dir is not None else (QUICK_DIR if quick else RESULTS_DIR)
    if quick and (ROOT / "results") in (out.resolve(), *out.resolve().parents):
        raise BenchmarkError(f"--quick results mean nothing and never go under {ROOT / 'results'}: "
                             f"pass another --out-dir (default {QUICK_DIR})")
    out.mkdir(parents=True, exist_ok=True)
    return out / f"{name}{'.quick' if quick else ''}{suffix}"


def json_default(x: Any):
    """numpy scalars and arrays as their Python values; anything else as its str."""
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


class JsonLines:
    """One JSON object a line, each flushed and synced as it is written: a process killed at any moment leaves
    every line it finished (at most a torn last one, which read_json_lines skips)."""

    def __init__(self, path: str | Path, mode: str = "a"):
        self.path = Path(path)
        self._f = open(self.path, mode)

    def write(self, doc: dict) -> None:
        self._f.write(json.dumps(doc, default=json_default) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def read_json_lines(path: str | Path) -> list[dict]:
    """The objects of a JSON-lines file (none if it is absent); a line cut by a kill is skipped."""
    rows = []
    path = Path(path)
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


ROWS_SUFFIX = ".rows.jsonl"


class RowLog:
    """A benchmark's rows as each finishes: <out>/<name>[.quick].rows.jsonl, one JSON line a row, written anew by
    each run. A run killed on the way (the device check's step timeout) leaves its finished rows there, and
    benchmarks.device_check puts them in the step's record; write_result removes the file once the result JSON,
    which holds every row, is in place."""

    def __init__(self, name: str, out_dir: str | Path | None, quick: bool):
        self._lines = JsonLines(result_path(name, out_dir, quick, ROWS_SUFFIX), "w")
        self.path = self._lines.path
        self.rows: list[dict] = []

    def append(self, row: dict) -> dict:
        self._lines.write(row)
        self.rows.append(row)
        return row

    def remove(self) -> None:
        self._lines.close()
        self.path.unlink(missing_ok=True)


def write_result(name: str, out_dir: str | Path | None, module: str, argv: Sequence[str] | None, quick: bool,
                 results: dict[str, Any], mach: dict[str, Any], row_log: RowLog | None = None) -> Path:
    """results/benchmarks/<name>.json, or runs/benchmarks/<name>.quick.json for a dry run (never under
    results/, where committed results live), with the machine, the load average at start and end, and the
    reproducing command. ``row_log``: the run's RowLog, removed once the JSON is written."""
    path = result_path(name, out_dir, quick)
    doc = {
        "schema": SCHEMA,
        "benchmark": name,
        "quick": quick,
        "command": command(module, argv),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {**mach, "load_average_end": load_average()},
        "appearance_version": APPEARANCE_VERSION,  # what camera frames rendered (env.appearance)
        "results": results,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
    if row_log is not None:
        row_log.remove()
    print(f"wrote {path}")
    return path


def run_main(fn, argv: Sequence[str] | None) -> int:
    """Run a benchmark's main: a BenchmarkError (or a missing optional module) is one line and exit 2."""
    from engines.optional import MissingDependencyError

    try:
        return fn(argv)
    except (BenchmarkError, MissingDependencyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def progress(iterable=None, total=None, desc=None, disable=False):
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, disable=disable, leave=False, unit="it")
