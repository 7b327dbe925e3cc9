"""Plan-k-Step-Generation set: the model draws the k intermediate states itself; scored per turn.

A case (k = 2..5, 20 per k by default) gives the initial and the target state (k + 1 moves apart,
with real ordering constraints inside the target) and asks for k images, the states after moves
1..k. The set stores, for every step i, every *valid* state (each set of i target blocks on some
legal path, :func:`planning.ideals`: every legal order, not only the reference one) as a reference
render, and for calibration every *invalid* state of that step: the other i-block subsets of the
target (a block moved while another still rests on it) and one drawn distractor of each kind per
reference step (wrong hole, wrong yaw on the rim, extra block, ...).

Scoring (:func:`score_images`) is by what the pictures show: each generated image is aligned to the fixed camera
(:func:`matching.align`: resized, photometry matched, a whole-pixel shift, then a similarity warp, since a generator's
picture may be a little zoomed, turned or offset by a fraction of a pixel) and read part by part
(:mod:`assembly_probe.partread`: each block at its start, in its hole, on the rim or elsewhere). The case scores 1
when every block is at its start or in its hole in every image and the inserted sets form a legal path
(:func:`planning.legal_path`, any order the constraints allow), else 0. Beside it, the paper's matcher as a
diagnostic: each image matched to the nearest valid state of its step by MSE after the same alignment, within a
calibrated tolerance, then the same path check; every report says how often the two agree. The MSE depends on
the renderer's pixels, which no generator reproduces (issue 47: a correct picture moved half a pixel, zoomed 1%,
turned 1 degree or blurred scored 0 of 30 under it).

The reading is calibrated on the set (:func:`calibrate`, :data:`SAMPLE_RULE`): valid renders and invalid renders,
clean and under the changes a generator makes (``matching.PERTURBATIONS``: half a pixel and 2 px offsets, 1-3%
zoom either way, 1-2 degree rotations, blur, JPEG q75, twice the size, brighter, less contrast, gamma, all at once);
the manifest records per change how many correct renders were read as their own state and how many wrong ones were
rejected, per case the same for the reference order, and the separation margin: the smallest distance of any
deciding share from the reading's threshold over every image whose state is known block by block
(:func:`partread.margin`). The MSE tolerance is calibrated on the same images (the geometric mean of the largest
correct and the smallest wrong distance when apart, else the fewest errors).

``generate-answers`` writes answer folders: the reference renders (``oracle``, optionally perturbed), the same
with an invalid state at one turn (``wrong``), or a model's images from an OpenAI-compatible chat endpoint
(``http``; :mod:`assembly_probe.gendriver`: multi-turn, each turn seeing the model's own previous image, as in
the paper, or single-shot, all k images from one request).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from assembly_probe import matching as M
from assembly_probe import partread as PR
from assembly_probe import planning as P
from assembly_probe import scene as S
from assembly_probe.build import MANIFEST_FILE, _png_bytes, files_sha256, read_set, set_sha256

CASES_FILE = "cases.jsonl"
RUN_FILE = "run.json"  # in an answers folder: how its images were made (written by the http driver)
KS = (2, 3, 4, 5)
CAMERA = "plan"
STEP_FILE = "step{}.png"  # answers: DIR/<case id>/step1.png .. step<k>.png


class GenError(RuntimeError):
    """Bad input (no set, bad answers folder): one line from the CLI."""


def gen_prompt(k: int) -> str:
    return ("Image 'Initial' shows the start and image 'Target' the goal. One move takes a block that has nothing "
            "resting on it and drops it into its matching hole of the board (it falls through and stands on the "
            f"table). Reaching the target takes {k + 1} moves. Draw {k} images, from the same camera as the "
            f"inputs: the states after moves 1 to {k} of a legal plan.")


def make_case(rng: np.random.Generator, k: int) -> dict:
    """A domain, a k+1-move target with a constraint inside it, and the step states (no pixels)."""
    for _ in range(100):
        n = min(9, k + 1 + int(rng.integers(0, 3)))
        dom = P.make_domain(rng, n)
        order = P.random_order(dom, rng)[: k + 1]
        target = set(order)
        if len(order) == k + 1 and any(u in target and v in target for u, v in P.edges(dom)):
            break
    else:
        raise RuntimeError("could not draw a constrained plan")
    ideals = set(P.ideals(dom, target))
    valid = {i: sorted(sorted(s) for s in ideals if len(s) == i) for i in range(1, k + 1)}
    invalid: dict[int, list[dict]] = {i: [] for i in range(1, k + 1)}
    seen = set()
    for i in range(1, k + 1):
        for combo in _subsets(sorted(target), i):
            if frozenset(combo) not in ideals:
                st = P.state_of(dom, combo)
                seen.add(S.canonical(st))
                invalid[i].append({"kind": "precedence_subset", "inserted": list(combo), "state": st})
    steps = [(order[: i - 1], order[i - 1]) for i in range(1, k + 1)]
    avoid = {S.canonical(P.state_of(dom, s)) for s in ideals}  # each state's key computed once (hashing is slow)
    for kind in P.DISTRACTOR_KINDS:
        for i, (prev, move) in enumerate(steps, start=1):
            st = P.distractor(dom, kind, set(prev), move, target, rng)
            if st is None or P.valid_toward(dom, st, target):
                continue
            key = S.canonical(st)
            if key in seen or key in avoid:
                continue
            seen.add(key)
            invalid[i].append({"kind": kind, "inserted": None, "state": st})
    return {"k": k, "prompt": gen_prompt(k),
            "images": [{"label": "Initial", "role": "initial", "state": P.state_of(dom, ()), "camera": CAMERA},
                       {"label": "Target", "role": "target", "state": P.state_of(dom, target), "camera": CAMERA}],
            "valid": {str(i): [{"inserted": s, "state": P.state_of(dom, s)} for s in valid[i]] for i in valid},
            "invalid": {str(i): v for i, v in invalid.items()},
            "meta": {"domain": dom, "target": sorted(target), "reference_order": order, "edges": P.edges(dom)}}


def _subsets(xs, r):
    import itertools

    return [list(c) for c in itertools.combinations(xs, r)]


def generate_cases(seed=0, ks=KS, per_k=20) -> list[dict]:
    cases = []
    for k in ks:
        for i in range(per_k):
            case = make_case(np.random.default_rng([seed, 200 + k, i]), k)
            case["id"] = f"gen-k{k}-{i:02d}"
            cases.append(case)
    return cases


def _all_refs(case):
    yield from case["images"]
    for group in ("valid", "invalid"):
        for refs in case[group].values():
            yield from refs


def _cases_with_paths(seed, ks, per_k, size) -> tuple[list[dict], dict[str, dict]]:
    """The cases with every reference's image file named, and {path: state} of the distinct images."""
    cases = generate_cases(seed, ks, per_k)
    todo: dict[str, dict] = {}
    for case in cases:
        for ref in _all_refs(case):
            ref["path"] = f"img/{S.image_key(ref['state'], CAMERA, size)}.png"
            todo.setdefault(ref["path"], ref["state"])
    return cases, todo


def _cases_jsonl(cases) -> bytes:
    return "".join(json.dumps(c, sort_keys=True) + "\n" for c in cases).encode()


def states_sha256(seed=0, ks=KS, per_k=20, size=S.IMAGE_SIZE) -> str:
    """``sha256_states`` of the set ``build`` would write, without rendering: the machine-independent hash."""
    return hashlib.sha256(_cases_jsonl(_cases_with_paths(seed, ks, per_k, size)[0])).hexdigest()


def build(out, seed=0, ks=KS, per_k=20, size=S.IMAGE_SIZE, progress=True, renderer=None) -> dict:
    """Cases, reference renders (valid and invalid states), calibration and a manifest: the set's identity
    (``sha256_states``), the images' hash and each file's (``files``)."""
    from tqdm import tqdm

    t0 = time.monotonic()
    out = Path(out)
    (out / "img").mkdir(parents=True, exist_ok=True)
    cases, todo = _cases_with_paths(seed, ks, per_k, size)
    renderer = renderer or S.Renderer(size=size)
    images: dict[str, bytes] = {}
    for path in tqdm(sorted(todo), desc="rendering", unit="img", disable=not progress):
        images[path] = _png_bytes(renderer.render(todo[path], CAMERA))
        tmp = out / (path + ".tmp")
        tmp.write_bytes(images[path])
        os.replace(tmp, out / path)
    for stale in (out / "img").glob("*.png"):
        if f"img/{stale.name}" not in images:
            stale.unlink()
    jsonl = _cases_jsonl(cases)
    (out / CASES_FILE).write_bytes(jsonl)
    t1 = time.monotonic()
    cal = calibrate(cases, out, size, progress=progress)
    cal["calibrate_s"] = round(time.monotonic() - t1, 2)
    counts = {f"k{k}": sum(c["k"] == k for c in cases) for k in ks}
    # the set's identity is its states (the renderer's pixels differ a little between machines); the images' hash
    # and each file's are published beside it
    manifest = {"sha256_states": hashlib.sha256(jsonl).hexdigest(), "sha256_images": set_sha256(jsonl, images),
                "seed": seed, "ks": list(ks), "per_k": per_k, "image_size": size, "camera": CAMERA,
                "n_cases": len(cases), "n_images": len(images), "counts": counts, "calibration": cal,
                "n_valid_refs": sum(len(v) for c in cases for v in c["valid"].values()),
                "n_invalid_refs": sum(len(v) for c in cases for v in c["invalid"].values()),
                "build_s": round(time.monotonic() - t0, 2),
                "files": files_sha256(CASES_FILE, jsonl, images)}  # what a run checks first (verify_files)
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _load_img(path: Path, size: int) -> np.ndarray:
    """An image file as a ``matching.to_size`` array; GenError when it cannot be read."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return M.to_size(np.asarray(im.convert("RGB")), size)
    except (UnidentifiedImageError, OSError) as e:
        raise GenError(f"cannot read image {path}: {e}") from None


def _load_uint8(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


class CaseRefs:
    """What scoring one case needs, prepared once: the anchor (its initial render, for registration), every
    valid state of every step (prepared for matching) and the part-level reader. Images are ``to_size``
    arrays; ``valid`` is {step: [(inserted ids, image), ...]}."""

    def __init__(self, case: dict, anchor: np.ndarray, target_img: np.ndarray, valid: dict):
        self.case, self.k = case, case["k"]
        self.dom, self.target = case["meta"]["domain"], set(case["meta"]["target"])
        self.anchor, self.stats = anchor, M.photometry(anchor)
        self.size = anchor.shape[0]
        # references through the same photometric step as a generated image: a render and its perturbed copy
        # then differ by the perturbation alone
        self.valid = {int(i): [(list(ins), M.prepare(M.normalise(img, self.stats), self.size)) for ins, img in refs]
                      for i, refs in valid.items()}
        self.reader = PR.Reader(self.dom, self.target, anchor, target_img)

    @classmethod
    def from_files(cls, case: dict, data_dir, size: int) -> "CaseRefs":
        d = Path(data_dir)
        valid = {int(i): [(v["inserted"], _load_img(d / v["path"], size)) for v in vs] for i, vs in case["valid"].items()}
        return cls(case, _load_img(d / case["images"][0]["path"], size), _load_img(d / case["images"][1]["path"], size),
                   valid)

    def match(self, img: np.ndarray, step: int) -> tuple[float, list, np.ndarray]:
        """(MSE to the nearest valid state of ``step``, that state's inserted ids, the aligned image)."""
        reg = M.align(img, self.anchor, self.stats)
        g = M.prepare(reg, self.size)
        d, ins = min((M.distance(g, ref)[0], ins) for ins, ref in self.valid[step])
        return d, ins, reg


def score_images(refs: CaseRefs, images: list[np.ndarray], tolerance: float) -> dict:
    """The case's score, by what the pictures show: the part-level reading (:mod:`assembly_probe.partread`) of
    every image, after alignment to the fixed camera, gives each block's place; the case scores 1 when every block
    is at its start or in its hole in every image and the inserted sets form a legal path to the target
    (``accepted``). Beside it, the diagnostic the paper uses: the MSE to the nearest valid state of each step within
    ``tolerance`` and the matched states a legal path (``mse_accepted``), and whether the two verdicts agree."""
    k = refs.k
    if len(images) != k:
        why = f"expected {k} images, got {len(images)}"
        return {"accepted": False, "reason": why, "read": [], "where": [], "mse": [], "mse_matched": [],
                "mse_accepted": False, "mse_reason": why, "agree": True}
    matched, dists, read, where, mse_reason = [], [], [], [], None
    for i, img in enumerate(images, start=1):
        d, ins, reg = refs.match(img, i)
        dists.append(d)
        w = refs.reader.where(reg)
        where.append(w)
        read.append(PR.inserted_of(w))
        if d <= tolerance:
            matched.append(ins)
        elif mse_reason is None:
            mse_reason = f"step {i}: no valid state within MSE {tolerance:.3g} (nearest {d:.3g})"
    mse_ok = False
    if mse_reason is None:
        mse_ok, mse_reason = P.legal_path(refs.dom, refs.target, matched)
    bad = next((i for i, r in enumerate(read, start=1) if r is None), None)
    if bad is not None:
        odd = sorted(f"{b} {v}" for b, v in where[bad - 1].items() if v not in ("start", "inserted"))
        ok, reason = False, f"step {bad}: a block is neither at its start nor in its hole ({', '.join(odd)})"
    else:
        ok, reason = P.legal_path(refs.dom, refs.target, read)
    return {"accepted": bool(ok), "reason": reason, "read": read, "where": where, "mse": dists,
            "mse_matched": matched, "mse_accepted": bool(mse_ok), "mse_reason": mse_reason,
            "agree": bool(ok) == bool(mse_ok)}


def _tolerance(correct: list[float], wrong: list[float]) -> tuple[float, bool]:
    """The geometric mean of the largest correct and the smallest wrong distance when they are apart; else the
    midpoint between neighbouring values with the fewest errors (correct rejected plus wrong accepted)."""
    c_max, w_min = max(correct), min(wrong)
    if c_max < w_min:
        return float(np.sqrt(c_max * w_min)) if c_max > 0 else w_min / 2, True
    cs, ws = np.sort(correct), np.sort(wrong)
    cands = np.unique(np.concatenate([cs, ws]))
    errors = [(np.sum(cs > t) + np.sum(ws <= t), t) for t in cands]
    return float(min(errors)[1]), False


CLEAN = "clean"  # a calibration image as rendered
SAMPLE_RULE = ("every valid render of the reference order's states under every change and clean; every other valid "
               "render and every invalid render clean and under one change, the changes taken in turn")


def calibration_kinds(case_index: int, n_refs_before: int, on_reference: bool) -> list[str]:
    """The changes a calibration image is matched under (:data:`SAMPLE_RULE`): all of them for a state of the
    reference order, else ``clean`` and one change in turn (by the image's place in the set)."""
    if on_reference:
        return [CLEAN, *M.PERTURBATIONS]
    return [CLEAN, M.PERTURBATIONS[(case_index + n_refs_before) % len(M.PERTURBATIONS)]]


def _variant(raw: np.ndarray, kind: str, size: int) -> np.ndarray:
    return M.to_size(raw if kind == CLEAN else M.perturb(raw, kind), size)


def _kind_rows(rows, population: str, kind: str):
    return [r for r in rows if r["population"] == population and r["kind"] == kind]


def _reading_summary(rows, case_rows) -> dict:
    """The part-level reading over the calibration rows: per change, correct renders read as their own state and
    wrong renders not read as a valid state of their step; the separation margin (:func:`partread.margin`) over
    every image whose state is known block by block; per change, the cases of the reference order read as a legal
    path, and the cases with one wrong turn rejected."""
    kinds = [CLEAN, *M.PERTURBATIONS]
    correct = [r for r in rows if r["population"] == "correct"]
    known = [r for r in rows if r["margin"] is not None]
    low = min(known, key=lambda r: r["margin"])
    c_low = min(correct, key=lambda r: r["margin"])
    w_known = [r for r in rows if r["population"] == "wrong" and r["margin"] is not None]
    out = {"share_threshold": PR.SHARE, "thresholds": dict(PR.THRESHOLDS),
           "separation_margin": low["margin"],
           "separation_margin_at": {k: low[k] for k in ("population", "case", "step", "kind", "variant", "state")},
           "correct_min_margin": c_low["margin"],
           "wrong_known_min_margin": min(r["margin"] for r in w_known) if w_known else None,
           "correct": {}, "wrong": {}, "wrong_by_state_kind": {}, "cases": {}}
    for kind in kinds:
        rs = _kind_rows(rows, "correct", kind)
        if rs:
            out["correct"][kind] = {"images": len(rs), "read_right": sum(r["read"] == r["state"] for r in rs),
                                    "min_margin": min(r["margin"] for r in rs)}
        ws = _kind_rows(rows, "wrong", kind)
        if ws:
            out["wrong"][kind] = {"images": len(ws), "rejected": sum(not r["read_valid"] for r in ws)}
    for r in rows:
        if r["population"] == "wrong":
            e = out["wrong_by_state_kind"].setdefault(r["state_kind"], {"images": 0, "rejected": 0})
            e["images"] += 1
            e["rejected"] += not r["read_valid"]
    for kind in kinds + ["wrong_turn"]:
        cs = [c for c in case_rows if c["kind"] == kind]
        if cs:
            out["cases"][kind] = {"cases": len(cs), "accepted": sum(c["read_accepted"] for c in cs),
                                  "mse_accepted": None}
    out["correct_read_right"] = sum(r["read"] == r["state"] for r in correct)
    out["correct_images"] = len(correct)
    wrong = [r for r in rows if r["population"] == "wrong"]
    out["wrong_rejected"] = sum(not r["read_valid"] for r in wrong)
    out["wrong_images"] = len(wrong)
    return out


def _mse_summary(rows, case_rows) -> dict:
    """The MSE matcher (the paper's score, a diagnostic here): its tolerance from the two populations, where they
    come nearest, the rates at the tolerance, and a tolerance taken from the even cases tried on the odd ones."""
    correct = [r for r in rows if r["population"] == "correct"]
    wrong = [r for r in rows if r["population"] == "wrong"]
    tol, separated = _tolerance([r["mse"] for r in correct], [r["mse"] for r in wrong])
    c_top = max(correct, key=lambda r: r["mse"])
    w_low = min(wrong, key=lambda r: r["mse"])
    even = [r for r in rows if r["half"] == 0]
    tol_even, _ = _tolerance([r["mse"] for r in even if r["population"] == "correct"] or [0.0],
                             [r["mse"] for r in even if r["population"] == "wrong"] or [1.0])

    def rates(rs, t):
        out = {}
        for kind in [CLEAN, *M.PERTURBATIONS]:
            c = _kind_rows(rs, "correct", kind)
            w = _kind_rows(rs, "wrong", kind)
            out[kind] = {"correct_images": len(c), "correct_accepted": sum(r["mse"] <= t and r["nearest"] == r["state"]
                                                                           for r in c),
                         "wrong_images": len(w), "wrong_rejected": sum(r["mse"] > t for r in w)}
        return out

    def case_rates(cs, t):
        out = {}
        for kind in [CLEAN, *M.PERTURBATIONS, "wrong_turn"]:
            rs = [c for c in cs if c["kind"] == kind]
            if rs:
                out[kind] = {"cases": len(rs), "accepted": sum(all(d <= t for d in c["mse"]) and c["legal_if_matched"]
                                                               for c in rs)}
        return out

    return {"metric": "MSE over rgb in [0, 1] after alignment (matching.py: resized, per-channel mean/std matched, "
                      "registered to the initial render by a similarity warp, 2x2 low-pass, best shift)",
            "tolerance_mse": tol, "separated": separated,
            "correct_max_mse": c_top["mse"], "correct_max_at": {k: c_top[k] for k in ("case", "step", "kind", "state")},
            "wrong_min_mse": w_low["mse"], "wrong_min_at": {k: w_low[k] for k in ("case", "step", "kind", "state")},
            "separation_ratio": w_low["mse"] / c_top["mse"] if c_top["mse"] > 0 else None,
            "images": rates(rows, tol), "cases": case_rates(case_rows, tol),
            "held_out": {"tolerance_mse_from_even_cases": tol_even,
                         "odd_cases": case_rates([c for c in case_rows if c["half"] == 1], tol_even)}}


def calibrate(cases, data_dir, size: int, progress: bool = False) -> dict:
    """Read (part level) and match (MSE) the calibration images (:data:`SAMPLE_RULE`) against the valid states of
    their step; the reading's rates and separation margin, the MSE tolerance, and how often the two agree."""
    from tqdm import tqdm

    data_dir = Path(data_dir)
    rows, case_rows = [], []
    for ci, case in enumerate(tqdm(cases, desc="calibrating", unit="case", disable=not progress)):
        refs = CaseRefs.from_files(case, data_dir, size)
        valid_sets = {int(i): [v["inserted"] for v in vs] for i, vs in case["valid"].items()}
        ref_order = case["meta"]["reference_order"]
        ref_sets = [sorted(ref_order[:j]) for j in range(1, case["k"] + 1)]
        per_step: dict = {}  # (step, kind) -> row of the reference order's state
        n_refs = 0

        def row_of(population, kind, step, raw, state, state_kind, variant):
            d, ins, reg = refs.match(_variant(raw, kind, size), step)
            shares = refs.reader.shares(reg)
            got = PR.inserted_of({b: PR.place(sh) for b, sh in shares.items()})
            return {"population": population, "kind": kind, "case": case["id"], "half": ci % 2, "step": step,
                    "state": state, "state_kind": state_kind, "variant": variant, "mse": d, "nearest": ins,
                    "read": got, "read_valid": got in valid_sets[step],
                    "margin": PR.margin(shares, state) if state is not None else None}

        for step in range(1, case["k"] + 1):
            for v in case["valid"][str(step)]:
                raw = _load_uint8(data_dir / v["path"])
                on_ref = v["inserted"] == ref_sets[step - 1]
                for kind in calibration_kinds(ci, n_refs, on_ref):
                    row = row_of("correct", kind, step, raw, v["inserted"], "valid", v["path"])
                    rows.append(row)
                    if on_ref:
                        per_step[(step, kind)] = row
                n_refs += 1
            for u in case["invalid"][str(step)]:
                raw = _load_uint8(data_dir / u["path"])
                for kind in calibration_kinds(ci, n_refs, False):
                    row = row_of("wrong", kind, step, raw, u["inserted"], u["kind"], u["path"])
                    rows.append(row)
                    # the reference order with this turn wrong (its other turns the clean reference renders, read
                    # and matched as their own state)
                    matched, read = list(ref_sets), list(ref_sets)
                    matched[step - 1], read[step - 1] = row["nearest"], row["read"]
                    case_rows.append({"kind": "wrong_turn", "case": case["id"], "half": ci % 2,
                                      "mse": [0.0 if j != step - 1 else row["mse"] for j in range(case["k"])],
                                      "legal_if_matched": P.legal_path(refs.dom, refs.target, matched)[0],
                                      "read_accepted": row["read"] is not None
                                      and P.legal_path(refs.dom, refs.target, read)[0]})
                n_refs += 1
        for kind in [CLEAN, *M.PERTURBATIONS]:
            steps = [per_step[(j, kind)] for j in range(1, case["k"] + 1)]
            reads = [r["read"] for r in steps]
            case_rows.append({"kind": kind, "case": case["id"], "half": ci % 2, "mse": [r["mse"] for r in steps],
                              "legal_if_matched": P.legal_path(refs.dom, refs.target, [r["nearest"] for r in steps])[0],
                              "read_accepted": all(r is not None for r in reads)
                              and P.legal_path(refs.dom, refs.target, reads)[0]})
    mse = _mse_summary(rows, case_rows)
    reading = _reading_summary(rows, case_rows)
    for kind, c in reading["cases"].items():
        c["mse_accepted"] = mse["cases"][kind]["accepted"]
    tol = mse["tolerance_mse"]
    agree = sum((r["nearest"] if r["mse"] <= tol else None) == (r["read"] if r["read_valid"] else None) for r in rows)
    return {"method": "part-level reading (partread.py) of each picture after alignment to the fixed camera "
                      "(matching.align: whole-pixel shift, then a similarity warp); a case scores 1 when every block "
                      "is at its start or in its hole in every picture and the inserted sets form a legal path",
            "perturbations": list(M.PERTURBATIONS), "sample": SAMPLE_RULE, "images": len(rows),
            "register_px": M.REGISTER_PX, "shift_px": M.SHIFT_PX,
            "reading": reading, "mse": mse,
            "agreement": {"images": len(rows), "agree": agree, "rate": agree / len(rows)}}


def recalibrate(data, progress: bool = True) -> dict:
    """Calibrate a built set again (the renders as they are) and rewrite its manifest's calibration."""
    cases, manifest = load(data)
    t1 = time.monotonic()
    cal = calibrate(cases, data, manifest["image_size"], progress=progress)
    cal["calibrate_s"] = round(time.monotonic() - t1, 2)
    manifest["calibration"] = cal
    (Path(data) / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def rebuild_command(data, manifest: dict) -> str:
    """The ``generate-build`` command line that makes the set the manifest describes."""
    parts = ["python -m assembly_probe generate-build", f"--out {data}"]
    try:
        if manifest.get("seed", 0) != 0:
            parts.append(f"--seed {int(manifest['seed'])}")
        ks = [int(k) for k in manifest.get("ks", KS)]
        if ks != list(KS):
            parts.append(f"--ks {','.join(map(str, ks))}")
        if manifest.get("per_k", 20) != 20:
            parts.append(f"--per-k {int(manifest['per_k'])}")
        if manifest.get("image_size", S.IMAGE_SIZE) != S.IMAGE_SIZE:
            parts.append(f"--size {int(manifest['image_size'])}")
    except (TypeError, ValueError, AttributeError):  # a manifest edited by hand: the plain command
        return f"python -m assembly_probe generate-build --out {data}"
    return " ".join(parts)


def load(data) -> tuple[list[dict], dict]:
    """The cases and the manifest of a built set, every file checked against the manifest (GenError)."""
    return read_set(data, CASES_FILE, "python -m assembly_probe generate-build", GenError, rebuild=rebuild_command)


def read_answers(answers, case, size) -> list[np.ndarray] | str:
    """The k step images of a case from ``answers/<id>/``, or the reason they cannot be read."""
    folder = Path(answers) / case["id"]
    if not folder.is_dir():
        return "no folder for this case"
    out = []
    for i in range(1, case["k"] + 1):
        f = folder / STEP_FILE.format(i)
        if not f.is_file():
            return f"missing {STEP_FILE.format(i)}"
        try:
            out.append(_load_img(f, size))
        except GenError as e:
            return str(e)
    return out


def read_run(answers) -> dict:
    """How an answers folder was made: its run.json (the http driver writes one), else 'files'."""
    f = Path(answers) / RUN_FILE
    if not f.is_file():
        return {"protocol": "files", "note": "images written by another program (no run.json)"}
    try:
        return json.loads(f.read_text())
    except ValueError:
        raise GenError(f"{f} is not JSON: remove it or rerun generate-answers") from None


def score_answers(data, answers, progress=False) -> tuple[list[dict], dict]:
    from tqdm import tqdm

    cases, manifest = load(data)
    if not Path(answers).is_dir():
        raise GenError(f"--answers {answers} is not a folder (expected {answers}/<case id>/step1.png ...)")
    known = {c["id"] for c in cases}
    strays = sorted(p.name for p in Path(answers).iterdir() if p.is_dir() and p.name not in known)
    if strays and not any((Path(answers) / c["id"]).is_dir() for c in cases):
        raise GenError(f"no folder in {answers} is named after a case of this set (found {strays[0]!r}, "
                       f"expected e.g. {cases[0]['id']!r})")
    if "reading" not in manifest.get("calibration", {}):
        raise GenError(f"{data}/{MANIFEST_FILE} has no calibration of the part-level reading (an older set): rebuild "
                       f"it with: {rebuild_command(data, manifest)}")
    tol = manifest["calibration"]["mse"]["tolerance_mse"]
    size = manifest["image_size"]
    records = []
    for case in tqdm(cases, desc="scoring", unit="case", disable=not progress):
        imgs = read_answers(answers, case, size)
        if isinstance(imgs, str):
            res = {"accepted": False, "reason": imgs, "read": [], "where": [], "mse": [], "mse_matched": [],
                   "mse_accepted": False, "mse_reason": imgs, "agree": True}
        else:
            res = score_images(CaseRefs.from_files(case, data, size), imgs, tol)
        records.append({"id": case["id"], "k": case["k"], "score": int(res["accepted"]), **res})
    return records, manifest


def _reason_key(reason: str) -> str:
    return reason.split(":")[0] if reason.startswith("step") else reason


def summarize(records, manifest, answerer: str, run: dict | None = None) -> dict:
    from binomial_stats import wilson

    per_k = {}
    for k in sorted({r["k"] for r in records}):
        rs = [r for r in records if r["k"] == k]
        hit = sum(r["score"] for r in rs)
        iv = wilson(hit, len(rs))
        per_k[f"k{k}"] = {"n": len(rs), "success": hit, "rate": hit / len(rs), "ci": [iv.low, iv.high],
                          "mse_success": sum(r["mse_accepted"] for r in rs), "agree": sum(r["agree"] for r in rs)}
    reasons: dict[str, int] = {}
    for r in records:
        if not r["accepted"]:
            key = _reason_key(r["reason"])
            reasons[key] = reasons.get(key, 0) + 1
    n, hit = len(records), sum(r["score"] for r in records)
    iv = wilson(hit, n) if n else None
    return {"answerer": answerer, "set_sha256_states": manifest.get("sha256_states"), "n_cases": n,
            "protocol": (run or {}).get("protocol", "files"), "run": run or {"protocol": "files"},
            "success": hit, "rate": hit / n if n else None, "ci": [iv.low, iv.high] if iv else None,
            "mse_success": sum(r["mse_accepted"] for r in records),
            "agree": sum(r["agree"] for r in records), "per_k": per_k, "calibration": manifest["calibration"],
            "failure_reasons": reasons}


PROTOCOLS = {
    "multi-turn": "multi-turn (the paper's protocol): each turn asks for the next state and sees the model's own "
                  "previous image",
    "single-shot": "single-shot: one request, all k images from one reply",
    "files": "images written by another program (no run.json in the answers folder)",
}


def write_report(records, manifest, answerer, out, run: dict | None = None) -> dict:
    from assembly_probe import caveats

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    s = summarize(records, manifest, answerer, run)
    (out / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    (out / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    cal = s["calibration"]
    rd, mse = cal["reading"], cal["mse"]
    at = rd["separation_margin_at"]
    ci = s["ci"] or [float("nan")] * 2
    lines = [f"# Plan-k-Step-Generation: `{answerer}`", "",
             f"Set sha256_states `{s['set_sha256_states']}`; {s['n_cases']} cases; {s['success']} accepted "
             f"({100 * (s['rate'] or 0):.1f}%, 95% Wilson {100 * ci[0]:.1f}% - {100 * ci[1]:.1f}%). Protocol: "
             f"{PROTOCOLS.get(s['protocol'], s['protocol'])}.", "",
             "Scored by what the pictures show: each generated image is aligned to the fixed camera (shift, then a "
             "similarity warp: a little zoom or rotation is no error) and read part by part (each block's colour in "
             "the regions the known geometry gives: at its start, in its hole, on the hole's rim). A case scores 1 "
             "when every block is at its start or in its hole in every image and the inserted sets form a legal "
             "path to the target (any order the constraints allow), else 0.", "",
             f"Calibrated on the set ({cal['images']} images: {cal['sample']}), under {', '.join(cal['perturbations'])}: "
             f"correct renders read as their own state {rd['correct_read_right']}/{rd['correct_images']}, wrong-state "
             f"renders rejected {rd['wrong_rejected']}/{rd['wrong_images']}; separation margin "
             f"{rd['separation_margin']:.3f} (every deciding share at least this far from its region's threshold: "
             f"{', '.join(f'{k} {v:g}' for k, v in rd['thresholds'].items())}; nearest: {at['population']} "
             f"{at['case']} step {at['step']} under {at['kind']}).", "",
             "| k | n | success | rate | 95% Wilson CI | MSE matcher (diagnostic) | agree |",
             "|---|---|---|---|---|---|---|"]
    for k, r in s["per_k"].items():
        lines.append(f"| {k[1:]} | {r['n']} | {r['success']} | {100 * r['rate']:.1f}% | "
                     f"{100 * r['ci'][0]:.1f}% - {100 * r['ci'][1]:.1f}% | {r['mse_success']} | {r['agree']} |")
    lines += ["", f"Diagnostic, the paper's matcher: the MSE to the nearest valid state of each step within "
              f"{mse['tolerance_mse']:.3g} (calibrated: perturbed correct renders reach {mse['correct_max_mse']:.3g} "
              f"under {mse['correct_max_at']['kind']}, wrong-state renders come to {mse['wrong_min_mse']:.3g}"
              + (", apart" if mse["separated"] else ", overlapping") + f") accepts {s['mse_success']} of "
              f"{s['n_cases']}; it agrees with the part-level score on {s['agree']} of {s['n_cases']} cases. It "
              "depends on the renderer's pixels, which a generator never reproduces.", ""]
    if s["failure_reasons"]:
        lines += ["Failures: " + ", ".join(f"{k} {v}" for k, v in sorted(s["failure_reasons"].items())) + ".", ""]
    lines += caveats.lines(generation=True)
    (out / "REPORT.md").write_text("\n".join(lines) + "\n")
    return s


ANSWERERS = ("oracle", "wrong", "http")


def write_answers(data, out, answerer="oracle", seed=0, perturb: str | None = None) -> int:
    """Answer folders from the references: ``oracle`` submits the reference renders of a legal order (each
    perturbed with ``perturb``, :func:`matching.perturb`, when given); ``wrong`` does the same but puts an
    invalid state's render at one turn of every case."""
    cases, _ = load(data)
    out = Path(out)
    if answerer not in ("oracle", "wrong"):
        raise GenError(f"unknown generation answerer {answerer!r}; valid: {', '.join(ANSWERERS)}")
    if perturb is not None and perturb not in M.PERTURBATIONS:
        raise GenError(f"unknown --perturb {perturb!r}; valid: {', '.join(M.PERTURBATIONS)}")
    from PIL import Image

    for case in cases:
        folder = out / case["id"]
        folder.mkdir(parents=True, exist_ok=True)
        order = case["meta"]["reference_order"]
        rng = np.random.default_rng([seed, int(hashlib.sha256(case["id"].encode()).hexdigest()[:8], 16)])
        bad_step = int(rng.integers(1, case["k"] + 1)) if answerer == "wrong" else None
        for i in range(1, case["k"] + 1):
            want = sorted(order[:i])
            src = next(v["path"] for v in case["valid"][str(i)] if v["inserted"] == want)
            if i == bad_step:
                inv = case["invalid"][str(i)]
                src = inv[int(rng.integers(len(inv)))]["path"]
            if perturb is None:
                shutil.copyfile(Path(data) / src, folder / STEP_FILE.format(i))
            else:
                Image.fromarray(M.perturb(_load_uint8(Path(data) / src), perturb)).save(folder / STEP_FILE.format(i))
    return len(cases)
