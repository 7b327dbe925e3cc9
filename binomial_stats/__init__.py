"""Binomial proportion statistics shared by the benchmark's evaluation (``eval.stats``) and the assembly reasoning
probe (``assembly_probe``): the Wilson score interval and its 95% z.

The lowest layer of the house (tests/test_layers.py): it imports nothing of the project, so both can import it
downwards without either importing the other.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054

__all__ = ["Z95", "Interval", "wilson"]


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


def wilson(k: int, n: int, z: float = Z95) -> Interval:
    """Wilson score interval for ``k`` successes out of ``n`` tries.

    centre    = (p + z^2 / 2n) / (1 + z^2 / n)
    half-width = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / 4n^2)

    ``n == 0`` gives ``Interval(nan, nan)``.  The bounds are clipped to
    [0, 1] and are exactly 0 (k == 0) / 1 (k == n) at the edges.
    """
    k = int(k)
    n = int(n)
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"wilson: need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return Interval(math.nan, math.nan)
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = (z / denom) * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n))
    low = 0.0 if k == 0 else max(0.0, centre - half)
    high = 1.0 if k == n else min(1.0, centre + half)
    return Interval(low, high)
