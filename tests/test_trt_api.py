"""The TensorRT code against the APIs of TensorRT 10 and 11 and of cuda-python, on a CPU: fake ``tensorrt`` and
``cuda.bindings.runtime`` modules (tests/fake_trt.py) drive engines.trt.build_engine and TensorRtRunner; the fp16
graph that strongly typed TensorRT builds from is checked with ONNX Runtime on the CPU."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from engines import runners, trt
from engines.onnx_utils import BadModelFileError
from engines.runners import TensorRtRunner
from engines.zero_copy import CopyCounter
from tests import fake_trt
from tests.fake_trt import ENGINE_BYTES, DeviceArray

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
GOLDEN = DATA / "golden_mlp.onnx"
ROOT = Path(__file__).resolve().parents[1]
GOLDEN_PROFILE = "x:1x4/1x4/4x4;img:1x2x2x1/1x2x2x1/4x2x2x1"


def one_line(e: BaseException) -> str:
    msg = str(e)
    assert msg and "\n" not in msg, msg
    return msg


def save(model, path: Path) -> Path:
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def graph_with_inputs(path: Path, *inputs) -> Path:
    """A graph of Identity nodes over float inputs [(name, dims), ...]."""
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n, dims in inputs]
    outs = [helper.make_tensor_value_info(f"{n}_out", TensorProto.FLOAT, dims) for n, dims in inputs]
    nodes = [helper.make_node("Identity", [n], [f"{n}_out"]) for n, _ in inputs]
    return save(helper.make_model(helper.make_graph(nodes, "g", ins, outs),
                                  opset_imports=[helper.make_opsetid("", 17)]), path)


# ------------------------------------------------------------------ build: TensorRT 10 (weakly typed)
def test_trt10_fp16_uses_the_builder_flag_and_names_the_engine_by_major(tmp_path, monkeypatch):
    f = fake_trt.install(monkeypatch, major=10)
    cache = tmp_path / "timing.cache"
    path = trt.build_engine(GOLDEN, tmp_path, "golden", "fp16", batch_max=4, timing_cache=cache)
    s = f.trt.state
    assert s.config.flags == {f.trt.BuilderFlag.FP16} and s.network.flags == 0  # weakly typed, as 10 builds
    assert s.parsed.graph.initializer[0].data_type == TensorProto.FLOAT  # the ONNX file itself was parsed
    assert s.config.profiles[0].shapes == {"x": ((1, 4), (1, 4), (4, 4)),
                                           "img": ((1, 2, 2, 1), (1, 2, 2, 1), (4, 2, 2, 1))}
    assert path.name.startswith("golden_fp16_trt10_b4_p") and path.read_bytes() == ENGINE_BYTES
    key = trt.read_sidecar(path)
    assert key.profile == GOLDEN_PROFILE and key.graph == trt.AS_IS and key.tensorrt == "10.3.0"
    assert not cache.exists()  # the timing cache is named by TensorRT major: another major's would be refused
    assert (tmp_path / "timing_trt10.cache").read_bytes() == b"timing-cache"
    assert trt.build_engine(GOLDEN, tmp_path, "golden", "fp16", batch_max=4, timing_cache=cache) == path
    assert s.builds == 1  # the second call reused the cached engine


def test_trt10_fp32_clears_tf32_and_int8_needs_fast_int8(tmp_path, monkeypatch):
    f = fake_trt.install(monkeypatch, major=10)
    trt.build_engine(GOLDEN, tmp_path, "golden", "fp32")
    assert f.trt.state.config.flags == set() and f.trt.state.config.cleared == {f.trt.BuilderFlag.TF32}
    with pytest.raises(trt.TensorRTUnavailable, match="no fast INT8"):
        trt.build_engine(GOLDEN, tmp_path, "golden", "int8")


# ------------------------------------------------------------------ build: TensorRT 11 (strongly typed)
@pytest.mark.parametrize("has_flag", [True, False])
def test_trt11_fp16_builds_a_strongly_typed_network_from_the_fp16_graph(tmp_path, monkeypatch, has_flag):
    f = fake_trt.install(monkeypatch, major=11, strongly_typed_flag=has_flag)
    path = trt.build_engine(GOLDEN, tmp_path, "golden", "fp16", batch_max=4)
    s = f.trt.state
    assert not hasattr(f.trt.BuilderFlag, "FP16") and s.config.flags == set()
    assert s.network.flags == ((1 << 1) if has_flag else 0)  # STRONGLY_TYPED where the flag still exists
    g = s.parsed.graph
    assert {t.data_type for t in g.initializer if t.name.startswith(("w", "b"))} == {TensorProto.FLOAT16}
    assert [(i.name, i.type.tensor_type.elem_type) for i in g.input] == [("x", TensorProto.FLOAT),
                                                                       ("img", TensorProto.UINT8)]
    assert g.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert path.name.startswith("golden_fp16_trt11_b4_p")
    key = trt.read_sidecar(path)
    assert key.graph == trt.FP16_GRAPH and key.profile == GOLDEN_PROFILE
    fp16 = list(tmp_path.glob("*.fp16.onnx"))
    assert len(fp16) == 1  # cached beside the engine
    stamp = fp16[0].stat().st_mtime_ns
    trt.build_engine(GOLDEN, tmp_path, "golden", "fp16", batch_max=4, rebuild=True)
    assert s.builds == 2 and fp16[0].stat().st_mtime_ns == stamp  # the fp16 graph was reused


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_trt11_refuses_int8_and_fp8_without_qdq(tmp_path, monkeypatch, precision):
    fake_trt.install(monkeypatch, major=11)
    with pytest.raises(trt.TensorRTUnavailable) as e:
        trt.build_engine(GOLDEN, tmp_path, "golden", precision)
    assert "Q/DQ" in one_line(e.value) and "11.0.0" in str(e.value)


def test_engines_of_two_tensorrt_majors_do_not_meet(tmp_path, monkeypatch):
    fake_trt.install(monkeypatch, major=10)
    old = trt.build_engine(GOLDEN, tmp_path, "golden", "fp32")
    fake_trt.install(monkeypatch, major=11)
    new = trt.build_engine(GOLDEN, tmp_path, "golden", "fp32")
    assert old != new and "trt10" in old.name and "trt11" in new.name
    with pytest.raises(trt.EngineMismatchError, match="tensorrt: engine '10.3.0', here '11.0.0'"):
        trt.check_engine(old, trt.system_key(GOLDEN, "fp32"))


# ------------------------------------------------------------------ build: every failure is one line
def test_build_steps_that_fail_give_one_line(tmp_path, monkeypatch):
    f = fake_trt.install(monkeypatch, major=10)
    f.trt.state.parse_ok = False
    with pytest.raises(BadModelFileError) as e:
        trt.build_engine(GOLDEN, tmp_path, "golden", "fp16")
    assert "cannot parse" in one_line(e.value) and "UNSUPPORTED_NODE" in str(e.value)
    f.trt.state.parse_ok, f.trt.state.build_ok = True, False
    with pytest.raises(trt.TensorRTBuildError) as e:
        trt.build_engine(GOLDEN, tmp_path, "golden", "fp16")
    assert "failed to build golden" in one_line(e.value)
    assert not list(tmp_path.glob("*.engine"))  # nothing half-made left under a cached name
    f.trt.state.build_ok, f.trt.state.timing_cache_ok = True, False
    (tmp_path / "old_trt10.cache").write_bytes(b"from another GPU")
    with pytest.raises(trt.TensorRTBuildError) as e:
        trt.build_engine(GOLDEN, tmp_path, "golden", "fp16", timing_cache=tmp_path / "old.cache")
    assert "old_trt10.cache" in one_line(e.value) and "delete it" in str(e.value)


# ------------------------------------------------------------------ the optimisation profile
def test_dynamic_non_batch_axes_are_refused_unless_shapes_are_given(tmp_path):
    path = graph_with_inputs(tmp_path / "dyn.onnx", ("img", ["B", 3, "H", 8]), ("s", ["B", 5]))
    with pytest.raises(BadModelFileError) as e:
        trt.input_profile(path, 2)
    assert "'img' axis 2 is dynamic" in one_line(e.value) and "input_shapes" in str(e.value)
    prof = trt.input_profile(path, 2, {"img": (1, 3, 16, 8)})
    assert prof == {"img": ((1, 3, 16, 8), (1, 3, 16, 8), (2, 3, 16, 8)), "s": ((1, 5), (1, 5), (2, 5))}
    other = trt.profile_text(trt.input_profile(path, 2, {"img": (1, 3, 32, 8)}))
    assert other != trt.profile_text(prof)
    bad = [({"img": (1, 3, 16)}, "rank 3"), ({"img": (1, 4, 16, 8)}, "fixes it to 3"),
           ({"nope": (1,)}, "does not have"), ({"img": (1, 3, 0, 8)}, "at least 1")]
    for shapes, msg in bad:
        with pytest.raises(ValueError, match=msg) as e:
            trt.input_profile(path, 2, shapes)
        one_line(e.value)


def test_a_fixed_batch_axis_cannot_take_a_larger_profile(tmp_path):
    path = graph_with_inputs(tmp_path / "fixed.onnx", ("s", [1, 5]))
    assert trt.input_profile(path, 1) == {"s": ((1, 5),) * 3}
    with pytest.raises(BadModelFileError, match="fixed batch axis") as e:
        trt.input_profile(path, 4)
    one_line(e.value)


def test_profile_and_tensorrt_major_are_in_the_key_and_the_file_name(tmp_path, monkeypatch):
    fake_trt.install(monkeypatch, major=10)
    path = graph_with_inputs(tmp_path / "dyn.onnx", ("img", ["B", 3, "H", 8]))
    small = trt.system_key(path, "fp16", 2, {"img": (1, 3, 16, 8)})
    large = trt.system_key(path, "fp16", 2, {"img": (1, 3, 32, 8)})
    assert small.profile == "img:1x3x16x8/1x3x16x8/2x3x16x8"
    assert small.file_stem("m") != large.file_stem("m") and "trt10" in small.file_stem("m")
    assert any(d.startswith("profile:") for d in small.differences(large))
    eleven = dataclasses.replace(small, tensorrt="11.0.0")
    assert "trt11" in eleven.file_stem("m")


# ------------------------------------------------------------------ the fp16 graph, run by ONNX Runtime
def ort_run(path: Path, feeds: dict) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def rel_err(a, ref) -> float:
    ref = np.asarray(ref, np.float64)
    return float(np.max(np.abs(np.asarray(a, np.float64) - ref)) / np.max(np.abs(ref)))


# fp16 keeps 11 significant bits (relative step 4.9e-4); through these small graphs' rounded weights and
# activations the error stays under 1% of the largest output (measured here: 8e-4 and 4e-4)
FP16_BOUND = 1e-2


def test_fp16_graph_of_the_golden_mlp_matches_fp32_within_the_bound(tmp_path):
    with np.load(DATA / "golden_mlp.npz") as z:
        feeds, y = {"x": z["x"], "img": z["img"]}, z["y"]
    out = trt.fp16_graph(GOLDEN, tmp_path / "golden.fp16.onnx")
    model = onnx.load(str(out))
    assert [i.type.tensor_type.elem_type for i in model.graph.input] == [TensorProto.FLOAT, TensorProto.UINT8]
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert all(t.data_type != TensorProto.FLOAT for t in model.graph.initializer)
    got = ort_run(out, feeds)
    assert got.dtype == np.float32 and got.shape == y.shape
    err = rel_err(got, y)
    assert 0 < err < FP16_BOUND, err  # > 0: it did run in fp16
    np.testing.assert_allclose(ort_run(GOLDEN, feeds), y, rtol=1e-5, atol=1e-6)


def keep_fp32_graph(path: Path) -> Path:
    """x (B,1,2,2) -> *w -> Resize x2 (scales must stay float32) -> + Constant(value_float) -> Max(mask -1e9)."""
    rs = np.random.default_rng(3)
    init = [numpy_helper.from_array(rs.normal(size=(1, 1, 2, 2)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"]),
             helper.make_node("Resize", ["m", "", "scales"], ["r"], mode="nearest"),
             helper.make_node("Constant", [], ["c"], value_float=0.5),
             helper.make_node("Add", ["r", "c"], ["a"]),
             helper.make_node("Constant", [], ["mask"], value=numpy_helper.from_array(np.array(-1e9, np.float32))),
             helper.make_node("Max", ["a", "mask"], ["y"])]
    graph = helper.make_graph(nodes, "keep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 1, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 1, 4, 4])], init)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_fp16_graph_keeps_fp32_ops_in_fp32_and_saturates_large_constants(tmp_path):
    src = keep_fp32_graph(tmp_path / "keep.onnx")
    out = trt.fp16_graph(src)
    assert out == tmp_path / "keep.fp16.onnx"  # beside the source by default
    g = onnx.load(str(out)).graph
    inits = {t.name: t for t in g.initializer}
    assert inits["scales"].data_type == TensorProto.FLOAT and inits["w"].data_type == TensorProto.FLOAT16
    resize = next(n for n in g.node if n.op_type == "Resize")
    casts = {n.output[0]: n for n in g.node if n.op_type == "Cast"}
    assert casts[resize.input[0]].attribute[0].i == TensorProto.FLOAT  # fed float32
    mask = next(n for n in g.node if n.output[0] == "mask").attribute[0].t
    assert mask.data_type == TensorProto.FLOAT16 and numpy_helper.to_array(mask) == -65504
    x = np.random.default_rng(4).normal(size=(3, 1, 2, 2)).astype(np.float32)
    ref, got = ort_run(src, {"x": x}), ort_run(out, {"x": x})
    assert got.dtype == np.float32 and got.shape == (3, 1, 4, 4)
    assert 0 < rel_err(got, ref) < FP16_BOUND


def test_fp16_graph_is_cached_by_source_digest_and_refuses_control_flow(tmp_path):
    src = keep_fp32_graph(tmp_path / "keep.onnx")
    out = trt.fp16_graph(src)
    stamp = out.stat().st_mtime_ns
    assert trt.fp16_graph(src) == out and out.stat().st_mtime_ns == stamp
    keep_fp32_graph(src)  # same bytes: still reused
    assert out.stat().st_mtime_ns == stamp
    graph_with_inputs(src, ("x", ["B", 2]))  # another source: made again
    assert trt.fp16_graph(src) == out and out.stat().st_mtime_ns != stamp
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "b", [],
                               [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    cond = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True))),
         helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)], "if",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = save(helper.make_model(cond, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "if.onnx")
    with pytest.raises(BadModelFileError, match="subgraph") as e:
        trt.fp16_graph(path)
    one_line(e.value)


# ------------------------------------------------------------------ the runner: binding, checks, CUDA graphs
@pytest.fixture
def engine_file(tmp_path):
    path = tmp_path / "fake.engine"
    path.write_bytes(ENGINE_BYTES)
    return path


def test_host_feeds_are_copied_and_counted(monkeypatch, engine_file):
    f = fake_trt.install(monkeypatch)
    counter = CopyCounter()
    x = np.array([[-1, 2, -3, 4], [5, -6, 7, -8]], np.float32)
    with TensorRtRunner(engine_file, counter=counter) as r:
        np.testing.assert_array_equal(r.infer({"x": x})["y"], 2 * np.maximum(x, 0))
        assert r.context.shape_calls == [("x", (2, 4))] and r.last_gpu_ms == 0.25
        # bytes and device time of the copy (CUDA events around it; the fake device copies 1 MiB per ms)
        assert r.last_h2d_bytes == x.nbytes and r.last_h2d_ms == x.nbytes / 2 ** 20
    assert f.cudart.h2d == 1 and counter.h2d_bytes == x.nbytes and not counter.report()["zero_copy"]
    assert counter.h2d_ms == x.nbytes / 2 ** 20


def test_device_feeds_are_bound_by_address_without_copies(monkeypatch, engine_file):
    f = fake_trt.install(monkeypatch)
    counter = CopyCounter()
    frame = DeviceArray(np.array([[1, -2, 3, -4]], np.float32))
    with TensorRtRunner(engine_file, counter=counter) as r:
        out = r.infer({"x": frame})["y"]
        assert r.context.addresses["x"] == frame.array.ctypes.data
        assert (r.last_h2d_bytes, r.last_h2d_ms) == (0, 0.0)
    np.testing.assert_array_equal(out, [[2, 0, 6, 0]])
    counter.end_step()
    assert f.cudart.h2d == 0 and counter.report()["zero_copy"] and counter.per_step == [0]


def test_device_feeds_with_wrong_dtype_layout_or_stream_are_refused(monkeypatch, engine_file):
    f = fake_trt.install(monkeypatch)
    base = np.zeros((2, 4), np.float32)
    cases = [(DeviceArray(base.astype(np.float16)), "dtype float16, the engine takes float32"),
             (DeviceArray(base, strides=(4, 8)), "not C-contiguous"),
             (DeviceArray(base, stream=0), "stream 0 is not valid")]
    with TensorRtRunner(engine_file) as r:
        for feed, msg in cases:
            with pytest.raises(ValueError, match=msg) as e:
                r.infer({"x": feed})
            assert "'x'" in one_line(e.value)
        r.infer({"x": DeviceArray(base, strides=(16, 4))})  # explicit C strides are fine
        r.infer({"x": DeviceArray(base, stream=0x77)})  # the producer's stream: waited for, not refused
    assert ("cudaEventRecord", 0x77) in f.cudart.calls and "cudaStreamWaitEvent" in f.cudart.calls


def test_refused_shape_address_or_enqueue_give_one_line(monkeypatch, engine_file):
    fake_trt.install(monkeypatch)
    with TensorRtRunner(engine_file) as r:
        with pytest.raises(ValueError) as e:
            r.infer({"x": np.zeros((5, 4), np.float32)})  # the profile stops at batch 4
        assert "refused shape (5, 4) for input 'x'" in one_line(e.value) and "(4, 4)" in str(e.value)
        r.context.refuse_addresses = True
        with pytest.raises(ValueError, match="refused address") as e:
            r.infer({"x": np.zeros((1, 4), np.float32)})
        one_line(e.value)
        r.context.refuse_addresses, r.context.execute_ok = False, False
        with pytest.raises(RuntimeError, match="execute_async_v3 failed for fake.engine") as e:
            r.infer({"x": np.zeros((1, 4), np.float32)})
        one_line(e.value)
        with pytest.raises(ValueError, match="needs inputs x"):
            r.infer({})


def test_cuda_graphs_are_keyed_by_addresses_not_only_shapes(monkeypatch, engine_file):
    f = fake_trt.install(monkeypatch)
    a = DeviceArray(np.array([[1, 2, 3, 4]], np.float32))
    b = DeviceArray(np.array([[-1, 5, -1, 6]], np.float32))
    with TensorRtRunner(engine_file, cuda_graph=True) as r:
        for _ in range(3):  # runs, captures, replays
            np.testing.assert_array_equal(r.infer({"x": a})["y"], [[2, 4, 6, 8]])
        assert f.cudart.calls.count("cudaGraphInstantiate") == 1 and f.cudart.calls.count("cudaGraphLaunch") == 2
        # same shape, another address: a shape-keyed graph would replay a's pointer here
        np.testing.assert_array_equal(r.infer({"x": b})["y"], [[0, 10, 0, 12]])
        np.testing.assert_array_equal(r.infer({"x": b})["y"], [[0, 10, 0, 12]])
        assert len(r.graphs) == 2
    assert f.cudart.calls.count("cudaGraphExecDestroy") == 2  # deactivate frees what it captured


# ------------------------------------------------------------------ cuda-python against the driver
def test_cuda_python_newer_than_the_driver_is_refused_with_what_to_install(monkeypatch, engine_file):
    runners.check_cuda_python("12.6.2", 12060)
    runners.check_cuda_python("12.6.2", 13000)  # a newer driver runs older bindings
    with pytest.raises(trt.TensorRTUnavailable) as e:
        runners.check_cuda_python("13.0.1", 12060)
    assert one_line(e.value) == ("cuda-python 13.0.1 needs a CUDA 13 driver, this one is CUDA 12.6; "
                                 "install: pip install 'cuda-python>=12.6,<13'")
    with pytest.raises(trt.TensorRTUnavailable, match="no CUDA driver"):
        runners.check_cuda_python("12.6.2", 0)
    fake_trt.install(monkeypatch, cuda_version="13.0.1", driver=12060)
    with pytest.raises(trt.TensorRTUnavailable, match="cuda-python 13.0.1 needs a CUDA 13 driver"):
        TensorRtRunner(engine_file).activate()


def test_setup_admits_cuda_python_12_and_13_in_the_trt_extra():
    """JetPack 6 brings CUDA 12.6, JetPack 7 CUDA 13: the extra admits both, and a driver's own major is what the
    one-line refusal says to install (12.x below CUDA 13)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "setup")
    extras = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "extras_require"))
    assert extras["trt"] == [runners.CUDA_PYTHON_SPEC] == ["cuda-python>=12.6,<14"]
    assert runners.cuda_python_spec(12) == "cuda-python>=12.6,<13"
    assert runners.cuda_python_spec(13) == "cuda-python>=13,<14"


def test_a_damaged_engine_in_the_cache_is_built_again_with_one_line(tmp_path, monkeypatch, capsys):
    f = fake_trt.install(monkeypatch, major=10)
    path = trt.build_engine(GOLDEN, tmp_path, "golden", "fp16", batch_max=4)
    path.write_bytes(path.read_bytes()[:4])  # a truncated copy
    capsys.readouterr()
    assert trt.build_engine(GOLDEN, tmp_path, "golden", "fp16", batch_max=4) == path
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "damaged" in err[0]
    assert f.trt.state.builds == 2 and path.read_bytes() == ENGINE_BYTES
