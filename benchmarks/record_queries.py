"""Record model queries from real benchmark tries, to .npz files with a canonical hash: Octo's feeds
(uint8 images, padding masks, the instruction's T5 embedding, the diffusion noise) with the fp32 JAX
actions, and bc-state's 40-number states.

    python -m benchmarks.record_queries                 # Octo's parity file and calibration file
    python -m benchmarks.record_queries --only bc-calib # bc-state's calibration states
    python -m benchmarks.record_queries --quick         # the tiny test model, 12 steps: checks it runs

Two files under build/octo_queries/ (too big to commit; this command remakes them byte for byte in
content, the hash says so):

- ``octo_small_dev_parity.npz``: tries PARITY_TRIES of the dev split (300 steps each, 75 queries a try at
  the default chunk of 4): the >= 200 queries every precision's parity is measured on.
- ``octo_small_dev_calib.npz``: tries CALIB_TRIES of the dev split, other setups and tries than the parity
  file's, driven by the scripted reference with Octo's queries recorded (no model runs; as ``make engines``
  records it): the INT8 calibration set (:mod:`engines.quantize`).

- ``bc_state_dev_calib.npz``: the states bc-state (fp32, ONNX Runtime) reads on tries BC_CALIB_TRIES of
  the dev split (try 10 of each group's first setup; the success comparison of
  :mod:`benchmarks.octo_precision` runs tries 0..4): bc-state's INT8 calibration set.

octo-small runs with seeded random weights (the only Octo weights here), JAX on the CPU, through the one
rollout loop (:func:`eval.rollout.run_try`) with the locked dev task list, so the images are the frames a
benchmark try renders; the policy's warm-up query (blank images, run once before its first try) is made
before recording starts, so every recorded query is a real one. The hash
(:func:`engines.quantize.arrays_sha256`) is over the arrays' names, dtypes, shapes and bytes, not over the
zip, so it names the content.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, BenchmarkError, parser, run_main
from engines.calibration import (BC_CALIB_TRIES, CALIB_TRIES, MODEL, PARITY_TRIES, SPLIT,  # noqa: F401
                                 RecordingError, recording_inputs, save)
from eval.calibration import record, record_bc_states, record_scripted
from engines.quantize import QUERIES_DIR

MODULE = "benchmarks.record_queries"
OUT_DIR = QUERIES_DIR
FILES = {"parity": "octo_small_dev_parity.npz", "calib": "octo_small_dev_calib.npz",
         "bc-calib": "bc_state_dev_calib.npz"}


def command_line(quick: bool = False) -> str:
    return f"python -m {MODULE}" + (" --quick" if quick else "")


def main(argv=None) -> int:
    p = parser(MODULE, __doc__.split("\n\n")[0])
    p.add_argument("--only", choices=tuple(FILES), help="record one of the two files")
    args = p.parse_args(argv)
    out = Path(args.out_dir) if args.out_dir else (OUT_DIR if not args.quick else ROOT / "runs" / "octo_queries")
    for kind, tries in (("parity", PARITY_TRIES), ("calib", CALIB_TRIES), ("bc-calib", BC_CALIB_TRIES)):
        if (args.only and kind != args.only) or (not args.only and kind == "bc-calib"):
            continue
        tries = tries[:1] if args.quick else tries
        name = FILES[kind].replace("octo_small", "octo_tiny") if args.quick else FILES[kind]
        try:
            if kind == "bc-calib":
                arrays = record_bc_states(tries, quick=args.quick, progress=not args.no_progress)
                info = {"model": "bc-state", "backend": "ort", "precision": "fp32"}
            elif kind == "calib":  # as make engines records it (engines.calibration.CALIB_DRIVER)
                arrays = record_scripted(tries, quick=args.quick, progress=not args.no_progress)
                info = {"model": "octo-tiny" if args.quick else MODEL, "driver": "scripted", "random_weights": True,
                        "backend": "none"}
            else:
                arrays = record(tries, quick=args.quick, progress=not args.no_progress)
                info = {"model": "octo-tiny" if args.quick else MODEL, "random_weights": True, "backend": "jax"}
        except RecordingError as e:
            raise BenchmarkError(str(e)) from None
        inputs = recording_inputs("bc-state" if kind == "bc-calib" else info["model"], tries, quick=args.quick,
                                  driver=info.get("driver", "model"))
        side = save(arrays, out / name, {**info, "split": SPLIT, "tries": [list(t) for t in tries],
                                         "command": command_line(args.quick) + (f" --only {kind}" if
                                                                                kind == "bc-calib" else "")}, inputs)
        print(f"{kind}: {side['queries']} queries -> {out / name} sha256 {side['sha256']}")
    return 0


def load_queries(path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """(arrays, sidecar) of a recorded file; the arrays' hash is checked against the sidecar's."""
    from engines.quantize import arrays_sha256

    path = Path(path)
    if not path.is_file():
        raise BenchmarkError(f"no recorded queries at {path}; record them with: {command_line()}")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    side_path = path.with_suffix(".json")
    side = json.loads(side_path.read_text()) if side_path.is_file() else {}
    digest = arrays_sha256(arrays)
    if side.get("sha256") and side["sha256"] != digest:
        raise BenchmarkError(f"{path} has sha256 {digest[:16]}, its sidecar says {side['sha256'][:16]}: record again")
    side["sha256"] = digest
    return arrays, side


if __name__ == "__main__":
    import sys

    sys.exit(run_main(main, None))
