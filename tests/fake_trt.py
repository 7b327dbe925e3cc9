"""Fake ``tensorrt`` and ``cuda.bindings.runtime`` modules, for driving the TensorRT code on a CPU-only machine.

Only as much of the real APIs as engines.trt and engines.runners.TensorRtRunner use, with the names and
return conventions of TensorRT 10 (weakly typed: ``BuilderFlag.FP16/INT8``, ``platform_has_fast_*``) and
TensorRT 11 (no precision flags: strongly typed), and of cuda-python ((err, *values) tuples). The "device"
is host memory: cudaMalloc hands out real host addresses, so a fake engine computes on what was bound and a
test can see which pointers a replayed CUDA graph read. Installed into ``sys.modules`` with pytest's
monkeypatch by :func:`install`; nothing here imports tensorrt or cuda.
"""

from __future__ import annotations

import ctypes
import functools
import types
from types import SimpleNamespace

import numpy as np

ENGINE_BYTES = b"fake-engine"  # what the fake Runtime deserialises; anything else is "corrupt"


# ------------------------------------------------------------------ tensorrt: build side
class _Flag(int):
    """An enum member: int() gives its bit index, as TensorRT's enums do."""


class FakeInput:
    def __init__(self, name: str, shape: tuple[int, ...]):
        self.name, self.shape = name, shape


class FakeNetwork:
    def __init__(self, flags: int):
        self.flags = flags
        self.inputs: list[FakeInput] = []

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, i: int) -> FakeInput:
        return self.inputs[i]


class FakeParserError:
    def __init__(self, desc: str):
        self.desc = desc

    def __str__(self) -> str:
        return self.desc


class FakeProfile:
    def __init__(self):
        self.shapes: dict[str, tuple] = {}

    def set_shape(self, name, lo, opt, hi):  # the real one returns None
        self.shapes[name] = (tuple(lo), tuple(opt), tuple(hi))


class FakeTimingCache:
    def __init__(self, blob: bytes):
        self.blob = blob

    def serialize(self) -> bytes:
        return b"timing-cache"


class FakeConfig:
    def __init__(self, state):
        self.state = state
        self.flags: set = set()
        self.cleared: set = set()
        self.profiles: list[FakeProfile] = []
        self.cache = None

    def set_flag(self, flag):
        self.flags.add(flag)

    def clear_flag(self, flag):
        self.cleared.add(flag)

    def add_optimization_profile(self, profile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def create_timing_cache(self, blob: bytes):
        return FakeTimingCache(blob)

    def set_timing_cache(self, cache, ignore_mismatch: bool) -> bool:
        self.cache = cache
        return self.state.timing_cache_ok

    def get_timing_cache(self):
        return self.cache


def make_tensorrt(major: int = 10, strongly_typed_flag: bool = True) -> types.ModuleType:
    """A fake ``tensorrt`` of TensorRT ``major`` (10 or 11). ``trt.state`` records what a build did and holds
    the switches that make steps fail (``parse_ok``, ``build_ok``, ``timing_cache_ok``)."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = {10: "10.3.0", 11: "11.0.0"}[major]
    state = trt.state = SimpleNamespace(builds=0, parsed=None, network=None, config=None, parse_ok=True,
                                        build_ok=True, timing_cache_ok=True)

    class Logger:
        ERROR, WARNING, INFO = 1, 2, 3

        def __init__(self, severity=2):
            self.severity = severity

    flags = {"TF32": _Flag(7)}
    if major == 10:  # TensorRT 11 removed every precision-enabling flag
        flags.update(FP16=_Flag(0), INT8=_Flag(1), FP8=_Flag(12))
    trt.BuilderFlag = SimpleNamespace(**flags)
    creation = {"STRONGLY_TYPED": _Flag(1)} if strongly_typed_flag else {}
    if major == 10:
        creation["EXPLICIT_BATCH"] = _Flag(0)  # deprecated and ignored in 10
    trt.NetworkDefinitionCreationFlag = SimpleNamespace(**creation)
    trt.Logger = Logger

    class Builder:
        def __init__(self, logger):
            self.logger = logger
            if major == 10:
                self.platform_has_fast_fp16 = True
                self.platform_has_fast_int8 = False  # Orin-like fake: fast fp16, no fast int8 claimed

        def create_network(self, flags: int = 0):
            state.network = FakeNetwork(flags)
            return state.network

        def create_builder_config(self):
            state.config = FakeConfig(state)
            return state.config

        def create_optimization_profile(self):
            return FakeProfile()

        def build_serialized_network(self, network, config):
            state.builds += 1
            return ENGINE_BYTES if state.build_ok else None

    class OnnxParser:
        def __init__(self, network, logger):
            self.network, self.errors = network, []

        def parse(self, data: bytes) -> bool:
            import onnx

            if not state.parse_ok:
                self.errors = [FakeParserError("In node 3 (Foo): UNSUPPORTED_NODE:\n no importer")]
                return False
            model = onnx.load_from_string(data)
            state.parsed = model
            weights = {t.name for t in model.graph.initializer}
            for i in model.graph.input:
                if i.name not in weights:
                    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in i.type.tensor_type.shape.dim)
                    self.network.inputs.append(FakeInput(i.name, dims))
            return True

        @property
        def num_errors(self) -> int:
            return len(self.errors)

        def get_error(self, i: int):
            return self.errors[i]

    trt.Builder, trt.OnnxParser = Builder, OnnxParser
    _add_runtime(trt)
    return trt


# ------------------------------------------------------------------ tensorrt: runtime side
class FakeEngine:
    """One input ``x`` (B, 4) float32 with a profile of batch 1..4, one output ``y`` = 2 * relu(x)."""

    def __init__(self, trt, cudart):
        self.trt, self.cudart = trt, cudart
        self.names = ["x", "y"]
        self.num_io_tensors = 2
        self.profile = {"x": ((1, 4), (1, 4), (4, 4))}

    def get_tensor_name(self, i: int) -> str:
        return self.names[i]

    def get_tensor_mode(self, name: str):
        return self.trt.TensorIOMode.INPUT if name == "x" else self.trt.TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name: str):
        return "float32"

    def get_tensor_profile_shape(self, name: str, index: int):
        return self.profile[name]

    def create_execution_context(self):
        return FakeContext(self)


class FakeContext:
    """Checks shapes against the profile as TensorRT does (set_input_shape gives False outside it); the
    enqueue computes on the bound addresses, or is recorded into a CUDA graph while one is captured."""

    def __init__(self, engine: FakeEngine):
        self.engine = engine
        self.shapes: dict[str, tuple] = {}
        self.addresses: dict[str, int] = {}
        self.shape_calls: list[tuple] = []
        self.refuse_shapes = False
        self.refuse_addresses = False
        self.execute_ok = True
        self.runs = 0

    def set_input_shape(self, name, shape) -> bool:
        self.shape_calls.append((name, tuple(shape)))
        lo, _, hi = self.engine.profile[name]
        if self.refuse_shapes or len(shape) != len(lo) or any(not a <= s <= b for a, s, b in zip(lo, shape, hi)):
            return False
        self.shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name, ptr) -> bool:
        if self.refuse_addresses:
            return False
        self.addresses[name] = int(ptr)
        return True

    def get_tensor_shape(self, name):
        x = self.shapes.get("x")
        return (-1, 4) if x is None else (x[0], 4)

    def execute_async_v3(self, stream) -> bool:
        if not self.execute_ok:
            return False
        shape, src, dst = self.shapes["x"], self.addresses["x"], self.addresses["y"]  # bound now, read later

        def run():
            self.runs += 1
            n = int(np.prod(shape))
            x = np.frombuffer((ctypes.c_float * n).from_address(src), np.float32).reshape(shape)
            y = np.frombuffer((ctypes.c_float * n).from_address(dst), np.float32).reshape(shape)
            y[...] = 2 * np.maximum(x, 0)

        self.engine.cudart.enqueue(run)
        return True


def _add_runtime(trt) -> None:
    trt.TensorIOMode = SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
    trt.nptype = lambda dtype: np.dtype(dtype).type

    class Runtime:
        def __init__(self, logger):
            self.logger = logger

        def deserialize_cuda_engine(self, data: bytes):
            return FakeEngine(trt, trt.cudart) if data == ENGINE_BYTES else None

    trt.Runtime = Runtime


# ------------------------------------------------------------------ cuda-python runtime
class FakeStream:
    def __init__(self, handle: int):
        self.handle = handle

    def __int__(self) -> int:
        return self.handle


def make_cudart(version: str = "12.6.2", driver: int = 12060) -> types.ModuleType:
    """A fake ``cuda.bindings.runtime`` whose device memory is host memory. ``cudart.calls`` lists the calls
    by name; ``cudart.h2d`` counts host-to-device copies."""
    rt = types.ModuleType("cuda.bindings.runtime")
    rt.__version__ = version
    rt.calls, rt.h2d, rt.capturing, rt.memory = [], 0, None, {}
    rt.cudaMemcpyKind = SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2)
    rt.cudaStreamCaptureMode = SimpleNamespace(cudaStreamCaptureModeGlobal=0)

    def call(name, *values):
        rt.calls.append(name)
        return (0, *values)

    def enqueue(op):
        if rt.capturing is not None:
            rt.capturing.append(op)
        else:
            op()

    def malloc(n):
        buf = ctypes.create_string_buffer(n)
        rt.memory[ctypes.addressof(buf)] = buf
        return call("cudaMalloc", ctypes.addressof(buf))

    def memcpy(dst, src, n, kind, stream):
        if kind == 1:
            rt.h2d += 1
        ctypes.memmove(int(dst), int(src), n)
        return call("cudaMemcpyAsync")

    def begin(stream, mode):
        rt.capturing = []
        return call("cudaStreamBeginCapture")

    def end(stream):
        ops, rt.capturing = rt.capturing, None
        return call("cudaStreamEndCapture", ops)

    def launch(exe, stream):
        for op in exe:
            op()
        return call("cudaGraphLaunch")

    rt.enqueue = enqueue
    rt.cudaDriverGetVersion = lambda: call("cudaDriverGetVersion", driver)
    rt.cudaMalloc = malloc
    rt.cudaFree = lambda ptr: (rt.memory.pop(int(ptr), None), call("cudaFree"))[1]
    rt.cudaMemcpyAsync = memcpy
    rt.cudaStreamCreate = lambda: call("cudaStreamCreate", FakeStream(0x5A))
    rt.cudaStreamDestroy = lambda s: call("cudaStreamDestroy")
    rt.cudaStreamSynchronize = lambda s: call("cudaStreamSynchronize")
    rt.cudaStreamWaitEvent = lambda s, e, flags: call("cudaStreamWaitEvent")
    rt.cudaEventCreate = lambda: call("cudaEventCreate", object())
    rt.cudaEventDestroy = lambda e: call("cudaEventDestroy")
    rt.cudaEventRecord = lambda e, s: (rt.calls.append(("cudaEventRecord", int(s))), (0,))[1]
    rt.cudaEventElapsedTime = lambda a, b: call("cudaEventElapsedTime", 0.25)
    rt.cudaStreamBeginCapture = begin
    rt.cudaStreamEndCapture = end
    rt.cudaGraphInstantiate = lambda graph, flags: call("cudaGraphInstantiate", list(graph))
    rt.cudaGraphLaunch = launch
    rt.cudaGraphExecDestroy = lambda exe: call("cudaGraphExecDestroy")
    rt.cudaGraphDestroy = lambda graph: call("cudaGraphDestroy")
    return rt


class DeviceArray:
    """A "device" array for the fake runtime: host memory behind ``__cuda_array_interface__`` (v3)."""

    def __init__(self, array: np.ndarray, typestr: str | None = None, strides=None, stream=None):
        self.array = array  # keeps the memory alive
        self.__cuda_array_interface__ = {
            "shape": array.shape, "typestr": typestr or array.dtype.str, "data": (array.ctypes.data, False),
            "version": 3, "strides": strides, "stream": stream}
        self.shape = array.shape


def install(monkeypatch, major: int = 10, strongly_typed_flag: bool = True, cuda_version: str = "12.6.2",
            driver: int = 12060) -> SimpleNamespace:
    """Put fake tensorrt and cuda-python modules in sys.modules and make engines.trt see a GPU."""
    import sys

    from engines import runners, trt as trt_cache

    cudart = make_cudart(cuda_version, driver)
    trt = make_tensorrt(major, strongly_typed_flag)
    trt.cudart = cudart
    cuda = types.ModuleType("cuda")
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime, cuda.bindings = cudart, bindings
    for name, module in (("tensorrt", trt), ("cuda", cuda), ("cuda.bindings", bindings),
                         ("cuda.bindings.runtime", cudart)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(trt_cache, "unavailable_reason", lambda: None)
    monkeypatch.setattr(trt_cache, "gpu_identity", lambda: ("Fake Orin", "8.7"))
    monkeypatch.setattr(trt_cache, "l4t_version", lambda: "36.4.0")
    monkeypatch.setattr(runners, "_cuda_python_version", lambda cudart: cudart.__version__)
    # a fresh cache for the checked module, dropped with the fakes when the test ends
    monkeypatch.setattr(runners, "_cudart", functools.lru_cache(maxsize=1)(runners._cudart.__wrapped__))
    return SimpleNamespace(trt=trt, cudart=cudart)
