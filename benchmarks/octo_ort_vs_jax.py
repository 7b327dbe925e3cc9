"""octo-small (backbone + 20 denoising steps) through ONNX Runtime fp32 against jitted JAX on this CPU.

    python -m benchmarks.octo_ort_vs_jax                  # -> results/benchmarks/octo_ort_vs_jax.json
    python -m benchmarks.octo_ort_vs_jax --queries 50 --model octo-base

Same inputs for both (random images, instruction embedding and noise; random
weights: latency only). Each backend is warmed up, then timed per query with a
monotonic clock (mean, p50, p99). ONNX Runtime is tried with several thread
counts and graph-optimisation levels; the fastest is the headline and its
ratio to JAX is reported. Where the time goes: the backbone and the sampler
are timed apart, and one profiled backbone run gives the time per operator
type. The load average and the process's CPU time per query are recorded,
since a machine shared with other jobs inflates wall-clock times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engines.backends import rel_err

OUT = Path("results/benchmarks/octo_ort_vs_jax.json")
TARGET_MS = 250.0


@dataclass(frozen=True)
class BenchConfig:
    model: str = "octo-small"
    queries: int = 30
    warmup: int = 3
    seed: int = 0
    out: str = str(OUT)
    onnx_dir: str = "build/engines"  # reused when its weights' digest matches, else exported to the cache
    profile: bool = True


# ------------------------------------------------------------------ machine and statistics
def machine() -> dict:
    from engines.runners import cpu_count

    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = " ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
                         if f" {f}" in text)
    except OSError:
        pass
    # key names as the other benchmarks' JSON (results README): cpu, cores, usable_cores, os, python
    return {"cpu": model, "cores": os.cpu_count(), "usable_cores": cpu_count(), "simd": flags,
            "os": platform.platform(), "python": platform.python_version()}


def summary(ms: list[float]) -> dict:
    a = np.asarray(ms, np.float64)
    return {"n": int(a.size), "mean_ms": round(float(a.mean()), 2), "p50_ms": round(float(np.percentile(a, 50)), 2),
            "p99_ms": round(float(np.percentile(a, 99)), 2), "min_ms": round(float(a.min()), 2)}


def timed(fn, n: int, warmup: int) -> tuple[list[float], float]:
    """(wall ms per call, process CPU ms per call) after ``warmup`` untimed calls; perf_counter is monotonic."""
    for _ in range(warmup):
        fn()
    out = []
    c0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out, (time.process_time() - c0) * 1e3 / n


# ------------------------------------------------------------------ the benchmark
def profile_ops(path: Path, feeds: dict, threads: int, runs: int = 3) -> list[dict]:
    """Per-operator-type share of one backbone run (ORT's profiler, kernel times summed over nodes)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        o = ort.SessionOptions()
        o.intra_op_num_threads = threads
        o.log_severity_level = 3
        o.enable_profiling = True
        o.profile_file_prefix = str(Path(tmp) / "prof")
        s = ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])
        s.run(None, feeds)
        for _ in range(runs):
            s.run(None, feeds)
        events = json.loads(Path(s.end_profiling()).read_text())
    per: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e["args"].get("op_name", "?")
            per[op] = per.get(op, 0.0) + e["dur"] / 1e3 / (runs + 1)
    total = sum(per.values()) or 1.0
    return [{"op": k, "ms": round(v, 2), "share": round(v / total, 3)}
            for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:10]]


def run(cfg: BenchConfig) -> dict:
    from engines.optional import require

    for module in ("jax", "onnxruntime", "onnx"):
        require(module, "jax" if module == "jax" else "export")
    import jax
    import jax.numpy as jnp
    import onnxruntime as ort
    from tqdm import tqdm

    from engines.octo.config import PRESETS
    from engines.octo.export import (
        backbone_feeds, cache_dir, export_octo, file_stem, matching_export, params_digest, sampler_feeds)
    from engines.octo.runners import OnnxOcto
    from engines.octo.model import make_backbone, make_infer, make_sampler
    from engines.octo.params import init_params
    from engines.runners import OnnxRuntimeRunner, cpu_count

    if cfg.model not in PRESETS:
        raise ValueError(f"unknown model {cfg.model!r}; valid: {', '.join(PRESETS)}")
    load_before = os.getloadavg()
    ocfg = PRESETS[cfg.model]()
    params = jax.tree_util.tree_map(jnp.asarray, init_params(ocfg, cfg.seed, with_t5=False))
    digest = params_digest(params)
    stem = file_stem(cfg.model)
    graphs = matching_export(Path(cfg.onnx_dir), stem, digest) or matching_export(
        cache_dir(), f"{stem}_{digest[:16]}", digest)
    if graphs is None:
        graphs = export_octo(ocfg, params, cache_dir(), f"{stem}_{digest[:16]}", random_weights=True,
                             source=f"random-weights:{cfg.model}:seed{cfg.seed}", digest=digest, progress=True)

    rs = np.random.default_rng(cfg.seed + 1)
    images = [rs.integers(0, 256, (1, ocfg.window, *c.image_size, 3), dtype=np.uint8) for c in ocfg.cameras]
    masks = np.ones((1, ocfg.window, 1 + len(ocfg.cameras)), np.float32)
    masks[0, 0, 0] = 0.0  # the first query of a try: a padded copy
    lang = rs.normal(size=(1, ocfg.lang_tokens, ocfg.t5.d_model)).astype(np.float32)
    noise = (rs.normal(size=(1, ocfg.flat_action_dim)).astype(np.float32),
             rs.normal(size=(ocfg.diffusion_steps, 1, ocfg.flat_action_dim)).astype(np.float32))

    # JAX: the whole query jitted (what OctoEngine.predict runs), and its two parts apart
    infer = jax.jit(make_infer(ocfg))
    backbone = jax.jit(make_backbone(ocfg))
    sampler = jax.jit(make_sampler(ocfg))
    jimages = [jnp.asarray(i) for i in images]
    jargs = (jnp.asarray(lang), jnp.asarray(masks))
    jnoise = tuple(jnp.asarray(n) for n in noise)
    ref = np.asarray(infer(params, jimages, *jargs, *jnoise))
    ref_readout = np.asarray(backbone(params, jimages, *jargs))
    results: dict = {"benchmark": "octo_ort_vs_jax", "command": "python -m benchmarks.octo_ort_vs_jax " + " ".join(
                         sys.argv[1:]), "config": asdict(cfg), "machine": machine(), "model": cfg.model,
                     "weights": "random (latency only, success meaningless)",
                     "onnx": {"backbone": str(graphs.backbone), "sampler": str(graphs.sampler)},
                     "versions": {"jax": jax.__version__, "onnxruntime": ort.__version__,
                                  "numpy": np.__version__}}
    n, w = cfg.queries, cfg.warmup
    bar = tqdm(total=7, desc="octo ort vs jax", unit="run", leave=False)
    jax_ms, jax_cpu = timed(lambda: jax.block_until_ready(infer(params, jimages, *jargs, *jnoise)), n, w)
    bar.update()
    jax_bb, _ = timed(lambda: jax.block_until_ready(backbone(params, jimages, *jargs)), max(5, n // 3), w)
    jr = backbone(params, jimages, *jargs)
    jax_sm, _ = timed(lambda: jax.block_until_ready(sampler(params, jr, *jnoise)), max(5, n // 3), w)
    bar.update()
    results["jax"] = {**summary(jax_ms), "cpu_ms_per_query": round(jax_cpu, 1),
                      "backbone": summary(jax_bb), "sampler": summary(jax_sm)}

    # ONNX Runtime: thread counts and optimisation levels
    threads = sorted({cpu_count(), 1})
    trials = [(t, "all") for t in threads] + [(cpu_count(), "basic")]
    bfeeds = backbone_feeds(ocfg, images, masks, lang)
    rows = []
    for t, level in trials:
        model = OnnxOcto(ocfg, OnnxRuntimeRunner(graphs.backbone, "cpu", intra_op_threads=t, optimization=level),
                         OnnxRuntimeRunner(graphs.sampler, "cpu", intra_op_threads=t, optimization=level)).activate()
        got = model.predict(images, masks, lang, noise)
        readout = model.readout(images, masks, lang)
        ms, cpu = timed(lambda: model.predict(images, masks, lang, noise), n, w)
        sfeeds = sampler_feeds(readout, *noise)
        bb_ms, _ = timed(lambda: model.backbone.infer(bfeeds), max(5, n // 3), 1)
        sm_ms, _ = timed(lambda: model.sampler.infer(sfeeds), max(5, n // 3), 1)
        rows.append({"intra_op_threads": t, "optimization": level, **summary(ms), "cpu_ms_per_query": round(cpu, 1),
                     "backbone": summary(bb_ms), "sampler": summary(sm_ms),
                     "sampler_per_step_ms": round(float(np.median(sm_ms)) / ocfg.diffusion_steps, 3),
                     "rel_err_actions_vs_jax": rel_err(got, ref), "rel_err_readout_vs_jax": rel_err(readout,
                                                                                                     ref_readout)})
        model.deactivate()
        bar.update()
    best = min(rows, key=lambda r: r["p50_ms"])
    results["ort"] = {"trials": rows, "best": best}
    if cfg.profile:
        results["ort"]["backbone_ops"] = profile_ops(graphs.backbone, bfeeds, best["intra_op_threads"])
    bar.update()
    bar.close()
    results["ratio_ort_over_jax_p50"] = round(best["p50_ms"] / results["jax"]["p50_ms"], 3)
    results["ratio_ort_over_jax_mean"] = round(best["mean_ms"] / results["jax"]["mean_ms"], 3)
    results["target_ms"] = TARGET_MS
    results["meets_target_p50"] = best["p50_ms"] <= TARGET_MS
    load_after = os.getloadavg()
    results["load_average_1m"] = {"before": round(load_before[0], 2), "after": round(load_after[0], 2)}
    results["machine"].update(load_average_start=round(load_before[0], 2), load_average_end=round(load_after[0], 2))
    # CPU time / wall time near the thread count means the cores were ours; well below it, shared
    results["ort_cpu_per_wall"] = round(best["cpu_ms_per_query"] / best["mean_ms"], 2)
    return results


def table(r: dict) -> str:
    m, j, best = r["machine"], r["jax"], r["ort"]["best"]
    lines = [f"{r['model']} on {m['cpu']} ({m['usable_cores']} cores), random weights (latency only); "
             f"load average {r['load_average_1m']['before']} -> {r['load_average_1m']['after']}",
             f"{'backend':<30} {'mean':>8} {'p50':>8} {'p99':>8} {'backbone':>9} {'sampler':>8} {'rel err':>9}",
             f"{'jax (jit)':<30} {j['mean_ms']:>8.1f} {j['p50_ms']:>8.1f} {j['p99_ms']:>8.1f} "
             f"{j['backbone']['p50_ms']:>9.1f} {j['sampler']['p50_ms']:>8.1f} {'-':>9}"]
    for t in r["ort"]["trials"]:
        name = f"ort fp32 threads={t['intra_op_threads']} opt={t['optimization']}"
        lines.append(f"{name:<30} {t['mean_ms']:>8.1f} {t['p50_ms']:>8.1f} {t['p99_ms']:>8.1f} "
                     f"{t['backbone']['p50_ms']:>9.1f} {t['sampler']['p50_ms']:>8.1f} "
                     f"{t['rel_err_actions_vs_jax']:>9.1e}")
    lines.append(f"ratio ORT/JAX (p50): {r['ratio_ort_over_jax_p50']}; target {r['target_ms']:.0f} ms/query "
                 f"{'met' if r['meets_target_p50'] else 'missed'} (ORT best p50 {best['p50_ms']:.1f} ms; "
                 f"CPU/wall {r['ort_cpu_per_wall']})")
    if r["ort"].get("backbone_ops"):
        ops = ", ".join(f"{o['op']} {o['share']:.0%}" for o in r["ort"]["backbone_ops"][:6])
        lines.append(f"ORT backbone time by operator: {ops}")
    return "\n".join(lines)


def main(argv=None) -> int:
    d = BenchConfig()
    p = argparse.ArgumentParser(prog="python -m benchmarks.octo_ort_vs_jax", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=d.model, help="octo-small or octo-base")
    p.add_argument("--queries", type=int, default=d.queries, help="timed queries per backend")
    p.add_argument("--warmup", type=int, default=d.warmup, help="untimed queries first")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default=d.out, help="JSON result")
    p.add_argument("--onnx-dir", default=d.onnx_dir, help="folder of `make engines`' exports, reused if they match")
    p.add_argument("--no-profile", action="store_true", help="skip the per-operator profile")
    a = p.parse_args(argv)
    if a.queries < 2 or a.warmup < 0:
        print("error: --queries must be at least 2 and --warmup at least 0", file=sys.stderr)
        return 2
    cfg = BenchConfig(a.model, a.queries, a.warmup, a.seed, a.out, a.onnx_dir, not a.no_profile)
    try:
        r = run(cfg)
    except Exception as e:  # noqa: BLE001 - one line at the command line
        print(f"error: {(str(e).strip().splitlines() or [type(e).__name__])[0]}", file=sys.stderr)
        return 1
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=1) + "\n")
    print(table(r))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
