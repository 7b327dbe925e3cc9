"""Recording model queries from real benchmark tries: the INT8 calibration sets and Octo's parity queries
(:mod:`engines.calibration` keys them by what they are recorded from and says when to record again).

    python -m eval.calibration --model octo-small --out build/octo_queries/octo_small_dev_calib.npz
    python -m eval.calibration --model bc-state --out build/octo_queries/bc_state_dev_calib.npz

octo-small runs with seeded random weights (the weights every machine has), JAX on the CPU, through the one
rollout loop (:func:`eval.rollout.run_try`) with the locked dev task list, so the images are the frames a
benchmark try renders; the policy's warm-up query (blank images, run once before its first try) is made
before recording starts, so every recorded query is a real one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from engines.calibration import (BC_CALIB_TRIES, CALIB_TRIES, MODEL, QUICK_STEPS, SPLIT,  # noqa: F401
                                 RecordingError, recording_inputs, save)


class _Recording:
    """Wraps a policy's runner: every query's feeds and outputs are kept (copies), the call itself unchanged."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.rows: list[dict[str, np.ndarray]] = []
        self.meta: dict[str, Any] = {}

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self.runner.infer(feeds)
        if self.meta.get("on"):
            row = {k: np.array(v, copy=True) for k, v in feeds.items()}
            if "actions" in out:
                row["jax_actions"] = np.array(out["actions"], np.float32, copy=True)
            row["setup"] = np.array([self.meta["setup"]])
            row["try_index"] = np.array([self.meta["try"]], np.int32)
            self.rows.append(row)
        return out


def record(tries, quick: bool = False, progress: bool = True) -> dict[str, np.ndarray]:
    """The Octo queries of ``tries`` ((setup, try index) of the dev split), batch-stacked."""
    from env.setups import get_setup
    from env.tasklist import load
    from eval.request import make_policy
    from eval.rollout import Scenes, run_try

    if quick:
        from engines.octo.testing import tiny_octo

        policy = make_policy("octo-small", engine=tiny_octo(seed=1), backend="jax")
    else:
        policy = make_policy(MODEL, random_weights=True, backend="jax")
    rec = _Recording(policy.runner)
    policy.runner = rec
    policy.reset("warm-up", seed=0)  # the warm-up query (blank images) runs now, before anything is recorded
    tasklist = load(SPLIT)
    for setup_id, t in tries:
        t0 = time.monotonic()
        scenes = Scenes(get_setup(setup_id), 1, sim="cpu", cameras=True, max_steps=QUICK_STEPS if quick else None)
        try:
            rec.meta = {"on": True, "setup": setup_id, "try": t}
            run_try(scenes, policy, SPLIT, t, tasklist)
        finally:
            rec.meta = {}
            scenes.close()
        if progress:
            print(f"  {setup_id} try {t}: {sum(1 for r in rec.rows if r['setup'][0] == setup_id)} queries in "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
    if not rec.rows:
        raise RecordingError("the tries made no Octo query")
    keys = rec.rows[0].keys()
    return {k: np.concatenate([r[k] for r in rec.rows]) for k in keys}


def record_bc_states(tries, quick: bool = False, progress: bool = True) -> dict[str, np.ndarray]:
    """The states bc-state (fp32 on ONNX Runtime) reads on ``tries`` of the dev split, stacked."""
    from env.setups import get_setup
    from env.tasklist import load
    from eval.request import make_policy
    from eval.rollout import Scenes, run_try

    policy = make_policy("bc-state", backend="ort")
    rec = _Recording(policy.runner)
    policy.runner = rec
    tasklist = load(SPLIT)
    for setup_id, t in tries:
        scenes = Scenes(get_setup(setup_id), 1, sim="cpu", cameras=False, max_steps=QUICK_STEPS if quick else None)
        try:
            rec.meta = {"on": True, "setup": setup_id, "try": t}
            result = run_try(scenes, policy, SPLIT, t, tasklist)
        finally:
            rec.meta = {}
            scenes.close()
        if progress:
            print(f"  bc-state {setup_id} try {t}: success {result.success}", flush=True)
    if not rec.rows:
        raise RecordingError("the tries made no bc-state query")
    return {"state": np.concatenate([r["state"] for r in rec.rows]).astype(np.float32),
            "setup": np.concatenate([r["setup"] for r in rec.rows]),
            "try_index": np.concatenate([r["try_index"] for r in rec.rows])}




def main(argv=None) -> int:
    """Record ``--model``'s calibration queries on its calibration tries into ``--out`` (and its sidecar)."""
    from engines import quantize

    p = argparse.ArgumentParser(prog="python -m eval.calibration", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=(MODEL, "bc-state"))
    p.add_argument("--out", required=True, help="the .npz to write (its .json sidecar beside it)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    path = Path(args.out)
    tries = BC_CALIB_TRIES if args.model == "bc-state" else CALIB_TRIES
    try:
        if args.model == "bc-state":
            arrays = record_bc_states(tries, progress=not args.no_progress)
            info = {"model": "bc-state", "backend": "ort", "precision": "fp32"}
        else:
            arrays = record(tries, progress=not args.no_progress)
            info = {"model": MODEL, "random_weights": True, "backend": "jax"}
        save(arrays, path, {**info, "split": SPLIT, "tries": [list(t) for t in tries],
                            "command": quantize.RECORD_COMMAND.get(path.name, f"python -m eval.calibration --model "
                                                                  f"{args.model} --out {path}")},
             recording_inputs(args.model, tries))
    except (RecordingError, ValueError, OSError, ImportError) as e:
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
