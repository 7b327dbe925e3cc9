"""engines/flops.py: FLOPs of a hand-built graph whose count is known, and the matmul peak's shape."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from engines.flops import graph_flops, matmul_peak, node_flops  # noqa: E402


def tiny_graph():
    """x (1, 3, 8, 8) -> Conv 5x3x3x3 -> (1, 5, 6, 6) -> Reshape (5, 36) -> Gemm with (36, 16) + bias -> (5, 16)
    -> MatMul (16, 4) -> (5, 4) -> Add 1 -> Einsum 'ij,jk->ik' with (4, 7) -> (5, 7).

    Conv 2 * 180 outputs * 27 = 9,720; Gemm 2 * 5 * 16 * 36 = 5,760; MatMul 2 * 5 * 4 * 16 = 640;
    Einsum 2 * 5 * 4 * 7 = 280: 16,400 in all. Elementwise: the Add's 20 outputs."""
    rs = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rs.standard_normal(s).astype(np.float32), n) for n, s in
             [("w", (5, 3, 3, 3)), ("g", (36, 16)), ("gb", (16,)), ("m", (16, 4)), ("e", (4, 7)), ("one", ())]]
    inits.append(numpy_helper.from_array(np.array([5, 36], np.int64), "shape"))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Reshape", ["c", "shape"], ["r"]),
             helper.make_node("Gemm", ["r", "g", "gb"], ["y"]),
             helper.make_node("MatMul", ["y", "m"], ["z"]),
             helper.make_node("Add", ["z", "one"], ["a"]),
             helper.make_node("Einsum", ["a", "e"], ["out"], equation="ij,jk->ik")]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [5, 7])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


EXPECTED = {"Conv": 9720, "Gemm": 5760, "MatMul": 640, "Einsum": 280}


@pytest.mark.parametrize("by_running", [True, False])
def test_hand_built_graph_flops(by_running):
    feeds = {"x": np.zeros((1, 3, 8, 8), np.float32)} if by_running else None
    f = graph_flops(tiny_graph(), feeds)
    assert f["by_op"] == EXPECTED
    assert f["total"] == sum(EXPECTED.values()) == 16400
    assert f["elementwise"] == 20 and f["uncounted"] == 0


def test_attention_and_batched_matmul_rules():
    mha = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft", num_heads=2)
    # q k^T and p v over 2 heads of 4: 2 * (2 * 2 * 3 * 5 * 4) * batch 2 = 4 * 2 * 3 * 5 * 8
    assert node_flops(mha, {"q": (2, 3, 8), "k": (2, 5, 8), "o": (2, 3, 8)}) == 4 * 2 * 3 * 5 * 8
    bmm = helper.make_node("MatMul", ["a", "b"], ["c"])
    assert node_flops(bmm, {"a": (6, 3, 4), "b": (4, 5), "c": (6, 3, 5)}) == 2 * 6 * 3 * 5 * 4
    assert node_flops(bmm, {"a": (6, 3, 4)}) is None  # output shape unknown: not guessed
    assert node_flops(helper.make_node("Add", ["a", "b"], ["c"]), {"a": (2,), "c": (2,)}) is None


def test_matmul_peak_reports_each_source():
    p = matmul_peak(threads=1, n=128, seconds=0.05, sources=("ort",))
    assert p["n"] == 128 and p["threads"] == 1 and set(p["by_source"]) == {"ort"}
    assert p["gflops"] == p["by_source"]["ort"] > 0
