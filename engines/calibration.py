"""Recording model queries from real benchmark tries (the INT8 calibration sets, Octo's parity queries), and
the calibration sets ``make engines`` needs, recorded only when what they are recorded from changed.

A recording is an .npz of the queries (Octo: uint8 images, padding masks, the instruction's T5 embedding,
the diffusion noise and the fp32 JAX actions; bc-state: its 40-number states) with a sidecar ``.json``: the
arrays' canonical hash (:func:`engines.quantize.arrays_sha256`, over names, dtypes, shapes and bytes) and
``inputs_sha256``, the hash of everything the recording is made from (:func:`recording_inputs`: the model,
the tries, the task list, the success predicate and, for camera policies, the appearance version of the
frames). :func:`ensure_calibration` re-runs the simulator only when that hash differs from the sidecar's.

octo-small runs with seeded random weights (the only Octo weights here), JAX on the CPU, through the one
rollout loop (:func:`eval.rollout.run_try`) with the locked dev task list, so the images are the frames a
benchmark try renders; the policy's warm-up query (blank images, run once before its first try) is made
before recording starts, so every recorded query is a real one.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

SPLIT = "dev"
MODEL = "octo-small"
# (setup, try index) of the dev split; the calibration tries share no setup with the parity tries
PARITY_TRIES = (("A01", 0), ("C01", 0), ("E01", 0))
CALIB_TRIES = (("B01", 1), ("D01", 1))
BC_CALIB_TRIES = tuple((f"{g}01", 10) for g in "ABCDEFG")
QUICK_STEPS = 12  # a --quick recording's tries are cut to this many steps


class RecordingError(RuntimeError):
    """A recording that made no query (one line)."""


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
    from eval.policies import octo_policy
    from eval.rollout import Scenes, run_try

    if quick:
        from engines.octo.testing import tiny_engine

        policy = octo_policy(engine=tiny_engine(seed=1), backend="jax")
    else:
        policy = octo_policy(MODEL, random_weights=True, backend="jax")
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
    from eval.policies import bc_state_policy
    from eval.rollout import Scenes, run_try

    policy = bc_state_policy(backend="ort")
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


def recording_inputs(model: str, tries, quick: bool = False) -> dict[str, Any]:
    """What a recording of ``model``'s queries on ``tries`` is made from; its hash names the recording."""
    from env.appearance import APPEARANCE_VERSION
    from env.predicate import SUCCESS_PREDICATE_VERSION
    from env.tasklist import load

    inputs: dict[str, Any] = {"model": model, "split": SPLIT, "tries": [list(t) for t in tries],
                              "tasklist_sha256": load(SPLIT).sha256, "predicate": SUCCESS_PREDICATE_VERSION,
                              "max_steps": QUICK_STEPS if quick else None}
    if model == "bc-state":
        from engines.bc_mlp import DEFAULT_WEIGHTS
        from engines.onnx_utils import sha256_file

        inputs["weights_sha256"] = sha256_file(DEFAULT_WEIGHTS)  # its actions decide the states it reaches
    else:  # frames: the appearance they were rendered with; actions: the seeded random weights
        inputs.update(appearance=APPEARANCE_VERSION, weights="octo-tiny seed 1" if quick else "random seed 0")
    return inputs


def inputs_sha256(inputs: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def save(arrays: Mapping[str, np.ndarray], path: Path, info: dict, inputs: Mapping[str, Any]) -> dict:
    """``path`` (.npz) and its sidecar ``path.json``: the canonical hash, the inputs and their hash, the command."""
    from engines.quantize import arrays_sha256

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)
    side = {**info, "file": path.name, "queries": int(len(next(iter(arrays.values())))),
            "sha256": arrays_sha256(arrays), "inputs": dict(inputs), "inputs_sha256": inputs_sha256(inputs),
            "arrays": {k: [str(v.dtype), list(v.shape)] for k, v in arrays.items()}}
    path.with_suffix(".json").write_text(json.dumps(side, indent=1) + "\n")
    return side


def recorded_inputs_sha256(path: Path) -> str | None:
    """The ``inputs_sha256`` of a recording's sidecar (None: no file, no sidecar, or one from before it)."""
    side = Path(path).with_suffix(".json")
    if not Path(path).is_file() or not side.is_file():
        return None
    try:
        return json.loads(side.read_text()).get("inputs_sha256")
    except (OSError, ValueError):
        return None


def ensure_calibration(model: str, folder: Path | None = None, progress: bool = True) -> tuple[Path, bool]:
    """The calibration recording ``make engines`` quantizes ``model`` with (in ``folder``, default
    ``build/octo_queries/``), and whether it was recorded now: the simulator runs only when the file is
    missing or was recorded from other inputs."""
    from engines import quantize

    path = quantize.BC_CALIB if model == "bc-state" else quantize.OCTO_CALIB
    path = Path(folder) / path.name if folder is not None else path
    tries = BC_CALIB_TRIES if model == "bc-state" else CALIB_TRIES
    inputs = recording_inputs("bc-state" if model == "bc-state" else MODEL, tries)
    if recorded_inputs_sha256(path) == inputs_sha256(inputs):
        return path, False
    if model == "bc-state":
        arrays = record_bc_states(tries, progress=progress)
        info = {"model": "bc-state", "backend": "ort", "precision": "fp32"}
    else:
        arrays = record(tries, progress=progress)
        info = {"model": MODEL, "random_weights": True, "backend": "jax"}
    save(arrays, path, {**info, "split": SPLIT, "tries": [list(t) for t in tries],
                        "command": quantize.RECORD_COMMAND[path.name]}, inputs)
    return path, True
