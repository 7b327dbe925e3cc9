"""Runtime backends behind one interface, after Polygraphy's runners: ``activate``, ``infer``, ``deactivate``.

A runner owns one compiled network. ``infer`` takes and returns dicts of
numpy arrays keyed by the graph's input and output names, and records its own
latency. Heavy optional modules (onnxruntime, jax, tensorrt, cuda) are imported in
``activate``, so every module here imports on a CPU-only machine.

Runners: :class:`JaxRunner`, :class:`OnnxRuntimeRunner` (CPU, CUDA or
TensorRT execution providers), :class:`TensorRtRunner` (``execute_async_v3``
on a CUDA stream, device buffers bound without a copy), :class:`CallableRunner`.
"""

from __future__ import annotations

import abc
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

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


# execution providers by the short names the CLI and the build table use; CPU is always the fallback
ORT_PROVIDERS = {
    "cpu": ("CPUExecutionProvider",),
    "cuda": ("CUDAExecutionProvider", "CPUExecutionProvider"),
    "tensorrt": ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
}


def ort_providers(kind: str) -> tuple[str, ...]:
    if kind not in ORT_PROVIDERS:
        raise ValueError(f"unknown ONNX Runtime provider set {kind!r}; valid: {', '.join(ORT_PROVIDERS)}")
    return ORT_PROVIDERS[kind]


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class OnnxRuntimeRunner(Runner):
    """ONNX Runtime on the CPU, or on CUDA / TensorRT execution providers where they are installed.

    ``providers``: provider names, or one of "cpu", "cuda", "tensorrt" (see ``ORT_PROVIDERS``).
    ``intra_op_threads`` 0 lets ORT pick (one per physical core). ``optimization``: "all", "extended",
    "basic" or "disable" (ORT graph optimisation level).
    """

    name = "ort"
    LEVELS = ("disable", "basic", "extended", "all")

    def __init__(self, onnx_path: str | Path, providers: tuple[str, ...] | str = ("CPUExecutionProvider",),
                 intra_op_threads: int = 1, optimization: str = "all", provider_options: list[dict] | None = None,
                 log_severity: int = 3) -> None:
        super().__init__()
        self.onnx_path = Path(onnx_path)
        self.providers = ort_providers(providers) if isinstance(providers, str) else tuple(providers)
        self.intra_op_threads = intra_op_threads
        if optimization not in self.LEVELS:
            raise ValueError(f"unknown ORT optimisation level {optimization!r}; valid: {', '.join(self.LEVELS)}")
        self.optimization = optimization
        self.provider_options = provider_options
        self.log_severity = log_severity  # 3 = errors only: ORT warns about every folded initializer

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
        opts.log_severity_level = self.log_severity
        opts.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[self.optimization]
        kwargs = {"provider_options": self.provider_options} if self.provider_options else {}
        try:
            self.session = ort.InferenceSession(str(self.onnx_path), opts, providers=list(self.providers), **kwargs)
        except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RuntimeError(f"ONNX Runtime cannot load {self.onnx_path} ({first})") from None
        self.input_names = [i.name for i in self.session.get_inputs()]
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


class JaxRunner(Runner):
    """A JAX function as a runner: ``fn(**feeds) -> dict`` jitted on activate; ``infer`` waits for the result,
    so the recorded latency is the computation's, not the dispatch's. ``warmup`` feeds compile it untimed."""

    name = "jax"

    def __init__(self, fn: Callable[..., Mapping[str, Any]], jit: bool = True,
                 warmup: Mapping[str, np.ndarray] | None = None) -> None:
        super().__init__()
        self.fn = fn
        self.jit = jit
        self.warmup_feeds = warmup

    def _activate(self) -> None:
        jax = require("jax", "jax")
        self._jax = jax
        self._fn = jax.jit(self.fn) if self.jit else self.fn
        if self.warmup_feeds is not None:
            jax.block_until_ready(self._fn(**self.warmup_feeds))

    def _infer(self, feeds):
        out = self._jax.block_until_ready(self._fn(**feeds))
        return {k: np.asarray(v) for k, v in out.items()}

    def _deactivate(self) -> None:
        self._fn = None


# ------------------------------------------------------------------ TensorRT
def _cudart():
    """cuda-python's runtime module under either of its import paths (cuda.bindings since 12.6)."""
    try:
        from cuda.bindings import runtime as cudart  # type: ignore[import-not-found]
    except ImportError:
        cudart = require("cuda.cudart", "trt")  # older cuda-python; the error names what to install
    return cudart


def _cuda_check(result):
    """cuda-python returns (err, *values); raise on an error, return the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return values[0] if len(values) == 1 else tuple(values)


class DeviceBuffer:
    """A device allocation: ``ptr`` (int), ``nbytes``, ``shape``, ``dtype``. Anything with these (or with
    ``__cuda_array_interface__``, e.g. a torch/cupy tensor) can be fed to :class:`TensorRtRunner` without a copy."""

    def __init__(self, shape: tuple[int, ...], dtype) -> None:
        self.cudart = _cudart()
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.ptr = int(_cuda_check(self.cudart.cudaMalloc(max(1, self.nbytes))))

    def free(self) -> None:
        if self.ptr:
            _cuda_check(self.cudart.cudaFree(self.ptr))
            self.ptr = 0


def _device_pointer(value) -> int | None:
    """The device address of a GPU-resident feed, or None for a host array."""
    if isinstance(value, DeviceBuffer):
        return value.ptr
    cai = getattr(value, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    return None


class TensorRtRunner(Runner):
    """A serialized TensorRT engine run with ``execute_async_v3`` on its own CUDA stream.

    Feeds may be host numpy arrays (copied into the runner's device buffers) or
    device buffers (a :class:`DeviceBuffer` or anything with
    ``__cuda_array_interface__``), bound by address without a copy, so a
    GPU-resident camera frame goes straight in. Outputs come back as numpy
    arrays. ``cuda_graph`` captures the enqueue once per input shape and replays
    it (fewer launches; the addresses of device feeds must then stay fixed).
    ``expected_key`` (an :class:`engines.trt.EngineKey`) refuses an engine built
    for another system before deserialising it. tensorrt and cuda-python are
    imported on activate.
    """

    name = "trt"

    def __init__(self, engine_path: str | Path, expected_key=None, cuda_graph: bool = False) -> None:
        super().__init__()
        self.engine_path = Path(engine_path)
        self.expected_key = expected_key
        self.cuda_graph = cuda_graph
        self.last_gpu_ms: float | None = None

    def _activate(self) -> None:
        from engines import trt as trt_cache
        from engines.onnx_utils import BadModelFileError

        reason = trt_cache.unavailable_reason()
        if reason:
            raise trt_cache.TensorRTUnavailable(reason)
        if self.expected_key is not None:
            trt_cache.check_engine(self.engine_path, self.expected_key)
        elif not self.engine_path.is_file():
            raise BadModelFileError(f"engine {self.engine_path} does not exist; build it with: make engines")
        trt = require("tensorrt", "trt")
        self.cudart = _cudart()
        self.trt = trt
        self.logger = trt.Logger(trt.Logger.ERROR)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(self.engine_path.read_bytes())
        if self.engine is None:
            raise BadModelFileError(f"engine {self.engine_path} is corrupt, truncated or from another TensorRT "
                                    "version; rebuild it with: make engines")
        self.context = self.engine.create_execution_context()
        self.stream = _cuda_check(self.cudart.cudaStreamCreate())
        self.names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in self.names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in self.names if n not in self.inputs]
        self.buffers: dict[str, DeviceBuffer] = {}
        self.graphs: dict[tuple, Any] = {}
        self.start = _cuda_check(self.cudart.cudaEventCreate())
        self.stop = _cuda_check(self.cudart.cudaEventCreate())

    def _buffer(self, name: str, shape, dtype) -> DeviceBuffer:
        buf = self.buffers.get(name)
        if buf is None or buf.shape != tuple(shape) or buf.dtype != np.dtype(dtype):
            if buf is not None:
                buf.free()
            buf = self.buffers[name] = DeviceBuffer(tuple(shape), dtype)
            self.graphs.clear()  # captured graphs hold the old addresses
        return buf

    def _infer(self, feeds):
        cudart, trt = self.cudart, self.trt
        h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        missing = [n for n in self.inputs if n not in feeds]
        if missing:
            raise ValueError(f"TensorRT engine {self.engine_path.name} needs inputs {', '.join(missing)}")
        shapes = []
        for name in self.inputs:
            value = feeds[name]
            shape = tuple(int(d) for d in value.shape)
            self.context.set_input_shape(name, shape)
            shapes.append(shape)
            ptr = _device_pointer(value)
            if ptr is None:
                host = np.ascontiguousarray(value, trt.nptype(self.engine.get_tensor_dtype(name)))
                buf = self._buffer(name, shape, host.dtype)
                _cuda_check(cudart.cudaMemcpyAsync(buf.ptr, host.ctypes.data, host.nbytes, h2d, self.stream))
                ptr = buf.ptr
            self.context.set_tensor_address(name, ptr)
        hosts = {}
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            dtype = trt.nptype(self.engine.get_tensor_dtype(name))
            buf = self._buffer(name, shape, dtype)
            self.context.set_tensor_address(name, buf.ptr)
            hosts[name] = np.empty(shape, dtype)
        _cuda_check(cudart.cudaEventRecord(self.start, self.stream))
        key = tuple(shapes)
        if self.cuda_graph and key in self.graphs:
            _cuda_check(cudart.cudaGraphLaunch(self.graphs[key], self.stream))
        elif self.cuda_graph:
            # the first call runs normally (TensorRT allocates on it), the capture happens on the second
            if getattr(self, "_seen", None) == key:
                mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal
                _cuda_check(cudart.cudaStreamBeginCapture(self.stream, mode))
                self.context.execute_async_v3(self.stream)
                graph = _cuda_check(cudart.cudaStreamEndCapture(self.stream))
                self.graphs[key] = _cuda_check(cudart.cudaGraphInstantiate(graph, 0))
                _cuda_check(cudart.cudaGraphLaunch(self.graphs[key], self.stream))
            elif not self.context.execute_async_v3(self.stream):
                raise RuntimeError(f"TensorRT failed to run {self.engine_path.name}")
            self._seen = key
        elif not self.context.execute_async_v3(self.stream):
            raise RuntimeError(f"TensorRT failed to run {self.engine_path.name}")
        _cuda_check(cudart.cudaEventRecord(self.stop, self.stream))
        for name in self.outputs:
            h = hosts[name]
            _cuda_check(cudart.cudaMemcpyAsync(h.ctypes.data, self.buffers[name].ptr, h.nbytes, d2h, self.stream))
        _cuda_check(cudart.cudaStreamSynchronize(self.stream))
        self.last_gpu_ms = float(_cuda_check(cudart.cudaEventElapsedTime(self.start, self.stop)))
        return hosts

    def _deactivate(self) -> None:
        for buf in self.buffers.values():
            buf.free()
        self.buffers.clear()
        self.graphs.clear()
        if getattr(self, "stream", None) is not None:
            self.cudart.cudaStreamDestroy(self.stream)
            self.stream = None
        self.context = self.engine = self.runtime = None
