"""Lower-precision ONNX graphs for ONNX Runtime (and TensorRT): INT8 by Q/DQ, and the BF16 verdict.

INT8 (``int8_graph``): ``onnxruntime.quantization.quantize_static`` in the QDQ format, static ranges
from MinMax calibration over recorded inputs, int8 weights per output channel and int8 activations, both
symmetric (zero point 0): the form TensorRT's explicit quantization takes, so the same file runs on ONNX
Runtime's CPU provider (which fuses the Q/DQ pairs into integer kernels) and builds a TensorRT INT8 engine
(on TensorRT 11, strongly typed, Q/DQ is the only way to INT8). Only the ops in ``ops`` are quantized
(default: Gemm, MatMul and Conv, where the arithmetic is); LayerNorm's mean and variance, Softmax, GELU,
the diffusion schedule's arithmetic and every residual Add stay float32: they are a small share of the
time, and their dynamic range (softmax's near-zero probabilities, variance) is the kind one int8 scale
per tensor cannot hold. Before quantizing, the graph gets the standard-ONNX rewrites of
:mod:`engines.octo.optimize` that survive quantization (static reshapes, LayerNormalization: a TensorRT
and ONNX Runtime op) and is constant-folded by ONNX Runtime (basic level, its transpose optimizer off), so
that weights transposed by the exporter become initializers the quantizer sees while the attention
pattern stays as exported: ONNX Runtime's load-time rewrite (``OnnxRuntimeRunner(rewrite=True)``) then
still fuses attention and GELU in the Q/DQ graph, as in the fp32 one (quantizing the raw export instead
left all 25 layer norms and 12 attention blocks unfused: 1,506 nodes against 1,086, and twice the readout
error).

The calibration set is named and hashed (:func:`arrays_sha256`, over the arrays' names, dtypes, shapes
and bytes); an INT8 graph's metadata holds the weights digest of its source, the calibration's name and
hash, and this pass's version, and :func:`find_int8` accepts a file only when all match.

BF16: ONNX Runtime's CPU execution provider has no bfloat16 kernels for MatMul, Gemm, Add or Softmax
(:func:`ort_bf16_reason` probes it: a one-node bfloat16 MatMul fails to load, NOT_IMPLEMENTED), so no
BF16 graph is built for ``ort``; ``--precision bf16`` on ``ort`` is refused in one line naming that.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from engines.onnx_utils import has_qdq  # noqa: F401 - what an INT8 graph is, named here too
from engines.optional import require

INT8_PASS = "qdq-s8s8-symmetric-minmax/3"  # bump when the pass changes: older INT8 graphs are rebuilt (3: ranges over
# every calibration feed; 2 took only the last 150 mod 16, microsoft/onnxruntime#18893)
DEFAULT_OPS = ("Gemm", "MatMul", "Conv")
ORT_PRECISIONS = ("fp32", "int8", "bf16")  # what --precision may ask of the ort backend (bf16: refused here)


def arrays_sha256(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over named arrays in a canonical layout: for each name in sorted order, ``name|dtype|shape|``
    then the C-order bytes. Independent of the file format that holds them (npz zips carry timestamps)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        if a.dtype.kind == "U":  # strings: their UTF-8, not numpy's fixed-width layout
            h.update(f"{name}|str|{a.shape}|".encode())
            h.update("\x00".join(a.ravel().tolist()).encode())
            continue
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Calibration:
    """A named, hashed calibration set: ``feeds()`` yields one batch-1 feed dict per sample."""

    name: str
    sha256: str
    feeds: Callable[[], Iterable[Mapping[str, np.ndarray]]] = field(compare=False, repr=False)
    samples: int = 0


def input_specs(onnx_path: str | Path) -> dict[str, tuple[tuple, np.dtype]]:
    """{input: (shape with dynamic axes as -1, numpy dtype)} of a graph."""
    onnx = require("onnx", "export")
    from onnx import helper

    m = onnx.load(str(onnx_path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    out = {}
    for i in m.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
        out[i.name] = (shape, np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)))
    return out


def complete_feeds(feeds: Mapping[str, np.ndarray], specs: Mapping[str, tuple[tuple, np.dtype]]) -> dict:
    """``feeds`` restricted to the graph's inputs; an input the recording lacks whose name starts with
    ``goal_`` (a goal-image input added after the recording) is fed zeros of the feeds' batch; any other
    missing input is an error naming it."""
    b = next(iter(feeds.values())).shape[0]
    out = {}
    for name, (shape, dtype) in specs.items():
        if name in feeds:
            out[name] = np.ascontiguousarray(feeds[name], dtype)
        elif name.startswith("goal_"):
            out[name] = np.zeros((b, *[max(d, 1) for d in shape[1:]]), dtype)
        else:
            raise ValueError(f"the calibration feeds have no input {name!r} (they hold {', '.join(sorted(feeds))})")
    return out


PRE_PASSES = ("static_reshapes", "layer_norm")  # engines.octo.optimize rewrites applied before quantizing


def _fold(src: Path, dst: Path) -> None:
    """The standard rewrites of :data:`PRE_PASSES`, then ONNX Runtime's basic graph optimisations (constant
    folding; no fusions into contrib ops; the transpose optimizer off, so that attention keeps the shape the
    load-time rewrite matches) into ``dst``."""
    onnx = require("onnx", "export")
    ort = require("onnxruntime", "export")
    from engines.octo.optimize import optimize_model

    model = onnx.load(str(src))
    optimize_model(model, passes=PRE_PASSES)
    pre = dst.with_name(f"pre_{dst.name}")
    onnx.save(model, str(pre))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.optimized_model_filepath = str(dst)
    opts.log_severity_level = 3
    ort.InferenceSession(str(pre), opts, providers=["CPUExecutionProvider"], disabled_optimizers=["TransposeOptimizer"])


def gemm_to_matmul(model) -> int:
    """Rewrite each Gemm that is a plain product (alpha 1, no transposed A, no bias: beta 0 or no C) as a
    MatMul, its B transposed in place where ``transB`` and B is a weight; returns how many. jax2onnx emits
    its dense layers so (beta 0, a scalar C, the bias a separate Add); ONNX Runtime fuses a Q/DQ MatMul
    into an integer kernel, a Gemm with a float C it leaves as float Gemm between Q/DQ pairs."""
    from onnx import helper, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    done = 0
    for i, n in enumerate(model.graph.node):
        if n.op_type != "Gemm":
            continue
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        no_bias = len(n.input) < 3 or not n.input[2] or a.get("beta", 1.0) == 0.0
        if not no_bias or a.get("alpha", 1.0) != 1.0 or a.get("transA", 0):
            continue
        b = n.input[1]
        if a.get("transB", 0):
            if b not in inits:
                continue
            t = inits[b]
            t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(t).T), t.name))
        model.graph.node[i].CopyFrom(helper.make_node("MatMul", [n.input[0], b], list(n.output), name=n.name))
        done += 1
    return done


def weight_nodes(model, ops: Sequence[str]) -> list[str]:
    """Names of the ``ops`` nodes whose second input (B of MatMul/Gemm, W of Conv) is a weight initializer:
    the ones quantized. A product of two activations (attention's QK^T and softmax-times-V) stays float:
    softmax's probabilities in one symmetric int8 scale would lose every weight under 1/127 of the largest."""
    inits = {t.name for t in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type in ops and len(n.input) > 1 and n.input[1] in inits]


def prepare(path: Path, ops: Sequence[str]) -> list[str]:
    """In place: every node named, plain Gemms as MatMuls (:func:`gemm_to_matmul`); the nodes to quantize."""
    onnx = require("onnx", "export")
    model = onnx.load(str(path))
    seen = set()
    for k, n in enumerate(model.graph.node):
        if not n.name or n.name in seen:
            n.name = f"{n.op_type}_{k}"
        seen.add(n.name)
    gemm_to_matmul(model)
    onnx.save(model, str(path))
    return weight_nodes(model, ops)


def unshare_quantize(model) -> int:
    """Give each QuantizeLinear of a tensor quantized more than once (a dedicated Q/DQ pair per consumer:
    attention's q, k and v projections read one LayerNorm output) its own scale and zero-point initializers,
    so that ONNX Runtime's common-subexpression pass does not merge the Qs into one Q with three DQs, which
    its int8-to-uint8 pass and integer-kernel fusion then skip (36 of octo-small's 75 products stayed float
    DQ -> MatMul -> Q). Values are unchanged; returns how many Qs were given copies."""
    import collections
    import copy

    inits = {t.name: t for t in model.graph.initializer}
    consumers = collections.defaultdict(list)
    for n in model.graph.node:
        for i in n.input:
            consumers[i].append(n)
    done = 0
    for x, nodes in list(consumers.items()):
        for q in [n for n in nodes if n.op_type == "QuantizeLinear" and n.input[0] == x][1:]:
            names = []
            for j in (1, 2):
                if len(q.input) <= j or q.input[j] not in inits:
                    break
                t = copy.deepcopy(inits[q.input[j]])
                t.name = f"{q.input[j]}__{q.name}"
                model.graph.initializer.append(t)
                names.append(t.name)
            if len(names) != 2:
                continue
            q.input[1], q.input[2] = names
            for d in consumers[q.output[0]]:
                if d.op_type == "DequantizeLinear":
                    d.input[1], d.input[2] = names
            done += 1
    return done


@contextlib.contextmanager
def _quiet_root_logger():
    import logging

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def activation_ranges(path: Path, nodes: Sequence[str], calibration: Calibration, specs, bar=None):
    """MinMax ranges of the activations the ``nodes`` of the graph at ``path`` quantize (their inputs other than
    weights, and their outputs) over the calibration feeds, as ONNX Runtime's MinMax calibrator computes them (the
    smallest and largest value of each tensor over all feeds), in its ``TensorsData``. The graph runs with those
    tensors as outputs and ONNX Runtime's optimisations off, as its calibrator runs it, so the values are the
    same; without the calibrator's two reduction nodes per tensor and their per-feed outputs (30% of its time)."""
    onnx = require("onnx", "export")
    ort = require("onnxruntime", "export")
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import TensorData, TensorsData

    model = onnx.load(str(path))
    named, inits = set(nodes), {t.name for t in model.graph.initializer}
    tensors = list(dict.fromkeys(t for n in model.graph.node if n.name in named for t in [*n.input, *n.output]
                                 if t and t not in inits))
    outputs = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in tensors if t not in outputs)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    del model
    low = np.full(len(tensors), np.inf, np.float32)
    high = np.full(len(tensors), -np.inf, np.float32)
    for feeds in calibration.feeds():
        values = session.run(tensors, complete_feeds(feeds, specs))
        low = np.minimum(low, [np.nanmin(v) for v in values])
        high = np.maximum(high, [np.nanmax(v) for v in values])
        if bar is not None:  # counts samples, the rows of each feed
            bar.update(len(next(iter(feeds.values()))))
    if not calibration.samples or not np.all(np.isfinite(low) & np.isfinite(high)):
        raise ValueError(f"calibration {calibration.name}: no finite range for some of the {len(tensors)} activations")
    return TensorsData(CalibrationMethod.MinMax, {t: TensorData(lowest=low[i:i + 1], highest=high[i:i + 1])
                                                  for i, t in enumerate(tensors)})


def quantize_int8(onnx_path: str | Path, out_path: str | Path, calibration: Calibration, *, weights_digest: str,
                  ops: Sequence[str] = DEFAULT_OPS, exclude_nodes: Sequence[str] = ()) -> Path:
    """The Q/DQ INT8 copy of ``onnx_path`` at ``out_path`` (see the module docstring); metadata names the
    source's weights digest, the calibration and this pass."""
    onnx = require("onnx", "export")
    require("onnxruntime", "export")
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static, save_tensors_data

    from engines.onnx_utils import check_onnx_file, gc_paused, sha256_file

    if "calibration_cache_path" not in inspect.signature(quantize_static).parameters:  # ranges are passed so
        ort = require("onnxruntime", "export")
        raise RuntimeError(f"onnxruntime {ort.__version__} cannot take precomputed ranges (quantize_static has no "
                           "calibration_cache_path): install the locked version (requirements/lock.txt)")
    onnx_path, out_path = Path(onnx_path), Path(out_path)
    specs = input_specs(onnx_path)
    src_meta = {p.key: p.value for p in onnx.load(str(onnx_path), load_external_data=False).metadata_props}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sab-int8-") as tmp, gc_paused():
        folded = Path(tmp) / "folded.onnx"
        _fold(onnx_path, folded)
        nodes = prepare(folded, ops)
        q = Path(tmp) / "int8.onnx"
        from tqdm import tqdm

        bar = tqdm(total=calibration.samples, desc=f"int8 calibration of {onnx_path.name}", unit="sample", leave=False)
        with bar:
            ranges = activation_ranges(folded, [n for n in nodes if n not in set(exclude_nodes)], calibration, specs,
                                       bar)
        ranges_file = Path(tmp) / "ranges.json"
        save_tensors_data(ranges, ranges_file)
        with _quiet_root_logger():  # its advice to run onnxruntime's quant_pre_process: folded above instead
            quantize_static(str(folded), str(q), None, quant_format=QuantFormat.QDQ,
                            op_types_to_quantize=list(ops), nodes_to_quantize=nodes, per_channel=True,
                            activation_type=QuantType.QInt8,
                            weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                            nodes_to_exclude=list(exclude_nodes),
                            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True,
                                           "DedicatedQDQPair": True},
                            calibration_cache_path=str(ranges_file))
        model = onnx.load(str(q))
        unshare_quantize(model)
        del model.metadata_props[:]
        props = {**src_meta, "precision": "int8", "int8_pass": INT8_PASS, "int8_weights_sha256": weights_digest,
                 "int8_source_sha256": sha256_file(onnx_path), "int8_ops": ",".join(ops),
                 "int8_pre_passes": ",".join(PRE_PASSES),
                 "calibration": calibration.name, "calibration_sha256": calibration.sha256,
                 "calibration_samples": str(calibration.samples)}
        for k, v in props.items():
            e = model.metadata_props.add()
            e.key, e.value = k, str(v)
        tmp_out = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
        onnx.save(model, str(tmp_out))
        os.replace(tmp_out, out_path)
    check_onnx_file(out_path)
    return out_path


def int8_name(fp32_path: str | Path) -> Path:
    """Where the INT8 copy of an fp32 graph lives: beside it, ``<stem>.int8.onnx``."""
    p = Path(fp32_path)
    return p.with_name(f"{p.stem}.int8.onnx")


def int8_matches(path: Path, weights_digest: str, calibration_sha256: str | None = None,
                 source: str | Path | None = None) -> bool:
    """Whether ``path`` is this pass's INT8 graph of these weights (and this calibration, when given; and of
    the same export format as ``source``, when given: an older export's interface is not this one's)."""
    from engines.onnx_utils import BadModelFileError, metadata

    if not Path(path).is_file():
        return False
    try:
        m = metadata(path)
        src = metadata(source) if source is not None else m
    except BadModelFileError as e:  # named, then rebuilt by make engines (never loaded)
        print(f"{str(e).split(';')[0]}: make engines builds it again (or delete it)", file=sys.stderr)
        return False
    # the same export format and graph version as the source (an INT8 copy of an older graph is not its copy)
    return (m.get("int8_pass") == INT8_PASS and m.get("int8_weights_sha256") == weights_digest
            and m.get("format") == src.get("format") and m.get("graph_version") == src.get("graph_version")
            and (calibration_sha256 is None or m.get("calibration_sha256") == calibration_sha256))


def find_int8(candidates: Sequence[Path], weights_digest: str, source: str | Path | None = None) -> Path | None:
    """The first of ``candidates`` that is this pass's INT8 graph of these weights (any calibration)."""
    return next((Path(c) for c in candidates if int8_matches(Path(c), weights_digest, source=source)), None)


def int8_graph(onnx_path: str | Path, calibration: Calibration, *, weights_digest: str,
               out_path: str | Path | None = None, **kw) -> Path:
    """The INT8 copy of ``onnx_path`` (default beside it, :func:`int8_name`), built unless one of these
    weights, this calibration and this pass is there already."""
    out = Path(out_path) if out_path is not None else int8_name(onnx_path)
    if int8_matches(out, weights_digest, calibration.sha256, source=onnx_path):
        return out
    return quantize_int8(onnx_path, out, calibration, weights_digest=weights_digest, **kw)


class PrecisionUnavailable(ValueError):
    """A precision this backend cannot run here (one line, with the reason)."""


@functools.lru_cache(maxsize=1)
def ort_bf16_reason() -> str | None:
    """Why ONNX Runtime on this machine's CPU cannot run a bfloat16 graph (probed: a one-node bfloat16
    MatMul), or None where it can."""
    onnx = require("onnx", "export")
    ort = require("onnxruntime", "export")
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "bf16_probe",
                          [helper.make_tensor_value_info("a", TensorProto.BFLOAT16, [2, 4]),
                           helper.make_tensor_value_info("b", TensorProto.BFLOAT16, [4, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2, 3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    try:
        ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ORT's own exception types
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return (f"ONNX Runtime {ort.__version__}'s CPU execution provider has no bfloat16 MatMul/Gemm kernels "
                f"({first.split(' : ')[-1].strip()})")
    del onnx
    return None


# per-model INT8 decisions from benchmarks/octo_precision.py (speed and dev-try success against fp32), and models
# whose INT8 has not been measured yet; a model named here is refused at int8 on every backend (make engines builds
# neither its Q/DQ graph nor a TensorRT int8 engine), with the measured reason or the missing measurement
INT8_REFUSED = {
    "bc-state": "bc-state does not run at int8: its Q/DQ graph (ranges over all 1,062 calibration states) succeeded "
                "in 5/35 dev tries against 35/35 at fp32 and was 3.0x slower at batch 1 (0.085 vs 0.028 ms "
                "p50; Intel Xeon, 2026-12-05, results/benchmarks/octo_precision.json; 12/35 and 3.5x slower in the "
                "run of 2026-12-02, whose ranges came from the last 38 states only), a 0.3 MB MLP that int8 makes "
                "worse and slower: use fp32",
    "bc-camera": "bc-camera does not run at int8: its Q/DQ graph (ranges over 997 of its own dev queries) was 1.64x "
                 "slower than fp32 at batch 1 on ONNX Runtime (1.62 vs 0.99 ms p50, one thread) and its first "
                 "action on 776 other dev queries was up to 0.96 off in yaw (dz 0.52), with 41 gripper commands "
                 "flipped (v15's weights; AMD EPYC, 2026-12-07, results/benchmarks/bc_camera_int8.json; v14's: "
                 "1.66x, 32 of 830 flipped): use fp32 (ort) or fp16/fp32 (trt)",
}


def check_precision(backend: str, precision: str, model: str | None = None) -> None:
    """One-line PrecisionUnavailable for a (backend, precision) pair that cannot run, or a model whose INT8
    the precision benchmark refused or has not measured yet (INT8_REFUSED)."""
    from engines.trt import PRECISIONS as TRT_PRECISIONS

    if precision == "int8" and model in INT8_REFUSED:
        raise PrecisionUnavailable(INT8_REFUSED[model])

    if backend == "trt":
        if precision not in TRT_PRECISIONS:
            raise PrecisionUnavailable(f"precision {precision!r} is not one of TensorRT's: {', '.join(TRT_PRECISIONS)}")
        return
    if backend == "ort":
        if precision not in ORT_PRECISIONS:
            raise PrecisionUnavailable(f"precision {precision!r} is not one of ONNX Runtime's: "
                                       f"{', '.join(p for p in ORT_PRECISIONS if p != 'bf16')}")
        if precision == "bf16":
            reason = ort_bf16_reason()
            raise PrecisionUnavailable(f"--precision bf16 on ort: {reason}; no bf16 graph is built for it"
                                       if reason else "--precision bf16 on ort: this ONNX Runtime has bfloat16 "
                                       "kernels, but this project builds no bf16 graph yet; use fp32 or int8")
        return
    if precision != "fp32":
        raise PrecisionUnavailable(f"backend {backend!r} runs fp32 only, not {precision!r} "
                                   "(int8: --backend ort or trt)")


# ------------------------------------------------------------------ the calibration sets of this project
QUERIES_DIR = Path(__file__).resolve().parents[1] / "build" / "octo_queries"  # benchmarks.record_queries writes
OCTO_CALIB = QUERIES_DIR / "octo_small_dev_calib.npz"
BC_CALIB = QUERIES_DIR / "bc_state_dev_calib.npz"
RECORD_COMMAND = {OCTO_CALIB.name: "python -m benchmarks.record_queries --only calib",
                  BC_CALIB.name: "python -m benchmarks.record_queries --only bc-calib"}


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of a recorded calibration file; a damaged one is one line naming the file to delete (make
    engines records it again when it is missing)."""
    from engines.onnx_utils import BadModelFileError

    try:
        with np.load(str(path)) as z:
            return {k: z[k] for k in z.files}
    except Exception as e:  # noqa: BLE001 - zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError
        raise BadModelFileError(f"calibration file {path} is damaged ({type(e).__name__}): delete it and run make "
                                "engines, which records it again") from None


def _calibration_name(path: Path, arrays, kind: str) -> str:
    tries = sorted({f"{s}/{int(t)}" for s, t in zip(arrays["setup"], arrays["try_index"])}) if "setup" in arrays else []
    return f"{path.name}: {len(next(iter(arrays.values())))} {kind} from dev tries {', '.join(tries)}"


def octo_calibration(cfg, path: str | Path = OCTO_CALIB, limit: int | None = None) -> Calibration:
    """Octo's backbone calibration: the recorded queries' images, masks and instruction embeddings
    (``limit``: the first N), as backbone feeds of batch 1. Its hash is the file's arrays' (all of them)."""
    from engines.octo.export import backbone_feeds

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no Octo calibration queries at {path}; record them with: "
                                f"{RECORD_COMMAND.get(path.name, 'python -m benchmarks.record_queries')}")
    arrays = load_npz(path)
    n = len(arrays["masks"]) if limit is None else min(limit, len(arrays["masks"]))

    def feeds():
        for i in range(n):
            yield backbone_feeds(cfg, [arrays[f"image_{c.name}"][i:i + 1] for c in cfg.cameras],
                                 arrays["masks"][i:i + 1], arrays["lang"][i:i + 1])

    digest = arrays_sha256(arrays)
    name = _calibration_name(path, arrays, "queries") + (f" (first {n} used)" if n < len(arrays["masks"]) else "")
    return Calibration(name, digest if n == len(arrays["masks"]) else f"{digest}:first{n}", feeds, n)


def bc_calibration(path: str | Path = BC_CALIB) -> Calibration:
    """bc-state's calibration: the recorded states, in batches of 64 rows."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no bc-state calibration states at {path}; record them with: "
                                f"{RECORD_COMMAND[BC_CALIB.name]}")
    arrays = load_npz(path)
    states = arrays["state"].astype(np.float32)

    def feeds():
        for i in range(0, len(states), 64):
            yield {"state": states[i:i + 64]}

    return Calibration(_calibration_name(path, arrays, "states"), arrays_sha256(arrays), feeds, len(states))
