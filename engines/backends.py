"""The one backend factory: a model and a :class:`BackendSpec` (backend, precision, batch profile, threads) give
an activated runner with the ``activate`` / ``infer`` / ``deactivate`` interface. Policies receive the runner
(the model table in :mod:`eval.policies` assembles them); none builds its own.

- :func:`model_runner`: a model's runner. bc-state (a weights file): ``ort``, ``trt`` or ``torch``; Octo (an
  :class:`~engines.octo.engine.OctoEngine`): ``jax`` (the jitted model, on the CPU or on the GPU where JAX has
  CUDA: the GPU engine where TensorRT is absent), ``ort`` or ``trt`` (its two exported graphs).
- :func:`make_runner`: one exported ONNX graph on a graph backend. ``ort``: ONNX Runtime on the CPU
  (``threads`` intra-op threads; None: the cores this process may use); ``trt``: a TensorRT engine built from
  the graph on first use for this GPU, TensorRT version and precision, with an optimisation profile of batch
  1..``max_batch`` (opt 1), cached under ``<cache>/engines`` with a shared timing cache, and checked against
  its sidecar key on every load (:mod:`engines.trt`).

Precision applies to ``ort`` too (:mod:`engines.quantize`): ``int8`` runs the Q/DQ INT8 graph ``make engines``
built beside the fp32 one (Octo: the backbone; its sampler, 1% of a query, stays fp32); on ``trt``, ``int8``
builds its engine from that same Q/DQ graph where one exists. ``bf16`` on ``ort`` is refused in one line
(ONNX Runtime's CPU provider has no bfloat16 MatMul/Gemm kernels), as is every precision on ``jax``/``torch``
but fp32.

Where ONNX files are cached is here too (:func:`onnx_cache_dir`), and :func:`rel_err`, the one measure of
output agreement between backends that tests and device checks use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from env.cache import cache_root

GRAPH_BACKENDS = ("ort", "trt")  # run an exported ONNX graph
BACKENDS = ("jax", "ort", "trt", "torch")
# the backends each model family runs on, the first its default
MODEL_BACKENDS = {"bc-state": ("ort", "trt", "torch"), "octo": ("jax", "ort", "trt")}


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


def onnx_cache_dir() -> Path:
    """Where ONNX exports made on first use are cached (keyed by the weights' digest in the file name)."""
    return cache_root() / "onnx"


def engine_cache_dir() -> Path:
    return cache_root() / "engines"


def make_runner(onnx_path: str | Path, spec: BackendSpec):
    """An activated runner of ``onnx_path`` on ``spec``'s backend; BackendUnavailable (one line) if it cannot run."""
    from engines.runners import OnnxRuntimeRunner, TensorRtRunner, cpu_count

    if spec.backend not in GRAPH_BACKENDS:
        raise ValueError(f"an ONNX graph runs on {', '.join(GRAPH_BACKENDS)}, not {spec.backend!r}")
    _check_available(spec.backend)
    onnx_path = Path(onnx_path)
    if spec.backend == "ort":
        return OnnxRuntimeRunner(onnx_path, "cpu", intra_op_threads=spec.threads or cpu_count()).activate()
    from engines import trt

    out = engine_cache_dir()
    path = trt.build_engine(onnx_path, out, onnx_path.stem, spec.precision, spec.max_batch,
                            timing_cache=out / "timing.cache")
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
        raise ValueError(f"no runner for model {model!r}; models with runners: bc-state, octo-small, octo-base")
    if backend is None:
        return MODEL_BACKENDS[family][0]
    if backend not in MODEL_BACKENDS[family]:
        raise ValueError(f"{model} has no backend {backend!r}; valid: {', '.join(MODEL_BACKENDS[family])}")
    return backend


def model_runner(model: str, spec: BackendSpec, *, weights: str | Path | None = None, engine=None):
    """The activated runner of ``model`` on ``spec``'s backend: bc-state from its ``weights`` file, Octo from
    its ``engine``. BackendUnavailable (one line) where the backend cannot run here, checked before any
    export or engine build."""
    family = model_family(model)
    model_backend(model, spec.backend)
    _check_available(spec.backend)
    _check_precision(spec, family)
    if family == "bc-state":
        from engines.bc_mlp import load, numpy_forward, onnx_for_weights
        from engines.onnx_utils import sha256_file

        if spec.backend == "torch":
            from engines.runners import CallableRunner

            net, _, _ = load(weights)
            return CallableRunner("torch", lambda state: {"action": numpy_forward(net, state)}).activate()
        digest = sha256_file(weights)
        from engines.octo.export import BUILD_DIR

        graph = _graph_for(spec, onnx_for_weights(weights, digest), digest, "bc-state", (BUILD_DIR / "bc_state.onnx",))
        return make_runner(graph, spec)
    from engines.octo.runners import JaxOcto, OnnxOcto

    if spec.backend == "jax":
        return JaxOcto(engine).activate()
    from engines.octo.export import onnx_for_engine
    from engines.optional import require

    require("onnx", "export")
    onnx = onnx_for_engine(engine)
    backbone = onnx.backbone
    sampler_spec = spec
    if spec.precision == "int8":
        from dataclasses import replace

        from engines.octo.export import BUILD_DIR, file_stem, params_digest

        backbone = _graph_for(spec, onnx.backbone, params_digest(engine.params), engine.cfg.name,
                              (BUILD_DIR / f"{file_stem(engine.cfg.name)}_backbone.onnx",))
        sampler_spec = replace(spec, precision="fp32")  # the sampler stays fp32 (engines.quantize)
    return OnnxOcto(engine.cfg, make_runner(backbone, spec), make_runner(onnx.sampler, sampler_spec)).activate()


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
