"""Arithmetic that gives the same bits on every machine, for everything that is hashed or locked.

``np.linalg.norm`` of a 1-D array, ``np.dot`` and ``@`` go through BLAS, and OpenBLAS picks its kernel
per CPU (fused multiply-add or not, another summation order): the last bit of a derived start or a
question's metadata then depends on the machine (``OPENBLAS_CORETYPE=Prescott`` / ``Haswell`` /
``SkylakeX`` show it). These helpers use plain float arithmetic, summed left to right: Python floats
and numpy's elementwise ufuncs round every operation once and never fuse a multiply-add.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np


def dot(u, v) -> float:
    """Sum of products of two short vectors, left to right."""
    total = 0.0
    for a, b in zip(u, v):
        total += float(a) * float(b)
    return total


def norm(v) -> float:
    """Euclidean norm of a short vector (sum of squares left to right, then the correctly rounded sqrt)."""
    return math.sqrt(dot(v, v))


def fma(a: float, b: float, c: float) -> float:
    """a * b + c rounded once (IEEE fused multiply-add), in exact rational arithmetic where Python has
    no math.fma (before 3.13)."""
    if hasattr(math, "fma"):
        return math.fma(a, b, c)
    return float(Fraction(a) * Fraction(b) + Fraction(c))


def rows_dot(points, axis) -> np.ndarray:
    """Each row of ``points`` (n, d) dotted with ``axis`` (d,): ``points @ axis`` without BLAS."""
    points = np.asarray(points, dtype=float)
    out = points[:, 0] * float(axis[0])
    for k in range(1, points.shape[1]):
        out = out + points[:, k] * float(axis[k])
    return out


def rows_matmul(points, matrix) -> np.ndarray:
    """``points @ matrix`` for (n, d) points and a (d, m) matrix without BLAS, column by column."""
    matrix = np.asarray(matrix, dtype=float)
    return np.stack([rows_dot(points, matrix[:, j]) for j in range(matrix.shape[1])], axis=1)
