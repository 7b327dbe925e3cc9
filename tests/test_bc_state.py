"""bc-state: the state vector, deterministic training, strict loading, ONNX parity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engines import bc_mlp
from engines.bc_mlp import BadCheckpointError, BCConfig
from eval.training.state_features import SCENE_DIM, STATE_DIM, ActionHistory, policy_input, state_vector
from eval.training.train_bc import train

pytestmark = pytest.mark.sim  # builds ManiSkill scenes


def _state(block_yaw=0.3, shape_k=1, grip=0.2):
    def q_yaw(a):
        return np.array([np.cos(a / 2), 0, 0, np.sin(a / 2)])

    # tcp pointing down with fingers closing along `grip` (same construction as the scripted policy)
    from eval.policies.scripted import _top_down

    tq = _top_down(grip).as_quat()  # xyzw
    block_q = np.tile(q_yaw(0.0), (3, 1))
    block_q[shape_k] = q_yaw(block_yaw)
    return {
        "tcp_p": np.array([0.0, 0.0, 0.15]), "tcp_q": np.array([tq[3], tq[0], tq[1], tq[2]]),
        "gripper_opening": np.float64(1.0),
        "block_p": np.array([[-1.2, 1.2, -0.9], [-0.18, 0.01, 0.02], [-1.2, 1.5, -0.9]]),
        "block_q": block_q, "hole_xy": np.array([[0.03, -0.11], [0.03, 0.0], [0.03, 0.11]]),
        "hole_yaw": np.zeros(3), "board_top_z": np.float64(0.03),
        "active": np.array([0, 1, 0], bool), "target": np.eye(3, dtype=bool)[shape_k], "is_grasped": np.False_,
    }


def test_state_vector_is_fixed_and_symmetric():
    v = state_vector(_state())
    assert v.shape == (SCENE_DIM,) and v.dtype == np.float32 and np.all(np.isfinite(v))
    # a square turned by a quarter turn, held at a grip turned by a half turn: the same features
    np.testing.assert_allclose(state_vector(_state(block_yaw=0.3 + np.pi / 2, grip=0.2 + np.pi)), v, atol=1e-5)
    assert not np.allclose(state_vector(_state(block_yaw=0.3 + np.pi / 4)), v, atol=1e-3)


def _data(n=600, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, STATE_DIM)).astype(np.float32)
    y = np.tanh(x[:, :7] * 0.5).astype(np.float32)
    return x, y


def test_training_is_deterministic_from_its_seed():
    x, y = _data()
    a, _, ha = train(x, y, seed=3, epochs=3, batch=64, log=lambda *_: None)
    b, _, hb = train(x, y, seed=3, epochs=3, batch=64, log=lambda *_: None)
    for (ka, ta), (kb, tb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(ta, tb)
    assert ha == hb and ha[-1]["train_mse"] < ha[0]["train_mse"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    x, y = _data()
    model, config, _ = train(x, y, seed=0, epochs=2, batch=64, log=lambda *_: None)
    path = tmp_path_factory.mktemp("bc") / "w.safetensors"
    bc_mlp.save(model, config, path)
    return path, model, config, x


def test_weights_round_trip(trained):
    path, model, _, x = trained
    loaded, config, meta = bc_mlp.load(path)
    assert config == BCConfig() and meta["format"] == bc_mlp.FORMAT
    np.testing.assert_array_equal(bc_mlp.numpy_forward(loaded, x[:5]), bc_mlp.numpy_forward(model, x[:5]))


def test_mismatched_or_broken_weights_fail_with_one_line(trained, tmp_path):
    from safetensors.torch import load_file, save_file

    path = trained[0]
    tensors = load_file(str(path))
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    cases = {
        "shape": ({**tensors, "net.0.weight": torch.zeros(256, 12)}, meta, "net.0.weight"),
        "norm": ({k: v for k, v in tensors.items() if k != "obs_std"}, meta, "obs_std"),
        "badstd": ({**tensors, "obs_std": torch.zeros(STATE_DIM)}, meta, "std"),
        "format": (tensors, {**meta, "format": "other"}, "not a bc-state checkpoint"),
    }
    for name, (t, m, needle) in cases.items():
        p = tmp_path / f"{name}.safetensors"
        save_file(t, str(p), metadata=m)
        with pytest.raises(BadCheckpointError) as e:
            bc_mlp.load(p)
        assert needle in str(e.value) and "\n" not in str(e.value), name
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(path.read_bytes()[:100])
    with pytest.raises(BadCheckpointError, match="corrupt"):
        bc_mlp.load(corrupt)
    with pytest.raises(BadCheckpointError, match="train them"):
        bc_mlp.load(tmp_path / "missing.safetensors")


def test_onnx_export_matches_torch_and_the_policy_backends_agree(trained, tmp_path, monkeypatch):
    from engines.runners import OnnxRuntimeRunner

    path, model, config, x = trained
    onnx_path = bc_mlp.export_onnx(model, config, tmp_path / "bc.onnx")
    with OnnxRuntimeRunner(onnx_path) as r:
        for batch in (1, 7):  # dynamic batch
            got = r.infer({"state": x[:batch]})["action"]
            np.testing.assert_allclose(got, bc_mlp.numpy_forward(model, x[:batch]), rtol=1e-4, atol=1e-5)
    from engines.onnx_utils import metadata

    meta = metadata(onnx_path)
    assert meta["opset"] == "17" and meta["exporter"].startswith("torch.onnx")

    monkeypatch.setenv("SAB_CACHE_DIR", str(tmp_path / "cache"))
    from eval.request import make_policy

    obs = {"state": _state()}
    a_ort = make_policy("bc-state", checkpoint=path, backend="ort").query(obs)
    a_torch = make_policy("bc-state", checkpoint=path, backend="torch").query(obs)
    assert a_ort.shape == (7,)
    np.testing.assert_allclose(a_ort, a_torch, rtol=1e-4, atol=1e-5)


def _trt_reason():
    from engines import trt

    return trt.unavailable_reason()


@pytest.mark.skipif(_trt_reason() is None, reason="TensorRT is available here")
def test_trt_backend_without_tensorrt_is_one_line(trained, tmp_path, monkeypatch):
    from eval.request import make_policy

    monkeypatch.setenv("SAB_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="needs TensorRT and an NVIDIA GPU") as e:
        make_policy("bc-state", checkpoint=trained[0], backend="trt")
    assert "\n" not in str(e.value)


@pytest.mark.gpu
@pytest.mark.skipif(_trt_reason() is not None, reason=f"TensorRT unavailable: {_trt_reason()}")
def test_trt_backend_matches_onnx_runtime(trained, tmp_path, monkeypatch):
    from eval.policies.base import query_members
    from eval.request import make_policy

    monkeypatch.setenv("SAB_CACHE_DIR", str(tmp_path / "cache"))
    obs = {"state": _state()}
    ort, trt = make_policy("bc-state", checkpoint=trained[0], backend="ort"), make_policy("bc-state", checkpoint=trained[0], backend="trt")
    np.testing.assert_allclose(trt.query(obs), ort.query(obs), rtol=1e-4, atol=1e-5)
    batch_trt, _, _ = query_members([trt.spawn() for _ in range(5)], [obs] * 5)  # the dynamic batch profile
    batch_ort, _, _ = query_members([ort.spawn() for _ in range(5)], [obs] * 5)
    np.testing.assert_allclose(batch_trt, batch_ort, rtol=1e-4, atol=1e-5)


def test_tilt_and_yaw_error_features():
    from env import geometry
    from eval.policies.scripted import _top_down
    from scipy.spatial.transform import Rotation

    v = state_vector(_state(block_yaw=0.3))
    np.testing.assert_allclose(v[29:31], 0.0, atol=1e-6)  # pointing straight down
    assert v[31] == pytest.approx(geometry.yaw_error("square", 0.3, 0.0), abs=1e-6)
    s = _state()
    tilted = Rotation.from_rotvec([0.05, 0.0, 0.0]) * _top_down(0.2)
    q = tilted.as_quat()
    s["tcp_q"] = np.array([q[3], q[0], q[1], q[2]])
    # the feature is the rotation that undoes the tilt
    np.testing.assert_allclose(state_vector(s)[29:31], [-0.05, 0.0], atol=1e-5)


def _demo_file(path, relabeled, version=None, successes=(True, False)):
    import h5py

    from eval.training.state_features import VERSION

    n = 5
    episodes = np.array([(b"A01", i, i, ok, i * n, n) for i, ok in enumerate(successes)],
                        dtype=[("setup", "S4"), ("try", "i4"), ("seed", "i8"), ("success", "?"),
                               ("start", "i8"), ("length", "i4")])
    with h5py.File(path, "w") as f:
        f.create_dataset("states", data=np.zeros((n * len(successes), STATE_DIM), np.float32))
        f.create_dataset("actions", data=np.zeros((n * len(successes), 7), np.float32))
        f.create_dataset("episodes", data=episodes)
        f.attrs["relabeled"] = int(relabeled)
        f.attrs["state"] = version or VERSION
    return path


def test_demo_files_keep_successes_or_every_relabeled_step(tmp_path):
    from eval.training.train_bc import DemoFileError, load_demos

    assert len(load_demos(_demo_file(tmp_path / "clean.h5", relabeled=False))[0]) == 5
    assert len(load_demos(_demo_file(tmp_path / "dagger.h5", relabeled=True))[0]) == 10
    with pytest.raises(DemoFileError, match="record them again"):
        load_demos(_demo_file(tmp_path / "old.h5", relabeled=False, version="eval.training.state_features v1 (29 numbers)"))


def test_recorder_labels_with_the_reference_while_the_learner_acts(trained):
    from eval.training.demos import _record_setup

    (_, recs), = [_record_setup(("A01", [0], 0.02, str(trained[0]), 0.5))]
    t, seed, success, states, actions, executed = recs[0]
    assert t == 0 and states.shape[1] == STATE_DIM and len(states) == len(actions) <= 300
    assert np.all(np.abs(actions) <= 1.0) and np.all(np.isfinite(states)) and executed.shape == actions.shape
    # the input carries the history of what was executed, not of the labels
    np.testing.assert_array_equal(states[1:, SCENE_DIM:SCENE_DIM + 7], executed[:-1])


def test_action_history_counts_how_long_the_gripper_command_is_held():
    h = ActionHistory()
    x = policy_input(_state(), h)
    assert x.shape == (STATE_DIM,) and x[SCENE_DIM + 6] == 1.0 and x[-1] == 0.0  # start: still, gripper open
    close = np.array([0, 0, 0.1, 0, 0, 0, -1], np.float32)
    for n in range(1, 4):
        h.update(close)
        assert h.hold == n
    np.testing.assert_array_equal(policy_input(_state(), h)[SCENE_DIM:SCENE_DIM + 7], close)
    h.update(np.array([0, 0, 0, 0, 0, 0, 1], np.float32))  # the command changes sign: counting starts again
    assert h.hold == 1
    for _ in range(30):
        h.update(np.array([0, 0, 0, 0, 0, 0, 1], np.float32))
    assert h.vector()[-1] == 1.0  # capped


def test_labeler_mode_reference_inserts_and_labels_from_the_scene():
    """The reference in labeler mode (eval.training.demos) succeeds alone on a tight hole, and its label depends on
    the scene and the last executed command, not on its own past: a fresh labeler told the same last command
    gives the same action at every step of an insertion."""
    from env import make_env
    from env.setups import get_setup
    from env.tasklist import load
    from eval.policies.scripted import ScriptedPolicy
    from eval.rollout import observation_for

    setup = get_setup("A03")  # 1 mm clearance
    tl = load("train")
    env = make_env("A03", obs_mode="state")
    try:
        obs, _ = env.reset(seed=tl.seed("A03", 0), options={"start": tl.start("A03", 0), "reconfigure": True})
        labeler = ScriptedPolicy(clearance=setup.clearance_m, labeler=True)
        labeler.reset("")
        compared = 0
        for _ in range(setup.max_steps):
            o = observation_for(labeler, env, obs)
            fresh = ScriptedPolicy(clearance=setup.clearance_m, labeler=True)
            fresh.reset("")
            fresh.executed_gripper, fresh.executed_hold, fresh.executed_dz = (
                labeler.executed_gripper, labeler.executed_hold, labeler.executed_dz)
            action = labeler.act(o)
            if labeler.phase in ("insert", "open", "retreat", "close", "descend"):
                np.testing.assert_allclose(fresh.act(o), action, atol=1e-6)
                compared += 1
            labeler.observe_executed(action)
            obs, _, term, trunc, info = env.step(action)
            if bool(info["success"][0]) or bool(term[0]) or bool(trunc[0]):
                break
        assert bool(info["success"][0]) and compared > 30
    finally:
        env.close()


def test_committed_results_name_the_shipped_weights():
    """The published test-split result is of the weights that ship: retraining them means rerunning it."""
    import json
    from pathlib import Path

    from eval.policies.bc_state import weights_sha256

    results = Path(__file__).resolve().parent.parent / "results"
    run = json.loads((results / "bc_state_test" / "run.json").read_text())
    assert run["weights_sha256"] == weights_sha256()
    dagger = bc_mlp.DEFAULT_WEIGHTS.with_name("bc_state_dagger.safetensors")
    assert json.loads((results / "bc_state_dagger" / "test" / "run.json").read_text())["weights_sha256"] == \
        weights_sha256(dagger)
