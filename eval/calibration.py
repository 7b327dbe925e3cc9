"""Recording model queries from real benchmark tries: the INT8 calibration sets and Octo's parity queries
(:mod:`engines.calibration` keys them by what they are recorded from and says when to record again).

    python -m eval.calibration --model octo-small --out build/octo_queries/octo_small_dev_calib.npz
    python -m eval.calibration --model bc-state --out build/octo_queries/bc_state_dev_calib.npz

The Octo calibration set (``--model octo-small``) is recorded on tries the scripted reference drives
(:func:`record_scripted`): Octo's own policy (preprocessing, history window, query steps, the instruction
embedding of octo-small's T5 with seeded random weights) builds the feeds of every query it would make on the
frames of a try that grasps, carries and inserts, and no model runs. Octo's parity queries
(:func:`record`, :mod:`benchmarks.record_queries`) are its own tries: octo-small with seeded random weights,
JAX on the CPU, its fp32 actions kept. Both go through the one rollout loop (:func:`eval.rollout.run_try`)
with the locked dev task list, so the images are the frames a benchmark try renders; the policy's warm-up
query (blank images, run once before its first try) is made before recording starts, so every recorded
query is a real one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from engines.calibration import (BC_CALIB_TRIES, CALIB_DRIVER, CALIB_EVERY, CALIB_TRIES, MODEL,  # noqa: F401
                                 QUICK_STEPS, SPLIT, RecordingError, recording_inputs, save)
from eval.policies.base import Policy


class _Recording:
    """Wraps a policy's runner: every query's feeds and outputs are kept (copies), the call itself unchanged."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.rows: list[dict[str, np.ndarray]] = []
        self.meta: dict[str, Any] = {}

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def start_try(self, setup_id: str, try_index: int) -> None:
        self.meta = {"on": True, "setup": setup_id, "try": try_index}

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
    from eval.request import make_policy

    if quick:
        from engines.octo.testing import tiny_octo

        policy = make_policy("octo-small", engine=tiny_octo(seed=1), backend="jax")
    else:
        policy = make_policy(MODEL, random_weights=True, backend="jax")
    rec = _Recording(policy.runner)
    policy.runner = rec
    policy.reset("warm-up", seed=0)  # the warm-up query (blank images) runs now, before anything is recorded
    return _recorded_tries(tries, lambda setup: policy, rec, quick, progress)


def _recorded_tries(tries, policy_for, keeper, quick: bool, progress: bool, model: str = "Octo",
                    cameras: bool = True) -> dict[str, np.ndarray]:
    """Run ``tries`` ((setup, try index) of the dev split), each with ``policy_for(setup)``, while ``keeper``
    (:class:`_Recording`, :class:`_QueryKeeper`) keeps ``model``'s queries; its rows batch-stacked."""
    from env.setups import get_setup
    from env.tasklist import load
    from eval.rollout import Scenes, run_try

    tasklist = load(SPLIT)
    for setup_id, t in tries:
        t0 = time.monotonic()
        setup = get_setup(setup_id)
        policy = policy_for(setup)
        scenes = Scenes(setup, 1, sim="cpu", cameras=cameras, max_steps=QUICK_STEPS if quick else None)
        try:
            keeper.start_try(setup_id, t)
            result = run_try(scenes, policy, SPLIT, t, tasklist)
        finally:
            keeper.meta = {}
            scenes.close()
        if progress:
            print(f"  {model} {setup_id} try {t}: {sum(1 for r in keeper.rows if r['setup'][0] == setup_id)} "
                  f"queries, success {result.success}, {time.monotonic() - t0:.0f} s", flush=True)
    if not keeper.rows:
        raise RecordingError(f"the tries made no {model} query")
    keys = keeper.rows[0].keys()
    return {k: np.concatenate([r[k] for r in keeper.rows]) for k in keys}


class _QueryKeeper:
    """Octo's runner while the scripted reference drives: keeps every query's feeds (copies) and answers with a
    zero chunk, which the recording policy never applies; no model runs."""

    name = "none (feeds recorded)"

    def __init__(self, cfg, every: int = 1) -> None:
        self.cfg, self.every = cfg, every
        self.rows: list[dict[str, np.ndarray]] = []
        self.meta: dict[str, Any] = {}
        self.seen = 0  # queries of this try

    def start_try(self, setup_id: str, try_index: int) -> None:
        self.meta, self.seen = {"on": True, "setup": setup_id, "try": try_index}, 0

    def batch_sizes(self, n: int) -> list[int]:
        return [n]

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        b = int(feeds["masks"].shape[0])
        if self.meta.get("on") and self.seen % self.every == 0:
            row = {k: np.array(v, copy=True) for k, v in feeds.items()}
            row["setup"] = np.array([self.meta["setup"]] * b)
            row["try_index"] = np.array([self.meta["try"]] * b, np.int32)
            self.rows.append(row)
        self.seen += bool(self.meta.get("on"))
        return {"actions": np.zeros((b, self.cfg.action_horizon, self.cfg.action_dim), np.float32)}


class OctoQueriesOfScriptedTries(Policy):
    """The scripted reference drives the arm on the exact state; Octo's own policy (the same preprocessing,
    history window, query steps and instruction embedding as in a benchmark try) reads the frames it would
    read and makes the queries it would make, whose feeds its runner (:class:`_QueryKeeper`) keeps. The
    frames are those of a try that grasps, carries and inserts, whatever Octo's weights; no model runs, so a
    recording costs the simulator and the renders only."""

    name = "scripted (Octo's queries recorded)"
    track = "reference"
    observes = "state+cameras"

    def __init__(self, octo, driver) -> None:
        super().__init__()
        self.octo, self.driver = octo, driver

    def reset(self, instruction: str, seed: int | None = None) -> None:
        self.octo.reset(instruction, seed=seed)
        self.driver.reset(instruction, seed=seed)

    def set_start(self, start) -> None:
        self.octo.set_start(start)
        self.driver.set_start(start)

    def reads_observation(self, step: int) -> bool:
        return self.octo.reads_observation(step) or self.driver.reads_observation(step)

    def act(self, observation: Mapping[str, Any]) -> np.ndarray:
        self.octo.act(observation)  # Octo's query bookkeeping: its feeds are kept on its query steps
        return self.driver.act(observation)


def record_scripted(tries, quick: bool = False, progress: bool = True) -> dict[str, np.ndarray]:
    """Octo's queries (images, masks, instruction embedding, noise) on ``tries`` ((setup, try index) of the dev
    split) driven by the scripted reference (:class:`OctoQueriesOfScriptedTries`), every ``CALIB_EVERY``-th of
    a try's (its first included), batch-stacked: the INT8 calibration set. The instruction embedding is
    octo-small's T5 with seeded random weights (quick: the tiny test model's)."""
    from eval.policies.octo import OctoPolicy
    from eval.request import make_policy

    if quick:
        from engines.octo.testing import tiny_octo

        engine = tiny_octo(seed=1)
    else:
        from engines.octo.octo_model import load_octo

        engine = load_octo(MODEL, random_weights=True)
    keeper = _QueryKeeper(engine.cfg, every=CALIB_EVERY)

    def policy_for(setup):
        policy = OctoQueriesOfScriptedTries(OctoPolicy(engine, keeper), make_policy("scripted", setup=setup))
        policy.octo.reset("warm-up", seed=0)  # its warm-up query (blank images) before anything is kept
        return policy

    return _recorded_tries(tries, policy_for, keeper, quick, progress)


def record_bc_states(tries, quick: bool = False, progress: bool = True) -> dict[str, np.ndarray]:
    """The states bc-state (fp32 on ONNX Runtime) reads on ``tries`` of the dev split, stacked."""
    from eval.request import make_policy

    policy = make_policy("bc-state", backend="ort")
    rec = _Recording(policy.runner)
    policy.runner = rec
    arrays = _recorded_tries(tries, lambda setup: policy, rec, quick, progress, model="bc-state", cameras=False)
    return {"state": arrays["state"].astype(np.float32), "setup": arrays["setup"], "try_index": arrays["try_index"]}


def record_bc_camera_queries(tries, quick: bool = False, progress: bool = True) -> dict[str, np.ndarray]:
    """The feeds (both cameras' frames, joints, instruction, action history) bc-camera (its shipped weights, fp32
    on ONNX Runtime) gives its graph on ``tries`` of the dev split, stacked, with its fp32 actions."""
    from eval.request import make_policy

    policy = make_policy("bc-camera", backend="ort")
    rec = _Recording(policy.runner)
    policy.runner = rec
    arrays = _recorded_tries(tries, lambda setup: policy, rec, quick, progress, model="bc-camera")
    arrays["actions"] = arrays.pop("jax_actions")  # what _Recording names every model's outputs
    return arrays


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
    t0 = time.monotonic()
    try:
        if args.model == "bc-state":
            arrays = record_bc_states(tries, progress=not args.no_progress)
            info = {"model": "bc-state", "backend": "ort", "precision": "fp32"}
        else:
            arrays = record_scripted(tries, progress=not args.no_progress)
            info = {"model": MODEL, "driver": "scripted", "random_weights": True, "backend": "none"}
        save(arrays, path, {**info, "split": SPLIT, "tries": [list(t) for t in tries],
                            "recording_s": round(time.monotonic() - t0, 1),
                            "command": quantize.RECORD_COMMAND.get(path.name, f"python -m eval.calibration --model "
                                                                  f"{args.model} --out {path}")},
             recording_inputs(args.model, tries, driver=CALIB_DRIVER[args.model]))
    except (RecordingError, ValueError, OSError, ImportError) as e:
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
