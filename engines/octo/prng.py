"""JAX's threefry2x32 PRNG in NumPy: Octo's diffusion noise drawn with no JAX at run time (the Jetson image has none).

Everything here reproduces ``jax.random`` with the default ``threefry2x32`` implementation under
``jax.threefry_partitionable(False)`` (upstream Octo's setting, jax 0.4.20 semantics; see
:func:`engines.octo.model.upstream_prng`), with keys as JAX's raw legacy keys: ``uint32`` arrays of shape (2,).

- :func:`prng_key`, :func:`split`, :func:`fold_in`, :func:`random_bits`: bit for bit as ``jax.random.PRNGKey``,
  ``split``, ``fold_in`` and ``bits`` (32-bit);
- :func:`uniform_open`: bit for bit as ``jax.random.uniform(key, shape, float32, nextafter(-1, 0), 1)``, the
  uniform that ``jax.random.normal`` draws;
- :func:`normal`: ``jax.random.normal``'s path (those uniforms, then ``sqrt(2) * erfinv(u)``), with XLA's float32
  erfinv (Giles' single-precision approximation, as XLA lowers ``chlo.erf_inv``: the same two polynomials, the
  same Horner order, the same branch at ``w = 5``), evaluated in float32. Its results agree with JAX's to a few
  ulps, not bit for bit: XLA may fuse the Horner steps into FMAs (it allows FP contraction on CPUs with FMA) and
  computes ``log1p`` with its own approximation; tests/test_prng.py derives the bound and checks it;
- :func:`noise` / :func:`noise_for`: :func:`engines.octo.model.noise_from_rng`'s draws (same splits, same shapes,
  same order).

Threefry is vectorised over ``uint32`` arrays (wraparound arithmetic is what uint32 arrays do; no overflow
warnings arise, since numpy only warns for scalar overflow); the sequential key splits of a query, two-element
hashes, run on Python ints, which is several times faster than numpy at that size. One octo-small query's draws
(22 splits and 21 normals of shape (1, 2, 28)) cost well under a millisecond.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

__all__ = ["prng_key", "split", "fold_in", "random_bits", "uniform_open", "erfinv", "normal", "noise", "noise_for",
           "split_key"]

_M32 = 0xFFFFFFFF
_ROT = ((13, 15, 26, 6), (17, 29, 16, 24))
_ROT_GROUPS = tuple(_ROT[i & 1] for i in range(5))  # the rotations of the five 4-round groups
_PARITY = 0x1BD11BDA
_U32 = np.uint32


# ------------------------------------------------------------------ the threefry2x32 hash
def _keys(key) -> tuple[int, int]:
    k = np.asarray(key)
    if k.shape != (2,) or k.dtype != np.uint32:
        raise TypeError(f"a threefry key is a uint32 array of shape (2,); got {k.dtype} {k.shape}")
    return int(k[0]), int(k[1])


def _schedule(k0: int, k1: int) -> list[tuple[int, int]]:
    """The five key injections after the 4-round groups: (added to x0, added to x1), the round counter folded in
    (addition mod 2**32 is associative, so ``x + ks + i`` == ``x + ((ks + i) mod 2**32)``)."""
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    return [(ks[(i + 1) % 3], (ks[(i + 2) % 3] + i + 1) & _M32) for i in range(5)]


def _hash_py(k0: int, k1: int, x0: int, x1: int) -> tuple[int, int]:
    """threefry2x32 of one (x0, x1) pair on Python ints: 20 rounds, 5 key injections (jax's unrolled lowering)."""
    inj = _schedule(k0, k1)
    x0 = (x0 + k0) & _M32
    x1 = (x1 + k1) & _M32
    for i in range(5):
        for r in _ROT[i & 1]:
            x0 = (x0 + x1) & _M32
            x1 = (((x1 << r) & _M32) | (x1 >> (32 - r))) ^ x0
        a, b = inj[i]
        x0 = (x0 + a) & _M32
        x1 = (x1 + b) & _M32
    return x0, x1


def _split2(k0: int, k1: int) -> tuple[int, int, int, int]:
    """``split(key)`` on Python ints, both hashed pairs in one loop: the counts iota(4) are the pairs (0, 2) and
    (1, 3); the new keys are [pair0[0], pair1[0]] (the carried rng) and [pair0[1], pair1[1]] (the drawn key).
    The hot path of a query's draws: the mask is a literal (a constant load, not a global one)."""
    inj = _schedule(k0, k1)
    x0, x1, y0, y1 = k0, (2 + k1) & 0xFFFFFFFF, (1 + k0) & 0xFFFFFFFF, (3 + k1) & 0xFFFFFFFF
    for rots, (a, b) in zip(_ROT_GROUPS, inj):
        for r in rots:
            x0 = (x0 + x1) & 0xFFFFFFFF
            y0 = (y0 + y1) & 0xFFFFFFFF
            x1 = (((x1 << r) & 0xFFFFFFFF) | (x1 >> (32 - r))) ^ x0
            y1 = (((y1 << r) & 0xFFFFFFFF) | (y1 >> (32 - r))) ^ y0
        x0 = (x0 + a) & 0xFFFFFFFF
        x1 = (x1 + b) & 0xFFFFFFFF
        y0 = (y0 + a) & 0xFFFFFFFF
        y1 = (y1 + b) & 0xFFFFFFFF
    return x0, y0, x1, y1


_ROT_NP = tuple(tuple((_U32(r), _U32(32 - r)) for r in group) for group in _ROT)


def _hash_np(k0, k1, x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """threefry2x32 over uint32 arrays (new arrays; the inputs are left as they are); ``k0``/``k1``: Python ints,
    or uint32 arrays broadcasting against ``x0`` (one key per row for a batch of draws). The uint32 arithmetic
    wraps mod 2**32 as threefry wants (numpy warns about overflow of scalars only, and the scalar key schedule is
    done on Python ints)."""
    if isinstance(k0, (int, np.integer)):
        k0, k1 = int(k0), int(k1)
        first = (_U32(k0), _U32(k1))
        inj = [(_U32(a), _U32(b)) for a, b in _schedule(k0, k1)]
    else:
        ks = (k0, k1, k0 ^ k1 ^ _U32(_PARITY))
        first = (k0, k1)
        inj = [(ks[(i + 1) % 3], ks[(i + 2) % 3] + _U32(i + 1)) for i in range(5)]
    x0 = np.add(x0, first[0], dtype=np.uint32)
    x1 = np.add(x1, first[1], dtype=np.uint32)
    x0, x1 = np.broadcast_arrays(x0, x1)
    x0, x1 = x0.copy(), x1.copy()
    tmp = np.empty_like(x1)
    for i in range(5):
        for left, right in _ROT_NP[i & 1]:  # in place: a fifth of the time of fresh arrays at this size
            np.add(x0, x1, out=x0)
            np.left_shift(x1, left, out=tmp)
            np.right_shift(x1, right, out=x1)
            np.bitwise_or(x1, tmp, out=x1)
            np.bitwise_xor(x1, x0, out=x1)
        np.add(x0, inj[i][0], out=x0)
        np.add(x1, inj[i][1], out=x1)
    return x0, x1


def _threefry_counts(keys: np.ndarray, n: int) -> np.ndarray:
    """``threefry_2x32(key, iota(n))`` of JAX for each key of ``keys`` ((K, 2) uint32): (K, n) uint32. The counts
    are cut in two halves (an odd count padded with one 0 at the end), hashed pairwise, the halves concatenated
    and the pad dropped."""
    half = (n + 1) // 2
    x0 = np.arange(half, dtype=np.uint32)[None]
    x1 = np.arange(half, 2 * half, dtype=np.uint32)[None]
    if n % 2:
        x1[0, -1] = 0
    if keys.shape[0] == 1:
        y0, y1 = _hash_np(int(keys[0, 0]), int(keys[0, 1]), x0, x1)
    else:
        y0, y1 = _hash_np(keys[:, :1], keys[:, 1:], x0, x1)
    return np.concatenate([y0, y1], axis=1)[:, :n]


def _shape(shape) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    return shape


# ------------------------------------------------------------------ keys
def prng_key(seed: int) -> np.ndarray:
    """``jax.random.PRNGKey(seed)``'s raw key data (default threefry2x32 impl, x64 disabled, as this project runs
    JAX): ``[0, seed mod 2**32]`` as uint32.

    JAX turns a Python int seed into ``np.int64`` (any int outside [-2**63, 2**63) is an OverflowError there, and
    here), then, with x64 disabled, into an int32 array, which wraps it to its low 32 bits; the key is
    ``[seed >> 32 (a logical shift of a 32-bit value by 32: 0), seed & 0xFFFFFFFF]``. So seeds in [2**31, 2**32)
    give ``[0, seed]`` (they are not clipped or rejected), as do negative seeds ``[0, seed + 2**32]`` and larger
    ones their low word. With x64 enabled JAX would keep the high word (``[seed >> 32, seed & 0xFFFFFFFF]``): the
    two agree on [0, 2**32), the seeds the policy uses (``int(seed or 0) % 2**32``)."""
    s = int(seed)
    if not -(2 ** 63) <= s < 2 ** 63:
        raise OverflowError(f"seed {s} does not fit int64 (as jax.random.PRNGKey)")
    return np.array([0, s & _M32], dtype=np.uint32)


def split(key, num: int | Sequence[int] = 2) -> np.ndarray:
    """``jax.random.split(key, num)`` under ``jax.threefry_partitionable(False)``: (num, 2) uint32 (``num`` may
    be a shape: (*shape, 2)). The new keys are ``threefry_2x32(key, iota(2 * num))`` reshaped."""
    k0, k1 = _keys(key)
    shape = _shape(num)
    n = math.prod(shape)
    if n <= 4:  # a few keys (the per-query split): Python ints beat numpy's per-call overhead
        h = n  # counts 0..2n-1 in halves [0, n) and [n, 2n)
        out = [0] * (2 * n)
        for j in range(h):
            out[j], out[h + j] = _hash_py(k0, k1, j, h + j)
        return np.array(out, dtype=np.uint32).reshape(*shape, 2)
    return _threefry_counts(np.array([[k0, k1]], np.uint32), 2 * n).reshape(*shape, 2)


def split_key(key) -> tuple[np.ndarray, np.ndarray]:
    """``split(key)`` as (rng, key): :func:`engines.octo.model.split_key` without JAX."""
    r0, r1, s0, s1 = _split2(*_keys(key))
    return np.array([r0, r1], np.uint32), np.array([s0, s1], np.uint32)


def fold_in(key, data: int) -> np.ndarray:
    """``jax.random.fold_in(key, data)``: ``threefry_2x32(key, [0, data])`` (the same with or without partitionable
    threefry). ``data`` must be in [0, 2**32), as JAX requires of a Python int (OverflowError otherwise)."""
    k0, k1 = _keys(key)
    d = int(data)
    if not 0 <= d <= _M32:
        raise OverflowError(f"Python integer {d} out of bounds for uint32 (as jax.random.fold_in)")
    a, b = _hash_py(k0, k1, 0, d)
    return np.array([a, b], dtype=np.uint32)


# ------------------------------------------------------------------ bits, uniforms, normals
def random_bits(key, shape: int | Sequence[int]) -> np.ndarray:
    """``jax.random.bits(key, shape)`` (uint32) under ``jax.threefry_partitionable(False)``:
    ``threefry_2x32(key, iota(size))`` reshaped."""
    k0, k1 = _keys(key)
    return _bits(np.array([[k0, k1]], np.uint32), _shape(shape))[0]


def _bits(keys: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    n = math.prod(shape)
    if n >= _M32:  # JAX then hashes in blocks of 2**32-1 under split keys: never needed here
        raise NotImplementedError("random bits of 2**32-1 elements or more")
    if n == 0:
        return np.zeros((keys.shape[0], *shape), np.uint32)
    return _threefry_counts(keys, n).reshape(keys.shape[0], *shape)


_ONE_BITS = _U32(0x3F800000)  # 1.0f
_LO = np.nextafter(np.float32(-1.0), np.float32(0.0))  # normal()'s minval, as jax.random._normal_real
_HI = np.float32(1.0)


def _uniform_from_bits(bits: np.ndarray, lo: np.float32 = _LO, hi: np.float32 = _HI) -> np.ndarray:
    """jax.random._uniform for float32: the top 23 bits as the mantissa of a float in [1, 2), minus 1, scaled to
    [lo, hi) in float32 and clipped below at lo."""
    floats = ((bits >> _U32(9)) | _ONE_BITS).view(np.float32) - np.float32(1.0)
    return np.maximum(lo, floats * np.float32(hi - lo) + lo)


def uniform_open(key, shape: int | Sequence[int]) -> np.ndarray:
    """``jax.random.uniform(key, shape, float32, nextafter(-1, 0), 1)`` bit for bit: the uniforms that
    :func:`normal` maps through erfinv (a value in [nextafter(-1, 0), 1))."""
    return _uniform_from_bits(random_bits(key, shape))


# Giles (2010), "Approximating the erfinv function", single precision; XLA's ErfInv32 (chlo.erf_inv for f32):
# w = -log1p(-x*x); w < 5: p(w - 2.5) with _ERFINV_CENTRAL, else p(sqrt(w) - 3) with _ERFINV_TAIL; erfinv = p * x.
_ERFINV_CENTRAL = tuple(np.float32(c) for c in (
    2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
    -0.00417768164, 0.246640727, 1.50140941))
_ERFINV_TAIL = tuple(np.float32(c) for c in (
    -0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
    0.00943887047, 1.00167406, 2.83297682))
_SQRT2 = np.float32(np.sqrt(2.0))  # the constant of jax.random._normal_real


def erfinv(x: np.ndarray) -> np.ndarray:
    """XLA's float32 erfinv (Giles' approximation): the same formula, branch, polynomials and Horner order, every
    operation rounded to float32 (no FMA). ``log1p`` is computed in float64 and rounded once to float32 (within
    0.5 ulp plus a double rounding's 2**-29 of the exact value, whatever numpy's own float32 log1p does on this
    CPU); XLA's is its own approximation (1 ulp in XLA's accuracy budget)."""
    x = np.asarray(x, np.float32)
    t = -(x * x)  # XLA: multiply(x, negate(x)), the same rounding
    w = np.negative(np.log1p(t.astype(np.float64))).astype(np.float32)
    central = w < np.float32(5.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        v = np.where(central, w - np.float32(2.5), np.sqrt(w) - np.float32(3.0))
        if central.all():
            coefs = [np.float32(c) for c in _ERFINV_CENTRAL]
        elif not central.any():
            coefs = [np.float32(c) for c in _ERFINV_TAIL]
        else:
            coefs = [np.where(central, a, b) for a, b in zip(_ERFINV_CENTRAL, _ERFINV_TAIL)]
        p = coefs[0]
        for c in coefs[1:]:
            p = c + p * v
        out = p * x
        edge = np.abs(x) == np.float32(1.0)
        if edge.any():
            out = np.where(edge, x * np.float32(np.inf), out)
    return out.astype(np.float32, copy=False)


def _normal_from_bits(bits: np.ndarray) -> np.ndarray:
    return _SQRT2 * erfinv(_uniform_from_bits(bits))


def normal(key, shape: int | Sequence[int]) -> np.ndarray:
    """``jax.random.normal(key, shape)`` (float32) under ``jax.threefry_partitionable(False)``: bits -> uniform in
    [nextafter(-1, 0), 1) (bit for bit) -> ``sqrt(2) * erfinv(u)`` (to a few ulps: see :func:`erfinv`)."""
    return _normal_from_bits(random_bits(key, shape))


# ------------------------------------------------------------------ Octo's noise
def noise(key, batch: int, window: int, flat_action_dim: int, diffusion_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`engines.octo.model.noise_from_rng` without JAX: ``(init (batch, flat), steps (diffusion_steps, batch,
    flat))`` float32.

    As upstream's ``predict_action``: ``rng, k = split(rng)``; ``init = normal(k, (batch, window, flat))[:, -1]``;
    then per step (the scan) ``rng, k = split(rng)``; ``normal(k, (batch, window, flat))[:, -1]``. The keys are
    split in turn; all the draws' hashes then run as one vectorised threefry (one key per row)."""
    k0, k1 = _keys(key)
    keys = np.empty((diffusion_steps + 1, 2), np.uint32)
    for i in range(diffusion_steps + 1):
        k0, k1, s0, s1 = _split2(k0, k1)  # (the carried rng, this draw's key)
        keys[i] = (s0, s1)
    shape = (int(batch), int(window), int(flat_action_dim))
    if math.prod(shape) == 0:
        z = np.zeros((diffusion_steps + 1, shape[0], shape[2]), np.float32)
        return z[0], z[1:]
    bits = _bits(keys, shape)[:, :, -1]  # only the kept window step's numbers go through erfinv
    drawn = _normal_from_bits(bits)
    return drawn[0], drawn[1:]


def noise_for(cfg: Any, key, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`noise` for an :class:`engines.octo.config.OctoConfig` (its window, flat_action_dim and
    diffusion_steps): ``noise_from_rng(cfg, key, batch)`` without JAX."""
    return noise(key, batch, cfg.window, cfg.flat_action_dim, cfg.diffusion_steps)
