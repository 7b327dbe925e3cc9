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
# who drives the calibration tries: bc-state its own states; Octo's queries are recorded on tries the scripted
# reference drives (eval.calibration.record_scripted), whose frames grasp, carry and insert whatever Octo's weights
# are, with no model run (random-weight Octo driving cost 33 s of JAX inference and only flailed)
CALIB_DRIVER = {"bc-state": "model", MODEL: "scripted"}
# Octo's calibration keeps every CALIB_EVERY-th query of a try (queries are 4 control steps apart, so 8 here):
# each backbone pass of the calibration costs 0.25 s (octo-small) to 0.7 s (octo-base), and on octo-small's
# held-out queries the INT8 readout error was the same with 15, 30 or all 59 queries of these tries (max rel
# 0.057-0.064, mean abs 0.032-0.033; docs/engines.md, "Precisions")
CALIB_EVERY = 2
QUICK_STEPS = 12  # a --quick recording's tries are cut to this many steps


class RecordingError(RuntimeError):
    """A recording that could not be made (one line)."""


def recording_inputs(model: str, tries, quick: bool = False, driver: str = "model") -> dict[str, Any]:
    """What a recording of ``model``'s queries on ``tries`` is made from; its hash names the recording.
    ``driver``: who moved the arm, "model" (the model itself: Octo's parity queries, bc-state's states) or
    "scripted" (the scripted reference, while Octo's queries were recorded: the INT8 calibration set)."""
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
    else:  # frames: the appearance they were rendered with; instruction embedding (and, driven by the model, its
        # actions): the seeded random weights
        inputs.update(appearance=APPEARANCE_VERSION, weights="octo-tiny seed 1" if quick else "random seed 0")
    if driver != "model":
        inputs["driver"] = driver
    if driver == "scripted":
        inputs["every"] = CALIB_EVERY
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


def calibration_path(model: str, folder: Path | None = None) -> Path:
    """Where ``make engines`` keeps ``model``'s calibration recording (default ``build/octo_queries/``)."""
    from engines import quantize

    path = quantize.BC_CALIB if model == "bc-state" else quantize.OCTO_CALIB
    return Path(folder) / path.name if folder is not None else path


def _recording_model(model: str) -> str:
    return "bc-state" if model == "bc-state" else MODEL


def ensure_calibration(model: str, folder: Path | None = None, progress: bool = True) -> tuple[Path, bool]:
    """The calibration recording ``make engines`` quantizes ``model`` with (in ``folder``, default
    ``build/octo_queries/``), and whether it was recorded now: the simulator runs only when the file is
    missing or was recorded from other inputs."""
    return start_calibration(model, folder, progress).wait()


def start_calibration(model: str, folder: Path | None = None, progress: bool = True) -> "CalibrationJob":
    """:func:`ensure_calibration` started: the recording (when one is needed) runs in its own process while the
    caller goes on (``make engines`` exports meanwhile); :meth:`CalibrationJob.wait` for the file."""
    path = calibration_path(model, folder)
    tries = BC_CALIB_TRIES if model == "bc-state" else CALIB_TRIES
    inputs = recording_inputs(_recording_model(model), tries, driver=CALIB_DRIVER[_recording_model(model)])
    if recorded_inputs_sha256(path) == inputs_sha256(inputs):
        return CalibrationJob(path, None, [])
    return record_calibration(model, path, progress)


class CalibrationJob:
    """A calibration recording: already there (no process), or being recorded by ``python -m eval.calibration``."""

    def __init__(self, path: Path, proc, cmd: list[str]) -> None:
        self.path, self.proc, self.cmd = path, proc, cmd
        self.t0 = time.monotonic()

    @property
    def seconds(self) -> float | None:
        """How long the recording took, as its sidecar says (None: not recorded, or not said)."""
        try:
            return json.loads(self.path.with_suffix(".json").read_text()).get("recording_s")
        except (OSError, ValueError):
            return None

    @property
    def recorded(self) -> bool:
        return self.proc is not None

    def wait(self) -> tuple[Path, bool]:
        """(path, recorded now); a failed recording is one line (RecordingError)."""
        if self.proc is None:
            return self.path, False
        _, err = self.proc.communicate()
        if self.proc.returncode != 0:
            lines = (err or "").splitlines()
            why = next((ln.removeprefix("error: ") for ln in reversed(lines) if ln.startswith("error:")),
                       lines[-1] if lines else f"exit code {self.proc.returncode}")
            raise RecordingError(f"recording {self.path.name} failed ({' '.join(self.cmd[1:])}): {why}")
        return self.path, True

    def cancel(self) -> None:
        """Stop a recording still running (the caller failed or was interrupted); its file is not written."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: it did not stop
                self.proc.kill()


def record_calibration(model: str, path: Path, progress: bool = True) -> CalibrationJob:
    """Start recording ``model``'s calibration queries into ``path`` (and its sidecar). The recording runs
    benchmark tries (the simulator and the driving policy: the eval layer, above this one), so it runs as that
    layer's command, :mod:`eval.calibration`, in a process of its own; :meth:`CalibrationJob.wait` for it (its
    failure is one line)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "eval.calibration", "--model", _recording_model(model), "--out", str(path)] \
        + ([] if progress else ["--no-progress"])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=None if progress else subprocess.PIPE, text=True)
    return CalibrationJob(path, proc, cmd)
