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
import functools
import os
import sys
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
    "basic" or "disable" (ORT graph optimisation level). ``rewrite`` (CPU provider only): run the graph as
    rewritten by :func:`engines.octo.optimize.ort_optimized` (fused LayerNormalization, FastGelu,
    MultiHeadAttention, Gemm biases, static reshapes; a cached copy, same outputs), the graph that
    ``--backend ort`` and ``benchmarks.octo_ort_vs_jax`` time; ``loaded_path`` is the file ORT loaded.
    ``session_config``: extra ``SessionOptions.add_session_config_entry`` pairs.
    """

    name = "ort"
    LEVELS = ("disable", "basic", "extended", "all")

    def __init__(self, onnx_path: str | Path, providers: tuple[str, ...] | str = ("CPUExecutionProvider",),
                 intra_op_threads: int = 1, optimization: str = "all", provider_options: list[dict] | None = None,
                 log_severity: int = 3, rewrite: bool = True, session_config: dict[str, str] | None = None) -> None:
        super().__init__()
        self.onnx_path = Path(onnx_path)
        self.providers = ort_providers(providers) if isinstance(providers, str) else tuple(providers)
        self.intra_op_threads = intra_op_threads
        if optimization not in self.LEVELS:
            raise ValueError(f"unknown ORT optimisation level {optimization!r}; valid: {', '.join(self.LEVELS)}")
        self.optimization = optimization
        self.provider_options = provider_options
        self.log_severity = log_severity  # 3 = errors only: ORT warns about every folded initializer
        self.rewrite = rewrite and self.providers == ("CPUExecutionProvider",)
        self.session_config = dict(session_config or {})
        self.loaded_path = self.onnx_path

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
        for key, value in self.session_config.items():
            opts.add_session_config_entry(key, str(value))
        opts.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[self.optimization]
        kwargs = {"provider_options": self.provider_options} if self.provider_options else {}
        self.loaded_path = self.onnx_path
        if self.rewrite:
            from engines.octo.optimize import ort_optimized
            from engines.optional import MissingDependencyError

            try:
                self.loaded_path = ort_optimized(self.onnx_path)
            except MissingDependencyError as e:  # onnx (the export extra) absent: the graph as exported, said
                print(f"ONNX Runtime loads {self.onnx_path.name} as exported, without this project's rewrites (same "
                      f"outputs, slower): {e}", file=sys.stderr)
                self.loaded_path = self.onnx_path
        try:
            self.session = ort.InferenceSession(str(self.loaded_path), opts, providers=list(self.providers), **kwargs)
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
# cuda-python's major is the CUDA major it was built for; a newer major than the driver's cannot run
# (cuda-python 13 needs a CUDA 13 driver: JetPack 7; JetPack 6 has CUDA 12.6). setup.py's trt extra admits both.
CUDA_PYTHON_SPEC = "cuda-python>=12.6,<14"


def cuda_python_spec(driver_major: int) -> str:
    """The cuda-python a CUDA ``driver_major`` driver runs: 12.x up to CUDA 12, the driver's own major after."""
    return "cuda-python>=12.6,<13" if driver_major <= 12 else f"cuda-python>={driver_major},<{driver_major + 1}"


def _cuda_python_version(cudart) -> str | None:
    """The installed cuda-python (or cuda-bindings) version, or None where no distribution says."""
    from importlib import metadata

    for dist in ("cuda-bindings", "cuda-python"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return getattr(cudart, "__version__", None)


def check_cuda_python(bindings_version: str | None, driver_version: int) -> None:
    """Refuse cuda-python built for a newer CUDA major than the driver's (one line saying what to install).

    ``driver_version`` is cudaDriverGetVersion's (12060 for CUDA 12.6; 0 for no driver). An older
    cuda-python on a newer driver is fine: drivers run code built for earlier CUDA majors."""
    from engines.trt import TensorRTUnavailable

    if driver_version <= 0:
        raise TensorRTUnavailable("no CUDA driver is loaded (cudaDriverGetVersion gave 0); TensorRT needs one")
    driver_major = driver_version // 1000
    if bindings_version is None:
        return  # nothing to compare (a source build); the first CUDA call will tell
    try:
        bindings_major = int(bindings_version.split(".")[0])
    except ValueError:
        return
    if bindings_major > driver_major:
        raise TensorRTUnavailable(
            f"cuda-python {bindings_version} needs a CUDA {bindings_major} driver, this one is CUDA "
            f"{driver_major}.{driver_version % 1000 // 10}; install: pip install '{cuda_python_spec(driver_major)}'")


@functools.lru_cache(maxsize=1)
def _cudart():
    """cuda-python's runtime module under either of its import paths (cuda.bindings since 12.6), checked
    once against the driver's CUDA major."""
    try:
        from cuda.bindings import runtime as cudart  # type: ignore[import-not-found]
    except ImportError:
        try:
            from cuda import cudart  # type: ignore[import-not-found,no-redef]  # cuda-python before 12.6
        except ImportError:
            from engines.optional import MissingDependencyError

            raise MissingDependencyError(f"cuda-python is not installed; install it with: pip install "
                                         f"'{CUDA_PYTHON_SPEC}' (or: pip install -e '.[trt]'; on a CUDA 12 driver, JetPack 6: "
                                         f"cuda-python<13)") from None
    check_cuda_python(_cuda_python_version(cudart), int(_cuda_check(cudart.cudaDriverGetVersion(),
                                                                    "cudaDriverGetVersion")))
    return cudart


def _cuda_check(result, what: str = "CUDA call"):
    """cuda-python returns (err, *values); raise one line naming the call on an error, return the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: CUDA error {getattr(err, 'name', err)} ({int(err)})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


class DeviceBuffer:
    """A device allocation: ``ptr`` (int), ``nbytes``, ``shape``, ``dtype``. Anything with these (or with
    ``__cuda_array_interface__``, e.g. a torch/cupy tensor) can be fed to :class:`TensorRtRunner` without a copy."""

    def __init__(self, shape: tuple[int, ...], dtype) -> None:
        self.cudart = _cudart()
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.ptr = int(_cuda_check(self.cudart.cudaMalloc(max(1, self.nbytes)), f"cudaMalloc({self.nbytes})"))

    def free(self) -> None:
        if self.ptr:
            _cuda_check(self.cudart.cudaFree(self.ptr), "cudaFree")
            self.ptr = 0


class DeviceFeed:
    """A GPU-resident feed checked for binding by address: ``ptr``, ``shape``, ``dtype``, and the CUDA
    ``stream`` its producer wrote it on (None: ready now)."""

    __slots__ = ("ptr", "shape", "dtype", "stream")

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype, stream: int | None = None) -> None:
        self.ptr, self.shape, self.dtype, self.stream = ptr, shape, dtype, stream


def _device_pointer(value, name: str = "input", dtype=None) -> DeviceFeed | None:
    """A GPU-resident feed as a checked :class:`DeviceFeed`, or None for a host array.

    ``__cuda_array_interface__`` feeds must have ``dtype`` (the engine's, when given), C-contiguous strides, no
    mask and a valid stream (v3: None, or a nonzero handle); each violation raises one line naming ``name``."""
    if isinstance(value, DeviceBuffer):
        feed = DeviceFeed(value.ptr, value.shape, value.dtype)
    else:
        cai = getattr(value, "__cuda_array_interface__", None)
        if cai is None:
            return None
        try:
            shape = tuple(int(d) for d in cai["shape"])
            found = np.dtype(cai["typestr"])
            ptr = int(cai["data"][0] or 0)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ValueError(f"input {name!r}: malformed __cuda_array_interface__ ({e})") from None
        if cai.get("mask") is not None:
            raise ValueError(f"input {name!r}: masked device arrays cannot be bound to TensorRT")
        strides = cai.get("strides")
        if strides is not None:
            c_strides, step = [], found.itemsize
            for d in reversed(shape):
                c_strides.append(step)
                step *= d
            c_strides.reverse()
            # an axis of length 1 (or an empty array) may carry any stride without changing the layout
            if any(s != c for s, c, d in zip(strides, c_strides, shape) if d > 1) and 0 not in shape:
                raise ValueError(f"input {name!r}: device array with strides {tuple(strides)} is not C-contiguous "
                                 f"(TensorRT reads it as dense); pass a contiguous one (torch: .contiguous())")
        stream = cai.get("stream")
        if stream is not None and (not isinstance(stream, int) or isinstance(stream, bool) or stream == 0):
            raise ValueError(f"input {name!r}: __cuda_array_interface__ stream {stream!r} is not valid "
                             "(None or a nonzero stream handle)")
        if ptr == 0 and int(np.prod(shape)) > 0:
            raise ValueError(f"input {name!r}: device array has a null data pointer")
        feed = DeviceFeed(ptr, shape, found, stream)
    if dtype is not None and feed.dtype != np.dtype(dtype):
        raise ValueError(f"input {name!r}: device array has dtype {feed.dtype}, the engine takes {np.dtype(dtype)}; "
                         "convert it on the device first")
    return feed


def _frozen(a: np.ndarray) -> bool:
    """Whether a host array's contents cannot change: read-only, and so is every array it views, down to an
    owner that is none (its own memory), ``bytes`` or a read-only memoryview (e.g. a JAX array's buffer)."""
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    return a is None or isinstance(a, bytes) or (isinstance(a, memoryview) and a.readonly)


def h2d_of(runner: Any) -> tuple[int | None, float | None]:
    """(bytes, ms) a runner copied from host to device in its last call: its own ``last_h2d_bytes`` and
    ``last_h2d_ms`` where it keeps them (:class:`TensorRtRunner`, :class:`engines.octo.runners.OnnxOcto`); (0, None)
    for ONNX Runtime on the CPU alone (no device, nothing to time); (None, None) for the rest (unknown: JAX,
    ONNX Runtime on CUDA, which copies inside its session)."""
    if hasattr(runner, "last_h2d_bytes"):
        return runner.last_h2d_bytes, getattr(runner, "last_h2d_ms", None)
    if tuple(getattr(runner, "providers", ())) == ORT_PROVIDERS["cpu"]:
        return 0, None
    return None, None


class TensorRtRunner(Runner):
    """A serialized TensorRT engine run with ``execute_async_v3`` on its own CUDA stream.

    Feeds may be host numpy arrays (copied into the runner's device buffers) or
    device buffers (a :class:`DeviceBuffer` or anything with
    ``__cuda_array_interface__``, e.g. a torch CUDA tensor), bound by address
    without a copy, so a GPU-resident camera frame goes straight in; a device
    feed must have the engine's dtype and be C-contiguous, and work pending on
    the stream it names is waited for. This is the project's one TensorRT
    binding path. Outputs come back as numpy arrays. Every TensorRT call that
    reports failure (an input shape outside the profile, a refused address, a
    failed enqueue) raises one line. ``cuda_graph`` captures the enqueue once
    per set of input shapes and bound addresses and replays it (fewer
    launches); a device feed at a new address gets its own capture, so a
    replay never reads a stale pointer. ``counter`` (a
    :class:`engines.zero_copy.CopyCounter`) counts the bytes of host feeds
    copied to the device (device feeds count 0; outputs, which always come
    back, are not counted) and their device time.

    Host-to-device traffic: a host feed that is the very array object copied into that input's device
    buffer last time, and frozen (read-only, and so is whatever it views: :func:`_frozen`), is not copied
    again; the runner keeps a reference to it (not its id, which a new array could reuse), so its contents
    are still the buffer's. A policy makes what is fixed for a try (Octo's language embedding, goal images)
    such an array once and passes that same object on every query. After each ``infer``:
    ``last_h2d_bytes`` is the host bytes copied to the device by that call, ``last_h2d_ms`` the device time
    of those copies, measured with CUDA events recorded on the runner's stream just before the first and
    just after the last copy (0.0 when nothing was copied; a host clock around asynchronous copies would
    time their enqueueing, not the copies). ``expected_key`` (an
    :class:`engines.trt.EngineKey`) refuses an engine built for another system
    before deserialising it. tensorrt and cuda-python are imported on activate.
    """

    name = "trt"
    MAX_GRAPHS = 8  # captured CUDA graphs kept (per shapes and addresses); the oldest is destroyed beyond

    def __init__(self, engine_path: str | Path, expected_key=None, cuda_graph: bool = False, counter=None) -> None:
        super().__init__()
        self.engine_path = Path(engine_path)
        self.expected_key = expected_key
        self.cuda_graph = cuda_graph
        self.counter = counter
        self.last_gpu_ms: float | None = None
        self.last_h2d_bytes: int | None = None  # host bytes copied to the device by the last infer
        self.last_h2d_ms: float | None = None  # device time of those copies (CUDA events), ms
        self._fed: dict[str, np.ndarray] = {}  # input -> the frozen host array its device buffer holds
        self._h2d_timed = False

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
        if self.runtime is None:
            raise RuntimeError(f"TensorRT could not create a runtime for {self.engine_path.name}")
        self.engine = self.runtime.deserialize_cuda_engine(self.engine_path.read_bytes())
        if self.engine is None:
            raise BadModelFileError(f"engine {self.engine_path} is corrupt, truncated or from another TensorRT "
                                    "version; rebuild it with: make engines")
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise RuntimeError(f"TensorRT could not create an execution context for {self.engine_path.name} "
                               "(out of device memory?)")
        self._setup()

    def _setup(self) -> None:
        """Stream, events and tensor lists of an engine and context already in place (tests give fakes)."""
        trt, cudart = self.trt, self.cudart
        self.stream = _cuda_check(cudart.cudaStreamCreate(), "cudaStreamCreate")
        self.names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in self.names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in self.names if n not in self.inputs]
        self.buffers: dict[str, DeviceBuffer] = {}
        self.graphs: dict[tuple, tuple] = {}  # key -> (graph, graph exec), oldest first
        self._seen: tuple | None = None
        self._sync = _cuda_check(cudart.cudaEventCreate(), "cudaEventCreate")  # waits on a producer's stream
        self.start = _cuda_check(cudart.cudaEventCreate(), "cudaEventCreate")
        self.stop = _cuda_check(cudart.cudaEventCreate(), "cudaEventCreate")
        self.h2d_start = _cuda_check(cudart.cudaEventCreate(), "cudaEventCreate")  # around the host copies
        self.h2d_stop = _cuda_check(cudart.cudaEventCreate(), "cudaEventCreate")
        self._fed = {}

    def _buffer(self, name: str, shape, dtype) -> DeviceBuffer:
        buf = self.buffers.get(name)
        if buf is None or buf.shape != tuple(shape) or buf.dtype != np.dtype(dtype):
            self._fed.pop(name, None)  # a new buffer holds nothing yet
            if buf is not None:
                buf.free()
            buf = self.buffers[name] = DeviceBuffer(tuple(shape), dtype)
        return buf

    def _shape_error(self, name: str, shape) -> str:
        allowed = ""
        try:
            lo, _, hi = self.engine.get_tensor_profile_shape(name, 0)
            allowed = f"; its profile allows {tuple(lo)} to {tuple(hi)}"
        except Exception:  # noqa: BLE001 - the range is a courtesy in the message
            pass
        return f"TensorRT engine {self.engine_path.name} refused shape {tuple(shape)} for input {name!r}{allowed}"

    def _bind(self, feeds) -> tuple:
        """Set every input's shape and address (host feeds copied in, unless the buffer holds that frozen
        array already), every output's address; returns the key of this binding: shapes and addresses."""
        cudart, trt = self.cudart, self.trt
        missing = [n for n in self.inputs if n not in feeds]
        if missing:
            raise ValueError(f"TensorRT engine {self.engine_path.name} needs inputs {', '.join(missing)}")
        key, copies = [], []
        for name in self.inputs:
            value = feeds[name]
            dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(name)))
            dev = _device_pointer(value, name, dtype)
            if dev is None:
                host = np.ascontiguousarray(value, dtype)
                shape = tuple(int(d) for d in host.shape)
            else:
                shape = dev.shape
            if not self.context.set_input_shape(name, shape):
                raise ValueError(self._shape_error(name, shape))
            if dev is None:
                buf = self._buffer(name, shape, dtype)
                if self._fed.get(name) is not host or not _frozen(host):  # the buffer lacks this frozen array
                    copies.append((name, buf, host))
                ptr = buf.ptr
            else:
                ptr = dev.ptr
                if dev.stream is not None and dev.stream != int(self.stream):
                    # the producer's work on its stream must finish before the engine reads (CAI v3)
                    _cuda_check(cudart.cudaEventRecord(self._sync, dev.stream), f"event on input {name!r}'s stream")
                    _cuda_check(cudart.cudaStreamWaitEvent(self.stream, self._sync, 0),
                                f"wait for input {name!r}'s stream")
            if not self.context.set_tensor_address(name, ptr):
                raise ValueError(f"TensorRT engine {self.engine_path.name} refused address {ptr:#x} for input {name!r}")
            key.append((name, shape, ptr))
        self._copy_in(copies)
        for name in self.outputs:
            shape = tuple(int(d) for d in self.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise RuntimeError(f"TensorRT engine {self.engine_path.name} cannot size output {name!r} ({shape}) "
                                   "from these input shapes")
            buf = self._buffer(name, shape, trt.nptype(self.engine.get_tensor_dtype(name)))
            if not self.context.set_tensor_address(name, buf.ptr):
                raise RuntimeError(f"TensorRT engine {self.engine_path.name} refused address {buf.ptr:#x} "
                                   f"for output {name!r}")
            key.append((name, shape, buf.ptr))
        return tuple(key)

    def _copy_in(self, copies: list) -> None:
        """Copy host feeds into their device buffers on the stream, between the two H2D events; then
        remember the frozen ones (only now: a binding that failed before copying leaves nothing to trust)."""
        cudart = self.cudart
        h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.last_h2d_bytes, self._h2d_timed = 0, bool(copies)
        if not copies:
            return
        _cuda_check(cudart.cudaEventRecord(self.h2d_start, self.stream), "cudaEventRecord")
        for name, buf, host in copies:
            self._fed.pop(name, None)
            _cuda_check(cudart.cudaMemcpyAsync(buf.ptr, host.ctypes.data, host.nbytes, h2d, self.stream),
                        f"copy of input {name!r} to the device")
            self.last_h2d_bytes += host.nbytes
            if self.counter is not None:
                self.counter.add_h2d(host.nbytes)
        _cuda_check(cudart.cudaEventRecord(self.h2d_stop, self.stream), "cudaEventRecord")
        for name, _, host in copies:
            if _frozen(host):
                self._fed[name] = host  # a reference: the object (and so its id) stays alive

    def _enqueue(self) -> None:
        if not self.context.execute_async_v3(self.stream):
            raise RuntimeError(f"TensorRT execute_async_v3 failed for {self.engine_path.name}")

    def _capture(self, key: tuple) -> Any:
        cudart = self.cudart
        mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal
        _cuda_check(cudart.cudaStreamBeginCapture(self.stream, mode), "cudaStreamBeginCapture")
        try:
            ok = self.context.execute_async_v3(self.stream)
        finally:
            graph = _cuda_check(cudart.cudaStreamEndCapture(self.stream), "cudaStreamEndCapture")
        if not ok:
            cudart.cudaGraphDestroy(graph)
            raise RuntimeError(f"TensorRT execute_async_v3 failed for {self.engine_path.name} (CUDA graph capture)")
        exe = _cuda_check(cudart.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        if len(self.graphs) >= self.MAX_GRAPHS:
            self._destroy_graph(next(iter(self.graphs)))
        self.graphs[key] = (graph, exe)
        return exe

    def _destroy_graph(self, key: tuple) -> None:
        graph, exe = self.graphs.pop(key)
        self.cudart.cudaGraphExecDestroy(exe)
        self.cudart.cudaGraphDestroy(graph)

    def _infer(self, feeds):
        cudart = self.cudart
        d2h = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.last_h2d_bytes = self.last_h2d_ms = None
        key = self._bind(feeds)
        _cuda_check(cudart.cudaEventRecord(self.start, self.stream), "cudaEventRecord")
        if self.cuda_graph and key in self.graphs:
            _cuda_check(cudart.cudaGraphLaunch(self.graphs[key][1], self.stream), "cudaGraphLaunch")
        elif self.cuda_graph and self._seen == key:
            # the first call with a binding runs normally (TensorRT allocates on it), the second captures
            _cuda_check(cudart.cudaGraphLaunch(self._capture(key), self.stream), "cudaGraphLaunch")
        else:
            self._enqueue()
            self._seen = key
        _cuda_check(cudart.cudaEventRecord(self.stop, self.stream), "cudaEventRecord")
        hosts = {}
        for name in self.outputs:
            buf = self.buffers[name]
            h = hosts[name] = np.empty(buf.shape, buf.dtype)
            _cuda_check(cudart.cudaMemcpyAsync(h.ctypes.data, buf.ptr, h.nbytes, d2h, self.stream),
                        f"copy of output {name!r} to the host")
        _cuda_check(cudart.cudaStreamSynchronize(self.stream), f"TensorRT run of {self.engine_path.name}")
        self.last_gpu_ms = float(_cuda_check(cudart.cudaEventElapsedTime(self.start, self.stop),
                                             "cudaEventElapsedTime"))
        self.last_h2d_ms = float(_cuda_check(cudart.cudaEventElapsedTime(self.h2d_start, self.h2d_stop),
                                             "cudaEventElapsedTime")) if self._h2d_timed else 0.0
        if self.counter is not None:
            self.counter.add_h2d_ms(self.last_h2d_ms)
        return hosts

    def _deactivate(self) -> None:
        for key in list(getattr(self, "graphs", {})):
            self._destroy_graph(key)
        for buf in getattr(self, "buffers", {}).values():
            buf.free()
        self.buffers = {}
        self._fed = {}
        if getattr(self, "stream", None) is not None:
            for event in (self._sync, self.start, self.stop, self.h2d_start, self.h2d_stop):
                self.cudart.cudaEventDestroy(event)
            self.cudart.cudaStreamDestroy(self.stream)
            self.stream = None
        self.context = self.engine = self.runtime = None
