"""Plan-k-Step-Generation set: the model draws the k intermediate states itself; scored per turn.

A case (k = 2..5, 20 per k by default) gives the initial and the target state (k + 1 moves apart,
with real ordering constraints inside the target) and asks for k images, the states after moves
1..k. The set stores, for every step i, every *valid* state (each set of i target blocks on some
legal path, :func:`planning.ideals`: every legal order, not only the reference one) as a reference
render, and for calibration every *invalid* state of that step: the other i-block subsets of the
target (a block moved while another still rests on it) and one drawn distractor of each kind per
reference step (wrong hole, wrong yaw on the rim, extra block, ...).

Scoring (:func:`score_case`): each generated image is matched to the nearest valid reference of its
step by RMS distance (RGB in [0, 1], resized to the render size); a match counts if the distance is
at most the set's threshold. Then the matched states must form a legal path (one new block per
step, each move legal, the last missing block a legal final move): the case scores 1, else 0.

The threshold is calibrated on the set itself (:func:`calibrate`): ``d_invalid`` is the smallest RMS
distance between a valid state and its nearest invalid state of the same step, ``d_valid`` the
smallest between two valid states of a case (any steps, initial and target included); the threshold
is half the smaller of the two. RMS
distance is a metric, so an image within the threshold of a valid state is farther than the
threshold from every other valid or invalid state of its step: an accepted match is unambiguous,
and a render of an invalid state is never accepted.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np

from eval.reasoning import planning as P
from eval.reasoning import scene as S
from eval.reasoning.build import MANIFEST_FILE, _png_bytes, read_set, set_sha256

CASES_FILE = "cases.jsonl"
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
    avoid = [P.state_of(dom, s) for s in ideals]
    for kind in P.DISTRACTOR_KINDS:
        for i, (prev, move) in enumerate(steps, start=1):
            st = P.distractor(dom, kind, set(prev), move, target, rng)
            if st is None or P.valid_toward(dom, st, target) or S.canonical(st) in seen:
                continue
            if any(S.canonical(st) == S.canonical(a) for a in avoid):
                continue
            seen.add(S.canonical(st))
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
    cal = calibrate(cases, out)
    counts = {f"k{k}": sum(c["k"] == k for c in cases) for k in ks}
    manifest = {"sha256": set_sha256(jsonl, images), "sha256_states": hashlib.sha256(jsonl).hexdigest(),
                "seed": seed, "ks": list(ks), "per_k": per_k, "image_size": size, "camera": CAMERA,
                "n_cases": len(cases), "n_images": len(images), "counts": counts, "calibration": cal,
                "n_valid_refs": sum(len(v) for c in cases for v in c["valid"].values()),
                "n_invalid_refs": sum(len(v) for c in cases for v in c["invalid"].values()),
                "build_s": round(time.monotonic() - t0, 2)}
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _load_img(path: Path, size: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            if im.size != (size, size):
                im = im.resize((size, size), Image.BILINEAR)
            return np.asarray(im, dtype=np.float64) / 255.0
    except (UnidentifiedImageError, OSError) as e:
        raise GenError(f"cannot read image {path}: {e}") from None


def rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(math.sqrt(float(np.mean((a - b) ** 2))))


def calibrate(cases, data_dir) -> dict:
    """Smallest RMS distance from a valid state to the nearest invalid one of its step (and between two
    valid states of one step) over the whole set; the matching threshold is half the smaller."""
    data_dir = Path(data_dir)
    size = None
    cache: dict[str, np.ndarray] = {}

    def img(path):
        nonlocal size
        if path not in cache:
            arr = _load_img(data_dir / path, size or 0) if size else None
            if arr is None:
                from PIL import Image

                with Image.open(data_dir / path) as im:
                    size = im.size[0]
                arr = _load_img(data_dir / path, size)
            cache[path] = arr
        return cache[path]

    d_inv, d_val, where_inv, where_val = math.inf, math.inf, None, None
    for case in cases:
        for step, valid in case["valid"].items():
            for v in valid:
                for u in case["invalid"][step]:
                    d = rms(img(v["path"]), img(u["path"]))
                    if d < d_inv:
                        d_inv, where_inv = d, {"case": case["id"], "step": int(step), "valid": v["inserted"],
                                               "invalid_kind": u["kind"]}
        # every valid state of the case, initial and target included, against every other (any step):
        # a drawing of the state one move early or late is no match either
        allv = [(0, im["path"], []) for im in case["images"] if im["role"] == "initial"]
        allv += [(int(st), v["path"], v["inserted"]) for st, vs in case["valid"].items() for v in vs]
        allv += [(case["k"] + 1, im["path"], case["meta"]["target"]) for im in case["images"] if im["role"] == "target"]
        for j, (sa, pa, ia) in enumerate(allv):
            for sb, pb, ib in allv[j + 1:]:
                d = rms(img(pa), img(pb))
                if d < d_val:
                    d_val, where_val = d, {"case": case["id"], "a": ia, "b": ib, "steps": [sa, sb]}
        cache.clear()  # one case at a time: bounded memory
    thr = min(d_inv, d_val) / 2
    return {"metric": "RMS over RGB in [0, 1]", "d_valid_invalid_min": d_inv, "d_valid_invalid_at": where_inv,
            "d_valid_valid_min": None if math.isinf(d_val) else d_val, "d_valid_valid_at": where_val,
            "threshold_rms": thr, "threshold_over_255": thr * 255}


def load(data) -> tuple[list[dict], dict]:
    cases, manifest = read_set(data, CASES_FILE, "python -m eval.reasoning generate-build", GenError)
    if manifest is None:
        raise GenError(f"no {MANIFEST_FILE} in {data}: rebuild the set")
    return cases, manifest


def score_case(case, images: list[np.ndarray], data_dir, threshold: float) -> dict:
    """Match each image to the nearest valid reference of its step, then check the path (1 or 0)."""
    k = case["k"]
    dom, target = case["meta"]["domain"], set(case["meta"]["target"])
    if len(images) != k:
        return {"accepted": False, "reason": f"expected {k} images, got {len(images)}", "matched": [], "rms": []}
    size = images[0].shape[0] if images else S.IMAGE_SIZE
    matched, dists = [], []
    for i, gen in enumerate(images, start=1):
        best = min((rms(gen, _load_img(Path(data_dir) / v["path"], size)), v["inserted"]) for v in case["valid"][str(i)])
        dists.append(best[0])
        if best[0] > threshold:
            return {"accepted": False, "reason": f"step {i}: no valid state within RMS {threshold:.4f} "
                    f"(nearest {best[0]:.4f})", "matched": matched, "rms": dists}
        matched.append(best[1])
    moves, prev = [], set()
    for i, s in enumerate(matched, start=1):
        new = set(s) - prev
        if not prev <= set(s) or len(new) != 1:
            return {"accepted": False, "reason": f"step {i} does not add exactly one block to step {i - 1}",
                    "matched": matched, "rms": dists}
        moves.append(new.pop())
        prev = set(s)
    order = moves + sorted(target - prev)
    ok = len(target - prev) == 1 and P.is_topological_order(order, target, P.edges(dom))
    return {"accepted": bool(ok), "reason": "legal path" if ok else "illegal order", "matched": matched,
            "rms": dists, "moves": order}


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
    thr = manifest["calibration"]["threshold_rms"]
    size = manifest["image_size"]
    records = []
    for case in tqdm(cases, desc="scoring", unit="case", disable=not progress):
        imgs = read_answers(answers, case, size)
        if isinstance(imgs, str):
            res = {"accepted": False, "reason": imgs, "matched": [], "rms": []}
        else:
            res = score_case(case, imgs, data, thr)
        records.append({"id": case["id"], "k": case["k"], "score": int(res["accepted"]), **res})
    return records, manifest


def summarize(records, manifest, answerer: str) -> dict:
    from eval.stats import wilson

    per_k = {}
    for k in sorted({r["k"] for r in records}):
        rs = [r for r in records if r["k"] == k]
        hit = sum(r["score"] for r in rs)
        iv = wilson(hit, len(rs))
        per_k[f"k{k}"] = {"n": len(rs), "success": hit, "rate": hit / len(rs), "ci": [iv.low, iv.high]}
    reasons: dict[str, int] = {}
    for r in records:
        if not r["accepted"]:
            key = r["reason"].split(":")[0] if r["reason"].startswith("step") else r["reason"]
            reasons[key] = reasons.get(key, 0) + 1
    return {"answerer": answerer, "set_sha256": manifest.get("sha256"), "n_cases": len(records),
            "success": sum(r["score"] for r in records), "per_k": per_k, "calibration": manifest["calibration"],
            "failure_reasons": reasons}


def write_report(records, manifest, answerer, out) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    s = summarize(records, manifest, answerer)
    (out / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    (out / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    cal = s["calibration"]
    lines = [f"# Plan-k-Step-Generation: `{answerer}`", "",
             f"Set sha256 `{s['set_sha256']}`; {s['n_cases']} cases; {s['success']} accepted.", "",
             "Each generated image is matched to the nearest valid state of its step (every state on some legal "
             "path, not only the reference one) by RMS distance; a case scores 1 when every image matches and the "
             "matched states form a legal path, else 0.", "",
             f"Matching threshold RMS {cal['threshold_rms']:.4f} ({cal['threshold_over_255']:.1f}/255), calibrated on "
             f"the set: half the smaller of the smallest distance between a valid state and its nearest invalid "
             f"state of the same step ({cal['d_valid_invalid_min']:.4f}, {cal['d_valid_invalid_at']['case']} step "
             f"{cal['d_valid_invalid_at']['step']}, {cal['d_valid_invalid_at']['invalid_kind']}) and between two valid "
             f"states of a case, any steps ({_f(cal['d_valid_valid_min'])}).", "",
             "| k | n | success | rate | 95% Wilson CI |", "|---|---|---|---|---|"]
    for k, r in s["per_k"].items():
        lines.append(f"| {k[1:]} | {r['n']} | {r['success']} | {100 * r['rate']:.1f}% | "
                     f"{100 * r['ci'][0]:.1f}% - {100 * r['ci'][1]:.1f}% |")
    if s["failure_reasons"]:
        lines += ["", "Failures: " + ", ".join(f"{k} {v}" for k, v in sorted(s["failure_reasons"].items())) + "."]
    (out / "REPORT.md").write_text("\n".join(lines) + "\n")
    return s


def _f(x):
    return "n/a" if x is None else f"{x:.4f}"


def write_answers(data, out, answerer="oracle", seed=0) -> int:
    """Answer folders from the references: ``oracle`` submits the reference renders of a legal order;
    ``wrong`` does the same but puts an invalid state's render at one turn of every case."""
    cases, _ = load(data)
    out = Path(out)
    if answerer not in ("oracle", "wrong"):
        raise GenError(f"unknown generation answerer {answerer!r}; valid: oracle, wrong")
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
            shutil.copyfile(Path(data) / src, folder / STEP_FILE.format(i))
    return len(cases)
