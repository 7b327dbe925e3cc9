"""Expected TensorRT time of the exported policies on the Jetson AGX Orin, from their FLOPs: an estimate.

    make engines && python -m benchmarks.orin_estimate     # -> results/benchmarks/orin_estimate.json
    python -m benchmarks.orin_estimate --efficiency 0.05

No Orin is lent here, so this is arithmetic, labelled as such: the FLOPs of one query of each graph
``make engines`` wrote (:func:`engines.flops.graph_flops`, at batch 1, shapes from one ONNX Runtime run)
over the Orin GPU's peak at each precision, times a stated efficiency (``--efficiency``, default 0.10 of the
peak: batch-1 layers this small fill few of its 16 SMs). That compute term is a lower bound: a small graph
on a GPU is bound by its kernel launches and the query's copies, not its arithmetic. The benchmark's own
Orin number for the smallest network says how large that floor is: bc-state, 0.3 MFLOP, was published at
1.4 ms a query (docs/BENCHMARK.md section 8, measured on a Jetson AGX Orin, its runtime not stated; read by
eval.site.published), so ``expected_ms`` is that floor plus the compute term. Only a run of ``eval.orin``
on a device replaces it.

Peaks (NVIDIA Jetson AGX Orin Series Technical Brief v1.2; the 64 GB module at its top GPU clock,
1.3 GHz): 2048 CUDA cores, 5.3 TFLOPS FP32; 64 third-generation Tensor Cores, 170 sparse INT8 TOPS, so
85 dense INT8 TOPS and 42.5 dense FP16 TFLOPS (sparsity doubles the rate; FP16 runs at half the INT8
rate). TensorRT's fp32 engines run on the CUDA cores (TF32 aside), fp16 and int8 on the Tensor Cores.
"""

from __future__ import annotations

import sys
from typing import Sequence

import numpy as np

from benchmarks.common import BenchmarkError, machine, parser, print_table, run_main, write_result

NAME = "orin_estimate"
MODULE = "benchmarks.orin_estimate"
ORIN_PEAK_FLOPS = {"fp32": 5.3e12, "fp16": 42.5e12, "int8": 85e12}  # dense, per second (see the docstring)
ORIN_PEAK_SOURCE = ("NVIDIA Jetson AGX Orin Series Technical Brief v1.2: 5.3 FP32 TFLOPS (2048 CUDA cores), "
                    "170 sparse INT8 TOPS (64 Tensor Cores); dense = sparse / 2, FP16 = INT8 / 2")
DEFAULT_EFFICIENCY = 0.10
FLOOR_MODEL = "bc-state"  # the published Orin latency of the smallest network: the per-query floor
MODELS = ("bc-state", "bc-camera")  # one graph a query each (Octo's sampler runs its graph per denoising step)


def _feeds(path) -> dict[str, np.ndarray]:
    """Zeros of each graph input's shape (engines.quantize.input_specs), its dynamic (batch) dimensions at 1."""
    from engines.quantize import input_specs

    return {name: np.zeros([max(d, 1) for d in shape], dtype) for name, (shape, dtype) in input_specs(path).items()}


def published_floor_ms() -> float:
    from eval.site.published import read_published

    pub = read_published()
    entry = next((e for e in pub.entries if e.model == FLOOR_MODEL and e.ms_per_query), None)
    if entry is None:
        raise BenchmarkError(f"{pub.path} names no Orin ms/query for {FLOOR_MODEL}")
    return float(entry.ms_per_query)


def estimate(flops: int, precision: str, efficiency: float, floor_ms: float) -> dict:
    """The compute term (ms) at ``precision`` and ``efficiency`` of the peak, and the floor plus it."""
    compute_ms = flops / (ORIN_PEAK_FLOPS[precision] * efficiency) * 1e3
    return {"precision": precision, "compute_ms": round(compute_ms, 4),
            "expected_ms": round(floor_ms + compute_ms, 3)}


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(MODULE, __doc__.split("\n\n")[0])
    p.add_argument("--engines", default=None, help="the folder `make engines` wrote (default build/engines)")
    p.add_argument("--efficiency", type=float, default=DEFAULT_EFFICIENCY,
                   help=f"the fraction of the Orin's peak a query reaches (default {DEFAULT_EFFICIENCY})")
    args = p.parse_args(argv)
    if not 0 < args.efficiency <= 1:
        raise BenchmarkError(f"--efficiency must be in (0, 1], got {args.efficiency:g}")
    from pathlib import Path

    from engines.flops import graph_flops
    from engines.folder import EnginesFolderError, default_dir, file_of, model_entry
    from engines.optional import require

    onnx = require("onnx", "export")
    folder = default_dir() if args.engines is None else Path(args.engines)
    floor_ms = published_floor_ms()
    mach = machine()
    rows, table = [], []
    for name in MODELS:
        try:  # the graph as built (its sha256 checked against the manifest)
            entry = model_entry(folder, name)
            path = file_of(folder, entry, entry.get("graphs", {}).get("model"), "graph", name)
        except EnginesFolderError as e:
            raise BenchmarkError(str(e)) from None
        model = onnx.load(str(path))
        f = graph_flops(model, _feeds(path))
        if f["uncounted"]:
            raise BenchmarkError(f"{path}: {f['uncounted']} contracting nodes of unknown shape")
        est = [estimate(f["total"], prec, args.efficiency, floor_ms) for prec in ORIN_PEAK_FLOPS]
        rows.append({"model": name, "graph": path.name, "flops_per_query": f["total"],
                     "elementwise": f["elementwise"], "onnx_nodes": len(model.graph.node), "estimates": est})
        table += [[name, f"{f['total'] / 1e6:.3f}", e["precision"], e["compute_ms"], e["expected_ms"]] for e in est]
    print_table(f"expected Orin TensorRT ms a query (an estimate: efficiency {args.efficiency:g}, floor "
                f"{floor_ms:g} ms = the published {FLOOR_MODEL})",
                ["model", "MFLOP", "precision", "compute ms", "expected ms"], table)
    results = {"label": "an estimate from FLOPs, not a measurement", "efficiency": args.efficiency,
               "peak_flops_per_s": ORIN_PEAK_FLOPS, "peak_source": ORIN_PEAK_SOURCE,
               "floor_ms": floor_ms, "floor_source": f"docs/BENCHMARK.md section 8: {FLOOR_MODEL} ms/query on the Orin",
               "models": rows}
    write_result(NAME, args.out_dir, MODULE, argv, args.quick, results, mach)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, sys.argv[1:] if len(sys.argv) > 1 else None))
