"""Runners and model files: the golden ONNX model through every runner here, corrupt and truncated files
give one line, TensorRT skips with a visible reason on a machine without it, `engines.build` CLI errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engines import trt
from engines.backends import WEIGHTS_FILE_MODELS
from engines.onnx_utils import BadModelFileError, check_onnx_file, metadata
from engines.runners import JaxRunner, OnnxRuntimeRunner, TensorRtRunner, ort_providers

DATA = Path(__file__).resolve().parent / "data"
GOLDEN = DATA / "golden_mlp.onnx"
REPO = Path(__file__).resolve().parents[1]


def golden():
    with np.load(DATA / "golden_mlp.npz") as z:
        return {"x": z["x"], "img": z["img"]}, z["y"]


def one_line(e: BaseException) -> str:
    msg = str(e)
    assert msg and "\n" not in msg and "Traceback" not in msg, msg
    return msg


# ------------------------------------------------------------------ golden model
@pytest.mark.kernels
def test_golden_file_is_what_the_script_writes():
    sys.path.insert(0, str(DATA))
    try:
        import make_golden
    finally:
        sys.path.remove(str(DATA))
    feeds, y = golden()
    np.testing.assert_allclose(make_golden.reference(feeds["x"], feeds["img"]), y, rtol=0, atol=0)
    assert GOLDEN.stat().st_size < 8192
    meta = metadata(GOLDEN)
    assert meta["opset"] == "18" and meta["model"] == "golden-mlp"


@pytest.mark.kernels
def test_golden_through_onnx_runtime_and_dynamic_batch():
    feeds, y = golden()
    with OnnxRuntimeRunner(GOLDEN, "cpu") as r:
        np.testing.assert_allclose(r.infer(feeds)["y"], y, rtol=1e-5, atol=1e-6)
        one = r.infer({k: v[:1] for k, v in feeds.items()})["y"]
        np.testing.assert_allclose(one, y[:1], rtol=1e-5, atol=1e-6)
        assert len(r.latencies_ms) == 2 and all(t > 0 for t in r.latencies_ms)
    with pytest.raises(RuntimeError, match="before activate"):
        r.infer(feeds)


@pytest.mark.kernels
def test_golden_through_the_jax_runner():
    jnp = pytest.importorskip("jax.numpy")
    sys.path.insert(0, str(DATA))
    try:
        import make_golden
    finally:
        sys.path.remove(str(DATA))
    w = make_golden.weights()

    def fn(x, img):
        pix = img.reshape(img.shape[0], -1).astype(jnp.float32) / 127.5 - 1.0
        h = jnp.tanh(jnp.concatenate([x, pix], axis=1) @ w["w1"] + w["b1"])
        return {"y": h @ w["w2"] + w["b2"]}

    feeds, y = golden()
    with JaxRunner(fn, warmup=feeds) as r:
        np.testing.assert_allclose(r.infer(feeds)["y"], y, rtol=1e-5, atol=1e-6)
        assert len(r.latencies_ms) == 1  # the warm-up is not timed


def test_ort_provider_sets():
    assert ort_providers("cpu") == ("CPUExecutionProvider",)
    assert ort_providers("tensorrt")[0] == "TensorrtExecutionProvider" and ort_providers("cuda")[-1].startswith("CPU")
    with pytest.raises(ValueError, match="valid: cpu, cuda, tensorrt"):
        ort_providers("npu")
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(RuntimeError) as e:
            OnnxRuntimeRunner(GOLDEN, "cuda").activate()
        assert "lacks CUDAExecutionProvider" in one_line(e.value)


# ------------------------------------------------------------------ broken files
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "missing"])
def test_broken_onnx_files_give_one_line(tmp_path, damage):
    path = tmp_path / "m.onnx"
    data = GOLDEN.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x08\x07not a protobuf at all" * 10)
    elif damage == "empty":
        path.write_bytes(b"")
    for call in (lambda: check_onnx_file(path), lambda: OnnxRuntimeRunner(path).activate()):
        with pytest.raises(BadModelFileError) as e:
            call()
        msg = one_line(e.value)
        assert str(path) in msg and "make engines" in msg


def test_broken_engine_files_give_one_line(tmp_path):
    """Without TensorRT the reason is the line; with it, a truncated engine is refused by its key or by
    TensorRT, in one line either way."""
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"\x00garbage engine")
    with pytest.raises((trt.TensorRTUnavailable, BadModelFileError, trt.EngineMismatchError)) as e:
        TensorRtRunner(engine).activate()
    one_line(e.value)
    key = trt.EngineKey("ab" * 32, "10.3.0", "Orin", "8.7", "fp16", 1, 1, 1, None)
    trt.write_sidecar(engine, key)
    side = engine.with_suffix(".json")
    side.write_text(side.read_text()[:40])  # a truncated sidecar
    with pytest.raises(trt.EngineMismatchError) as e:
        trt.check_engine(engine, key)
    assert "unreadable" in one_line(e.value)
    side.write_text('{"key": {"onnx_sha256": "x"}}')  # fields missing
    with pytest.raises(trt.EngineMismatchError) as e:
        trt.check_engine(engine, key)
    assert "unreadable" in one_line(e.value)


@pytest.mark.kernels
@pytest.mark.gpu
def test_tensorrt_runner_on_the_golden_model(tmp_path):
    reason = trt.unavailable_reason()
    if reason:
        pytest.skip(f"TensorRT runner not exercised: {reason}")
    feeds, y = golden()
    for precision, tol in (("fp32", 1e-5), ("fp16", 2e-2)):
        path = trt.build_engine(GOLDEN, tmp_path, "golden", precision, batch_max=4)
        with TensorRtRunner(path, expected_key=trt.system_key(GOLDEN, precision, 4)) as r:
            np.testing.assert_allclose(r.infer(feeds)["y"], y, rtol=tol, atol=tol)
    with pytest.raises(trt.EngineMismatchError):  # built for batch 4: a batch-8 key refuses it
        TensorRtRunner(path, expected_key=trt.system_key(GOLDEN, "fp16", 8)).activate()


def test_runner_module_imports_without_tensorrt():
    code = ("import sys; import engines.runners, engines.trt, engines.build, engines.octo.export; "
            "assert 'tensorrt' not in sys.modules and 'jax2onnx' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# ------------------------------------------------------------------ make engines
def test_build_cli_refuses_bad_arguments_in_one_line():
    for args, what in ((["--models", "octo-huge"], "unknown model octo-huge"),
                       (["--precisions", "fp64"], "unknown precision fp64"),
                       (["--batch-max", "0"], "--batch-max must be at least 1")):
        out = subprocess.run([sys.executable, "-m", "engines.build", *args], cwd=REPO, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2 and what in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_build_exports_bc_state_and_skips_tensorrt_with_the_reason(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    from engines import bc_mlp, build

    # fresh weights of the current architecture, so the test does not depend on the committed file's version
    weights = tmp_path / "bc_state.safetensors"
    bc_mlp.save(bc_mlp.build(bc_mlp.BCConfig()), bc_mlp.BCConfig(), weights)
    monkeypatch.setattr(bc_mlp, "DEFAULT_WEIGHTS", weights)
    # fp32 only: the INT8 graph needs a calibration set recorded from sim tries (tests/test_quantize.py builds one)
    rc = build.main(["--out", str(tmp_path), "--models", "bc-state", "--ort-precisions", "fp32"])
    out = capsys.readouterr().out
    assert rc == 0 and (tmp_path / "bc_state.onnx").is_file()
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["model", "artifact", "status"]
    assert any(line.split()[:3] == ["bc-state", "onnx", "built"] for line in lines)
    reason = trt.unavailable_reason()
    if reason:
        rows = [line for line in lines if line.split()[:2] == ["bc-state", "tensorrt"]]  # the table's rows
        assert len(rows) == 2 and all("skipped" in r and reason in r for r in rows)


def _bc_camera_weights(path: Path, seed: int = 0) -> Path:
    """A bc-camera weights file of seeded random weights of the current architecture (not the trained one)."""
    import torch

    from engines import bc_camera

    torch.manual_seed(seed)
    config = bc_camera.BCCameraNetConfig()
    bc_camera.save(bc_camera.build(config), config, path)
    return path


def test_build_exports_bc_camera_beside_bc_state_into_one_folder(tmp_path, capsys, monkeypatch):
    """make engines' weights-file path, bc-camera beside bc-state: its graph, its manifest entry (the weights' name,
    sha256 and source), its INT8 refused with the reason, TensorRT skipped with the reason here; the graph is
    byte for byte the export a run makes of the same file (what TensorRT engines are keyed by); a second build
    exports nothing again."""
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    import json

    from engines import bc_camera, bc_mlp, build, quantize
    from engines.folder import MANIFEST, sha256_file

    monkeypatch.setenv("SAB_CACHE_DIR", str(tmp_path / "cache"))
    state_weights = tmp_path / "bc_state.safetensors"
    bc_mlp.save(bc_mlp.build(bc_mlp.BCConfig()), bc_mlp.BCConfig(), state_weights)
    monkeypatch.setattr(bc_mlp, "DEFAULT_WEIGHTS", state_weights)
    weights = _bc_camera_weights(tmp_path / "bc_camera.safetensors")
    monkeypatch.setattr(bc_camera, "DEFAULT_WEIGHTS", weights)
    out = tmp_path / "engines"
    # int8 asked: both refuse it (no calibration recording starts), each row saying why
    rc = build.main(["--out", str(out), "--models", "bc-state,bc-camera", "--ort-precisions", "fp32,int8"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, lines
    rows = [line for line in lines if line.startswith("bc-camera ")]
    assert any(r.split()[:3] == ["bc-camera", "onnx", "built"] and str(out / "bc_camera.onnx") in r for r in rows)
    int8 = [r for r in rows if r.split()[1:3] == ["onnx", "int8"]]
    assert len(int8) == 1 and "skipped" in int8[0] and quantize.INT8_REFUSED["bc-camera"] in int8[0]
    assert "results/benchmarks/bc_camera_int8.json" in quantize.INT8_REFUSED["bc-camera"]
    reason = trt.unavailable_reason()
    if reason:
        engines = [r for r in rows if r.split()[1] == "tensorrt"]
        assert len(engines) == 2 and all("skipped" in r and reason in r for r in engines)
    manifest = json.loads((out / MANIFEST).read_text())
    assert set(manifest["models"]) == {"bc-state", "bc-camera"}
    entry = manifest["models"]["bc-camera"]
    digest = sha256_file(weights)
    assert entry["graphs"] == {"model": "bc_camera.onnx"} and entry["family"] == "bc-camera"
    assert entry["weights"] == {"file": "bc_camera.safetensors", "sha256": digest} and not entry["random_weights"]
    source = f"bc_camera.safetensors sha256 {digest[:16]}"
    assert entry["source"] == metadata(out / "bc_camera.onnx")["source"] == source
    assert entry["files"] == {"bc_camera.onnx": sha256_file(out / "bc_camera.onnx")}
    assert manifest["models"]["bc-state"]["weights"]["sha256"] == sha256_file(state_weights)
    # a run of these weights exports the same bytes: the engines built from the folder's graph are its engines
    assert sha256_file(WEIGHTS_FILE_MODELS["bc-camera"].onnx_for_weights(weights, digest)) == entry["files"]["bc_camera.onnx"]
    assert build.main(["--out", str(out), "--models", "bc-camera", "--ort-precisions", "fp32"]) == 0
    again = capsys.readouterr().out.splitlines()
    assert any(line.split()[:3] == ["bc-camera", "onnx", "built"] and "(unchanged)" in line for line in again)

def test_bc_camera_int8_refusal_quotes_its_measurement():
    """The refusal's numbers are the committed benchmark's (results/benchmarks/bc_camera_int8.json)."""
    from engines import quantize

    r = json.loads((REPO / "results" / "benchmarks" / "bc_camera_int8.json").read_text())["results"]
    text = quantize.INT8_REFUSED["bc-camera"]
    lat, parity = r["latency_ms"], r["parity"]
    # the ratio of the two p50s the JSON keeps (its int8_over_fp32_p50, rounded to 3 places, would round twice)
    assert f"{lat['int8']['p50'] / lat['fp32']['p50']:.2f}x slower" in text
    assert f"{lat['int8']['p50']:.2f} vs {lat['fp32']['p50']:.2f} ms p50" in text
    assert f"ranges over {r['calibration']['queries']:,} of its own dev queries" in text
    assert f"on {parity['queries']} other dev queries was up to {max(parity['per_component_max_abs'][:6]):.2f} off" \
        in text
    assert f"{parity['gripper_sign_flips']} gripper commands flipped" in text



def test_build_without_bc_camera_weights_says_how_to_train_them(tmp_path, capsys, monkeypatch):
    """No weights file: named by --models, one line naming the file and the training command, exit 2, nothing
    built; in the default list, a skipped row with that line while the others are built."""
    pytest.importorskip("torch")
    from engines import bc_camera, bc_mlp, build

    state_weights = tmp_path / "bc_state.safetensors"
    bc_mlp.save(bc_mlp.build(bc_mlp.BCConfig()), bc_mlp.BCConfig(), state_weights)
    monkeypatch.setattr(bc_mlp, "DEFAULT_WEIGHTS", state_weights)
    missing = tmp_path / "weights" / "bc_camera.safetensors"
    monkeypatch.setattr(bc_camera, "DEFAULT_WEIGHTS", missing)
    out = tmp_path / "engines"
    assert build.main(["--out", str(out), "--models", "bc-state,bc-camera", "--ort-precisions", "fp32"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: no bc-camera weights at {missing}; ")
    assert "train them with: python -m eval.training.train_bc_camera --datasets DIR" in err and not out.exists()
    # the default list (every model; Octo's left out here: it needs its released weights)
    monkeypatch.setattr(build, "EXPORTS", {m: build.EXPORTS[m] for m in build.WEIGHTS_FILE_MODELS})
    assert build.main(["--out", str(out), "--ort-precisions", "fp32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    skipped = [line for line in lines if line.split()[:2] == ["bc-camera", "onnx"]]
    assert len(skipped) == 1 and skipped[0].split()[2] == "skipped" and build.missing_weights("bc-camera") in skipped[0]
    assert any(line.split()[:3] == ["bc-state", "onnx", "built"] for line in lines)
    assert (out / "bc_state.onnx").is_file() and not (out / "bc_camera.onnx").exists()


def test_bc_camera_int8_is_refused_in_one_line_on_every_backend(monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    from engines.backends import BackendUnavailable, resolve_runtime
    from engines.quantize import INT8_REFUSED
    from tests import fake_trt

    assert resolve_runtime("bc-camera", "ort").precision == "fp32"
    fake_trt.install(monkeypatch)  # a GPU with TensorRT, faked: trt's default is fp16, and int8 refused there too
    assert resolve_runtime("bc-camera", "trt").precision == "fp16"
    for backend in ("ort", "trt", "torch"):
        with pytest.raises(BackendUnavailable) as e:
            resolve_runtime("bc-camera", backend, "int8")
        assert one_line(e.value) == INT8_REFUSED["bc-camera"]
