"""Floating-point operations of one run of an ONNX graph, and a matrix-multiply peak to set them against.

    from engines.flops import graph_flops, matmul_peak
    f = graph_flops("build/engines/octo_small_backbone.onnx", feeds)   # {"total": ..., "by_op": ...}
    peak = matmul_peak(threads=2)                                     # {"gflops": ..., "by_source": ...}

Counting rule (``total``): the multiply-adds of the contracting ops, two FLOPs each, at the shapes the
graph has for ``feeds``:

- ``MatMul`` / ``FusedMatMul`` / ``MatMulInteger`` / ``QLinearMatMul``: 2 * out elements * K;
- ``Gemm``: 2 * M * N * K (the bias add is not counted);
- ``Conv`` / ``ConvInteger`` / ``QLinearConv``: 2 * out elements * (C_in / group) * kernel elements;
- ``Einsum``: 2 * the product of every index's size;
- ``MultiHeadAttention`` (com.microsoft) and ``Attention`` (opset 23): q k^T and p v,
  4 * B * heads * S_q * S_kv * head size.

Everything else (adds, layer norm, softmax, GELU, casts) is left out of ``total`` and counted apart in
``elementwise``: one per output element of each arithmetic node (data movement such as Reshape,
Transpose, Concat, Gather, Slice, Expand and shape arithmetic counts zero). Integer ops are counted as
the float ones they replace, so an INT8 graph's "FLOPs" are its integer multiply-adds at the same count.

Shapes come from one ONNX Runtime run of the graph with every node's output exposed (exact for any graph,
contrib ops and dynamic reshapes included); with ``feeds`` None, from the graph's own value_info after
ONNX shape inference (static graphs only).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping

import numpy as np

from engines.optional import require

MOVEMENT = {"Reshape", "Transpose", "Concat", "Gather", "GatherND", "GatherElements", "Slice", "Squeeze",
            "Unsqueeze", "Expand", "Shape", "Size", "Identity", "Flatten", "Split", "Tile", "Pad",
            "ConstantOfShape", "Constant", "Cast", "CastLike", "QuantizeLinear", "DequantizeLinear",
            "DynamicQuantizeLinear", "Range", "NonZero", "ScatterND", "ScatterElements", "Where"}
CONTRACTING = {"MatMul", "FusedMatMul", "MatMulInteger", "QLinearMatMul", "Gemm", "Conv", "ConvInteger",
               "QLinearConv", "Einsum", "MultiHeadAttention", "Attention"}


def _attr(node, name, default=None):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def node_flops(node, shapes: Mapping[str, tuple]) -> int | None:
    """Multiply-add FLOPs of one contracting node from its input / output shapes; None for other ops or
    when a shape it needs is unknown."""
    op = node.op_type

    def s(i, of="input"):
        names = node.input if of == "input" else node.output
        return shapes.get(names[i]) if i < len(names) and names[i] else None

    if op in ("MatMul", "FusedMatMul", "MatMulInteger"):
        a, out = s(0), s(0, "output")
        if a is None or out is None:
            return None
        k = a[-2] if (op == "FusedMatMul" and _attr(node, "transA", 0)) else a[-1]
        return 2 * _prod(out) * int(k)
    if op == "QLinearMatMul":
        a, out = s(0), s(0, "output")
        return None if a is None or out is None else 2 * _prod(out) * int(a[-1])
    if op == "Gemm":
        a, out = s(0), s(0, "output")
        if a is None or out is None:
            return None
        k = a[0] if _attr(node, "transA", 0) else a[1]
        return 2 * _prod(out) * int(k)
    if op in ("Conv", "ConvInteger", "QLinearConv"):
        w = s(3 if op == "QLinearConv" else 1)
        out = s(0, "output")
        if w is None or out is None:
            return None
        return 2 * _prod(out) * _prod(w[1:])  # w: (C_out, C_in / group, *kernel)
    if op == "Einsum":
        eq = _attr(node, "equation")
        eq = eq.decode() if isinstance(eq, bytes) else eq
        lhs = eq.replace(" ", "").split("->")[0].split(",")
        sizes: dict[str, int] = {}
        for i, term in enumerate(lhs):
            shape = s(i)
            if shape is None or "..." in term or len(term) != len(shape):
                return None
            sizes.update({c: int(d) for c, d in zip(term, shape)})
        return 2 * _prod(sizes.values())
    if op in ("MultiHeadAttention", "Attention"):
        if op == "Attention" and node.domain not in ("", "ai.onnx"):
            return None  # com.microsoft Attention (packed QKV projection): not counted
        q, k, v = s(0), s(1), s(2)
        if q is None or k is None:
            return None
        v = v or k  # v's head size may differ from q's and k's (q k^T over q's, p v over v's)
        if len(q) == 3:  # (B, S, heads * head)
            b, sq, d = q
            skv = k[1] if len(k) == 3 else k[2]
            return 2 * int(b) * int(sq) * int(skv) * (int(d) + int(v[-1] if len(v) == 3 else v[1] * v[3]))
        b, n, sq, h = q  # (B, heads, S, head)
        return 2 * int(b) * int(n) * int(sq) * int(k[2]) * (int(h) + int(v[-1]))
    return None


def _shapes_by_running(model, feeds: Mapping[str, np.ndarray], threads: int) -> dict[str, tuple]:
    import onnx

    ort = require("onnxruntime", "export")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    names = [o for n in m.graph.node for o in n.output if o and o not in have]
    for name in names:
        m.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))  # type from the run
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = threads
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    wanted = [o.name for o in sess.get_outputs()]
    shapes = {k: tuple(np.shape(v)) for k, v in feeds.items()}
    for name, value in zip(wanted, sess.run(wanted, dict(feeds))):
        shapes[name] = tuple(np.shape(value))
    for t in model.graph.initializer:
        shapes[t.name] = tuple(t.dims)
    return shapes


def _shapes_from_graph(model) -> dict[str, tuple]:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    shapes = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        dims = v.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[v.name] = tuple(d.dim_value for d in dims)
    for t in model.graph.initializer:
        shapes[t.name] = tuple(t.dims)
    return shapes


def graph_flops(model, feeds: Mapping[str, np.ndarray] | None = None, threads: int = 1) -> dict:
    """FLOPs of one run of ``model`` (a path or a ModelProto) on ``feeds``: ``total`` (contracting ops, the
    rule in the module's docstring), ``by_op`` (total split by op type), ``elementwise`` (counted apart),
    ``uncounted`` (contracting nodes whose shapes were unknown: nonzero means ``total`` is a lower bound)."""
    onnx = require("onnx", "export")
    if isinstance(model, (str, Path)):
        model = onnx.load(str(model))
    shapes = _shapes_by_running(model, feeds, threads) if feeds is not None else _shapes_from_graph(model)
    by_op: dict[str, int] = {}
    elementwise = 0
    uncounted = 0
    for n in model.graph.node:
        if n.op_type in CONTRACTING:
            f = node_flops(n, shapes)
            if f is None:
                uncounted += 1
                continue
            by_op[n.op_type] = by_op.get(n.op_type, 0) + f
        elif n.op_type not in MOVEMENT and n.domain in ("", "ai.onnx", "com.microsoft"):
            out = shapes.get(n.output[0]) if n.output else None
            if out is not None and not _is_shape_arith(n, shapes):
                elementwise += _prod(out)
    return {"total": int(sum(by_op.values())), "by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
            "elementwise": int(elementwise), "uncounted": uncounted}


def _is_shape_arith(node, shapes) -> bool:
    """Arithmetic on shapes (a handful of int64 values), not on tensors."""
    out = shapes.get(node.output[0])
    return out is not None and _prod(out) <= 8 and len(out) <= 1


# ------------------------------------------------------------------ a matrix-multiply peak
def _best_gflops(fn, flops: float, seconds: float) -> float:
    fn()  # warm-up: thread pools started, buffers allocated, weights packed
    best = float("inf")
    t_end = time.perf_counter() + seconds
    runs = 0
    while runs < 3 or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return flops / best / 1e9


def matmul_peak(threads: int, n: int = 2048, seconds: float = 1.5, sources=("numpy", "ort", "jax")) -> dict:
    """Float32 GEMM throughput (n x n by n x n, best of ``seconds`` of repeats) per source at ``threads``
    threads, and ``gflops``, the largest: the peak achieved FLOP/s is set against. ONNX Runtime takes its
    intra-op thread count; numpy's BLAS and XLA run on every core this process may use, so they are measured
    only when ``threads`` is that count."""
    from engines.runners import cpu_count

    if threads != cpu_count():  # numpy's BLAS and XLA take every core; only ORT's thread count is ours to set
        sources = tuple(s for s in sources if s == "ort")
    rs = np.random.default_rng(0)
    a = rs.standard_normal((n, n), dtype=np.float32)
    b = rs.standard_normal((n, n), dtype=np.float32)
    flops = 2.0 * n * n * n
    out: dict[str, float] = {}
    if "numpy" in sources:
        out["numpy"] = round(_best_gflops(lambda: a @ b, flops, seconds), 1)
    if "ort" in sources:
        require("onnx", "export")
        ort = require("onnxruntime", "export")
        from onnx import TensorProto, helper, numpy_helper

        g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "peak",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])],
                              [numpy_helper.from_array(b, "b")])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        out["ort"] = round(_best_gflops(lambda: sess.run(None, {"a": a}), flops, seconds), 1)
    if "jax" in sources:
        try:
            import jax
            import jax.numpy as jnp
        except ImportError:
            pass
        else:
            ja, jb = jnp.asarray(a), jnp.asarray(b)
            mm = jax.jit(jnp.matmul)
            out["jax"] = round(_best_gflops(lambda: mm(ja, jb).block_until_ready(), flops, seconds), 1)
    return {"n": n, "threads": threads, "by_source": out, "gflops": max(out.values()) if out else None}
