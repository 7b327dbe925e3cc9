"""bc-camera (engines.bc_camera, eval.training.train_bc_camera, eval.policies.bc_camera): the graph averages the
rendered frames down as the training cache does, its ONNX export runs as the torch network does, and training
the estimator on a recording of python -m eval.record (tests/conftest.py's recorded_demos) gives weights, with
bc-state's network copied in as the head, that eval.run runs;
a killed training resumes to the weights of an uninterrupted one; datasets of another task list or split and a
work folder of another recipe are refused in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO_ROOT
from tests.tolerances import reblocking_bound

torch = pytest.importorskip("torch")

from engines import bc_camera, bc_mlp  # noqa: E402


def bc_state_sha256() -> str:
    from engines.onnx_utils import sha256_file

    return sha256_file(bc_mlp.DEFAULT_WEIGHTS)


def test_the_graph_averages_frames_as_the_training_cache_does():
    """A rendered frame averaged inside the network equals the cache's uint8 average to its rounding (half a
    level of 255)."""
    rng = np.random.default_rng(0)
    cfg = bc_camera.BCCameraNetConfig()
    for name, side in cfg.cameras:
        frames = rng.integers(0, 256, (3, side, side, 3), dtype=np.uint8)
        f = cfg.pool(name)
        inside = torch.nn.functional.avg_pool2d(torch.as_tensor(frames).permute(0, 3, 1, 2).float(), f).numpy()
        cached = bc_camera.pool_frames(frames, f)
        assert cached.shape == (3, 3, cfg.image_side(name), cfg.image_side(name))
        assert np.max(np.abs(inside - cached)) <= 0.5 + 1e-4, name


@pytest.mark.parametrize("grid_channels, far_block_first_frame, brightness_floor",
                         [(16, False, ()), (0, False, ()), (16, True, ()), (16, True, (0.48, 0.43))],
                         ids=["grid", "keypoints-only", "far-block-first-frame", "brightness-floor"])
def test_onnx_export_runs_as_the_network_at_every_batch(tmp_path, grid_channels, far_block_first_frame,
                                                         brightness_floor):
    pytest.importorskip("onnxruntime")
    from dataclasses import replace

    from engines.runners import OnnxRuntimeRunner

    cfg = replace(bc_camera.BCCameraNetConfig(), grid_channels=grid_channels,
                  far_block_first_frame=far_block_first_frame, brightness_floor=brightness_floor)
    torch.manual_seed(1)
    model = bc_camera.build(cfg).eval()
    path = bc_camera.export_onnx(model, cfg, tmp_path / "bc_camera.onnx")
    runner = OnnxRuntimeRunner(path, "cpu", intra_op_threads=1).activate()
    feeds = bc_camera.dummy_inputs(cfg, batch=4, seed=2)
    if brightness_floor:  # rows 0 and 2 dimmed below every floor: the graph scales them up
        for name in cfg.input_names[:2] + cfg.input_names[3:]:
            feeds[name][0::2] = (feeds[name][0::2] * 0.3).astype(np.uint8)
    assert cfg.input_names == bc_camera.INPUT_NAMES + (("wrist_first",) if far_block_first_frame else ())
    assert sorted(feeds) == sorted(cfg.input_names)
    feeds["low_dim"] = np.random.default_rng(3).normal(size=feeds["low_dim"].shape).astype(np.float32)
    ref = bc_camera.numpy_forward(model, feeds)
    assert ref.shape == (4, cfg.chunk, cfg.action_dim)
    got = runner.infer(feeds)["actions"]
    # the same rows at other batch sizes give the spread another kernel blocking causes here
    others = [np.concatenate([runner.infer({k: v[i:i + b] for k, v in feeds.items()})["actions"]
                              for i in range(0, 4, b)]) for b in (1, 2)]
    assert np.max(np.abs(got - ref)) <= reblocking_bound(ref, others + [got], factor=8.0)


def test_the_kinematic_chain_is_maniskills_panda_urdf():
    """engines.panda_kinematics' joint origins are panda_v2.urdf's, read from the file mani-skill installed."""
    import xml.etree.ElementTree as ET
    from importlib.resources import files

    from engines import panda_kinematics as K

    urdf = files("mani_skill") / "assets" / "robots" / "panda" / "panda_v2.urdf"
    joints = {j.get("name"): j for j in ET.fromstring(urdf.read_text()).iter("joint")}
    ours = (*K.ARM_JOINT_ORIGINS, *K.TCP_FIXED)
    for name, (xyz, rpy) in zip(K.URDF_JOINTS, ours, strict=True):
        origin = joints[name].find("origin")
        assert np.allclose([float(v) for v in origin.get("xyz").split()], xyz, atol=1e-12), name
        assert np.allclose([float(v) for v in origin.get("rpy").split()], rpy, atol=1e-12), name
        axis = joints[name].find("axis")
        assert joints[name].get("type") == ("revolute" if axis is not None else "fixed"), name
        assert axis is None or axis.get("xyz").split() == ["0", "0", "1"], name


@pytest.mark.sim
def test_the_estimates_gripper_features_are_the_recorded_truth(recorded_demos):
    """The gripper's scene features in an estimate (forward kinematics of the recorded joints) are the recording's
    observation.environment_state to float32 rounding, whatever the untrained estimator says of the rest; the
    relations (block to gripper, hole to block) are those of the estimate's own block, hole and gripper."""
    import pyarrow.parquet as pq

    demos, _ = recorded_demos
    table = pq.read_table(demos / "data" / "chunk-000" / "file-000.parquet").to_pydict()
    state = torch.tensor(table["observation.state"], dtype=torch.float32)
    truth = np.asarray(table["observation.environment_state"], np.float32)
    cfg = bc_camera.BCCameraNetConfig()
    model = bc_camera.build(cfg).eval()
    low = torch.zeros(len(state), cfg.low_dim)
    low[:, :cfg.proprio_dim] = state
    images = {name: torch.rand(len(state), 3, cfg.image_side(name), cfg.image_side(name)) for name, _ in cfg.cameras}
    with torch.no_grad():
        est = model.estimate(images, low).numpy()
    g = list(bc_camera.GRIPPER_FEATURES)
    # float32 rounding through 10 chained transforms of terms up to 1 m: a few ulp of 1 per transform
    assert np.max(np.abs(est[:, g] - truth[:, g])) <= 10 * 4 * np.finfo(np.float32).eps
    assert np.allclose(est[:, 16:19], est[:, 6:9] - est[:, 0:3], atol=1e-6)
    assert np.allclose(est[:, 19:21], est[:, 13:15] - est[:, 6:8], atol=1e-6)


def _untrained(n: int, **fields):
    """(config (the default's, with ``fields``), an untrained bc-camera network in eval mode, n random frames a
    camera, n random low_dim rows), seeded."""
    from dataclasses import replace

    torch.manual_seed(0)
    cfg = replace(bc_camera.BCCameraNetConfig(), **fields)
    model = bc_camera.build(cfg).eval()
    images = {name: torch.rand(n, 3, cfg.image_side(name), cfg.image_side(name)) for name, _ in cfg.cameras}
    return cfg, model, images, torch.rand(n, cfg.low_dim)


def test_the_knob_angle_is_read_from_the_wrist_camera_alone():
    """grip_knob (the knob's angle to the fingers) depends on the wrist frames only: other joints, another
    instruction or another third-person frame leave it as it is (version 4, given the arm's pose, put the block
    aligned with the fingers wherever they hovered); the wrist frames move it."""
    n = 4
    cfg, model, images, low = _untrained(n)
    other_low = torch.rand(n, cfg.low_dim)
    with torch.no_grad():
        est = model.estimate(images, low)
        moved = model.estimate({**images, "third_person": torch.rand_like(images["third_person"])}, other_low)
        wrist = model.estimate({**images, "wrist": torch.rand_like(images["wrist"])}, low)
    knob = list(bc_camera.KNOB)
    assert torch.equal(est[:, knob], moved[:, knob])
    assert not torch.allclose(est[:, knob], wrist[:, knob])
    assert not torch.allclose(est[:, list(bc_camera.FREE_FEATURES)], moved[:, list(bc_camera.FREE_FEATURES)])


def _train(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eval.training.train_bc_camera", "--quiet", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def trained(recorded_demos, tmp_path_factory):
    demos, _ = recorded_demos
    root = tmp_path_factory.mktemp("bc_camera")
    args = ["--datasets", str(demos), "--work", str(root / "work"), "--out", str(root / "w.safetensors"),
            "--report-dir", str(root / "report"), "--epochs", "2", "--batch", "64"]
    return root, args, _train(*args)


@pytest.mark.sim
def test_training_on_a_recording_writes_weights_eval_run_runs(trained, tmp_path):
    root, _, proc = trained
    assert proc.returncode == 0, proc.stderr[-3000:]
    model, cfg, meta = bc_camera.load(root / "w.safetensors")
    # the head is bc-state's network, copied in unchanged
    head, _, _ = bc_mlp.load(bc_mlp.DEFAULT_WEIGHTS)
    for name, t in head.state_dict().items():
        assert torch.equal(model.policy.state_dict()[name], t), name
    report = json.loads((root / "report" / "training.json").read_text())
    assert report["episodes_used"] == 2 and len(report["history"]) == 2
    assert report["labels"] == "observation.environment_state (every episode)"
    assert report["policy_head"]["sha256"] == bc_state_sha256()
    assert 0 < report["parameters_trained"] < report["parameters"]
    errors = report["final"]["validation"]["errors"]
    assert set(errors) == {"start", "before_grasp", "grasped"} and errors["start"]["steps"] >= 1
    assert {"block_mm", "block_minus_tcp_mm", "hole_minus_block_mm", "yaw_err_deg"} <= set(errors["before_grasp"])
    assert 0 < report["weights_bytes"] <= 5_000_000 and report["flops_per_query"] > 1e6
    assert report["peak_rss_mib"] > 0 and report["toppled_steps_left_out"] == 0
    assert report["locator"] is None and "locator_from" not in report  # none by default
    assert report["steps"] == report["train_steps"] + report["validation_steps"] + report["toppled_steps_left_out"]
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "eval.run", "--model", "bc-camera", "--checkpoint",
                          str(root / "w.safetensors"), "--split", "dev", "--setups", "A01", "--tries", "1",
                          "--max-steps", "5", "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rec = json.loads((out / "tries.jsonl").read_text().splitlines()[0])
    assert rec["model"] == "bc-camera" and rec["track"] == "adapted" and rec["backend"] == "ort"
    assert rec["steps"] == 5 and rec["infer_queries"] == 5 and rec["step_ms"]["render"] > 0


@pytest.mark.sim
def test_the_same_command_again_resumes_and_another_recipe_is_refused(trained):
    root, args, first = trained
    assert first.returncode == 0, first.stderr[-3000:]
    again = _train(*args)
    assert again.returncode == 0 and "resuming" in again.stdout and "after epoch 2 of 2" in again.stdout, again.stdout
    other = _train(*[a if a != "2" else "3" for a in args])
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert other.stderr.strip().splitlines() == [
        f"error: {root / 'work'} holds a training of another recipe; use --fresh to start this one there, or "
        f"another --work"]


@pytest.mark.sim
def test_a_killed_training_resumes_to_the_uninterrupted_weights(recorded_demos, tmp_path):
    """Interrupted after its first epoch's checkpoint, the run continues from it and ends with the weights an
    uninterrupted run ends with (the same process, shuffles and augmentation drawn per epoch)."""
    from eval.training import train_bc_camera as tbc

    demos, _ = recorded_demos
    recipe = tbc.Recipe(epochs=2, batch=64)
    data = tbc.read_demos([demos], recipe.config, tmp_path / "frames", show=False)
    head = bc_mlp.DEFAULT_WEIGHTS
    whole, _, _ = tbc.train(data, recipe, tmp_path / "whole", head, show=False, log=lambda line: None)

    def stop_after_first(line: str) -> None:
        if line.startswith("epoch 1/2"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tbc.train(data, recipe, tmp_path / "cut", head, show=False, log=stop_after_first)
    lines: list[str] = []
    resumed, history, _ = tbc.train(data, recipe, tmp_path / "cut", head, show=False, log=lines.append)
    assert lines[0].startswith(f"resuming {tmp_path / 'cut'} after epoch 1 of 2") and len(history) == 2
    for name, t in whole.state_dict().items():
        assert torch.equal(t, resumed.state_dict()[name]), name


@pytest.mark.sim
def test_a_dataset_of_another_task_list_or_split_is_refused(recorded_demos, tmp_path):
    demos, _ = recorded_demos
    for field, value, needle in (("tasklist_sha256", "0" * 64, "was recorded on another task list"),
                                 ("split", "test", "records the 'test' split"),
                                 ("environment_state", None, "has no observation.environment_state of")):
        copy = tmp_path / field
        shutil.copytree(demos / "meta", copy / "meta")
        rec = json.loads((copy / "meta" / "recording.json").read_text())
        rec[field] = value
        (copy / "meta" / "recording.json").write_text(json.dumps(rec))
        proc = _train("--datasets", str(copy), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "w"))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"error: {copy} ") and needle in line, line
    missing = _train("--datasets", str(tmp_path / "nothing"), "--work", str(tmp_path / "work"))
    assert missing.returncode == 2 and missing.stderr.startswith(f"error: {tmp_path / 'nothing'} is not a folder")
    for flag, value in (("--before-grasp-weight", "0"), ("--epochs", "-1"), ("--fine-weight", "-1"),
                        ("--grid-channels", "300")):
        bad = _train("--datasets", str(demos), "--work", str(tmp_path / "work"), flag, value)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
        (line,) = bad.stderr.strip().splitlines()
        assert line.startswith("error: --epochs must be at least 1 (0 with --init-from), --batch at least 1"), line
        assert flag in line, line
    no_head = _train("--datasets", str(demos), "--work", str(tmp_path / "work"), "--policy", str(tmp_path / "none"))
    assert no_head.returncode == 2 and no_head.stderr.strip().splitlines() == [
        f"error: --policy {tmp_path / 'none'} does not exist; give bc-state weights (python -m eval.training.train_bc "
        f"makes them)"]


def test_the_knob_probes_crop_is_the_frames_pixels_unturned():
    from eval.training.knob_probe import view

    x = torch.rand(2, 3, 128, 128)
    crop = view(x, torch.zeros(2), 40, 76, pooled=False)
    assert torch.allclose(crop, x[:, :, 56:96, 44:84], atol=1e-6)
    # a quarter turn: the centre square turned counter-clockwise on screen (rows towards columns), the direction
    # the label's sign (the knob turns against the frame) is derived for
    turned = view(x, torch.full((2,), np.pi / 2), 40, 64, pooled=False)
    assert torch.allclose(turned, torch.rot90(x[:, :, 44:84, 44:84], 1, dims=(2, 3)), atol=1e-5)


@pytest.mark.sim
def test_the_knob_probe_trains_on_a_recording_and_reports_the_hover(recorded_demos, tmp_path):
    demos, _ = recorded_demos
    out = tmp_path / "probe.json"
    proc = subprocess.run([sys.executable, "-m", "eval.training.knob_probe", "--datasets", str(demos), "--held-out",
                           str(demos), "--view", "crop", "--crop-side", "40", "--crop-row", "76", "--rotate",
                           "--epochs", "1", "--batch", "16", "--cache", str(tmp_path / "frames"), "--quiet",
                           "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    hover = report["history"][0]["held_out_hover"]
    assert hover["steps"] > 0 and 0 <= hover["median_deg"] <= 45
    assert report["side"] == 40 and report["rotate"] is True
    bad = subprocess.run([sys.executable, "-m", "eval.training.knob_probe", "--datasets", str(demos), "--held-out",
                          str(demos), "--view", "pooled", "--rotate"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "--view crop --target knob" in bad.stderr


def test_the_block_and_hole_are_read_from_the_frames_and_instruction_not_the_arm():
    """Version 6: the estimator's block and hole depend on the frames and the instruction only; other joint
    positions move the gripper's features and the relations, not the block's height, yaw or hole (versions 4 and
    5, given the gripper's pose, put the block under the gripper wherever it was)."""
    n = 4
    cfg, model, images, low = _untrained(n)
    other = low.clone()
    other[:, :cfg.proprio_dim] = torch.rand(n, cfg.proprio_dim)
    with torch.no_grad():
        est, moved = model.estimate(images, low), model.estimate(images, other)
    # the block's position across near the gripper is the gripper's plus the wrist head's offset (version 7), and
    # a held block is where the gripper is and the hole near it is the block's plus a wrist offset (version 8),
    # and a held block's yaw to the hole is composed with the closing angle (version 10)
    free = [i for i in bc_camera.FREE_FEATURES if i not in (6, 7, 8, 9, 10, 13, 14, bc_camera.YAW_ERR)]
    gripper = list(bc_camera.GRIPPER_FEATURES)
    assert torch.equal(est[:, free], moved[:, free])
    assert not torch.allclose(est[:, gripper], moved[:, gripper])
    assert not torch.allclose(est[:, 16:19], moved[:, 16:19])


def test_dataset_weights_are_one_positive_number_a_folder(tmp_path):
    for weights in (["1"], ["1", "0"]):
        proc = _train("--datasets", str(tmp_path / "a"), str(tmp_path / "b"), "--dataset-weights", *weights,
                      "--work", str(tmp_path / "work"))
        assert proc.returncode == 2 and "--dataset-weights takes one number > 0 for each of the 2" in proc.stderr, \
            proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.sim
def test_the_diagnosis_reports_each_phase_of_a_recording(trained, recorded_demos, tmp_path):
    root, _, proc = trained
    assert proc.returncode == 0, proc.stderr[-3000:]
    demos, _ = recorded_demos
    out = tmp_path / "diagnosis.json"
    run = subprocess.run([sys.executable, "-m", "eval.training.diagnose_bc_camera", "--weights",
                          str(root / "w.safetensors"), "--datasets", str(demos), "--cache", str(tmp_path / "frames"),
                          "--quiet", "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["steps"] == sum(p["steps"] for p in report["phases"].values())
    # the stages come from the true scene: both scripted tries (A01, F01) grasp their block
    st = report["stages"]
    assert st["tries"] == len((demos / "recording" / "tries.jsonl").read_text().splitlines()) == 2
    assert st["grasped"] == 2 and st["grasped"] >= st["over_the_hole"] >= st["down_at_the_hole"] >= 0
    assert "grasped" in report["phases"] and "block_across" in report["phases"]["grasped"]["action_error_with_true"]
    assert {"follows_gripper_x", "follows_gripper_y"} <= set(report["phases"]["grasped"]["block_across_mm"])
    # both carry their block over its hole: there, the action's error per dimension and with each group made true
    over = report["phases"]["grasped"]["over_the_hole"]
    assert 1 <= over["steps"] < report["phases"]["grasped"]["steps"]
    assert list(over["action_error_per_dimension"]) == ["dx", "dy", "dz", "droll", "dpitch", "dyaw", "gripper"]
    assert set(over["action_error_with_true"]) == set(report["phases"]["far"]["action_error_with_true"])
    assert len(report["weights_sha256"]) == 64 and report["policy_sha256"] == bc_state_sha256()
    # each try's first step, binned by the estimated block's error, with the recording's successes
    tries = [json.loads(line) for line in (demos / "recording" / "tries.jsonl").read_text().splitlines()]
    bins = report["first_step"]["by_error"]
    assert list(bins) == ["within_25_mm", "25_to_50_mm", "over_50_mm"] and report["first_step"]["tries"] == 2
    assert sum(b["tries"] for b in bins.values()) == 2
    assert sum(b["inserted"] for b in bins.values()) == sum(bool(t["success"]) for t in tries)
    missing = subprocess.run([sys.executable, "-m", "eval.training.diagnose_bc_camera", "--weights",
                              str(tmp_path / "none.safetensors"), "--datasets", str(demos)], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=600)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr


def test_the_first_steps_bins_count_tries_and_insertions_by_the_blocks_error():
    from eval.training.diagnose_bc_camera import first_step

    true = np.zeros((8, 32), np.float32)
    est = true.copy()
    starts = np.array([0, 2, 4, 6])
    est[starts, 6] = [0.010, 0.030, 0.060, 0.025]  # 10, 30, 60 and 25 mm off along x
    report = first_step(est, true, starts, np.array([1.0, 0.0, 0.0, 1.0]))
    assert report["by_error"] == {"within_25_mm": {"tries": 2, "inserted": 2},
                                  "25_to_50_mm": {"tries": 1, "inserted": 0}, "over_50_mm": {"tries": 1, "inserted": 0}}
    assert report["block_error_mm"]["median"] == 27.5
    unknown = first_step(est, true, starts, np.array([1.0, np.nan, 0.0, 1.0]))["by_error"]
    assert unknown["25_to_50_mm"]["inserted"] is None and unknown["within_25_mm"]["inserted"] == 2


def _say_the_mean(model) -> None:
    """The estimator and the locator say their normalisation's mean (scene_mean), whatever the frames."""
    for head in (model.estimator, *([model.locator] if hasattr(model, "locator") else [])):
        head[-1].weight.zero_()
        head[-1].bias.zero_()


def test_near_the_gripper_the_blocks_position_across_is_the_gripper_plus_the_wrist_offset():
    """Version 7: where the estimator puts the block within OFFSET_NEAR across of the gripper, its x, y are the
    gripper's plus the wrist head's offset; far from it, the estimator's own."""
    cfg, model, images, low = _untrained(1)
    with torch.no_grad():
        _say_the_mean(model)  # the block at scene_mean
        model.scene_mean[bc_camera.GRASPED] = -10.0  # not held
        tcp = model.estimate(images, low)[0, 0:2]
        for place, near in ((tcp, True), (tcp + torch.tensor([0.0, 0.2]), False)):
            model.scene_mean[6:8] = place
            est, offset = model.estimate(images, low, with_offset=True)
            expected = tcp + offset[0, 0:2] if near else place
            assert torch.allclose(est[0, 6:8], expected, atol=1e-5), (near, est[0, 6:8], expected)
            assert torch.allclose(est[0, 16:18], est[0, 6:8] - tcp, atol=1e-6)


def test_a_held_block_is_where_the_gripper_holds_it():
    """Version 8: where the estimator says the block is held, its centre is the tcp's x, y plus the wrist head's
    offset, and the knob's top below the tcp less the head's grasp depth; not held, the estimator's own place (a
    frames-only estimate left a lifted block near the table)."""
    cfg, model, images, low = _untrained(1)
    with torch.no_grad():
        _say_the_mean(model)
        tcp_xy = model.estimate(images, low)[0, 0:2]
        # far from the gripper, on the table
        model.scene_mean[6:9] = torch.cat([tcp_xy + torch.tensor([0.0, 0.2]), torch.tensor([0.02])])
        for grasped, held in ((10.0, True), (-10.0, False)):
            model.scene_mean[bc_camera.GRASPED] = grasped
            est, offset = model.estimate(images, low, with_offset=True)
            tcp = est[0, 0:3]
            in_hand = torch.cat([tcp[0:2] + offset[0, 0:2],
                                 tcp[2:3] - bc_camera.KNOB_TOP_ABOVE_CENTRE + offset[0, 2:3]])
            expected = in_hand if held else model.scene_mean[6:9]
            assert torch.allclose(est[0, 6:9], expected, atol=1e-5), (held, est[0, 6:9], expected)
            assert torch.allclose(est[0, 16:19], est[0, 6:9] - tcp, atol=1e-6)


def test_near_a_held_block_the_holes_position_across_is_the_blocks_plus_the_wrist_offset():
    """Version 8: held, and where the estimator puts the hole within OFFSET_NEAR across of the block, the hole's
    x, y are the block's plus the second wrist head's offset (read by the wrist camera over the board); farther,
    or not held, the estimator's own."""
    cfg, model, images, low = _untrained(1)
    with torch.no_grad():
        _say_the_mean(model)
        model.scene_mean[bc_camera.GRASPED] = 10.0
        block = model.estimate(images, low)[0, 6:8]  # held: where the gripper is
        for grasped, place, near in ((10.0, block, True), (10.0, block + torch.tensor([0.2, 0.0]), False),
                                     (-10.0, block, False)):
            model.scene_mean[bc_camera.GRASPED] = grasped
            model.scene_mean[13:15] = place
            est, heads = model.estimate(images, low, with_offset=True)
            expected = est[0, 6:8] + heads[0, 3:5] if near else place
            assert torch.allclose(est[0, 13:15], expected, atol=1e-5), (grasped, near, est[0, 13:15], expected)
            assert torch.allclose(est[0, 19:21], est[0, 13:15] - est[0, 6:8], atol=1e-6)


def test_the_wrist_heads_offsets_across_turn_with_the_hand():
    """Version 9: the wrist camera turns with the hand, so its heads read offsets across along the hand's axes, and
    the forward kinematics turns them into the world's. The same frames with the hand turned about its (vertical)
    axis give the same offsets turned by as much, the grasp depth unchanged; version 8 read them in the world's
    axes, which the frames alone do not show (its hover offset was uncorrelated with the truth on its own tries)."""
    from env.arms import get_arm

    cfg, model, images, low = _untrained(1)
    rest = torch.tensor(get_arm("panda").rest_qpos, dtype=torch.float32)
    low[0, :cfg.proprio_dim] = rest
    turned = low.clone()
    turned[0, 6] += 0.5  # the last arm joint turns the hand about its axis, pointing down at rest
    with torch.no_grad():
        heads = [model.estimate(images, x, with_offset=True)[1][0] for x in (low, turned)]
        _, rot = model.gripper.tcp_pose(torch.stack([low[0, :7], turned[0, :7]]))
    assert torch.allclose(rot[:, 2, 2], torch.tensor(-1.0), atol=1e-6)  # pointing straight down: a turn about z
    turn = torch.atan2(rot[1, 1, 0], rot[1, 0, 0]) - torch.atan2(rot[0, 1, 0], rot[0, 0, 0])
    assert abs(abs(float(turn)) - 0.5) < 1e-5
    c, s = torch.cos(turn), torch.sin(torch.as_tensor(turn))
    for a, b in ((0, 2), (3, 5)):  # the block's offset from the gripper, the hole's from the block
        x, y = heads[0][a:b]
        assert torch.allclose(heads[1][a:b], torch.stack([c * x - s * y, s * x + c * y]), atol=1e-6)
    assert torch.equal(heads[0][2], heads[1][2])


@pytest.mark.parametrize("shape,n", [("square", 4), ("triangle", 3), ("circle", 1)])
def test_a_held_blocks_yaw_to_the_hole_is_composed_from_the_board_the_fingers_and_its_turn_in_them(shape, n):
    """Version 10: held, n x (hole yaw - block yaw) = n x the board's yaw (the estimator's) - n x the closing angle
    (forward kinematics) + the block's turn in the fingers (the knob head's for the square, the triangle head's);
    the circle's (1, 0) and 0. Not held, the estimator's own (version 8's was 31 degrees off for a held square on
    its own tries)."""
    from env.arms import get_arm
    from env.instructions import SHAPES

    cfg, model, images, low = _untrained(1)
    low[0, :7] = torch.tensor(get_arm("panda").rest_qpos[:7], dtype=torch.float32)
    board, knob, tri = 0.3, 0.7, -1.1
    with torch.no_grad():
        for head in (model.estimator, model.knob, model.triangle_turn):
            head[-1].weight.zero_()
            head[-1].bias.zero_()
        model.triangle_turn[-1].bias.copy_(torch.tensor([np.cos(tri), np.sin(tri)], dtype=torch.float32))
        model.scene_mean[list(bc_camera.SHAPE_ONE_HOT)] = torch.eye(3)[SHAPES.index(shape)]
        model.scene_mean[bc_camera.HOLE_YAW] = torch.tensor([np.cos(board), np.sin(board)], dtype=torch.float32)
        model.scene_mean[bc_camera.KNOB] = torch.tensor([np.cos(knob), np.sin(knob)], dtype=torch.float32)
        model.scene_mean[bc_camera.BLOCK_HOLE_YAW + [bc_camera.YAW_ERR]] = torch.tensor([0.5, 0.5, 0.2])
        _, rot = model.gripper.tcp_pose(low[:, :7])
        closing = float(torch.atan2(rot[0, 1, 1], rot[0, 0, 1]))
        turn = {"square": knob, "triangle": tri, "circle": 0.0}[shape]
        yaw = n * board - n * closing + turn if n > 1 else 0.0
        wrapped = (yaw + np.pi) % (2 * np.pi) - np.pi
        for grasped, held in ((10.0, True), (-10.0, False)):
            model.scene_mean[bc_camera.GRASPED] = grasped
            est = model.estimate(images, low)[0]
            expected = [np.cos(yaw), np.sin(yaw), wrapped / n] if held else [0.5, 0.5, 0.2]
            got = est[bc_camera.BLOCK_HOLE_YAW + [bc_camera.YAW_ERR]]
            assert torch.allclose(got, torch.tensor(expected, dtype=torch.float32), atol=1e-5), (held, got, expected)


def test_the_triangle_heads_target_is_its_turn_in_the_fingers():
    """triangle_turn_truth: from the TCP's rotation and the true scene features (the board's yaw, the block's yaw
    to the hole as 3 x their difference) -> cos, sin of 3 x (closing angle - block yaw)."""
    closing, block, hole = 0.4, -0.9, 1.3
    rot = torch.zeros(1, 3, 3)
    rot[0, 0, 1], rot[0, 1, 1] = float(np.cos(closing)), float(np.sin(closing))  # the TCP's y axis: closing
    scene = torch.zeros(1, 32)
    scene[0, bc_camera.HOLE_YAW] = torch.tensor([np.cos(hole), np.sin(hole)], dtype=torch.float32)
    scene[0, bc_camera.BLOCK_HOLE_YAW] = torch.tensor([np.cos(3 * (hole - block)), np.sin(3 * (hole - block))],
                                                      dtype=torch.float32)
    got = bc_camera.triangle_turn_truth(rot, scene)[0]
    want = torch.tensor([np.cos(3 * (closing - block)), np.sin(3 * (closing - block))], dtype=torch.float32)
    assert torch.allclose(got, want, atol=1e-5), (got, want)


def test_committed_results_name_the_shipped_weights():
    """results/bc_camera_test is of the weights that ship: retraining them means rerunning it."""
    from engines.onnx_utils import sha256_file

    run = json.loads((REPO_ROOT / "results" / "bc_camera_test" / "run.json").read_text())
    assert run["model"] == "bc-camera" and run["split"] == "test"
    assert run["weights_sha256"] == sha256_file(bc_camera.DEFAULT_WEIGHTS)


def test_weights_written_before_first_frame_cameras_read_every_steps_frames():
    """Version 11 reads the third person as it was at the try's first step; a weights file without the field (the
    shipped v12, version 10) keeps reading every step's frames, and a camera the network lacks is refused."""
    from dataclasses import asdict

    cfg = bc_camera.BCCameraNetConfig()
    assert cfg.first_frame_cameras == ("third_person",)
    d = asdict(cfg)
    assert bc_camera.config_from_json(json.dumps(d)) == cfg
    del d["first_frame_cameras"], d["locator_hidden"]  # a file of version 10 has neither
    assert bc_camera.config_from_json(json.dumps(d)).first_frame_cameras == ()
    with pytest.raises(ValueError, match="first_frame_cameras names top, not one of the network's cameras"):
        bc_camera.BCCameraNetConfig(first_frame_cameras=("top",))


class _Feeds:
    """A runner that keeps what it is fed."""
    name = "fake"

    def __init__(self):
        self.fed = []

    def infer(self, feeds):
        self.fed.append({k: np.array(v) for k, v in feeds.items()})
        return {"actions": np.zeros((1, 1, 7), np.float32)}


@pytest.mark.parametrize("first_frame_cameras, far_block_first_frame",
                         [(("third_person",), False), ((), False), (("third_person",), True)],
                         ids=["version-11", "version-10", "version-13"])
def test_the_policy_feeds_the_tries_first_third_person_frame(first_frame_cameras, far_block_first_frame):
    """The third person goes to the runner as the try's first step rendered it (copied: the renderer reuses its
    buffer), the wrist as each step renders it, and (version 13) the wrist's first frame beside it as
    ``wrist_first``; a reset or a spawned policy starts from its own first frame."""
    from eval.policies.bc_camera import BCCameraPolicy

    cfg = bc_camera.BCCameraNetConfig(first_frame_cameras=first_frame_cameras,
                                      far_block_first_frame=far_block_first_frame)
    runner = _Feeds()
    policy = BCCameraPolicy(runner, cfg, bc_camera.DEFAULT_WEIGHTS)
    buffer = {"third_person": np.zeros((256, 256, 3), np.uint8), "wrist": np.zeros((128, 128, 3), np.uint8)}
    obs = {"images": buffer, "proprio": np.zeros(cfg.proprio_dim, np.float32)}

    def step(value: int) -> dict:
        for frame in buffer.values():
            frame[...] = value  # the renderer writes the next step into the same buffer
        policy.act(obs)
        return {k: int(v.ravel()[0]) for k, v in runner.fed[-1].items() if k != "low_dim"}

    kept = first_frame_cameras == ("third_person",)

    def fed(third_person, wrist, first):
        return {"third_person": third_person, "wrist": wrist, **({"wrist_first": first} if far_block_first_frame
                                                                  else {})}
    policy.reset(bc_camera.all_instructions()[0])
    assert step(1) == fed(1, 1, 1)
    assert step(2) == fed(1 if kept else 2, 2, 1)
    policy.reset(bc_camera.all_instructions()[0])
    assert step(3) == fed(3, 3, 3)
    assert step(4) == fed(3 if kept else 4, 4, 3)
    other = policy.spawn()
    other.reset(bc_camera.all_instructions()[0])
    for frame in buffer.values():
        frame[...] = 5
    other.act(obs)
    assert int(runner.fed[-1]["third_person"].ravel()[0]) == 5


def test_training_reads_the_episodes_first_frame_for_first_frame_cameras():
    """What the network is trained on at each step is what the policy feeds it there (frame_rows)."""
    from eval.training.train_bc_camera import Demos, frame_rows

    episode = np.array([0, 0, 0, 1, 1, 2])
    demos = Demos(frames={}, low_dim=np.zeros((6, 1)), scene=np.zeros((6, 32)), episode=episode, episodes_used=3)
    rows = frame_rows(demos, bc_camera.BCCameraNetConfig())
    assert rows["third_person"].tolist() == [0, 0, 0, 3, 3, 5]
    assert rows["wrist"].tolist() == [0, 1, 2, 3, 4, 5]
    assert frame_rows(demos, bc_camera.BCCameraNetConfig(first_frame_cameras=()))["third_person"].tolist() == \
        list(range(6))
    rows = frame_rows(demos, bc_camera.BCCameraNetConfig(far_block_first_frame=True))
    assert sorted(rows) == ["third_person", "wrist", "wrist_first"]
    assert rows["wrist_first"].tolist() == [0, 0, 0, 3, 3, 5] and rows["wrist"].tolist() == list(range(6))


def test_weights_written_before_the_locator_place_the_block_with_the_estimator():
    """Version 12 places the block before the grasp with the locator; a file without the field (v14, version 11)
    has none and the estimator places it, and a locator whose camera is read every step is refused."""
    from dataclasses import asdict

    assert bc_camera.BCCameraNetConfig().locator_hidden == ()  # off by default: docs/models.md
    cfg = bc_camera.BCCameraNetConfig(locator_hidden=(64, 64))
    d = asdict(cfg)
    assert bc_camera.config_from_json(json.dumps(d)) == cfg
    del d["locator_hidden"]
    old = bc_camera.config_from_json(json.dumps(d))
    assert old.locator_hidden == () and old.first_frame_cameras == ("third_person",)
    assert not hasattr(bc_camera.build(old), "locator")
    with pytest.raises(ValueError, match="the locator reads the third_person camera's first frame"):
        bc_camera.BCCameraNetConfig(first_frame_cameras=(), locator_hidden=(8,))


def test_the_locator_places_a_block_away_from_the_gripper_from_the_third_person_and_instruction_alone():
    """Version 12: not held and away from the gripper, the block's x, y are the locator's, which the wrist
    camera does not move (v14's estimator, reading it, moved its block with the gripper); the third person
    and the instruction do."""
    n = 4
    cfg, model, images, low = _untrained(n, locator_hidden=(64, 64))
    seen = cfg.proprio_dim + len(cfg.instructions)
    with torch.no_grad():
        model.scene_mean[bc_camera.GRASPED] = -10.0  # not held
        tcp = model.estimate(images, low)[:, 0:2]
        model.scene_mean[6:8] = tcp.mean(0) + torch.tensor([0.0, 0.5])  # away from every row's gripper
        feats = model.encoders["third_person"]((images["third_person"] - 0.5) * 4.0)
        located = model.locate(feats, low[:, cfg.proprio_dim:seen])
        assert torch.all(torch.linalg.vector_norm(located - tcp, dim=-1) > 3 * bc_camera.OFFSET_NEAR)
        est = model.estimate(images, low)
        wrist = model.estimate({**images, "wrist": torch.rand_like(images["wrist"])}, low)
        moved = model.estimate({**images, "third_person": torch.rand_like(images["third_person"])}, low)
        other = low.clone()
        other[:, cfg.proprio_dim:seen] = torch.roll(low[:, cfg.proprio_dim:seen], 1, dims=-1)
        told = model.estimate(images, other)
    assert torch.allclose(est[:, 6:8], located, atol=1e-3)  # held: sigmoid(-105) of the way to the gripper
    assert torch.equal(est[:, 6:8], wrist[:, 6:8])
    assert not torch.allclose(est[:, 6:8], moved[:, 6:8]) and not torch.allclose(est[:, 6:8], told[:, 6:8])


def test_the_first_steps_estimate_places_a_block_away_from_the_gripper():
    """Version 13: not held and away from the gripper, the block's x, y are the estimator's at the try's first
    step, from every camera's first frame (v15's, read from the step's wrist frame, followed the gripper): the
    step's wrist frame does not move them, the wrist's first frame does; where the first frames are the step's
    (the try's first step) the estimate is the network's without the change, the same weights."""
    n = 4
    cfg, model, images, low = _untrained(n, far_block_first_frame=True)
    step = bc_camera.build(bc_camera.BCCameraNetConfig()).eval()
    step.load_state_dict(model.state_dict())
    first = {**images, "wrist_first": images["wrist"]}
    with torch.no_grad():
        for net in (model, step):
            net.scene_mean[bc_camera.GRASPED] = -10.0  # not held
        tcp = model.estimate(first, low)[:, 0:2]
        for net in (model, step):
            net.scene_mean[6:8] = tcp.mean(0) + torch.tensor([0.0, 0.5])  # away from every row's gripper
        est = model.estimate(first, low)
        assert torch.equal(est, step.estimate(images, low))
        wrist = model.estimate({**first, "wrist": torch.rand_like(images["wrist"])}, low)
        moved = model.estimate({**first, "wrist_first": torch.rand_like(images["wrist"])}, low)
        with pytest.raises(ValueError, match="the estimate needs wrist_first"):
            model.estimate(images, low)
    assert torch.equal(est[:, 6:8], wrist[:, 6:8])
    assert not torch.allclose(est[:, 6:8], moved[:, 6:8])


def test_with_the_first_steps_far_block_the_locator_reads_every_cameras_first_frame():
    """Version 13 with a locator: it reads both cameras' first frames (the wrist's as ``wrist_first``), so the
    step's wrist frame does not move the block away from the gripper and the wrist's first frame does."""
    n = 4
    cfg, model, images, low = _untrained(n, far_block_first_frame=True, locator_hidden=(16,))
    first = {**images, "wrist_first": torch.rand_like(images["wrist"])}
    with torch.no_grad():
        model.scene_mean[bc_camera.GRASPED] = -10.0  # not held
        tcp = model.estimate(first, low)[:, 0:2]
        model.scene_mean[6:8] = tcp.mean(0) + torch.tensor([0.0, 0.5])  # away from every row's gripper
        feats = torch.cat([model.encoders[c]((first[k] - 0.5) * 4.0) for c, k in
                           (("third_person", "third_person"), ("wrist", "wrist_first"))], -1)
        located = model.locate(feats, low[:, cfg.proprio_dim:cfg.proprio_dim + len(cfg.instructions)])
        assert torch.all(torch.linalg.vector_norm(located - tcp, dim=-1) > 3 * bc_camera.OFFSET_NEAR)
        est = model.estimate(first, low)
        wrist = model.estimate({**first, "wrist": torch.rand_like(images["wrist"])}, low)
        moved = model.estimate({**first, "wrist_first": torch.rand_like(images["wrist"])}, low)
    assert torch.allclose(est[:, 6:8], located, atol=1e-3)
    assert torch.equal(est[:, 6:8], wrist[:, 6:8]) and not torch.allclose(est[:, 6:8], moved[:, 6:8])


def test_weights_written_before_the_first_steps_far_block_read_the_steps_frames():
    from dataclasses import asdict

    assert not bc_camera.BCCameraNetConfig().far_block_first_frame  # off by default: docs/models.md
    cfg = bc_camera.BCCameraNetConfig(far_block_first_frame=True)
    d = asdict(cfg)
    assert bc_camera.config_from_json(json.dumps(d)) == cfg and cfg.first_inputs == ("wrist",)
    del d["far_block_first_frame"]  # a file of version 12 (v15)
    assert not bc_camera.config_from_json(json.dumps(d)).far_block_first_frame
    assert bc_camera.BCCameraNetConfig(first_frame_cameras=(), far_block_first_frame=True).first_inputs == \
        ("third_person", "wrist")
    assert bc_camera.BCCameraNetConfig(locator_hidden=(8,)).locator_cameras == ("third_person",)
    assert bc_camera.BCCameraNetConfig(locator_hidden=(8,), far_block_first_frame=True).locator_cameras == \
        ("third_person", "wrist")
    with pytest.raises(ValueError, match="needs estimator_reads_gripper False"):
        bc_camera.BCCameraNetConfig(estimator_reads_gripper=True, far_block_first_frame=True)


def test_a_frame_darker_than_its_cameras_brightness_floor_is_scaled_up_to_it():
    """Version 14 (``brightness_floor``): a frame at or above its camera's floor is read as it is (the estimate is
    the network's without the field, bit for bit); one dimmed below it (as D01's dim light dims a scene: every
    channel alike) is scaled up to the floor, so the estimate is that of the frame scaled to the floor's mean,
    whatever the dimming; the first frames (``<camera>_first``) go by their camera's floor."""
    n = 2
    floors = (0.48, 0.43)
    cfg, model, _, low = _untrained(n, brightness_floor=floors, far_block_first_frame=True)
    plain = bc_camera.build(bc_camera.BCCameraNetConfig(far_block_first_frame=True)).eval()
    plain.load_state_dict(model.state_dict())
    torch.manual_seed(1)
    bright = {name: 0.55 + 0.4 * torch.rand(n, 3, cfg.image_side(name), cfg.image_side(name))
              for name, _ in cfg.cameras}  # means about 0.75, every pixel under 1
    bright["wrist_first"] = bright["wrist"].flip(-1)
    at_floor = {key: x * (floors[0 if key == "third_person" else 1] / x.mean(dim=(1, 2, 3), keepdim=True))
                for key, x in bright.items()}
    with torch.no_grad():
        assert torch.equal(model.estimate(bright, low), plain.estimate(bright, low))
        want = plain.estimate(at_floor, low)
        for k in (0.6, 0.3, 0.2):
            got = model.estimate({key: x * k for key, x in bright.items()}, low)
            assert torch.allclose(got, want, atol=1e-4), k
        assert not torch.allclose(plain.estimate({key: x * 0.3 for key, x in bright.items()}, low), want, atol=1e-4)
    from dataclasses import asdict

    d = asdict(cfg)
    assert bc_camera.config_from_json(json.dumps(d)) == cfg
    del d["brightness_floor"]  # a file of version 13 or older
    assert bc_camera.config_from_json(json.dumps(d)).brightness_floor == ()
    for bad in ((0.5,), (0.5, 0.0), (0.5, 1.2)):
        with pytest.raises(ValueError, match="brightness_floor takes one number in"):
            bc_camera.BCCameraNetConfig(brightness_floor=bad)


@pytest.mark.parametrize("far_block_first_frame", [False, True], ids=["version-12", "version-13"])
def test_the_locator_is_fitted_on_the_first_frames_holding_out_whole_starts(far_block_first_frame):
    """fit_locator changes the locator and its normalisation only, fits the block's x, y at each episode's first
    step from that frame (version 13: both cameras' first frames), and holds out starts (one block position and
    instruction) whole: DAgger rounds replay the demonstrations' starts, and a start on both sides would flatter the
    validation."""
    from eval.training.train_bc_camera import Demos, Recipe, fit_locator

    cfg, model, _, _ = _untrained(1, locator_hidden=(64, 64), far_block_first_frame=far_block_first_frame)
    features = sum(bc_camera.encoder_features(cfg, cfg.image_side(c)) for c in cfg.locator_cameras)
    assert model.locator_mean.shape == (features + len(cfg.instructions),)
    rng = np.random.default_rng(0)
    starts, repeats, length = 40, 2, 3
    xy = rng.uniform(-0.15, 0.15, (starts, 2)).astype(np.float32)
    side = {name: cfg.image_side(name) for name, _ in cfg.cameras}
    start_frames = rng.integers(0, 256, (starts, 3, side["third_person"], side["third_person"]), dtype=np.uint8)
    episodes = np.tile(np.arange(starts), repeats)  # each start recorded twice, as a DAgger round replays it
    n = len(episodes) * length
    scene = np.zeros((n, 32), np.float32)
    scene[:, 6:8] = np.repeat(xy[episodes], length, 0)
    scene[length - 1::length, 6:8] += 0.05  # a block that moves later in the episode: the first step's is fitted
    low = np.zeros((n, cfg.low_dim), np.float32)
    low[:, cfg.proprio_dim] = 1.0
    demos = Demos(frames={"third_person": np.repeat(start_frames[episodes], length, 0),
                          "wrist": rng.integers(0, 256, (n, 3, side["wrist"], side["wrist"]), dtype=np.uint8)},
                  low_dim=low, scene=scene, episode=np.repeat(np.arange(len(episodes)), length),
                  episodes_used=len(episodes))
    with torch.no_grad():
        model.scene_mean[6:8] = torch.as_tensor(xy.mean(0))
        model.scene_std[6:8] = torch.as_tensor(xy.std(0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = fit_locator(model, demos, Recipe(config=cfg, locator_batches=300, batch=32), show=False,
                         log=lambda *_: None)
    after = model.state_dict()
    changed = {k for k in after if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("locator") for k in changed), changed
    assert report["train"]["starts"] + report["validation"]["starts"] == starts
    assert report["train"]["episodes"] + report["validation"]["episodes"] == starts * repeats
    assert report["validation"]["episodes"] == repeats * report["validation"]["starts"]  # whole starts
    # it learns the fitted starts' first-step positions (a spread of 87 mm rms) to a fraction of that
    assert report["train"]["median_mm"] < 30.0


def _saved_untrained(path, **fields):
    from dataclasses import replace

    torch.manual_seed(0)
    cfg = replace(bc_camera.BCCameraNetConfig(), **fields)
    bc_camera.save(bc_camera.build(cfg), cfg, path)
    return path


@pytest.mark.sim
def test_a_locator_is_fitted_onto_trained_weights_without_one(recorded_demos, tmp_path):
    """--locator-from W: no epochs; W's network as it is, with a locator fitted on the datasets' first frames."""
    demos, _ = recorded_demos
    v11 = _saved_untrained(tmp_path / "v11.safetensors", locator_hidden=())
    proc = _train("--datasets", str(demos), "--work", str(tmp_path / "work"), "--report-dir", str(tmp_path / "r"),
                  "--locator-from", str(v11), "--locator-hidden", "64", "64", "--out",
                  str(tmp_path / "v12.safetensors"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    old, _, _ = bc_camera.load(v11)
    new, cfg, _ = bc_camera.load(tmp_path / "v12.safetensors")
    assert cfg.locator_hidden == (64, 64)
    for name, t in old.state_dict().items():
        assert torch.equal(new.state_dict()[name], t), name
    report = json.loads((tmp_path / "r" / "training.json").read_text())
    from engines.onnx_utils import sha256_file
    assert report["locator_from"]["sha256"] == sha256_file(v11) and report["history"] == []
    assert report["locator"]["train"]["episodes"] == 2 and report["locator"]["validation"] is None


def test_locator_from_refuses_weights_that_are_missing_or_have_one_and_wants_its_widths(tmp_path):
    fitted = _saved_untrained(tmp_path / "fitted.safetensors", locator_hidden=(8,))
    for weights, widths, said in (
            (tmp_path / "none.safetensors", ["64"], f"--locator-from {tmp_path / 'none.safetensors'} does not "
                                                    f"exist; give trained bc-camera weights"),
            (fitted, ["64"], f"--locator-from {fitted} has a locator already; give the weights it was fitted onto"),
            (fitted, [], "--locator-from fits a locator: give its hidden widths with --locator-hidden")):
        proc = _train("--datasets", str(tmp_path / "a"), "--work", str(tmp_path / "work"), "--locator-from",
                      str(weights), *(["--locator-hidden", *widths] if widths else []))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines() == [f"error: {said}"]


def test_the_policy_head_is_tuned_on_the_networks_own_estimates_against_bc_state_on_the_truth():
    """tune_head changes the policy head only, and its action on the (untrained) estimator's estimate comes nearer
    bc-state's on the true scene; steps whose block lies on its side are left out, as in the training."""
    from dataclasses import replace

    from eval.training.train_bc_camera import TOPPLED_TILT, Demos, Recipe, tune_head

    cfg, model, _, _ = _untrained(1)
    rng = np.random.default_rng(0)
    n, toppled = 256, 6
    side = {name: cfg.image_side(name) for name, _ in cfg.cameras}
    scene = rng.normal(0, 0.05, (n, 32)).astype(np.float32)
    scene[:toppled, 22] = TOPPLED_TILT + 0.1
    low = rng.uniform(-1, 1, (n, cfg.low_dim)).astype(np.float32)
    demos = Demos(frames={c: rng.integers(0, 256, (n, 3, side[c], side[c]), dtype=np.uint8) for c in side},
                  low_dim=low, scene=scene, episode=np.repeat(np.arange(n // 8), 8), episodes_used=n // 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    recipe = replace(Recipe(config=cfg), head_epochs=20, head_batch=64, head_lr=3e-3)
    report = tune_head(model, demos, recipe, bc_mlp.DEFAULT_WEIGHTS, show=False, log=lambda *_: None)
    after = model.state_dict()
    changed = {k for k in after if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("policy.") for k in changed), changed
    assert not any(p.requires_grad for p in model.policy.parameters())  # frozen again, as built
    assert report["steps"] == n - toppled and report["batches"] == 20 * ((n - toppled) // 64)
    on_est = report["action_error_on_the_estimate"]
    assert on_est["tuned"]["all"] < on_est["before"]["all"]
    assert on_est["before"]["over_the_hole"] is None  # no step holds a block over its hole


@pytest.mark.sim
def test_a_policy_head_is_tuned_onto_trained_weights_and_not_twice(recorded_demos, tmp_path):
    """--head-from W: no epochs; W's network as it is but its policy head, tuned; the file says so, and a second
    tuning from it is refused."""
    demos, _ = recorded_demos
    trained = _saved_untrained(tmp_path / "w.safetensors")
    args = ["--datasets", str(demos), "--work", str(tmp_path / "work"), "--report-dir", str(tmp_path / "r"),
            "--head-epochs", "1"]
    proc = _train(*args, "--head-from", str(trained), "--out", str(tmp_path / "tuned.safetensors"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    old, _, _ = bc_camera.load(trained)
    new, _, meta = bc_camera.load(tmp_path / "tuned.safetensors")
    differ = {k for k, t in old.state_dict().items() if not torch.equal(new.state_dict()[k], t)}
    assert differ and all(k.startswith("policy.") for k in differ), differ
    from engines.onnx_utils import sha256_file
    report = json.loads((tmp_path / "r" / "training.json").read_text())
    assert report["head_from"]["sha256"] == sha256_file(trained) == meta["head_from_sha256"]
    assert report["history"] == [] and meta["head_epochs"] == "1"
    assert report["policy_head_tuning"]["steps"] == report["steps"] > 0
    again = _train(*args, "--fresh", "--head-from", str(tmp_path / "tuned.safetensors"))
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        f"error: --head-from {tmp_path / 'tuned.safetensors'} has a tuned policy head already; give the weights it "
        f"was tuned onto"]


def test_head_from_refuses_missing_weights_and_wants_its_epochs_and_one_part_at_a_time(tmp_path):
    trained = _saved_untrained(tmp_path / "w.safetensors")
    for args, said in (
            (["--head-from", str(tmp_path / "none.safetensors"), "--head-epochs", "1"],
             f"--head-from {tmp_path / 'none.safetensors'} does not exist; give trained bc-camera weights"),
            (["--head-from", str(trained)], "--head-from tunes the policy head: give its epochs with --head-epochs"),
            (["--head-from", str(trained), "--head-epochs", "1", "--locator-from", str(trained), "--locator-hidden",
              "8"], "--locator-from and --head-from each fit one part onto trained weights; give one (fit the other "
                    "onto its output)"),
            (["--head-epochs", "-1"], None)):
        proc = _train("--datasets", str(tmp_path / "a"), "--work", str(tmp_path / "work"), *args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and (said is None or proc.stderr.strip() == f"error: {said}")


@pytest.mark.sim
def test_training_starts_from_trained_weights_with_their_normalisation_and_head(recorded_demos, tmp_path):
    """--init-from W: the epochs start from W's network (a DAgger round on new folders alone), its normalisation
    and policy head kept, not recomputed from the folders or copied from bc-state; the file names W and carries
    W's head-tuning epochs."""
    demos, _ = recorded_demos
    w = tmp_path / "w.safetensors"
    torch.manual_seed(0)
    cfg = bc_camera.BCCameraNetConfig()
    model = bc_camera.build(cfg)
    with torch.no_grad():  # a tuned head and a normalisation no folder has
        model.policy.net[0].weight.add_(0.5)
        model.scene_mean.fill_(0.25)
    bc_camera.save(model, cfg, w, extra={"head_epochs": 20})
    proc = _train("--datasets", str(demos), "--work", str(tmp_path / "work"), "--report-dir", str(tmp_path / "r"),
                  "--init-from", str(w), "--epochs", "1", "--lr", "1e-4", "--out", str(tmp_path / "next.safetensors"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    old, _, _ = bc_camera.load(w)
    new, _, meta = bc_camera.load(tmp_path / "next.safetensors")
    differ = {k for k, t in old.state_dict().items() if not torch.equal(new.state_dict()[k], t)}
    assert differ and not any(k.startswith("policy.") or k.endswith(("_mean", "_std")) for k in differ), differ
    from engines.onnx_utils import sha256_file
    report = json.loads((tmp_path / "r" / "training.json").read_text())
    assert report["init_from"]["sha256"] == sha256_file(w) == meta["init_from_sha256"]
    assert meta["head_epochs"] == "20" and meta["epochs"] == "1" and [h["epoch"] for h in report["history"]] == [0, 1]


def test_keeping_the_far_block_takes_the_teachers_block_only_far_from_the_gripper_before_the_grasp():
    """--keep-far-block's target: the truth, but where the block is far across from the gripper and not held, its
    x, y is the teacher's (W's) estimate, and the relations that read it follow; near the block or held, the
    truth."""
    from eval.training.train_bc_camera import far_block_target

    cfg, model, images, low = _untrained(3)
    scene = torch.rand(3, 32) * 0.1
    scene[:, 23] = torch.tensor([1.0, 0.0, 0.0])  # held (far), not held near, not held far
    scene[:, 16:18] = torch.tensor([[0.2, 0.0], [0.01, 0.01], [0.0, -0.3]])
    asked = []

    def inputs(far):
        asked.append(far.tolist())
        return {c: x[far] for c, x in images.items()}, low[far]
    target = far_block_target(model, scene, inputs)
    assert asked == [[False, False, True]]
    with torch.no_grad():
        xy = model.estimate({c: x[2:] for c, x in images.items()}, low[2:])[0, 6:8]
    assert torch.equal(target[:2], scene[:2])
    changed = [6, 7, 16, 17, 19, 20]
    same = [i for i in range(32) if i not in changed]
    assert torch.equal(target[2, same], scene[2, same])
    assert torch.equal(target[2, 6:8], xy)
    assert torch.allclose(target[2, 16:18], xy - scene[2, 0:2]) and torch.allclose(target[2, 19:21],
                                                                                   scene[2, 13:15] - xy)


def test_init_from_refuses_missing_weights_and_a_second_way_to_start(tmp_path):
    trained = _saved_untrained(tmp_path / "w.safetensors")
    for args, said in (
            (["--init-from", str(tmp_path / "none.safetensors")],
             f"--init-from {tmp_path / 'none.safetensors'} does not exist; give trained bc-camera weights"),
            (["--init-from", str(trained), "--head-from", str(trained), "--head-epochs", "1"],
             "--init-from trains W's network on; --locator-from and --head-from fit one part onto W without epochs: "
             "give one of them"),
            (["--init-from", str(trained), "--locator-hidden", "8"],
             "--init-from trains W's network as W's file configures it; leave out --grid-channels and "
             "--locator-hidden"),
            (["--keep-far-block"], "--keep-far-block keeps W's estimate of the far block: give --init-from W")):
        proc = _train("--datasets", str(tmp_path / "a"), "--work", str(tmp_path / "work"), *args)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"error: {said}"], proc.stderr


@pytest.mark.sim
@pytest.mark.parametrize("flags, changed",
                         [(["--far-block-first-frame"], {"far_block_first_frame": True}),
                          (["--brightness-floor", "0.48", "0.43"], {"brightness_floor": (0.48, 0.43)})],
                         ids=["far-block-first-frame", "brightness-floor"])
def test_a_change_onto_trained_weights_without_epochs(recorded_demos, tmp_path, flags, changed):
    """--init-from W --epochs 0 with --far-block-first-frame (version 13) or --brightness-floor (version 14): W's
    tensors unchanged, its configuration with the change; the history is W on the held-out episodes with it."""
    demos, _ = recorded_demos
    w = _saved_untrained(tmp_path / "w.safetensors")
    out = tmp_path / "first.safetensors"
    proc = _train("--datasets", str(demos), "--work", str(tmp_path / "work"), "--report-dir", str(tmp_path / "r"),
                  "--init-from", str(w), "--epochs", "0", *flags, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    old, old_cfg, _ = bc_camera.load(w)
    new, cfg, meta = bc_camera.load(out)
    assert cfg == bc_camera.BCCameraNetConfig(**{**old_cfg.__dict__, **changed})
    assert all(torch.equal(new.state_dict()[k], t) for k, t in old.state_dict().items())
    report = json.loads((tmp_path / "r" / "training.json").read_text())
    assert meta["epochs"] == "0" and [h["epoch"] for h in report["history"]] == [0]


def test_epochs_0_is_refused_without_init_from(tmp_path):
    trained = _saved_untrained(tmp_path / "w.safetensors")
    for args, said in (
            (["--epochs", "0"], "--epochs 0 trains nothing: it takes --init-from W (W as it is, with "
                                "--far-block-first-frame, --brightness-floor or --head-epochs)"),
            (["--brightness-floor", "0.5"], "--brightness-floor: brightness_floor takes one number in (0, 1] for each "
                                            "camera (third_person, wrist); got (0.5,)"),
            (["--init-from", str(trained), "--far-block-first-frame", "--head-from", str(trained)],
             "--init-from trains W's network on; --locator-from and --head-from fit one part onto W without epochs: "
             "give one of them")):
        proc = _train("--datasets", str(tmp_path / "a"), "--work", str(tmp_path / "work"), *args)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"error: {said}"], proc.stderr


def test_the_diagnosis_measures_how_far_the_blocks_error_follows_the_gripper():
    from eval.training.diagnose_bc_camera import error_follows_gripper

    rng = np.random.default_rng(0)
    true = np.zeros((50, 32))
    true[:, 6:8] = rng.uniform(-0.2, 0.2, (50, 2))  # the block
    tcp = rng.uniform(-0.3, 0.3, (50, 2))
    true[:, 16:18] = true[:, 6:8] - tcp
    read = true.copy()  # read from the block, with a constant bias
    read[:, 6:8] += 0.01
    under = true.copy()  # put where the gripper is
    under[:, 6:8] = tcp
    half = true.copy()
    half[:, 6:8] = (true[:, 6:8] + tcp) / 2
    for est, slope in ((read, 0.0), (under, 1.0), (half, 0.5)):
        assert np.allclose(error_follows_gripper(est, true), slope, atol=1e-9)
    assert all(np.isnan(error_follows_gripper(read[:2], true[:2])))


def test_training_leaves_out_the_steps_of_a_toppled_block(tmp_path):
    """A block lying on its side (tilt over TOPPLED_TILT), which some DAgger rounds hold and no demonstration
    does, is neither trained on nor validated on, and the report counts those steps."""
    from eval.training.train_bc_camera import TILT, TOPPLED_TILT, Demos, Recipe, train

    cfg = bc_camera.BCCameraNetConfig()
    rng = np.random.default_rng(0)
    n, episodes = 40, 8
    scene = rng.normal(0, 0.05, (n, 32)).astype(np.float32)
    scene[:, bc_camera.GRASPED] = 0.0
    scene[[3, 4, 17], TILT] = TOPPLED_TILT + np.array([0.01, 1.0, 1.4])
    demos = Demos(frames={name: rng.integers(0, 256, (n, 3, cfg.image_side(name), cfg.image_side(name)),
                                             dtype=np.uint8) for name, _ in cfg.cameras},
                  low_dim=rng.normal(0, 1, (n, cfg.low_dim)).astype(np.float32), scene=scene,
                  episode=np.repeat(np.arange(episodes), n // episodes), episodes_used=episodes,
                  source=np.zeros(n, np.int64))
    _, history, split = train(demos, Recipe(epochs=1, batch=8, config=cfg), tmp_path / "work",
                              bc_mlp.DEFAULT_WEIGHTS, show=False, log=lambda *_: None)
    assert split["toppled_steps_left_out"] == 3
    assert split["train_steps"] + split["validation_steps"] == n - 3
    assert np.isfinite(history[-1]["train_loss"])
