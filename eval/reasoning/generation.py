"""Plan-k-step-Generation scoring: a model draws one image per step instead of choosing.

Each generated image i (i = 1..k) is matched to the *valid states of step i*: every set of i
inserted blocks that lies on some legal path from the initial state to the target (not only
the reference path), rendered from the item's camera. The match is the valid state with the
smallest mean squared error (RGB in [0, 1], generated images resized to the render size);
it counts only if that MSE is <= ``MSE_THRESHOLD``. The trajectory is accepted only if every
step matched and the matched states form a legal complete path: one new block per step, each
move legal, and the last missing block legal too, checked by the constraint-graph order checker.

``MSE_THRESHOLD`` = 6.5e-5 (RMS 0.0081, 2.1/255) is the Plan-k-Step-Generation set's calibrated
threshold squared (:mod:`eval.reasoning.genset`, ``results/reasoning/generation/manifest.json``):
half the smallest RMS distance, over the 80 cases of k = 2..5, between a valid state and its nearest
invalid state of the same step (0.0162: a block resting on its hole's rim at a wrong yaw) or between
two valid states (0.0199). Within it a match is nearer its state than any other valid or invalid
state. (The earlier 3e-4, RMS 0.017, was above half that distance.) The set's own scorer,
``python -m eval.reasoning generate-score``, reads the threshold from the set's manifest; this
scorer renders states on demand for a single item.
"""

from __future__ import annotations

import numpy as np

from eval.reasoning import planning as P

MSE_THRESHOLD = 6.5e-5


def step_states(item) -> dict[int, list[frozenset]]:
    """Valid inserted sets per step 1..k (all states on some legal path to the target)."""
    dom, target, k = item["meta"]["domain"], set(item["meta"]["target"]), item["k"]
    by_size: dict[int, list[frozenset]] = {i: [] for i in range(1, k + 1)}
    for s in P.ideals(dom, target):
        if 1 <= len(s) <= k:
            by_size[len(s)].append(s)
    return by_size


def _as_float(img, size) -> np.ndarray:
    from PIL import Image

    img = np.asarray(img)
    if img.shape[:2] != (size, size):
        img = np.asarray(Image.fromarray(img.astype(np.uint8)).convert("RGB").resize((size, size), Image.BILINEAR))
    return img[..., :3].astype(np.float32) / 255.0


class Scorer:
    """Renders (and caches) the valid states of an item on demand. ``render(state, camera)`` -> uint8 image."""

    def __init__(self, render, size: int, threshold: float = MSE_THRESHOLD):
        self.render, self.size, self.threshold = render, size, threshold
        self._cache: dict[tuple, np.ndarray] = {}

    def _ref(self, item, inserted, camera):
        key = (item["id"], frozenset(inserted), camera)
        if key not in self._cache:
            state = P.state_of(item["meta"]["domain"], inserted)
            self._cache[key] = _as_float(self.render(state, camera), self.size)
        return self._cache[key]

    def score(self, item, images) -> dict:
        k = item["k"]
        dom, target = item["meta"]["domain"], set(item["meta"]["target"])
        camera = item["images"][0]["camera"]
        if len(images) != k:
            return {"accepted": False, "reason": f"expected {k} images, got {len(images)}", "matched": [], "mse": []}
        per_step = step_states(item)
        matched, mses = [], []
        for i, img in enumerate(images, start=1):
            gen = _as_float(img, self.size)
            scores = [(float(np.mean((gen - self._ref(item, s, camera)) ** 2)), sorted(s)) for s in per_step[i]]
            best, sset = min(scores)
            mses.append(best)
            if best > self.threshold:
                return {"accepted": False, "reason": f"step {i}: no valid state within MSE {self.threshold:g} "
                        f"(best {best:.2e})", "matched": matched, "mse": mses}
            matched.append(sset)
        moves, prev = [], set()
        for i, s in enumerate(matched, start=1):
            new = set(s) - prev
            if not prev <= set(s) or len(new) != 1:
                return {"accepted": False, "reason": f"step {i} does not add exactly one block to step {i - 1}",
                        "matched": matched, "mse": mses}
            moves.append(new.pop())
            prev = set(s)
        order = moves + sorted(target - prev)
        ok = len(target - prev) == 1 and P.is_topological_order(order, target, P.edges(dom))
        return {"accepted": bool(ok), "reason": "legal path" if ok else "illegal order", "matched": matched,
                "mse": mses, "moves": order}
