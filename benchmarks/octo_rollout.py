"""One octo-small try on this machine through the one rollout loop: N = 1 and N = 4 scenes, JAX and ONNX
Runtime, the try's wall time and its shares (render, inference, physics, other), all in one run.

    python -m benchmarks.octo_rollout            # octo-small, random weights, A01 dev tries, 300 steps
    python -m benchmarks.octo_rollout --quick    # the tiny test model, 12 steps: checks the benchmark runs
    python -m benchmarks.octo_rollout --sim gpu --num-envs 1,8,32,64 --backends jax   # GPU scenes (device check)

Targets (issue 34; issue 18's were 1.8x and 35%): a try's wall time <= 1.5x its own inference time; render
share <= 20% (appearance v2, env.appearance); N = 4 gives at least the tries/hour of N = 1. The row ``jax, N = 1, every step rendered`` is the loop as it
was before rendering followed what the policy reads, measured in the same run.

On GPU scenes (``--sim gpu``) the N scenes are one ManiSkill GPU simulation rendered in parallel, and frames
stay on the device up to the engine; each row reports tries/s and the image bytes that crossed between host
and device per step (the goal: 0). Where SAPIEN's GPU simulation cannot run, it stops with the reason.

Random weights: the actions are meaningless, the tries run to the step limit (300 steps, 75 queries at the
default chunk of 4), which is the frozen track's worst case and the same work for every row.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Sequence

from benchmarks.common import BenchmarkError, RowLog, machine, parser, print_table, progress, run_main, write_result

NAME = "octo_rollout"
MODULE = "benchmarks.octo_rollout"
SETUP = "A01"
SPLIT = "dev"
WALL_PER_INFERENCE_TARGET = 1.5
WALL_PER_INFERENCE_STRETCH = 1.5
RENDER_SHARE_TARGET = 0.20
SHARES = ("render", "inference", "physics", "other")


@functools.lru_cache(maxsize=1)
def _tiny_engine():
    """Quick mode's model, one for every row: its jitted functions (and ONNX export) are built once, not per row."""
    from engines.octo.testing import tiny_octo

    return tiny_octo(seed=1)


def _policy_factory(backend: str, quick: bool):
    from eval.request import make_policy

    if quick:
        engine = _tiny_engine()
        return lambda: make_policy("octo-small", engine=engine, backend=backend)
    return lambda: make_policy("octo-small", random_weights=True, backend=backend)


def measure(backend: str, num_envs: int, quick: bool, every_step: bool = False, sim: str = "cpu",
            torch_threads: int | None = None) -> dict:
    """One rollout of ``num_envs`` tries of A01 on as many scenes; its wall time and stage shares. With
    ``torch_threads``, torch runs on that many threads instead of the rollout's one (``env.one_torch_thread``)."""
    from env.setups import get_setup
    from eval.rollout import Scenes, make_members, rollout

    setup = get_setup(SETUP)
    factory = _policy_factory(backend, quick)
    members = make_members(factory(), num_envs, factory)
    if every_step:
        for m in members:
            m.reads_observation = lambda step: True  # the loop as it was: every step rendered
    scenes = Scenes(setup, num_envs, sim=sim, cameras=True, max_steps=12 if quick else None)
    if torch_threads is not None:
        import torch

        torch.set_num_threads(torch_threads)
    try:
        records, batch = rollout(scenes, members, SPLIT, list(range(num_envs)))
    finally:
        scenes.close()
    stages = {k: sum(r.step_ms[k] for r in records) / 1e3 for k in records[0].step_ms}  # s, all tries
    total = sum(stages.values())
    grouped = {"render": stages["render"], "inference": stages["inference"], "physics": stages["physics"],
               "other": total - stages["render"] - stages["inference"] - stages["physics"]}
    wall = batch["wall_s"]
    return {
        "backend": backend, "sim": sim, "num_envs": num_envs, "every_step_rendered": every_step,
        "torch_threads": torch_threads or 1,
        "tries": len(records), "tries_per_s": round(num_envs / wall, 4),
        "steps_per_try": [r.steps for r in records], "queries": len(batch["query_ms"]) + len(batch["warmup_ms"]),
        "wall_s": round(wall, 2), "try_wall_s": round(wall / num_envs, 2),
        "tries_per_hour": round(3600 * num_envs / wall, 1),
        "stage_s": {k: round(v, 2) for k, v in stages.items()},
        "share": {k: round(v / total, 3) for k, v in grouped.items()},
        "wall_per_inference": round(total / stages["inference"], 2),
        "query_ms_p50": _p50(batch["query_ms"]),
        "image_bytes_per_step": batch["image_bytes_per_step"],
    }


def _p50(xs):
    import numpy as np

    return round(float(np.percentile(xs, 50)), 1) if xs else None


def _main(argv: Sequence[str] | None) -> int:
    ap = parser(MODULE, __doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="jax,ort", help="comma-separated: jax, ort, trt (default jax,ort)")
    ap.add_argument("--sim", default="cpu", choices=("cpu", "gpu"), help="CPU scenes (default) or one GPU simulation")
    ap.add_argument("--num-envs", help="comma-separated scene counts (default 1,4; quick 1,2)")
    args = ap.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    if not backends or set(backends) - {"jax", "ort", "trt"}:
        raise BenchmarkError(f"--backends takes jax, ort and/or trt, got {args.backends!r}")
    try:
        counts = [int(x) for x in (args.num_envs or ("1,2" if args.quick else "1,4")).split(",") if x]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise BenchmarkError(f"--num-envs takes comma-separated counts >= 1, got {args.num_envs!r}")
    if args.sim == "gpu":
        from eval.rollout import gpu_sim_unavailable_reason

        reason = gpu_sim_unavailable_reason()
        if reason:
            raise BenchmarkError(f"--sim gpu cannot run here: {reason}")
    from engines.optional import require

    for module in ("jax", "flax"):
        require(module, "jax")
    from engines.backends import unavailable_reason

    for b in backends:
        reason = unavailable_reason(b)
        if reason:
            raise BenchmarkError(f"backend {b!r} {reason}")
    mach = machine()
    # the loop as it was (every step rendered) beside it, on CPU scenes
    cases = [("jax", 1, True, None)] if "jax" in backends and args.sim == "cpu" and 1 in counts else []
    cases += [(b, n, False, None) for b in backends for n in counts]
    if args.sim == "cpu" and 1 in counts:  # why the rollout runs torch on one thread: torch's default beside it
        cases += [(b, 1, False, os.cpu_count() or 1) for b in backends]
    row_log = RowLog(NAME, args.out_dir, args.quick)  # each row on disk as it finishes: a killed run keeps them
    rows = row_log.rows
    t0 = time.monotonic()
    for backend, n, every, threads in progress(cases, desc="rollouts", disable=args.no_progress):
        row_log.append(measure(backend, n, args.quick, every_step=every, sim=args.sim, torch_threads=threads))
    results = {"setup": SETUP, "split": SPLIT, "sim": args.sim, "model": "octo-tiny (test)" if args.quick else "octo-small",
               "weights": "random", "rows": rows, "wall_s": round(time.monotonic() - t0, 1),
               "targets": {"wall_per_inference": WALL_PER_INFERENCE_TARGET,
                           "wall_per_inference_stretch": WALL_PER_INFERENCE_STRETCH,
                           "render_share": RENDER_SHARE_TARGET, "n4_vs_n1_tries_per_hour": 1.0}}
    for b in backends:
        one = next((r for r in rows if r["backend"] == b and r["num_envs"] == 1 and not r["every_step_rendered"]
                    and r["torch_threads"] == 1), None)
        for many in (r for r in rows if r["backend"] == b and r["num_envs"] > 1):
            if one is not None:
                key = f"{b}_n{many['num_envs']}_vs_one_tries_per_hour"
                results[key] = round(many["tries_per_hour"] / one["tries_per_hour"], 3)
    print_table(f"one {results['model']} try on {mach['cpu']} ({args.sim} scenes)", [
        "backend", "N", "rendered", "torch threads", "try wall s", "tries/h", "wall/inference", "render", "inference", "physics",
        "other", "query p50 ms", "image B/step"], [
        [r["backend"], r["num_envs"], "every step" if r["every_step_rendered"] else "read steps", r["torch_threads"],
         r["try_wall_s"],
         r["tries_per_hour"], r["wall_per_inference"], *(r["share"][k] for k in SHARES), r["query_ms_p50"],
         r["image_bytes_per_step"]] for r in rows])
    write_result(NAME, args.out_dir, MODULE, argv, args.quick, results, mach, row_log)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
