"""TensorRT engines: build from ONNX through the TensorRT Python API, with a strict cache.

An engine is only valid for the ONNX file, TensorRT version, GPU, precision
and optimisation profile it was built for. Each engine file has a JSON sidecar
holding that key; loading an engine whose key differs from the running system
fails with one line saying what differs (or rebuilds when asked). tensorrt and
the CUDA bindings are imported only when a build or a load happens, so this
module imports on a CPU-only machine.

TensorRT 10 and 11 differ in how precision is chosen:

- TensorRT 10 (JetPack 6 ships 10.3) builds "weakly typed" networks: fp16 and int8
  are builder flags (``BuilderFlag.FP16``/``INT8``) that let it pick lower-precision kernels;
- TensorRT 11 removed those flags (and ``platform_has_fast_fp16/int8``): every network is
  strongly typed, so the precision is the ONNX graph's. An fp16 engine is built from an fp16
  copy of the graph (:func:`fp16_graph`: float16 weights and activations, float32 inputs and
  outputs through Cast nodes), cached beside the engine; int8 is built from a Q/DQ graph
  (:mod:`engines.quantize`'s ``<stem>.int8.onnx``, explicit quantization; on TensorRT 10 the
  same graph with the INT8 flag), and a graph without Q/DQ nodes is refused there, as is fp8.

The optimisation profile (min/opt/max shape of every input) is part of the key
and of the file name: the batch (axis 0) runs 1..``batch_max``; every other
axis is the graph's, or comes from ``input_shapes`` where the graph leaves it
dynamic (a graph with dynamic non-batch axes and no shapes is refused).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from engines.onnx_utils import BadModelFileError, sha256_file
from engines.optional import OPTIONAL, available, require

PRECISIONS = ("fp32", "fp16", "int8", "fp8")
AS_IS = "onnx"  # EngineKey.graph: TensorRT parsed the ONNX file itself
FP16_GRAPH = "fp16-io32/1"  # EngineKey.graph: the graph of fp16_graph (bump when that pass changes)

Profile = dict  # {input name: (min shape, opt shape, max shape)}, in the graph's input order


@dataclass(frozen=True)
class EngineKey:
    onnx_sha256: str
    tensorrt: str
    gpu: str
    compute_capability: str
    precision: str
    batch_min: int
    batch_opt: int
    batch_max: int
    l4t: str | None = None  # Jetson only
    profile: str = ""  # every input's min/opt/max shape (profile_text); "" in sidecars older than it
    graph: str = AS_IS  # which graph TensorRT parsed: the ONNX file itself or its fp16 copy (FP16_GRAPH)

    @property
    def tensorrt_major(self) -> str:
        return self.tensorrt.split(".")[0]

    def file_stem(self, name: str) -> str:
        # the profile goes in as a digest (the full shapes are in the sidecar): names stay short for many inputs
        prof = hashlib.sha256(self.profile.encode()).hexdigest()[:8]
        return (f"{name}_{self.precision}_trt{self.tensorrt_major}_b{self.batch_max}_p{prof}_"
                f"{self.onnx_sha256[:12]}")

    def differences(self, other: "EngineKey") -> list[str]:
        return [f"{f.name}: engine {getattr(other, f.name)!r}, here {getattr(self, f.name)!r}"
                for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


class EngineMismatchError(RuntimeError):
    """The cached engine was built for another system or input (one line)."""


class TensorRTUnavailable(RuntimeError):
    """No TensorRT or no NVIDIA GPU here; the message is the reason shown when skipping."""


class TensorRTBuildError(RuntimeError):
    """A TensorRT build step returned a failure (one line naming the step and the file)."""


def unavailable_reason() -> str | None:
    """Why TensorRT engines cannot be built here, or None when they can."""
    if not available("tensorrt"):
        return f"tensorrt is not installed ({OPTIONAL['tensorrt']})"
    if not Path("/dev/nvidia0").exists() and not Path("/dev/nvhost-ctrl").exists():
        return "no NVIDIA GPU device found"
    return None


def l4t_version() -> str | None:
    """L4T release from /etc/nv_tegra_release on Jetson, else None."""
    p = Path("/etc/nv_tegra_release")
    if not p.exists():
        return None
    head = p.read_text().split(",")
    try:
        release = head[0].split("R")[1].split()[0]
        revision = head[1].split(":")[1].strip()
        return f"{release}.{revision}"
    except IndexError:
        return p.read_text().splitlines()[0].strip()


def gpu_identity() -> tuple[str, str]:
    """(name, compute capability "major.minor") of GPU 0, through torch (installed with the sim extra)."""
    import torch

    if not torch.cuda.is_available():
        raise TensorRTUnavailable("CUDA is not available to torch")
    major, minor = torch.cuda.get_device_capability(0)
    return torch.cuda.get_device_name(0), f"{major}.{minor}"


def strongly_typed(trt) -> bool:
    """True where TensorRT has no weak-typing precision flags (TensorRT 11+): the graph's types are the precision."""
    return not hasattr(trt.BuilderFlag, "FP16")


# ------------------------------------------------------------------ optimisation profile
def input_profile(onnx_path: str | Path, batch_max: int = 1,
                  input_shapes: dict[str, tuple[int, ...]] | None = None) -> Profile:
    """The optimisation profile of the graph's inputs: axis 0 (the batch) 1..batch_max, the others the graph's.

    ``input_shapes`` {input: full shape} fills the graph's dynamic non-batch axes (its axis 0 is ignored: the
    batch comes from ``batch_max``); a dynamic non-batch axis left unfilled is refused, never guessed.
    """
    onnx = require("onnx", "export")
    onnx_path = Path(onnx_path)
    if batch_max < 1:
        raise ValueError(f"batch_max must be at least 1, got {batch_max}")
    try:
        graph = onnx.load(str(onnx_path), load_external_data=False).graph
    except FileNotFoundError:
        raise BadModelFileError(f"ONNX file {onnx_path} does not exist; build it with: make engines") from None
    except Exception as e:  # noqa: BLE001 - protobuf errors have many types
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BadModelFileError(f"ONNX file {onnx_path} is corrupt or truncated ({first}); rebuild it with: "
                                "make engines") from None
    given = dict(input_shapes or {})
    weights = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in weights]  # old exporters list initializers as inputs
    unknown = sorted(set(given) - {i.name for i in inputs})
    if unknown:
        raise ValueError(f"input_shapes names {', '.join(unknown)}, which {onnx_path.name} does not have; "
                         f"its inputs: {', '.join(i.name for i in inputs)}")
    profile: Profile = {}
    for inp in inputs:
        if not inp.type.HasField("tensor_type"):
            raise BadModelFileError(f"ONNX file {onnx_path}: input {inp.name!r} is not a tensor; "
                                    "TensorRT takes tensors")
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in inp.type.tensor_type.shape.dim]
        want = given.get(inp.name)
        if want is not None and len(want) != len(dims):
            raise ValueError(f"input_shapes[{inp.name!r}] = {tuple(want)} has rank {len(want)}; "
                             f"{onnx_path.name} gives {inp.name!r} rank {len(dims)}")
        if not dims:  # a scalar
            profile[inp.name] = ((), (), ())
            continue
        rest = []
        for axis, d in enumerate(dims[1:], start=1):
            if d is None and want is None:
                raise BadModelFileError(
                    f"ONNX file {onnx_path}: input {inp.name!r} axis {axis} is dynamic; pass its shape "
                    f"(build_engine(..., input_shapes={{{inp.name!r}: (1, ...)}})) or export it with fixed dims")
            if d is not None and want is not None and int(want[axis]) != d:
                raise ValueError(f"input_shapes[{inp.name!r}] axis {axis} is {want[axis]}, but {onnx_path.name} "
                                 f"fixes it to {d}")
            rest.append(d if d is not None else int(want[axis]))
        if any(r < 1 for r in rest):
            raise ValueError(f"input_shapes[{inp.name!r}] = {tuple(want)}: every axis must be at least 1")
        if dims[0] is None:
            profile[inp.name] = ((1, *rest), (1, *rest), (batch_max, *rest))
        elif batch_max == 1:
            profile[inp.name] = ((dims[0], *rest),) * 3
        else:
            raise BadModelFileError(f"ONNX file {onnx_path}: input {inp.name!r} has a fixed batch axis "
                                    f"({dims[0]}); a profile up to batch {batch_max} needs it exported dynamic")
    return profile


def profile_text(profile: Profile) -> str:
    """The profile as the key stores it: ``name:min/opt/max`` per input, shapes as ``1x40``, ';'-joined."""
    return ";".join(f"{name}:" + "/".join("x".join(str(d) for d in s) for s in shapes)
                    for name, shapes in profile.items())


def system_key(onnx_path: str | Path, precision: str, batch_max: int = 1,
               input_shapes: dict[str, tuple[int, ...]] | None = None) -> EngineKey:
    """The key an engine for this ONNX file would have on this machine."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    reason = unavailable_reason()
    if reason:
        raise TensorRTUnavailable(reason)
    trt = require("tensorrt")
    gpu, cc = gpu_identity()
    profile = profile_text(input_profile(onnx_path, batch_max, input_shapes))
    graph = FP16_GRAPH if precision == "fp16" and strongly_typed(trt) else AS_IS
    return EngineKey(sha256_file(onnx_path), trt.__version__, gpu, cc, precision, 1, 1, batch_max, l4t_version(),
                     profile, graph)


def write_sidecar(engine_path: Path, key: EngineKey, extra: dict | None = None) -> None:
    engine_path.with_suffix(".json").write_text(json.dumps({"key": asdict(key), **(extra or {})}, indent=1) + "\n")


def read_sidecar(engine_path: Path) -> EngineKey:
    side = engine_path.with_suffix(".json")
    if not engine_path.is_file():
        raise BadModelFileError(f"engine {engine_path} does not exist; build it with: make engines")
    if not side.is_file():
        raise EngineMismatchError(f"engine {engine_path} has no sidecar {side.name}; rebuild it with: make engines")
    try:
        return EngineKey(**json.loads(side.read_text())["key"])
    except (ValueError, KeyError, TypeError) as e:
        raise EngineMismatchError(f"sidecar {side} is unreadable ({e}); rebuild with: make engines") from None


def check_engine(engine_path: Path, expected: EngineKey) -> None:
    """Refuse an engine whose key is not the running system's, naming every difference."""
    found = read_sidecar(engine_path)
    diff = expected.differences(found)
    if diff:
        raise EngineMismatchError(f"engine {engine_path.name} was built for another setup ({'; '.join(diff)}); "
                                  "rebuild it with: make engines")


def find_engine(onnx_path: str | Path, folder: str | Path, precision: str, batch_max: int,
                rebuild: str = "make engines") -> Path:
    """The engine ``make engines`` built in ``folder`` for this graph, precision and batch profile on this GPU
    and TensorRT (found by its key, whatever the graph's file name), checked against its sidecar. A run never
    builds one: a missing or foreign engine is one line naming ``rebuild``, the command that builds it."""
    key = system_key(onnx_path, precision, batch_max)
    folder = Path(folder)
    suffix = key.file_stem("")  # "_<precision>_trt<major>_b<max>_p<profile>_<graph sha>"
    found = sorted(folder.glob(f"*{suffix}.engine"))
    if not found:
        raise EngineMismatchError(f"no TensorRT engine of {Path(onnx_path).name} ({precision}, batch 1..{batch_max}, "
                                  f"TensorRT {key.tensorrt}, {key.gpu}) in {folder}; build it with: {rebuild}")
    try:
        check_engine(found[0], key)
    except EngineMismatchError as e:
        raise EngineMismatchError(str(e).replace("make engines", rebuild)) from None
    return found[0]


# ------------------------------------------------------------------ fp16 graph (strongly typed TensorRT)
# Ops kept in float32, with Casts around them: their ONNX schemas take no float16 in some input (Resize and
# Upsample scales, Range) or they make float32 unless told otherwise (the Random* ops' dtype defaults to it).
KEEP_FP32_OPS = frozenset({"Range", "Resize", "Upsample", "RoiAlign", "NonMaxSuppression", "RandomNormal",
                           "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"})
_FP16_MAX = 65504.0


def _to_fp16_array(arr) -> np.ndarray:
    """float32 values as float16; finite values beyond its range saturate to +-65504 (as masks of -1e9 need)."""
    arr = np.asarray(arr, np.float32)
    finite = np.isfinite(arr)
    return np.where(finite, np.clip(arr, -_FP16_MAX, _FP16_MAX), arr).astype(np.float16)


def to_fp16(model, source: str = "the graph"):
    """An fp16 copy of an fp32 ONNX model with float32 inputs and outputs (Cast nodes at the boundary).

    Float initializers, Constant values and float types become float16; ``Cast(to=FLOAT)`` casts to float16;
    ops in :data:`KEEP_FP32_OPS` run in float32 between Casts (their constant float inputs stay float32). The
    result is checked with ONNX's strict type inference; graphs with control flow (If/Loop/Scan) are refused.
    """
    onnx = require("onnx", "export")
    from onnx import TensorProto, helper, numpy_helper

    FLOAT, HALF = TensorProto.FLOAT, TensorProto.FLOAT16
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for node in g.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            raise BadModelFileError(f"{source}: node {node.name or node.op_type!r} ({node.op_type}) holds a subgraph; "
                                    "the fp16 pass does not convert control flow (export it unrolled, or build fp32)")
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception as e:  # noqa: BLE001
        raise BadModelFileError(f"{source}: ONNX type inference fails ({(str(e).splitlines() or ['?'])[0]}); "
                                "cannot make its fp16 graph") from None
    types = {v.name: v.type.tensor_type.elem_type
             for v in list(inferred.graph.input) + list(inferred.graph.output) + list(inferred.graph.value_info)}
    types.update({t.name: t.data_type for t in g.initializer})
    names = set(types) | {o for n in g.node for o in n.output} | {i for n in g.node for i in n.input}

    def fresh(base: str) -> str:
        name, k = base, 0
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.add(name)
        return name

    consumers: dict[str, list] = {}
    for node in g.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    graph_outputs = {o.name for o in g.output}

    def only_fp32_ops_use(name: str) -> bool:
        users = consumers.get(name, [])
        return bool(users) and all(n.op_type in KEEP_FP32_OPS for n in users) and name not in graph_outputs

    kept = set()  # float32 constants read only by KEEP_FP32_OPS: left as they are, no Cast needed
    for t in g.initializer:
        if t.data_type == FLOAT:
            if only_fp32_ops_use(t.name):
                kept.add(t.name)
            else:
                t.CopyFrom(numpy_helper.from_array(_to_fp16_array(numpy_helper.to_array(t)), t.name))
    nodes = []
    for node in g.node:
        pre, post = [], []
        if node.op_type in KEEP_FP32_OPS:
            for k, name in enumerate(node.input):
                if name and types.get(name) == FLOAT and name not in kept:
                    cast = fresh(f"{name}__fp32")
                    pre.append(helper.make_node("Cast", [name], [cast], to=FLOAT, name=fresh(f"{cast}_cast")))
                    node.input[k] = cast
            for k, name in enumerate(node.output):
                if name and types.get(name) == FLOAT:
                    raw = fresh(f"{name}__fp32")
                    node.output[k] = raw
                    post.append(helper.make_node("Cast", [raw], [name], to=HALF, name=fresh(f"{name}_cast")))
        elif node.op_type == "Constant":
            if node.output[0] in consumers and only_fp32_ops_use(node.output[0]):
                kept.add(node.output[0])
            else:
                for a in node.attribute:
                    if a.name == "value" and a.t.data_type == FLOAT:
                        a.t.CopyFrom(numpy_helper.from_array(_to_fp16_array(numpy_helper.to_array(a.t)),
                                                             a.t.name))
                    elif a.name in ("value_float", "value_floats"):
                        arr = np.array(a.f if a.name == "value_float" else list(a.floats), np.float32)
                        node.attribute.remove(a)
                        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(
                            _to_fp16_array(arr))))
                        break
        else:
            for a in node.attribute:
                if a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == FLOAT:
                    a.i = HALF  # Cast(to=float), EyeLike(dtype=float): float16 inside the graph
                elif a.name == "value" and a.type == onnx.AttributeProto.TENSOR and a.t.data_type == FLOAT:
                    a.t.CopyFrom(numpy_helper.from_array(_to_fp16_array(numpy_helper.to_array(a.t)),
                                                         a.t.name))  # ConstantOfShape
        nodes.extend(pre + [node] + post)
    # the boundary: float32 inputs are cast to float16 on entry, float16 results to float32 on exit
    weights = {t.name for t in g.initializer}
    head, tail = [], []
    for inp in g.input:
        if inp.name in weights or inp.type.tensor_type.elem_type != FLOAT:
            continue
        inner = fresh(f"{inp.name}__fp16")
        for node in nodes:
            for k, name in enumerate(node.input):
                if name == inp.name:
                    node.input[k] = inner
        head.append(helper.make_node("Cast", [inp.name], [inner], to=HALF, name=fresh(f"{inner}_cast")))
    inputs = {i.name for i in g.input}
    for outp in g.output:
        if outp.type.tensor_type.elem_type != FLOAT or outp.name in inputs:
            continue
        inner = fresh(f"{outp.name}__fp16")
        for node in nodes:
            for k, name in enumerate(node.output):
                if name == outp.name:
                    node.output[k] = inner
            for k, name in enumerate(node.input):
                if name == outp.name:
                    node.input[k] = inner
        tail.append(helper.make_node("Cast", [inner], [outp.name], to=FLOAT, name=fresh(f"{outp.name}_cast")))
    del g.node[:]
    g.node.extend(head + nodes + tail)
    del g.value_info[:]  # the float32 types recorded there are stale; TensorRT and ORT infer their own
    try:
        onnx.checker.check_model(out)
        onnx.shape_inference.infer_shapes(out, check_type=True, strict_mode=True)
    except Exception as e:  # noqa: BLE001
        raise BadModelFileError(f"{source}: the fp16 pass made an inconsistent graph "
                                f"({(str(e).strip().splitlines() or ['?'])[0]}); build fp32 instead") from None
    return out


def fp16_graph(onnx_path: str | Path, out_path: str | Path | None = None) -> Path:
    """The fp16 copy of ``onnx_path`` (:func:`to_fp16`), written once to ``out_path`` (default: beside it as
    ``<stem>.fp16.onnx``) and reused while its metadata names this source's sha256 and this pass's version."""
    onnx = require("onnx", "export")
    onnx_path = Path(onnx_path)
    out_path = Path(out_path) if out_path is not None else onnx_path.with_name(f"{onnx_path.stem}.fp16.onnx")
    source_sha = sha256_file(onnx_path)
    if out_path.is_file():
        try:
            meta = {p.key: p.value for p in onnx.load(str(out_path), load_external_data=False).metadata_props}
        except Exception:  # noqa: BLE001 - a broken cached copy is simply made again
            meta = {}
        if meta.get("fp16_source_sha256") == source_sha and meta.get("fp16_pass") == FP16_GRAPH:
            return out_path
    from engines.onnx_utils import check_onnx_file

    model = to_fp16(check_onnx_file(onnx_path), str(onnx_path))
    for k, v in (("fp16_source_sha256", source_sha), ("fp16_pass", FP16_GRAPH)):
        entry = model.metadata_props.add()
        entry.key, entry.value = k, v
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, out_path)  # a reader never sees half a file
    return out_path


# ------------------------------------------------------------------ build
def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def build_engine(onnx_path: str | Path, out_dir: str | Path, name: str, precision: str = "fp16",
                 batch_max: int = 1, input_shapes: dict[str, tuple[int, ...]] | None = None,
                 timing_cache: str | Path | None = None, rebuild: bool = False) -> Path:
    """Build (or reuse from the cache) a serialized engine; returns its path.

    ``input_shapes`` {input: full shape} fills dynamic non-batch axes (see :func:`input_profile`). On a strongly
    typed TensorRT (11+) an fp16 engine is built from :func:`fp16_graph`'s copy, cached in ``out_dir``.
    """
    onnx_path = Path(onnx_path)
    key = system_key(onnx_path, precision, batch_max, input_shapes)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    engine_path = out_dir / f"{key.file_stem(name)}.engine"
    from engines.cache import reuse, write_sealed

    if not rebuild and reuse(engine_path, "TensorRT engine"):  # sealed when built: a damaged plan is rebuilt
        check_engine(engine_path, key)
        return engine_path
    trt = require("tensorrt")
    if timing_cache is not None:  # one per TensorRT major: another major's cache is refused after an upgrade
        tc = Path(timing_cache)
        timing_cache = tc.with_name(f"{tc.stem}_trt{str(trt.__version__).split('.')[0]}{tc.suffix}")
    typed = strongly_typed(trt)
    what = f"{onnx_path.name} ({precision}, TensorRT {trt.__version__})"
    if typed and precision in ("int8", "fp8"):
        from engines.onnx_utils import has_qdq

        if precision == "fp8" or not has_qdq(onnx_path):
            raise TensorRTUnavailable(f"TensorRT {trt.__version__} builds {precision} only from a graph with Q/DQ "
                                      "nodes (explicit quantization): for int8, the Q/DQ graph make engines builds "
                                      "(<stem>.int8.onnx, engines.quantize); else use fp16 or fp32")
    graph_path = onnx_path
    if key.graph == FP16_GRAPH:
        graph_path = fp16_graph(onnx_path, out_dir / f"{name}_{key.onnx_sha256[:12]}.fp16.onnx")

    def made(obj, step: str):
        if obj is None:
            raise TensorRTBuildError(f"TensorRT {step} returned nothing for {what}")
        return obj

    logger = trt.Logger(trt.Logger.WARNING)
    builder = made(trt.Builder(logger), "Builder()")
    flags = 0
    if typed and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)  # implied on 11; explicit where it exists
    network = made(builder.create_network(flags), "create_network")
    parser = made(trt.OnnxParser(network, logger), "OnnxParser()")
    if not parser.parse(graph_path.read_bytes()):
        errs = "; ".join(_one_line(parser.get_error(i)) for i in range(parser.num_errors)) or "no error recorded"
        raise BadModelFileError(f"TensorRT cannot parse {graph_path}: {errs}")
    config = made(builder.create_builder_config(), "create_builder_config")
    if precision == "fp32" and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)  # TF32 is on by default (Ampere+); fp32 should mean fp32
    if not typed:  # TensorRT 10: precision by builder flags, each checked against what this GPU has
        if precision == "fp16":
            if not getattr(builder, "platform_has_fast_fp16", True):
                raise TensorRTUnavailable("this GPU has no fast FP16")
            config.set_flag(trt.BuilderFlag.FP16)
        elif precision == "int8":
            if not getattr(builder, "platform_has_fast_int8", False) or not hasattr(trt.BuilderFlag, "INT8"):
                raise TensorRTUnavailable("this GPU has no fast INT8")
            config.set_flag(trt.BuilderFlag.INT8)
        elif precision == "fp8":
            cc = tuple(int(v) for v in key.compute_capability.split("."))
            if cc < (8, 9) or not hasattr(trt.BuilderFlag, "FP8"):
                raise TensorRTUnavailable(f"FP8 needs compute capability 8.9+ and TensorRT with FP8; "
                                          f"here {key.compute_capability}")
            config.set_flag(trt.BuilderFlag.FP8)
    profile_shapes = input_profile(onnx_path, batch_max, input_shapes)
    profile = made(builder.create_optimization_profile(), "create_optimization_profile")
    for i in range(network.num_inputs):
        inp = network.get_input(i)
        if inp.name not in profile_shapes:
            raise TensorRTBuildError(f"TensorRT sees an input {inp.name!r} that {onnx_path.name} does not declare")
        lo, opt, hi = profile_shapes[inp.name]
        if profile.set_shape(inp.name, lo, opt, hi) is False:
            raise TensorRTBuildError(f"TensorRT refused the profile {lo}/{opt}/{hi} of input {inp.name!r} of {what}")
    if config.add_optimization_profile(profile) < 0:
        raise TensorRTBuildError(f"TensorRT refused the optimisation profile of {what} ({key.profile})")
    blob = Path(timing_cache).read_bytes() if timing_cache is not None and Path(timing_cache).exists() else b""
    cache = config.create_timing_cache(blob)
    if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
        raise TensorRTBuildError(f"timing cache {timing_cache} was made by another TensorRT or GPU; delete it "
                                 "and build again")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise TensorRTBuildError(f"TensorRT failed to build {name} from {what}; its log above says why")
    data = bytes(serialized)
    if not data:
        raise TensorRTBuildError(f"TensorRT built an empty engine for {name} from {what}")
    write_sidecar(engine_path, key, {"onnx": str(onnx_path), "parsed": str(graph_path)})
    write_sealed(engine_path, lambda tmp: tmp.write_bytes(data))  # never a truncated engine under its name
    if timing_cache is not None:
        blob = made(config.get_timing_cache(), "get_timing_cache").serialize()
        tmp = Path(timing_cache).with_name(Path(timing_cache).name + ".tmp")
        tmp.write_bytes(bytes(made(blob, "timing cache serialize")))
        os.replace(tmp, timing_cache)
    return engine_path
