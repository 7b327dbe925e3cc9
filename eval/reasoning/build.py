"""Build the question set: items from seeded generators, PNG images, questions JSONL, manifest.

Determinism: item ``i`` of type ``t`` is drawn from ``default_rng([seed, type index, i])`` (plan
items from ``[seed, 100 + k, i]``), so a smaller build is a prefix of a larger one. Image files
are named by a hash of their state and camera, so one state shown by several questions is
rendered once. The set sha256 covers the JSONL bytes and every image's name and bytes;
``sha256_states`` covers the JSONL alone (which holds every state exactly), a check that does
not depend on the renderer's pixels. Every number in the JSONL is computed without BLAS
(:mod:`env.exact`), so ``sha256_states`` is the same on every CPU and BLAS kernel (a test derives it
under several ``OPENBLAS_CORETYPE`` values); the pixels, and with them the set sha256, are the
renderer's (Mesa lavapipe's version and the CPU it compiles its shaders for).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from pathlib import Path

import numpy as np

from eval.reasoning import planning as P
from eval.reasoning import questions as Q
from eval.reasoning import scene as S

QUESTIONS_FILE = "questions.jsonl"
MANIFEST_FILE = "manifest.json"
PLAN_LITE = 5  # plan items per k in the Lite subset


def generate_items(seed=0, per_type=100, lite=20, types=Q.TYPES, plan_ks=range(1, 9), plan_per_k=20,
                   progress=False) -> list[dict]:
    from tqdm import tqdm

    jobs = [("elem", t, i) for t in types for i in range(per_type)]
    jobs += [("plan", k, i) for k in plan_ks for i in range(plan_per_k)]
    items = []
    for kind, t, i in tqdm(jobs, desc="questions", unit="q", disable=not progress):
        if kind == "elem":
            item = Q.GENERATORS[t](np.random.default_rng([seed, Q.TYPES.index(t), i]), i)
            item.update(id=f"{t}-{i:03d}", set="elementary", lite=i < lite, chance=Q.CHANCE[t])
        else:
            item = P.make_plan_item(np.random.default_rng([seed, 100 + t, i]), t)
            item.update(id=f"plan-k{t}-{i:02d}", set="planning", lite=i < PLAN_LITE, chance=P.plan_chance(t))
        items.append(item)
    return items


def assign_image_paths(items: list[dict], size: int = S.IMAGE_SIZE) -> dict[str, tuple[dict, str]]:
    """Give every image reference its file (named by a hash of state, camera and size); {path: (state,
    camera)} of the distinct images."""
    todo: dict[str, tuple[dict, str]] = {}
    for item in items:
        for im in item["images"]:
            im["path"] = f"img/{S.image_key(im['state'], im['camera'], size)}.png"
            todo.setdefault(im["path"], (im["state"], im["camera"]))
    return todo


def questions_jsonl(items: list[dict]) -> bytes:
    """The questions file: one item per line, keys sorted, floats as Python's shortest round-trip repr."""
    return "".join(json.dumps(item, sort_keys=True) + "\n" for item in items).encode()


def states_sha256(seed=0, size=S.IMAGE_SIZE, **kwargs) -> str:
    """``sha256_states`` of the set ``build`` would write, without rendering: the machine-independent hash."""
    items = generate_items(seed, **kwargs)
    assign_image_paths(items, size)
    return hashlib.sha256(questions_jsonl(items)).hexdigest()


def _png_bytes(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG", compress_level=6)  # zlib output is a pure function of the pixels
    return buf.getvalue()


def set_sha256(jsonl: bytes, images: dict[str, bytes]) -> str:
    h = hashlib.sha256(jsonl)
    for name in sorted(images):
        h.update(name.encode())
        h.update(images[name])
    return h.hexdigest()


def build(out, seed=0, per_type=100, lite=20, types=Q.TYPES, plan_ks=range(1, 9), plan_per_k=20,
          size=S.IMAGE_SIZE, progress=True, renderer=None) -> dict:
    from tqdm import tqdm

    t0 = time.monotonic()
    out = Path(out)
    (out / "img").mkdir(parents=True, exist_ok=True)
    items = generate_items(seed, per_type, lite, types, plan_ks, plan_per_k, progress)
    t_items = time.monotonic() - t0
    todo = assign_image_paths(items, size)
    n_refs = sum(len(item["images"]) for item in items)
    renderer = renderer or S.Renderer(size=size)
    t1 = time.monotonic()
    images: dict[str, bytes] = {}
    for path in tqdm(sorted(todo), desc="rendering", unit="img", disable=not progress):
        state, camera = todo[path]
        images[path] = _png_bytes(renderer.render(state, camera))
        tmp = out / (path + ".tmp")
        tmp.write_bytes(images[path])
        os.replace(tmp, out / path)
    t_render = time.monotonic() - t1
    for stale in (out / "img").glob("*.png"):  # images of an earlier, different build
        if f"img/{stale.name}" not in images:
            stale.unlink()
    jsonl = questions_jsonl(items)
    (out / QUESTIONS_FILE).write_bytes(jsonl)
    counts: dict[str, int] = {}
    for item in items:
        key = item["type"] if item["type"] != "plan" else f"plan_k{item['k']}"
        counts[key] = counts.get(key, 0) + 1
    manifest = {
        "sha256": set_sha256(jsonl, images), "sha256_states": hashlib.sha256(jsonl).hexdigest(),
        "seed": seed, "per_type": per_type, "lite_per_type": lite, "plan_ks": list(plan_ks), "plan_per_k": plan_per_k,
        "plan_lite_per_k": PLAN_LITE, "image_size": size, "n_items": len(items), "n_image_refs": n_refs,
        "n_images": len(images), "counts": counts,
        "build_s": round(time.monotonic() - t0, 2), "items_s": round(t_items, 2), "render_s": round(t_render, 2),
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


class DataError(RuntimeError):
    pass


def read_set(data, records_file: str, build_command: str, error: type[Exception] = DataError
             ) -> tuple[list[dict], dict | None]:
    """A built set's records (one JSON line each) and its manifest (None when missing); ``error`` (one line
    naming ``build_command``) when the records are missing."""
    data = Path(data)
    f = data / records_file
    if not f.is_file():
        raise error(f"no {records_file} in {data} (build it with: {build_command} --out {data})")
    records = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    mf = data / MANIFEST_FILE
    return records, json.loads(mf.read_text()) if mf.is_file() else None


def load(data) -> tuple[list[dict], dict]:
    items, manifest = read_set(data, QUESTIONS_FILE, "python -m eval.reasoning build")
    return items, manifest or {}
