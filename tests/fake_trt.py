"""Fake ``tensorrt`` and ``cuda.bindings.runtime`` modules, for driving the TensorRT code on a CPU-only machine.

Only as much of the real APIs as engines.trt and engines.runners.TensorRtRunner use, with the names and
return conventions of TensorRT 10 (weakly typed: ``BuilderFlag.FP16/INT8``, ``platform_has_fast_*``) and
TensorRT 11 (no precision flags: strongly typed), and of cuda-python ((err, *values) tuples). The "device"
is host memory: cudaMalloc hands out real host addresses, so a fake engine computes on what was bound and a
test can see which pointers a replayed CUDA graph read. Time on the "device" is a clock that copies and
engine runs advance (``cudart.clock_ms``: a host-to-device copy of n bytes takes ``n / h2d_bytes_per_ms``, an
engine run ``run_ms``), and CUDA events read it when recorded, so event-timed intervals are exact. Engines
other than the one-input :class:`FakeEngine` are declared by their inputs and outputs (:class:`SpecEngine`,
:func:`octo_engines`: Octo's backbone and sampler). Installed into ``sys.modules`` with pytest's monkeypatch
by :func:`install`; nothing here imports tensorrt or cuda.
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
            self.engine.cudart.clock_ms += self.engine.cudart.run_ms
            n = int(np.prod(shape))
            x = np.frombuffer((ctypes.c_float * n).from_address(src), np.float32).reshape(shape)
            y = np.frombuffer((ctypes.c_float * n).from_address(dst), np.float32).reshape(shape)
            y[...] = 2 * np.maximum(x, 0)

        self.engine.cudart.enqueue(run)
        return True


def _host_array(ptr: int, shape, dtype) -> np.ndarray:
    """The "device" memory at ``ptr`` as a numpy array (host memory in these fakes), no copy."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    return np.frombuffer((ctypes.c_char * max(1, n)).from_address(int(ptr)), dtype, int(np.prod(shape))).reshape(shape)


class SpecEngine:
    """An engine declared by its tensors: ``inputs`` / ``outputs`` {name: (shape, dtype)} with -1 for the batch
    axis (profile batch 1..``max_batch``), and ``fn(**inputs) -> {output: array}`` computed on what is bound at
    the bound addresses when the enqueue runs (or replays)."""

    def __init__(self, trt, cudart, inputs: dict, outputs: dict, fn, max_batch: int = 8):
        self.trt, self.cudart = trt, cudart
        self.specs = {**inputs, **outputs}
        self.inputs, self.fn, self.max_batch = list(inputs), fn, max_batch
        self.names = [*inputs, *outputs]
        self.num_io_tensors = len(self.names)

    def get_tensor_name(self, i: int) -> str:
        return self.names[i]

    def get_tensor_mode(self, name: str):
        return self.trt.TensorIOMode.INPUT if name in self.inputs else self.trt.TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name: str):
        return np.dtype(self.specs[name][1]).name

    def get_tensor_profile_shape(self, name: str, index: int):
        shape = self.specs[name][0]
        return (tuple(1 if d < 0 else d for d in shape), tuple(1 if d < 0 else d for d in shape),
                tuple(self.max_batch if d < 0 else d for d in shape))

    def create_execution_context(self):
        return SpecContext(self)


class SpecContext:
    """:class:`FakeContext` for a :class:`SpecEngine`; ``runs`` counts the runs, ``read`` holds the input
    addresses each run read."""

    def __init__(self, engine: SpecEngine):
        self.engine = engine
        self.shapes: dict[str, tuple] = {}
        self.addresses: dict[str, int] = {}
        self.read: list[dict[str, int]] = []
        self.runs = 0

    def set_input_shape(self, name, shape) -> bool:
        want = self.engine.specs[name][0]
        if len(shape) != len(want) or any(w >= 0 and s != w for s, w in zip(shape, want)):
            return False
        if not 1 <= shape[0] <= self.engine.max_batch:
            return False
        self.shapes[name] = tuple(int(d) for d in shape)
        return True

    def set_tensor_address(self, name, ptr) -> bool:
        self.addresses[name] = int(ptr)
        return True

    def get_tensor_shape(self, name):
        b = next((self.shapes[n][0] for n in self.engine.inputs if n in self.shapes), -1)
        return tuple(b if d < 0 else d for d in self.engine.specs[name][0])

    def execute_async_v3(self, stream) -> bool:
        e = self.engine
        shapes = {n: self.get_tensor_shape(n) for n in e.names}
        addresses = dict(self.addresses)  # bound now, read when the run runs

        def run():
            self.runs += 1
            e.cudart.clock_ms += e.cudart.run_ms
            self.read.append({n: addresses[n] for n in e.inputs})
            ins = {n: _host_array(addresses[n], shapes[n], e.specs[n][1]).copy() for n in e.inputs}
            for n, value in e.fn(**ins).items():
                _host_array(addresses[n], shapes[n], e.specs[n][1])[...] = value

        e.cudart.enqueue(run)
        return True


def octo_engines(trt, cfg, folder) -> tuple:
    """Fake TensorRT engines of Octo's two graphs (:mod:`engines.octo.export`'s interface) for ``cfg``, written
    to ``folder``: (backbone path, sampler path). The backbone's readout is a function of every input (so a
    wrong binding shows); the sampler gives ``tanh`` of its inputs' sums as actions."""
    from pathlib import Path

    from engines.octo.export import SAMPLER_INPUTS, goal_input_names

    u8, f32 = np.uint8, np.float32
    cams = cfg.cameras
    bb_in = {f"image_{c.name}": ((-1, cfg.window, *c.image_size, 3), u8) for c in cams}
    bb_in.update({"lang_embedding": ((-1, cfg.lang_tokens, cfg.t5.d_model), f32),
                  "masks": ((-1, cfg.window, 1 + len(cams)), f32), "lang_mask": ((-1,), f32)})
    bb_in.update({n: ((-1, *c.image_size, 3), u8) for n, c in zip(goal_input_names(cfg),
                                                                    [c for c in cams if c.stack_task_image])})
    flat = cfg.flat_action_dim

    def backbone(**x):
        b = next(iter(x.values())).shape[0]
        total = sum(v.reshape(b, -1).astype(np.float64).mean(axis=1) for v in x.values())
        return {"readout": np.tile((total / 1e3).astype(f32)[:, None], (1, cfg.token_dim))}

    def sampler(readout, init_noise, step_noise):
        b = readout.shape[0]
        s = readout.mean(axis=1) + init_noise.mean(axis=1) + step_noise.reshape(b, -1).mean(axis=1)
        return {"actions": np.tanh(np.tile(s[:, None, None], (1, cfg.action_horizon, cfg.action_dim))).astype(f32)}

    sm_in = dict(zip(SAMPLER_INPUTS, [((-1, cfg.token_dim), f32), ((-1, flat), f32),
                                      ((-1, cfg.diffusion_steps, flat), f32)]))
    paths = []
    for part, ins, outs, fn in (("backbone", bb_in, {"readout": ((-1, cfg.token_dim), f32)}, backbone),
                                ("sampler", sm_in, {"actions": ((-1, cfg.action_horizon, cfg.action_dim), f32)},
                                 sampler)):
        data = f"fake-octo-{part}".encode()
        trt.engines[data] = functools.partial(SpecEngine, trt, trt.cudart, ins, outs, fn)
        path = Path(folder) / f"{cfg.name}_{part}.engine"
        path.write_bytes(data)
        paths.append(path)
    return tuple(paths)


def _add_runtime(trt) -> None:
    trt.TensorIOMode = SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
    trt.nptype = lambda dtype: np.dtype(dtype).type
    trt.engines = {}  # serialized bytes -> factory of a SpecEngine (octo_engines)

    class Runtime:
        def __init__(self, logger):
            self.logger = logger

        def deserialize_cuda_engine(self, data: bytes):
            if data in trt.engines:
                return trt.engines[data]()
            return FakeEngine(trt, trt.cudart) if data == ENGINE_BYTES else None

    trt.Runtime = Runtime


# ------------------------------------------------------------------ cuda-python runtime
class FakeEvent:
    """A CUDA event: the fake device clock when it was last recorded."""

    def __init__(self):
        self.t = 0.0


class FakeStream:
    def __init__(self, handle: int):
        self.handle = handle

    def __int__(self) -> int:
        return self.handle


def make_cudart(version: str = "12.6.2", driver: int = 12060) -> types.ModuleType:
    """A fake ``cuda.bindings.runtime`` whose device memory is host memory. ``cudart.calls`` lists the calls
    by name; ``cudart.h2d`` counts host-to-device copies, ``cudart.h2d_bytes`` their bytes; ``clock_ms`` is the
    device's time (copies and engine runs advance it; events record it)."""
    rt = types.ModuleType("cuda.bindings.runtime")
    rt.__version__ = version
    rt.calls, rt.h2d, rt.h2d_bytes, rt.capturing, rt.memory = [], 0, 0, None, {}
    # 1 MiB per ms host to device, 0.25 ms per run: powers of two, so the clock sums (and intervals) are exact
    rt.clock_ms, rt.h2d_bytes_per_ms, rt.run_ms = 0.0, float(2 ** 20), 0.25
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
            rt.h2d_bytes += n
            rt.clock_ms += n / rt.h2d_bytes_per_ms
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
    def record(event, stream):
        rt.calls.append(("cudaEventRecord", int(stream)))
        event.t = rt.clock_ms
        return (0,)

    rt.cudaEventCreate = lambda: call("cudaEventCreate", FakeEvent())
    rt.cudaEventDestroy = lambda e: call("cudaEventDestroy")
    rt.cudaEventRecord = record
    rt.cudaEventElapsedTime = lambda a, b: call("cudaEventElapsedTime", b.t - a.t)
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


@functools.lru_cache(maxsize=1)
def _fake_cuda_class():
    import torch

    class FakeCudaTensor(torch.Tensor):
        """A CPU tensor that says it is on a CUDA device (``is_cuda``, ``__cuda_array_interface__`` v3 of its
        memory, which is what the fake runtime's "device" memory is). torch ops keep the subclass, so frames made
        of it stay "on the device" through the policy's torch preprocessing, as GPU scenes' frames do."""

        __module__ = "torch.fake_cuda"  # engines.zero_copy.is_torch_tensor goes by the type's module

        @property
        def is_cuda(self) -> bool:
            return True

        @property
        def __cuda_array_interface__(self) -> dict:
            size = self.element_size()
            return {"shape": tuple(self.shape), "typestr": torch.empty(0, dtype=self.dtype).numpy().dtype.str,
                    "data": (self.data_ptr(), False), "version": 3,
                    "strides": tuple(s * size for s in self.stride()), "stream": None}

    return FakeCudaTensor


def fake_cuda(array: np.ndarray):
    """A torch tensor of ``array`` (its memory shared) that claims to be a CUDA tensor: see ``_fake_cuda_class``."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(array)).as_subclass(_fake_cuda_class())


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
