"""The one backend factory: a model and a :class:`BackendSpec` (backend, precision, batch profile, threads) give
an activated runner with the ``activate`` / ``infer`` / ``deactivate`` interface. Policies receive the runner
(the model table in :mod:`eval.policies` assembles them); none builds its own.

- :func:`model_runner`: a model's runner. bc-state (a weights file): ``ort``, ``trt`` or ``torch``; Octo: from
  the engines folder (a :class:`~engines.octo.deployed.DeployedOcto`, what a run uses: no JAX) ``ort`` or
  ``trt`` (its two graphs), or from a loaded :class:`~engines.octo.octo_model.OctoModel` ``jax`` (the jitted
  model, on the CPU or on the GPU where JAX has CUDA: the GPU engine where TensorRT is absent) or ``ort`` (its
  graphs exported on first use: tests and benchmarks).
- :func:`make_runner`: one exported ONNX graph on a graph backend. ``ort``: ONNX Runtime on the CPU
  (``threads`` intra-op threads; None: the cores this process may use); ``trt``: the TensorRT engine ``make
  engines`` built from the graph into the engines folder (:mod:`engines.folder`) for this GPU, TensorRT version,
  precision and optimisation profile of batch 1..``max_batch`` (opt 1), found by that key and checked against
  its sidecar (:func:`engines.trt.find_engine`). A run builds no engine: a missing or foreign one is one line
  naming the command that builds it.

Precision applies to ``ort`` too (:mod:`engines.quantize`): ``int8`` runs the Q/DQ INT8 graph ``make engines``
built beside the fp32 one (Octo: the backbone; its sampler, 1% of a query, stays fp32); on ``trt``, ``int8``
builds its engine from that same Q/DQ graph where one exists. ``bf16`` on ``ort`` is refused in one line
(ONNX Runtime's CPU provider has no bfloat16 MatMul/Gemm kernels), as is every precision on ``jax``/``torch``
but fp32.

:func:`rel_err` is the one measure of output agreement between backends that tests and device checks use;
where exports and engines are cached is :mod:`engines.cache`.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GRAPH_BACKENDS = ("ort", "trt")  # run an exported ONNX graph
BACKENDS = ("jax", "ort", "trt", "torch")
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")  # what --precision names (each backend runs some)


@dataclass(frozen=True)
class FamilyRuntime:
    """How a model family runs: its backends (the first its default), its TensorRT precision when none is asked
    for, the largest batch of its TensorRT profile (every --num-envs batch up to it), ONNX Runtime threads."""

    backends: tuple[str, ...]
    trt_precision: str
    trt_batch_max: int
    ort_threads: int | None = None
    # Octo's sampler (68 MFLOP a query over ten ~0.1 ms denoising steps): one thread, so its session has no
    # thread pool of its own spinning against the backbone's on the same cores (benchmarks.octo_ort_vs_jax)
    ort_sampler_threads: int | None = None


MODEL_RUNTIMES = {
    # a 0.3 MB MLP: fp16 would save nothing measurable and cost sub-millimetre precision; one ORT thread at
    # batch 1 (workers share the cores, more threads gain nothing)
    "bc-state": FamilyRuntime(("ort", "trt", "torch"), trt_precision="fp32", trt_batch_max=256, ort_threads=1),
    # 30 MFLOP a query of small convolutions: fp16 on the Orin's tensor cores (device_check compares it with
    # fp32); one ORT thread, as bc-state's (the workers share the cores)
    "bc-camera": FamilyRuntime(("ort", "trt", "torch"), trt_precision="fp16", trt_batch_max=64, ort_threads=1),
    # fp16: the Orin's fast path (device_check compares it with fp32)
    "octo": FamilyRuntime(("jax", "ort", "trt"), trt_precision="fp16", trt_batch_max=64, ort_sampler_threads=1),
}
MODEL_BACKENDS = {family: r.backends for family, r in MODEL_RUNTIMES.items()}


@dataclass(frozen=True)
class WeightsFileModel:
    """A model of one safetensors file of the project (bc-state, bc-camera): the module that loads, exports and
    runs it (``DEFAULT_WEIGHTS``, ``load``, ``export_onnx``, ``torch_outputs``), its graph's
    stem in the engines folder, and the command that trains the weights where the file is missing."""

    module: str
    stem: str
    train: str

    def code(self) -> types.ModuleType:
        import importlib

        return importlib.import_module(self.module)

    def weights(self) -> Path:
        return Path(self.code().DEFAULT_WEIGHTS)  # read when asked: tests point it at a file of their own

    def export(self, weights: Path, sha256: str, path: Path) -> Path:
        """The ONNX graph of ``weights`` (of that sha256) at ``path``, recording :func:`weights_source` (what
        ``make engines`` and a run's cached export both write, so that the two are the same bytes)."""
        code = self.code()
        net, config, _ = code.load(weights)
        return code.export_onnx(net, config, path, source=weights_source(weights, sha256))

    def onnx_for_weights(self, weights: Path, sha256: str) -> Path:
        """The ONNX export of a weights file, made once and cached (sealed, :mod:`engines.cache`) under a name
        from the weights' sha256; a damaged cached file (truncated, corrupt) is exported again."""
        from engines.cache import onnx_dir, reuse, write_sealed

        path = onnx_dir() / f"{self.stem}_{sha256[:16]}.onnx"
        if not reuse(path, "ONNX export"):
            write_sealed(path, lambda tmp: self.export(Path(weights), sha256, tmp))
        return path


def weights_source(weights: Path, sha256: str) -> str:
    """The identity an export of ``weights`` (of that sha256) records (ONNX metadata ``source``): the same for the
    engines folder's graph and a run's export of the same file, so that a run finds the TensorRT engines built
    from it (their key is the graph's sha256)."""
    return f"{Path(weights).name} sha256 {sha256[:16]}"


WEIGHTS_FILE_MODELS = {
    "bc-state": WeightsFileModel("engines.bc_mlp", "bc_state", "python -m eval.training.train_bc"),
    "bc-camera": WeightsFileModel("engines.bc_camera", "bc_camera", "python -m eval.training.train_bc_camera "
                                  "--datasets DIR (DIR: demonstrations recorded by python -m eval.record)"),
}


class BackendUnavailable(ValueError):
    """A backend this machine cannot run (one line, with the reason)."""


@dataclass(frozen=True)
class BackendSpec:
    backend: str = "ort"
    precision: str = "fp32"  # ort: fp32, int8 (Q/DQ graph; bf16 refused: no CPU kernels); trt: fp32, fp16, int8, fp8
    max_batch: int = 1  # TensorRT only: the largest batch of the engine's profile
    threads: int | None = None  # ONNX Runtime only: intra-op threads (None: this process's cores)

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; valid: {', '.join(BACKENDS)}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {self.max_batch}")


def unavailable_reason(backend: str) -> str | None:
    """Why ``backend`` cannot run here ("needs ..."), or None."""
    if backend == "trt":
        from engines import trt

        reason = trt.unavailable_reason()
        return f"needs TensorRT and an NVIDIA GPU: {reason}" if reason else None
    if backend == "ort":
        from engines.optional import MissingDependencyError, require

        try:
            require("onnxruntime", "export")
        except MissingDependencyError as e:
            return f"needs ONNX Runtime: {e}"
        return None
    if backend in ("jax", "torch"):
        from engines.optional import MissingDependencyError, require

        try:
            require(backend, "jax" if backend == "jax" else None)
        except MissingDependencyError as e:
            return f"needs {backend}: {e}"
        return None
    raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")


def make_runner(onnx_path: str | Path, spec: BackendSpec, *, engines: str | Path | None = None,
                rewritten: bool = False, model: str = ""):
    """An activated runner of ``onnx_path`` on ``spec``'s backend (a runtime :func:`resolve_runtime` resolved,
    or one a benchmark names; a missing module is one line from :func:`engines.optional.require`). ``ort``:
    ``rewritten`` says the graph is already the one ONNX Runtime loads (make engines rewrote it into the engines
    folder), else it is rewritten on load (cached). ``trt``: the engine ``make engines`` built from this graph in
    ``engines`` (default build/engines), found by its key and checked; a run never builds one, and a missing or
    foreign engine is one line naming the command that builds ``model``'s."""
    from engines.runners import OnnxRuntimeRunner, TensorRtRunner, cpu_count

    if spec.backend not in GRAPH_BACKENDS:
        raise ValueError(f"an ONNX graph runs on {', '.join(GRAPH_BACKENDS)}, not {spec.backend!r}")
    onnx_path = Path(onnx_path)
    if spec.backend == "ort":
        return OnnxRuntimeRunner(onnx_path, "cpu", intra_op_threads=spec.threads or cpu_count(),
                                 rewrite=not rewritten).activate()
    from engines import folder, trt

    where = Path(engines) if engines else folder.default_dir()
    path = trt.find_engine(onnx_path, where, spec.precision, spec.max_batch,
                           rebuild=folder.build_command(model or "MODEL", where))
    return TensorRtRunner(path, expected_key=trt.system_key(onnx_path, spec.precision, spec.max_batch)).activate()


def _check_available(backend: str) -> None:
    reason = unavailable_reason(backend)
    if reason:
        raise BackendUnavailable(f"backend {backend!r} {reason}")


def model_family(model: str) -> str:
    """"octo" for octo-small and octo-base, else the model's own name."""
    return "octo" if model.startswith("octo") else model


def model_backend(model: str, backend: str | None = None) -> str:
    """``backend``, or the model's default when None; ValueError (one line, the valid ones) if the model has
    no such backend."""
    family = model_family(model)
    if family not in MODEL_BACKENDS:
        raise ValueError(f"no runner for model {model!r}; models with runners: bc-state, bc-camera, octo-small, "
                         f"octo-base")
    if backend is None:
        return MODEL_BACKENDS[family][0]
    if backend not in MODEL_BACKENDS[family]:
        raise ValueError(f"{model} has no backend {backend!r}; valid: {', '.join(MODEL_BACKENDS[family])}")
    return backend


def resolve_runtime(model: str, backend: str | None = None, precision: str | None = None, *,
                    device_default: bool = False) -> BackendSpec:
    """THE one resolution of a model's runtime: the backend (the one asked; else the model's default, or with
    ``device_default`` the fastest this machine runs: TensorRT, else JAX on a GPU for models with a JAX
    backend, else ONNX Runtime), checked against the model's backends and this machine once, and the precision
    (the one asked; else the family's TensorRT precision on trt, fp32 elsewhere), checked against the backend;
    with the family's batch profile and threads. One-line errors (BackendUnavailable, a ValueError)."""
    family = model_family(model)
    if backend is None:
        backend = device_backend(model) if device_default else MODEL_RUNTIMES[family].backends[0]
    backend = model_backend(model, backend)
    _check_available(backend)
    rt = MODEL_RUNTIMES[family]
    spec = BackendSpec(backend, precision=precision or (rt.trt_precision if backend == "trt" else "fp32"),
                       max_batch=rt.trt_batch_max, threads=rt.ort_threads)
    _check_precision(spec, family)
    return spec


def device_backend(model: str) -> str:
    """The fastest backend of ``model`` this machine runs: trt, else jax on a GPU (for models with a JAX
    backend), else ort."""
    from engines import trt
    from engines.optional import available

    backends = MODEL_BACKENDS[model_family(model)]
    if trt.unavailable_reason() is None:
        return "trt"
    if "jax" in backends and available("jax"):
        import jax

        if jax.default_backend() == "gpu":
            return "jax"
    return "ort"


def runtime_reason(asked: str | None, spec: BackendSpec, device_default: bool) -> str:
    """Why this runtime: what eval.orin prints beside it."""
    if asked:
        return "chosen on the command line"
    if not device_default:
        return "the model's default"
    if spec.backend == "trt":
        return "TensorRT and an NVIDIA GPU are available"
    from engines import trt

    why = trt.unavailable_reason()
    return f"TensorRT unavailable ({why}): " + ("JAX (XLA) on the GPU" if spec.backend == "jax" else "ONNX Runtime")


def model_runner(model: str, spec: BackendSpec, *, weights: str | Path | None = None, engine=None,
                 engines: str | Path | None = None):
    """The activated runner of ``model`` on ``spec``'s backend: bc-state from its ``weights`` file, Octo from
    its ``engine`` (a :class:`~engines.octo.deployed.DeployedOcto`: the graphs of its engines folder, what a run
    uses; or an :class:`~engines.octo.octo_model.OctoModel`: its jitted model, or its graphs exported on first
    use, for tests and benchmarks). ``engines``: the folder TensorRT engines are read from (default
    build/engines). ``spec`` is a runtime :func:`resolve_runtime` resolved (backend, availability and precision
    checked there, once)."""
    family = model_family(model)
    if family in WEIGHTS_FILE_MODELS:
        return _weights_file_runner(family, spec, Path(weights), engines)
    from engines.octo.deployed import DeployedOcto
    from engines.octo.runners import JaxOcto, OnnxOcto

    sampler_spec = octo_sampler_spec(spec)
    if isinstance(engine, DeployedOcto):
        if spec.backend not in GRAPH_BACKENDS:
            raise BackendUnavailable(f"{model} from the engines folder {engine.folder} runs on "
                                     f"{', '.join(GRAPH_BACKENDS)}; --backend jax loads the checkpoint")
        parts = {}
        for part, part_spec in (("backbone", spec), ("sampler", sampler_spec)):
            graph = engine.graph(part, part_spec.precision, loaded_by=spec.backend)
            parts[part] = make_runner(graph, part_spec, engines=engine.folder, rewritten=spec.backend == "ort",
                                      model=model)
        return OnnxOcto(engine.cfg, parts["backbone"], parts["sampler"]).activate()
    if spec.backend == "jax":
        return JaxOcto(engine).activate()
    from engines.octo.export import onnx_for_octo
    from engines.optional import require

    require("onnx", "export")
    onnx = onnx_for_octo(engine)
    backbone = onnx.backbone
    if spec.precision == "int8":
        from engines.octo.export import BUILD_DIR, file_stem, params_digest

        backbone = _graph_for(spec, onnx.backbone, params_digest(engine.params), engine.cfg.name,
                              (BUILD_DIR / f"{file_stem(engine.cfg.name)}_backbone.onnx",))
    return OnnxOcto(engine.cfg, make_runner(backbone, spec, model=model),
                    make_runner(onnx.sampler, sampler_spec, model=model)).activate()


def _weights_file_runner(model: str, spec: BackendSpec, weights: Path, engines: str | Path | None):
    """bc-state's and bc-camera's runner from their weights file: torch runs the network itself; a graph backend
    runs the engines folder's graph where the folder holds one exported from these weights (its manifest names
    their sha256: what ``make engines`` built, nothing exported at run time), else the export made once and cached
    (:meth:`WeightsFileModel.onnx_for_weights`, the same bytes: their TensorRT engines are found either way)."""
    from engines import folder
    from engines.onnx_utils import sha256_file

    model_file = WEIGHTS_FILE_MODELS[model]
    code = model_file.code()
    if spec.backend == "torch":
        from engines.runners import CallableRunner

        net, _, _ = code.load(weights)
        return CallableRunner("torch", lambda **feeds: code.torch_outputs(net, feeds)).activate()
    digest = sha256_file(weights)
    where = Path(engines) if engines else folder.default_dir()
    listed = model in folder.read_manifest(where)["models"] if (where / folder.MANIFEST).is_file() else False
    entry = folder.model_entry(where, model) if listed else None  # a damaged folder is one line, not skipped
    if entry and (entry.get("weights") or {}).get("sha256") == digest:
        graph = folder.file_of(where, entry, (entry.get("graphs") or {}).get("model"), "graph", model)
    else:  # no folder, or one built from other weights (--checkpoint)
        graph = model_file.onnx_for_weights(weights, digest)
    graph = _graph_for(spec, graph, digest, model, (where / f"{model_file.stem}.onnx",))
    return make_runner(graph, spec, engines=engines, model=model)


def octo_sampler_spec(spec: BackendSpec) -> BackendSpec:
    """Octo's sampler's runtime beside the backbone's ``spec``: fp32 where the backbone runs INT8 (1% of a
    query; engines.quantize), and on ONNX Runtime the family's sampler threads."""
    from dataclasses import replace

    sampler = replace(spec, precision="fp32") if spec.precision == "int8" else spec
    threads = MODEL_RUNTIMES["octo"].ort_sampler_threads
    return replace(sampler, threads=threads) if spec.backend == "ort" and threads else sampler


def _check_precision(spec: BackendSpec, model: str | None = None) -> None:
    from engines.quantize import PrecisionUnavailable, check_precision

    try:
        check_precision(spec.backend, spec.precision, model)
    except PrecisionUnavailable as e:
        raise BackendUnavailable(str(e)) from None


def _graph_for(spec: BackendSpec, fp32: Path, weights_digest: str, model: str, more: tuple = ()) -> Path:
    """The graph ``spec`` runs: ``fp32`` itself, or for int8 its Q/DQ copy (beside it, or beside ``more``'s
    files) built for these weights; ort without one is one line saying how to build it, trt without one
    builds TensorRT's own INT8 from the fp32 graph (TensorRT 10; 11 refuses it in one line)."""
    if spec.precision != "int8":
        return fp32
    from engines.quantize import find_int8, int8_name

    found = find_int8([int8_name(p) for p in (fp32, *more)], weights_digest, fp32)
    if found is not None:
        return found
    if spec.backend == "trt":
        return fp32
    raise BackendUnavailable(f"no INT8 graph of {model} for weights {weights_digest[:16]}; build it with: "
                             f"python -m engines.build --models {model}")


def rel_err(a, ref) -> float:
    """Largest absolute difference over the largest magnitude of the reference (float64)."""
    ref = np.asarray(ref, np.float64)
    return float(np.max(np.abs(np.asarray(a, np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-12))
