"""Render cost and appearance: what a frame of both cameras costs, and what appearance v2 changes in it.

Parts (``env.appearance`` says what v2 renders):

- ``frames``: per setup, the frames of both cameras at several steps of a scripted dev try, rendered with the
  source meshes (appearance v1) and with v2's; per camera the mean absolute difference (0-255) and the share
  of pixels with any channel changed. The two scenes step in lockstep and their physical states are checked
  equal at every compared step (appearance changes images only).
- ``lod``: the level of detail of the decimated meshes: the same comparison on A01's and B01's frames for each
  keep fraction, with the triangles a frame sends and its render time; the chosen fraction is the smallest
  whose frames stay within ``LOD_MEAN_ABS_MAX`` of the source on both cameras.
- ``cost``: per control step of a scripted A01 try, in a fresh process that holds only appearance v2's scene
  and the floor's (as an eval worker holds only v2 scenes, and runs torch on one thread: ``env.
  one_torch_thread``), the scenes' renders interleaved: physics (``env.step`` with rendering off), the render
  of both cameras (``_get_obs_sensor_data``: both submitted, then both read), each camera alone,
  ``scene.update_render``, and the floor: v2's scene with every render body hidden (the per-frame fixed cost:
  submission, the camera passes, the read-back). The same in a fresh process per lavapipe thread count
  (``LP_NUM_THREADS``: lavapipe reads it once). Then v1 against v2 in one process, their renders interleaved
  step by step (each pays for the other's passage through the caches, so both are slower than alone). Last,
  v2 with torch on its default threads (one per core) instead of the rollout's one (``env.one_torch_thread``):
  the headline's process runs its try again (one process start less than a process of its own).

    python -m benchmarks.render_cost                 # the full run (minutes, a quiet machine)
    python -m benchmarks.render_cost --quick         # seconds: checks it works, numbers meaningless
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Sequence

import numpy as np

from benchmarks.common import BenchmarkError, machine, parser, print_table, progress, run_main, stats_ms, write_result

NAME = "render_cost"
MODULE = "benchmarks.render_cost"
PARTS = ("frames", "lod", "cost")
SPLIT = "dev"
KEEP_FRACTIONS = (0.5, 0.35, 0.25, 0.15, 0.1)
LOD_MEAN_ABS_MAX = 0.5  # mean absolute difference (0-255) a chosen level of detail may add, per camera
LOD_SETUPS = ("A01", "B01")
FRAME_STEPS = (0, 40, 80, 120)  # control steps of the scripted try whose frames are compared
LP_THREADS = (1, 2, 4)
RENDER_TARGET_MS = 35.0
RENDER_PHYSICS_RATIO_TARGET = 3.5


def _scene(setup: str, visual_meshes: str, keep_fraction: float | None = None):
    """A camera scene of the setup; with ``keep_fraction`` the source scene's meshes decimated to it."""
    from env import make_env, one_torch_thread
    from env.appearance import simplify_visuals

    one_torch_thread()  # as the rollout's scenes run (eval.rollout.Scenes)
    env = make_env(setup, obs_mode="rgb", visual_meshes=visual_meshes)
    if keep_fraction is not None:
        scene = env.unwrapped.scene
        simplify_visuals([e for sub in scene.sub_scenes for e in sub.entities], keep_fraction)
    return env


def _images(env) -> dict[str, np.ndarray]:
    u = env.unwrapped
    rendering, u.render_sensors = u.render_sensors, True  # the lockstep steps with rendering off
    try:
        data = u._get_obs_sensor_data()
    finally:
        u.render_sensors = rendering
    wrist = u.arm.wrist_camera_uid
    return {"third_person": data["third_person"]["rgb"][0].numpy(), "wrist": data[wrist]["rgb"][0].numpy()}


def image_difference(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Mean absolute difference (0-255, over pixels and channels) and the share of pixels with any channel
    changed."""
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return {"mean_abs": round(float(d.mean()), 4), "changed_share": round(float((d.max(-1) > 0).mean()), 5)}


class _Lockstep:
    """Scenes of one setup stepping one scripted dev try together, rendering only at the steps asked for."""

    def __init__(self, setup: str, try_index: int, envs: list, tasklist):
        from eval.policies.scripted import ScriptedPolicy
        from env.setups import get_setup

        s = get_setup(setup)
        self.envs = envs
        seed, start = tasklist.seed(setup, try_index), tasklist.start(setup, try_index)
        for env in envs:
            env.reset(seed=seed, options={"start": start})
            env.unwrapped.render_sensors = False
        self.policy = ScriptedPolicy(clearance=s.clearance_m, latency_steps=s.latency_steps)
        self.policy.reset(envs[0].unwrapped.instructions[0], seed=seed)
        self.step_count = 0
        self.physics_ms: list[float] = []

    def state(self, env) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in env.unwrapped.task_state().items()}

    def step(self) -> bool:
        action = self.policy.act({"state": self.state(self.envs[0])})
        done = False
        for env in self.envs:
            t0 = time.perf_counter()
            _, _, term, trunc, _ = env.step(action)
            self.physics_ms.append((time.perf_counter() - t0) * 1e3)
            done = done or bool(term) or bool(trunc)
        self.step_count += 1
        return not done

    def check_same_physics(self) -> None:
        ref = self.state(self.envs[0])
        for env in self.envs[1:]:
            other = self.state(env)
            for k in ref:
                if not np.array_equal(ref[k], other[k]):
                    raise BenchmarkError(f"step {self.step_count}: {k} differs between appearances: the physics "
                                         "changed with the render bodies")

    def frames_at(self, steps: Sequence[int]) -> list[tuple[int, list[dict[str, np.ndarray]]]]:
        out = []
        for target in steps:
            while self.step_count < target and self.step():
                pass
            if self.step_count < target:
                break  # the try ended before this step
            self.check_same_physics()
            out.append((self.step_count, [_images(env) for env in self.envs]))
        return out


def frames_part(setups: list[str], steps: Sequence[int], show: bool) -> dict:
    from env.appearance import APPEARANCE_VERSION
    from env.tasklist import load

    tasklist = load(SPLIT)
    rows = []
    for setup in progress(setups, desc="frames", disable=not show):
        envs = [_scene(setup, "source"), _scene(setup, "simplified")]
        try:
            for step, (v1, v2) in _Lockstep(setup, 0, envs, tasklist).frames_at(steps):
                rows.append({"setup": setup, "try": 0, "step": step,
                             **{cam: image_difference(v1[cam], v2[cam]) for cam in v1}})
        finally:
            for env in envs:
                env.close()
    summary = {cam: {"mean_abs_mean": round(float(np.mean([r[cam]["mean_abs"] for r in rows])), 4),
                     "mean_abs_max": max(r[cam]["mean_abs"] for r in rows),
                     "changed_share_mean": round(float(np.mean([r[cam]["changed_share"] for r in rows])), 5),
                     "changed_share_max": max(r[cam]["changed_share"] for r in rows)}
               for cam in ("third_person", "wrist")}
    return {"compared": f"appearance 1 (source meshes) vs {APPEARANCE_VERSION}", "steps": list(steps),
            "summary": summary, "per_frame": rows}


def _render_ms(env, repeats: int) -> float:
    _images(env)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _images(env)
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ts))


def lod_part(setups: Sequence[str], fractions: Sequence[float], steps: Sequence[int], repeats: int,
             show: bool) -> dict:
    from env.appearance import LOD_KEEP_FRACTION, scene_triangles
    from env.tasklist import load

    tasklist = load(SPLIT)
    levels = {f: {"keep_fraction": f, "diff": [], "render_ms": [], "triangles": None} for f in fractions}
    source_ms = []
    for setup in progress(setups, desc="lod", disable=not show):
        envs = [_scene(setup, "source")] + [_scene(setup, "source", f) for f in fractions]
        try:
            for f, env in zip(fractions, envs[1:]):
                levels[f]["triangles"] = scene_triangles(env.unwrapped.scene)
            source_triangles = scene_triangles(envs[0].unwrapped.scene)
            for _, images in _Lockstep(setup, 0, envs, tasklist).frames_at(steps):
                for f, im in zip(fractions, images[1:]):
                    levels[f]["diff"].append({cam: image_difference(images[0][cam], im[cam]) for cam in im})
                source_ms.append(_render_ms(envs[0], repeats))
                for f, env in zip(fractions, envs[1:]):
                    levels[f]["render_ms"].append(_render_ms(env, repeats))
        finally:
            for env in envs:
                env.close()
    rows = []
    for f in fractions:
        lv = levels[f]
        rows.append({"keep_fraction": f, "triangles": lv["triangles"],
                     "render_ms_median": round(float(np.median(lv["render_ms"])), 3),
                     **{cam: {"mean_abs_max": max(d[cam]["mean_abs"] for d in lv["diff"]),
                              "changed_share_max": max(d[cam]["changed_share"] for d in lv["diff"])}
                        for cam in ("third_person", "wrist")}})
    within = [r["keep_fraction"] for r in rows
              if all(r[cam]["mean_abs_max"] <= LOD_MEAN_ABS_MAX for cam in ("third_person", "wrist"))]
    return {"setups": list(setups), "steps": list(steps), "mean_abs_max_allowed": LOD_MEAN_ABS_MAX,
            "source": {"triangles": source_triangles, "render_ms_median": round(float(np.median(source_ms)), 3)},
            "levels": rows, "chosen_keep_fraction": min(within) if within else None,
            "env_keep_fraction": LOD_KEEP_FRACTION}


def _hide_all(env) -> None:
    import sapien

    for sub in env.unwrapped.scene.sub_scenes:
        for e in sub.entities:
            body = e.find_component_by_type(sapien.render.RenderBodyComponent)
            if body is not None:
                body.visibility = 0.0


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def cost_samples(setup: str, max_steps: int, with_source: bool, torch_threads: int | None = None) -> dict:
    """Per-step milliseconds along a scripted try of ``setup``, the scenes' renders interleaved; with
    ``torch_threads`` torch runs on that many threads instead of the rollout's one."""
    from env.tasklist import load

    envs = {"v2": _scene(setup, "simplified"), "floor": _scene(setup, "simplified")}
    if with_source:
        envs["v1"] = _scene(setup, "source")
    if torch_threads is not None:
        import torch

        torch.set_num_threads(torch_threads)
    _hide_all(envs["floor"])
    names = list(envs)
    try:
        run = _Lockstep(setup, 0, list(envs.values()), load(SPLIT))
        samples: dict[str, list[float]] = {k: [] for k in (*names, "third_person", "wrist", "update_render")}
        for _ in range(3):
            _images(envs["v2"])  # warm-up: pipelines, first uploads
        physics0 = 0
        while run.step_count < max_steps and run.step():
            physics0 += 1
            order = names if run.step_count % 2 else names[::-1]  # alternate: drift cancels
            for k in order:
                samples[k].append(_timed(lambda: _images(envs[k])))
            u = envs["v2"].unwrapped
            wrist = u.arm.wrist_camera_uid
            samples["update_render"].append(_timed(lambda: u.scene.update_render(
                update_sensors=True, update_human_render_cameras=False)))
            for cam, uid in (("third_person", "third_person"), ("wrist", wrist)):
                sensor = u.scene.sensors[uid]
                samples[cam].append(_timed(lambda: (sensor.capture(), sensor.get_obs(
                    rgb=True, depth=False, position=False, segmentation=False))))
        run.check_same_physics()
        # physics of one scene: the scenes step one after another, each with rendering off
        samples["physics"] = run.physics_ms
        return samples
    finally:
        for env in envs.values():
            env.close()


def _child_samples(setup: str, max_steps: int, lp_threads: int | None, torch_threads: int | None = None
                   ) -> list[dict]:
    """The cost samples of a fresh process holding v2's scenes only, as an eval worker does, torch on one thread
    (the rollout's); lavapipe's thread count ``lp_threads`` (None: unset, lavapipe's own default). With
    ``torch_threads``, the same process then runs the try again with torch on that many threads (one process
    start less than a child of its own); its samples follow."""
    env = {k: v for k, v in os.environ.items() if k != "LP_NUM_THREADS"}
    if lp_threads is not None:
        env["LP_NUM_THREADS"] = str(lp_threads)
    extra = ["--child-torch-threads", str(torch_threads)] if torch_threads is not None else []
    child = subprocess.run([sys.executable, "-m", MODULE, "--child-cost", setup, "--max-steps", str(max_steps), *extra],
                           env=env, capture_output=True, text=True)
    if child.returncode != 0:
        raise BenchmarkError(f"the LP_NUM_THREADS={lp_threads or 'unset'} run failed: "
                             f"{child.stderr.strip().splitlines()[-1:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def cost_part(setup: str, max_steps: int, lp_threads: Sequence[int], show: bool) -> dict:
    # the headline: a fresh process with v2's scenes only (an eval worker never holds a v1 scene, whose 582k
    # triangles pass through the caches between v2's frames when the two are interleaved)
    runs = [None, *lp_threads]
    cores = os.cpu_count() or 1
    got, with_cores = {}, None
    for n in progress(runs, desc="cost processes", disable=not show):
        samples = [{k: stats_ms(v) for k, v in part.items()}
                   for part in _child_samples(setup, max_steps, n, torch_threads=cores if n is None else None)]
        got[n] = samples[0]
        if n is None:
            with_cores = samples[1]
    s = got[None]
    out = {"setup": setup, "steps": s["v2"]["n"],
           "how": "a fresh process holding only appearance v2's scene (and the floor's), LP_NUM_THREADS unset",
           "ms_per_step": {
               "physics": s["physics"], "render_both_v2": s["v2"], "render_floor_all_hidden": s["floor"],
               "third_person_alone_v2": s["third_person"], "wrist_alone_v2": s["wrist"],
               "update_render_v2": s["update_render"]},
           "render_v2_over_physics": round(s["v2"]["p50"] / s["physics"]["p50"], 3),
           "targets": {"render_ms_max": RENDER_TARGET_MS, "render_over_physics_max": RENDER_PHYSICS_RATIO_TARGET}}
    # v1 against v2 under the same conditions: one process, the scenes' renders interleaved step by step
    both = {k: stats_ms(v) for k, v in cost_samples(setup, max_steps, with_source=True).items()}
    out["v1_vs_v2"] = {"how": "one process, v1, v2 and the floor's scenes interleaved step by step",
                       "ms_per_step": {"physics": both["physics"], "render_both_v1": both["v1"],
                                       "render_both_v2": both["v2"], "render_floor_all_hidden": both["floor"]},
                       "v2_vs_v1": round(both["v1"]["p50"] / both["v2"]["p50"], 3)}
    out["lp_num_threads"] = [{"lp_num_threads": n, "physics": got[n]["physics"], "render_both_v2": got[n]["v2"],
                              "render_floor_all_hidden": got[n]["floor"],
                              "render_v2_over_physics": round(got[n]["v2"]["p50"] / got[n]["physics"]["p50"], 3)}
                             for n in lp_threads]
    out["lp_num_threads_default"] = "unset (lavapipe: one per CPU)"
    # why the rollout runs torch on one thread (env.one_torch_thread): the headline's process, its try run again
    # with torch's default (a thread per core)
    t = with_cores
    out["torch_threads"] = {"rollout": 1, "compared": cores, "how": "the headline's process, its try run again",
                            "physics": t["physics"], "render_both_v2": t["v2"],
                            "render_v2_over_physics": round(t["v2"]["p50"] / t["physics"]["p50"], 3)}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(MODULE, __doc__.split("\n\n")[0])
    p.add_argument("--setups", help="setups of the frames part (default: every setup; quick: A01)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"which parts: {', '.join(PARTS)} (default all)")
    p.add_argument("--max-steps", type=int, help="steps of the cost part's try (default 100; quick: 3)")
    p.add_argument("--child-cost", metavar="SETUP", help=argparse.SUPPRESS)
    p.add_argument("--child-torch-threads", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_cost:  # one LP_NUM_THREADS run of the cost part: its samples (a list) as one JSON line
        steps = args.max_steps or 100
        runs = [cost_samples(args.child_cost, steps, with_source=False)]
        if args.child_torch_threads is not None:
            runs.append(cost_samples(args.child_cost, steps, with_source=False, torch_threads=args.child_torch_threads))
        print(json.dumps(runs))
        return 0
    from env.setups import SETUPS, resolve_setups

    try:
        setups = resolve_setups(args.setups) if args.setups else (["A01"] if args.quick else list(SETUPS))
    except Exception as e:  # noqa: BLE001 - UnknownSetupError: one line
        raise BenchmarkError(str(e)) from None
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    if not parts or set(parts) - set(PARTS):
        raise BenchmarkError(f"--parts: unknown or empty {', '.join(sorted(set(parts) - set(PARTS)))}; "
                             f"valid: {', '.join(PARTS)}")
    max_steps = args.max_steps if args.max_steps is not None else (3 if args.quick else 100)
    if max_steps < 1:
        raise BenchmarkError(f"--max-steps must be at least 1, got {max_steps}")
    steps = FRAME_STEPS[:1] if args.quick else FRAME_STEPS
    mach = machine()
    show = not args.no_progress and sys.stderr.isatty()
    results: dict = {}
    if "frames" in parts:
        f = results["frames"] = frames_part(setups, steps, show)
        print_table(f"frames, {f['compared']} ({len(f['per_frame'])} frames)",
                    ["camera", "mean abs (0-255) mean", "max", "changed share mean", "max"],
                    [[cam, v["mean_abs_mean"], v["mean_abs_max"], v["changed_share_mean"], v["changed_share_max"]]
                     for cam, v in f["summary"].items()])
    if "lod" in parts:
        lod = results["lod"] = lod_part(LOD_SETUPS[:1] if args.quick else LOD_SETUPS,
                                        KEEP_FRACTIONS[:1] if args.quick else KEEP_FRACTIONS, steps,
                                        1 if args.quick else 5, show)
        print_table(f"level of detail (source: {lod['source']['triangles']} triangles, "
                    f"{lod['source']['render_ms_median']:.1f} ms)",
                    ["keep fraction", "triangles", "render ms", "third-person mean abs max", "wrist mean abs max"],
                    [[r["keep_fraction"], r["triangles"], r["render_ms_median"], r["third_person"]["mean_abs_max"],
                      r["wrist"]["mean_abs_max"]] for r in lod["levels"]])
        print(f"chosen keep fraction (mean abs <= {LOD_MEAN_ABS_MAX} on both cameras): "
              f"{lod['chosen_keep_fraction']}; env.appearance has {lod['env_keep_fraction']}")
    if "cost" in parts:
        c = results["cost"] = cost_part("A01", max_steps, LP_THREADS[:1] if args.quick else LP_THREADS, show)
        print_table(f"ms per control step, {c['setup']} scripted try, {c['steps']} steps (target render <= "
                    f"{RENDER_TARGET_MS:g} ms, <= {RENDER_PHYSICS_RATIO_TARGET:g}x physics)",
                    ["what", "p50", "mean", "p99"],
                    [[k, v["p50"], v["mean"], v["p99"]] for k, v in c["ms_per_step"].items()]
                    + [[f"{k}, with v1 in the process", v["p50"], v["mean"], v["p99"]]
                       for k, v in c["v1_vs_v2"]["ms_per_step"].items()]
                    + [[f"render v2, LP_NUM_THREADS={t['lp_num_threads']}", t["render_both_v2"]["p50"],
                        t["render_both_v2"]["mean"], t["render_both_v2"]["p99"]] for t in c["lp_num_threads"]]
                    + [[f"render v2, torch on {c['torch_threads']['compared']} threads (the rollout: 1)",
                        *(c["torch_threads"]["render_both_v2"][k] for k in ("p50", "mean", "p99"))],
                       [f"physics, torch on {c['torch_threads']['compared']} threads",
                        *(c["torch_threads"]["physics"][k] for k in ("p50", "mean", "p99"))]])
        print(f"v2 vs v1: {c['v1_vs_v2']['v2_vs_v1']:.2f}x faster; render v2 / physics "
              f"{c['render_v2_over_physics']:.2f}")
    write_result(NAME, args.out_dir, MODULE, argv, args.quick, results, mach)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None))
