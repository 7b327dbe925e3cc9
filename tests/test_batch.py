"""Scenes stepped together (eval.rollout): the batched loop on CPU scenes gives the tries that one scene at a time
gives, batchable policies answer a batch as they answer one scene, and bad requests are one line.
The GPU physics path runs only where CUDA is available (skipped here with the reason)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from eval.policies.base import query_members
from eval.rollout import BatchError, check_batch_request, gpu_sim_unavailable_reason
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.sim  # builds ManiSkill scenes


def test_batched_loop_on_cpu_matches_one_scene_at_a_time():
    from benchmarks.gpu_physics_check import compare_setup

    # three tries in batches of two: a full batch and one with a spare scene
    row = compare_setup("A01", [0, 1, 2], num_envs=2, sim="cpu")
    assert row["tries"] == 3 and row["tries_differing"] == []
    assert row["cpu_success"] == row["batch_success"] == 3 and row["difference_pp"] == 0


def test_bc_state_batch_query_equals_single_queries():
    from env import make_env
    from eval.request import make_policy

    env = make_env("A01", obs_mode="state")
    try:
        env.reset(seed=0)
        state = {k: v[0] for k, v in env.unwrapped.task_state().items()}
    finally:
        env.close()
    lead = make_policy("bc-state")
    members = [lead, lead.spawn(), lead.spawn()]
    assert all(m.runner is lead.runner for m in members)  # one engine for the batch
    # give the members different histories, so that their rows differ
    for i, m in enumerate(members):
        m.history.update(np.array([0, 0, 0.1 * i, 0, 0, 0, -1 if i else 1], np.float32))
    singles = [make_policy("bc-state") for _ in members]
    for s, m in zip(singles, members):
        s.history.last, s.history.hold = m.history.last.copy(), m.history.hold
    obs = {"state": state, "instruction": "x"}
    actions, stage, ran = query_members(members, [obs] * 3)
    assert ran == [True] * 3
    expected = np.stack([s.act(obs) for s in singles])
    assert actions.shape == (3, 7) and set(stage) >= {"preprocess", "inference", "postprocess"}
    np.testing.assert_allclose(actions, expected, atol=1e-6)
    assert not np.allclose(actions[0], actions[2])
    for s, m in zip(singles, members):  # each member's history advanced with its own action
        np.testing.assert_array_equal(s.history.last, m.history.last)


@pytest.mark.parametrize("args,needle", [
    ((0, "cpu", "state"), "at least 1"),
    ((2, "tpu", "state"), "valid: cpu, gpu"),
])
def test_bad_batch_requests(args, needle):
    with pytest.raises(BatchError, match=needle):
        check_batch_request(*args)


@pytest.mark.skipif(gpu_sim_unavailable_reason() is None, reason="this machine has CUDA")
def test_gpu_request_without_cuda_names_the_reason():
    for observes in ("state", "cameras"):
        with pytest.raises(BatchError, match="--sim cpu"):
            check_batch_request(4, "gpu", observes)


def test_run_cli_batched_resumes_and_reports(tmp_path):
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    from engines.bc_mlp import DEFAULT_WEIGHTS
    from eval.policies.bc_state import weights_sha256

    # the shipped weights, copied to a file of the test's own: the same run is resumed (same weights), then
    # refused once that file is retrained in place (below); one batched run serves both, no second run is built
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(DEFAULT_WEIGHTS.read_bytes())
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "eval.run", "--model", "bc-state", "--checkpoint", str(weights), "--setups", "A01",
           "--tries", "3", "--num-envs", "2", "--sim", "cpu", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(x) for x in (out / "tries.jsonl").read_text().splitlines()]
    assert sorted(r["try"] for r in records) == [0, 1, 2] and all(r["num_envs"] == 2 for r in records)
    batches = [json.loads(x) for x in (out / "batches.jsonl").read_text().splitlines()]
    assert [b["tries"] for b in batches] == [[0, 1], [2]] and all(b["batched_queries"] for b in batches)
    summary = json.loads((out / "summary.json").read_text())
    b = summary["batch"]
    assert b["tries"] == 3 and b["query_ms"]["p50"] > 0 and b["tries_per_s"] > 0
    assert b["image_bytes_per_step"] == 0
    assert "Scenes stepped together" in (out / "REPORT.md").read_text()
    again = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and len((out / "tries.jsonl").read_text().splitlines()) == 3

    # the run names its weights; resuming it with other weights would mix two policies' tries
    sha = weights_sha256()
    assert json.loads((out / "run.json").read_text())["weights_sha256"] == sha
    assert {r["weights_sha256"] for r in records} == {sha}
    assert f"Weights (bc-state): sha256 {sha}" in (out / "REPORT.md").read_text()
    with safe_open(str(DEFAULT_WEIGHTS), "np") as f:  # retrained in place: the same path, other bytes
        meta = dict(f.metadata(), note="retrained")
    save_file(load_file(str(DEFAULT_WEIGHTS)), str(weights), metadata=meta)
    mixed = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert mixed.returncode != 0 and "weights_sha256" in mixed.stderr and "checkpoint" not in mixed.stderr
    assert len(mixed.stderr.strip().splitlines()) == 1


@pytest.mark.gpu
@pytest.mark.skipif(gpu_sim_unavailable_reason() is not None,
                    reason=f"GPU simulation unavailable: {gpu_sim_unavailable_reason()}")
def test_gpu_scenes_run_a_batch():
    from benchmarks.gpu_physics_check import compare_setup

    row = compare_setup("A01", [0, 1, 2, 3], num_envs=4, sim="gpu")
    # GPU physics may differ from CPU (that is what the benchmark measures), but every try must run and the
    # reference must insert on the nominal setup at least once
    assert row["tries"] == 4 and row["batch_mean_steps"] > 0 and row["batch_success"] >= 1


def test_gpu_camera_batches_refuse_setups_with_colours_per_try(monkeypatch):
    """The rendered sub-scenes of one GPU simulation share their materials: a camera batch of a setup that
    draws colours per try is refused in one line before anything is built (state batches have no renderer)."""
    import eval.rollout as rollout_module
    from env.setups import get_setup

    monkeypatch.setattr(rollout_module, "gpu_sim_unavailable_reason", lambda: None)  # as on a GPU machine
    with pytest.raises(BatchError, match="setups D03, D04 draw colours per try") as e:
        check_batch_request(4, "gpu", "cameras", [get_setup(s) for s in ("A01", "D03", "D04")])
    assert "\n" not in str(e.value) and "--sim cpu" in str(e.value)
    check_batch_request(4, "gpu", "cameras", [get_setup("A01"), get_setup("D02")])
    check_batch_request(4, "gpu", "state", [get_setup("D03")])
