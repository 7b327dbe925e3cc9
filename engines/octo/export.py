"""Octo to ONNX with jax2onnx: the observation backbone and the unrolled diffusion sampler, two graphs.

    from engines.octo.export import export_octo
    onnx = export_octo(cfg, params, "build/engines", "octo_small")   # -> OctoOnnx(backbone, sampler)

Graphs (batch dimension ``B`` dynamic, every other dimension fixed):

- ``<name>_backbone.onnx``: ``image_<camera>`` uint8 (B, window, H, W, 3) per
  camera in config order, ``lang_embedding`` float32 (B, lang_tokens, d_t5),
  ``masks`` float32 (B, window, 1 + cameras) and ``lang_mask`` float32 (B,)
  in, then ``goal_<camera>`` uint8 (B, H, W, 3) per camera that stacks a goal
  image (all zeros: language only, as upstream's absent goal); ``readout``
  float32 (B, d) out. Image normalisation is inside the graph; the structural
  attention mask is a constant, only the padding masks are inputs.
- ``<name>_sampler.onnx``: ``readout`` (B, d), ``init_noise`` (B, horizon*dim)
  and ``step_noise`` (B, steps, horizon*dim) in; ``actions`` (B, horizon, dim)
  normalised out. The 20 reverse-diffusion steps are unrolled (no Loop node) and
  all noise comes in as inputs: jax2onnx lowers random sampling wrongly, and
  equal noise is what makes backends comparable. ``step_noise`` is batch-first
  (JAX's sampler takes steps-first) so that TensorRT profiles see the batch on
  axis 0 of every input.

Weights are baked in as initializers. Metadata records the exporter, opset,
jax version, model, part, a sha256 of the parameters, whether the weights
are random (``latency_only``) and, for loaded weights, the files they came
from (``weights``: repo, commit and each file's sha256; ``weights_sha256``
their digest), so that a TensorRT engine's key (the graph's sha256) holds them
too. :func:`onnx_for_octo` exports an
:class:`~engines.octo.octo_model.OctoModel`'s model once and reuses it (cache
keyed by the parameter digest and the files' digest); :class:`engines.octo.runners.OnnxOcto` runs the
two graphs behind any pair of graph runners.

jax2onnx is imported only when exporting.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from engines.octo.config import OctoConfig
from engines.optional import require

EXPORT_FORMAT = "shape-assembly-bench/octo-onnx/2"  # bump when the graphs' interface changes (2: goal_<camera>)
# bump when the exported computation changes with the same interface: an export of another version is made
# again (2: the backbone's grouped attention, engines.octo.model.grouped_attention)
GRAPH_VERSION = "2"
DEFAULT_OPSET = 18  # ReduceMean with axes as input (jax2onnx emits it); TensorRT 8.6+/10 and ORT >= 1.14 read it
BATCH = "B"
BUILD_DIR = Path(__file__).resolve().parents[2] / "build" / "engines"  # `make engines` writes here (engines.build)


@dataclass(frozen=True)
class OctoExportConfig:
    opset: int = DEFAULT_OPSET
    batch_dim: str = BATCH  # name of the symbolic batch dimension


@dataclass(frozen=True)
class OctoOnnx:
    """The two exported graphs of one model."""

    backbone: Path
    sampler: Path

    def exists(self) -> bool:
        return self.backbone.is_file() and self.sampler.is_file()


# ------------------------------------------------------------------ interface of the graphs
def goal_input_names(cfg: OctoConfig) -> list[str]:
    return [f"goal_{c.name}" for c in cfg.cameras if c.stack_task_image]


def backbone_input_names(cfg: OctoConfig) -> list[str]:
    return [f"image_{c.name}" for c in cfg.cameras] + ["lang_embedding", "masks", "lang_mask"] + goal_input_names(cfg)


SAMPLER_INPUTS = ("readout", "init_noise", "step_noise")


def backbone_feeds(cfg: OctoConfig, images: Sequence[Any], masks, lang, lang_mask=None,
                   goals=None) -> dict[str, np.ndarray]:
    """Feeds of the backbone graph from ``OctoModel.predict``'s arguments (``goals``: {camera: uint8 goal
    image}, :func:`engines.octo.arrays.goal_arrays`; a camera without one is fed zeros).

    A feed that already has the graph's dtype, shape and C layout is passed on as the same object (no copy), so
    an array a policy keeps for a try (the language embedding, a goal image, read-only) reaches the runner as
    itself and TensorRT copies it to the device once (:class:`engines.runners.TensorRtRunner`); the all-ones
    language mask and the zero goal images are read-only arrays made once per batch size
    (:func:`constant_feed`), not new arrays per query."""
    b = np.asarray(masks).shape[0]
    # a GPU frame (``__cuda_array_interface__``) stays on the device, for a runner that binds it by address
    feeds = {f"image_{c.name}": img if hasattr(img, "__cuda_array_interface__") else np.ascontiguousarray(img, np.uint8)
             for c, img in zip(cfg.cameras, images)}
    lang_shape = (b, *np.shape(lang)[1:])
    feeds["lang_embedding"] = (np.ascontiguousarray(lang, np.float32) if np.shape(lang) == lang_shape  # as it is
                               else np.ascontiguousarray(np.broadcast_to(np.asarray(lang, np.float32), lang_shape)))
    feeds["masks"] = np.ascontiguousarray(masks, np.float32)
    feeds["lang_mask"] = (constant_feed((b,), "float32", 1.0) if lang_mask is None
                          else np.ascontiguousarray(lang_mask, np.float32))
    from engines.octo.arrays import goal_arrays

    given = goal_arrays(cfg, goals, b) or {}
    for c in cfg.cameras:
        if c.stack_task_image:
            feeds[f"goal_{c.name}"] = given.get(c.name, constant_feed((b, *c.image_size, 3), "uint8", 0))
    return feeds


@functools.lru_cache(maxsize=32)
def constant_feed(shape: tuple[int, ...], dtype: str, value: float) -> np.ndarray:
    """A read-only array of ``shape`` filled with ``value``, one object per (shape, dtype, value): the same
    object on every query, which a TensorRT runner copies to the device once (a batch size's zero goal images,
    its all-ones language mask)."""
    a = np.full(shape, value, np.dtype(dtype))
    a.setflags(write=False)
    return a


def sampler_feeds(readout, init_noise, step_noise) -> dict[str, np.ndarray]:
    """``step_noise`` as JAX takes it (steps, B, flat) -> batch-first for the graph."""
    return {"readout": np.ascontiguousarray(readout, np.float32),
            "init_noise": np.ascontiguousarray(init_noise, np.float32),
            "step_noise": np.ascontiguousarray(np.swapaxes(np.asarray(step_noise, np.float32), 0, 1))}


# ------------------------------------------------------------------ the functions exported
def backbone_fn(cfg: OctoConfig, params) -> Callable:
    """``f(*images, lang_embedding, masks, lang_mask, *goals) -> readout`` with the weights closed over."""
    from engines.octo.model import goal_cameras, make_backbone

    backbone = make_backbone(cfg)
    n = len(cfg.cameras)
    goal_names = goal_cameras(cfg)

    def f(*args):
        goals = dict(zip(goal_names, args[n + 3:]))
        return backbone(params, list(args[:n]), args[n], args[n + 1], args[n + 2], goals=goals)

    return f


def sampler_fn(cfg: OctoConfig, params) -> Callable:
    """The sampler unrolled: ``f(readout, init_noise, step_noise (B, steps, flat)) -> actions (B, horizon, dim)``.

    Same steps as :func:`engines.octo.model.make_sampler` (a ``lax.scan``), one
    Python iteration per step with ``t`` a constant, so the schedule folds into
    constants and no Loop node is needed.
    """
    from engines.octo.model import make_denoise_step

    step = make_denoise_step(cfg)

    def f(readout, init_noise, step_noise):
        x = init_noise
        for i in range(cfg.diffusion_steps):
            x = step(params, readout, x, cfg.diffusion_steps - 1 - i, step_noise[:, i])
        return x.reshape(x.shape[0], cfg.action_horizon, cfg.action_dim)

    return f


# ------------------------------------------------------------------ export
def params_digest(params) -> str:
    """sha256 over the parameter tree (names, shapes, dtypes, values); the T5 encoder is left out. Names are
    taken in sorted order: the same weights hash alike whatever order their dicts were built in (a tree that
    went through ``jax.tree_util`` comes back with its keys sorted)."""
    from engines.octo.params import flatten, without_t5

    h = hashlib.sha256()
    for name, value in sorted(flatten(without_t5(params)), key=lambda item: item[0]):
        a = np.ascontiguousarray(np.asarray(value))
        h.update(f"{name}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def t5_digest(engine) -> str:
    """sha256 over what an instruction's embedding depends on: the T5 encoder's parameters (names, shapes, dtypes,
    values, in sorted order) and the tokenizer (its spiece.model's sha256, or the random-weights hash tokenizer)."""
    from engines.octo.params import flatten

    h = hashlib.sha256()
    for name, value in sorted(flatten(engine.t5_params), key=lambda item: item[0]):
        a = np.ascontiguousarray(np.asarray(value))
        h.update(f"{name}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    tok = engine.weights.tokenizer.digest if engine.weights is not None else None
    h.update(f"tokenizer|{tok or type(engine.tokenizer).__name__}".encode())
    return h.hexdigest()


def _quiet_exporter() -> None:
    # onnx_ir logs one warning per untyped shape constant; thousands of lines that say nothing
    for name in ("onnx_ir.serde", "onnx_ir", "jax2onnx"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _prune_initializers(model) -> None:
    """Drop initializers no node reads (jax2onnx leaves some behind; ORT warns about each)."""
    used = {i for n in model.graph.node for i in n.input}
    used |= {o.name for o in model.graph.output}

    def walk(graph):
        for n in graph.node:
            for a in n.attribute:
                if a.g is not None and a.g.ByteSize():
                    used.update(i for m in a.g.node for i in m.input)
                    walk(a.g)

    walk(model.graph)
    keep = [t for t in model.graph.initializer if t.name in used]
    if len(keep) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)


def _export(fn: Callable, specs: list, input_names: list[str], output_names: list[str], path: Path,
            meta: dict[str, str], opset: int, model_name: str) -> Path:
    jax2onnx = require("jax2onnx", "export")
    onnx = require("onnx", "export")
    import jax

    from engines.octo.jax2onnx_fast import fast_output_check
    from engines.onnx_utils import check_onnx_file, gc_paused

    _quiet_exporter()
    # the same graph, without jax2onnx's quadratic output scan; no cyclic collections of the tracing's objects
    with fast_output_check(), gc_paused():
        model = jax2onnx.to_onnx(fn, specs, model_name=model_name, opset=opset, input_names=input_names,
                                 output_names=output_names)
    _prune_initializers(model)
    version = getattr(jax2onnx, "__version__", None)
    if version is None:
        from importlib.metadata import version as _v

        version = _v("jax2onnx")
    props = {"format": EXPORT_FORMAT, "graph_version": GRAPH_VERSION, "exporter": f"jax2onnx {version}",
             "jax": jax.__version__,
             "opset": str(opset), **meta}
    for k, v in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = k, str(v)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, path)  # a reader never sees half a file
    check_onnx_file(path)
    return path


def source_files(files) -> dict | None:
    """What an export keeps of the checkpoint files (:class:`engines.hub.Files`) its parameters came from: their
    repo and commit (or folder), each one's sha256 and their digest (None: random weights)."""
    return None if files is None else {"sha256": files.digest, **files.to_json()}


def export_octo(cfg: OctoConfig, params, out_dir: str | Path, name: str, *, source: str = "",
                random_weights: bool = False, export: OctoExportConfig = OctoExportConfig(),
                digest: str | None = None, progress: bool = False, weights: dict | None = None) -> OctoOnnx:
    """Export the backbone and the unrolled sampler of ``cfg`` with ``params`` to ``out_dir``; ``weights``: the
    files they were loaded from (:func:`source_files`), kept in the metadata."""
    import json

    import jax
    import jax.numpy as jnp
    from jax import export as jax_export

    from engines.octo.params import without_t5

    params = jax.tree_util.tree_map(jnp.asarray, without_t5(params))
    digest = digest or params_digest(params)
    (b,) = jax_export.symbolic_shape(export.batch_dim)

    def spec(*shape, dtype=jnp.float32):
        return jax.ShapeDtypeStruct((b, *shape), dtype)

    out_dir = Path(out_dir)
    meta = {"model": cfg.name, "params_sha256": digest, "source": source,
            "latency_only": "true" if random_weights else "false",
            "note": "random weights: latency only, success meaningless" if random_weights else "",
            "weights_sha256": weights["sha256"] if weights else "",
            "weights": json.dumps(weights, sort_keys=True) if weights else ""}
    bb_specs = [spec(cfg.window, *c.image_size, 3, dtype=jnp.uint8) for c in cfg.cameras]
    bb_specs += [spec(cfg.lang_tokens, cfg.t5.d_model), spec(cfg.window, 1 + len(cfg.cameras)), spec()]
    bb_specs += [spec(*c.image_size, 3, dtype=jnp.uint8) for c in cfg.cameras if c.stack_task_image]
    flat = cfg.flat_action_dim
    sm_specs = [spec(cfg.token_dim), spec(flat), spec(cfg.diffusion_steps, flat)]
    jobs = [
        ("backbone", backbone_fn(cfg, params), bb_specs, backbone_input_names(cfg), ["readout"]),
        ("sampler", sampler_fn(cfg, params), sm_specs, list(SAMPLER_INPUTS), ["actions"]),
    ]
    paths = {}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(jobs, desc=f"export {cfg.name}", unit="graph", leave=False)
    for part, fn, specs, ins, outs in (bar if bar is not None else jobs):
        paths[part] = _export(fn, specs, ins, outs, out_dir / f"{name}_{part}.onnx",
                              {**meta, "part": part}, export.opset, f"{name}_{part}")
    return OctoOnnx(paths["backbone"], paths["sampler"])


def file_stem(model: str) -> str:
    return model.replace("-", "_")


def matching_export(folder: Path, stem: str, digest: str, sealed: bool = False,
                    weights_sha256: str | None = None) -> OctoOnnx | None:
    """An export in ``folder`` whose metadata says it holds these weights (the parameters' digest and, for loaded
    weights, the digest of the files they came from) in this format, else None. A file
    that cannot be read is said in one line naming it; ``sealed`` (a cache folder): a damaged entry is removed
    (:func:`engines.cache.reuse`) and exported again by the caller."""
    from engines.cache import reuse
    from engines.onnx_utils import BadModelFileError, metadata

    found = OctoOnnx(folder / f"{stem}_backbone.onnx", folder / f"{stem}_sampler.onnx")
    if not found.exists():
        return None
    if sealed and not all([reuse(p, "ONNX export") for p in (found.backbone, found.sampler)]):
        return None
    try:
        for p in (found.backbone, found.sampler):
            m = metadata(p)
            if (m.get("params_sha256") != digest or m.get("format") != EXPORT_FORMAT
                    or m.get("graph_version") != GRAPH_VERSION):
                return None
            if (m.get("weights_sha256") or None) != weights_sha256:
                return None
    except BadModelFileError as e:  # make engines' output, damaged: named, and not used
        print(f"{str(e).split(';')[0]}: delete it or rebuild it with make engines; exporting these weights into "
              f"the cache meanwhile", file=sys.stderr)
        return None
    return found


def onnx_for_octo(engine, search: Sequence[Path] = (BUILD_DIR,), progress: bool = True) -> OctoOnnx:
    """The ONNX graphs of an engine's model: from ``make engines``' folder or the cache when the weights
    match, else exported into the cache once (keyed by the parameter digest, sealed: :mod:`engines.cache`)."""
    import tempfile

    from engines.cache import onnx_dir, write_sealed

    digest = params_digest(engine.params)
    loaded = getattr(engine, "weights", None)  # the graphs hold the checkpoint's files, not the tokenizer's
    weights = source_files(loaded.checkpoint if loaded is not None else None)
    files = weights["sha256"] if weights else None
    stem = file_stem(engine.cfg.name)
    for folder in search:
        hit = matching_export(Path(folder), stem, digest, weights_sha256=files)
        if hit:
            return hit
    folder = onnx_dir()
    keyed = f"{stem}_{digest[:16]}_f{EXPORT_FORMAT.rsplit('/', 1)[-1]}"  # graphs of an older format: other files
    if files:
        keyed += f"_w{files[:12]}"
    hit = matching_export(folder, keyed, digest, sealed=True, weights_sha256=files)
    if hit:
        return hit
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".export-") as tmp:  # then each graph moved in, sealed
        made = export_octo(engine.cfg, engine.params, tmp, keyed, source=engine.identity,
                           random_weights=engine.random_weights, digest=digest, progress=progress, weights=weights)
        return OctoOnnx(*(write_sealed(folder / p.name, lambda t, p=p: os.replace(p, t))
                          for p in (made.backbone, made.sampler)))

