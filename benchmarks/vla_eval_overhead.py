"""Tries per hour under vla-eval's harness against eval.run's, on the same tries and model, in one run.

    python -m benchmarks.vla_eval_overhead                # -> results/benchmarks/vla_eval_overhead.json
    python -m benchmarks.vla_eval_overhead --quick        # seconds: one try cut at 20 steps, numbers meaningless

One ``python -m eval.serve --model bc-state --backend ort --protocol vla-eval`` serves the model; against it run, one
after another, on the same dev tries: (1) vla-eval's own CLI, ``vla-eval run --config
configs/vla_eval/shape_assembly_bc_state.yaml --no-docker`` (the shape-assembly benchmark, eval.vla_eval_benchmark),
(2) ``eval.run --model remote --protocol vla-eval --profile bc-state`` (this project's runner and client), and
(3) ``eval.run --model bc-state`` in-process (no server) for reference. Per row: the command's wall clock (process
start to exit: imports, the server handshake, scene builds, the tries, the report) and tries per hour from it, and
the episode loop's own time per try (each record's ``wall_s``: the rollout from its first query to the try's end;
under vla-eval every query goes through its runner, so this is where the harness's overhead per step shows),
with their ratios to eval.run's. The runs' outcomes (seed, success, steps per try) must agree: a row that differs
is an error, not a number. ``results.conditions`` says whether the machine was loaded at the start.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from benchmarks.common import ROOT, BenchmarkError, machine, parser, print_table, run_main, write_result
from benchmarks.remote_latency import _start_server, conditions

CONFIG = ROOT / "configs" / "vla_eval" / "shape_assembly_bc_state.yaml"


def _timed(argv: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise BenchmarkError(f"{' '.join(argv[:4])} ... failed (exit {r.returncode}): "
                             f"{(r.stderr.strip().splitlines() or ['no output'])[-1]}")
    return wall, r


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _row(name: str, wall_s: float, records: list[dict]) -> dict:
    loop = sorted(r["wall_s"] for r in records)
    return {"runner": name, "tries": len(records), "wall_s": round(wall_s, 2),
            "tries_per_hour": round(3600 * len(records) / wall_s, 1),
            "loop_s_per_try_mean": round(sum(loop) / len(loop), 3), "loop_s_per_try_p50": loop[len(loop) // 2],
            "steps": sum(r["steps"] for r in records),
            "loop_ms_per_step": round(1e3 * sum(loop) / sum(r["steps"] for r in records), 2)}


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("benchmarks.vla_eval_overhead", __doc__.split("\n\n")[0])
    p.add_argument("--setups", default="A01", help="setups to run (as eval.run --setups; default A01)")
    p.add_argument("--tries", type=int, default=4, help="tries per setup (default 4)")
    args = p.parse_args(argv)
    if args.tries < 1:
        raise BenchmarkError(f"--tries must be at least 1, got {args.tries}")
    vla_eval = Path(sys.executable).with_name("vla-eval")
    if not vla_eval.exists():
        raise BenchmarkError(f"no vla-eval console script at {vla_eval}: pip install -e '.[remote]'")
    mach = machine()
    tries, cap = (1, ["--max-steps", "20"]) if args.quick else (args.tries, [])
    common = ["--split", "dev", "--setups", args.setups, "--tries", str(tries), *cap]
    work = Path(tempfile.mkdtemp(prefix="vla_eval_overhead-"))
    proc, url = _start_server("bc-state", "ort", "vla-eval")
    rows = []
    try:
        from eval.import_vla_eval import import_run

        wall, _ = _timed([str(vla_eval), "run", "--config", str(CONFIG), "--no-docker", "--server-url", url,
                          "--output-dir", str(work / "vla_eval"), "--param", f"setups={args.setups}",
                          "--param", f"tries={tries}", *(["--param", "max_steps=20"] if args.quick else [])])
        import_run(work / "vla_eval", work / "vla_eval_run", url)
        rows.append(_row("vla-eval run (its CLI and runner) -> eval.serve", wall,
                         _records(work / "vla_eval_run" / "tries.jsonl")))
        for folder, name, model in (
                ("remote", "eval.run --model remote --protocol vla-eval -> eval.serve",
                 ["--model", "remote", "--server", url, "--protocol", "vla-eval", "--profile", "bc-state"]),
                ("in_process", "eval.run --model bc-state (in-process, no server)",
                 ["--model", "bc-state", "--backend", "ort"])):
            out = work / folder
            wall, _ = _timed([sys.executable, "-m", "eval.run", *model, *common, "--out", str(out)])
            rows.append(_row(name, wall, _records(out / "tries.jsonl")))
        outcomes = []
        for folder in ("vla_eval_run", "remote", "in_process"):
            outcomes.append([(r["setup"], r["try"], r["seed"], r["success"], r["steps"])
                             for r in _records(work / folder / "tries.jsonl")])
        if any(o != outcomes[1] for o in outcomes):
            raise BenchmarkError(f"the runs' outcomes differ: {outcomes}")
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    base = rows[1]
    for r in rows:
        r["tries_per_hour_vs_eval_run"] = round(r["tries_per_hour"] / base["tries_per_hour"], 3)
        r["loop_time_vs_eval_run"] = round(r["loop_s_per_try_mean"] / base["loop_s_per_try_mean"], 3)
    print_table(f"tries per hour, {tries} dev tries of {args.setups} per runner (bc-state, ONNX Runtime, CPU)",
                ["runner", "tries", "wall s", "tries/hour", "vs eval.run", "loop s/try", "loop ms/step",
                 "loop vs eval.run"],
                [[r["runner"], r["tries"], r["wall_s"], r["tries_per_hour"], r["tries_per_hour_vs_eval_run"],
                  r["loop_s_per_try_mean"], r["loop_ms_per_step"], r["loop_time_vs_eval_run"]] for r in rows])
    results = {"model": "bc-state (the shipped weights) on ONNX Runtime, served by eval.serve on loopback",
               "tries": outcomes[1], "same_outcomes": True, "conditions": conditions(mach), "rows": rows}
    write_result("vla_eval_overhead", args.out_dir, "benchmarks.vla_eval_overhead", argv, args.quick, results, mach)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None))
