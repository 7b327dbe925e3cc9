"""Every precision against fp32 JAX, per stage and in action space, on queries recorded from real tries; the
latency of each precision on ONNX Runtime; and bc-state's dev-split successes per precision, side by side.

    python -m benchmarks.octo_precision            # -> results/benchmarks/octo_precision.json
    python -m benchmarks.octo_precision --quick    # the tiny model, a few queries: checks it runs

Octo (octo-small, seeded random weights: success meaningless, so only parity and speed):

- queries: ``build/octo_queries/octo_small_dev_parity.npz`` (>= 200 queries of 3 dev tries; its canonical
  sha256 and the command that records it are in the JSON), the same noise on every backend;
- per precision (ORT fp32, ORT int8 = the Q/DQ backbone + the fp32 sampler; bf16 where ORT has the kernels)
  the max abs and relative error (max abs over the reference's max magnitude) of the readout (the
  backbone's output) and of the normalised actions, against fp32 JAX (the exported functions jitted);
- p50 latency of one query (backbone + sampler) at batch 1 on ORT, precisions interleaved in one run, and
  the ratios to ORT fp32 (targets: int8 <= 0.5x, bf16 <= 0.7x where supported).

bc-state (the one model with trained weights): its INT8 graph's action error against fp32 (torch) over
states recorded from dev tries the calibration did not use, and its dev-split successes per precision with
``python -m eval.run`` (the exact commands in the JSON). TensorRT INT8 from the same Q/DQ graph is a step of
``benchmarks/device_check.sh`` (a GPU); here it is listed as skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, BenchmarkError, machine, parser, print_table, run_main, stats_ms, write_result

NAME = "octo_precision"
MODULE = "benchmarks.octo_precision"
TARGETS = {"int8": 0.5, "bf16": 0.7}  # p50 over ORT fp32's
LATENCY_QUERIES = 20  # per precision, batch 1, interleaved
PARITY_BATCH = 8  # parity rows run in batches (the graphs and JAX give each row the same result at any batch)
BC_SETUPS = "A01,B01,C01,D01,E01,F01,G01"
BC_TRIES = 5  # tries 0..4 of each setup; the calibration used try 10, the parity states try 11
BC_PARITY_TRIES = tuple((f"{g}01", 11) for g in "ABCDEFG")


def _err(a, ref) -> dict:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    d = np.abs(a - ref)
    return {"max_abs": float(d.max()), "rel": float(d.max() / max(float(np.abs(ref).max()), 1e-12)),
            "mean_abs": float(d.mean())}


def _round(x):
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, float):
        return float(f"{x:.6g}")
    return x


def octo_parity(arrays, engine, onnx, int8_path, progress: bool, n_latency: int) -> dict:
    import jax

    from engines.backends import rel_err  # noqa: F401 - the same measure, spelled out in _err
    from engines.octo.export import backbone_feeds, backbone_fn, backbone_input_names, sampler_feeds, sampler_fn
    from engines.quantize import complete_feeds, input_specs, ort_bf16_reason
    from engines.runners import OnnxRuntimeRunner, cpu_count

    cfg, params = engine.cfg, engine.params
    n = len(arrays["masks"])
    names = backbone_input_names(cfg)
    specs = input_specs(onnx.backbone)

    def feeds(rows):
        f = backbone_feeds(cfg, [arrays[f"image_{c.name}"][rows] for c in cfg.cameras], arrays["masks"][rows],
                           arrays["lang"][rows])
        return complete_feeds(f, specs)

    def noise(rows):
        return arrays["init_noise"][rows], np.swapaxes(arrays["step_noise"][rows], 0, 1)  # steps first

    jb = jax.jit(backbone_fn(cfg, params))
    js = jax.jit(sampler_fn(cfg, params))
    threads = cpu_count()
    runners = {"fp32": OnnxRuntimeRunner(onnx.backbone, "cpu", intra_op_threads=threads).activate(),
               "int8": OnnxRuntimeRunner(int8_path, "cpu", intra_op_threads=threads).activate()}
    sampler = OnnxRuntimeRunner(onnx.sampler, "cpu", intra_op_threads=threads).activate()
    ref_r, ref_a, out_r, out_a, sampler_only = [], [], {p: [] for p in runners}, {p: [] for p in runners}, []
    batches = [np.arange(i, min(i + PARITY_BATCH, n)) for i in range(0, n, PARITY_BATCH)]
    t0 = time.monotonic()
    for k, rows in enumerate(batches):
        padded = np.concatenate([rows, np.repeat(rows[-1:], PARITY_BATCH - len(rows))])  # one jit shape
        f = feeds(padded)
        init, steps = noise(padded)
        r = np.asarray(jb(*[f[x] for x in names]))
        a = np.asarray(js(r, init, np.swapaxes(steps, 0, 1)))
        ref_r.append(r[: len(rows)])
        ref_a.append(a[: len(rows)])
        sf = sampler_feeds(r, init, steps)
        sampler_only.append(sampler.infer(sf)["actions"][: len(rows)])
        for p, runner in runners.items():
            rp = runner.infer(f)["readout"]
            out_r[p].append(rp[: len(rows)])
            out_a[p].append(sampler.infer(sampler_feeds(rp, init, steps))["actions"][: len(rows)])
        if progress:
            print(f"  parity batch {k + 1}/{len(batches)} ({time.monotonic() - t0:.0f} s)", flush=True)
    ref_r, ref_a = np.concatenate(ref_r), np.concatenate(ref_a)
    precisions = {}
    for p in runners:
        r, a = np.concatenate(out_r[p]), np.concatenate(out_a[p])
        precisions[p] = {"supported": True, "graph": str(onnx.backbone if p == "fp32" else int8_path),
                         "readout": _err(r, ref_r), "actions_normalised": _err(a, ref_a),
                         "actions_normalised_per_dim_max_abs": np.abs(a - ref_a).max(axis=(0, 1)).round(6).tolist()}
    precisions["fp32"]["sampler_stage_alone"] = _err(np.concatenate(sampler_only), ref_a)
    bf16 = ort_bf16_reason()
    precisions["bf16"] = {"supported": bf16 is None, "reason": bf16}
    # latency: one query (backbone + sampler) at batch 1, precisions interleaved so load drifts hit both
    lat = {p: [] for p in runners}
    for i in range(min(n_latency, n) + 1):
        rows = np.array([i % n])
        f = feeds(rows)
        init, steps = noise(rows)
        for p, runner in runners.items():
            t = time.perf_counter()
            rp = runner.infer(f)["readout"]
            sampler.infer(sampler_feeds(rp, init, steps))
            if i:  # the first of each is a warm-up
                lat[p].append((time.perf_counter() - t) * 1e3)
    for p in runners:
        precisions[p]["latency_ms_batch1"] = stats_ms(lat[p])
    base = precisions["fp32"]["latency_ms_batch1"]["p50"]
    for p in runners:
        ratio = precisions[p]["latency_ms_batch1"]["p50"] / base
        precisions[p]["p50_over_ort_fp32"] = round(ratio, 3)
        if p in TARGETS:
            precisions[p]["target_p50_over_ort_fp32"] = TARGETS[p]
            precisions[p]["meets_target"] = bool(ratio <= TARGETS[p])
    precisions["bf16"]["target_p50_over_ort_fp32"] = TARGETS["bf16"]
    precisions["bf16"]["meets_target"] = None
    for r in list(runners.values()) + [sampler]:
        r.deactivate()
    return {"queries": n, "intra_op_threads": threads, "precisions": _round(precisions)}


def bc_parity(progress: bool, quick: bool) -> dict:
    import onnxruntime  # noqa: F401

    from benchmarks.record_queries import record_bc_states
    from engines.bc_mlp import DEFAULT_WEIGHTS, load, numpy_forward
    from engines.calibration import ensure_calibration
    from engines.quantize import arrays_sha256, bc_calibration, int8_graph
    from engines.onnx_utils import metadata, sha256_file
    from engines.runners import OnnxRuntimeRunner

    digest = sha256_file(DEFAULT_WEIGHTS)
    fp32 = ROOT / "build" / "engines" / "bc_state.onnx"
    if not fp32.is_file():
        raise BenchmarkError(f"no {fp32}; build it with: python -m engines.build --models bc-state")
    # bc-state's INT8 is refused (engines.quantize.INT8_REFUSED, from this measurement): make engines builds
    # none, so the decision's measurement builds its own from the same calibration recording
    int8 = int8_graph(fp32, bc_calibration(ensure_calibration("bc-state", progress=progress)[0]),
                      weights_digest=digest, out_path=ROOT / "runs" / NAME / "bc_state.int8.onnx")
    tries = BC_PARITY_TRIES[:1] if quick else BC_PARITY_TRIES
    arrays = record_bc_states(tries, quick=quick, progress=progress)
    states = arrays["state"]
    net, _, _ = load(DEFAULT_WEIGHTS)
    ref = numpy_forward(net, states)
    out = {}
    for p, path in (("fp32", fp32), ("int8", int8)):
        r = OnnxRuntimeRunner(path, "cpu", intra_op_threads=1).activate()
        a = r.infer({"state": states})["action"]
        lat = []
        for i in range(min(200, len(states))):
            t = time.perf_counter()
            r.infer({"state": states[i:i + 1]})
            lat.append((time.perf_counter() - t) * 1e3)
        r.deactivate()
        out[p] = {"graph": str(path.relative_to(ROOT)), "actions_normalised": _err(a, ref),
                  "per_dim_max_abs": np.abs(a - ref).max(axis=0).round(6).tolist(),
                  "latency_ms_batch1": stats_ms(lat[1:])}
    out["int8"]["p50_over_ort_fp32"] = round(out["int8"]["latency_ms_batch1"]["p50"]
                                             / out["fp32"]["latency_ms_batch1"]["p50"], 3)
    meta = metadata(int8)
    return {"reference": "torch fp32 (engines.bc_mlp.numpy_forward)", "states": int(len(states)),
            "states_sha256": arrays_sha256(arrays), "states_from": f"bc-state fp32 (ort) on dev tries "
            f"{', '.join(f'{s}/{t}' for s, t in tries)}", "calibration": meta.get("calibration"),
            "calibration_sha256": meta.get("calibration_sha256"), "precisions": _round(out)}


def refused_graph_successes(graph: Path, setups: str, tries: int) -> dict:
    """bc-state's dev-split tries with ``graph``, a precision ``eval.run`` refuses for it (INT8_REFUSED): the same
    tries through the one rollout loop with the policy on that graph, so that the refusal's evidence can be
    measured again (``eval.run`` itself never runs it)."""
    from env.setups import get_setup
    from env.tasklist import load
    from engines.runners import OnnxRuntimeRunner, cpu_count
    from eval.policies.bc_state import BCStatePolicy
    from eval.rollout import Scenes, run_try

    policy = BCStatePolicy(OnnxRuntimeRunner(graph, "cpu", intra_op_threads=cpu_count()).activate())
    tasklist, per_setup, t0 = load("dev"), {}, time.monotonic()
    for sid in setups.split(","):
        k = 0
        for t in range(tries):
            scenes = Scenes(get_setup(sid), 1, sim="cpu", cameras=False)
            try:
                k += bool(run_try(scenes, policy, "dev", t, tasklist).success)
            finally:
                scenes.close()
        per_setup[sid] = f"{k}/{tries}"
    k = sum(int(v.split("/")[0]) for v in per_setup.values())
    return {"graph": str(graph.relative_to(ROOT)) if graph.is_relative_to(ROOT) else str(graph),
            "how": "eval.rollout.run_try with BCStatePolicy on the graph (eval.run refuses this precision)",
            "k": k, "n": tries * len(per_setup), "per_setup": per_setup, "wall_s": round(time.monotonic() - t0, 1)}


def bc_successes(quick: bool, int8_graph: Path | None = None) -> dict:
    """bc-state's dev-split tries per precision through eval.run (subprocesses, one after another); a refused
    precision with a graph given (``int8_graph``: the one the decision is measured on) is also run on that
    graph (:func:`refused_graph_successes`)."""
    setups, tries = ("A01", 1) if quick else (BC_SETUPS, BC_TRIES)
    out = {}
    for p in ("fp32", "int8", "bf16"):
        folder = ROOT / "runs" / NAME / f"bc_state_{p}"
        cmd = ["python", "-m", "eval.run", "--model", "bc-state", "--backend", "ort", "--precision", p,
               "--split", "dev", "--setups", setups, "--tries", str(tries), "--out", str(folder.relative_to(ROOT)),
               "--fresh"]
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, *cmd[1:]], cwd=ROOT, capture_output=True, text=True)
        row = {"command": " ".join(cmd), "exit": proc.returncode, "wall_s": round(time.monotonic() - t0, 1)}
        if proc.returncode != 0:
            row["error"] = (proc.stderr.strip().splitlines() or [""])[-1]
        else:
            summary = json.loads((folder / "summary.json").read_text())
            k = sum(v["k"] for v in summary["setups"].values())
            n = sum(v["n"] for v in summary["setups"].values())
            row.update({"k": k, "n": n, "per_setup": {s: f"{v['k']}/{v['n']}" for s, v in summary["setups"].items()
                                                      if v["n"]}})
        if p == "int8" and proc.returncode != 0 and int8_graph is not None:
            row["graph_tries"] = refused_graph_successes(int8_graph, setups, tries)
        out[p] = row
    return out


def main(argv=None) -> int:
    p = parser(MODULE, __doc__.split("\n\n")[0])
    p.add_argument("--skip-bc", action="store_true", help="Octo only")
    p.add_argument("--skip-octo", action="store_true", help="bc-state only")
    args = p.parse_args(argv)
    mach = machine()
    progress = not args.no_progress
    results: dict = {"targets_p50_over_ort_fp32": TARGETS}
    if not args.skip_octo:
        from benchmarks.record_queries import FILES, OUT_DIR, command_line, load_queries
        from engines.octo.export import onnx_for_octo, params_digest
        from engines.onnx_utils import metadata as metadata_of
        from engines.quantize import find_int8, int8_graph, int8_name, octo_calibration

        if args.quick:
            from engines.octo.testing import tiny_octo

            engine = tiny_octo(seed=1)
            path = ROOT / "runs" / "octo_queries" / FILES["parity"].replace("octo_small", "octo_tiny")
        else:
            from engines.octo.octo_model import load_octo

            engine = load_octo("octo-small", random_weights=True, seed=0)
            path = OUT_DIR / FILES["parity"]
        arrays, side = load_queries(path)
        if args.quick:
            arrays = {k: v[:4] for k, v in arrays.items()}
        onnx = onnx_for_octo(engine, progress=progress)
        digest = params_digest(engine.params)
        if args.quick:
            calib = octo_calibration(engine.cfg, path.with_name(path.name.replace("parity", "calib")))
            int8 = int8_graph(onnx.backbone, calib, weights_digest=digest)
        else:
            int8 = find_int8([int8_name(onnx.backbone), ROOT / "build" / "engines" / "octo_small_backbone.int8.onnx"],
                             digest, onnx.backbone)
            if int8 is None:
                raise BenchmarkError("no INT8 backbone of octo-small; build it with: python -m engines.build "
                                     "--models octo-small")
        meta = metadata_of(int8)
        octo = octo_parity(arrays, engine, onnx, int8, progress, 3 if args.quick else LATENCY_QUERIES)
        results["octo"] = {
            "model": engine.cfg.name, "weights": "seeded random (latency only; success meaningless)",
            "params_sha256": digest, "reference": "fp32 JAX (engines.octo.export backbone_fn and sampler_fn, jitted, "
            "CPU), the same recorded noise", "queries_file": str(path.relative_to(ROOT)),
            "queries_sha256": side["sha256"], "queries_command": side.get("command", command_line(args.quick)),
            "queries_from": side.get("tries"),
            "int8": {"graph": str(Path(int8).relative_to(ROOT)) if Path(int8).is_relative_to(ROOT) else str(int8),
                     "quantized": "backbone: every Gemm/MatMul/Conv with a weight (per-channel symmetric int8 "
                     "weights, per-tensor symmetric int8 activations, MinMax); attention's activation products, "
                     "LayerNorm, Softmax, GELU, residual adds and the whole sampler fp32",
                     "calibration": meta.get("calibration"), "calibration_sha256": meta.get("calibration_sha256"),
                     "pass": meta.get("int8_pass")},
            "tensorrt_int8": "skipped here (no GPU): built from the same Q/DQ graph by benchmarks/device_check.sh "
                             "step trt-int8-qdq",
            **octo}
    if not args.skip_bc:
        results["bc_state"] = bc_parity(progress, args.quick)
        results["bc_state"]["dev_successes"] = bc_successes(args.quick, ROOT / results["bc_state"]["precisions"]
                                                            ["int8"]["graph"])
    write_result(NAME, args.out_dir, MODULE, argv, args.quick, results, mach)
    rows = []
    for p_, v in results.get("octo", {}).get("precisions", {}).items():
        if v.get("supported"):
            rows.append(("octo", p_, v["readout"]["max_abs"], v["readout"]["rel"], v["actions_normalised"]["max_abs"],
                         v["actions_normalised"]["rel"], v["latency_ms_batch1"]["p50"], v["p50_over_ort_fp32"]))
        else:
            rows.append(("octo", p_, None, None, None, None, None, v.get("reason")))
    for p_, v in results.get("bc_state", {}).get("precisions", {}).items():
        s = results["bc_state"]["dev_successes"].get(p_, {})
        s = s.get("graph_tries", s)  # a refused precision: the tries run on its graph
        rows.append(("bc-state", p_, None, None, v["actions_normalised"]["max_abs"], v["actions_normalised"]["rel"],
                     v["latency_ms_batch1"]["p50"], f"{s.get('k')}/{s.get('n')}"))
    print_table("precision parity vs fp32 (JAX for Octo, torch for bc-state)",
                ["model", "precision", "readout abs", "readout rel", "action abs", "action rel", "p50 ms",
                 "ratio / successes"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None))
