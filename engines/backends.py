"""The one backend factory: an exported ONNX graph and a :class:`BackendSpec` (backend, precision, batch
profile, threads) give an activated runner with the ``activate`` / ``infer`` / ``deactivate`` interface.

- ``ort``: ONNX Runtime on the CPU (``threads`` intra-op threads; None: the cores this process may use);
- ``trt``: a TensorRT engine built from the graph on first use for this GPU, TensorRT version and precision,
  with an optimisation profile of batch 1..``max_batch`` (opt 1), cached under ``<cache>/engines`` with a
  shared timing cache, and checked against its sidecar key on every load (:mod:`engines.trt`).

Where ONNX files are cached is here too (:func:`onnx_cache_dir`), and :func:`rel_err`, the one measure of
output agreement between backends that tests and device checks use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from env.cache import cache_root

BACKENDS = ("ort", "trt")


class BackendUnavailable(ValueError):
    """A backend this machine cannot run (one line, with the reason)."""


@dataclass(frozen=True)
class BackendSpec:
    backend: str = "ort"
    precision: str = "fp32"  # TensorRT only: fp32, fp16, int8, fp8
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
    raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")


def onnx_cache_dir() -> Path:
    """Where ONNX exports made on first use are cached (keyed by the weights' digest in the file name)."""
    return cache_root() / "onnx"


def engine_cache_dir() -> Path:
    return cache_root() / "engines"


def make_runner(onnx_path: str | Path, spec: BackendSpec):
    """An activated runner of ``onnx_path`` on ``spec``'s backend; BackendUnavailable (one line) if it cannot run."""
    from engines.runners import OnnxRuntimeRunner, TensorRtRunner, cpu_count

    reason = unavailable_reason(spec.backend)
    if reason:
        raise BackendUnavailable(f"backend {spec.backend!r} {reason}")
    onnx_path = Path(onnx_path)
    if spec.backend == "ort":
        return OnnxRuntimeRunner(onnx_path, "cpu", intra_op_threads=spec.threads or cpu_count()).activate()
    from engines import trt

    out = engine_cache_dir()
    path = trt.build_engine(onnx_path, out, onnx_path.stem, spec.precision, spec.max_batch,
                            timing_cache=out / "timing.cache")
    return TensorRtRunner(path, expected_key=trt.system_key(onnx_path, spec.precision, spec.max_batch)).activate()


def rel_err(a, ref) -> float:
    """Largest absolute difference over the largest magnitude of the reference (float64)."""
    ref = np.asarray(ref, np.float64)
    return float(np.max(np.abs(np.asarray(a, np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-12))
