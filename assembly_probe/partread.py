"""Part-level verifier for Plan-k-Step-Generation: which block stands where, read from a picture's colours.

Beyond the paper, whose own stated limit is that "MSE matching may depend on rendering style": the scenes
have known block colours, known shapes and a fixed camera, so each block can be looked for where it could
be. For every block the verifier knows three image regions (projected from the exact geometry): where the
block shows at its start (its silhouette, less the blocks stacked on it), where it shows when inserted in
its hole (what stands above the plate) and what a block resting on that hole's rim would add. A pixel is
given to the block whose colour it is nearest, or to the background (table, board, shadows), by the nearest
of colour samples taken from the case's own input pictures (the initial state shows every block at its
start, the target the target blocks inserted). A block is "at start", "inserted" or "elsewhere" (or on the rim) by the
share of its colour in those regions (half of a start or hole region, a quarter of the rim region: ``THRESHOLDS``;
the picture aligned to the initial one first, :func:`matching.align`). Then legality on parts: every block at its start or inserted, the
inserted set one block larger each step, inside the target, with every block that rested on an inserted one
inserted too, and the last missing block a legal final move (:func:`planning.legal_path`, the MSE matcher's
check as well).
"""

from __future__ import annotations


import numpy as np

from env import geometry
from assembly_probe import planning as P
from assembly_probe import scene as S

SHARE = 0.5  # of a start or hole region's pixels in the block's colour: the block is there
# the rim region is where only a raised block shows (a block on its hole's rim at a wrong yaw covers its hole region
# as well, 88-91% in the worst of the calibration's such states, and half its rim region, 48-49%; a block down in
# its hole leaves the rim region the table's): a quarter of it in the block's colour is enough to say "not in its hole"
RIM_SHARE = 0.25
THRESHOLDS = {"start": SHARE, "hole": SHARE, "rim": RIM_SHARE}
ERODE_PX = 2  # regions shrunk by this much: a 1-2 px misregistration stays inside them
SAMPLES = 400  # colour samples per class
SHADING = (0.7, 0.85, 1.0, 1.15, 1.3)  # a block's colour samples, also this much darker / brighter
BG_MARGIN = 0.03  # a block's colour samples lie at least this far (rgb in [0, 1]) from every background sample


def _mask(polys, size: int) -> np.ndarray:
    from PIL import Image, ImageDraw

    im = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(im)
    for poly in polys:
        if len(poly) >= 3:
            draw.polygon([(float(u), float(v)) for u, v in poly], fill=1)
    return np.asarray(im, dtype=bool)


def _erode(m: np.ndarray, px: int) -> np.ndarray:
    from scipy.ndimage import binary_erosion

    return binary_erosion(m, iterations=px) if px else m


def _dilate(m: np.ndarray, px: int) -> np.ndarray:
    from scipy.ndimage import binary_dilation

    return binary_dilation(m, iterations=px) if px else m


def block_mask(block: dict, camera: str, size: int, z_min: float | None = None) -> np.ndarray:
    """The pixels a block covers: its prism's outline and its knob's (not the hull of both, which takes in
    the table beside the knob)."""
    pts = S.block_points(block, z_min)
    prism, knob = pts[:-8], pts[-8:]
    polys = [S.hull2d(S.project(camera, knob, size))]
    if prism:
        polys.append(S.hull2d(S.project(camera, prism, size)))
    return _mask(polys, size)


def regions(dom: dict, camera: str, size: int) -> dict[str, dict[str, np.ndarray]]:
    """{block id: {"start", "hole", "rim"}: boolean masks}, eroded by ``ERODE_PX``."""
    start = {b["id"]: b for b in dom["blocks"]}
    sil = {bid: block_mask(b, camera, size) for bid, b in start.items()}
    out = {}
    for bid, b in start.items():
        above = [u for u in P.uppers(dom, bid)]
        covered = np.zeros((size, size), bool)
        todo = list(above)
        while todo:  # every block stacked above, however high
            u = todo.pop()
            covered |= _dilate(sil[u], 1)
            todo += P.uppers(dom, u)
        x, y, z, yaw = P.inserted_pose(dom, bid)
        ins = dict(b, x=x, y=y, z=z, yaw=yaw)
        hole = block_mask(ins, camera, size, z_min=geometry.PLATE_TOP_Z)
        raised = block_mask(dict(ins, z=S.Z_PLATE), camera, size)  # on the rim: a plate higher than inserted
        out[bid] = {"start": _erode(sil[bid] & ~covered, ERODE_PX), "hole": _erode(hole, ERODE_PX),
                    "rim": _erode(raised & ~_dilate(hole, 2), ERODE_PX)}
    return out


def _samples(pixels: np.ndarray, n: int = SAMPLES) -> np.ndarray:
    """Up to ``n`` colours spread over a class's pixels (sorted by brightness, evenly picked): deterministic."""
    if len(pixels) <= n:
        return pixels
    order = np.argsort(pixels.sum(axis=1), kind="stable")
    return pixels[order[np.linspace(0, len(pixels) - 1, n).round().astype(int)]]


class Reader:
    """The verifier for one case: regions from its domain, colour samples from its initial and target renders
    (``to_size`` images)."""

    def __init__(self, dom: dict, target, initial: np.ndarray, target_img: np.ndarray, camera: str = P.CAMERA):
        from scipy.spatial import cKDTree

        self.dom, self.target = dom, set(target)
        self.size = initial.shape[0]
        self.initial = initial
        self.ids = sorted(b["id"] for b in dom["blocks"])
        self.regions = regions(dom, camera, self.size)
        start_sil = np.zeros((self.size, self.size), bool)
        for b in dom["blocks"]:
            start_sil |= block_mask(b, camera, self.size)
        bg = _samples(initial[~_dilate(start_sil, 3)], 4 * SAMPLES)
        bg_tree = cKDTree(bg)
        colours, labels = [], []
        for j, bid in enumerate(self.ids):
            px = [initial[self.regions[bid]["start"]]]
            if bid in self.target:
                px.append(target_img[self.regions[bid]["hole"]])
            px = np.concatenate(px)
            px = px[bg_tree.query(px)[0] > BG_MARGIN]  # a region's edge pixels that show the table are not the block
            # the same faces lit more or less (a shadow cast on them comes or goes as other blocks move)
            c = _samples(px)
            c = np.concatenate([np.clip(c * f, 0.0, 1.0) for f in SHADING])
            c = c[bg_tree.query(c)[0] > BG_MARGIN]
            colours.append(c)
            labels.append(np.full(len(c), j))
        colours.append(bg)
        labels.append(np.full(len(bg), len(self.ids)))  # the background class
        self._tree = cKDTree(np.concatenate(colours))
        self._labels = np.concatenate(labels)
        # every region's pixels as indices into one list of the pixels any region holds (each looked up once)
        union = np.zeros((self.size, self.size), bool)
        for reg in self.regions.values():
            for m in reg.values():
                union |= m
        self._pixels = np.flatnonzero(union)
        pos = np.full(self.size * self.size, -1)
        pos[self._pixels] = np.arange(len(self._pixels))
        self._index = {bid: {name: pos[np.flatnonzero(m)] for name, m in reg.items()}
                       for bid, reg in self.regions.items()}

    def shares(self, img: np.ndarray) -> dict[str, dict[str, float]]:
        """{block id: {"start", "hole", "rim": the share of the region's pixels in the block's colour}} for an
        image ``matching.align``ed to the initial render (its size, its photometry, registered)."""
        _, nearest = self._tree.query(img.reshape(-1, 3)[self._pixels])
        cls = self._labels[nearest]
        return {bid: {name: float(np.mean(cls[ix] == j)) if len(ix) else 0.0 for name, ix in self._index[bid].items()}
                for j, bid in enumerate(self.ids)}

    def where(self, img: np.ndarray) -> dict[str, str]:
        """{block id: "start" | "inserted" | "rim" | "elsewhere"} for an aligned image (see :meth:`shares`)."""
        return {bid: place(share) for bid, share in self.shares(img).items()}

    def inserted(self, img: np.ndarray) -> list[str] | None:
        """The inserted blocks, or None when some block is neither at its start nor inserted."""
        return inserted_of(self.where(img))


def place(share: dict[str, float]) -> str:
    """A block's place from its three shares: "start", "inserted", "rim" or "elsewhere"."""
    at_start, in_hole, on_rim = (share[k] >= THRESHOLDS[k] for k in ("start", "hole", "rim"))
    if at_start and not in_hole:
        return "start"
    if in_hole and not at_start and not on_rim:
        return "inserted"
    if on_rim and not at_start:
        return "rim"
    return "elsewhere"


def inserted_of(where: dict[str, str]) -> list[str] | None:
    if any(v not in ("start", "inserted") for v in where.values()):
        return None
    return sorted(b for b, v in where.items() if v == "inserted")


# the shares that decide a block's place, and on which side of its threshold each must lie: (region, True = at or
# above)
DECIDING = {"start": (("start", True), ("hole", False)),
            "inserted": (("hole", True), ("start", False), ("rim", False))}


def margin(shares: dict[str, dict[str, float]], inserted) -> float:
    """How far the reading of a picture of a known state (every block at its start or, for those in ``inserted``,
    in its hole) lies from changing: the smallest distance of a deciding share from its region's threshold
    (``THRESHOLDS``), signed (negative: that block is misread). Every share moving by less than a positive margin
    leaves the reading right."""
    ins = set(inserted)
    out = 1.0
    for bid, share in shares.items():
        for region, high in DECIDING["inserted" if bid in ins else "start"]:
            t = THRESHOLDS[region]
            out = min(out, share[region] - t if high else t - share[region])
    return out
