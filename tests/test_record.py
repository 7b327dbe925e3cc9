"""python -m eval.record: tries recorded through the real command line as a LeRobotDataset v3.0, read back as
LeRobot's reader reads it (pyarrow for the parquet files, pandas for meta/tasks.parquet, PyAV for the videos:
LeRobot's own decoder where torchcodec is missing), resumed after a kill, and refused where it must be."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.sim  # renders camera scenes

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FPS = 20  # env.setups.CONTROL_FREQ


def _record(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eval.record", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def dataset(recorded_demos):
    """A scripted try of A01 and one of F01 (latency 1: the action is applied a step after it is sent), on two
    workers (tests/conftest.py: recorded once for this file and tests/test_bc_camera.py, which trains on it; the
    resume test records two tries of one setup, in order)."""
    return recorded_demos


def _table(path):
    return pq.read_table(path)


def test_the_folder_is_a_lerobot_v3_dataset(dataset):
    out, proc = dataset
    info = json.loads((out / "meta/info.json").read_text())
    episodes = _table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    data = _table(out / "data/chunk-000/file-000.parquet")
    records = [json.loads(x) for x in (out / "recording/tries.jsonl").read_text().splitlines()]
    assert info["codebase_version"] == "v3.0" and info["fps"] == FPS and info["robot_type"] == "panda"
    assert info["total_episodes"] == 2 == len(episodes) and info["total_tasks"] >= 1
    assert info["total_frames"] == data.num_rows == sum(e["length"] for e in episodes)
    assert info["splits"] == {"train": "0:2"}
    # the run's order (setups as asked), whichever worker finished first; each episode the try its record names
    assert [(e["setup"], e["try_index"]) for e in episodes] == [("F01", 0), ("A01", 0)]
    by_try = {(r["setup"], r["try"]): r for r in records}
    for e in episodes:
        r = by_try[(e["setup"], e["try_index"])]
        assert (e["length"], e["success"], e["seed"], e["flags"], e["split"]) == (
            r["steps"], r["success"], r["seed"], r["flags"], "train")
    assert all(e["success"] for e in episodes)  # the scripted reference solves these
    # the columns are exactly the non-video features, typed as LeRobot's reader casts them
    feats = info["features"]
    assert set(data.column_names) == {k for k, v in feats.items() if v["dtype"] != "video"}
    assert data.schema.field("observation.state").type == pa.list_(pa.float32(), 9)
    assert feats["observation.state"]["shape"] == [9] and len(feats["observation.state"]["names"]) == 9
    assert data.schema.field("action").type == pa.list_(pa.float32(), 7)
    assert data.schema.field("timestamp").type == pa.float32()
    for name in ("frame_index", "episode_index", "index", "task_index"):
        assert data.schema.field(name).type == pa.int64()
    assert feats["observation.images.third_person"]["shape"] == [256, 256, 3]
    assert feats["observation.images.wrist"]["shape"] == [128, 128, 3]
    cols = data.to_pydict()
    assert cols["index"] == list(range(data.num_rows))  # the row position: LeRobot indexes rows by it
    for e in episodes:
        rows = slice(e["dataset_from_index"], e["dataset_to_index"])
        assert set(cols["episode_index"][rows]) == {e["episode_index"]}
        assert cols["frame_index"][rows] == list(range(e["length"]))
        np.testing.assert_array_equal(np.float32(cols["timestamp"][rows]), np.float32(np.arange(e["length"]) / FPS))
        assert cols["next.done"][rows][-1] and not any(cols["next.done"][rows][:-1])
        assert cols["next.success"][rows][-1] is True  # the try ended on success
    actions = np.array(cols["action"])
    assert np.all(np.abs(actions) <= 1.0) and set(np.unique(actions[:, 6])) <= {-1.0, 1.0}
    assert "wrote the LeRobot v3.0 dataset" in proc.stdout


def test_tasks_are_read_by_pandas_as_lerobot_reads_them(dataset):
    pd = pytest.importorskip("pandas")
    out, _ = dataset
    tasks = pd.read_parquet(out / "meta/tasks.parquet")  # datasets/io_utils.py load_tasks
    tasks.index.name = "task"
    info = json.loads((out / "meta/info.json").read_text())
    assert len(tasks) == info["total_tasks"] and list(tasks["task_index"]) == list(range(len(tasks)))
    episodes = _table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    for e in episodes:
        (task,) = e["tasks"]
        assert tasks.loc[task].task_index == tasks.index.get_loc(task)  # dataset_metadata.py get_task_index
    data = _table(out / "data/chunk-000/file-000.parquet").to_pydict()
    first = data["task_index"][0]
    assert tasks.iloc[first].name == episodes[0]["tasks"][0]  # dataset_reader.py: item["task"]
    from env.instructions import INSTRUCTION

    # each episode's task is its try's instruction: the target shape its record names
    records = {(r["setup"], r["try"]): r for r in map(json.loads, (out / "recording/tries.jsonl").read_text().splitlines())}
    for e in episodes:
        assert e["tasks"] == [INSTRUCTION.format(shape=records[(e["setup"], e["try_index"])]["target"])]


def test_each_episode_frames_are_where_its_timestamps_say(dataset):
    """LeRobot asks the decoder for from_timestamp + frame_index / fps and refuses a frame further than 1e-4 s
    from it (datasets/video_utils.py, tolerance_s); the frame there is the episode's own first view."""
    av = pytest.importorskip("av")
    out, _ = dataset
    episodes = _table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    total = sum(e["length"] for e in episodes)
    for camera in ("third_person", "wrist"):
        key = f"observation.images.{camera}"
        with av.open(str(out / f"videos/{key}/chunk-000/file-000.mp4")) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == "h264"
            frames = [(float(f.pts * f.time_base), f.to_ndarray(format="rgb24")) for f in container.decode(stream)]
        assert len(frames) == total
        pts = np.array([t for t, _ in frames])
        np.testing.assert_allclose(pts, np.arange(total) / FPS, atol=1e-4, rtol=0)
        for e in episodes:
            assert e[f"videos/{key}/from_timestamp"] == pytest.approx(e["dataset_from_index"] / FPS, abs=1e-9)
            assert e[f"videos/{key}/to_timestamp"] == pytest.approx(e["dataset_to_index"] / FPS, abs=1e-9)
        if camera == "third_person":
            third = [f for _, f in frames]
    # the first frame of each episode is its try's start rendered anew: nearer to it than to any other try's
    # start, and than the previous episode's last frame (H.264 at CRF 23: a few levels off)
    from env.setups import get_setup
    from env.tasklist import load
    from eval.rollout import Scenes

    tl = load("train")
    rendered = []
    for e in episodes:
        scenes = Scenes(get_setup(e["setup"]), 1, cameras=True)
        try:
            scenes.reset([tl.seed(e["setup"], e["try_index"])], [tl.start(e["setup"], e["try_index"])])
            rendered.append(scenes.frames(0)[0].astype(float))
        finally:
            scenes.close()
    for k, e in enumerate(episodes):
        first = e["dataset_from_index"]
        candidates = [third[first]] + [third[first - 1]] * (first > 0)  # and the previous episode's last
        own = [np.abs(c.astype(float) - rendered[k]).mean() for c in candidates]
        others = [np.abs(third[first].astype(float) - r).mean() for j, r in enumerate(rendered) if j != k]
        assert own[0] < 8 and own[0] < min(own[1:] + others), (k, own, others)


def test_environment_state_is_the_scenes_state_features(dataset):
    """observation.environment_state (LeRobot's key for a simulator's state) holds bc-state's 32 scene features
    of the step's scene: at each episode's first step, those of its try's start built anew; at a successful try's
    last step, a block in its hole (the success predicate: at most 6 mm off in xy, 26 mm below the plate top)."""
    from env.setups import get_setup
    from env.tasklist import load
    from eval.rollout import Scenes
    from eval.training.state_features import SCENE_NAMES, VERSION, state_vector

    out, _ = dataset
    info = json.loads((out / "meta/info.json").read_text())
    assert info["features"]["observation.environment_state"] == {"dtype": "float32", "shape": [32],
                                                                  "names": list(SCENE_NAMES)}
    assert json.loads((out / "meta/recording.json").read_text())["environment_state"] == VERSION
    episodes = _table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    env_state = np.array(_table(out / "data/chunk-000/file-000.parquet").column("observation.environment_state")
                         .to_pylist(), dtype=np.float32)
    tl = load("train")
    for e in episodes:
        scenes = Scenes(get_setup(e["setup"]), 1, cameras=False)
        try:
            scenes.reset([tl.seed(e["setup"], e["try_index"])], [tl.start(e["setup"], e["try_index"])])
            expected = state_vector(scenes.observations([0], "state")[0]["state"])
        finally:
            scenes.close()
        np.testing.assert_array_equal(env_state[e["dataset_from_index"]], expected)
        last = env_state[e["dataset_to_index"] - 1]
        hole_minus_block = last[SCENE_NAMES.index("hole_minus_block_x"):SCENE_NAMES.index("hole_minus_block_y") + 1]
        assert e["success"] and np.linalg.norm(hole_minus_block) <= 0.006
        assert last[SCENE_NAMES.index("plate_top_minus_block_bottom")] >= 0.026 - 1e-6


def test_stats_cover_every_feature_as_lerobot_writes_them(dataset):
    out, _ = dataset
    stats = json.loads((out / "meta/stats.json").read_text())
    info = json.loads((out / "meta/info.json").read_text())
    assert set(stats) == set(info["features"])
    keys = {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"}
    for name, s in stats.items():
        assert set(s) == keys, name
        shape = (3, 1, 1) if name.startswith("observation.images.") else (info["features"][name]["shape"][0],)
        for k in keys - {"count"}:
            assert np.array(s[k]).shape == shape, (name, k)
    img = stats["observation.images.third_person"]
    assert 0 <= np.min(img["min"]) <= np.max(img["max"]) <= 1 and np.all(np.array(img["std"]) > 0)
    assert stats["observation.state"]["count"] == [info["total_frames"]]
    assert stats["index"]["max"] == [info["total_frames"] - 1]
    recording = json.loads((out / "meta/recording.json").read_text())
    assert recording["model"] == "scripted" and recording["split"] == "train" and recording["left_out"] == []
    from env.tasklist import load

    assert recording["tasklist_sha256"] == load("train").sha256
    assert not (out / "recording/episodes").exists()  # the staged episodes went once the dataset was written


def test_a_finished_dataset_is_refused_unless_fresh(dataset):
    out, _ = dataset
    proc = _record("--setups", "A01", "--tries", "1", "--out", str(out), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: {out} holds a finished dataset (meta/info.json); use --fresh to record it again, or another --out"]


@pytest.mark.parametrize("args,message", [
    (["--split", "dev"], "eval.record records the train split only, not 'dev'"),
    (["--split", "test"], "eval.record records the train split only, not 'test'"),
    (["--push-to-hub", "not a repo"], "--push-to-hub 'not a repo' is not a Hub repo id"),
    (["--private"], "--private needs --push-to-hub"),
    (["--tries", "0"], "--tries must be at least 1"),
    (["--tries", "101"], "the train task list has 100 tries of A01"),
    (["--max-steps", "0"], "--max-steps must be at least 1 (control steps per try), got 0"),
    (["--first-try", "-1"], "--first-try must be 0 or more (a try index of the task list), got -1"),
    (["--first-try", "99", "--tries", "2"], "the train task list has 100 tries of A01; --first-try 99 --tries 2 "
                                            "(tries 99..100) asks for more"),
    (["--noise", "-1"], "--noise must be a finite number, 0 or more (the std of the noise on each motion component), "
                        "got -1"),
    (["--noise", "0.1", "--model", "random"], "--noise perturbs the scripted reference's actions (DART): it needs "
                                              "--model scripted, not random"),
])
def test_bad_requests_are_one_line(args, message, tmp_path):
    proc = _record("--setups", "A01", "--out", str(tmp_path / "ds"), *args, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and message in line, line
    assert not (tmp_path / "ds" / "meta").exists()


def test_a_folder_that_is_not_a_recording_is_refused(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    proc = _record("--setups", "A01", "--tries", "1", "--out", str(out), timeout=120)
    assert proc.returncode == 2 and "is not a recording of eval.record" in proc.stderr and "notes.txt" in proc.stderr
    assert (out / "notes.txt").read_text() == "keep me"


def test_a_killed_recording_resumes_without_a_torn_episode(tmp_path):
    """Ctrl-C once the first try is recorded: the second, cut off mid-way, is recorded again from its start on
    the rerun; the first is not run again; the dataset holds both, whole. A smoke recording (tries cut at 40
    steps): the staging and the resume are those of whole tries."""
    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "eval.record", "--setups", "A01", "--tries", "2", "--max-steps", "40", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    tries = out / "recording/tries.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if tries.exists() and tries.read_text().count("\n") >= 1:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "rerun the same command to continue" in err, err[-2000:]
    assert tries.read_text().count("\n") == 1
    assert not (out / "meta/info.json").exists()
    from eval.lerobot.episode import read_staged

    # a staged episode is whole or hidden (a try cut off leaves only its .partial folder); the second try may have
    # been staged before its record was appended: it runs again and replaces it
    staged = sorted(p.name for p in (out / "recording/episodes").iterdir() if not p.name.startswith("."))
    assert "A01_try000" in staged
    for name in staged:
        read_staged(out / "recording/episodes" / name)
    first = tries.read_text()
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(x) for x in tries.read_text().splitlines()]
    assert [(r["setup"], r["try"]) for r in records] == [("A01", 0), ("A01", 1)]
    episodes = _table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [(e["try_index"], e["length"]) for e in episodes] == [(r["try"], r["steps"]) for r in records]
    assert tries.read_text().startswith(first)  # try 0 was not run again
    assert all(r["steps"] == 40 and r["max_steps"] == 40 for r in records)
    assert json.loads((out / "meta/recording.json").read_text())["max_steps"] == 40
    assert "every try cut at 40 control steps" in (out / "README.md").read_text()


def test_first_try_records_other_starts_than_the_first(tmp_path):
    """``--first-try 7 --tries 1``: the train list's try 7 of A01 (its seed), named so in the episodes, the
    recording and the card; a smoke recording (10 steps)."""
    from env.tasklist import load

    out = tmp_path / "ds"
    proc = _record("--setups", "A01", "--tries", "1", "--first-try", "7", "--max-steps", "10", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = [json.loads(x) for x in (out / "recording/tries.jsonl").read_text().splitlines()]
    assert (record["setup"], record["try"], record["seed"]) == ("A01", 7, load("train").seed("A01", 7))
    (episode,) = _table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert (episode["try_index"], episode["seed"]) == (7, record["seed"])
    recording = json.loads((out / "meta/recording.json").read_text())
    assert (recording["first_try"], recording["tries_per_setup"]) == (7, 1)
    assert json.loads((out / "recording/run.json").read_text())["request"]["first_try"] == 7
    assert "tries 7 to 7 of each" in (out / "README.md").read_text()


NOISE = 0.1


@pytest.fixture(scope="module")
def noisy_dataset(tmp_path_factory):
    """A smoke recording of the perturbed reference (DART): one try of A01 cut at 20 control steps."""
    out = tmp_path_factory.mktemp("record_noise") / "dart"
    proc = _record("--setups", "A01", "--tries", "1", "--max-steps", "20", "--noise", str(NOISE), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_a_noisy_recording_executes_the_perturbed_reference_and_keeps_its_labels(noisy_dataset):
    """``action`` is what was executed: the label plus the try's seeded noise on the motion components, clipped;
    ``action.expert`` is the label, the reference's own action in labeler mode for the state reached (a fresh
    labeler, told each executed action, replays the try and gives every label again)."""
    from eval.policies.dart import NOISE_SEED_OFFSET

    out = noisy_dataset
    info = json.loads((out / "meta/info.json").read_text())
    feats = info["features"]
    assert feats["action.expert"] == {"dtype": "float32", "shape": [7], "names": feats["action"]["names"]}
    data = _table(out / "data/chunk-000/file-000.parquet")
    assert set(data.column_names) == {k for k, v in feats.items() if v["dtype"] != "video"}
    assert data.schema.field("action.expert").type == pa.list_(pa.float32(), 7)
    cols = data.to_pydict()
    executed = np.array(cols["action"], dtype=np.float32)
    expert = np.array(cols["action.expert"], dtype=np.float32)
    states = np.array(cols["observation.state"], dtype=np.float32)
    assert len(executed) == 20 == info["total_frames"]
    assert np.all(np.abs(executed) <= 1.0) and np.all(np.abs(expert) <= 1.0)
    np.testing.assert_array_equal(executed[:, 6], expert[:, 6])  # the gripper's command is never perturbed
    assert np.all(np.any(executed[:, :6] != expert[:, :6], axis=1))  # every step's motion is
    # the noise is the try's own stream: the executed action is the label plus it, clipped as the controller clips
    (episode,) = _table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    rng = np.random.default_rng(episode["seed"] + NOISE_SEED_OFFSET)
    expected = expert.copy()
    for t in range(len(expected)):
        expected[t, :6] = np.clip(expected[t, :6] + rng.normal(0.0, NOISE, 6), -1.0, 1.0)
    np.testing.assert_array_equal(executed, expected)
    # replayed: the scene reaches each recorded state, and a labeler there gives the recorded label
    from env.setups import get_setup
    from env.tasklist import load
    from eval.policies.scripted import ScriptedPolicy
    from eval.rollout import Scenes

    setup, tl = get_setup("A01"), load("train")
    labeler = ScriptedPolicy(clearance=setup.clearance_m, latency_steps=setup.latency_steps, labeler=True)
    scenes = Scenes(setup, 1, cameras=True, max_steps=20)  # as recorded (rendered only at the start here)
    try:
        scenes.reset([tl.seed("A01", 0)], [tl.start("A01", 0)])
        labeler.reset(scenes.instructions[0])
        for t in range(len(executed)):
            np.testing.assert_allclose(scenes.proprio(0), states[t], rtol=0, atol=1e-6)
            np.testing.assert_array_equal(labeler.act(scenes.observations([0])[0]), expert[t])
            labeler.observe_executed(executed[t])
            scenes.step(executed[t][None], np.ones(1, dtype=bool), np.zeros(1, dtype=bool))
    finally:
        scenes.close()
    stats = json.loads((out / "meta/stats.json").read_text())
    assert set(stats) == set(feats) and stats["action.expert"]["count"] == [20]
    np.testing.assert_allclose(stats["action.expert"]["mean"], expert.astype(np.float64).mean(0), rtol=1e-12)
    recording = json.loads((out / "meta/recording.json").read_text())
    assert recording["model"] == "scripted" and recording["options"]["noise"] == NOISE
    assert json.loads((out / "recording/run.json").read_text())["options"]["noise"] == NOISE
    card = (out / "README.md").read_text()
    assert "`action.expert`" in card and f"std {NOISE:g} per motion component" in card


def test_a_recording_with_another_noise_is_another_recording(noisy_dataset, tmp_path):
    """Refused in one line: the finished dataset uploaded again with another noise, and a recording cut off
    before its dataset was written (its run folder alone) resumed with another (or none)."""
    out = noisy_dataset
    same = ["--setups", "A01", "--tries", "1", "--max-steps", "20"]
    proc = _record(*same, "--noise", "0.2", "--out", str(out), "--push-to-hub", "user/dart-a01", timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: {out} holds a finished dataset of another recording (noise differ); use --fresh to record this "
        f"one, or another --out"]
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(out / "recording", cut / "recording")
    for noise in (["--noise", "0.2"], []):
        proc = _record(*same, *noise, "--out", str(cut), timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"error: {cut / 'recording'} holds a run with other settings") and "'noise'" in line
    assert not (cut / "meta").exists()


LEROBOT_VENV_WAIT_S = 900


def _lerobot_python() -> Path | None:
    """The interpreter of the LeRobot venv (scripts/lerobot_venv.sh), or None. CI builds the venv beside the tests
    and names the file its build's exit status lands in (SAB_LEROBOT_VENV_RC): the test waits for it, and a
    failed build fails the test instead of skipping it."""
    rc_file = os.environ.get("SAB_LEROBOT_VENV_RC")
    if rc_file:
        deadline = time.monotonic() + LEROBOT_VENV_WAIT_S
        while not (Path(rc_file).is_file() and Path(rc_file).read_text().strip()):
            if time.monotonic() > deadline:
                pytest.fail(f"the LeRobot venv's build (scripts/lerobot_venv.sh) did not end in {LEROBOT_VENV_WAIT_S} s")
            time.sleep(2)
        rc = Path(rc_file).read_text().strip()
        if rc != "0":
            pytest.fail(f"the LeRobot venv's build failed (scripts/lerobot_venv.sh exited {rc}; its log is in CI's output)")
    named = os.environ.get("SAB_LEROBOT_PYTHON")
    path = Path(named) if named else REPO_ROOT / "build/venv-py312-lerobot/bin/python"
    stamp = path.parent.parent / ".installed"
    return path if path.is_file() and (named or stamp.is_file()) else None


def test_lerobot_reads_the_dataset_with_its_own_reader(dataset):
    """LeRobot's LeRobotDataset (its own venv) reads every feature of the dataset as eval.record wrote it: the
    rows, the task text, both cameras decoded at the rows' timestamps, action chunks padded at an episode's end."""
    python = _lerobot_python()
    if python is None:
        pytest.skip("no LeRobot venv here (bash scripts/lerobot_venv.sh builds build/venv-py312-lerobot; CI does)")
    av = pytest.importorskip("av")
    out, _ = dataset
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(out.parent / "hf_home")}
    proc = subprocess.run([str(python), str(REPO_ROOT / "tests/lerobot_reader.py"), str(out)], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    read = json.loads(proc.stdout.strip().splitlines()[-1])
    info = json.loads((out / "meta/info.json").read_text())
    data = _table(out / "data/chunk-000/file-000.parquet").to_pydict()
    episodes = _table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert (read["len"], read["num_episodes"], read["fps"]) == (info["total_frames"], info["total_episodes"], FPS)
    assert read["camera_keys"] == ["observation.images.third_person", "observation.images.wrist"]
    assert set(read["stats_keys"]) == set(info["features"])
    decoded = {}
    for key in read["camera_keys"]:  # our own decode of the same files, to compare LeRobot's frames with
        with av.open(str(out / f"videos/{key}/chunk-000/file-000.mp4")) as c:
            decoded[key] = [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]
    for item in read["items"]:
        i = item["index"]
        e = episodes[item["episode_index"]]
        assert (item["episode_index"], item["frame_index"]) == (data["episode_index"][i], data["frame_index"][i])
        assert item["timestamp"] == pytest.approx(data["timestamp"][i], abs=1e-6)
        assert item["task"] == e["tasks"][0]
        np.testing.assert_array_equal(np.float32(item["state"]), np.float32(data["observation.state"][i]))
        np.testing.assert_array_equal(np.float32(item["action"]), np.float32(data["action"][i]))
        left = e["dataset_to_index"] - 1 - i  # steps after this one in its episode
        assert item["action_chunk_shape"] == [3, 7]
        assert item["action_is_pad"] == [False, left < 1, left < 2]
        for key, img in item["images"].items():
            h, w = info["features"][key]["shape"][:2]
            assert img["shape"] == [3, h, w] and img["dtype"] == "torch.float32"
            ours = decoded[key][i].astype(np.float64).mean(axis=(0, 1)) / 255.0
            np.testing.assert_allclose(img["mean_rgb"], ours, atol=2 / 255)  # the same frame, whichever FFmpeg


def test_the_lerobot_venv_script_skips_with_the_reason_where_there_is_no_python_3_12(tmp_path):
    import shutil

    path = "/usr/bin:/bin"
    if shutil.which("python3.12", path=path):
        pytest.skip("this machine has a python3.12 in /usr/bin: the script would build its venv")
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts/lerobot_venv.sh")], env={"PATH": path, "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("lerobot venv: skipped: no Python 3.12 here (LeRobot 0.5+ needs it); the LeRobot "
                                   "reader test will skip")
