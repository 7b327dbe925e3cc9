"""GPU physics against CPU physics on the scripted reference, before GPU scenes are used for scored runs.

    python -m benchmarks.gpu_physics_check                       # on a CUDA machine: A01..A04, 16 tries each
    python -m benchmarks.gpu_physics_check --sim cpu --quick     # anywhere: the batched loop on CPU scenes

The same dev-split tries run twice: one at a time on CPU PhysX (a rollout of one scene, as
every scored run so far) and as one batch of ``--num-envs`` scenes on the
chosen physics (eval.rollout). Tight insertion is where PhysX's GPU solver is
known to differ, so the default setups are the clearance group A01..A04. Per
setup: success on each, tries whose outcome differs, mean steps, the paired
difference in percentage points; and throughput of the batch. On ``--sim cpu``
every try must come out the same (a check of the batched loop itself).
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from benchmarks.common import BenchmarkError, RowLog, machine, parser, print_table, run_main, write_result

NAME = "gpu_physics_check"
MODULE = "benchmarks.gpu_physics_check"
OUTCOME_FIELDS = ("success", "steps", "flags", "blocks_inserted", "disturbance_fired", "disturbance_step")


def compare_setup(setup_id: str, tries: Sequence[int], num_envs: int, sim: str, split: str = "dev") -> dict:
    """The tries of one setup on CPU one at a time and batched on ``sim``; outcomes side by side."""
    from env.setups import get_setup
    from env.tasklist import load
    from eval.request import make_policy
    from eval.rollout import Scenes, make_members, rollout, run_try

    tasklist = load(split)
    setup = get_setup(setup_id)
    factory = lambda: make_policy("scripted", setup=setup)  # noqa: E731
    one = Scenes(setup, 1, sim="cpu")
    t0 = time.monotonic()
    try:
        single = [run_try(one, factory(), split, t, tasklist=tasklist).to_json() for t in tries]
    finally:
        one.close()
    single_s = time.monotonic() - t0
    scenes = Scenes(setup, num_envs, sim=sim)
    t0 = time.monotonic()
    try:
        batched = []
        members = make_members(factory(), num_envs, factory)
        for i in range(0, len(tries), num_envs):
            records, _ = rollout(scenes, members, split, list(tries[i:i + num_envs]), tasklist)
            batched += [r.to_json() for r in records]
    finally:
        scenes.close()
    batch_s = time.monotonic() - t0
    differ = [int(a["try"]) for a, b in zip(single, batched) if any(a[f] != b[f] for f in OUTCOME_FIELDS)]
    k_cpu = sum(r["success"] for r in single)
    k_batch = sum(r["success"] for r in batched)
    diff = np.array([int(b["success"]) - int(a["success"]) for a, b in zip(single, batched)], float)
    rng = np.random.default_rng(0)
    boot = diff[rng.integers(0, len(diff), size=(5000, len(diff)))].mean(1) * 100
    return {
        "setup": setup_id, "tries": len(tries), "cpu_success": k_cpu, "batch_success": k_batch,
        "difference_pp": round(100 * (k_batch - k_cpu) / len(tries), 2),
        "difference_pp_95": [round(float(np.percentile(boot, 2.5)), 2), round(float(np.percentile(boot, 97.5)), 2)],
        "tries_differing": differ,
        "cpu_mean_steps": round(float(np.mean([r["steps"] for r in single])), 2),
        "batch_mean_steps": round(float(np.mean([r["steps"] for r in batched])), 2),
        "cpu_tries_per_s": round(len(tries) / single_s, 3), "batch_tries_per_s": round(len(tries) / batch_s, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(MODULE, __doc__.split("\n\n")[0])
    p.add_argument("--setups", default="A01,A02,A03,A04")
    p.add_argument("--tries", type=int, default=16, help="dev-split tries per setup")
    p.add_argument("--num-envs", type=int, default=16, help="scenes per batch")
    p.add_argument("--sim", choices=("gpu", "cpu"), default="gpu")
    args = p.parse_args(argv)
    from env.setups import resolve_setups
    from eval.rollout import gpu_sim_unavailable_reason

    if args.quick:
        args.tries, args.num_envs, args.setups = 2, 2, "A01"
    if args.sim == "gpu" and (reason := gpu_sim_unavailable_reason()):
        raise BenchmarkError(f"--sim gpu: {reason}; --sim cpu checks the batched loop on CPU scenes")
    if args.tries < 1 or args.num_envs < 1:
        raise BenchmarkError("--tries and --num-envs must be at least 1")
    from engines.optional import require

    for module in ("sapien", "mani_skill"):  # where SAPIEN is absent (the device tool's H200): one line, exit 2
        require(module, "sim")
    setups = resolve_setups(args.setups)
    mach = machine()
    name = f"{NAME}_{args.sim}"
    row_log = RowLog(name, args.out_dir, args.quick)  # each setup on disk as it finishes: a killed run keeps them
    rows = row_log.rows
    for s in setups:
        row_log.append(compare_setup(s, list(range(args.tries)), args.num_envs, args.sim))
        print(f"{s}: CPU {rows[-1]['cpu_success']}/{args.tries}, {args.sim.upper()} batch "
              f"{rows[-1]['batch_success']}/{args.tries}, differing tries {rows[-1]['tries_differing']}", flush=True)
    print_table(f"scripted reference: CPU one at a time vs {args.sim.upper()} batch of {args.num_envs}",
                ["setup", "tries", "CPU ok", "batch ok", "diff pp", "diff 95%", "differing", "CPU steps",
                 "batch steps", "CPU tries/s", "batch tries/s"],
                [[r["setup"], r["tries"], r["cpu_success"], r["batch_success"], r["difference_pp"],
                  f"{r['difference_pp_95'][0]}..{r['difference_pp_95'][1]}", len(r["tries_differing"]),
                  r["cpu_mean_steps"], r["batch_mean_steps"], r["cpu_tries_per_s"], r["batch_tries_per_s"]]
                 for r in rows])
    total = sum(r["tries"] for r in rows)
    results = {"sim": args.sim, "num_envs": args.num_envs, "setups": rows,
               "total": {"tries": total, "cpu_success": sum(r["cpu_success"] for r in rows),
                         "batch_success": sum(r["batch_success"] for r in rows),
                         "tries_differing": sum(len(r["tries_differing"]) for r in rows)}}
    write_result(name, args.out_dir, MODULE, argv, args.quick, results, mach, row_log)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(run_main(main, None))
