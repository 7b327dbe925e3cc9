"""eval.run as researchers use it: parallel workers, kill and resume, watchdog, bad actions, torch on one thread per worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.sim  # builds ManiSkill scenes

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("setup", "try", "seed", "success", "steps", "flags", "blocks_inserted", "disturbance_fired")


def _cmd(*args):
    return [sys.executable, "-m", "eval.run", *args]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "tries.jsonl").read_text().splitlines()]


def _key(recs):
    return sorted(tuple(json.dumps(r[k]) for k in KEYS) for r in recs)


def test_killed_run_resumes_to_the_same_records_as_an_uninterrupted_one(tmp_path):
    # 2 setups x 2 tries on 2 workers: killed once 2 records are written, 1 or 2 tries are left to resume
    common = ["--model", "scripted", "--split", "dev", "--setups", "A01,F03", "--tries", "2"]
    whole = tmp_path / "whole"
    subprocess.run(_cmd(*common, "--out", str(whole)), cwd=ROOT, check=True, capture_output=True, timeout=600)

    cut = tmp_path / "cut"
    proc = subprocess.Popen(_cmd(*common, "--workers", "2", "--out", str(cut)), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if (cut / "tries.jsonl").exists() and len((cut / "tries.jsonl").read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole run, workers included, mid-way
    proc.wait()
    n_before = len(_records(cut))
    assert 2 <= n_before < 4
    subprocess.run(_cmd(*common, "--workers", "2", "--out", str(cut)), cwd=ROOT, check=True,
                   capture_output=True, timeout=600)
    recs = _records(cut)
    assert len(recs) == 4 and len({(r["setup"], r["try"]) for r in recs}) == 4
    assert _key(recs) == _key(_records(whole))
    a = json.loads((whole / "summary.json").read_text())
    b = json.loads((cut / "summary.json").read_text())
    assert a["setups"] == b["setups"] and a["secondary"]["recovery"] == b["secondary"]["recovery"]
    assert (cut / "REPORT.md").exists()


def test_nan_action_stops_the_run_with_one_line_naming_the_try(tmp_path):
    proc = subprocess.run(_cmd("--model", "tests.fault_policies:NaNPolicy", "--setups", "A01", "--out",
                               str(tmp_path / "nan")), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "A01 try 0" in lines[0] and "non-finite" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("policy, flag", [("HangPolicy", "policy_hang"), ("SimHangPolicy", "sim_hang")])
def test_watchdog_flags_a_hung_policy_or_simulator_and_the_run_goes_on(tmp_path, policy, flag):
    out = tmp_path / "hang"
    proc = subprocess.run(_cmd("--model", f"tests.fault_policies:{policy}", "--setups", "A01", "--tries", "2",
                               "--step-timeout", "3", "--out", str(out)),
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-2000:]  # finished, with hung tries
    recs = _records(out)
    assert sorted(r["try"] for r in recs) == [0, 1]
    assert all(r["flags"] == [flag] and not r["success"] for r in recs)
    last = proc.stdout.strip().splitlines()[-1]
    assert f"2 tries did not finish ({flag} 2)" in last, proc.stdout


THREADS_ENV = {"OMP_NUM_THREADS": "2"}  # two threads torch's default here, whatever the machine's core count


@pytest.fixture(scope="module")
def torch_default_threads() -> str:
    """torch's thread count in a fresh process under THREADS_ENV, without the workers' one_torch_thread: asked
    once (a torch import) for both worker counts, which share the environment."""
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           env={**os.environ, **THREADS_ENV}, capture_output=True, text=True, check=True)
    return probe.stdout.strip()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_workers_run_torch_on_one_thread_where_torch_would_take_two(tmp_path, workers, torch_default_threads):
    # torch's OpenMP pool spins on the cores lavapipe and PhysX need (env.one_torch_thread); OMP_NUM_THREADS=2
    # makes two torch's default here whatever the machine's core count, so one thread is the worker's doing
    seen = tmp_path / "threads.txt"
    env = {**os.environ, **THREADS_ENV, "SAB_TEST_TORCH_THREADS_OUT": str(seen)}
    proc = subprocess.run(_cmd("--model", "tests.fault_policies:TorchThreadsPolicy", "--setups", "A01",
                               "--tries", workers, "--workers", workers, "--out", str(tmp_path / "run")),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert seen.read_text().split() == ["1"] * int(workers)
    assert torch_default_threads == "2"  # what the workers would have had without it
