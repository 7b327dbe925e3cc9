"""Build everything this machine can run: ONNX exports always, TensorRT engines where a GPU and TensorRT exist.

    python -m engines.build            # what `make engines` runs
    python -m engines.build --precisions fp32,fp16 --batch-max 8
    python -m engines.build --models octo-small --checkpoint-octo-small ~/octo-small-1.5   # a local copy
    python -m engines.build --models octo-small --random-weights   # latency only
    python -m engines.build --models octo-small --onnx-from DIR   # a Jetson: engines from a folder made on x86
    python -m engines.build --models octo-small --instruction "put the blocks away"   # one more embedding
    python -m engines.build --models bc-state --ort-precisions fp32  # no INT8 graphs
    python -m engines.build --models bc-camera   # from engines/weights/bc_camera.safetensors

Prints a table of what was built, where, and why anything was skipped.
Outputs go to build/engines/ (ignored by git), the engines folder a run reads alone (:mod:`engines.folder`:
``manifest.json`` lists every file with its sha256; Octo's entry adds its architecture, dataset statistics,
the graphs as ONNX Runtime loads them and the T5 embeddings of every instruction of every task list, so that
a run on ONNX Runtime or TensorRT needs neither the checkpoint nor JAX). bc-state and bc-camera are exported
from their weights files (``engines/weights/``, :data:`WEIGHTS_FILE_MODELS`); the entry names the file and its
sha256. A missing file stops a build whose ``--models`` names the model, in one line with the command that trains
it; the default list (every model) lists such a model as skipped with that line.
Octo (octo-small, octo-base) is exported from its released weights (:mod:`engines.hub`: the Hugging Face
cache, or downloaded into it), or from the folder given (--checkpoint-octo-small DIR), and the table names the
repo and commit they came from. When they cannot be had the build
stops before anything is built, in one line naming the repo, the files, the cache
folder and the flag. Seeded random weights of the exact architecture only with
--random-weights, marked "random weights (latency only)" on every row and in the
ONNX metadata. ``--onnx-from DIR`` takes Octo's entry of an engines folder made elsewhere (``python -m
engines.build --out DIR`` on an x86 machine with JAX), checks every file against its sha256, copies it into
``--out`` (when that is another folder) and builds the TensorRT engines there, so that a machine without JAX
(the Jetson image, JetPack 6) gets a whole engines folder. TensorRT engines are built for the batch profile a
run uses (``engines.backends.MODEL_RUNTIMES``; ``--batch-max`` for another) and listed in the manifest.

Beside each fp32 graph it builds the INT8 Q/DQ graph ONNX Runtime runs as ``--precision int8``
(``<stem>.int8.onnx``, :mod:`engines.quantize`; Octo: the backbone), calibrated on the benchmark's own dev
tries (``build/octo_queries/``: recorded by :mod:`engines.calibration` when missing or recorded from other
inputs: model, tries, task list, appearance), and keyed by the weights' digest and the calibration's sha256
(rebuilt only when either changes). A model whose INT8 is refused (:data:`engines.quantize.INT8_REFUSED`:
both measured: bc-state and bc-camera) gets neither the Q/DQ graph nor a TensorRT int8 engine; their
rows say skipped, with the reason. BF16 is listed as skipped with the reason (ONNX Runtime's CPU provider has no
bfloat16 kernels).

Work already done is not redone: an Octo export of the same weights and format, Octo's load-time ONNX
Runtime rewrite (cached by the graph's sha256), a calibration recording of the same inputs and an INT8
graph of the same weights and calibration are kept. The seconds of each stage (export, optimise,
calibration recording, quantise, tensorrt) are printed and written to ``<out>/build_stages.json``
(``python -m benchmarks.engines_build`` times a build from nothing and one with nothing changed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import types
from pathlib import Path

from engines.backends import WEIGHTS_FILE_MODELS, weights_source
from engines.octo.config import RANDOM_WEIGHTS_LABEL
from engines.octo.export import BUILD_DIR as OUT  # build/engines of this checkout


def missing_weights(model: str) -> str | None:
    """Why a weights-file model cannot be exported here (its file is missing, in one line with the command that
    trains it), or None."""
    spec = WEIGHTS_FILE_MODELS[model]
    path = spec.weights()
    return None if path.is_file() else f"no {model} weights at {path}; train them with: {spec.train}"


def _weights_file_onnx(model: str):
    def export(out: Path, args) -> list[tuple[str, Path, str]]:
        from engines.onnx_utils import sha256_file

        spec = WEIGHTS_FILE_MODELS[model]
        weights = spec.weights()
        digest = sha256_file(weights)
        path = out / f"{spec.stem}.onnx"
        if path.is_file() and _metadata_or_none(path).get("source") == weights_source(weights, digest):  # done before
            return [("onnx", path, " (unchanged)")]
        return [("onnx", spec.export(weights, digest, path), "")]

    return export


def _weights_file_entry(model: str, built: list, int8: Path | None) -> tuple[dict, list[str]]:
    """A weights-file model's entry of the engines folder: its graph (and INT8 copy), the weights file it was
    exported from (name, sha256) and the source its graph records."""
    from engines.onnx_utils import sha256_file

    weights = WEIGHTS_FILE_MODELS[model].weights()
    graphs = {"model": built[0][1].name, **({"model_int8": int8.name} if int8 is not None else {})}
    digest = sha256_file(weights)
    entry = {"model": model, "family": model, "graphs": graphs, "random_weights": False,
             "weights": {"file": weights.name, "sha256": digest}, "source": weights_source(weights, digest)}
    return entry, sorted(graphs.values())


def _metadata_or_none(path: Path) -> dict:
    from engines.onnx_utils import BadModelFileError, metadata

    try:
        return metadata(path)
    except BadModelFileError:
        return {}  # a broken file is exported again


def _octo_onnx(model: str):
    def export(out: Path, args) -> list[tuple[str, Path, str]]:
        if args.onnx_from:
            return _octo_exported(model, Path(args.onnx_from), out, args)
        entry = _unchanged_octo_entry(model, out, args)
        if entry is not None:  # these weights' whole entry is there, untouched: no JAX, no model, no hashing
            args.octo_entries[model], args.octo_reused[model] = entry, entry
            rows = []
            for part in ("backbone", "sampler"):
                path = out / entry["graphs"][part]
                args.rewritten[path] = out / entry["graphs"][f"{part}_ort"]
                rows.append((f"onnx {part}", path, " (unchanged)"))
            return rows
        from engines.optional import require

        for module in ("jax", "jax2onnx", "onnx"):
            require(module, "jax" if module == "jax" else "export")
        from engines.octo.export import export_octo, file_stem, matching_export, params_digest, source_files
        from engines.octo.octo_model import OctoModel

        weights = args.octo_weights.get(model)  # resolved before anything was built (main)
        if weights is not None:  # its errors are one line
            engine = OctoModel.load(model, weights=weights)
        else:
            engine = OctoModel.load(model, random_weights=True, seed=args.seed)
        args.octo_models[model] = engine
        digest = args.params_digests[model] = params_digest(engine.params)
        files = source_files(weights.checkpoint if weights is not None else None)
        onnx = matching_export(out, file_stem(model), digest,  # these weights exported before: nothing to do
                               weights_sha256=files["sha256"] if files else None)
        note = " (unchanged)" if onnx else ""
        if onnx is None:
            onnx = export_octo(engine.cfg, engine.params, out, file_stem(model), source=engine.identity,
                               random_weights=weights is None, digest=digest, progress=True, weights=files)
        return [("onnx backbone", onnx.backbone, note), ("onnx sampler", onnx.sampler, note)]

    return export


def _export_identity() -> dict:
    """What an Octo export's graphs depend on besides the weights: the export format and graph version, and (for
    random weights, drawn by JAX's initialisers) JAX's version."""
    from importlib.metadata import PackageNotFoundError, version

    from engines.octo.export import EXPORT_FORMAT, GRAPH_VERSION

    try:
        jax_version = version("jax")
    except PackageNotFoundError:
        jax_version = None
    return {"format": EXPORT_FORMAT, "graph_version": GRAPH_VERSION, "jax": jax_version}


def _unchanged_octo_entry(model: str, out: Path, args) -> dict | None:
    """Octo's entry of ``out`` when a build would remake it the same: the same weights (the checkpoint files'
    sha256, or the same seeded random weights and JAX), the same export format and graph version, ONNX Runtime
    rewrites of this pass, every instruction embedded, every file untouched since hashed
    (:func:`engines.folder.unchanged_entry`). None: build as usual."""
    from engines.folder import unchanged_entry
    from engines.octo.config import PRESETS, config_to_dict, random_weights_identity
    from engines.octo.deployed import read_embeddings
    from engines.octo.export import source_files
    from engines.octo.optimize import ort_optimized_name
    from env.instructions import all_instructions

    entry = unchanged_entry(out, model)
    if entry is None or entry.get("family") != "octo" or entry.get("export") != _export_identity():
        return None
    weights = args.octo_weights.get(model)
    if weights is not None:
        files = source_files(weights.checkpoint)
        if entry.get("random_weights") or entry.get("checkpoint_files_sha256") != files["sha256"]:
            return None
    elif not (entry.get("random_weights") and entry.get("source") == random_weights_identity(model, args.seed)
              and entry.get("config") == json.loads(json.dumps(config_to_dict(PRESETS[model]())))):  # as stored
        return None
    graphs = entry.get("graphs") or {}
    for name in [g for g in graphs if not g.endswith("_ort")]:  # the rewrite this pass makes of each graph
        source = out / graphs[name]
        expected = ort_optimized_name(source, entry["files"].get(graphs[name], ""))
        if graphs.get(f"{name}_ort") not in (expected, source.name if (out / expected).with_suffix(
                ".unchanged").is_file() else None):
            return None
    try:
        meta, _ = read_embeddings(out / entry["embeddings"])
    except (KeyError, TypeError, ValueError, OSError):
        return None
    if meta.get("t5_sha256") != entry.get("t5_sha256") or not (
            set(all_instructions()) | set(args.instruction or [])) <= set(meta.get("texts") or []):
        return None
    return entry


def _octo_weights(models: list[str], args) -> dict:
    """The released weights (or --checkpoint-<model> DIR) of each Octo model to export, and t5-base's tokenizer,
    resolved before anything is built: cache, else download; one-line errors (engines.hub) with the flag to
    point at a copy."""
    from engines.optional import require

    require("jax", "jax")
    from engines.octo.checkpoint import RANDOM_FLAG, OctoWeights, resolve
    from engines.octo.text import resolve_spiece

    out = {}
    for m in models:
        files = resolve(m, getattr(args, f"checkpoint_{m.replace('-', '_')}"), local_flag=f"--checkpoint-{m} DIR",
                        also=RANDOM_FLAG)
        out[m] = OctoWeights(files, resolve_spiece(files))
    return out


def _octo_exported(model: str, folder: Path, out: Path, args) -> list[tuple[str, Path, str]]:
    """Octo's engines-folder entry as made elsewhere (``python -m engines.build --out DIR`` on a machine with JAX),
    checked (every file's sha256, the ONNX checker, this project's export format) and copied into ``out`` when
    that is another folder; no JAX."""
    import shutil

    from engines import folder as engines_folder
    from engines.octo.export import EXPORT_FORMAT
    from engines.onnx_utils import check_onnx_file, metadata

    try:
        entry = engines_folder.model_entry(folder, model)
    except engines_folder.EnginesFolderError as e:
        raise FileNotFoundError(f"{e} (on a machine with JAX: python -m engines.build --models {model} --out DIR, "
                                f"then copy DIR here)") from None
    engines = entry.get("tensorrt") or {}  # engines built there are for its GPU: never copied
    made_there = set(engines) | {Path(n).with_suffix(".json").name for n in engines}
    entry = {**entry, "tensorrt": {}, "files": {n: sha for n, sha in entry["files"].items() if n not in made_there}}
    if folder.resolve() != out.resolve():
        for name in entry["files"]:
            shutil.copy2(folder / name, out / name)
    args.octo_entries[model] = entry
    rows = []
    graphs = entry.get("graphs") or {}
    for part in ("backbone", "sampler"):
        path = out / graphs[part]
        check_onnx_file(path)
        meta = metadata(path)
        if meta.get("format") != EXPORT_FORMAT:
            raise ValueError(f"{path} is not this project's export ({meta.get('format')!r}, expected {EXPORT_FORMAT!r})"
                             "; export it again with python -m engines.build")
        note = f"; {RANDOM_WEIGHTS_LABEL}" if meta.get("latency_only") == "true" else ""
        rows.append((f"onnx {part}", path, f" (exported elsewhere){note}"))
    return rows


def _octo_entry(model: str, out: Path, built: list, int8: Path | None, args) -> tuple[dict, list[str]]:
    """Octo's entry of the engines folder (:mod:`engines.folder`) and its files: the graphs (and the graphs as ONNX
    Runtime loads them), the architecture, the dataset statistics and the embeddings of every instruction."""
    if model in args.octo_reused:  # nothing changed: the entry as it was, with the INT8 graph made now
        entry = {**args.octo_entries[model], "graphs": dict(args.octo_entries[model]["graphs"])}
        if int8 is not None and model not in args.int8_from_entry:  # made or changed now: its rewrite too
            from engines import quantize
            from engines.octo.optimize import ort_optimized

            entry["graphs"]["backbone_int8"] = int8.name
            entry["graphs"]["backbone_int8_ort"] = ort_optimized(int8, cache=out).name
            entry["int8_calibration_sha256"] = args.int8_calibration.get(model)
            entry["int8_pass"] = quantize.INT8_PASS
        old_graphs = set(args.octo_entries[model]["graphs"].values())
        return entry, sorted((set(entry["files"]) - old_graphs) | set(entry["graphs"].values()))
    if model in args.octo_entries:  # --onnx-from: the entry made where the graphs were exported
        entry = args.octo_entries[model]
        return entry, list(entry["files"])
    import json

    from engines import quantize
    from engines.octo.config import config_to_dict
    from engines.octo.deployed import embeddings_file, statistics_file
    from engines.octo.export import file_stem, params_digest, source_files
    from engines.octo.optimize import ort_optimized

    engine = args.octo_models[model]
    stem = file_stem(model)
    graphs = {part.removeprefix("onnx ").strip(): path.name for part, path, _ in built}
    if int8 is not None:
        graphs["backbone_int8"] = int8.name
    for name in list(graphs):  # the graph as ONNX Runtime loads it, rewritten once here (engines.octo.optimize)
        path = out / graphs[name]
        rewritten = args.rewritten.get(path) or ort_optimized(path, cache=out)
        graphs[f"{name}_ort"] = rewritten.name
    stats = out / statistics_file(stem)
    text = json.dumps(engine.dataset_statistics, indent=1, sort_keys=True) + "\n"
    if not stats.is_file() or stats.read_text() != text:
        stats.write_text(text)
    t5_sha, emb = _embeddings(engine, out / embeddings_file(stem), args.instruction or [])
    weights = engine.weights.to_json() if engine.weights is not None else None
    entry = {"model": model, "family": "octo", "config": config_to_dict(engine.cfg), "graphs": graphs,
             "statistics": stats.name, "embeddings": emb.name, "t5_sha256": t5_sha,
             "params_sha256": args.params_digests.get(model) or params_digest(engine.params), "random_weights": engine.random_weights,
             "source": engine.identity, "weights": weights,
             "checkpoint_files_sha256": source_files(engine.weights.checkpoint)["sha256"] if weights else None,
             "export": _export_identity(), "int8_calibration_sha256": args.int8_calibration.get(model),
             "int8_pass": quantize.INT8_PASS}
    return entry, sorted(set(graphs.values())) + [stats.name, emb.name]


def _embeddings(engine, path: Path, extra: list[str]) -> tuple[str, Path]:
    """T5 embeddings of every instruction the benchmark's task lists say (and ``extra``), kept in ``path`` with the
    T5 weights' and tokenizer's digest; only instructions not there yet (or all, for other T5 weights) are
    encoded."""
    from env.instructions import all_instructions
    from engines.octo.deployed import read_embeddings, text_key, write_embeddings
    from engines.octo.export import t5_digest

    t5_sha = t5_digest(engine)
    texts = sorted(set(all_instructions()) | set(extra))
    have: dict = {}
    if path.is_file():
        try:
            meta, arrays = read_embeddings(path)
            if meta.get("t5_sha256") == t5_sha:
                have = {t: arrays[text_key(t)] for t in meta.get("texts", []) if text_key(t) in arrays}
        except ValueError:
            have = {}
    if set(texts) <= set(have):
        return t5_sha, path
    for t in texts:
        if t not in have:
            have[t] = engine.embed(t)
    write_embeddings(path, have, t5_sha)
    return t5_sha, path


class Skipped(Exception):
    """An artifact this machine cannot or need not build; the message is the reason shown."""


STAGE_TIMES_FILE = "build_stages.json"
EXPORTS = {**{m: _weights_file_onnx(m) for m in WEIGHTS_FILE_MODELS}, "octo-small": _octo_onnx("octo-small"),
           "octo-base": _octo_onnx("octo-base")}
# the models engines.calibration records an INT8 calibration set for (octo-base takes octo-small's)
CALIBRATED = ("bc-state", "octo-small", "octo-base")
ORT_PRECISIONS = ("fp32", "int8", "bf16")


def _calibration(model: str, timer: "StageTimer", folder: str | None, jobs: dict, progress: bool = True):
    """The model's calibration set, recorded from dev tries only when the recording is missing or was made
    from other inputs (engines.calibration: model, tries, task list, appearance, ...). A recording started
    before the exports (``jobs``, by its file: :func:`_start_recordings`) is waited for; the stage's time is
    the wait, its note the recording's own time."""
    from engines import quantize
    from engines.calibration import calibration_path, start_calibration

    with timer.stage(model, "calibration recording") as st:
        where = calibration_path(model, Path(folder) if folder else None)
        job = jobs.pop(where, None) or start_calibration(model, Path(folder) if folder else None, progress=progress)
        path, recorded = job.wait()
        took = f"{job.seconds:.1f} s" if job.seconds is not None else "time not recorded"
        if recorded and job.t0 < st.t0:  # its own seconds, beside the exports (the stage's are the wait)
            st.background_s = job.seconds
        st.note = (f"recorded ({took}, beside the exports)" if recorded and job.t0 < st.t0 else
                   f"recorded ({took})" if recorded else "cached")
    if model == "bc-state":
        return quantize.bc_calibration(path)
    from engines.octo.config import PRESETS

    return quantize.octo_calibration(PRESETS[model](), path)


class StageTimer:
    """Wall seconds of each (model, stage) of a build, and whether the stage did work or found it cached. A stage
    whose work ran in a process of its own beside the others (the calibration recording) has that work's own
    seconds in ``background_s``; its ``s`` is the time the build waited for it."""

    STAGES = ("export", "optimise", "calibration recording", "quantise", "tensorrt")

    def __init__(self) -> None:
        self.rows: list[dict] = []

    @contextlib.contextmanager
    def stage(self, model: str, stage: str):
        t0 = time.monotonic()
        row = types.SimpleNamespace(note="", t0=t0)
        try:
            yield row
        finally:
            self.rows.append({"model": model, "stage": stage, "s": round(time.monotonic() - t0, 2),
                              "note": row.note, **({"background_s": row.background_s}
                                                   if getattr(row, "background_s", None) is not None else {})})

    def totals(self) -> dict[str, float]:
        return {st: round(sum(r["s"] for r in self.rows if r["stage"] == st), 2) for st in self.STAGES}


def _start_recordings(models: list[str], args, ort_precisions: list[str]) -> dict:
    """The calibration recordings the INT8 graphs of ``models`` will need, started now in processes of their own
    (the simulator, no model) so that they run while the exports do: {recording file: CalibrationJob}."""
    from engines import quantize
    from engines.calibration import start_calibration

    if "int8" not in ort_precisions or args.onnx_from:
        return {}
    jobs = {}
    for m in models:
        if m in quantize.INT8_REFUSED or m not in CALIBRATED:
            continue
        job = start_calibration(m, Path(args.queries_dir) if args.queries_dir else None, progress=True)
        if job.recorded:
            jobs[job.path] = job
        if m in ("octo-small", "octo-base"):
            break  # one recording serves both Octo models
    return jobs


def _int8(name: str, built: list[tuple[str, Path, str]], timer: StageTimer, queries: str | None,
          jobs: dict, args, onnx_from: str | None = None) -> tuple[str, Path]:
    """(artifact, path) of the INT8 Q/DQ graph of the model's quantized graph (Octo: the backbone). With
    ``onnx_from`` (no JAX here to record calibration queries) Octo's INT8 graph must come with the fp32 ones.
    An Octo entry found unchanged (``args.octo_reused``) that lists the INT8 graph of this pass and calibration
    keeps it without reading a graph."""
    from engines import quantize
    from engines.onnx_utils import metadata, sha256_file

    part, path = next((a, p) for a, p, _ in built if a in ("onnx", "onnx backbone"))
    artifact = f"onnx int8{part.removeprefix('onnx')}"
    reused = args.octo_reused.get(name)
    if name not in CALIBRATED:  # never a calibration set of another model
        raise Skipped(f"{name} has no INT8 calibration set (engines.calibration records {', '.join(CALIBRATED)}'s)")
    if name in WEIGHTS_FILE_MODELS:
        digest = sha256_file(WEIGHTS_FILE_MODELS[name].weights())
    elif reused is not None:
        digest = reused["params_sha256"]
    else:
        digest = metadata(path)["params_sha256"]
        if onnx_from:
            q = quantize.int8_name(path)
            if not q.is_file():
                raise Skipped(f"no {q}: its calibration queries come from JAX rollouts; build it where the graphs "
                              f"were exported (python -m engines.build --models {name}) and copy {q.name} beside them")
            if not quantize.int8_matches(q, digest, source=path):
                raise ValueError(f"{q} is not the INT8 graph of {path.name}'s weights (or of another export or "
                                 "quantization pass); build both again where they were exported")
            return artifact, q
    calibration = _calibration(name, timer, queries, jobs)
    args.int8_calibration[name] = calibration.sha256
    with timer.stage(name, "quantise") as st:
        q = quantize.int8_name(path)
        if (reused is not None and reused["graphs"].get("backbone_int8") == q.name
                and reused.get("int8_calibration_sha256") == calibration.sha256
                and reused.get("int8_pass") == quantize.INT8_PASS):
            st.note = "cached"
            args.int8_from_entry.add(name)
            return artifact, q
        fresh = not quantize.int8_matches(q, digest, calibration.sha256, source=path)
        st.note = "built" if fresh else "cached"
        return artifact, quantize.int8_graph(path, calibration, weights_digest=digest)


def main(argv=None) -> int:
    from env.cache import hashes_remembered

    with hashes_remembered():  # every file written and listed here is read once to hash it
        return _build(argv)


def _build(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engines.build", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--models", help=f"comma-separated, of: {', '.join(EXPORTS)} (default: all, where a model whose "
                   "weights file is missing is listed as skipped with the command that trains it; named here, that "
                   "is an error)")
    p.add_argument("--precisions", default="fp32,fp16", help="TensorRT precisions (fp32, fp16, int8, fp8)")
    p.add_argument("--ort-precisions", default=",".join(ORT_PRECISIONS), help="ONNX Runtime graphs: fp32 (the "
                   "export), int8 (its Q/DQ copy, calibrated on dev tries), bf16 (listed as skipped: no CPU kernels)")
    p.add_argument("--batch-max", type=int, default=None, help="largest batch of the TensorRT optimisation profile "
                   "(default: the one a run's profile has, engines.backends.MODEL_RUNTIMES: bc-state 256, bc-camera "
                   "and Octo 64)")
    p.add_argument("--instruction", action="append", metavar="TEXT", help="Octo: also compute the T5 embedding of "
                   "this instruction (repeatable; every instruction of the benchmark's task lists is always there)")
    p.add_argument("--checkpoint-octo-small", metavar="DIR", help="a local copy of octo-small-1.5 (default: the "
                   "released weights, from the Hugging Face cache or downloaded into it)")
    p.add_argument("--checkpoint-octo-base", metavar="DIR", help="a local copy of octo-base-1.5 (default: the "
                   "released weights)")
    p.add_argument("--random-weights", action="store_true", help="Octo from seeded random weights of the exact "
                   "architecture: latency only, success meaningless")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--onnx-from", metavar="DIR", help="Octo's graphs exported elsewhere (<model>_backbone.onnx, "
                   "<model>_sampler.onnx): build their engines without JAX")
    p.add_argument("--queries-dir", metavar="DIR", help="where the calibration recordings are kept (default "
                   "build/octo_queries/)")
    args = p.parse_args(argv)
    named = args.models is not None  # --models given: each model it names must be built
    models = [m.strip() for m in (args.models if named else ",".join(EXPORTS)).split(",") if m.strip()]
    if not models:  # an empty list would build nothing and exit 0
        print(f"error: --models names no model; give one or more of: {', '.join(EXPORTS)}", file=sys.stderr)
        return 2
    unknown = [m for m in models if m not in EXPORTS]
    if unknown:
        print(f"error: unknown model {', '.join(unknown)}; valid: {', '.join(EXPORTS)}", file=sys.stderr)
        return 2
    if args.batch_max is not None and args.batch_max < 1:
        print(f"error: --batch-max must be at least 1, got {args.batch_max}", file=sys.stderr)
        return 2
    if not args.out.strip():  # Path("") is the current folder: the build would land in the repository root
        print("error: --out is empty; name the engines folder (default build/engines)", file=sys.stderr)
        return 2
    # a weights-file model without its file: asked for by name, the build stops before anything is built; in the
    # default list its row says skipped, why, and the command that trains them
    unweighted = {m: why for m in models if m in WEIGHTS_FILE_MODELS and (why := missing_weights(m))}
    if named and unweighted:
        print(f"error: {next(iter(unweighted.values()))}", file=sys.stderr)
        return 2
    # an Octo option that no model of --models takes would be silently ignored
    has_octo = any(m in ("octo-small", "octo-base") for m in models)
    takers = {"--checkpoint-octo-small": ("octo-small", "octo-small" in models),
              "--checkpoint-octo-base": ("octo-base", "octo-base" in models),
              "--random-weights": ("an Octo model", has_octo), "--onnx-from": ("an Octo model", has_octo),
              "--instruction": ("an Octo model", has_octo)}
    for flag, (who, taken) in takers.items():
        if getattr(args, flag[2:].replace("-", "_")) and not taken:
            print(f"error: {flag} applies to {who}, which --models {','.join(models)} does not name", file=sys.stderr)
            return 2
    from dataclasses import asdict

    from engines import quantize, trt
    from engines.backends import MODEL_RUNTIMES, model_family
    from engines.folder import add_files, write_entry

    precisions = [x for x in args.precisions.split(",") if x]
    bad = [x for x in precisions if x not in trt.PRECISIONS]
    if bad:
        print(f"error: unknown precision {', '.join(bad)}; valid: {', '.join(trt.PRECISIONS)}", file=sys.stderr)
        return 2
    ort_precisions = [x for x in args.ort_precisions.split(",") if x]
    bad = [x for x in ort_precisions if x not in ORT_PRECISIONS]
    if bad:
        print(f"error: unknown ONNX Runtime precision {', '.join(bad)}; valid: {', '.join(ORT_PRECISIONS)}",
              file=sys.stderr)
        return 2
    octo = [m for m in models if m in ("octo-small", "octo-base")]
    if args.random_weights and any(getattr(args, f"checkpoint_{m.replace('-', '_')}") for m in octo):
        print("error: --random-weights excludes --checkpoint-octo-small/--checkpoint-octo-base", file=sys.stderr)
        return 2
    args.octo_weights = {}
    args.octo_models, args.octo_entries = {}, {}  # Octo models loaded for the folder's entries; entries made elsewhere
    args.octo_reused = {}  # ... of these, the entries this build found unchanged (no model loaded)
    args.params_digests = {}  # each loaded model's parameters' digest, computed once
    args.int8_calibration, args.int8_from_entry = {}, set()  # the INT8 graphs' calibration; those kept as listed
    args.rewritten = {}  # graph -> its ONNX Runtime rewrite, made in the optimise stage
    weights_rows = []
    if octo and not args.random_weights and not args.onnx_from:
        from engines.hub import HubError
        from engines.octo.errors import OctoError
        from engines.optional import MissingDependencyError

        try:
            args.octo_weights = _octo_weights(octo, args)
        except (HubError, OctoError, MissingDependencyError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        weights_rows += [(m, "weights", "resolved", f.checkpoint.where + (f" in {f.checkpoint.folder}"
                                                                           if f.checkpoint.repo else ""))
                         for m, f in args.octo_weights.items()]
    elif octo and args.random_weights:
        weights_rows += [(m, "weights", "random", f"seed {args.seed}") for m in octo]
    random_models = set(octo) if args.random_weights else set()  # every row of theirs says so
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timer = StageTimer()
    t_build = time.monotonic()
    reason = trt.unavailable_reason()
    # the calibration recording runs beside the exports (its own process: the simulator, no model), and every
    # model is exported before anything is quantized, so that the recording is done when its graphs need it
    jobs = _start_recordings([m for m in models if m not in unweighted], args, ort_precisions)
    by_model: dict[str, list] = {name: [] for name in models}  # the table's rows, model by model
    exported: dict[str, list] = {}
    try:
        for name in models:
            if name in unweighted:
                by_model[name].append((name, "onnx", "skipped", unweighted[name]))
                continue
            try:
                with timer.stage(name, "export"):
                    built = EXPORTS[name](out, args)
                if name in ("octo-small", "octo-base") and not args.onnx_from:
                    from engines.octo.optimize import ort_optimized

                    with timer.stage(name, "optimise"):  # the load-time rewrite ONNX Runtime runs, into the folder
                        for _, path, _ in built:
                            args.rewritten[path] = args.rewritten.get(path) or ort_optimized(path, cache=out)
            except Skipped as e:
                by_model[name].append((name, "onnx", "skipped", str(e)))
                continue
            except Exception as e:  # noqa: BLE001 - reported in the table, the run goes on
                by_model[name].append((name, "onnx", "failed", (str(e).strip().splitlines() or [type(e).__name__])[0]))
                continue
            if any(RANDOM_WEIGHTS_LABEL in note for *_, note in built):
                random_models.add(name)
            by_model[name] += [(name, artifact, "built", f"{path}{note}") for artifact, path, note in built]
            exported[name] = built
        for name, built in exported.items():
            rows = by_model[name]
            int8 = None
            if "int8" in ort_precisions and name in quantize.INT8_REFUSED:
                rows.append((name, "onnx int8", "skipped", quantize.INT8_REFUSED[name]))
            elif "int8" in ort_precisions:
                try:
                    artifact, path = _int8(name, built, timer, args.queries_dir, jobs, args,
                                           args.onnx_from if name in ("octo-small", "octo-base") else None)
                    rows.append((name, artifact, "built", str(path)))
                    int8 = path
                except Skipped as e:
                    rows.append((name, "onnx int8", "skipped", str(e)))
                except Exception as e:  # noqa: BLE001
                    rows.append((name, "onnx int8", "failed", (str(e).strip().splitlines() or [type(e).__name__])[0]))
            if "bf16" in ort_precisions:
                from engines.quantize import ort_bf16_reason

                rows.append((name, "onnx bf16", "skipped", ort_bf16_reason() or "this project builds no bf16 graph"))
            try:  # the folder's entry first: the run reads it (engines.folder); the engines are added as built
                entry, files = (_weights_file_entry(name, built, int8) if name in WEIGHTS_FILE_MODELS
                                else _octo_entry(name, out, built, int8, args))
                write_entry(out, name, entry, files)
            except Exception as e:  # noqa: BLE001
                rows.append((name, "manifest", "failed", (str(e).strip().splitlines() or [type(e).__name__])[0]))
                continue
            batch_max = args.batch_max or MODEL_RUNTIMES[model_family(name)].trt_batch_max  # what a run's profile is
            for artifact, path, _ in built:
                part = artifact.removeprefix("onnx").strip()
                for precision in precisions:
                    label = f"tensorrt {precision}" + (f" {part}" if part else "")
                    if reason:
                        rows.append((name, label, "skipped", reason))
                        continue
                    if precision == "int8" and name in quantize.INT8_REFUSED:  # no engine a run would refuse
                        rows.append((name, label, "skipped", quantize.INT8_REFUSED[name]))
                        continue
                    graph = path
                    if precision == "int8" and int8 is not None and quantize.int8_name(path) == int8:
                        graph = int8  # TensorRT's INT8 from the Q/DQ graph, as a run asks for it
                    try:
                        with timer.stage(name, "tensorrt"):
                            engine = trt.build_engine(graph, out, graph.stem, precision, batch_max,
                                                      timing_cache=out / "timing.cache")
                        key = trt.read_sidecar(engine)
                        add_files(out, name, {engine.name: asdict(key), engine.with_suffix(".json").name: None},
                                  key="tensorrt")
                        rows.append((name, label, "built", str(engine)))
                    except Exception as e:  # noqa: BLE001
                        rows.append((name, label, "failed", (str(e).strip().splitlines() or [type(e).__name__])[0]))
    finally:  # a build that failed or was interrupted leaves no recording running
        for job in jobs.values():
            job.cancel()
    rows = weights_rows + [r for name in models for r in by_model[name]]
    width = [max(len(r[i]) for r in rows + [("model", "artifact", "status", "where / why")]) for i in range(3)]
    print(f"{'model':<{width[0]}}  {'artifact':<{width[1]}}  {'status':<{width[2]}}  where / why")
    for r in rows:
        marked = r[0] in random_models and r[2] in ("built", "random") and RANDOM_WEIGHTS_LABEL not in r[3]
        note = f"; {RANDOM_WEIGHTS_LABEL}" if marked else ""
        print(f"{r[0]:<{width[0]}}  {r[1]:<{width[1]}}  {r[2]:<{width[2]}}  {r[3]}{note}")
    total = round(time.monotonic() - t_build, 2)
    print(f"\nstage seconds (total {total:.1f} s): "
          + ", ".join(f"{k} {v:.1f}" for k, v in timer.totals().items()))
    for r in timer.rows:
        print(f"  {r['model']:<12} {r['stage']:<22} {r['s']:>7.1f} s  {r['note']}")
    # the stage times of this build, for benchmarks.engines_build (and a reader wondering where the time went)
    (out / STAGE_TIMES_FILE).write_text(json.dumps({"total_s": total, "stages_s": timer.totals(),
                                                    "rows": timer.rows}, indent=1) + "\n")
    return 1 if any(r[2] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
