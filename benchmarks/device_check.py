"""Device check for a GPU machine: TensorRT engines of octo-small and bc-state in FP32 and FP16, parity
against ONNX Runtime (CPU, fp32), latency with CUDA events after warm-up; one JSON result.

    bash benchmarks/device_check.sh                  # installs what it needs, then runs this
    python -m benchmarks.device_check --out results/benchmarks
    python -m benchmarks.device_check --dry-run      # tiny Octo, no installs: checks the script on a CPU

Without TensorRT or a GPU every TensorRT row is recorded as skipped with the
reason, and the ONNX Runtime references are still made, so the script runs
end to end anywhere. Random weights (latency only) unless checkpoints are given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engines.backends import rel_err

# fp32 engines are built with TF32 off (engines.trt), so they should match ORT closely; fp16 within a few %
TOLERANCE = {"fp32": 1e-3, "fp16": 5e-2}


@dataclass(frozen=True)
class CheckConfig:
    out: str
    work: str = "build/device_check"
    precisions: tuple[str, ...] = ("fp32", "fp16")
    queries: int = 50
    warmup: int = 10
    dry_run: bool = False
    octo_checkpoint: str | None = None


def stats(ms: list[float]) -> dict:
    a = np.asarray(ms, np.float64)
    return {"n": int(a.size), "mean_ms": round(float(a.mean()), 3), "p50_ms": round(float(np.percentile(a, 50)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3)}


def gpu_info() -> dict:
    info: dict = {}
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            info = {"gpu": torch.cuda.get_device_name(0), "compute_capability": f"{major}.{minor}",
                    "cuda": torch.version.cuda}
    except ImportError:
        pass
    from engines.optional import available

    if available("tensorrt"):
        import tensorrt

        info["tensorrt"] = tensorrt.__version__
    from engines.trt import l4t_version

    info["l4t"] = l4t_version()
    return info


# ------------------------------------------------------------------ models: ONNX files and fixed inputs
def bc_state(work: Path) -> tuple[Path, dict, str]:
    from engines import bc_mlp

    try:
        model, config, _ = bc_mlp.load(bc_mlp.DEFAULT_WEIGHTS)
        source = bc_mlp.DEFAULT_WEIGHTS.name
    except bc_mlp.BadCheckpointError:  # no trained weights here: the architecture with its init weights
        config = bc_mlp.BCConfig()
        model = bc_mlp.build(config).eval()
        source = "untrained weights (latency only)"
    path = bc_mlp.export_onnx(model, config, work / "bc_state.onnx", source=source)
    feeds = {"state": np.random.default_rng(0).normal(size=(1, config.state_dim)).astype(np.float32)}
    return path, feeds, source


def octo(work: Path, cfg: CheckConfig) -> tuple[list[tuple[str, Path, dict]], str]:
    """(part, onnx path, feeds) for the backbone and the sampler (feeds of the sampler: the backbone's output
    from ORT, so both backends see the same readout)."""
    from engines.octo.export import backbone_feeds, export_octo, sampler_feeds
    from engines.octo.params import init_params

    if cfg.dry_run:
        from engines.octo.testing import tiny_config

        ocfg, params, source = tiny_config(), init_params(tiny_config(), 0, with_t5=False), "tiny random (dry run)"
    elif cfg.octo_checkpoint:
        from engines.octo.checkpoint import load, resolve
        from engines.octo.config import octo_small_config

        c = load(resolve("octo-small", cfg.octo_checkpoint), model="octo-small", expect=octo_small_config())
        ocfg, params, source = c.config, c.params, c.identity
    else:
        from engines.octo.config import octo_small_config

        ocfg = octo_small_config()
        params, source = init_params(ocfg, 0, with_t5=False), "random weights (latency only)"
    graphs = export_octo(ocfg, params, work, "octo_small", source=source, random_weights=not cfg.octo_checkpoint,
                         progress=True)
    rs = np.random.default_rng(1)
    images = [rs.integers(0, 256, (1, ocfg.window, *c.image_size, 3), dtype=np.uint8) for c in ocfg.cameras]
    masks = np.ones((1, ocfg.window, 1 + len(ocfg.cameras)), np.float32)
    lang = rs.normal(size=(1, ocfg.lang_tokens, ocfg.t5.d_model)).astype(np.float32)
    noise = (rs.normal(size=(1, ocfg.flat_action_dim)).astype(np.float32),
             rs.normal(size=(ocfg.diffusion_steps, 1, ocfg.flat_action_dim)).astype(np.float32))
    bfeeds = backbone_feeds(ocfg, images, masks, lang)
    from engines.runners import OnnxRuntimeRunner

    with OnnxRuntimeRunner(graphs.backbone, "cpu", intra_op_threads=0) as r:
        readout = r.infer(bfeeds)["readout"]
    return [("backbone", graphs.backbone, bfeeds), ("sampler", graphs.sampler, sampler_feeds(readout, *noise))], source


# ------------------------------------------------------------------ one graph: ORT reference, TensorRT rows
def check_graph(name: str, path: Path, feeds: dict, cfg: CheckConfig, reason: str | None) -> list[dict]:
    from engines import trt
    from engines.runners import OnnxRuntimeRunner, TensorRtRunner

    with OnnxRuntimeRunner(path, "cpu", intra_op_threads=0) as r:
        ref = r.infer(feeds)
        for _ in range(min(cfg.warmup, 3)):
            r.infer(feeds)
        r.latencies_ms.clear()
        for _ in range(min(cfg.queries, 10)):
            r.infer(feeds)
        rows = [{"model": name, "backend": "ort-cpu fp32", "status": "ok", **stats(r.latencies_ms)}]
    for precision in cfg.precisions:
        row = {"model": name, "backend": f"tensorrt {precision}"}
        if reason:
            rows.append({**row, "status": "skipped", "reason": reason})
            continue
        try:
            t0 = time.perf_counter()
            engine = trt.build_engine(path, Path(cfg.work) / "engines", path.stem, precision, 1,
                                      timing_cache=Path(cfg.work) / "engines" / "timing.cache")
            build_s = time.perf_counter() - t0
            runner = TensorRtRunner(engine, expected_key=trt.system_key(path, precision, 1))
            with runner:
                out = runner.infer(feeds)
                for _ in range(cfg.warmup):
                    runner.infer(feeds)
                gpu, wall = [], []
                for _ in range(cfg.queries):
                    t0 = time.perf_counter()
                    runner.infer(feeds)
                    wall.append((time.perf_counter() - t0) * 1e3)
                    gpu.append(runner.last_gpu_ms)
            errs = {k: rel_err(out[k], ref[k]) for k in ref}
            worst = max(errs.values())
            rows.append({**row, "status": "ok" if worst <= TOLERANCE[precision] else "parity-failed",
                         "rel_err_vs_ort": errs, "tolerance": TOLERANCE[precision], "engine": str(engine),
                         "build_s": round(build_s, 1), "gpu_events": stats(gpu), "wall_with_copies": stats(wall)})
        except Exception as e:  # noqa: BLE001 - recorded, the check goes on
            rows.append({**row, "status": "failed", "reason": (str(e).strip().splitlines() or [type(e).__name__])[0]})
    return rows


def run(cfg: CheckConfig) -> dict:
    from tqdm import tqdm

    from engines import trt

    work = Path(cfg.work)
    work.mkdir(parents=True, exist_ok=True)
    reason = trt.unavailable_reason()
    if cfg.dry_run and reason is None:
        reason = "dry run"
    result: dict = {"config": asdict(cfg), "system": gpu_info(), "tensorrt_skipped": reason,
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": []}
    graphs: list[tuple[str, Path, dict]] = []
    path, feeds, source = bc_state(work)
    graphs.append(("bc-state", path, feeds))
    result["bc_state_weights"] = source
    parts, source = octo(work, cfg)
    graphs += [(f"octo-small {part}", p, f) for part, p, f in parts]
    result["octo_weights"] = source
    for name, p, f in tqdm(graphs, desc="device check", unit="graph"):
        result["rows"] += check_graph(name, p, f, cfg, reason)
    result["ok"] = all(r["status"] in ("ok", "skipped") for r in result["rows"])
    return result


def table(result: dict) -> str:
    lines = [f"{'model':<20} {'backend':<16} {'status':<14} {'p50 ms':>8} {'rel err':>9}  note"]
    for r in result["rows"]:
        p50 = r.get("gpu_events", r).get("p50_ms")
        err = max(r["rel_err_vs_ort"].values()) if "rel_err_vs_ort" in r else None
        lines.append(f"{r['model']:<20} {r['backend']:<16} {r['status']:<14} "
                     f"{'' if p50 is None else f'{p50:.3f}':>8} {'' if err is None else f'{err:.1e}':>9}  "
                     f"{r.get('reason', '')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.device_check", description=__doc__.split("\n\n")[0])
    default_out = os.environ.get("OUT") or "results/benchmarks"
    p.add_argument("--out", default=default_out, help="folder of device_check.json (default $OUT or results/benchmarks)")
    p.add_argument("--work", default="build/device_check", help="ONNX files and engines")
    p.add_argument("--precisions", default="fp32,fp16")
    p.add_argument("--queries", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--octo-checkpoint", help="octo-small-1.5 checkpoint folder (default: random weights)")
    p.add_argument("--dry-run", action="store_true", help="tiny Octo, TensorRT skipped: checks the script anywhere")
    a = p.parse_args(argv)
    cfg = CheckConfig(a.out, a.work, tuple(x for x in a.precisions.split(",") if x), a.queries, a.warmup,
                      a.dry_run, a.octo_checkpoint)
    bad = [x for x in cfg.precisions if x not in TOLERANCE]
    if bad or cfg.queries < 1:
        print(f"error: precisions must be of {', '.join(TOLERANCE)} and --queries at least 1", file=sys.stderr)
        return 2
    try:
        result = run(cfg)
    except Exception as e:  # noqa: BLE001 - one line at the command line
        print(f"error: {(str(e).strip().splitlines() or [type(e).__name__])[0]}", file=sys.stderr)
        return 1
    out = Path(cfg.out) / ("device_check_dry_run.json" if cfg.dry_run else "device_check.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    print(f"wrote {out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
