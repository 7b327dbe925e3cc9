"""octo-small on ONNX Runtime with its diffusion noise drawn by JAX (as today) or by engines.octo.prng (NumPy, no JAX).

    python -m benchmarks.octo_numpy_draws            # -> results/benchmarks/octo_numpy_draws.json
    python -m benchmarks.octo_numpy_draws --quick    # the tiny model, a few queries: checks it runs

One query as eval/policies/octo.py makes it: the try's key split once (``rng, key = split(rng)``), the noise
``(init, steps)`` drawn from ``key`` (upstream's splits and shapes: :func:`engines.octo.model.noise_from_rng`),
then the backbone and the sampler on ONNX Runtime. The draws are made either by JAX as today
(:func:`engines.octo.model.split_key` and the model's jitted ``draw_noise``) or by :mod:`engines.octo.prng`
(``split_key`` and ``noise_for``); everything else is the same: the same graphs and sessions
(:func:`engines.backends.model_runner` with ``BackendSpec("ort")``, exported into the cache on first use), the
same images, masks and instruction embedding. Random weights (latency only).

The two ways alternate query by query (the order swapped every other pair, so that neither always runs first),
timed with a monotonic clock (``time.perf_counter``) after untimed warm-up queries (which also compile JAX's
draw); the p50 of each and the ratio numpy/jax (target <= 1.01). The draws alone (split + noise) are timed the
same way over many more calls. Parity: the keys of both ways bit for bit along a try's chain of queries, the
noise in float32 ulps (tests/test_prng.py derives the bound) and the actions' relative error.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from benchmarks.common import machine, parser, print_table, progress, run_main, stats_ms, write_result

NAME = "octo_numpy_draws"
MODULE = "benchmarks.octo_numpy_draws"
TARGET_RATIO = 1.01  # query p50 with NumPy draws over query p50 with JAX draws
QUERIES = 60  # timed queries per way (alternating)
DRAWS = 3000  # timed draws (split + noise) per way, alternating
WARMUP = 3
PARITY_QUERIES = 50  # queries along one try's key chain whose draws are compared
SEED = 0


def ulp_diff(a, b) -> np.ndarray:
    """The number of float32 values between a and b, elementwise."""
    def ordered(x):
        i = np.ascontiguousarray(x, np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    return np.abs(ordered(a) - ordered(b))


def run(quick: bool, show_progress: bool) -> dict:
    import jax
    import onnxruntime as ort

    from engines.backends import BackendSpec, model_runner, rel_err
    from engines.octo import prng
    from engines.octo.model import split_key

    if quick:
        from engines.octo.testing import tiny_octo

        model, engine = "octo-tiny", tiny_octo(seed=1)
        n_queries, n_draws, n_parity = 3, 50, 5
    else:
        from engines.octo.octo_model import OctoModel

        model, engine = "octo-small", OctoModel.load("octo-small", random_weights=True)
        n_queries, n_draws, n_parity = QUERIES, DRAWS, PARITY_QUERIES
    cfg = engine.cfg
    spec = BackendSpec("ort")
    t0 = time.perf_counter()
    runner = model_runner(model, spec, engine=engine)  # exports the graphs into the cache on first use
    runner_s = time.perf_counter() - t0

    rs = np.random.default_rng(SEED + 1)
    images = [rs.integers(0, 256, (1, cfg.window, *c.image_size, 3), dtype=np.uint8) for c in cfg.cameras]
    masks = np.ones((1, cfg.window, 1 + len(cfg.cameras)), np.float32)
    masks[0, 0, 0] = 0.0  # the first query of a try: a padded copy
    lang = rs.normal(size=(1, cfg.lang_tokens, cfg.t5.d_model)).astype(np.float32)

    # each way carries its own try's key from query to query, as the policy does
    state = {"jax": jax.random.PRNGKey(SEED), "numpy": prng.prng_key(SEED)}

    def draw_jax():
        state["jax"], key = split_key(state["jax"])
        return engine.draw_noise(key)

    def draw_numpy():
        state["numpy"], key = prng.split_key(state["numpy"])
        return prng.noise_for(cfg, key, 1)

    draws = {"jax": draw_jax, "numpy": draw_numpy}

    # parity along one chain of queries: keys bit for bit, noise in ulps, then actions
    keys_equal, worst_ulps = True, 0
    first = {}
    for i in range(n_parity):
        got = {k: f() for k, f in draws.items()}
        keys_equal &= bool(np.array_equal(np.asarray(state["jax"]), state["numpy"]))
        for a, b in zip(got["jax"], got["numpy"]):
            worst_ulps = max(worst_ulps, int(ulp_diff(a, b).max()))
        if i == 0:
            first = got
    actions = {k: runner.predict(images, masks, lang, noise) for k, noise in first.items()}
    parity = {"queries": n_parity, "keys_bit_for_bit": keys_equal, "noise_max_ulp_diff": worst_ulps,
              "noise_ulp_bound": "tests/test_prng.py erfinv_ulp_bound (11 ulps at most)",
              "actions_rel_err_numpy_vs_jax": rel_err(actions["numpy"], actions["jax"])}

    def query(way):
        noise = draws[way]()
        return runner.predict(images, masks, lang, noise)

    def alternate(fn, n: int, desc: str) -> dict[str, list[float]]:
        """n timed calls of fn(way) per way, alternating (jax numpy, numpy jax, ...), milliseconds."""
        out: dict[str, list[float]] = {"jax": [], "numpy": []}
        for i in progress(range(n), desc=desc, disable=not show_progress):
            for way in (("jax", "numpy") if i % 2 == 0 else ("numpy", "jax")):
                t = time.perf_counter()
                fn(way)
                out[way].append((time.perf_counter() - t) * 1e3)
        return out

    alternate(query, WARMUP, "warm-up")
    load_before = machine()["load_average_start"]
    q = alternate(query, n_queries, "queries")
    d = alternate(lambda way: draws[way](), n_draws, "draws alone")
    qs = {k: stats_ms(v) for k, v in q.items()}
    ds = {k: stats_ms(v) for k, v in d.items()}
    ratio = round(qs["numpy"]["p50"] / qs["jax"]["p50"], 4)
    return {
        "model": model, "weights": "random (latency only)", "backend": "ort fp32 (BackendSpec('ort'): this "
        "process's cores, the graphs rewritten as --backend ort runs them)",
        "graphs": {"backbone": str(runner.backbone.loaded_path), "sampler": str(runner.sampler.loaded_path)},
        "runner_setup_s": round(runner_s, 1),
        "versions": {"jax": jax.__version__, "numpy": np.__version__, "onnxruntime": ort.__version__},
        "query": "split the try's key once, draw (init (1, flat), steps (diffusion_steps, 1, flat)), then "
                 "backbone + sampler on ORT (OnnxOcto.predict), batch 1",
        "draws": {"jax": "engines.octo.model.split_key + OctoModel.draw_noise (jitted noise_from_rng)",
                  "numpy": "engines.octo.prng.split_key + noise_for"},
        "clock": "time.perf_counter (monotonic), per call; the two ways alternate call by call, order swapped "
                 "every other pair",
        "load_average_before_timing": load_before,
        "query_ms": qs, "draw_ms": ds,
        "draw_share_of_query_p50": {k: round(ds[k]["p50"] / qs[k]["p50"], 5) for k in ds},
        "draw_p50_numpy_over_jax": round(ds["numpy"]["p50"] / ds["jax"]["p50"], 3),
        "ratio_query_p50_numpy_over_jax": ratio,
        "target": {"ratio_query_p50_numpy_over_jax": f"<= {TARGET_RATIO}", "met": ratio <= TARGET_RATIO},
        "parity": parity,
    }


def main(argv=None) -> int:
    p = parser(MODULE, __doc__.split("\n\n")[0])
    args = p.parse_args(argv)
    mach = machine()
    results = run(args.quick, not args.no_progress)
    write_result(NAME, args.out_dir, MODULE, argv, args.quick, results, mach)
    q, d = results["query_ms"], results["draw_ms"]
    print_table(f"{results['model']} on ORT: draws by JAX vs by engines.octo.prng (ms)",
                ["draws", "query p50", "query mean", "query p99", "draws p50", "draws p99"],
                [(k, q[k]["p50"], q[k]["mean"], q[k]["p99"], d[k]["p50"], d[k]["p99"]) for k in ("jax", "numpy")])
    par = results["parity"]
    print(f"query p50 numpy/jax {results['ratio_query_p50_numpy_over_jax']} (target <= {TARGET_RATIO}: "
          f"{'met' if results['target']['met'] else 'missed'}); draws alone p50 numpy/jax "
          f"{results['draw_p50_numpy_over_jax']}; parity: keys {'equal' if par['keys_bit_for_bit'] else 'DIFFER'}, "
          f"noise within {par['noise_max_ulp_diff']} ulps, actions rel err {par['actions_rel_err_numpy_vs_jax']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None))
