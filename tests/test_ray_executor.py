"""eval.run --executor ray on a small local Ray instance: same report as the local executor, resume and
dedup, a dead actor's try retried once then flagged actor_died, a hung try flagged sim_hang.

One Ray instance for the module (starting Ray takes about 10 s); each run is ``python -m eval.run`` as a
user types it, connected to that instance with ``--address``. The fault policies below are loaded by the
actors as ``tests.test_ray_executor:FaultPolicy``: they find their attempt log through ``SAB_FAULT_DIR``,
set before Ray starts so that every Ray worker inherits it.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from eval.policies.base import Policy

pytestmark = pytest.mark.sim  # builds ManiSkill scenes

ROOT = Path(__file__).resolve().parents[1]
FAULT_DIR_ENV = "SAB_FAULT_DIR"
KEYS = ("setup", "try", "seed", "success", "steps", "flags", "blocks_inserted", "disturbance_fired", "target")
COMMON = ["--model", "scripted", "--split", "dev", "--setups", "A01", "--tries", "2"]
# summary fields that measure time or name the machine/run, not the outcome of the tries
TIMING_KEYS = {"run", "machine", "source", "latency_ms", "step_ms", "warmup_ms"}

# dev split seeds of A01 tries 0, 1, 2 (the fault policy tells tries apart by the seed reset gives it)
SEED_DIES_ALWAYS, SEED_DIES_ONCE, SEED_HANGS = 20000000, 20000001, 20000002


class FaultPolicy(Policy):
    """The scripted controller, except: try 0 kills its process at every attempt, try 1 only at its first
    attempt, try 2 hangs at its third query. Every attempt is logged to $SAB_FAULT_DIR/attempts."""

    name = "fault-test"
    track = "sanity"

    def __init__(self):
        super().__init__()
        from env.setups import get_setup
        from eval.policies.scripted import ScriptedPolicy

        self.inner = ScriptedPolicy(clearance=get_setup("A01").clearance_m, latency_steps=get_setup("A01").latency_steps)
        self.log = Path(os.environ[FAULT_DIR_ENV]) / "attempts"

    def reset(self, instruction, seed=None):
        self.seed, self.n = seed, 0
        earlier = self.log.read_text().split().count(str(seed)) if self.log.exists() else 0
        self.die = seed == SEED_DIES_ALWAYS or (seed == SEED_DIES_ONCE and earlier == 0)
        with open(self.log, "a") as f:
            f.write(f"{seed}\n")
        self.inner.reset(instruction, seed=seed)

    def act(self, observation):
        self.n += 1
        if self.n >= 3 and self.die:
            os._exit(17)  # as a segfault or an OOM kill would end the actor's process
        if self.n >= 3 and self.seed == SEED_HANGS:
            time.sleep(3600)
        return np.asarray(self.inner.act(observation), np.float32)


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory):
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[ray]'")
    fault_dir = tmp_path_factory.mktemp("faults")
    old = os.environ.get(FAULT_DIR_ENV)
    os.environ[FAULT_DIR_ENV] = str(fault_dir)  # the raylet, and so every Ray worker, inherits it
    ctx = ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 1024 ** 2,
                   logging_level="WARNING", log_to_driver=False)
    try:
        yield ctx.address_info["gcs_address"], fault_dir
    finally:
        ray.shutdown()
        if old is None:
            os.environ.pop(FAULT_DIR_ENV, None)
        else:
            os.environ[FAULT_DIR_ENV] = old


def _run(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "eval.run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "tries.jsonl").read_text().splitlines()]


def _key(recs):
    return sorted(tuple(json.dumps(r.get(k)) for k in KEYS) for r in recs)


def _outcome(summary):
    """The summary without the fields that time things or name the machine, run or source file."""
    if isinstance(summary, dict):
        return {k: _outcome(v) for k, v in summary.items() if k not in TIMING_KEYS and "wall" not in k}
    if isinstance(summary, list):
        return [_outcome(v) for v in summary]
    return summary


def _csv(path: Path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "run"
    _run(*COMMON, "--out", str(out))
    return out


def test_ray_report_is_identical_to_the_local_one(ray_address, local_run, tmp_path):
    address, _ = ray_address
    out = tmp_path / "ray"
    _run(*COMMON, "--workers", "2", "--executor", "ray", "--address", address, "--out", str(out))
    assert _key(_records(out)) == _key(_records(local_run))
    assert _csv(out / "per_config.csv") == _csv(local_run / "per_config.csv")
    a = json.loads((local_run / "summary.json").read_text())
    b = json.loads((out / "summary.json").read_text())
    assert b["run"]["executor"] == "ray" and a["run"]["executor"] == "local"
    assert _outcome(a) == _outcome(b)


def test_ray_run_resumes_and_does_not_repeat_tries(ray_address, local_run, tmp_path):
    # a folder holding try 0 (from the local run) and a torn line: the Ray run adds try 1 only
    address, _ = ray_address
    out = tmp_path / "resume"
    out.mkdir()
    shutil.copy(local_run / "run.json", out / "run.json")
    first = (local_run / "tries.jsonl").read_text().splitlines()[0]
    (out / "tries.jsonl").write_text(first + "\n" + '{"setup": "A01", "tr')
    _run(*COMMON, "--executor", "ray", "--address", address, "--out", str(out))
    recs = _records(out)
    assert sorted((r["setup"], r["try"]) for r in recs) == [("A01", 0), ("A01", 1)]
    assert _key(recs) == _key(_records(local_run))
    _run(*COMMON, "--executor", "ray", "--address", address, "--out", str(out))  # nothing left to run
    assert len(_records(out)) == 2


def test_dead_actor_retried_once_then_flagged_and_hang_flagged(ray_address, local_run, tmp_path):
    address, fault_dir = ray_address
    out = tmp_path / "faults"
    # one actor at a time: try 2 then runs on the actor that finished try 1's retry, its scene already built
    # (with two, a fifth actor would build a scene for it); every death still needs a fresh actor
    proc = _run("--model", "tests.test_ray_executor:FaultPolicy", "--split", "dev", "--setups", "A01", "--tries",
                "3", "--workers", "1", "--step-timeout", "3", "--executor", "ray", "--address", address,
                "--out", str(out), check=False)
    assert proc.returncode == 3, proc.stderr[-3000:]  # finished, but with tries that did not finish
    assert "Traceback" not in proc.stderr
    recs = {r["try"]: r for r in _records(out)}
    assert sorted(recs) == [0, 1, 2]
    assert recs[0]["flags"] == ["actor_died"] and not recs[0]["success"]  # died at both attempts
    assert recs[2]["flags"] == ["policy_hang"] and not recs[2]["success"]  # the watchdog, not a retry
    # died at its first attempt, the retry on a fresh actor is the scripted try itself
    local = {r["try"]: r for r in _records(local_run)}
    assert _key([recs[1]]) == _key([local[1]])
    attempts = (fault_dir / "attempts").read_text().split()
    assert attempts.count(str(SEED_DIES_ALWAYS)) == 2 and attempts.count(str(SEED_DIES_ONCE)) == 2
    assert attempts.count(str(SEED_HANGS)) == 1
    summary = json.loads((out / "summary.json").read_text())
    flags = summary["setups"]["A01"]["flags"]
    assert flags.get("actor_died") == 1 and flags.get("policy_hang") == 1
    assert "2 tries did not finish (policy_hang 1, actor_died 1)" in proc.stdout.strip().splitlines()[-1]


def test_missing_ray_is_one_line_naming_the_extra(tmp_path):
    # runs whether or not ray is installed: the import is blocked as if it were absent
    code = ("import sys; sys.modules['ray'] = None; from eval.run import main; "
            f"sys.exit(main(['--model', 'scripted', '--executor', 'ray', '--out', {str(tmp_path / 'x')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "ray is not installed" in lines[0] and ".[ray]" in lines[0], proc.stderr


def test_ray_only_options_need_the_ray_executor(tmp_path):
    proc = _run("--model", "scripted", "--address", "auto", "--out", str(tmp_path / "x"), check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--executor ray" in lines[0], proc.stderr
