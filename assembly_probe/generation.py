"""Plan-k-step-Generation scoring of one Plan-k-step item: a model draws one image per step instead of choosing.

The same scorer as the generation set's (:func:`genset.score_images`): each generated image is aligned to the
fixed camera and read part by part (the headline: every block at its start or in its hole, the inserted sets a
legal path to the target); beside it the MSE diagnostic against the valid states of each step (every set of i
inserted blocks on some legal path, rendered here on demand from the item's camera) within ``MSE_TOLERANCE``.

``MSE_TOLERANCE`` is the Plan-k-Step-Generation set's calibrated tolerance (``calibration.mse.tolerance_mse`` in
``results/reasoning/generation/manifest.json``; a test checks they are the same).
"""

from __future__ import annotations

import numpy as np

from assembly_probe import genset as GS
from assembly_probe import matching as M
from assembly_probe import planning as P

MSE_TOLERANCE = 0.00020817316544707865


def step_states(item) -> dict[int, list[frozenset]]:
    """Valid inserted sets per step 1..k (all states on some legal path to the target)."""
    dom, target, k = item["meta"]["domain"], set(item["meta"]["target"]), item["k"]
    by_size: dict[int, list[frozenset]] = {i: [] for i in range(1, k + 1)}
    for s in P.ideals(dom, target):
        if 1 <= len(s) <= k:
            by_size[len(s)].append(s)
    return by_size


class Scorer:
    """Renders (and caches) an item's valid states on demand. ``render(state, camera)`` -> uint8 image."""

    def __init__(self, render, size: int, tolerance: float = MSE_TOLERANCE):
        self.render, self.size, self.tolerance = render, size, tolerance
        self._refs: dict[str, GS.CaseRefs] = {}

    def _case(self, item) -> GS.CaseRefs:
        if item["id"] not in self._refs:
            dom, target = item["meta"]["domain"], item["meta"]["target"]
            camera = item["images"][0]["camera"]

            def img(inserted):
                return M.to_size(self.render(P.state_of(dom, inserted), camera), self.size)

            valid = {i: [(sorted(s), img(s)) for s in sets] for i, sets in step_states(item).items()}
            self._refs[item["id"]] = GS.CaseRefs(item, img(()), img(target), valid)
        return self._refs[item["id"]]

    def score(self, item, images) -> dict:
        refs = self._case(item)
        return GS.score_images(refs, [M.to_size(np.asarray(im), self.size) for im in images], self.tolerance)
