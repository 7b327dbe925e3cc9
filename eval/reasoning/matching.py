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

REGISTER_PX = 4  # render-size pixels each way
SHIFT_PX = 1  # half-size pixels each way, after registration
PERTURBATIONS = ("jpeg85", "shift1", "resample2x", "down2x", "bright+3", "bright-3")


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


def align(img, anchor: np.ndarray, stats=None) -> np.ndarray:
    """Steps 1-3 for a generated image: the anchor's size, its photometry (``stats``: the anchor's, computed
    when not given), registered to it; a full-size image (the part-level verifier reads this one)."""
    a = to_size(img, anchor.shape[0])
    return register(normalise(a, stats if stats is not None else photometry(anchor)), anchor)[0]


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


def perturb(img: np.ndarray, kind: str) -> np.ndarray:
    """A uint8 render as a generator might return it: ``jpeg85`` (re-encoded, quality 85), ``shift1`` (content
    moved 1 px right and down, the edge repeated), ``resample2x`` (delivered at twice the size, bicubic),
    ``down2x`` (shrunk to half and enlarged back, bicubic), ``bright+3`` / ``bright-3`` (3% brighter / darker)."""
    from PIL import Image

    img = np.asarray(img, dtype=np.uint8)
    if kind == "jpeg85":
        return _png_roundtrip(img, "JPEG", quality=85)
    if kind == "shift1":
        return np.pad(img, ((1, 0), (1, 0), (0, 0)), mode="edge")[:-1, :-1]
    n = img.shape[0]
    if kind == "resample2x":
        return np.asarray(Image.fromarray(img).resize((2 * n, 2 * n), Image.BICUBIC))
    if kind == "down2x":
        small = Image.fromarray(img).resize((n // 2, n // 2), Image.BICUBIC)
        return np.asarray(small.resize((n, n), Image.BICUBIC))
    if kind in ("bright+3", "bright-3"):
        gain = 1.03 if kind == "bright+3" else 0.97
        return np.clip(np.round(img.astype(np.float64) * gain), 0, 255).astype(np.uint8)
    raise ValueError(f"unknown perturbation {kind!r}; valid: {', '.join(PERTURBATIONS)}")
