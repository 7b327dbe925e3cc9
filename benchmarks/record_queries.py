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
  file's: the INT8 calibration set (:mod:`engines.quantize`).

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
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from benchmarks.common import ROOT, BenchmarkError, parser, run_main

MODULE = "benchmarks.record_queries"
OUT_DIR = ROOT / "build" / "octo_queries"
SPLIT = "dev"
MODEL = "octo-small"
# (setup, try index) of the dev split; the calibration tries share no setup with the parity tries
PARITY_TRIES = (("A01", 0), ("C01", 0), ("E01", 0))
CALIB_TRIES = (("B01", 1), ("D01", 1))
BC_CALIB_TRIES = tuple((f"{g}01", 10) for g in "ABCDEFG")
FILES = {"parity": "octo_small_dev_parity.npz", "calib": "octo_small_dev_calib.npz",
         "bc-calib": "bc_state_dev_calib.npz"}


def command_line(quick: bool = False) -> str:
    return f"python -m {MODULE}" + (" --quick" if quick else "")


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
    """The queries of ``tries`` ((setup, try index) of the dev split), batch-stacked."""
    from env.setups import get_setup
    from env.tasklist import load
    from eval.request import make_policy
    from eval.rollout import Scenes, run_try

    if quick:
        from engines.octo.testing import tiny_engine

        policy = make_policy("octo-small", engine=tiny_engine(seed=1), backend="jax")
    else:
        policy = make_policy(MODEL, random_weights=True, backend="jax")
    rec = _Recording(policy.runner)
    policy.runner = rec
    policy.reset("warm-up", seed=0)  # the warm-up query (blank images) runs now, before anything is recorded
    tasklist = load(SPLIT)
    for setup_id, t in tries:
        t0 = time.monotonic()
        scenes = Scenes(get_setup(setup_id), 1, sim="cpu", cameras=True, max_steps=12 if quick else None)
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
        raise BenchmarkError("the tries made no Octo query")
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
        scenes = Scenes(get_setup(setup_id), 1, sim="cpu", cameras=False, max_steps=12 if quick else None)
        try:
            rec.meta = {"on": True, "setup": setup_id, "try": t}
            record = run_try(scenes, policy, SPLIT, t, tasklist)
        finally:
            rec.meta = {}
            scenes.close()
        if progress:
            print(f"  bc-state {setup_id} try {t}: success {record.success}", flush=True)
    if not rec.rows:
        raise BenchmarkError("the tries made no bc-state query")
    return {"state": np.concatenate([r["state"] for r in rec.rows]).astype(np.float32),
            "setup": np.concatenate([r["setup"] for r in rec.rows]),
            "try_index": np.concatenate([r["try_index"] for r in rec.rows])}


def save(arrays: Mapping[str, np.ndarray], path: Path, info: dict) -> dict:
    """``path`` (.npz) and its sidecar ``path.json``: the canonical hash, the command, the tries."""
    from engines.quantize import arrays_sha256

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)
    side = {**info, "file": path.name, "queries": int(len(next(iter(arrays.values())))),
            "sha256": arrays_sha256(arrays),
            "arrays": {k: [str(v.dtype), list(v.shape)] for k, v in arrays.items()}}
    path.with_suffix(".json").write_text(json.dumps(side, indent=1) + "\n")
    return side


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
        if kind == "bc-calib":
            arrays = record_bc_states(tries, quick=args.quick, progress=not args.no_progress)
            info = {"model": "bc-state", "backend": "ort", "precision": "fp32"}
        else:
            arrays = record(tries, quick=args.quick, progress=not args.no_progress)
            info = {"model": "octo-tiny" if args.quick else MODEL, "random_weights": True, "backend": "jax"}
        side = save(arrays, out / name, {**info, "split": SPLIT, "tries": [list(t) for t in tries],
                                         "command": command_line(args.quick) + (f" --only {kind}" if
                                                                                kind == "bc-calib" else "")})
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
