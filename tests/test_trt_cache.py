"""TensorRT engine cache keys: a changed field refuses the engine, the file name tells TensorRT majors and
profiles apart, an older sidecar is refused; no GPU here means a visible skip."""

from __future__ import annotations

import dataclasses
import json

import pytest

from engines import trt
from engines.onnx_utils import BadModelFileError

KEY = trt.EngineKey("ab" * 32, "10.3.0", "Orin", "8.7", "fp16", 1, 1, 4, "36.4",
                    "state:1x40/1x40/4x40", trt.AS_IS)


def test_every_changed_field_refuses_the_engine(tmp_path):
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"\0" * 16)
    trt.write_sidecar(engine, KEY)
    trt.check_engine(engine, KEY)  # same system: accepted
    for f in dataclasses.fields(KEY):
        value = getattr(KEY, f.name)
        other = dataclasses.replace(KEY, **{f.name: (value + 1) if isinstance(value, int) else f"{value}-x"})
        with pytest.raises(trt.EngineMismatchError) as e:
            trt.check_engine(engine, other)
        assert f.name in str(e.value) and "\n" not in str(e.value)


def test_file_name_holds_tensorrt_major_precision_batch_and_profile():
    stem = KEY.file_stem("bc_state")
    assert stem.startswith("bc_state_fp16_trt10_b4_p") and stem.endswith("_" + "ab" * 6)
    assert dataclasses.replace(KEY, tensorrt="11.0.0").file_stem("bc_state").startswith("bc_state_fp16_trt11_")
    assert dataclasses.replace(KEY, profile="state:1x40/1x40/4x41").file_stem("bc_state") != stem


def test_sidecar_from_before_profiles_is_refused(tmp_path):
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"\0" * 16)
    old = {k: v for k, v in dataclasses.asdict(KEY).items() if k not in ("profile", "graph")}
    engine.with_suffix(".json").write_text(json.dumps({"key": old}))
    with pytest.raises(trt.EngineMismatchError, match="profile: engine '', here 'state:1x40/1x40/4x40'") as e:
        trt.check_engine(engine, KEY)
    assert "make engines" in str(e.value) and "\n" not in str(e.value)


def test_missing_or_broken_sidecar_and_engine(tmp_path):
    engine = tmp_path / "m.engine"
    with pytest.raises(BadModelFileError, match="make engines"):
        trt.read_sidecar(engine)
    engine.write_bytes(b"x")
    with pytest.raises(trt.EngineMismatchError, match="no sidecar"):
        trt.read_sidecar(engine)
    engine.with_suffix(".json").write_text("{not json")
    with pytest.raises(trt.EngineMismatchError, match="unreadable"):
        trt.read_sidecar(engine)


def test_unknown_precision_is_refused(tmp_path):
    with pytest.raises(ValueError, match="valid: fp32, fp16, int8, fp8"):
        trt.system_key(tmp_path / "x.onnx", "fp64")


def test_building_needs_tensorrt_and_a_gpu(tmp_path):
    reason = trt.unavailable_reason()
    if reason is None:
        pytest.skip("a GPU with TensorRT is present: the build path is exercised by benchmarks/device_check.sh")
    with pytest.raises(trt.TensorRTUnavailable) as e:
        trt.system_key(tmp_path / "x.onnx", "fp16")
    assert str(e.value) == reason
