"""Inference latency of every model x backend available here, on the same inputs: mean, p50 and p99 in
milliseconds (time.perf_counter around each call, after warm-up), batch 1 and batch N where the backend
takes a batch, and the ratios between the backends of a model.

Levels: ``policy`` is ``Policy.query`` on one observation, as the runner calls it (preprocessing, the
action checks included); ``model`` is the compiled network alone through its runner, on batched inputs.

- scripted (python): policy, batch 1 (it has no network);
- bc-state (ort, torch): policy batch 1; model batch 1 and N; one intra-op thread, as an eval worker uses;
- octo-small with seeded random weights (jax; ort when engines.octo.export can export the ONNX graphs):
  model batch 1 and N; JAX (XLA) and ONNX Runtime use every core here. Random weights time exactly the
  released architecture; no weights are downloaded.

The state observation is a real one (the dev split's first A01 start); Octo's images are seeded random
uint8 frames and its noise one seeded draw, identical for both backends. Each row's outputs are compared
with the model's first backend (max_abs_diff).

    python -m benchmarks.inference                  # all models (octo: minutes to compile and export)
    python -m benchmarks.inference --quick          # seconds: scripted and bc-state, numbers meaningless
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

from benchmarks.common import BenchmarkError, machine, parser, print_table, progress, run_main, stats_ms, write_result

NAME = "inference"
MODULE = "benchmarks.inference"
MODELS = ("scripted", "bc-state", "octo-small")
INSTRUCTION_SEED = 0


def _measure(fn: Callable[[], Any], warmup: int, iters: int, budget_s: float, show: bool, desc: str) -> list[float]:
    """Milliseconds of ``iters`` calls after ``warmup`` untimed ones; stops early past ``budget_s`` seconds
    (with at least 5 samples), so a slow backend cannot stall the run."""
    for _ in range(warmup):
        fn()
    out: list[float] = []
    start = time.perf_counter()
    for _ in progress(range(iters), desc=desc, disable=not show):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
        if len(out) >= 5 and time.perf_counter() - start > budget_s:
            break
    return out


def _state_observation():
    """(observation dict of the state policies, its 32-number state vector) from a real scene."""
    from env import make_env
    from env.tasklist import load
    from eval.rollout import observation_for
    from eval.training.state_features import ActionHistory, policy_input

    tasklist = load("dev")
    env = make_env("A01", obs_mode="state")
    try:
        env.reset(seed=tasklist.seed("A01", 0), options={"start": tasklist.start("A01", 0)})

        class _StatePolicy:  # observation_for only asks what the policy observes
            observes = "state"

        obs = observation_for(_StatePolicy(), env, None)
    finally:
        env.close()
    return obs, policy_input(obs["state"], ActionHistory()).astype(np.float32)


class Bench:
    def __init__(self, warmup: int, iters: int, budget_s: float, show: bool):
        self.warmup, self.iters, self.budget_s, self.show = warmup, iters, budget_s, show
        self.rows: list[dict] = []
        self.skipped: list[dict] = []

    def row(self, model: str, backend: str, level: str, batch: int, fn: Callable[[], Any], threads: str,
            reference: np.ndarray | None = None, output: Callable[[], np.ndarray] | None = None, warmup=None,
            iters=None) -> np.ndarray | None:
        samples = _measure(fn, self.warmup if warmup is None else warmup, self.iters if iters is None else iters,
                           self.budget_s, self.show, f"{model} {backend} {level} b{batch}")
        out = output() if output is not None else None
        diff = None
        if out is not None and reference is not None:
            diff = float(np.max(np.abs(np.asarray(out, np.float64) - np.asarray(reference, np.float64))))
        s = stats_ms(samples)
        self.rows.append({"model": model, "backend": backend, "level": level, "batch": batch, "threads": threads,
                          **{f"{k}_ms" if k != "n" else k: v for k, v in s.items()},
                          "per_sample_mean_ms": round(s["mean"] / batch, 4) if s["mean"] is not None else None,
                          "max_abs_diff_vs_first_backend": diff})
        return out

    def skip(self, model: str, backend: str, reason: str) -> None:
        self.skipped.append({"model": model, "backend": backend, "reason": reason})
        print(f"skip {model} {backend}: {reason}", file=sys.stderr)


def bench_scripted(b: Bench, obs) -> None:
    from env.setups import get_setup
    from eval.policies.scripted import ScriptedPolicy

    s = get_setup("A01")
    policy = ScriptedPolicy(clearance=s.clearance_m, latency_steps=s.latency_steps)
    policy.reset(obs["instruction"], seed=0)
    b.row("scripted", "python", "policy", 1, lambda: policy.query(obs), "1")


def bench_bc_state(b: Bench, obs, state: np.ndarray, batch: int, threads: int, weights: str | None = None) -> None:
    import torch

    from engines.backends import MODEL_BACKENDS, MODEL_RUNTIMES, BackendSpec, model_runner
    from engines.bc_mlp import DEFAULT_WEIGHTS
    from eval.policies.bc_state import BCStatePolicy

    torch.set_num_threads(threads)
    weights = weights or DEFAULT_WEIGHTS
    rng = np.random.default_rng(0)
    # batch N: the real state and N-1 copies jittered by 1 % (distinct rows, same for every backend)
    xs = {1: state[None], batch: (state[None] * (1 + 0.01 * rng.standard_normal((batch, state.size)))).astype(np.float32)}
    refs: dict[tuple, np.ndarray] = {}
    for backend in MODEL_BACKENDS["bc-state"]:
        rt = MODEL_RUNTIMES["bc-state"]
        spec = BackendSpec(backend, precision=rt.trt_precision, max_batch=rt.trt_batch_max, threads=threads)
        try:
            policy = BCStatePolicy(model_runner("bc-state", spec, weights=weights), weights)
        except Exception as e:  # noqa: BLE001 - a backend that cannot load here is skipped, with why
            b.skip("bc-state", backend, str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            continue
        policy.reset(obs["instruction"], seed=0)
        out = b.row("bc-state", backend, "policy", 1, lambda: policy.query(obs), str(threads),
                    refs.get(("policy", 1)), lambda: policy.act(obs)[None])
        refs.setdefault(("policy", 1), out)
        for n in sorted(set(xs)):
            x = xs[n]
            out = b.row("bc-state", backend, "model", n, lambda: policy.runner.infer({"state": x}), str(threads),
                        refs.get(("model", n)), lambda: policy.runner.infer({"state": x})["action"])
            refs.setdefault(("model", n), out)


def octo_ort_unavailable() -> str | None:
    """Why the ONNX Runtime path of Octo cannot run here (None when it can)."""
    from engines.optional import available

    for module in ("onnx", "onnxruntime", "jax2onnx"):
        if not available(module):
            return f"{module} is not installed (pip install -e '.[export]')"
    return None


def bench_octo(b: Bench, batch: int, model: str = "octo-small") -> None:
    from engines.optional import available

    for module in ("jax", "flax", "sentencepiece"):
        if not available(module):
            b.skip(model, "jax", f"{module} is not installed (pip install -e '.[jax]')")
            return
    import jax

    from engines.octo.octo_model import load_octo

    t0 = time.perf_counter()
    engine = load_octo(model, random_weights=True, seed=0)
    load_s = time.perf_counter() - t0
    cfg = engine.cfg
    lang1 = engine.embed("put the square block into the square hole")[None]
    rng = np.random.default_rng(INSTRUCTION_SEED)
    inputs = {}
    for n in sorted({1, batch}):
        images = [rng.integers(0, 256, (n, cfg.window, *c.image_size, 3), dtype=np.uint8) for c in cfg.cameras]
        masks = np.ones((n, cfg.window, 1 + len(cfg.cameras)), np.float32)
        lang = np.repeat(lang1, n, axis=0)
        noise = engine.draw_noise(jax.random.PRNGKey(0), n)
        inputs[n] = (images, masks, lang, noise)
    # compiling is not inference: every shape is compiled in the untimed warm-up
    refs = {}
    warm = max(2, b.warmup // 10)
    iters = max(5, b.iters // 20)
    for n, (images, masks, lang, noise) in inputs.items():
        def jax_call(images=images, masks=masks, lang=lang, noise=noise):
            return engine.predict(images, masks, lang, noise=noise)
        refs[n] = b.row(model, "jax", "model", n, jax_call, "XLA default (all cores)", None, jax_call,
                        warmup=warm, iters=iters)
    b.rows[-1]["load_s"] = round(load_s, 2)
    reason = octo_ort_unavailable()
    if reason:
        b.skip(model, "ort", reason)
        return
    from engines.backends import BackendSpec, model_runner

    try:
        t0 = time.perf_counter()
        graphs = model_runner(model, BackendSpec("ort"), engine=engine)  # exports once (minutes), then cached
        export_s = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - the exporter is new: any failure is a reason, not a crash
        b.skip(model, "ort", f"export or load failed: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
        return
    from engines.runners import cpu_count

    for n, (images, masks, lang, noise) in inputs.items():
        def ort_call(images=images, masks=masks, lang=lang, noise=noise):
            return graphs.predict(images, masks, lang, noise)
        b.row(model, "ort", "model", n, ort_call, str(cpu_count()), refs[n], ort_call, warmup=warm, iters=iters)
    b.rows[-1]["export_or_load_s"] = round(export_s, 2)


def ratios(rows: list[dict]) -> list[dict]:
    """Each backend's mean and p50 over the model's first backend, at the same level and batch (>1: slower)."""
    out = []
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["level"], r["batch"]), []).append(r)
    for (model, level, batch), rs in groups.items():
        ref = rs[0]
        for r in rs[1:]:
            if ref["mean_ms"] and r["mean_ms"] is not None:
                out.append({"model": model, "level": level, "batch": batch, "backend": r["backend"],
                            "vs": ref["backend"], "mean_ratio": round(r["mean_ms"] / ref["mean_ms"], 3),
                            "p50_ratio": round(r["p50_ms"] / ref["p50_ms"], 3) if ref["p50_ms"] else None})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(MODULE, __doc__.split("\n\n")[0])
    p.add_argument("--models", help=f"comma-separated, of {', '.join(MODELS)} (default all; quick: scripted,bc-state)")
    p.add_argument("--batch", type=int, help="the batch N besides 1 (default 8; quick: 4)")
    p.add_argument("--iters", type=int, help="timed calls per row (default 2000; octo a twentieth; quick: 20)")
    p.add_argument("--warmup", type=int, help="untimed calls first (default 50; octo a tenth, at least 2; quick: 3)")
    p.add_argument("--max-seconds", type=float, help="time budget per row (default 30; quick: 2)")
    p.add_argument("--bc-weights", help="bc-state weights file (default the shipped engines/weights/bc_state.safetensors)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of bc-state's torch and ORT (default 1, "
                   "as an eval worker)")
    args = p.parse_args(argv)
    models = [m.strip() for m in (args.models or ("scripted,bc-state" if args.quick else ",".join(MODELS))).split(",")
              if m.strip()]
    bad = sorted(set(models) - set(MODELS))
    if bad or not models:
        raise BenchmarkError(f"--models: unknown or empty {', '.join(bad)}; valid: {', '.join(MODELS)}")
    batch = args.batch if args.batch is not None else (4 if args.quick else 8)
    iters = args.iters if args.iters is not None else (20 if args.quick else 2000)
    warmup = args.warmup if args.warmup is not None else (3 if args.quick else 50)
    budget = args.max_seconds if args.max_seconds is not None else (2.0 if args.quick else 30.0)
    for name, v in (("--batch", batch), ("--iters", iters), ("--threads", args.threads)):
        if v < 1:
            raise BenchmarkError(f"{name} must be at least 1, got {v}")
    if budget <= 0:
        raise BenchmarkError(f"--max-seconds must be above 0, got {budget:g}")
    if warmup < 0:
        raise BenchmarkError(f"--warmup must be 0 or more, got {warmup}")
    mach = machine()
    b = Bench(warmup, iters, budget, show=not args.no_progress and sys.stderr.isatty())
    if "scripted" in models or "bc-state" in models:
        obs, state = _state_observation()
        if "scripted" in models:
            bench_scripted(b, obs)
        if "bc-state" in models:
            bench_bc_state(b, obs, state, batch, args.threads, args.bc_weights)
    if "octo-small" in models:
        bench_octo(b, batch)
    rs = ratios(b.rows)
    print_table("inference latency, ms (perf_counter, after warm-up)",
                ["model", "backend", "level", "batch", "n", "mean", "p50", "p99", "per sample", "max |diff|"],
                [[r["model"], r["backend"], r["level"], r["batch"], r["n"], r["mean_ms"], r["p50_ms"], r["p99_ms"],
                  r["per_sample_mean_ms"], r["max_abs_diff_vs_first_backend"]] for r in b.rows])
    if rs:
        print_table("ratios between backends (mean ms over the first backend's; above 1 is slower)",
                    ["model", "level", "batch", "backend", "vs", "mean ratio", "p50 ratio"],
                    [[r["model"], r["level"], r["batch"], r["backend"], r["vs"], r["mean_ratio"], r["p50_ratio"]]
                     for r in rs])
    results = {"bc_weights": args.bc_weights, "models": models, "batch": batch, "iters": iters, "warmup": warmup, "max_seconds_per_row": budget,
               "threads": args.threads, "rows": b.rows, "ratios": rs, "skipped": b.skipped}
    write_result(NAME, args.out_dir, MODULE, argv, args.quick, results, mach)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None))
