"""Recording model queries from real benchmark tries (the INT8 calibration sets, Octo's parity queries), and
the calibration sets ``make engines`` needs, recorded only when what they are recorded from changed.

A recording is an .npz of the queries (Octo: uint8 images, padding masks, the instruction's T5 embedding,
the diffusion noise and the fp32 JAX actions; bc-state: its 40-number states) with a sidecar ``.json``: the
arrays' canonical hash (:func:`engines.quantize.arrays_sha256`, over names, dtypes, shapes and bytes) and
``inputs_sha256``, the hash of everything the recording is made from (:func:`recording_inputs`: the model,
the tries, the task list, the success predicate and, for camera policies, the appearance version of the
frames). :func:`ensure_calibration` re-runs the simulator only when that hash differs from the sidecar's.

The recording itself runs benchmark tries (:mod:`eval.calibration`, the eval layer's: the simulator and the
model's policy), started by :func:`ensure_calibration` as its own process.
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
    """A recording that could not be made (one line)."""


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
    record_calibration(model, path, progress)
    return path, True


def record_calibration(model: str, path: Path, progress: bool = True) -> None:
    """Record ``model``'s calibration queries into ``path`` (and its sidecar). The recording runs benchmark tries
    (the simulator and the model's policy: the eval layer, above this one), so it runs as that layer's command,
    :mod:`eval.calibration`, in a process of its own; its failure is one line."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "eval.calibration", "--model", "bc-state" if model == "bc-state" else MODEL,
           "--out", str(path)] + ([] if progress else ["--no-progress"])
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=None if progress else subprocess.PIPE, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or "").splitlines()
        why = next((ln.removeprefix("error: ") for ln in reversed(lines) if ln.startswith("error:")),
                   lines[-1] if lines else f"exit code {proc.returncode}")
        raise RecordingError(f"recording {path.name} failed ({' '.join(cmd[1:])}): {why}")
