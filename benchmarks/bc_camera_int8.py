"""bc-camera at INT8 on ONNX Runtime against fp32: its actions on real queries and its latency at batch 1.

    make engines && python -m benchmarks.bc_camera_int8     # -> results/benchmarks/bc_camera_int8.json
    python -m benchmarks.bc_camera_int8 --quick             # tries cut to a few steps: checks it runs

The shipped weights (engines/weights/bc_camera.safetensors) as ``make engines`` exported them
(build/engines/bc_camera.onnx). Queries are bc-camera's own on dev tries, fp32 on ONNX Runtime
(:func:`eval.calibration.record_bc_camera_queries`): the calibration tries' queries give the INT8 ranges
(:func:`engines.quantize.int8_graph`, the pass every INT8 graph here takes: Q/DQ, Conv, Gemm and MatMul
per channel), the parity tries' (other starts) the error of the INT8 graph's first action against fp32's,
raw and over the action's range ([-1, 1], so max abs / 2). Latency: both graphs on one intra-op thread, as an
eval worker runs them, batch 1, interleaved round by round so that load falls on both alike (p50, p99,
their ratio). Success at INT8 is not measured: ``eval.run`` refuses bc-camera at int8
(engines.quantize.INT8_REFUSED), and what this measures is whether it should.
"""

from __future__ import annotations

import sys
import time
from typing import Sequence

import numpy as np

from benchmarks.common import ROOT, BenchmarkError, machine, parser, print_table, run_main, stats_ms, write_result

NAME = "bc_camera_int8"
MODULE = "benchmarks.bc_camera_int8"
CALIB_TRIES = (("A01", 10), ("C01", 10), ("E01", 10), ("G01", 10))  # dev starts the benchmark's tries (0..9) skip
PARITY_TRIES = (("B01", 11), ("D01", 11), ("F01", 11))
ROUNDS = 20
PER_ROUND = 10  # queries per graph per round


def _session(path, threads: int = 1):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _graph_inputs() -> tuple[str, ...]:
    """The shipped network's graph inputs (version 13 adds ``wrist_first``), read from its weights file."""
    from engines.bc_camera import DEFAULT_WEIGHTS, load

    return load(DEFAULT_WEIGHTS)[1].input_names


def _rows(arrays: dict, i: int, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    return {k: arrays[k][i:i + 1] for k in names}


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(MODULE, __doc__.split("\n\n")[0])
    args = p.parse_args(argv)
    from engines.folder import EnginesFolderError, default_dir, file_of, model_entry
    from engines.quantize import Calibration, arrays_sha256, int8_graph
    from eval.calibration import record_bc_camera_queries

    folder = default_dir()
    try:
        entry = model_entry(folder, "bc-camera")
        fp32 = file_of(folder, entry, entry.get("graphs", {}).get("model"), "graph", "bc-camera")
    except EnginesFolderError as e:
        raise BenchmarkError(str(e)) from None
    show = not args.no_progress
    mach = machine()
    calib = record_bc_camera_queries(CALIB_TRIES, quick=args.quick, progress=show)
    parity = record_bc_camera_queries(PARITY_TRIES, quick=args.quick, progress=show)
    names = _graph_inputs()
    feeds = {k: calib[k] for k in names}
    n_calib = len(calib["low_dim"])
    calibration = Calibration(name=f"bc-camera dev queries of {len(CALIB_TRIES)} tries", sha256=arrays_sha256(feeds),
                              feeds=lambda: (_rows(calib, i, names) for i in range(n_calib)), samples=n_calib)
    out_dir = (ROOT / "runs" / "benchmarks") if args.quick else (ROOT / "runs" / NAME)
    t0 = time.monotonic()
    int8 = int8_graph(fp32, calibration, weights_digest=entry["weights"]["sha256"],
                      out_path=out_dir / "bc_camera.int8.onnx")
    quantize_s = time.monotonic() - t0
    sessions = {"fp32": _session(fp32), "int8": _session(int8)}
    n = len(parity["low_dim"])
    first = {name: np.concatenate([s.run(["actions"], _rows(parity, i, names))[0][:, 0] for i in range(n)])
             for name, s in sessions.items()}
    ref = first["fp32"]
    d = np.abs(first["int8"] - ref)
    recorded = np.abs(ref - parity["actions"][:, 0]).max()  # this session's fp32 against the policy's own
    parity_row = {"queries": int(n), "max_abs": float(d.max()), "mean_abs": float(d.mean()),
                  "max_over_action_range": float(d.max() / 2), "per_component_max_abs": d.max(0).round(4).tolist(),
                  "gripper_sign_flips": int(np.sum(np.sign(first["int8"][:, 6]) != np.sign(ref[:, 6]))),
                  "fp32_vs_recorded_max_abs": float(recorded)}
    times = {name: [] for name in sessions}
    rounds = 2 if args.quick else ROUNDS
    for name, s in sessions.items():  # warm-up
        for i in range(3):
            s.run(["actions"], _rows(parity, i % n, names))
    for r in range(rounds):
        for name, s in sessions.items():
            for k in range(PER_ROUND):
                row = _rows(parity, (r * PER_ROUND + k) % n, names)
                t = time.perf_counter()
                s.run(["actions"], row)
                times[name].append((time.perf_counter() - t) * 1e3)
    lat = {name: stats_ms(v) for name, v in times.items()}
    ratio = lat["int8"]["p50"] / lat["fp32"]["p50"]
    print_table("bc-camera INT8 against fp32 (ONNX Runtime, 1 thread, batch 1)",
                ["graph", "p50 ms", "p99 ms", "first action max abs vs fp32"],
                [["fp32", lat["fp32"]["p50"], lat["fp32"]["p99"], 0.0],
                 ["int8", lat["int8"]["p50"], lat["int8"]["p99"], round(parity_row["max_abs"], 4)]])
    print(f"int8 / fp32 p50: {ratio:.2f}x; mean abs action error {parity_row['mean_abs']:.4f}")
    results = {"weights_sha256": entry["weights"]["sha256"], "fp32_graph": fp32.name,
               "calibration": {"tries": [list(t) for t in CALIB_TRIES], "queries": n_calib,
                               "sha256": calibration.sha256, "quantize_s": round(quantize_s, 1)},
               "parity": {"tries": [list(t) for t in PARITY_TRIES], **parity_row},
               "latency_ms": lat, "int8_over_fp32_p50": round(ratio, 3), "threads": 1, "batch": 1,
               "rounds": rounds, "per_round": PER_ROUND}
    write_result(NAME, args.out_dir, MODULE, argv, args.quick, results, mach)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, sys.argv[1:] if len(sys.argv) > 1 else None))
