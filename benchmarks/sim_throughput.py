"""Simulation throughput: control steps/s of a bare ``env.step`` loop and of the runner's loop
(``eval.rollout.run_try``, a rollout of one scene), for state observations and for both cameras, and tries/s with 1 vs 2 workers.

Harness overhead: the scripted policy runs a try once through ``run_try`` (untimed, to learn its
length); then, from the same start and a freshly built scene, a bare loop (the scripted policy's
``act`` on the scene's state, then ``env.step``: the least any evaluation must do) and ``run_try`` run
the same try in alternating order. Overhead = runner ms per step / bare ms per step - 1: what the
runner adds (observation assembly, the query's timing and checks, the step profiler, flag
bookkeeping). The runner's own per-stage profile (``step_ms`` of the record) says where the time goes.

Workers: the same list of scripted tries through ``eval.executors.local.WorkerPool`` with 1 and with 2 workers;
each pool first runs one untimed try per worker (start-up: imports, first scene), then the timed tries.

    python -m benchmarks.sim_throughput              # the full run (minutes, a quiet machine)
    python -m benchmarks.sim_throughput --quick      # seconds: checks it works, numbers meaningless
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Sequence

import numpy as np

from benchmarks.common import BenchmarkError, machine, parser, print_table, progress, run_main, write_result

NAME = "sim_throughput"
MODULE = "benchmarks.sim_throughput"
OBS_MODES = {"state": "state", "cameras": "rgb"}  # label -> ManiSkill obs_mode (rgb: both cameras rendered)
PARTS = ("steps", "workers")
SPLIT = "dev"  # the tries timed here are the dev split's (never the test split's)
OVERHEAD_TARGET_PCT = 10.0
SPEEDUP_TARGET = 1.8
QUICK_STEPS = 20  # --quick: every try cut at this many steps (5 with cameras); it checks the benchmark runs


def _scripted(setup: str):
    from env.setups import get_setup
    from eval.policies.scripted import ScriptedPolicy

    s = get_setup(setup)
    return ScriptedPolicy(clearance=s.clearance_m, latency_steps=s.latency_steps)


def bare_vs_runner(setup: str, try_index: int, label: str, repeats: int, max_steps: int | None, tasklist) -> dict:
    """Per-step milliseconds of the bare loop and of the rollout on one try, ``repeats`` times each."""
    from env.setups import get_setup
    from eval.rollout import Scenes, run_try

    scenes = Scenes(get_setup(setup), 1, cameras=label == "cameras", max_steps=max_steps)
    env = scenes.envs[0]
    try:
        policy = _scripted(setup)
        actions: list[np.ndarray] = []
        act = policy.act
        policy.act = lambda obs: actions.append(np.array(act(obs), np.float32, copy=True)) or actions[-1]
        run_try(scenes, policy, SPLIT, try_index, tasklist=tasklist)  # untimed: records the actions, warms up
        seed, start = tasklist.seed(setup, try_index), tasklist.start(setup, try_index)
        bare_ms, runner_ms, profiles = [], [], []
        for r in range(repeats):
            for which in (("bare", "runner") if r % 2 == 0 else ("runner", "bare")):  # alternate: drift cancels
                if which == "bare":
                    # the least a loop can do: the scripted policy on the scene's state, then env.step
                    env.reset(seed=seed, options={"start": start, "reconfigure": True})
                    u = env.unwrapped
                    bare_policy = _scripted(setup)
                    bare_policy.reset(u.instructions[0], seed=seed)
                    t0 = time.perf_counter()
                    for _ in actions:
                        state = {k: v[0] for k, v in u.task_state().items()}
                        env.step(bare_policy.act({"state": state}))
                    bare_ms.append((time.perf_counter() - t0) * 1e3 / len(actions))
                else:
                    rec = run_try(scenes, _scripted(setup), SPLIT, try_index, tasklist=tasklist)
                    if rec.steps != len(actions):
                        raise BenchmarkError(f"{setup} try {try_index}: the runner took {rec.steps} steps, the "
                                             f"recorded actions {len(actions)}; the scene is not deterministic")
                    runner_ms.append(rec.wall_s * 1e3 / rec.steps)
                    profiles.append({k: v / rec.steps for k, v in rec.step_ms.items()})
    finally:
        scenes.close()
    profile = {k: round(float(np.mean([p[k] for p in profiles])), 4) for k in profiles[0]} if profiles else None
    return {"setup": setup, "try": try_index, "obs": label, "steps": len(actions), "bare_ms_per_step": bare_ms,
            "runner_ms_per_step": runner_ms, "runner_profile_ms_per_step": profile}


def steps_part(setups: list[str], tries: int, repeats: int, max_steps: int | None, labels: list[str],
               show: bool) -> dict:
    from env.tasklist import load

    tasklist = load(SPLIT)
    cases = [(label, s, t) for label in labels for s in setups for t in range(tries)]
    per_try = []
    for label, s, t in progress(cases, desc="steps", disable=not show):
        per_try.append(bare_vs_runner(s, t, label, repeats, max_steps, tasklist))
    summary = {}
    for label in labels:
        rows = [p for p in per_try if p["obs"] == label]
        # step-weighted means over tries: a long try counts for its steps
        w = np.array([p["steps"] for p in rows], np.float64)
        bare = float(np.sum(w * [np.mean(p["bare_ms_per_step"]) for p in rows]) / w.sum())
        runner = float(np.sum(w * [np.mean(p["runner_ms_per_step"]) for p in rows]) / w.sum())
        profs = [p["runner_profile_ms_per_step"] for p in rows if p["runner_profile_ms_per_step"]]
        summary[label] = {
            "steps": int(w.sum()), "bare_ms_per_step": round(bare, 4), "runner_ms_per_step": round(runner, 4),
            "bare_steps_per_s": round(1e3 / bare, 2), "runner_steps_per_s": round(1e3 / runner, 2),
            "harness_overhead_pct": round(100 * (runner / bare - 1), 2),
            "runner_profile_ms_per_step": ({k: round(float(np.mean([p[k] for p in profs])), 4) for k in profs[0]}
                                           if profs else None),
        }
    return {"setups": setups, "tries_per_setup": tries, "repeats": repeats, "max_steps": max_steps,
            "summary": summary, "per_try": per_try}


def _pool_run(n_workers: int, jobs, warm_jobs, max_steps: int | None = None) -> dict:
    from eval.records import TryRecord
    from eval.executors.local import WorkerPool

    def hung(job, flag):  # only reached if a scripted step hangs: counted, never expected
        return TryRecord(setup=job.setup.id, try_index=job.try_index, seed=0, split=SPLIT, disturbance=None,
                         tasklist_sha256=None, flags=(flag,), finished=False)

    from eval.request import RunRequest, resolve_model

    request = RunRequest(resolve_model("scripted"), setups=tuple({j.setup.id: j.setup for j in jobs}.values()),
                         split=SPLIT, tries=1, max_steps=max_steps)
    t0 = time.perf_counter()
    pool = WorkerPool(n_workers, request, None)
    try:
        list(pool.run(list(warm_jobs), hung))
        startup_s = time.perf_counter() - t0
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        t1 = time.perf_counter()
        recs = [rec.to_json() for _, result in pool.run(list(jobs), hung) for rec in result.records]
        wall = time.perf_counter() - t1
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        pool.close()
    walls = [r["wall_s"] for r in recs if r.get("wall_s") is not None]
    parent_cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {"workers": n_workers, "tries": len(recs), "startup_s": round(startup_s, 2), "wall_s": round(wall, 3),
            "tries_per_s": round(len(recs) / wall, 4), "try_wall_s_mean": round(float(np.mean(walls)), 3) if walls else None,
            "steps": int(sum(r.get("steps") or 0 for r in recs)), "parent_cpu_pct": round(100 * parent_cpu / wall, 1),
            "hangs": sum("sim_hang" in r.get("flags", ()) for r in recs)}


def workers_part(setups: list[str], tries: int, show: bool, mach: dict, max_steps: int | None = None) -> dict:
    from env.setups import get_setup
    from eval.executors import Job

    jobs = [Job(get_setup(s), t) for s in setups for t in range(tries)]  # eval.run's order: setup by setup
    runs = {}
    for n in progress((1, 2), desc="workers", disable=not show):
        warm = [Job(get_setup(setups[0]), tries + i) for i in range(n)]  # one untimed try per worker, not in the timed list
        runs[n] = _pool_run(n, jobs, warm, max_steps)
    speedup = runs[2]["tries_per_s"] / runs[1]["tries_per_s"]
    out = {"setups": setups, "tries_per_setup": tries, "max_steps": max_steps, "runs": [runs[1], runs[2]],
           "speedup_2_vs_1": round(speedup, 3)}
    if speedup < SPEEDUP_TARGET and runs[1]["try_wall_s_mean"] and runs[2]["try_wall_s_mean"]:
        # a try taking longer inside its worker when a second worker runs: the two do not each get a core
        slow = runs[2]["try_wall_s_mean"] / runs[1]["try_wall_s_mean"]
        out["try_slowdown_2_vs_1"] = round(slow, 3)
        out["why_below_target"] = (
            f"2 workers gave {speedup:.2f}x (target {SPEEDUP_TARGET}x); one try took {slow:.2f}x as long inside "
            f"its worker with 2 workers running as with 1, so the workers did not each get a core (load average "
            f"at start {mach['load_average_start']} on {mach['usable_cores']} usable cores; the parent used "
            f"{runs[2]['parent_cpu_pct']}% of a core). Fix: measure on a quiet machine; give W workers W cores "
            "plus one for the parent and the OS.")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(MODULE, __doc__.split("\n\n")[0])
    p.add_argument("--setups", help="setups (ids), comma-separated (default A01,B01,C02,F03; quick: A01)")
    p.add_argument("--tries", type=int, help="tries per setup (default 2; quick: 1)")
    p.add_argument("--repeats", type=int, help="timed runs of each try per loop (default 3; quick: 1)")
    p.add_argument("--max-steps", type=int, help="cut each try at this many steps (default: whole tries; "
                   f"quick: {QUICK_STEPS}, 5 with cameras)")
    p.add_argument("--obs", default="state,cameras", help="state, cameras or both (default both)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"which parts: {', '.join(PARTS)} (default both)")
    p.add_argument("--worker-tries", type=int, help="timed tries per setup for the worker part (default 4; quick: 2)")
    args = p.parse_args(argv)
    from env.setups import resolve_setups

    try:
        setups = resolve_setups(args.setups or ("A01" if args.quick else "A01,B01,C02,F03"))
    except Exception as e:  # noqa: BLE001 - UnknownSetupError: one line
        raise BenchmarkError(str(e)) from None
    labels = [x.strip() for x in args.obs.split(",") if x.strip()]
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    for bad, valid, what in ((set(labels) - set(OBS_MODES), OBS_MODES, "--obs"), (set(parts) - set(PARTS), PARTS, "--parts")):
        if bad or not (labels if what == "--obs" else parts):
            raise BenchmarkError(f"{what}: unknown or empty {', '.join(sorted(bad))}; valid: {', '.join(valid)}")
    tries = args.tries if args.tries is not None else (1 if args.quick else 2)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    worker_tries = args.worker_tries if args.worker_tries is not None else (2 if args.quick else 4)
    for name, v in (("--tries", tries), ("--repeats", repeats), ("--worker-tries", worker_tries),
                    ("--max-steps", args.max_steps if args.max_steps is not None else 1)):
        if v < 1:
            raise BenchmarkError(f"{name} must be at least 1, got {v}")
    mach = machine()
    show = not args.no_progress and sys.stderr.isatty()
    results: dict = {"targets": {"harness_overhead_pct_max": OVERHEAD_TARGET_PCT, "speedup_2_vs_1_min": SPEEDUP_TARGET}}
    if "steps" in parts:
        results["steps"] = {}
        for label in labels:
            # CPU rendering of both cameras is slow (about 0.5 s a step on a loaded 2-core machine): quick cuts it
            cap = args.max_steps if args.max_steps is not None else (
                (5 if label == "cameras" else QUICK_STEPS) if args.quick else None)
            results["steps"][label] = steps_part(setups, tries, repeats, cap, [label], show)["summary"][label] | {
                "max_steps": cap}
        rows = [[label, s["steps"], s["bare_steps_per_s"], s["runner_steps_per_s"], s["harness_overhead_pct"],
                 " ".join(f"{k} {v:.2f}" for k, v in (s["runner_profile_ms_per_step"] or {}).items() if v >= 0.005)]
                for label, s in results["steps"].items()]
        print_table(f"control steps/s, bare env.step vs run_try (target overhead <= {OVERHEAD_TARGET_PCT:g}%)",
                    ["obs", "steps", "bare steps/s", "runner steps/s", "overhead %", "runner ms/step by stage"], rows)
    if "workers" in parts:
        w = workers_part(setups, worker_tries, show, mach,
                         max_steps=args.max_steps if args.max_steps is not None else (QUICK_STEPS if args.quick else None))
        results["workers"] = w
        print_table(f"tries/s through WorkerPool (target 2 vs 1 >= {SPEEDUP_TARGET}x)",
                    ["workers", "tries", "start-up s", "wall s", "tries/s", "s per try (in worker)", "parent CPU %"],
                    [[r["workers"], r["tries"], r["startup_s"], r["wall_s"], r["tries_per_s"], r["try_wall_s_mean"],
                      r["parent_cpu_pct"]] for r in w["runs"]])
        print(f"2 workers vs 1: {w['speedup_2_vs_1']:.2f}x")
        if w.get("why_below_target"):
            print(w["why_below_target"])
    write_result(NAME, args.out_dir, MODULE, argv, args.quick, results, mach)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None))
