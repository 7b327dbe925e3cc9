"""Build the question set: items from seeded generators, PNG images, questions JSONL, manifest.

Determinism: item ``i`` of type ``t`` is drawn from ``default_rng([seed, type index, i])`` (plan
items from ``[seed, 100 + k, i]``), so a smaller build is a prefix of a larger one. Image files
are named by a hash of their state and camera, so one state shown by several questions is
rendered once. The set's identity is ``sha256_states``: the JSONL alone (which holds every state
exactly), which does not depend on the renderer's pixels; ``sha256_images`` covers the JSONL bytes and
every image's name and bytes (published, not the identity: two OpenBLAS kernels or Mesa versions may
differ by a few pixel values). Every number in the JSONL is computed without BLAS
(:mod:`env.exact`), so ``sha256_states`` is the same on every CPU and BLAS kernel (a test derives it
under several ``OPENBLAS_CORETYPE`` values); the pixels, and with them ``sha256_images``, are the
renderer's (Mesa lavapipe's version and the CPU it compiles its shaders for). The manifest's ``files`` holds each
file's own sha256 (every image's published): :func:`load` checks every one before a run or a gallery reads the set,
so an edited answer key or image is refused, named, with the command that rebuilds the set, before any model is
asked anything.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from pathlib import Path

import numpy as np

from assembly_probe import planning as P
from assembly_probe import questions as Q
from assembly_probe import scene as S

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


def files_sha256(records_file: str, jsonl: bytes, images: dict[str, bytes]) -> dict[str, str]:
    """Each file of a set and its sha256 (the manifest's ``files``): what a run checks, so that an edited file is
    named before any question is answered."""
    out = {records_file: hashlib.sha256(jsonl).hexdigest()}
    out.update((name, hashlib.sha256(images[name]).hexdigest()) for name in sorted(images))
    return out


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
        "sha256_states": hashlib.sha256(jsonl).hexdigest(), "sha256_images": set_sha256(jsonl, images),
        "seed": seed, "per_type": per_type, "lite_per_type": lite, "types": list(types), "plan_ks": list(plan_ks),
        "plan_per_k": plan_per_k, "plan_lite_per_k": PLAN_LITE, "image_size": size, "n_items": len(items),
        "n_image_refs": n_refs, "n_images": len(images), "counts": counts,
        "build_s": round(time.monotonic() - t0, 2), "items_s": round(t_items, 2), "render_s": round(t_render, 2),
        "files": files_sha256(QUESTIONS_FILE, jsonl, images),  # what a run checks first (verify_files)
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


class DataError(RuntimeError):
    pass


def _json_lines(f: Path, raw: bytes, rebuild: str, error: type[Exception]) -> list[dict]:
    records = []
    for n, line in enumerate(raw.decode(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise error(f"{f} line {n} is not JSON ({e.msg}): rebuild the set with: {rebuild}") from None
        if not isinstance(rec, dict):
            raise error(f"{f} line {n} is not a JSON object: rebuild the set with: {rebuild}")
        records.append(rec)
    return records


def verify_files(data, manifest: dict, records_file: str, rebuild: str, error: type[Exception] = DataError) -> None:
    """Every file of the set against the manifest's sha256 (``files``; a set built before those were written: the
    records against ``sha256_states``, the images against ``sha256``); ``error``, one line naming the first file
    that differs and ``rebuild``, the command that makes the set again."""
    data = Path(data)
    files = manifest.get("files")
    if isinstance(files, dict) and files:
        for name, want in sorted(files.items(), key=lambda kv: (kv[0] != records_file, kv[0])):
            f = data / name
            if not f.is_file():
                raise error(f"{f} is missing (listed in {data / MANIFEST_FILE}): rebuild the set with: {rebuild}")
            if hashlib.sha256(f.read_bytes()).hexdigest() != want:
                raise error(f"{f} differs from its sha256 in {data / MANIFEST_FILE} (edited or damaged): rebuild "
                            f"the set with: {rebuild}")
        return
    images_sha = manifest.get("sha256_images", manifest.get("sha256"))  # "sha256": a set built before issue 47
    if images_sha is None or "sha256_states" not in manifest:
        raise error(f"{data / MANIFEST_FILE} holds no sha256 of the set: rebuild the set with: {rebuild}")
    jsonl = (data / records_file).read_bytes()
    if hashlib.sha256(jsonl).hexdigest() != manifest["sha256_states"]:
        raise error(f"{data / records_file} differs from sha256_states in {data / MANIFEST_FILE} (edited or "
                    f"damaged): rebuild the set with: {rebuild}")
    images = {f"img/{f.name}": f.read_bytes() for f in sorted((data / "img").glob("*.png"))}
    if set_sha256(jsonl, images) != images_sha:  # an older manifest has no per-file hashes to name one by
        raise error(f"the images in {data / 'img'} differ from the sha256 in {data / MANIFEST_FILE} (edited, "
                    f"damaged, added or removed): rebuild the set with: {rebuild}")


def read_set(data, records_file: str, build_command: str, error: type[Exception] = DataError,
             rebuild=None) -> tuple[list[dict], dict]:
    """A built set's records (one JSON line each) and its manifest, every file checked against the manifest's
    sha256 before anything reads the set (:func:`verify_files`). ``error``, one line naming the file and the
    command that rebuilds the set, when the records or the manifest are missing or not JSON, or a file differs.
    ``rebuild(data, manifest)`` gives that command from the manifest (default: ``build_command --out DATA``)."""
    data = Path(data)
    plain = f"{build_command} --out {data}"
    f = data / records_file
    if not f.is_file():
        raise error(f"no {records_file} in {data} (build it with: {plain})")
    raw = f.read_bytes()
    mf = data / MANIFEST_FILE
    if not mf.is_file():
        raise error(f"no {MANIFEST_FILE} in {data}: its files cannot be checked; rebuild the set with: {plain}")
    try:
        manifest = json.loads(mf.read_text(errors="replace"))
    except ValueError as e:
        raise error(f"{mf} is not JSON ({e.msg}): rebuild the set with: {plain}") from None
    if not isinstance(manifest, dict):
        raise error(f"{mf} is not a JSON object: rebuild the set with: {plain}")
    command = rebuild(data, manifest) if rebuild else plain
    records = _json_lines(f, raw, command, error)
    verify_files(data, manifest, records_file, command, error)
    return records, manifest


def rebuild_command(data, manifest: dict) -> str:
    """The ``build`` command line that makes the set the manifest describes (its options where not the defaults)."""
    parts = ["python -m assembly_probe build", f"--out {data}"]
    m = manifest
    try:
        if m.get("seed", 0) != 0:
            parts.append(f"--seed {int(m['seed'])}")
        if m.get("per_type", 100) != 100:
            parts.append(f"--per-type {int(m['per_type'])}")
        if m.get("lite_per_type", 20) != 20:
            parts.append(f"--lite {int(m['lite_per_type'])}")
        types = m.get("types") or [t for t in m.get("counts", {}) if not t.startswith("plan_k")]
        if types and tuple(types) != Q.TYPES:
            parts.append(f"--types {','.join(types)}")
        ks = [int(k) for k in m.get("plan_ks", range(1, 9))]
        if ks != list(range(1, 9)):
            parts.append("--plan-k " + (",".join(map(str, ks)) if ks else "''"))
        if m.get("plan_per_k", 20) != 20:
            parts.append(f"--plan-per-k {int(m['plan_per_k'])}")
        if m.get("image_size", S.IMAGE_SIZE) != S.IMAGE_SIZE:
            parts.append(f"--size {int(m['image_size'])}")
    except (TypeError, ValueError, AttributeError):  # a manifest edited by hand: the plain command
        return f"python -m assembly_probe build --out {data}"
    return " ".join(parts)


def load(data) -> tuple[list[dict], dict]:
    """The questions and the manifest of a built set, every file checked against the manifest (DataError)."""
    return read_set(data, QUESTIONS_FILE, "python -m assembly_probe build", rebuild=rebuild_command)
