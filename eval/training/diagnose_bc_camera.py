"""Where bc-camera's estimate goes wrong on its own tries: per phase, how far the estimated block is across from
the gripper against the truth (and how far its error follows the gripper), and which estimated features, made
true, bring bc-state's action on the estimate to its action on the truth.

    python -m eval.record --model bc-camera --checkpoint W --split train --setups all --tries 1 --out data/own_tries
    python -m eval.training.diagnose_bc_camera --weights W --datasets data/own_tries

The recording keeps every step's true scene features (``observation.environment_state``), which the policy never
saw. Phases of a step's truth: **far** (block not held, more than 30 mm across from the gripper), **hover** (within
30 mm across, more than 40 mm below the gripper: where versions 3 to 5 stalled), **low** (within 30 mm, lower) and
**grasped**; and within grasped, **over the hole** (held within 15 mm across of its hole: where a try that gets
there inserts or runs out of time). Each gives the action's error per action dimension too. Beside them, how many
tries grasp the block, carry it within 15 mm across of its hole and set it down there (their true scene says
so). The actions compared, with the step's true action history: the network's head on the estimate against
bc-state's (``--policy``, the head's teacher: its weights, or those a tuned head was tuned against) on the truth,
both with the knob's angle to the fingers set "aligned": bc-state solves the dev tries with it so (docs/models.md),
so a knob read wrong is not counted against the estimate. And **first step**: how far the estimated block is from
the truth at each try's first step (what a version-13 network keeps for the block away from the gripper), and how
many tries inserted their block with it within 25 mm, 25 to 50 mm and over 50 mm off (the recording's success).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from engines.bc_mlp import DEFAULT_WEIGHTS as BC_STATE_WEIGHTS
from engines.bc_mlp import HISTORY_DIM
from eval.lerobot.dataset import ACTION_NAMES
from eval.training.train_bc_camera import (GRASPED, OVER_HOLE_XY, TrainingInputError, estimates, over_the_hole,
                                           read_demos)

# groups of scene features (eval.training.state_features), each made true in turn
GROUPS = {"block_across": [6, 7, 16, 17], "block_height": [8, 18], "block_yaw": [9, 10, 31],
          "hole": [13, 14, 15, 19, 20, 21, 27, 28], "grasped": [GRASPED], "tilt": [22], "shape": [24, 25, 26]}
KNOB = [11, 12]
HOVER_XY, HOVER_DZ = 0.03, 0.04  # m
# how far a try got, from its true scene: the block held; held within OVER_HOLE_XY across of its hole; and there
# with its bottom within DOWN_DZ of the plate's top (set down on the plate, or in the hole)
DOWN_DZ = 0.005  # m
FIRST_STEP_BINS_MM = (25.0, 50.0)  # the first step's block error: within 25 mm, 25 to 50, over 50


def phases(scene: np.ndarray) -> np.ndarray:
    across = np.linalg.norm(scene[:, 16:18], axis=1)
    below = -scene[:, 18]
    held = scene[:, GRASPED] > 0.5
    return np.where(held, "grasped", np.where(across > HOVER_XY, "far", np.where(below > HOVER_DZ, "hover", "low")))


def stages(scene: np.ndarray, tries: np.ndarray) -> dict:
    """How many tries (``tries``: one id a step) reached each stage, from their true scene features."""
    held = scene[:, GRASPED] > 0.5
    over = over_the_hole(scene)
    down = over & (scene[:, 21] > -DOWN_DZ)
    ids = np.unique(tries)
    return {"tries": int(len(ids)), **{name: int(sum(m[tries == t].any() for t in ids))
                                       for name, m in (("grasped", held), ("over_the_hole", over),
                                                       ("down_at_the_hole", down))}}


def error_follows_gripper(est: np.ndarray, true: np.ndarray) -> tuple[float, float]:
    """How far the estimated block's error (x, y) moves with the gripper's offset from the block: a least-squares
    slope per axis over the steps given. 0 for an estimate read from the block, 1 for one that puts the block
    wherever the gripper is (v12 far from the block at new starts: 0.78 / 0.97, docs/models.md); nan where the
    gripper's offset does not vary."""
    error, offset = est[:, 6:8] - true[:, 6:8], -true[:, 16:18]
    g, e = offset - offset.mean(0), error - error.mean(0)
    den = (g * g).sum(0)
    return tuple(float((g[:, k] * e[:, k]).sum() / den[k]) if len(g) > 2 and den[k] > 0 else float("nan")
                 for k in (0, 1))


def first_step(est: np.ndarray, true: np.ndarray, starts: np.ndarray, success: np.ndarray) -> dict:
    """The estimated block's x, y error at each try's first step (rows ``starts``), and the tries inserted by that
    error's bin (``success``: each try's, 1.0 / 0.0, nan where the recording has none)."""
    err = np.linalg.norm(est[starts, 6:8] - true[starts, 6:8], axis=1) * 1000
    lo, hi = FIRST_STEP_BINS_MM
    bins = {f"within_{lo:g}_mm": err <= lo, f"{lo:g}_to_{hi:g}_mm": (err > lo) & (err <= hi),
            f"over_{hi:g}_mm": err > hi}
    known = ~np.isnan(success)
    return {"tries": int(len(err)), "block_error_mm": {"median": round(float(np.median(err)), 1),
                                                      "p90": round(float(np.quantile(err, 0.9)), 1)},
            "by_error": {name: {"tries": int(m.sum()),
                                "inserted": int(np.nansum(success[m])) if known[m].all() else None}
                         for name, m in bins.items()}}


def diagnose(weights: Path, roots: list[Path], cache: Path, show: bool = True, policy: Path = BC_STATE_WEIGHTS) -> dict:
    import torch

    from engines import bc_camera, bc_mlp
    from engines.onnx_utils import sha256_file

    model, config, _ = bc_camera.load(weights)
    demos = read_demos(roots, config, cache, show=show)
    low = torch.as_tensor(demos.low_dim)
    est = estimates(model, demos, config)
    true = demos.scene.copy()
    est[:, KNOB], true[:, KNOB] = (1.0, 0.0), (1.0, 0.0)

    def act(scene: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model.act(torch.as_tensor(scene, dtype=torch.float32), low).numpy()

    teacher = bc_mlp.load(policy)[0]
    with torch.no_grad():
        a_true = teacher(torch.cat([torch.as_tensor(true, dtype=torch.float32), low[:, -HISTORY_DIM:]], -1)).numpy()
    a_est = act(est)
    made_true = {}
    for name, idx in GROUPS.items():
        s = est.copy()
        s[:, idx] = true[:, idx]
        made_true[name] = act(s)
    phase = phases(demos.scene)
    out = {"weights": str(weights), "weights_sha256": sha256_file(weights), "policy_sha256": sha256_file(policy),
           "datasets": [str(r) for r in roots],
           "steps": int(len(low)),
           "stages": stages(demos.scene, demos.source.astype(np.int64) * 1_000_000 + demos.episode), "phases": {}}
    from eval.training.train_bc_camera import episode_starts

    out["first_step"] = first_step(est, true, episode_starts(demos), demos.success)
    r = lambda v: round(float(v), 3)  # noqa: E731
    over = over_the_hole(demos.scene)

    def action_errors(m: np.ndarray) -> dict:
        err = lambda a: np.median(np.linalg.norm(a[m] - a_true[m], axis=1))  # noqa: E731
        return {"steps": int(m.sum()), "action_error": r(err(a_est)),
                "action_error_per_dimension": dict(zip(ACTION_NAMES, map(r, np.median(np.abs(a_est[m] - a_true[m]),
                                                                                        axis=0)))),
                "action_error_with_true": {g: r(err(a)) for g, a in made_true.items()}}

    for name in ("far", "hover", "low", "grasped"):
        m = phase == name
        if not m.any():
            continue
        across_est = np.linalg.norm(est[m, 16:18], axis=1) * 1000
        across_true = np.linalg.norm(true[m, 16:18], axis=1) * 1000
        follows = error_follows_gripper(est[m], true[m])
        corr = [np.corrcoef(est[m, k], true[m, k])[0, 1] if m.sum() > 2 else float("nan") for k in (16, 17)]
        out["phases"][name] = {
            **action_errors(m),
            "block_across_mm": {"estimated": r(np.median(across_est)), "true": r(np.median(across_true)),
                                "error": r(np.median(np.linalg.norm(est[m, 16:18] - true[m, 16:18], axis=1) * 1000)),
                                "correlation_x": r(corr[0]), "correlation_y": r(corr[1]),
                                "follows_gripper_x": r(follows[0]), "follows_gripper_y": r(follows[1])}}
        if name == "grasped" and over.any():
            out["phases"][name]["over_the_hole"] = action_errors(over)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.training.diagnose_bc_camera", description=__doc__.split("\n")[0])
    p.add_argument("--weights", required=True, help="bc-camera weights (safetensors)")
    p.add_argument("--datasets", required=True, nargs="+", metavar="DIR",
                   help="recordings of its own tries (python -m eval.record --model bc-camera --checkpoint W)")
    p.add_argument("--policy", default=str(BC_STATE_WEIGHTS), metavar="W",
                   help="the bc-state weights whose action on the truth the network's is measured against")
    p.add_argument("--cache", default="build/diagnose_bc_camera/frames", help="decoded frames")
    p.add_argument("--out", help="write the report here (JSON)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    from engines.weights_file import BadCheckpointError

    try:
        report = diagnose(Path(args.weights), [Path(d) for d in args.datasets], Path(args.cache), not args.quiet,
                          Path(args.policy))
    except (TrainingInputError, BadCheckpointError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    st = report["stages"]
    print(f"{st['tries']} tries: {st['grasped']} grasp the block, {st['over_the_hole']} hold it within "
          f"{OVER_HOLE_XY * 1000:.0f} mm across of its hole, {st['down_at_the_hole']} of them with its bottom within "
          f"{DOWN_DZ * 1000:.0f} mm of the plate's top")
    fs = report["first_step"]
    print(f"first step: the estimated block {fs['block_error_mm']['median']} mm off (median; p90 "
          f"{fs['block_error_mm']['p90']}); inserted " + ", ".join(
              f"{b['inserted'] if b['inserted'] is not None else '?'} of {b['tries']} {name.replace('_', ' ')}"
              for name, b in fs["by_error"].items()))
    for name, ph in report["phases"].items():
        b = ph["block_across_mm"]
        made = ", ".join(f"{g} {v}" for g, v in ph["action_error_with_true"].items())
        print(f"{name}: {ph['steps']} steps; action error {ph['action_error']} (with true {made}); block across "
              f"estimated {b['estimated']} mm, truly {b['true']} mm, error {b['error']} mm, correlation "
              f"{b['correlation_x']} / {b['correlation_y']}, its error following the gripper "
              f"{b['follows_gripper_x']} / {b['follows_gripper_y']}")
        if "over_the_hole" in ph:
            o = ph["over_the_hole"]
            worst = max(o["action_error_per_dimension"].items(), key=lambda kv: kv[1])
            made = ", ".join(f"{g} {v}" for g, v in o["action_error_with_true"].items())
            print(f"  over the hole: {o['steps']} steps; action error {o['action_error']}, most in {worst[0]} "
                  f"({worst[1]}; with true {made})")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
