"""The engines folder: the contract between ``make engines`` (which writes it) and a run (which reads it alone).

``python -m engines.build`` writes into one folder (``build/engines`` unless ``--out``) everything a run of a model
on ONNX Runtime or TensorRT needs, and ``eval.run``, ``eval.orin`` and ``eval.serve`` (``--engines DIR``) run
from it with no checkpoint, no Hugging Face cache, no JAX, no export and no engine build (Octo; bc-state and
bc-camera read their weights file, below)::

    manifest.json                           what follows, per model, with the sha256 of every file
    octo_small_backbone.onnx                the two graphs (engines.octo.export) ...
    octo_small_sampler.onnx
    octo_small_backbone.int8.onnx           ... the backbone's INT8 Q/DQ copy (engines.quantize)
    octo_small_backbone.ort.onnx            ... and the graphs as ONNX Runtime loads them (engines.octo.optimize)
    octo_small_sampler.ort.onnx
    octo_small.statistics.json              the checkpoint's dataset statistics (unnormalisation)
    octo_small.instructions.npz             T5 embeddings of every instruction of every task list
    octo_small_backbone_fp16_trt10_...engine  TensorRT engines (+ .json sidecar: their strict key)
    bc_state.onnx                           bc-state's graph (engines/weights/bc_state.safetensors)
    bc_camera.onnx                          bc-camera's graph, uint8 frames in (engines/weights/bc_camera.safetensors)
    bc_camera_fp16_trt10_...engine, ...     their TensorRT engines

``manifest.json`` is ``{"format": FORMAT, "models": {name: entry}}``; an entry names its files (``files``: name ->
sha256; ``stat``: each one's size and modification time when hashed, so that a build with nothing changed hashes
nothing again, while a run hashes every file), the TensorRT engines built (``tensorrt``: file -> key) and where the
weights came from (``weights``: Octo's resolved files' repo, commit and sha256 as a run records them, or null for
random weights; bc-state's and bc-camera's weights file, ``{"file", "sha256"}``; ``source``: the identity the
exporter saw). Octo's entry also holds its architecture (``config``) and the T5 weights' digest (``t5_sha256``) the
embeddings were computed with. Every file is checked against its sha256 when a run reads the entry: a truncated or
replaced file is one line naming it and the command that rebuilds it.

bc-state and bc-camera (``graphs["model"]``) run from their weights file (``--checkpoint``, default
``engines/weights/``; engines.backends exports it on first use into the cache): the same bytes as the folder's
graph, since the build exports it with the same identity (engines.build), so a run on TensorRT finds the engines
built from the folder's graph by its sha256.

Nothing here imports JAX, onnx or TensorRT.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from env.cache import sha256_file  # the project's one file digest

FORMAT = "shape-assembly-bench/engines/1"
MANIFEST = "manifest.json"
REBUILD = "make engines"


class EnginesFolderError(ValueError):
    """An engines folder a run cannot use (one line: the file and the command that rebuilds it)."""


def default_dir() -> Path:
    """``build/engines`` of this checkout: where ``make engines`` writes."""
    from engines.octo.export import BUILD_DIR

    return BUILD_DIR


def build_command(model: str, folder: Path, options: str = "") -> str:
    """The command that builds ``model`` into ``folder`` (with ``options``, e.g. ``--random-weights``)."""
    folder = Path(folder)
    command = f"python -m engines.build --models {model}" + (f" {options}" if options else "")
    if folder.resolve() == default_dir().resolve():
        return command if options else f"make engines (or {command})"
    return f"{command} --out {folder}"


def read_manifest(folder: str | Path, model: str = "") -> dict[str, Any]:
    """The folder's manifest (an empty one when the folder has none yet and ``model`` is empty: a build)."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        if not model:
            return {"format": FORMAT, "models": {}}
        raise EnginesFolderError(f"{path} does not exist: {folder} holds no engines; build them with: "
                                 f"{build_command(model, folder)}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EnginesFolderError(f"{path} cannot be read ({type(e).__name__}); rebuild it with: "
                                 f"{build_command(model or 'MODEL', folder)}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("models"), dict):
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise EnginesFolderError(f"{path} is not an engines manifest of this project ({found!r}, expected "
                                 f"{FORMAT!r}); rebuild it with: {build_command(model or 'MODEL', folder)}")
    return data


def _stat(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _sha256(folder: Path, name: str, before: dict[str, Any]) -> tuple[str, list[int]]:
    """(sha256, [size, mtime_ns]) of a file; the sha256 the last build listed when the file has not changed since
    (same size and modification time, as git's index trusts them): a build with nothing changed hashes nothing."""
    stat = _stat(folder / name)
    old = (before.get("stat") or {}).get(name)
    if old == stat and name in (before.get("files") or {}):
        return before["files"][name], stat
    return sha256_file(folder / name), stat


def write_entry(folder: str | Path, model: str, entry: dict[str, Any], files: list[str]) -> dict[str, Any]:
    """Record ``model``'s entry with the sha256 of each of ``files`` (names in ``folder``); the manifest is
    replaced whole (a reader never sees half of it). Returns the entry as written."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    before = manifest["models"].get(model) or {}
    hashed = {name: _sha256(folder, name, before) for name in sorted(set(files))}
    entry = {**entry, "files": {n: h[0] for n, h in hashed.items()}, "stat": {n: h[1] for n, h in hashed.items()}}
    manifest["models"][model] = entry
    tmp = folder / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, folder / MANIFEST)
    return entry


def add_files(folder: str | Path, model: str, files: dict[str, Any], key: str | None = None) -> None:
    """Add files (name -> what ``entry[key]`` keeps of each, e.g. a TensorRT engine's key) to ``model``'s entry."""
    folder = Path(folder)
    manifest = read_manifest(folder, model)
    entry = manifest["models"].get(model)
    if entry is None:
        raise EnginesFolderError(f"{folder / MANIFEST} has no {model}; build it with: {build_command(model, folder)}")
    for name, value in files.items():
        entry["files"][name], entry.setdefault("stat", {})[name] = _sha256(folder, name, entry)
        if key is not None and value is not None:
            entry.setdefault(key, {})[name] = value
    tmp = folder / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, folder / MANIFEST)


def model_entry(folder: str | Path, model: str, verify: bool = True) -> dict[str, Any]:
    """``model``'s entry of the folder's manifest, each of its files checked against its sha256 (``verify``).
    One line (EnginesFolderError) for a missing manifest, model or file, or a file that changed."""
    folder = Path(folder)
    entry = read_manifest(folder, model)["models"].get(model)
    if not isinstance(entry, dict) or not isinstance(entry.get("files"), dict):
        raise EnginesFolderError(f"{folder / MANIFEST} has no {model}; build it with: {build_command(model, folder)}")
    if verify:
        for name, sha in entry["files"].items():
            path = folder / name
            if not path.is_file():
                raise EnginesFolderError(f"{path} is missing (listed in {MANIFEST}); rebuild it with: "
                                         f"{build_command(model, folder)}")
            if sha256_file(path) != sha:
                raise EnginesFolderError(f"{path} is not the file {MANIFEST} lists (truncated or replaced: its "
                                         f"sha256 differs); rebuild it with: {build_command(model, folder)}")
    return entry


def unchanged_entry(folder: str | Path, model: str) -> dict[str, Any] | None:
    """``model``'s entry when every file it lists is there with the size and modification time it had when hashed
    (what a build with nothing changed may trust without hashing, as git's index does), else None. A run never
    takes this: it checks every sha256 (:func:`model_entry`)."""
    folder = Path(folder)
    try:
        entry = read_manifest(folder)["models"].get(model)
    except EnginesFolderError:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("files"), dict):
        return None
    stats = entry.get("stat") or {}
    for name in entry["files"]:
        path = folder / name
        if not path.is_file() or stats.get(name) != _stat(path):
            return None
    return entry


def file_of(folder: str | Path, entry: dict[str, Any], name: str | None, what: str, model: str) -> Path:
    """The path of one of the entry's files, which must be listed (one line otherwise)."""
    folder = Path(folder)
    if not name or name not in entry.get("files", {}):
        raise EnginesFolderError(f"{folder / MANIFEST} lists no {what} of {model}; build it with: "
                                 f"{build_command(model, folder)}")
    return folder / name
