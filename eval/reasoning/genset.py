"""Plan-k-Step-Generation set: the model draws the k intermediate states itself; scored per turn.

A case (k = 2..5, 20 per k by default) gives the initial and the target state (k + 1 moves apart,
with real ordering constraints inside the target) and asks for k images, the states after moves
1..k. The set stores, for every step i, every *valid* state (each set of i target blocks on some
legal path, :func:`planning.ideals`: every legal order, not only the reference one) as a reference
render, and for calibration every *invalid* state of that step: the other i-block subsets of the
target (a block moved while another still rests on it) and one drawn distractor of each kind per
reference step (wrong hole, wrong yaw on the rim, extra block, ...).

Scoring (:func:`score_images`), as the paper defines it: each generated image is matched to the nearest
valid candidate state of its step by MSE after alignment to the fixed camera (:mod:`eval.reasoning.matching`:
resized, registered to the case's initial render, low-passed, photometrically normalised, a small shift
search); a match counts if the MSE is at most the set's tolerance. Then the matched states must form a legal
path (:func:`planning.legal_path`): the case scores 1, else 0. Beside it, the part-level verifier
(:mod:`eval.reasoning.partread`) reads from each image which block stands where and checks legality on parts;
every report says how often the two agree.

The tolerance is calibrated on the set (:func:`calibrate`): every valid reference render is perturbed the ways
a generator's picture differs from a render (``matching.PERTURBATIONS``: JPEG q85, a 1 px shift, delivered at
twice the size, shrunk and enlarged, 3% brighter or darker) and matched; every invalid render is matched too.
With the largest perturbed-correct distance below the smallest wrong-state distance, the tolerance is their
geometric mean; otherwise the value with the fewest errors. The manifest records both extremes, where they
occur, the rates at the tolerance (per image and per case), the rates on the odd cases at a tolerance taken
from the even ones, and the verifier's agreement.

``generate-answers`` writes answer folders: the reference renders (``oracle``, optionally perturbed), the same
with an invalid state at one turn (``wrong``), or a model's images from an OpenAI-compatible chat endpoint
(``http``; :mod:`eval.reasoning.gendriver`: multi-turn, each turn seeing the model's own previous image, as in
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

from eval.reasoning import matching as M
from eval.reasoning import partread as PR
from eval.reasoning import planning as P
from eval.reasoning import scene as S
from eval.reasoning.build import MANIFEST_FILE, _png_bytes, files_sha256, read_set, set_sha256

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
    """Cases, reference renders (valid and invalid states), calibration and a manifest with the sha256."""
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
    manifest = {"sha256": set_sha256(jsonl, images), "sha256_states": hashlib.sha256(jsonl).hexdigest(),
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
    """The case's score (1: every image within ``tolerance`` of a valid state of its step, the matched states a
    legal path) and the part-level verifier's verdict on the same images."""
    k = refs.k
    if len(images) != k:
        why = f"expected {k} images, got {len(images)}"
        return {"accepted": False, "reason": why, "matched": [], "mse": [], "read": [], "verifier_accepted": False,
                "verifier_reason": why, "agree": True}
    matched, dists, read, reason = [], [], [], None
    for i, img in enumerate(images, start=1):
        d, ins, reg = refs.match(img, i)
        dists.append(d)
        read.append(refs.reader.inserted(reg))
        if d <= tolerance:
            matched.append(ins)
        elif reason is None:
            reason = f"step {i}: no valid state within MSE {tolerance:.3g} (nearest {d:.3g})"
    accepted = False
    if reason is None:
        accepted, reason = P.legal_path(refs.dom, refs.target, matched)
    bad = next((i for i, r in enumerate(read, start=1) if r is None), None)
    if bad is not None:
        v_ok, v_reason = False, f"step {bad}: a block is neither at its start nor in its hole"
    else:
        v_ok, v_reason = P.legal_path(refs.dom, refs.target, read)
    return {"accepted": bool(accepted), "reason": reason, "matched": matched, "mse": dists, "read": read,
            "verifier_accepted": bool(v_ok), "verifier_reason": v_reason, "agree": bool(accepted) == bool(v_ok)}


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


def _rates(rows, tolerance: float) -> dict:
    """Image and case rates at a tolerance over calibration rows (see :func:`calibrate`)."""
    out = {"correct": {}, "wrong": {}}
    for kind in M.PERTURBATIONS:
        rs = [r for r in rows if r["population"] == "correct" and r["kind"] == kind]
        ok = [r for r in rs if r["mse"] <= tolerance and r["nearest"] == r["state"]]
        out["correct"][kind] = {"images": len(rs), "accepted": len(ok), "rate": len(ok) / max(len(rs), 1)}
    ws = [r for r in rows if r["population"] == "wrong"]
    rej = [r for r in ws if r["mse"] > tolerance]
    by_kind: dict = {}
    for r in ws:
        e = by_kind.setdefault(r["kind"], {"images": 0, "rejected": 0})
        e["images"] += 1
        e["rejected"] += r["mse"] > tolerance
    out["wrong"] = {"images": len(ws), "rejected": len(rej), "rate": len(rej) / max(len(ws), 1), "by_kind": by_kind}
    return out


def _case_rates(case_rows, tolerance: float) -> dict:
    """Per case: the reference order's k renders perturbed one way, or with one turn an invalid render."""
    out = {}
    for kind in list(M.PERTURBATIONS) + ["wrong_turn"]:
        rs = [c for c in case_rows if c["kind"] == kind]
        acc = [c for c in rs if all(d <= tolerance for d in c["mse"]) and c["legal_if_matched"]]
        mse_ok = [all(d <= tolerance for d in c["mse"]) and c["legal_if_matched"] for c in rs]
        agree = sum(m == c["verifier_accepted"] for m, c in zip(mse_ok, rs))
        out[kind] = {"cases": len(rs), "accepted": len(acc), "rate": len(acc) / max(len(rs), 1),
                     "verifier_accepted": sum(c["verifier_accepted"] for c in rs), "agree": agree}
    return out


def calibrate(cases, data_dir, size: int, progress: bool = False) -> dict:
    """Match every valid render, perturbed each way, and every invalid render against the valid states of its
    step; the tolerance from the two populations' distances; the rates and the verifier's agreement."""
    from tqdm import tqdm

    data_dir = Path(data_dir)
    rows, case_rows = [], []
    for ci, case in enumerate(tqdm(cases, desc="calibrating", unit="case", disable=not progress)):
        refs = CaseRefs.from_files(case, data_dir, size)
        valid_sets = {int(i): [v["inserted"] for v in vs] for i, vs in case["valid"].items()}
        ref_order = case["meta"]["reference_order"]
        per_step: dict = {}  # (step, kind) -> row of the reference order's state
        for step, vs in case["valid"].items():
            step = int(step)
            for v in vs:
                raw = _load_uint8(data_dir / v["path"])
                for kind in M.PERTURBATIONS:
                    d, ins, reg = refs.match(M.to_size(M.perturb(raw, kind), size), step)
                    got = refs.reader.inserted(reg)
                    row = {"population": "correct", "kind": kind, "case": case["id"], "half": ci % 2, "step": step,
                           "state": v["inserted"], "mse": d, "nearest": ins,
                           "read": got if got in valid_sets[step] else None}
                    rows.append(row)
                    if v["inserted"] == sorted(ref_order[:step]):
                        per_step[(step, kind)] = row
            for u in case["invalid"][str(step)]:
                d, ins, reg = refs.match(_load_img(data_dir / u["path"], size), step)
                got = refs.reader.inserted(reg)
                row = {"population": "wrong", "kind": u["kind"], "case": case["id"], "half": ci % 2, "step": step,
                       "state": u["inserted"], "mse": d, "nearest": ins,
                       "read": got if got in valid_sets[step] else None}
                rows.append(row)
                # the reference order with this turn wrong (its other turns are the clean reference renders, which
                # match their own state at MSE 0 and are read as it): matched as the nearest valid state here
                sets = [sorted(ref_order[:j]) for j in range(1, case["k"] + 1)]
                matched = list(sets)
                matched[step - 1] = ins
                read = list(sets)
                read[step - 1] = row["read"]
                case_rows.append({"kind": "wrong_turn", "case": case["id"], "half": ci % 2,
                                  "mse": [0.0 if j != step - 1 else d for j in range(case["k"])],
                                  "legal_if_matched": P.legal_path(refs.dom, refs.target, matched)[0],
                                  "verifier_accepted": row["read"] is not None
                                  and P.legal_path(refs.dom, refs.target, read)[0]})
        for kind in M.PERTURBATIONS:
            steps = [per_step[(j, kind)] for j in range(1, case["k"] + 1)]
            reads = [r["read"] for r in steps]
            case_rows.append({"kind": kind, "case": case["id"], "half": ci % 2, "mse": [r["mse"] for r in steps],
                              "legal_if_matched": P.legal_path(refs.dom, refs.target, [r["nearest"] for r in steps])[0],
                              "verifier_accepted": all(r is not None for r in reads)
                              and P.legal_path(refs.dom, refs.target, reads)[0]})
    correct = [r for r in rows if r["population"] == "correct"]
    wrong = [r for r in rows if r["population"] == "wrong"]
    tol, separated = _tolerance([r["mse"] for r in correct], [r["mse"] for r in wrong])
    c_top = max(correct, key=lambda r: r["mse"])
    w_low = min(wrong, key=lambda r: r["mse"])
    even = [r for r in rows if r["half"] == 0]
    tol_even, _ = _tolerance([r["mse"] for r in even if r["population"] == "correct"],
                             [r["mse"] for r in even if r["population"] == "wrong"])
    odd = [r for r in rows if r["half"] == 1]
    # the verifier: the state it reads (a valid state of the step, else none) against the matcher's
    mse_verdict = [r["nearest"] if r["mse"] <= tol else None for r in rows]
    agree = sum(v == r["read"] for v, r in zip(mse_verdict, rows))
    return {
        "metric": "MSE over rgb in [0, 1] after alignment (matching.py: resized, registered to the initial render, "
                  "2x2 low-pass, per-channel mean/std matched, best shift)",
        "register_px": M.REGISTER_PX, "shift_px": M.SHIFT_PX, "perturbations": list(M.PERTURBATIONS),
        "tolerance_mse": tol, "separated": separated,
        "correct_max_mse": c_top["mse"], "correct_max_at": {k: c_top[k] for k in ("case", "step", "kind", "state")},
        "correct_max_mse_by_kind": {kind: max(r["mse"] for r in correct if r["kind"] == kind) for kind in M.PERTURBATIONS},
        "wrong_min_mse": w_low["mse"], "wrong_min_at": {k: w_low[k] for k in ("case", "step", "kind", "state")},
        "separation_ratio": w_low["mse"] / c_top["mse"] if c_top["mse"] > 0 else None,
        "images": _rates(rows, tol), "cases": _case_rates(case_rows, tol),
        "held_out": {"tolerance_mse_from_even_cases": tol_even, "odd_cases": _rates(odd, tol_even),
                     "odd_cases_by_case": _case_rates([c for c in case_rows if c["half"] == 1], tol_even)},
        "verifier": {"images": len(rows), "agree": agree, "rate": agree / len(rows),
                     "correct_read_right": sum(r["read"] == r["state"] for r in correct), "correct_images": len(correct),
                     "wrong_read_as_valid": sum(r["read"] is not None for r in wrong), "wrong_images": len(wrong)},
    }


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
    parts = ["python -m eval.reasoning generate-build", f"--out {data}"]
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
        return f"python -m eval.reasoning generate-build --out {data}"
    return " ".join(parts)


def load(data) -> tuple[list[dict], dict]:
    """The cases and the manifest of a built set, every file checked against the manifest (GenError)."""
    return read_set(data, CASES_FILE, "python -m eval.reasoning generate-build", GenError, rebuild=rebuild_command)


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
    if "tolerance_mse" not in manifest.get("calibration", {}):
        raise GenError(f"{data}/{MANIFEST_FILE} has no calibrated tolerance (an older set): rebuild it with "
                       "python -m eval.reasoning generate-build")
    tol = manifest["calibration"]["tolerance_mse"]
    size = manifest["image_size"]
    records = []
    for case in tqdm(cases, desc="scoring", unit="case", disable=not progress):
        imgs = read_answers(answers, case, size)
        if isinstance(imgs, str):
            res = {"accepted": False, "reason": imgs, "matched": [], "mse": [], "read": [],
                   "verifier_accepted": False, "verifier_reason": imgs, "agree": True}
        else:
            res = score_images(CaseRefs.from_files(case, data, size), imgs, tol)
        records.append({"id": case["id"], "k": case["k"], "score": int(res["accepted"]), **res})
    return records, manifest


def _reason_key(reason: str) -> str:
    return reason.split(":")[0] if reason.startswith("step") else reason


def summarize(records, manifest, answerer: str, run: dict | None = None) -> dict:
    from eval.stats import wilson

    per_k = {}
    for k in sorted({r["k"] for r in records}):
        rs = [r for r in records if r["k"] == k]
        hit = sum(r["score"] for r in rs)
        v_hit = sum(r["verifier_accepted"] for r in rs)
        iv = wilson(hit, len(rs))
        per_k[f"k{k}"] = {"n": len(rs), "success": hit, "rate": hit / len(rs), "ci": [iv.low, iv.high],
                          "verifier_success": v_hit, "agree": sum(r["agree"] for r in rs)}
    reasons: dict[str, int] = {}
    for r in records:
        if not r["accepted"]:
            key = _reason_key(r["reason"])
            reasons[key] = reasons.get(key, 0) + 1
    return {"answerer": answerer, "set_sha256": manifest.get("sha256"), "n_cases": len(records),
            "protocol": (run or {}).get("protocol", "files"), "run": run or {"protocol": "files"},
            "success": sum(r["score"] for r in records), "verifier_success": sum(r["verifier_accepted"] for r in records),
            "agree": sum(r["agree"] for r in records), "per_k": per_k, "calibration": manifest["calibration"],
            "failure_reasons": reasons}


PROTOCOLS = {
    "multi-turn": "multi-turn (the paper's protocol): each turn asks for the next state and sees the model's own "
                  "previous image",
    "single-shot": "single-shot: one request, all k images from one reply",
    "files": "images written by another program (no run.json in the answers folder)",
}


def write_report(records, manifest, answerer, out, run: dict | None = None) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    s = summarize(records, manifest, answerer, run)
    (out / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    (out / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    cal = s["calibration"]
    lines = [f"# Plan-k-Step-Generation: `{answerer}`", "",
             f"Set sha256 `{s['set_sha256']}`; {s['n_cases']} cases; {s['success']} accepted. Protocol: "
             f"{PROTOCOLS.get(s['protocol'], s['protocol'])}.", "",
             "Each generated image is matched to the nearest valid state of its step (every state on some legal "
             "path, not only the reference one) by MSE after alignment to the fixed camera; a case scores 1 when "
             "every image is within the tolerance and the matched states form a legal path, else 0.", "",
             f"Tolerance MSE {cal['tolerance_mse']:.3g}, calibrated on the set: perturbed correct renders "
             f"({', '.join(cal['perturbations'])}) reach at most {cal['correct_max_mse']:.3g} "
             f"({cal['correct_max_at']['kind']}), wrong-state renders come no nearer than {cal['wrong_min_mse']:.3g} "
             f"({cal['wrong_min_at']['kind']}, {cal['wrong_min_at']['case']} step {cal['wrong_min_at']['step']})"
             + (f": apart by a factor {cal['separation_ratio']:.2f}." if cal["separated"] else
                ": the two overlap; the tolerance has the fewest errors.") + "", "",
             "| k | n | success | rate | 95% Wilson CI | part-level verifier | agree |", "|---|---|---|---|---|---|---|"]
    for k, r in s["per_k"].items():
        lines.append(f"| {k[1:]} | {r['n']} | {r['success']} | {100 * r['rate']:.1f}% | "
                     f"{100 * r['ci'][0]:.1f}% - {100 * r['ci'][1]:.1f}% | {r['verifier_success']} | {r['agree']} |")
    lines += ["", f"Part-level verifier (reads each block's place from its colour, checks legality on parts): "
              f"{s['verifier_success']} of {s['n_cases']} accepted; it agrees with the MSE matcher on "
              f"{s['agree']} of {s['n_cases']} cases."]
    if s["failure_reasons"]:
        lines += ["", "Failures: " + ", ".join(f"{k} {v}" for k, v in sorted(s["failure_reasons"].items())) + "."]
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
