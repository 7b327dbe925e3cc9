"""Float tolerances derived from what varies in a run, never read off one machine.

XLA and ONNX Runtime choose a GEMM's blocking by its batch size and by the CPU (its vector width, its kernel),
so the same rows computed in batches of different sizes agree only to float32 rounding, and a sampler that
iterates on its own output amplifies that rounding. A bound that holds on every x86-64 CPU is therefore
measured in the run itself: the same rows computed at several other batch sizes give the spread that another
blocking causes here; :func:`reblocking_bound` allows a multiple of it (never less than a few units in the
last place of the result). Only results of the same compiled program on the same inputs (same shapes) are
compared bit for bit.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

F32_EPS = float(np.finfo(np.float32).eps)  # 2**-23: one unit in the last place at magnitude 1
REBLOCK_FACTOR = 4.0  # a blocking not among those measured may round up to this many times worse
MIN_ULPS = 16  # the floor: where every measured blocking happens to agree exactly


def reblocking_bound(reference: np.ndarray, others: Iterable[np.ndarray], factor: float = REBLOCK_FACTOR,
                     min_ulps: int = MIN_ULPS) -> float:
    """The largest absolute difference from ``reference`` that another GEMM blocking of the same rows may cause:
    ``factor`` times the largest difference of ``others`` (the same rows computed at other batch sizes in this
    run) from it, and at least ``min_ulps`` float32 units in the last place of the reference's magnitude."""
    reference = np.asarray(reference, np.float64)
    spread = max((float(np.max(np.abs(np.asarray(o, np.float64) - reference))) for o in others), default=0.0)
    scale = max(float(np.max(np.abs(reference))), 1.0)
    return max(factor * spread, min_ulps * F32_EPS * scale)
