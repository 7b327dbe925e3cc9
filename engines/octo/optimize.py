"""Graph rewrites that make an exported Octo graph fast on ONNX Runtime's CPU provider, same numbers.

    from engines.octo.optimize import ort_optimized
    path = ort_optimized("build/engines/octo_small_backbone.onnx")   # -> cached rewritten copy

jax2onnx lowers every op as JAX traced it: layer norm as a dozen elementwise
nodes (mean, mean of squares, rsqrt...), tanh-GELU as nine, each dense layer as
``Gemm`` with a zero bias followed by a broadcast ``Add`` of the real bias,
attention as Transpose / MatMul / Add / Softmax / MatMul, and every Reshape's
target shape computed at run time from ``Shape`` / ``Gather`` / ``Concat`` for
the symbolic batch. ORT's own optimiser (``ORT_ENABLE_ALL``) and its
``onnxruntime.transformers`` fusions match none of these (they expect
PyTorch's patterns), so each query ran ~2000 small kernels. The rewrites, each
an exact pattern match that leaves anything else alone:

standard ONNX (opset >= 17; TensorRT parses them too)
  ``static_reshapes``   a Reshape target built from one run-time value and
                        constants -> a constant with -1 in that place (same
                        result: the -1 is the one value that fits); the shape
                        arithmetic then dies.
  ``gemm_bias``         Gemm(A, W, 0, beta=0) -> [Reshape] -> Add(bias) ->
                        Gemm(A, W, bias) -> [Reshape].
  ``layer_norm``        flax's LayerNorm (E[x^2] - E[x]^2, max 0, + eps, rsqrt,
                        scale, shift) -> ``LayerNormalization`` (ORT's CPU kernel
                        computes the variance the same way).

ONNX Runtime contrib ops (``com.microsoft``; ORT only, TensorRT never sees them)
  ``gelu``              0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -> ``FastGelu``.
  ``attention``         softmax(q k^T * scale [+ bias]) v over heads split by
                        Reshape/Transpose -> ``MultiHeadAttention`` on the
                        (B, S, heads*head) tensors (with ``attention_bias``
                        where there is one). Octo's backbone has none: its
                        grouped attention (engines.octo.model) carries the key
                        mask in q and k, so each group is an unmasked MHA, which
                        ONNX Runtime runs as its fused (flash) CPU kernel.

Then dead nodes and initializers are dropped. :func:`optimize_model` rewrites a
ModelProto in place and returns what it changed; :func:`ort_optimized` keeps a
rewritten copy per source file in the ONNX cache (``<cache>/onnx/ort-optimized``,
keyed by the source's sha256, the passes and :data:`OPTIMIZE_VERSION`), which :class:`engines.runners.OnnxRuntimeRunner`
loads. Parity with JAX is tested (tests/test_ort_optimize.py) and measured by
``benchmarks.octo_ort_vs_jax``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from engines.optional import require

OPTIMIZE_VERSION = "2"  # bump when a rewrite changes: the cached copies are keyed by it
STANDARD_PASSES = ("static_reshapes", "gemm_bias", "layer_norm")
ORT_PASSES = ("gelu", "attention")
ALL_PASSES = STANDARD_PASSES + ORT_PASSES
MS_DOMAIN = "com.microsoft"


class _Graph:
    """Producer / consumer maps and constant values of a graph (made for each pass, refreshed after each rewrite)."""

    def __init__(self, model) -> None:
        from onnx import numpy_helper

        self.model = model
        self.g = model.graph
        self.inits = {t.name: t for t in self.g.initializer}
        self._np = numpy_helper
        self.outputs = {o.name for o in self.g.output}
        self.shapes = {}
        for v in list(self.g.value_info) + list(self.g.input) + list(self.g.output):
            t = v.type.tensor_type
            if t.HasField("shape"):
                self.shapes[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        self.refresh()

    def refresh(self) -> None:
        """Producers, consumers, positions and names again after a rewrite (value_info does not change within a
        pass, and initializers are added through add_init, which keeps its map)."""
        producer: dict[str, Any] = {}
        consumers: dict[str, list] = defaultdict(list)
        position: dict[str, int] = {}  # a node's first output -> its index (where _replace starts looking)
        for i, n in enumerate(self.g.node):
            outs = list(n.output)
            if outs:
                position[outs[0]] = i
            for o in outs:
                producer[o] = n
            for x in n.input:
                consumers[x].append(n)
        self.producer, self.consumers, self.position = producer, consumers, position
        self._names = {n.name for n in self.g.node} | set(self.inits) | set(producer)
        self._counter = 0  # fresh names count from 1 again, skipping the names in use

    def const(self, name: str):
        """The value of ``name`` if it is a constant (an initializer, or Sqrt/Cast/Reshape of one), else None."""
        if name in self.inits:
            return self._np.to_array(self.inits[name])
        n = self.producer.get(name)
        if n is None:
            return None
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    return self._np.to_array(a.t)
            return None
        if n.op_type == "Sqrt":
            v = self.const(n.input[0])
            return None if v is None else np.sqrt(v)
        if n.op_type == "Identity":
            return self.const(n.input[0])
        if n.op_type == "Concat":
            parts = [self.const(i) for i in n.input]
            if any(p is None for p in parts):
                return None
            return np.concatenate(parts, axis=_attr(n, "axis", 0))
        if n.op_type == "Reshape":
            v, shape = self.const(n.input[0]), self.const(n.input[1])
            if v is None or shape is None or np.any(shape == 0):
                return None
            return v.reshape([int(d) for d in shape.reshape(-1)])
        return None

    def one_element(self, name: str) -> bool:
        """Whether ``name`` certainly holds one element (value_info, or a scalar unsqueezed / gathered)."""
        shape = self.shapes.get(name)
        if shape is not None:
            return shape in ([], [1])
        n = self.producer.get(name)
        if n is None:
            return False
        if n.op_type in ("Unsqueeze", "Squeeze", "Cast", "Identity"):
            return self.one_element(n.input[0])
        if n.op_type == "Gather":
            idx = self.const(n.input[1])
            return idx is not None and idx.size == 1
        return False

    def scalar(self, name: str):
        v = self.const(name)
        if v is None or v.size != 1 or v.dtype.kind != "f":
            return None
        return float(v.reshape(()))

    def node_of(self, name: str, op: str):
        n = self.producer.get(name)
        return n if n is not None and n.op_type == op else None

    def single_use(self, name: str) -> bool:
        return len(self.consumers.get(name, ())) == 1 and name not in self.outputs

    def fresh(self, stem: str) -> str:
        while True:
            self._counter += 1
            name = f"{stem}_opt{self._counter}"
            if name not in self._names:
                self._names.add(name)
                return name

    def add_init(self, stem: str, value: np.ndarray) -> str:
        name = self.fresh(stem)
        self.g.initializer.append(self._np.from_array(np.ascontiguousarray(value), name))
        self.inits[name] = self.g.initializer[-1]
        return name


def _attr(node, name, default=None):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _other(node, name: str) -> str | None:
    """The other input of a two-input node, given one of them."""
    if len(node.input) != 2:
        return None
    if node.input[0] == name:
        return node.input[1]
    if node.input[1] == name:
        return node.input[0]
    return None


def _const_operand(gr: _Graph, node):
    """(other input, constant value) of a binary node with one constant input, else (None, None)."""
    if len(node.input) != 2:
        return None, None
    for i in (1, 0):
        v = gr.const(node.input[i])
        if v is not None:
            return node.input[1 - i], v
    return None, None


def _replace(gr: _Graph, anchor, new_nodes: list) -> None:
    """Put ``new_nodes`` where ``anchor`` is (its inputs come earlier, its consumers later) and drop it."""
    nodes = gr.g.node
    key = list(anchor.output)
    first = key[0]  # output names are unique: the first one finds the node, the whole list confirms it

    def at(i: int) -> bool:
        n = nodes[i]
        return bool(n.output) and n.output[0] == first and list(n.output) == key

    # where the last refresh saw it; rewrites since then moved nodes by a few places: look outward from there
    # (a scan from the start made the passes quadratic in the graph's size)
    hint, size = gr.position.get(first, 0), len(nodes)
    idx = next(i for d in range(size) for i in ((hint,) if d == 0 else (hint - d, hint + d))
               if 0 <= i < size and at(i))
    del nodes[idx]
    for k, n in enumerate(new_nodes):
        nodes.insert(idx + k, n)


# ------------------------------------------------------------------ standard rewrites
def _static_reshapes(gr: _Graph) -> int:
    """Reshape(x, Concat(one run-time scalar, constants...)) -> Reshape(x, constant with -1 there)."""
    from onnx import helper

    done = 0
    for n in list(gr.g.node):
        if n.op_type != "Reshape" or len(n.input) < 2:
            continue
        cat = gr.node_of(n.input[1], "Concat")
        if cat is None:
            continue
        folded = gr.const(n.input[1])
        if folded is not None:  # all constants: folded here so that later rewrites read the shape
            if np.any(folded == 0) and not _attr(n, "allowzero", 0):
                continue
            shape = gr.add_init("static_shape", folded.astype(np.int64))
            _replace(gr, n, [helper.make_node("Reshape", [n.input[0], shape], list(n.output), name=n.name)])
            done += 1
            continue
        parts, dynamic = [], 0
        for i in cat.input:
            v = gr.const(i)
            if v is None:
                if not gr.one_element(i):
                    parts = None
                    break
                dynamic += 1
                parts.append(np.array([-1], np.int64))
            else:
                v = np.asarray(v).reshape(-1)
                if v.dtype != np.int64 or np.any(v <= 0):  # 0 and -1 have their own meaning in Reshape
                    parts = None
                    break
                parts.append(v)
        if parts is None or dynamic != 1 or _attr(n, "allowzero", 0):
            continue
        shape = gr.add_init("static_shape", np.concatenate(parts))
        new = helper.make_node("Reshape", [n.input[0], shape], list(n.output), name=n.name)
        _replace(gr, n, [new])
        done += 1
    return done


def _gemm_bias(gr: _Graph) -> int:
    """Gemm(A, W, C=0, beta=0) [-> Reshape] -> Add(b) with b (1, ..., N) -> Gemm(A, W, b[N]) [-> Reshape]."""
    from onnx import helper

    done = 0
    for add in list(gr.g.node):
        if add.op_type != "Add":
            continue
        x, b = _const_operand(gr, add)
        if x is None or b.dtype != np.float32 or b.ndim < 1 or np.prod(b.shape[:-1]) != 1:
            continue
        reshape = gr.node_of(x, "Reshape")
        gemm_out = reshape.input[0] if reshape is not None else x
        gemm = gr.node_of(gemm_out, "Gemm")
        if gemm is None or not gr.single_use(gemm_out) or (reshape is not None and not gr.single_use(x)):
            continue
        if _attr(gemm, "alpha", 1.0) != 1.0 or len(gemm.input) < 2:
            continue
        w = gr.const(gemm.input[1])
        if w is None or w.ndim != 2:
            continue
        n_out = w.shape[0] if _attr(gemm, "transB", 0) else w.shape[1]
        if b.shape[-1] != n_out:
            continue
        if len(gemm.input) > 2 and gemm.input[2]:
            c = gr.const(gemm.input[2])
            if c is None or (_attr(gemm, "beta", 1.0) != 0.0 and np.any(c != 0)):
                continue
        if reshape is not None:
            shape = gr.const(reshape.input[1])
            if shape is None or int(shape.reshape(-1)[-1]) != n_out:  # the bias must still fall on the last axis
                continue
        bias = gr.add_init("gemm_bias", b.reshape(n_out).astype(np.float32))
        attrs = {a.name: helper.get_attribute_value(a) for a in gemm.attribute if a.name not in ("beta",)}
        attrs["beta"] = 1.0
        out = gr.fresh("gemm_out") if reshape is not None else add.output[0]
        new = [helper.make_node("Gemm", [gemm.input[0], gemm.input[1], bias], [out], name=gemm.name, **attrs)]
        if reshape is not None:
            new.append(helper.make_node("Reshape", [out, reshape.input[1]], list(add.output), name=reshape.name,
                                        **{a.name: helper.get_attribute_value(a) for a in reshape.attribute}))
        # the old nodes out first (the new ones may reuse the Add's output name), the new ones where the Add was
        _replace(gr, gemm, [])
        if reshape is not None:
            _replace(gr, reshape, [])
        _replace(gr, add, new)
        done += 1
        gr.refresh()
    return done


def _reduce_axes(gr: _Graph, node):
    if node.op_type != "ReduceMean" or _attr(node, "keepdims", 1) != 1:
        return None
    if len(node.input) > 1 and node.input[1]:
        v = gr.const(node.input[1])
        return None if v is None else tuple(int(a) for a in np.asarray(v).reshape(-1))
    axes = _attr(node, "axes")
    return None if axes is None else tuple(int(a) for a in axes)


def _last_axis(gr: _Graph, x: str, axes) -> bool:
    if axes == (-1,):
        return True
    rank = len(gr.shapes[x]) if x in gr.shapes else None
    return rank is not None and axes == (rank - 1,)


def _layer_norm(gr: _Graph) -> int:
    """x -> (x - mean) * 1/sqrt(max(E[x^2] - mean^2, 0) + eps) * gamma + beta -> LayerNormalization."""
    from onnx import helper

    done = 0
    for add_b in list(gr.g.node):
        if add_b.op_type != "Add":
            continue
        scaled, beta = _const_operand(gr, add_b)
        mul_g = gr.node_of(scaled, "Mul") if scaled else None
        if mul_g is None or beta.dtype != np.float32:
            continue
        normed, gamma = _const_operand(gr, mul_g)
        mul_r = gr.node_of(normed, "Mul") if normed else None
        if mul_r is None or gamma.dtype != np.float32:
            continue
        m = _match_normalise(gr, mul_r)
        if m is None:
            continue
        x, axes, eps = m
        d = gr.shapes.get(x, [None])[-1]
        # scale and shift of shape (1, ..., d): one per feature of the last axis
        if not d or gamma.size != d or beta.size != d or gamma.shape[-1] != d or beta.shape[-1] != d:
            continue
        g = gr.add_init("ln_scale", gamma.reshape(d))
        b = gr.add_init("ln_bias", beta.reshape(d))
        new = helper.make_node("LayerNormalization", [x, g, b], list(add_b.output), name=gr.fresh("LayerNorm"),
                               axis=-1, epsilon=eps)
        _replace(gr, add_b, [new])
        done += 1
        gr.refresh()
    return done


def _match_normalise(gr: _Graph, mul_r):
    """Mul(Sub(x, mean), rsqrt) of flax's LayerNorm -> (x, axes, eps), else None."""
    for i in (0, 1):
        sub = gr.node_of(mul_r.input[i], "Sub")
        div = gr.node_of(mul_r.input[1 - i], "Div")
        if sub is None or div is None:
            continue
        x, mean_name = sub.input[0], sub.input[1]
        mean = gr.node_of(mean_name, "ReduceMean")
        if mean is None or mean.input[0] != x:
            continue
        axes = _reduce_axes(gr, mean)
        if axes is None or not _last_axis(gr, x, axes):
            continue
        if gr.scalar(div.input[0]) != 1.0:
            continue
        sqrt = gr.node_of(div.input[1], "Sqrt")
        add_e = gr.node_of(sqrt.input[0], "Add") if sqrt else None
        if add_e is None:
            continue
        var_name, eps_v = _const_operand(gr, add_e)
        if var_name is None or eps_v.size != 1:
            continue
        eps = float(eps_v.reshape(()))
        mx = gr.node_of(var_name, "Max")
        if mx is not None:
            inner, zero = _const_operand(gr, mx)
            if inner is None or zero.size != 1 or float(zero.reshape(())) != 0.0:
                continue
            var_name = inner
        var = gr.node_of(var_name, "Sub")
        if var is None:
            continue
        mean_sq = gr.node_of(var.input[0], "ReduceMean")
        sq_mean = gr.node_of(var.input[1], "Mul")
        if mean_sq is None or sq_mean is None or list(sq_mean.input) != [mean_name, mean_name]:
            continue
        if _reduce_axes(gr, mean_sq) != axes:
            continue
        sq = gr.node_of(mean_sq.input[0], "Mul")
        if sq is None or list(sq.input) != [x, x]:
            continue
        return x, axes, eps
    return None


# ------------------------------------------------------------------ ONNX Runtime contrib rewrites
_GELU_C = math.sqrt(2.0 / math.pi)


def _close(v, target) -> bool:
    return v is not None and abs(v - target) <= 1e-6 * max(1.0, abs(target))


def _gelu(gr: _Graph) -> int:
    """x * (0.5 * (1 + tanh(c * (x + 0.044715 * x^3)))) (any operand order) -> FastGelu(x)."""
    from onnx import helper

    done = 0
    for out in list(gr.g.node):
        if out.op_type != "Mul" or len(out.input) != 2:
            continue
        for i in (0, 1):
            x, half = out.input[i], gr.node_of(out.input[1 - i], "Mul")
            if half is None:
                continue
            one_p, h = _const_operand(gr, half)
            if one_p is None or not _close(float(h.reshape(-1)[0]) if h.size == 1 else None, 0.5):
                continue
            add1 = gr.node_of(one_p, "Add")
            if add1 is None:
                continue
            t, one = _const_operand(gr, add1)
            tanh = gr.node_of(t, "Tanh") if t else None
            if tanh is None or one.size != 1 or float(one.reshape(())) != 1.0:
                continue
            mc = gr.node_of(tanh.input[0], "Mul")
            if mc is None:
                continue
            inner, c = _const_operand(gr, mc)
            if inner is None or c.size != 1 or not _close(float(c.reshape(())), _GELU_C):
                continue
            addx = gr.node_of(inner, "Add")
            if addx is None:
                continue
            cube = _other(addx, x)
            mk = gr.node_of(cube, "Mul") if cube else None
            if mk is None:
                continue
            x3, k = _const_operand(gr, mk)
            if x3 is None or k.size != 1 or not _close(float(k.reshape(())), 0.044715):
                continue
            m3 = gr.node_of(x3, "Mul")
            if m3 is None:
                continue
            x2 = _other(m3, x)
            m2 = gr.node_of(x2, "Mul") if x2 else None
            if m2 is None or list(m2.input) != [x, x]:
                continue
            new = helper.make_node("FastGelu", [x], list(out.output), name=gr.fresh("FastGelu"), domain=MS_DOMAIN)
            _replace(gr, out, [new])
            done += 1
            gr.refresh()
            break
    return done


def _heads_split(gr: _Graph, name: str, perm):
    """x4 = Transpose(perm)(Reshape(x3, [*, S, N, H])) -> (x3, N, H), else None."""
    tr = gr.node_of(name, "Transpose")
    if tr is None or list(_attr(tr, "perm", [])) != list(perm):
        return None
    rs = gr.node_of(tr.input[0], "Reshape")
    if rs is None:
        return None
    shape = gr.const(rs.input[1])
    x3 = rs.input[0]
    src = gr.shapes.get(x3)
    if shape is None or shape.size != 4 or src is None or len(src) != 3:
        return None
    n, h = int(shape[2]), int(shape[3])
    if n <= 0 or h <= 0 or src[2] != n * h or (src[1] is not None and int(shape[1]) not in (src[1],)):
        return None
    return x3, n, h


def _attention(gr: _Graph) -> int:
    """Reshape(Transpose(softmax(q k^T * s [+ bias]) v)) over Reshape/Transpose head splits -> MultiHeadAttention."""
    from onnx import helper

    done = 0
    for rs_out in list(gr.g.node):
        if rs_out.op_type != "Reshape":
            continue
        shape = gr.const(rs_out.input[1])
        tr_out = gr.node_of(rs_out.input[0], "Transpose")
        if shape is None or shape.size != 3 or tr_out is None or list(_attr(tr_out, "perm", [])) != [0, 2, 1, 3]:
            continue
        pv = gr.node_of(tr_out.input[0], "MatMul")
        if pv is None:
            continue
        sm = gr.node_of(pv.input[0], "Softmax")
        v = _heads_split(gr, pv.input[1], (0, 2, 1, 3))
        if sm is None or v is None or _attr(sm, "axis", -1) not in (-1, 3):
            continue
        bias = ""
        logits = sm.input[0]
        add = gr.node_of(logits, "Add")
        if add is not None:
            a, b = add.input
            if gr.node_of(a, "MatMul") is None:
                a, b = b, a
            bshape = gr.shapes.get(b)
            if gr.node_of(a, "MatMul") is None or bshape is None or len(bshape) != 4:
                continue
            bias, logits = b, a
        qk = gr.node_of(logits, "MatMul")
        if qk is None:
            continue
        # the scale: a scalar Div/Mul of the query heads, or none (queries scaled before the head split, as
        # the grouped attention of engines.octo.model does: scale 1)
        scale_node = gr.producer.get(qk.input[0])
        q4, scale = qk.input[0], 1.0
        if scale_node is not None and scale_node.op_type in ("Div", "Mul"):
            s = gr.scalar(scale_node.input[1])
            if s is None or s == 0.0:
                continue
            q4, scale = scale_node.input[0], 1.0 / s if scale_node.op_type == "Div" else s
        q = _heads_split(gr, q4, (0, 2, 1, 3))
        kt = gr.node_of(qk.input[1], "Transpose")
        if q is None or kt is None or list(_attr(kt, "perm", [])) != [0, 1, 3, 2]:
            continue
        k = _heads_split(gr, kt.input[0], (0, 2, 1, 3))
        # q and k share heads and head size; v shares the heads (its head size may differ: the grouped
        # attention's q and k carry the key mask as one more dimension)
        if k is None or q[1:] != k[1:] or v[1] != q[1]:
            continue
        n = q[1]
        if bias:
            bshape = gr.shapes[bias]
            if bshape[1] not in (1, n):
                continue
        if int(shape[2]) != n * v[2]:
            continue
        ins = [q[0], k[0], v[0], "", "", bias] if bias else [q[0], k[0], v[0]]
        new = helper.make_node("MultiHeadAttention", ins, list(rs_out.output), name=gr.fresh("MultiHeadAttention"),
                               domain=MS_DOMAIN, num_heads=n, scale=float(scale))
        _replace(gr, rs_out, [new])
        done += 1
        gr.refresh()
    return done


# ------------------------------------------------------------------ clean-up and entry points
def _dead_code(model) -> int:
    g = model.graph
    live = {o.name for o in g.output}
    keep = []
    for n in reversed(g.node):
        if any(o in live for o in n.output):
            keep.append(n)
            live.update(i for i in n.input if i)
    removed = len(g.node) - len(keep)
    if removed:
        keep.reverse()
        del g.node[:]
        g.node.extend(keep)
    inits = [t for t in g.initializer if t.name in live]
    if len(inits) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(inits)
    names = {o for n in g.node for o in n.output}
    vi = [v for v in g.value_info if v.name in names]
    if len(vi) != len(g.value_info):
        del g.value_info[:]
        g.value_info.extend(vi)
    return removed


PASSES = {"static_reshapes": _static_reshapes, "gemm_bias": _gemm_bias, "layer_norm": _layer_norm,
          "gelu": _gelu, "attention": _attention}


def optimize_model(model, passes=ALL_PASSES) -> dict[str, int]:
    """Apply ``passes`` (names from :data:`PASSES`, in that order) to ``model`` in place; the count of each
    rewrite and of the nodes removed."""
    from onnx import helper

    unknown = [p for p in passes if p not in PASSES]
    if unknown:
        raise ValueError(f"unknown graph rewrite {unknown[0]!r}; valid: {', '.join(PASSES)}")
    from engines.onnx_utils import gc_paused

    stats = {}
    before = len(model.graph.node)
    with gc_paused():
        for p in passes:
            stats[p] = PASSES[p](_Graph(model))
            if p == "static_reshapes":
                _dead_code(model)
        _dead_code(model)
    if any(n.domain == MS_DOMAIN for n in model.graph.node) and not any(
            o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    if stats.get("layer_norm"):
        for o in model.opset_import:
            if o.domain in ("", "ai.onnx") and o.version < 17:
                o.version = 17  # LayerNormalization; every other op here reads the same at 17
    stats["nodes_before"], stats["nodes_after"] = before, len(model.graph.node)
    return stats


def ort_cache_dir() -> Path:
    from engines.cache import ort_optimized_dir

    return ort_optimized_dir()


def ort_optimized_name(path: str | Path, source_sha256: str, passes=ALL_PASSES) -> str:
    """The file name :func:`ort_optimized` gives the rewrite of the graph at ``path`` whose sha256 is
    ``source_sha256``: the source's stem and a hash of its sha256, the passes and :data:`OPTIMIZE_VERSION`."""
    import hashlib

    key = hashlib.sha256(f"{source_sha256}|{OPTIMIZE_VERSION}|{','.join(passes)}".encode()).hexdigest()[:16]
    return f"{Path(path).stem}.{key}.onnx"


def ort_optimized(path: str | Path, passes=ALL_PASSES, cache: str | Path | None = None) -> Path:
    """The rewritten copy of the graph at ``path`` (made once, in ``cache`` or :func:`ort_cache_dir`, named by
    the source's stem and a hash of its sha256, the passes and :data:`OPTIMIZE_VERSION`; sealed, so that a
    damaged copy is rebuilt: :mod:`engines.cache`); ``path`` itself when no rewrite applies (remembered by an
    empty marker file)."""
    onnx = require("onnx", "export")
    from engines.cache import reuse, write_sealed
    from engines.onnx_utils import sha256_file

    path = Path(path)
    folder = Path(cache) if cache is not None else ort_cache_dir()
    out = folder / ort_optimized_name(path, sha256_file(path), passes)
    unchanged = out.with_suffix(".unchanged")
    if reuse(out, "ONNX Runtime graph"):
        return out
    if unchanged.is_file():
        return path
    model = onnx.load(str(path))
    stats = optimize_model(model, passes)
    folder.mkdir(parents=True, exist_ok=True)
    if not any(stats[p] for p in passes):
        unchanged.write_text("no rewrite applies\n")
        return path
    entry = model.metadata_props.add()
    entry.key, entry.value = "ort_optimize", f"v{OPTIMIZE_VERSION} " + " ".join(f"{k}={v}" for k, v in stats.items())
    return write_sealed(out, lambda tmp: onnx.save(model, str(tmp)))
