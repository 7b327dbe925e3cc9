"""Runtime backends behind one interface, after Polygraphy's runners: ``activate``, ``infer``, ``deactivate``.

A runner owns one compiled network. ``infer`` takes and returns dicts of
numpy arrays keyed by the graph's input and output names, and records its own
latency. Heavy optional modules (onnxruntime, tensorrt, cuda) are imported in
``activate``, so every module here imports on a CPU-only machine.
"""

from __future__ import annotations

import abc
import time
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from engines.optional import require


class Runner(abc.ABC):
    name = "runner"

    def __init__(self) -> None:
        self.active = False
        self.latencies_ms: list[float] = []

    def activate(self) -> "Runner":
        if not self.active:
            self._activate()
            self.active = True
        return self

    def deactivate(self) -> None:
        if self.active:
            self._deactivate()
            self.active = False

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.active:
            raise RuntimeError(f"{self.name} runner used before activate()")
        t0 = time.perf_counter()
        out = self._infer(feeds)
        self.latencies_ms.append((time.perf_counter() - t0) * 1e3)
        return out

    def __enter__(self) -> "Runner":
        return self.activate()

    def __exit__(self, *exc) -> None:
        self.deactivate()

    @abc.abstractmethod
    def _activate(self) -> None: ...

    @abc.abstractmethod
    def _infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def _deactivate(self) -> None:
        pass


class OnnxRuntimeRunner(Runner):
    """ONNX Runtime on the CPU, or on CUDA / TensorRT execution providers where they are installed."""

    name = "ort"

    def __init__(self, onnx_path: str | Path, providers: tuple[str, ...] = ("CPUExecutionProvider",),
                 intra_op_threads: int = 1) -> None:
        super().__init__()
        self.onnx_path = Path(onnx_path)
        self.providers = providers
        self.intra_op_threads = intra_op_threads

    def _activate(self) -> None:
        ort = require("onnxruntime", "export")
        from engines.onnx_utils import check_onnx_file

        check_onnx_file(self.onnx_path)
        available = set(ort.get_available_providers())
        missing = [p for p in self.providers if p not in available]
        if missing:
            raise RuntimeError(f"ONNX Runtime here lacks {', '.join(missing)}; available: {', '.join(sorted(available))}")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.intra_op_threads
        self.session = ort.InferenceSession(str(self.onnx_path), opts, providers=list(self.providers))
        self.output_names = [o.name for o in self.session.get_outputs()]

    def _infer(self, feeds):
        return dict(zip(self.output_names, self.session.run(self.output_names, dict(feeds))))

    def _deactivate(self) -> None:
        self.session = None


class CallableRunner(Runner):
    """A native framework function (torch, JAX) as a runner: ``fn(**feeds) -> dict``."""

    def __init__(self, name: str, fn: Callable[..., Mapping[str, np.ndarray]]) -> None:
        super().__init__()
        self.name = name
        self.fn = fn

    def _activate(self) -> None:
        pass

    def _infer(self, feeds):
        return {k: np.asarray(v) for k, v in self.fn(**feeds).items()}
