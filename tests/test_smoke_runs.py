"""eval.run --max-steps N: a smoke run whose tries stop after N control steps, through the real command line. Its
records, run.json, summary, REPORT.md and last line say so; it is its own run (a folder of a run with another
cap, or none, refuses it); a bad N is one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eval.records import max_steps_label, record_problem
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.sim  # builds a state scene

LABEL = max_steps_label(5)


def _run(*args: str, module: str = "eval.run") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, "--model", "scripted", "--setups", "A01", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "run"
    proc = _run("--tries", "2", "--max-steps", "5", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc


def test_every_try_stops_at_the_cap_and_every_file_says_so(smoke):
    out, proc = smoke
    records = [json.loads(x) for x in (out / "tries.jsonl").read_text().splitlines()]
    assert [(r["try"], r["steps"], r["max_steps"]) for r in records] == [(0, 5, 5), (1, 5, 5)]
    assert all(record_problem(r) is None for r in records)
    assert json.loads((out / "run.json").read_text())["options"] == {"max_steps": 5}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["max_steps"] == 5
    report = (out / "REPORT.md").read_text()
    assert f"**scripted: {LABEL}**" in report and "no (tries cut at 5 steps: a smoke run)" in report
    assert f"scripted: {LABEL}" in proc.stderr  # said as the run starts
    assert f"scripted ({LABEL}) on dev" in proc.stdout.strip().splitlines()[-1]


def test_a_run_with_another_cap_or_none_is_another_run(smoke, tmp_path):
    out, _ = smoke
    for other in (["--max-steps", "6"], []):
        proc = _run("--tries", "2", *other, "--out", str(out))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
        assert str(out) in line and "--fresh" in line, line
    assert len((out / "tries.jsonl").read_text().splitlines()) == 2  # nothing added, nothing lost


@pytest.mark.parametrize("module,value", [("eval.run", "0"), ("eval.run", "-3"), ("eval.orin", "0")])
def test_a_cap_below_one_step_is_one_line(module, value, tmp_path):
    proc = _run("--max-steps", value, "--out", str(tmp_path / "run"), module=module)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]  # (eval.orin names the device first)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert errors == [f"error: --max-steps must be at least 1 (control steps per try), got {value}"], proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_record_whose_cap_is_not_a_step_count_is_named():
    assert "max_steps" in record_problem({"setup": "A01", "try": 0, "success": False, "max_steps": "5"})
    assert "max_steps" in record_problem({"setup": "A01", "try": 0, "success": False, "max_steps": 0})
