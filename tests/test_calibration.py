"""Calibration recordings (engines.calibration): recorded once per set of inputs, so that a rebuild of the
engines does not run the simulator again; engines.build times its stages and imports no benchmark."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engines import calibration
from engines.build import StageTimer

ROOT = Path(__file__).resolve().parents[1]


def _fake_recorder(calls):
    """In place of the recording process (eval.calibration): writes what it writes, without the simulator."""
    def record_calibration(model, path, progress=True):
        recorded = calibration._recording_model(model)
        tries = calibration.BC_CALIB_TRIES if model == "bc-state" else calibration.CALIB_TRIES
        calls.append(list(tries))
        arrays = {"state": np.arange(80, dtype=np.float32).reshape(2, 40), "setup": np.array(["A01", "A01"]),
                  "try_index": np.array([10, 10], np.int32)}
        calibration.save(arrays, path, {"model": model, "recording_s": 1.5},
                         calibration.recording_inputs(recorded, tries, driver=calibration.CALIB_DRIVER[recorded]))
        done = subprocess.Popen([sys.executable, "-c", ""])  # a recording process that ended well
        return calibration.CalibrationJob(path, done, [sys.executable, "-c", ""])
    return record_calibration


def test_a_recording_is_reused_until_its_inputs_change(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(calibration, "record_calibration", _fake_recorder(calls))
    path, recorded = calibration.ensure_calibration("bc-state", tmp_path, progress=False)
    assert recorded and path.is_file() and calls == [list(calibration.BC_CALIB_TRIES)]
    side = json.loads(path.with_suffix(".json").read_text())
    inputs = calibration.recording_inputs("bc-state", calibration.BC_CALIB_TRIES)
    assert side["inputs"] == json.loads(json.dumps(inputs)) and side["inputs_sha256"] == calibration.inputs_sha256(inputs)
    for key in ("tasklist_sha256", "predicate", "weights_sha256", "tries"):
        assert key in inputs, key
    # the same inputs: the recording is kept, the simulator does not run
    assert calibration.ensure_calibration("bc-state", tmp_path, progress=False) == (path, False)
    assert len(calls) == 1
    # other inputs (here: other tries): recorded again
    monkeypatch.setattr(calibration, "BC_CALIB_TRIES", (("A01", 11),))
    assert calibration.ensure_calibration("bc-state", tmp_path, progress=False) == (path, True)
    assert calls[-1] == [("A01", 11)]
    # a recording from before inputs were hashed (no inputs_sha256 in its sidecar) is recorded again
    side = json.loads(path.with_suffix(".json").read_text())
    side.pop("inputs_sha256")
    path.with_suffix(".json").write_text(json.dumps(side))
    assert calibration.ensure_calibration("bc-state", tmp_path, progress=False)[1] is True


def test_make_engines_starts_one_recording_before_the_exports_and_waits_for_it_once(tmp_path, monkeypatch):
    """engines.build: the Octo calibration recording is started before anything is exported (bc-state's INT8 is
    refused: none for it), waited for by the first Octo model's INT8 graph, which notes the recording's own
    seconds apart from the wait, and found cached by the second."""
    import types

    from engines import build, quantize

    calls = []
    monkeypatch.setattr(calibration, "record_calibration", _fake_recorder(calls))
    monkeypatch.setattr(quantize, "octo_calibration", lambda cfg, path: path)  # the fake holds no images
    args = types.SimpleNamespace(onnx_from=None, queries_dir=str(tmp_path))
    jobs = build._start_recordings(["bc-state", "octo-small", "octo-base"], args, ["fp32", "int8"])
    assert calls == [list(calibration.CALIB_TRIES)]
    assert list(jobs) == [calibration.calibration_path("octo-small", tmp_path)]
    assert build._start_recordings(["octo-small"], args, ["fp32"]) == {}  # no INT8 asked: nothing recorded
    timer = StageTimer()
    for model in ("octo-small", "octo-base"):
        assert build._calibration(model, timer, str(tmp_path), jobs) == tmp_path / quantize.OCTO_CALIB.name
    first, second = timer.rows
    assert first["note"] == "recorded (1.5 s, beside the exports)" and first["background_s"] == 1.5
    assert second["note"] == "cached" and "background_s" not in second and len(calls) == 1 and not jobs


def test_octo_recordings_name_the_appearance_of_their_frames(monkeypatch):
    from env import appearance

    a = calibration.recording_inputs("octo-small", calibration.CALIB_TRIES)
    assert a["appearance"] == appearance.APPEARANCE_VERSION
    monkeypatch.setattr("env.appearance.APPEARANCE_VERSION", appearance.APPEARANCE_VERSION + 1)
    b = calibration.recording_inputs("octo-small", calibration.CALIB_TRIES)
    assert calibration.inputs_sha256(a) != calibration.inputs_sha256(b)


def test_stage_timer_records_each_stage_and_its_note():
    timer = StageTimer()
    with timer.stage("bc-state", "export"):
        pass
    with pytest.raises(RuntimeError):
        with timer.stage("bc-state", "quantise") as st:
            st.note = "built"
            raise RuntimeError("a failing stage is still timed")
    assert [(r["model"], r["stage"], r["note"]) for r in timer.rows] == [("bc-state", "export", ""),
                                                                       ("bc-state", "quantise", "built")]
    assert set(timer.totals()) == set(StageTimer.STAGES) and all(v >= 0 for v in timer.totals().values())


def test_engines_import_no_benchmark():
    """engines.build records its calibration through engines.calibration: engines never imports benchmarks."""
    for path in sorted((ROOT / "engines").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "benchmarks" or n.startswith("benchmarks.") for n in names), path


@pytest.mark.sim
def test_the_octo_calibration_is_recorded_on_scripted_tries_at_octos_query_steps_without_a_model(monkeypatch):
    """eval.calibration.record_scripted: the scripted reference drives, Octo's own policy makes its queries (every
    CALIB_EVERY-th kept, the first included) and no model runs; the frames are the scene's."""
    pytest.importorskip("jax")
    from eval import calibration as recording
    from eval.policies.octo import OctoPolicy

    calls = []
    real_act = OctoPolicy.act
    monkeypatch.setattr(OctoPolicy, "act", lambda self, o: calls.append(self.runner.name) or real_act(self, o))
    arrays = recording.record_scripted((("B01", 3),), quick=True, progress=False)
    # 12 steps at Octo's chunk of 4: queries on steps 0, 4 and 8, of which every CALIB_EVERY-th is kept
    queries = -(-calibration.QUICK_STEPS // 4)
    assert len(arrays["masks"]) == -(-queries // calibration.CALIB_EVERY)
    assert set(calls) == {recording._QueryKeeper.name} and len(calls) == calibration.QUICK_STEPS
    assert arrays["masks"][0, 0, 0] == 0 and arrays["masks"][0, 1, 0] == 1  # the first query: its copy is padding
    for key in ("image_primary", "image_wrist"):
        assert arrays[key].dtype == np.uint8 and arrays[key].std() > 5  # rendered frames, not blanks
    assert list(arrays["setup"]) == ["B01"] * len(arrays["masks"]) and set(arrays["try_index"]) == {3}
    inputs = calibration.recording_inputs("octo-small", calibration.CALIB_TRIES, driver="scripted")
    assert inputs["driver"] == "scripted" and inputs["every"] == calibration.CALIB_EVERY
    assert calibration.inputs_sha256(inputs) != calibration.inputs_sha256(
        calibration.recording_inputs("octo-small", calibration.CALIB_TRIES))
