"""Write the tiny golden ONNX model and its expected outputs (tests/data/golden_mlp.onnx, golden_mlp.npz).

    python tests/data/make_golden.py

The graph is written node by node with onnx.helper (no exporter involved), the
expected outputs are computed with numpy, so the test that reads them checks
every runner against an independent reference. Inputs: ``x`` float32 (B, 4)
and ``img`` uint8 (B, 2, 2, 1) (a uint8 input as Octo's backbone has); output
``y`` float32 (B, 3) = tanh(concat(x, img / 127.5 - 1) @ W1 + b1) @ W2 + b2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ONNX_PATH = HERE / "golden_mlp.onnx"
EXPECTED_PATH = HERE / "golden_mlp.npz"
OPSET = 18


def weights():
    rs = np.random.default_rng(20240607)
    return {"w1": rs.normal(0, 0.5, (8, 16)).astype(np.float32), "b1": rs.normal(0, 0.1, 16).astype(np.float32),
            "w2": rs.normal(0, 0.5, (16, 3)).astype(np.float32), "b2": rs.normal(0, 0.1, 3).astype(np.float32)}


def reference(x: np.ndarray, img: np.ndarray) -> np.ndarray:
    """The golden function in float64 numpy, rounded to float32."""
    w = {k: v.astype(np.float64) for k, v in weights().items()}
    pix = img.reshape(img.shape[0], -1).astype(np.float64) / 127.5 - 1.0
    h = np.tanh(np.concatenate([x.astype(np.float64), pix], axis=1) @ w["w1"] + w["b1"])
    return (h @ w["w2"] + w["b2"]).astype(np.float32)


def build_model():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = weights()
    init = [numpy_helper.from_array(v, k) for k, v in w.items()]
    init += [numpy_helper.from_array(np.array([0, -1], np.int64), "flat"),
             numpy_helper.from_array(np.array(127.5, np.float32), "half"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    nodes = [
        helper.make_node("Cast", ["img"], ["imgf"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["imgf", "flat"], ["pix0"]),
        helper.make_node("Div", ["pix0", "half"], ["pix1"]),
        helper.make_node("Sub", ["pix1", "one"], ["pix"]),
        helper.make_node("Concat", ["x", "pix"], ["xin"], axis=1),
        helper.make_node("MatMul", ["xin", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Tanh", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["y0"]),
        helper.make_node("Add", ["y0", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "golden_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4]),
         helper.make_tensor_value_info("img", TensorProto.UINT8, ["B", 2, 2, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 3])], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="make_golden.py")
    model.ir_version = 8  # readable by ONNX Runtime >= 1.10 and TensorRT 8.6+
    for k, v in {"exporter": "onnx.helper (tests/data/make_golden.py)", "opset": str(OPSET),
                 "model": "golden-mlp"}.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = k, v
    onnx.checker.check_model(model)
    return model


def inputs(batch: int = 3):
    rs = np.random.default_rng(7)
    return rs.normal(size=(batch, 4)).astype(np.float32), rs.integers(0, 256, (batch, 2, 2, 1), dtype=np.uint8)


def main() -> None:
    import onnx

    onnx.save(build_model(), str(ONNX_PATH))
    x, img = inputs()
    np.savez(EXPECTED_PATH, x=x, img=img, y=reference(x, img))
    print(f"wrote {ONNX_PATH} ({ONNX_PATH.stat().st_size} bytes) and {EXPECTED_PATH}")


if __name__ == "__main__":
    main()
