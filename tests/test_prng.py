"""engines.octo.prng (JAX's threefry2x32 PRNG in NumPy) against jax.random under jax.threefry_partitionable(False).

Keys, splits, fold_in, random bits and the uniforms behind ``normal`` are compared bit for bit; normals within the
ulp bound derived in :func:`erfinv_ulp_bound`; Octo's noise against :func:`engines.octo.model.noise_from_rng`. The
same cases run against the lock's JAX (in this process) and, where CI names it in ``SAB_NEWEST_JAX_PYTHON``, the
newest JAX for Python 3.12 (in a subprocess writing an .npz): one reference script, :data:`REFERENCE_SCRIPT`,
makes both.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from engines.octo import prng
from engines.octo.config import PRESETS

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------ the cases (the same for both JAX versions)
SEEDS = [0, 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 42, 7, 2_654_435_761, 3_735_928_559, 1_234_567_890]
SPLIT_NUMS = [1, 2, 3, 4, 5, 7, 16]  # up to 4 keys prng hashes on Python ints, more on numpy arrays
FOLD_DATA = [0, 1, 7, 2 ** 31, 2 ** 32 - 1, 123_456_789]
BIT_SHAPES = [(0,), (1,), (2,), (3,), (7,), (2, 3), (5, 5, 5), (1, 2, 28), (3, 2, 28), (1001,)]  # odd sizes pad
NORMAL_SHAPES = [(1,), (3,), (1, 2, 28), (3, 2, 28), (999,), (65_536,)]
NOISE_SEEDS = [0, 7, 42, 2 ** 31, 2 ** 32 - 1]
NOISE_BATCHES = [1, 3]
ALL_UNIFORM_BITS = 23  # normal()'s uniforms take 2**23 values: every one of them goes through erfinv once

# The reference: run with the lock's JAX in this process, or as a script under another interpreter (newest JAX).
REFERENCE_SCRIPT = textwrap.dedent('''
    import functools, sys
    import numpy as np
    import jax, jax.numpy as jnp
    from engines.octo.config import PRESETS
    from engines.octo.model import noise_from_rng, split_key

    def reference(path, seeds, split_nums, fold_data, bit_shapes, normal_shapes, noise_seeds, noise_batches,
                  uniform_bits):
        out = {"jax_version": np.array(jax.__version__)}
        lo = np.nextafter(np.float32(-1.0), np.float32(0.0))
        with jax.threefry_partitionable(False):
            for s in seeds:
                key = jax.random.PRNGKey(s)
                out[f"key_{s}"] = np.asarray(key)
                for n in split_nums:
                    out[f"split_{s}_{n}"] = np.asarray(jax.random.split(key, n))
                out[f"split_{s}_2x3"] = np.asarray(jax.random.split(key, (2, 3)))
                for d in fold_data:
                    out[f"fold_{s}_{d}"] = np.asarray(jax.random.fold_in(key, d))
                for shape in bit_shapes:
                    tag = "x".join(map(str, shape))
                    out[f"bits_{s}_{tag}"] = np.asarray(jax.random.bits(key, shape))
                    out[f"uniform_{s}_{tag}"] = np.asarray(jax.random.uniform(key, shape, jnp.float32, lo, 1.0))
                for shape in normal_shapes:
                    tag = "x".join(map(str, shape))
                    out[f"normal_{s}_{tag}"] = np.asarray(jax.random.normal(key, shape))
            cfg = PRESETS["octo-small"]()
            draw = jax.jit(functools.partial(noise_from_rng, cfg), static_argnums=(1,))  # as OctoModel.draw_noise
            for s in noise_seeds:
                key = jax.random.PRNGKey(s)
                out[f"split_key_{s}"] = np.stack([np.asarray(k) for k in split_key(key)])
                for b in noise_batches:
                    init, steps = draw(key, b)
                    out[f"noise_init_{s}_{b}"], out[f"noise_steps_{s}_{b}"] = np.asarray(init), np.asarray(steps)
        # every uniform normal() can draw, built with jax ops as jax.random._uniform builds it, then normal()'s map
        bits = jnp.arange(2 ** uniform_bits, dtype=jnp.uint32) << (32 - uniform_bits)
        floats = jax.lax.bitcast_convert_type((bits >> 9) | jnp.uint32(0x3F800000), jnp.float32) - 1.0
        u = jax.jit(lambda f: jnp.maximum(lo, f * (jnp.float32(1.0) - lo) + lo))(floats)
        out["all_uniforms"] = np.asarray(u)
        out["all_normals"] = np.asarray(jax.jit(lambda u: np.float32(np.sqrt(2)) * jax.lax.erf_inv(u))(u))
        np.savez(path, **out)

    if __name__ == "__main__":
        import json
        reference(sys.argv[1], **json.loads(sys.argv[2]))
''')


def _case_kwargs() -> dict:
    return dict(seeds=SEEDS, split_nums=SPLIT_NUMS, fold_data=FOLD_DATA, bit_shapes=BIT_SHAPES,
                normal_shapes=NORMAL_SHAPES, noise_seeds=NOISE_SEEDS, noise_batches=NOISE_BATCHES,
                uniform_bits=ALL_UNIFORM_BITS)


@pytest.fixture(scope="module")
def lock_reference(tmp_path_factory):
    pytest.importorskip("jax")
    path = tmp_path_factory.mktemp("prng_lock") / "reference.npz"
    namespace: dict = {"__name__": "prng_reference"}
    exec(compile(REFERENCE_SCRIPT, "prng_reference", "exec"), namespace)
    namespace["reference"](path, **_case_kwargs())
    with np.load(path) as z:
        return dict(z)


@pytest.fixture(scope="module")
def newest_reference(tmp_path_factory):
    python = os.environ.get("SAB_NEWEST_JAX_PYTHON")
    if not python:
        pytest.skip("SAB_NEWEST_JAX_PYTHON is not set: .ci/run sets it to a Python 3.12 venv with the newest JAX "
                    "where Python 3.12 and a registry are available")
    import json

    d = tmp_path_factory.mktemp("prng_newest")
    script, path = d / "reference.py", d / "reference.npz"
    script.write_text(REFERENCE_SCRIPT)
    kwargs = {k: [list(s) for s in v] if k.endswith("shapes") else v for k, v in _case_kwargs().items()}
    proc = subprocess.run([python, str(script), str(path), json.dumps(kwargs)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-4000:]
    with np.load(path) as z:
        return dict(z)


@pytest.fixture(params=["lock", "newest"])
def ref(request):
    """The reference draws of the lock's JAX or of the newest JAX (skipped where SAB_NEWEST_JAX_PYTHON is unset)."""
    return request.getfixturevalue(f"{request.param}_reference")


# ------------------------------------------------------------------ ulps and the derived bound
def ulp_diff(a, b) -> np.ndarray:
    """The number of float32 values from a to b (elementwise): 0 for equal, 1 for neighbours, across zero too."""
    def ordered(x):
        i = np.ascontiguousarray(x, np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    return np.abs(ordered(a) - ordered(b))


U = 2.0 ** -24  # float32's unit roundoff: a float32 operation's relative error is at most U
LOG1P_ULPS_NUMPY = 0.5 + 2.0 ** -26  # prng: float64 log1p (a few float64 ulps at most), rounded once to float32
LOG1P_ULPS_XLA = 1.0  # XLA's float32 log1p: 1 ulp, its accuracy budget on CPU and GPU
# (xla/codegen/intrinsic/accuracy/accuracy_budget.h, kLog1pF32Budget)


def _horner(coefs, v):
    """P(v), P'(v) and the running rounding-error bound of Horner's scheme in float32 without FMA, in units of U:
    step k, q_k = q_{k+1} * v + c_k, rounds the product (<= U |q_{k+1} v|) and the sum (<= U |q_k|), and an error
    made at step k reaches the result multiplied by |v|^k. With FMA a step rounds once: the bound covers both."""
    n = len(coefs) - 1
    q = np.full_like(v, float(coefs[0]))
    dp = np.zeros_like(v)
    h = np.zeros_like(v)
    for j, c in enumerate(coefs[1:], start=1):
        dp = dp * v + q  # derivative by Horner alongside
        prod = q * v
        q = prod + float(c)
        h += (np.abs(prod) + np.abs(q)) * np.abs(v) ** (n - j)
    return q, dp, h


def erfinv_ulp_bound(x) -> np.ndarray:
    """How far (in float32 ulps of the result) prng's ``sqrt(2) * erfinv(x)`` may lie from XLA's, for each float32
    input ``x``: a bound derived from the operations, not read off a machine.

    Both evaluate XLA's ErfInv32 (Giles' approximation) on the same float32 ``x`` (the uniforms agree bit for
    bit, tested below): ``t = -(x*x)`` (one rounding, the same in both: XLA keeps the multiply apart from
    log1p, as the exhaustive test shows, where a fused ``x*x`` would cost hundreds of ulps near |x| = 1);
    ``w = -log1p(t)``; ``v = w - 2.5`` if ``w < 5`` else ``sqrt(w) - 3``; ``p = P(v)`` by Horner (9
    coefficients); ``r = sqrt2 * (p * x)``. They differ in log1p (prng: float64 rounded once, within
    LOG1P_ULPS_NUMPY ulps; XLA: its own, within LOG1P_ULPS_XLA ulps) and in FMA (XLA contracts a Horner step's
    multiply and add where the CPU has FMA; not with --xla_cpu_max_isa=SSE4_2). Against the exact value
    R = sqrt2 * x * P(v(w)) of the same formula, an implementation with log1p error of L ulps has, to first order
    in U (one ulp is at most 2U relative, so |dw| <= 2 L U w):

    - in v: central ``|dv| <= 2 L U w + U |v|``; tail ``|dv| <= (L + 1) U sqrt(w) + U |v|`` (sqrt halves the
      relative error of w and rounds once; the subtraction rounds once);
    - in p: ``|P'(v)| |dv|`` from that, plus Horner's rounding (:func:`_horner`), all over |P(v)|;
    - 2 U for the two last multiplies (p * x and sqrt2 * r).

    The two implementations' relative errors E_numpy + E_xla then bound |r_numpy - r_xla| / |R|, and since a
    float32 ulp at the magnitude of either result exceeds U |R| (1 - E), the count of float32 values between
    them is at most (E_numpy + E_xla) / U (to first order; the caller floors it after a 1e-6 relative margin).
    Where an implementation's w may fall on the other side of 5 than the exact one, the gap between the two
    polynomials there is added. Over all 2**23 uniforms the bound peaks near 12 ulps (|x| ~ 0.9966, tail
    branch), and sits near 10 for most x: Horner's rounding bound dominates (P's terms cancel: sum |c_k v^k|
    is up to ~2.5 |P(v)| at v = -2.5), the log1p terms add at most ~1.6."""
    x = np.asarray(x, np.float32)
    w = -np.log1p((-(x * x)).astype(np.float64))  # exact enough: float64 against float32's U
    central = w < 5.0
    vc, vt = w - 2.5, np.sqrt(w) - 3.0
    pc, dpc, hc = _horner(prng._ERFINV_CENTRAL, vc)
    pt, dpt, ht = _horner(prng._ERFINV_TAIL, vt)
    p, dp, h, v = (np.where(central, a, b) for a, b in ((pc, pt), (dpc, dpt), (hc, ht), (vc, vt)))
    total = np.zeros_like(w)
    for lg in (LOG1P_ULPS_NUMPY, LOG1P_ULPS_XLA):
        dv = np.where(central, 2 * lg * U * w + U * np.abs(v), (lg + 1) * U * np.sqrt(w) + U * np.abs(v))
        total += (np.abs(dp) * dv + U * h) / np.abs(p) + 2 * U
    bound = total / U
    near_branch = np.abs(w - 5.0) <= 2 * 2 * max(LOG1P_ULPS_NUMPY, LOG1P_ULPS_XLA) * U * w
    return np.where(near_branch, bound + np.abs(pc - pt) / np.abs(p) / U, bound)


def _allowed(x) -> np.ndarray:
    return np.floor(erfinv_ulp_bound(x) * (1 + 1e-6)).astype(np.int64)


@functools.lru_cache(maxsize=1)
def normal_ulp_tolerance() -> int:
    """The bound's maximum over every uniform normal() can draw (2**23 of them): the tolerance of any normal."""
    bits = np.arange(2 ** ALL_UNIFORM_BITS, dtype=np.uint32) << np.uint32(32 - ALL_UNIFORM_BITS)
    u = prng._uniform_from_bits(bits)
    return int(max(_allowed(c).max() for c in np.array_split(u, 16)))


def check_normals(got, want, uniforms, what: str) -> int:
    """Elementwise within the derived bound, and within the global tolerance; returns the max ulp difference."""
    assert got.dtype == np.float32 and got.shape == want.shape, (what, got.dtype, got.shape, want.shape)
    d = ulp_diff(got, want)
    allowed = _allowed(uniforms)
    bad = np.flatnonzero(d.ravel() > allowed.ravel())
    assert bad.size == 0, (f"{what}: {bad.size} values beyond the derived bound, e.g. u={uniforms.ravel()[bad[0]]} "
                           f"ulps={d.ravel()[bad[0]]} allowed={allowed.ravel()[bad[0]]}")
    assert d.max(initial=0) <= normal_ulp_tolerance(), what
    return int(d.max(initial=0))


def test_the_derived_tolerance_is_a_few_ulps():
    tol = normal_ulp_tolerance()
    assert 3 <= tol <= 12, tol  # the derivation's peak (docstring of erfinv_ulp_bound): ~11.8 -> 11


# ------------------------------------------------------------------ bit for bit
@pytest.mark.slow
def test_prng_key_matches_jax_for_every_seed_kind(ref):
    for s in SEEDS:
        got = prng.prng_key(s)
        assert got.dtype == np.uint32 and got.shape == (2,)
        np.testing.assert_array_equal(got, ref[f"key_{s}"], err_msg=f"seed {s}")


def test_prng_key_wraps_as_jax_does_with_x64_disabled():
    jax = pytest.importorskip("jax")
    if jax.config.jax_enable_x64:
        pytest.skip("x64 enabled: JAX keeps the seed's high word")
    for s in [2 ** 32, 2 ** 32 + 7, 2 ** 40 + 3, -1, -5, 2 ** 63 - 1, -(2 ** 63)]:
        np.testing.assert_array_equal(prng.prng_key(s), np.asarray(jax.random.PRNGKey(s)), err_msg=str(s))
    with pytest.raises(OverflowError):
        prng.prng_key(2 ** 63)


def test_split_matches_jax(ref):
    for s in SEEDS:
        key = prng.prng_key(s)
        for n in SPLIT_NUMS:
            got = prng.split(key, n)
            assert got.dtype == np.uint32 and got.shape == (n, 2)
            np.testing.assert_array_equal(got, ref[f"split_{s}_{n}"], err_msg=f"seed {s} num {n}")
        np.testing.assert_array_equal(prng.split(key, (2, 3)), ref[f"split_{s}_2x3"])
        np.testing.assert_array_equal(prng.split(key), ref[f"split_{s}_2"])


def test_fold_in_matches_jax(ref):
    for s in SEEDS:
        for d in FOLD_DATA:
            got = prng.fold_in(prng.prng_key(s), d)
            assert got.dtype == np.uint32 and got.shape == (2,)
            np.testing.assert_array_equal(got, ref[f"fold_{s}_{d}"], err_msg=f"seed {s} data {d}")
    for d in (-1, 2 ** 32):  # as JAX: a Python int outside uint32 is an OverflowError
        with pytest.raises(OverflowError):
            prng.fold_in(prng.prng_key(0), d)


@pytest.mark.kernels
def test_random_bits_and_uniforms_match_jax(ref):
    for s in SEEDS:
        key = prng.prng_key(s)
        for shape in BIT_SHAPES:
            tag = "x".join(map(str, shape))
            got = prng.random_bits(key, shape)
            assert got.dtype == np.uint32 and got.shape == shape
            np.testing.assert_array_equal(got, ref[f"bits_{s}_{tag}"], err_msg=f"seed {s} shape {shape}")
            u = prng.uniform_open(key, shape)
            assert u.dtype == np.float32
            np.testing.assert_array_equal(u.view(np.uint32), ref[f"uniform_{s}_{tag}"].view(np.uint32),
                                          err_msg=f"uniform seed {s} shape {shape}")


@pytest.mark.kernels
@pytest.mark.slow
def test_every_uniform_normal_can_draw_maps_within_the_bound(ref):
    """All 2**23 values of normal()'s uniform through sqrt2 * erfinv: the uniforms bit for bit, the normals
    elementwise within erfinv_ulp_bound."""
    bits = np.arange(2 ** ALL_UNIFORM_BITS, dtype=np.uint32) << np.uint32(32 - ALL_UNIFORM_BITS)
    u = prng._uniform_from_bits(bits)
    np.testing.assert_array_equal(u.view(np.uint32), ref["all_uniforms"].view(np.uint32))
    worst = check_normals(prng._SQRT2 * prng.erfinv(u), ref["all_normals"], u, f"jax {ref['jax_version']}")
    print(f"\nJAX {ref['jax_version']}: max ulp difference over all 2**23 uniforms {worst} "
          f"(derived tolerance {normal_ulp_tolerance()})")


@pytest.mark.kernels
def test_normal_matches_jax_within_the_derived_bound(ref):
    worst = 0
    for s in SEEDS:
        key = prng.prng_key(s)
        for shape in NORMAL_SHAPES:
            want = ref[f"normal_{s}_{'x'.join(map(str, shape))}"]
            worst = max(worst, check_normals(prng.normal(key, shape), want, prng.uniform_open(key, shape),
                                             f"seed {s} shape {shape}"))
    print(f"\nJAX {ref['jax_version']}: max ulp difference of normal() {worst} "
          f"(derived tolerance {normal_ulp_tolerance()})")


def _noise_uniforms(cfg, key, batch):
    """The uniforms behind noise(): the same split chain, each draw's (batch, window, flat) then [:, -1]."""
    shape = (batch, cfg.window, cfg.flat_action_dim)
    out = []
    for _ in range(cfg.diffusion_steps + 1):
        key, k = prng.split_key(key)
        out.append(prng.uniform_open(k, shape)[:, -1])
    return np.stack(out)


@pytest.mark.kernels
def test_octo_noise_matches_noise_from_rng(ref):
    cfg = PRESETS["octo-small"]()
    for s in NOISE_SEEDS:
        key = prng.prng_key(s)
        np.testing.assert_array_equal(np.stack(prng.split_key(key)), ref[f"split_key_{s}"])
        for b in NOISE_BATCHES:
            init, steps = prng.noise_for(cfg, key, b)
            assert init.shape == (b, cfg.flat_action_dim) and steps.shape == (cfg.diffusion_steps, b,
                                                                                cfg.flat_action_dim)
            u = _noise_uniforms(cfg, key, b)
            check_normals(init, ref[f"noise_init_{s}_{b}"], u[0], f"init seed {s} batch {b}")
            check_normals(steps, ref[f"noise_steps_{s}_{b}"], u[1:], f"steps seed {s} batch {b}")
            i2, s2 = prng.noise(key, b, cfg.window, cfg.flat_action_dim, cfg.diffusion_steps)
            np.testing.assert_array_equal(i2, init)
            np.testing.assert_array_equal(s2, steps)


def test_noise_draws_the_normals_it_keeps():
    """noise() hashes only the kept window step's uniforms through erfinv: the same numbers as whole draws."""
    cfg = PRESETS["octo-small"]()
    key = prng.prng_key(11)
    init, steps = prng.noise_for(cfg, key, 3)
    rng, k = prng.split_key(key)
    np.testing.assert_array_equal(init, prng.normal(k, (3, cfg.window, cfg.flat_action_dim))[:, -1])
    for i in range(cfg.diffusion_steps):
        rng, k = prng.split_key(rng)
        np.testing.assert_array_equal(steps[i], prng.normal(k, (3, cfg.window, cfg.flat_action_dim))[:, -1])


# ------------------------------------------------------------------ no JAX, no warnings, fast
BLOCK_JAX = textwrap.dedent('''
    import sys, warnings
    warnings.simplefilter("error")  # numpy's overflow warnings (uint32 wraparound) are errors here

    class BlockJax:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("jax", "jaxlib", "flax"):
                raise ImportError(f"{name} is blocked")
            return None

    sys.meta_path.insert(0, BlockJax())
    from engines.octo import prng
    from engines.octo.config import PRESETS
    key = prng.prng_key(2 ** 32 - 1)
    rng, k = prng.split_key(key)
    init, steps = prng.noise_for(PRESETS["octo-small"](), k, 3)
    prng.normal(prng.fold_in(k, 5), (7, 3)); prng.split(key, 9); prng.random_bits(key, (5,))
    assert not [m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "flax")]
    print(init.shape, steps.shape, init.dtype)
''')


def test_prng_imports_no_jax_and_warns_of_nothing():
    proc = subprocess.run([sys.executable, "-c", BLOCK_JAX], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == ["(3,", "28)", "(20,", "3,", "28)", "float32"], proc.stdout


def test_one_querys_draws_take_well_under_a_millisecond():
    """One query: a split (the policy's) and noise (22 splits, 21 normals of (1, 2, 28)). Best of 50, so that a
    loaded machine does not fail it; 2 ms leaves room for a slow CI core (the benchmark has the real numbers)."""
    cfg = PRESETS["octo-small"]()
    rng = prng.prng_key(0)
    best = float("inf")
    for _ in range(50):
        t0 = time.perf_counter()
        rng, key = prng.split_key(rng)
        prng.noise_for(cfg, key, 1)
        best = min(best, time.perf_counter() - t0)
    assert best < 2e-3, best
