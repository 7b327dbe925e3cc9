"""Image matching for Plan-k-Step-Generation: a generated picture against a reference render of a state.

The paper (LEGO-Puzzles) matches each generated image to the nearest candidate state by MSE; a real
generator's picture is never pixel-identical to a render (issue 35: re-encoded as JPEG, shifted a pixel,
resampled or brightened, every correct render failed the old RMS threshold). So both images go through the
same alignment to the fixed camera before the MSE:

1. resized to the render size (area average when shrinking, bicubic when enlarging);
2. photometric normalisation: each colour channel moved to the mean and standard deviation of an anchor render
   of the same scene (the case's initial state; a brightness or contrast change is not a change of what stands
   where, and every state's render shares the anchor's light);
3. registered to the fixed camera: moved by the whole-pixel shift (up to ``REGISTER_PX`` each way) that best
   matches it to the anchor (the board and the table fill most of the picture and do not move), searched at
   half size and refined at full size;
4. a 2x2 box low-pass to half size (JPEG blocks and resampling ringing are finer than a block's outline);
5. the smallest MSE against the reference (a render, through steps 2 and 4) over shifts of up to
   ``SHIFT_PX`` half-size pixel each way (what the registration left), over the central crop both share.

``perturb`` makes the generator-like variants the tolerance is calibrated on (:func:`genset.calibrate`).
"""

from __future__ import annotations

import io

import numpy as np

REGISTER_PX = 4  # render-size pixels each way (the whole-pixel search that starts the registration)
SHIFT_PX = 1  # half-size pixels each way, after registration
# what a generator's picture differs by from a render of the same state (:func:`perturb`): a sub-pixel offset and a
# 2 px one, a few percent of zoom either way, small rotations, blur, JPEG, delivery at twice the size, other light,
# and all of these at once
PERTURBATIONS = ("subpx", "shift2", "zoom+1", "zoom+3", "zoom-3", "rot+1", "rot-2", "blur2", "jpeg75", "resample2x",
                 "bright+10", "contrast-15", "gamma0.8", "combined")
ZOOM_MAX = 0.05  # the similarity registration's bounds: scale within 1 +- this,
ROTATION_MAX_DEG = 4.0  # rotation within +- this many degrees,
TRANSLATION_MAX_PX = 8.0  # translation within +- this many render pixels


def to_size(img, size: int) -> np.ndarray:
    """Step 1: float32 (size, size, 3) in [0, 1] from a uint8 or float image of any size."""
    from PIL import Image

    arr = np.asarray(img)
    if arr.dtype != np.uint8:
        arr = (np.clip(arr, 0.0, 1.0) * 255).round().astype(np.uint8)
    arr = arr[..., :3]
    if arr.shape[:2] != (size, size):
        im = Image.fromarray(arr)
        method = Image.BOX if im.size[0] >= size else Image.BICUBIC
        arr = np.asarray(im.resize((size, size), method))
    return arr.astype(np.float32) / np.float32(255.0)


def photometry(img: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation of an image."""
    return img.mean(axis=(0, 1)), img.std(axis=(0, 1))


def normalise(img: np.ndarray, stats: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Step 2: each channel of ``img`` moved to the mean and standard deviation ``stats`` (the anchor's)."""
    m, sd = photometry(img)
    return ((img - m) * (stats[1] / np.maximum(sd, 1e-6)) + stats[0]).astype(np.float32)


def _half(a: np.ndarray) -> np.ndarray:
    h = a.shape[0] // 2 * 2
    a = a[:h, :h]
    return 0.25 * (a[0::2, 0::2] + a[1::2, 0::2] + a[0::2, 1::2] + a[1::2, 1::2])


def _shifted(a: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """``a`` moved by (dy, dx) pixels (content goes down / right for positive values), edges repeated."""
    n = a.shape[0]
    pad = max(abs(dy), abs(dx))
    if pad == 0:
        return a
    p = np.pad(a, ((pad, pad), (pad, pad), (0, 0)), mode="edge")
    return p[pad - dy:pad - dy + n, pad - dx:pad - dx + n]


def _mse_at(g: np.ndarray, ref: np.ndarray, dy: int, dx: int, margin: int) -> float:
    """MSE of ``_shifted(g, dy, dx)`` and ``ref`` over the central crop (``margin`` >= |dy|, |dx|)."""
    n = ref.shape[0]
    win = g[margin - dy:n - margin - dy, margin - dx:n - margin - dx]
    return float(np.mean(np.square(win - ref[margin:n - margin, margin:n - margin])))


def register(img: np.ndarray, anchor: np.ndarray, max_px: int = REGISTER_PX) -> tuple[np.ndarray, tuple[int, int]]:
    """Step 3: ``img`` (normalised) and ``anchor`` are ``to_size`` images of one size: ``img`` moved by the
    whole-pixel shift that best matches the anchor (half-size search, then the full-size neighbours of its
    best), and that shift."""
    gh, ah = _half(img), _half(anchor)
    r = max_px // 2
    best_h = min((_mse_at(gh, ah, dy, dx, r + 1), (dy, dx)) for dy in range(-r, r + 1) for dx in range(-r, r + 1))[1]
    cands = {(max(-max_px, min(max_px, 2 * best_h[0] + ey)), max(-max_px, min(max_px, 2 * best_h[1] + ex)))
             for ey in (-1, 0, 1) for ex in (-1, 0, 1)}
    dy, dx = min((_mse_at(img, anchor, dy, dx, max_px + 2), (dy, dx)) for dy, dx in sorted(cands))[1]
    return _shifted(img, dy, dx), (dy, dx)


def _gray(a: np.ndarray) -> np.ndarray:
    return a.mean(axis=2, dtype=np.float64)


def _box(a: np.ndarray, f: int) -> np.ndarray:
    n = a.shape[0] // f * f
    return a[:n, :n].reshape(n // f, f, n // f, f).mean(axis=(1, 3))


def _warp(a: np.ndarray, p: np.ndarray, order: int = 1) -> np.ndarray:
    """``a`` (2-D or H x W x C) resampled at the similarity warp ``p`` = (s, r, tx, ty) of the anchor's pixel grid
    about the picture's centre: anchor pixel x reads ``a`` at (1 + s) R(r) (x - c) + c + t (edges repeated)."""
    from scipy.ndimage import map_coordinates

    n = a.shape[0]
    c = (n - 1) / 2.0
    yy, xx = np.mgrid[0:n, 0:n].astype(np.float64) - c
    sc, ca, sa = 1.0 + p[0], np.cos(p[1]), np.sin(p[1])
    xs = sc * (ca * xx - sa * yy) + c + p[2]
    ys = sc * (sa * xx + ca * yy) + c + p[3]
    if a.ndim == 2:
        return map_coordinates(a, [ys, xs], order=order, mode="nearest")
    return np.stack([map_coordinates(a[..., k], [ys, xs], order=order, mode="nearest") for k in range(a.shape[2])],
                    axis=-1).astype(a.dtype)


def register_similarity(img: np.ndarray, anchor: np.ndarray, start=(0, 0)) -> np.ndarray:
    """The similarity warp (scale, rotation, translation about the centre: ``_warp``'s ``p``) that best maps the
    anchor's pixels onto ``img`` (both normalised ``to_size`` images of one size), by Gauss-Newton on the grey
    levels from ``start`` (a whole-pixel shift (dy, dx) that moves ``img`` onto the anchor) at a quarter, half
    and full size. The board and the table fill most of the picture and do not move between states; pixels whose
    difference is far above the typical one (blocks that moved, the picture's border) get no weight, so what
    changed between the two states does not pull the fit. Bounded by ``ZOOM_MAX``, ``ROTATION_MAX_DEG`` and
    ``TRANSLATION_MAX_PX``."""
    gi, ga = _gray(img), _gray(anchor)
    n = ga.shape[0]
    p = np.array([0.0, 0.0, -float(start[1]), -float(start[0])])
    for f, iters in ((4, 12), (2, 8), (1, 4)):
        A, I = (_box(ga, f), _box(gi, f)) if f > 1 else (ga, gi)
        m = A.shape[0]
        c = (m - 1) / 2.0
        yy, xx = np.mgrid[0:m, 0:m].astype(np.float64) - c
        edge = max(2, int(0.06 * m))
        inner = np.zeros((m, m), bool)
        inner[edge:m - edge, edge:m - edge] = True
        gy_a, gx_a = np.gradient(A)
        for _ in range(iters):
            q = p.copy()
            q[2:] /= f  # the translation in this level's pixels
            W = _warp(I, q)
            gy_w, gx_w = np.gradient(W)
            gx, gy = 0.5 * (gx_a + gx_w), 0.5 * (gy_a + gy_w)  # the mean of both gradients (ESM): converges wider
            e = W - A
            mad = np.median(np.abs(e[inner])) + 1e-6
            w = inner & (np.abs(e) < 4.0 * 1.4826 * mad + 0.02)
            J = np.stack([gx * xx + gy * yy, -gx * yy + gy * xx, gx, gy], axis=-1)[w]
            H = J.T @ J
            step = np.linalg.lstsq(H + 1e-9 * np.eye(4), -J.T @ e[w], rcond=None)[0]
            step[2:] *= f
            p = p + step
            p[0] = float(np.clip(p[0], -ZOOM_MAX, ZOOM_MAX))
            p[1] = float(np.clip(p[1], -np.radians(ROTATION_MAX_DEG), np.radians(ROTATION_MAX_DEG)))
            p[2:] = np.clip(p[2:], -TRANSLATION_MAX_PX, TRANSLATION_MAX_PX)
            if abs(step[0]) < 1e-5 and abs(step[1]) < 1e-5 and np.abs(step[2:]).max() < 0.01 * f:
                break
    return p


def align(img, anchor: np.ndarray, stats=None) -> np.ndarray:
    """Steps 1-3 for a generated image: the anchor's size, its photometry (``stats``: the anchor's, computed
    when not given), registered to it: the whole-pixel shift search, then the similarity warp
    (:func:`register_similarity`: a generator's picture may be a little zoomed or turned, not only shifted); a
    full-size image (the part-level verifier reads this one)."""
    a = normalise(to_size(img, anchor.shape[0]), stats if stats is not None else photometry(anchor))
    _, shift = register(a, anchor)
    p = register_similarity(a, anchor, shift)
    return _warp(a, p).astype(np.float32)


def prepare(img, size: int) -> np.ndarray:
    """Step 4 (after steps 1-3 for a generated image, 1-2 for a reference render): a 2x2 box average."""
    return _half(to_size(img, size))


def distance(gen: np.ndarray, ref: np.ndarray, shift: int = SHIFT_PX) -> tuple[float, tuple[int, int]]:
    """Step 5: (MSE, (dy, dx)) of two ``prepare``d images at the best shift of ``gen`` within ``shift`` pixels."""
    return min((_mse_at(gen, ref, dy, dx, shift), (dy, dx)) for dy in range(-shift, shift + 1)
               for dx in range(-shift, shift + 1))


def _png_roundtrip(arr: np.ndarray, fmt: str, **kw) -> np.ndarray:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt, **kw)
    buf.seek(0)
    with Image.open(buf) as im:
        return np.asarray(im.convert("RGB"))


def similarity(img: np.ndarray, zoom: float = 0.0, rotation_deg: float = 0.0, dx: float = 0.0,
               dy: float = 0.0) -> np.ndarray:
    """A uint8 picture zoomed by ``1 + zoom`` and turned by ``rotation_deg`` about its centre and moved by (dx, dy)
    pixels (content right / down for positive values), bicubic, the border repeated (a generator draws the table
    there, not black)."""
    from PIL import Image

    n = img.shape[0]
    pad = int(np.ceil(n * (abs(zoom) + abs(np.radians(rotation_deg))))) + int(np.ceil(max(abs(dx), abs(dy)))) + 4
    big = np.pad(img, ((pad, pad), (pad, pad), (0, 0)), mode="edge")
    m = big.shape[0]
    c = (m - 1) / 2.0
    s, a = 1.0 + zoom, np.radians(rotation_deg)
    # PIL's affine maps output pixels to input pixels: the inverse of the content's motion
    ca, sa = np.cos(a) / s, np.sin(a) / s
    ox, oy = c + dx, c + dy
    coeffs = (ca, sa, c - ca * ox - sa * oy, -sa, ca, c + sa * ox - ca * oy)
    out = Image.fromarray(big).transform((m, m), Image.AFFINE, coeffs, resample=Image.BICUBIC)
    return np.asarray(out)[pad:pad + n, pad:pad + n]


def _tone(img: np.ndarray, gain: float = 1.0, contrast: float = 1.0, gamma: float = 1.0) -> np.ndarray:
    x = img.astype(np.float64) / 255.0
    x = np.power(x, gamma)
    x = (x - 0.5) * contrast + 0.5
    return np.clip(np.round(x * gain * 255.0), 0, 255).astype(np.uint8)


def perturb(img: np.ndarray, kind: str) -> np.ndarray:
    """A uint8 render as a generator might return it: ``subpx`` (content moved half a pixel right and down),
    ``shift2`` (2 px right, 1 px up), ``zoom+1`` / ``zoom+3`` / ``zoom-3`` (1% and 3% larger, 3% smaller, about
    the centre), ``rot+1`` / ``rot-2`` (turned 1 degree one way, 2 the other), ``blur2`` (Gaussian, radius 2),
    ``jpeg75`` (re-encoded at quality 75), ``resample2x`` (delivered at twice the size, bicubic), ``bright+10`` (10%
    brighter), ``contrast-15`` (15% less contrast), ``gamma0.8`` (gamma 0.8: shadows lifted), ``combined`` (half a
    pixel, 2% larger, 1 degree, radius 1 blur, 5% darker, JPEG 75 at once)."""
    from PIL import Image, ImageFilter

    img = np.asarray(img, dtype=np.uint8)
    n = img.shape[0]
    if kind == "subpx":
        return similarity(img, dx=0.5, dy=0.5)
    if kind == "shift2":
        return similarity(img, dx=2.0, dy=-1.0)
    if kind in ("zoom+1", "zoom+3", "zoom-3"):
        return similarity(img, zoom=float(kind[4:]) / 100.0)
    if kind in ("rot+1", "rot-2"):
        return similarity(img, rotation_deg=float(kind[3:]))
    if kind == "blur2":
        return np.asarray(Image.fromarray(img).filter(ImageFilter.GaussianBlur(2)))
    if kind == "jpeg75":
        return _png_roundtrip(img, "JPEG", quality=75)
    if kind == "resample2x":
        return np.asarray(Image.fromarray(img).resize((2 * n, 2 * n), Image.BICUBIC))
    if kind == "bright+10":
        return _tone(img, gain=1.10)
    if kind == "contrast-15":
        return _tone(img, contrast=0.85)
    if kind == "gamma0.8":
        return _tone(img, gamma=0.8)
    if kind == "combined":
        out = similarity(img, zoom=0.02, rotation_deg=1.0, dx=0.5, dy=0.5)
        out = np.asarray(Image.fromarray(out).filter(ImageFilter.GaussianBlur(1)))
        return _png_roundtrip(_tone(out, gain=0.95), "JPEG", quality=75)
    raise ValueError(f"unknown perturbation {kind!r}; valid: {', '.join(PERTURBATIONS)}")
