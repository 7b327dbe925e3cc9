"""The one rollout loop (eval.rollout): scenes batched give the records of one scene at a time, for a camera
policy and a state policy; frames reach a policy as a renderer rendering every step gives them; the
per-step stage times add up; --video writes a playable mp4 of the try's length; --num-envs runs Octo."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from env.setups import get_setup
from eval.policies.base import Policy
from eval.rollout import STAGES, Scenes, make_members, rollout, run_try
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.sim  # builds ManiSkill scenes

TIMING = {"wall_s", "infer_ms", "infer_ms_mean", "infer_ms_p99", "warmup_ms", "step_ms", "machine", "num_envs"}


def _outcomes(records):
    return [{k: v for k, v in r.to_json().items() if k not in TIMING} for r in records]


def _one_at_a_time_and_batched(setup_id, tries, factory, cameras, max_steps, num_envs=2):
    setup = get_setup(setup_id)
    one = Scenes(setup, 1, cameras=cameras, max_steps=max_steps)
    try:
        policy = factory()
        single = [run_try(one, policy, "dev", t) for t in tries]
    finally:
        one.close()
    scenes = Scenes(setup, num_envs, cameras=cameras, max_steps=max_steps)
    try:
        members = make_members(factory(), num_envs, factory)
        batched, batch = rollout(scenes, members, "dev", tries)
    finally:
        scenes.close()
    return single, batched, batch


def test_camera_policy_batched_gives_the_records_of_one_scene_at_a_time():
    pytest.importorskip("jax")
    from engines.octo.testing import tiny_octo
    from eval.request import make_policy

    engine = tiny_octo(seed=3)
    single, batched, batch = _one_at_a_time_and_batched(
        "A01", [0, 1], lambda: make_policy("octo-small", engine=engine), cameras=True, max_steps=10)
    assert _outcomes(single) == _outcomes(batched)
    assert [r.steps for r in single] == [10, 10]
    # queries at steps 0, 4, 8: one model call for both scenes each time
    assert [r.infer_queries for r in single] == [3, 3]
    assert len(batch["warmup_ms"]) + len(batch["query_ms"]) == 3 and all(b == 2 for b in batch["query_batch"])
    assert batch["batched_queries"] and batch["image_bytes_per_step"] == 0
    assert all(r.step_ms["render"] > 0 for r in batched)


def test_state_policy_batched_gives_the_records_of_one_scene_at_a_time():
    from eval.request import make_policy

    single, batched, batch = _one_at_a_time_and_batched("A02", [0, 1, 2], lambda: make_policy("bc-state"), cameras=False,
                                                        max_steps=None, num_envs=3)
    assert _outcomes(single) == _outcomes(batched)
    assert batch["batched_queries"] and batch["steps"] == max(r.steps for r in batched)


class FrameProbe(Policy):
    """A camera policy that keeps the frames it reads and moves the arm, reading every step or only the
    frames of a window of 2 before each chunk of 4 (as Octo does)."""

    name = "frame-probe"
    observes = "cameras"

    def __init__(self, every_step: bool):
        super().__init__()
        self.every_step = every_step

    def reset(self, instruction, seed=None):
        self.step, self.frames = 0, {}

    def reads_observation(self, step):
        return self.every_step or (-step) % 4 < 2

    def act(self, observation):
        if observation["images"] is not None:
            self.frames[self.step] = {k: v.copy() for k, v in observation["images"].items()}
        else:
            assert not self.reads_observation(self.step)
        self.step += 1
        return np.array([0.3, -0.2, -0.4, 0.1, 0, 0.2, 1 if self.step < 6 else -1], np.float32)


def test_frames_read_are_those_of_rendering_every_step(monkeypatch):
    from mani_skill.envs.sapien_env import BaseEnv

    setup = get_setup("A01")
    scenes = Scenes(setup, 1, cameras=True, max_steps=12)
    renders: list[int] = []  # the scene's renders (both cameras) from here on, counted where ManiSkill renders
    render = BaseEnv._get_obs_sensor_data
    monkeypatch.setattr(BaseEnv, "_get_obs_sensor_data", lambda self, *a, **k: (renders.append(1), render(self, *a, **k))[1])
    try:
        every, window = FrameProbe(every_step=True), FrameProbe(every_step=False)
        rec_every = run_try(scenes, every, "dev", 0)
        renders_every, renders[:] = len(renders), []
        rec_window = run_try(scenes, window, "dev", 0)
        renders_window = len(renders)
    finally:
        scenes.close()
    assert sorted(window.frames) == [0, 3, 4, 7, 8, 11] and len(every.frames) == 12
    for step, frames in window.frames.items():
        for cam in ("third_person", "wrist"):
            assert frames[cam].tobytes() == every.frames[step][cam].tobytes(), (step, cam)
    assert len({every.frames[s]["third_person"].tobytes() for s in (0, 6, 11)}) == 3  # the arm moved
    # only the steps read are rendered (counted, not timed: times on a shared machine say nothing): each frame
    # read, and the observation after the last step (step 12: every step's, and in the window's reach)
    assert (renders_every, renders_window) == (len(every.frames) + 1, len(window.frames) + 1) == (13, 7)
    assert rec_window.step_ms["render"] > 0 and rec_every.step_ms["render"] > 0


def test_step_stages_add_up_to_the_try():
    from eval.policies.scripted import ScriptedPolicy

    setup = get_setup("A01")
    for cameras in (False, True):
        scenes = Scenes(setup, 1, cameras=cameras, max_steps=20)
        try:
            rec = run_try(scenes, ScriptedPolicy(clearance=setup.clearance_m), "dev", 0)
        finally:
            scenes.close()
        ms = rec.step_ms
        assert set(ms) == set(STAGES) and all(v >= 0 for v in ms.values())
        total = sum(ms.values())
        # the stages are the loop's own time per step: together they are the try's wall time, bar the
        # bookkeeping after the last step's stages are summed
        assert total <= rec.wall_s * 1e3 + 1.0 and total >= 0.97 * rec.wall_s * 1e3, (total, rec.wall_s)
        assert rec.steps == 20 and rec.infer_queries == 20 and len(rec.infer_ms) + len(rec.warmup_ms) == 20
        assert (ms["render"] > 0) == cameras  # state scenes render nothing
        assert ms["physics"] > 0 and ms["inference"] > 0


def test_video_is_a_playable_mp4_of_the_try(tmp_path):
    """One frame per control step, both cameras side by side under the step's text; the try cut at 20 steps
    (--max-steps): the frames of a whole try are the same code, 110 steps more."""
    imageio = pytest.importorskip("imageio.v2")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "eval.run", "--model", "scripted", "--setups", "A01", "--tries", "1",
                           "--video", "1", "--max-steps", "20", "--out", str(out)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = json.loads((out / "tries.jsonl").read_text().splitlines()[0])
    video = out / "videos" / "A01_try000.mp4"
    reader = imageio.get_reader(str(video))
    frames = [f for f in reader]
    reader.close()
    assert len(frames) == rec["steps"] == 20 and frames[0].shape == (300, 512, 3)
    assert np.abs(frames[-1].astype(float) - frames[0]).mean() > 1  # the arm moved between the first and last


@pytest.mark.slow
def test_octo_runs_batched_end_to_end(tmp_path):
    """eval.run --num-envs 2 on Octo through the real command line: one batched query per chunk. The tiny Octo in
    the released layout (``--model octo --checkpoint``, its t5 tokenizer beside it) stands in for octo-small:
    the batching is the same code, and a query costs milliseconds instead of half a second. The tries are cut at
    14 steps (--max-steps): four chunks, the last one cut short, say as much of the batching as 300 steps."""
    pytest.importorskip("jax")
    pytest.importorskip("sentencepiece", reason="the tiny t5 tokenizer is trained with sentencepiece")
    import os

    from engines.octo import checkpoint as ckpt
    from engines.octo.params import init_params
    from engines.octo.testing import tiny_config, tiny_statistics, train_spiece

    cfg = tiny_config()
    checkpoint = ckpt.save(tmp_path / "octo-tiny", cfg, init_params(cfg, seed=2), tiny_statistics())
    train_spiece(checkpoint / "t5-base")
    out = tmp_path / "octo"
    cmd = [sys.executable, "-m", "eval.run", "--model", "octo", "--checkpoint", str(checkpoint), "--setups", "A01",
           "--tries", "2", "--num-envs", "2", "--sim", "cpu", "--max-steps", "14", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200,
                          env=dict(os.environ, OCTO_T5_TOKENIZER=str(checkpoint / "t5-base")))
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(x) for x in (out / "tries.jsonl").read_text().splitlines()]
    assert sorted(r["try"] for r in records) == [0, 1] and all(r["num_envs"] == 2 for r in records)
    assert [r["steps"] for r in records] == [14, 14] and all(r["max_steps"] == 14 for r in records)
    steps = records[0]["steps"]
    assert all(r["infer_queries"] == -(-r["steps"] // 4) for r in records)  # one query per chunk of 4
    (batch,) = [json.loads(x) for x in (out / "batches.jsonl").read_text().splitlines()]
    assert batch["batched_queries"] and set(batch["query_batch"]) <= {1, 2} and batch["image_bytes_per_step"] == 0
    assert len(batch["query_ms"]) + len(batch["warmup_ms"]) == -(-max(r["steps"] for r in records) // 4)
    assert steps > 0 and "Scenes stepped together" in (out / "REPORT.md").read_text()


def test_each_policy_is_given_its_tries_start_before_reset():
    """The rollout hands every policy its try's start (Policy.set_start) before reset: what a goal image is
    rendered from; a wrapper (latency replay) passes it on and keeps the inner policy's record fields."""
    from env.tasklist import load
    from eval.latency_replay import ReplayLatencyPolicy
    from eval.policies.sanity import HoldPolicy

    class Seen(HoldPolicy):
        def __init__(self):
            super().__init__()
            self.calls = []

        def set_start(self, start):
            self.calls.append(("start", start))

        def reset(self, instruction, seed=None):
            super().reset(instruction, seed)
            if hasattr(self, "calls"):
                self.calls.append(("reset", seed))

        def record_fields(self):
            return {"seen": len(self.calls)}

    setup = get_setup("A01")
    inner = Seen()
    wrapped = ReplayLatencyPolicy(inner, np.array([1.0]))
    scenes = Scenes(setup, 1, cameras=False, max_steps=3)
    try:
        rec = run_try(scenes, wrapped, "dev", 2)
    finally:
        scenes.close()
    tl = load("dev")
    assert inner.calls[-2:] == [("start", tl.start("A01", 2)), ("reset", tl.seed("A01", 2))]
    assert rec.policy_fields == {"seen": len(inner.calls)}
