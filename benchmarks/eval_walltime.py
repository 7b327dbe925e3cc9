"""Evaluation wall time: the scripted policy on the test split, end to end, as a user runs it
(``python -m eval.run --model scripted --split test --setups all --tries 50 --workers 2``), timed from
the command's start to its exit: worker start-up, every try, the report.

    python -m benchmarks.eval_walltime                    # the whole test split: 1,500 tries (about 10 min)
    python -m benchmarks.eval_walltime --tries 1 --setups A01,B01   # a dry run
    python -m benchmarks.eval_walltime --quick            # = --tries 1 --setups A01

The run goes into a fresh folder (``--keep`` keeps it); the JSON has the wall time, tries/s, the outcome
(successes, S) and the runner's per-stage step profile from the run's summary.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from benchmarks.common import ROOT, BenchmarkError, machine, parser, print_table, run_main, write_result

NAME = "eval_walltime"
MODULE = "benchmarks.eval_walltime"
FULL_TRIES = 50  # tries per setup of the test split


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(MODULE, __doc__.split("\n\n")[0])
    p.add_argument("--tries", type=int, help=f"tries per setup (default {FULL_TRIES}, the whole split; quick: 1)")
    p.add_argument("--setups", help="setups as eval.run takes them (default all; quick: A01)")
    p.add_argument("--workers", type=int, default=2, help="eval.run --workers (default 2)")
    p.add_argument("--executor", default="local", choices=("local", "ray"), help="eval.run --executor (default local)")
    p.add_argument("--split", default="test", help="task list (default test)")
    p.add_argument("--run-dir", help="eval.run's output folder (default a temporary one, removed afterwards)")
    p.add_argument("--keep", action="store_true", help="keep the temporary run folder")
    args = p.parse_args(argv)
    tries = args.tries if args.tries is not None else (1 if args.quick else FULL_TRIES)
    setups = args.setups or ("A01" if args.quick else "all")
    if tries < 1 or args.workers < 1:
        raise BenchmarkError(f"--tries and --workers must be at least 1, got {tries} and {args.workers}")
    mach = machine()
    tmp = None
    if args.run_dir:
        run_dir = Path(args.run_dir)
    else:
        tmp = tempfile.mkdtemp(prefix="sab_eval_walltime_")
        run_dir = Path(tmp) / "run"
    cmd = [sys.executable, "-m", "eval.run", "--model", "scripted", "--split", args.split, "--setups", setups,
           "--tries", str(tries), "--workers", str(args.workers), "--out", str(run_dir), "--fresh"]
    if args.executor != "local":
        cmd += ["--executor", args.executor]
    shown = shlex.join(["python", *cmd[1:]])
    print(f"running: {shown}", file=sys.stderr)
    t0 = time.monotonic()
    # eval.run's own progress bar is the progress shown (stderr passes through unless --no-progress)
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                          stderr=subprocess.DEVNULL if args.no_progress else None)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise BenchmarkError(f"eval.run exited with {proc.returncode}: {shown}")
    summary = json.loads((run_dir / "summary.json").read_text())
    n = summary["n_tries"]
    k = sum(v["k"] for v in summary["setups"].values())
    sec = summary.get("secondary", {})
    results = {
        "eval_run_command": shown, "split": args.split, "setups": setups, "tries_per_setup": tries,
        "workers": args.workers, "executor": args.executor, "n_tries": n, "successes": k,
        "S": summary.get("S"), "wall_s": round(wall, 2), "tries_per_s": round(n / wall, 4),
        "s_per_try": round(wall / n, 3), "wall_s_inside_eval_run": summary.get("run", {}).get("wall_s_this_session"),
        "step_ms_mean": sec.get("step_ms"), "mean_completion_s": sec.get("mean_completion_s"),
    }
    print_table(f"scripted on {args.split}, end to end ({args.workers} workers, {args.executor})",
                ["tries", "successes", "S", "wall s", "tries/s", "s per try"],
                [[n, k, results["S"], results["wall_s"], results["tries_per_s"], results["s_per_try"]]])
    write_result(NAME, args.out_dir, MODULE, argv, args.quick, results, mach)
    if tmp and not args.keep:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    elif tmp:
        print(f"run kept in {run_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None))
