"""eval.orin on a CPU machine: device defaults, the latency section, telemetry stated as unavailable; and the
latency replay that applies a measured latency distribution as action delay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from eval.latency_replay import LatencyProfileError, ReplayLatencyPolicy, load_profile
from eval.policies.base import Policy

pytestmark = pytest.mark.sim  # builds ManiSkill scenes

ROOT = Path(__file__).resolve().parents[1]


class _Counter(Policy):
    """Action k at its k-th query (x component), gripper -1."""

    def reset(self, instruction, seed=None):
        self.k = 0

    def act(self, observation):
        self.k += 1
        return np.array([self.k, 0, 0, 0, 0, 0, -1], dtype=np.float32)


def test_replayed_latency_delays_actions_to_the_next_control_steps():
    # 120 ms: ready during the third 50 ms period, so each action reaches the arm two steps late
    policy = ReplayLatencyPolicy(_Counter(), np.array([120.0]))
    policy.reset("x", seed=1)
    got = [policy.query({}) for _ in range(5)]
    assert [a[0] for a in got] == [0, 0, 1, 2, 3]
    assert got[0][6] == 1  # nothing arrived yet: hold, gripper open
    fast = ReplayLatencyPolicy(_Counter(), np.array([10.0]))
    fast.reset("x", seed=1)
    assert [fast.query({})[0] for _ in range(3)] == [1, 2, 3]


def test_replay_holds_still_between_arrivals_and_draws_reproducibly(tmp_path):
    policy = ReplayLatencyPolicy(_Counter(), np.array([10.0, 160.0]))
    runs = []
    for _ in range(2):
        policy.reset("x", seed=7)
        runs.append([policy.query({}).tolist() for _ in range(12)])
        assert all(d in (0, 3) for d in policy.delays)
    assert runs[0] == runs[1]
    prof = tmp_path / "tries.jsonl"
    prof.write_text(json.dumps({"setup": "A01", "try": 0, "success": False, "infer_ms": [1.5, 2.5]}) + "\n")
    assert load_profile(prof).tolist() == [1.5, 2.5]
    bad = tmp_path / "bad.json"
    bad.write_text('{"p50": 3}')
    for path, needle in ((bad, "JSON list"), (tmp_path / "none.jsonl", "does not exist")):
        with pytest.raises(LatencyProfileError, match=needle):
            load_profile(path)


def _orin(*args):
    return subprocess.run([sys.executable, "-m", "eval.orin", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_orin_on_cpu_writes_the_latency_section(tmp_path):
    out = tmp_path / "orin"
    profile = tmp_path / "profile.json"
    profile.write_text("[70.0]")  # one step of delay on every action
    proc = _orin("--model", "scripted", "--split", "dev", "--setups", "A01", "--tries", "1", "--out", str(out),
                 "--replay-latency", str(profile))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "run.json").read_text())["options"]["replay_latency"] == str(profile.resolve())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["device"]["kind"] == "cpu" and summary["device"]["cpu"]
    assert summary["telemetry"]["available"] is False
    assert summary["telemetry"]["reason"].startswith("telemetry unavailable")
    lat = summary["secondary"]["latency_ms"]
    assert lat["p50"] is not None and lat["p99"] >= lat["p50"]
    steps = summary["secondary"]["step_ms"]
    assert steps["physics"] > 0 and steps["inference"] > 0
    report = (out / "REPORT.md").read_text()
    assert "## Latency profile" in report and "telemetry unavailable" in report
    assert (out / "latency.png").stat().st_size > 0


@pytest.mark.parametrize("args,needle", [
    (("--num-envs", "4", "--sim", "gpu"), "GPU"),
    (("--model", "octo-small", "--random-weights", "--num-envs", "4", "--sim", "gpu"), "needs GPU simulation"),
    (("--replay-latency", "/nonexistent/profile.jsonl"), "does not exist"),
])
def test_orin_bad_input_is_one_line(tmp_path, args, needle):
    proc = _orin("--model", "scripted", *args, "--out", str(tmp_path / "x"))
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and needle in errors[0], proc.stderr[-1000:]


def test_the_headline_command_names_only_the_model(monkeypatch, capsys):
    """`python -m eval.orin --model octo-small` parses as written (the mission's headline): the run folder is the
    model's own under runs/orin; eval.run keeps --out required."""
    from eval import orin, run as eval_run

    seen = {}

    def fake_run(args, **kw):
        seen["out"] = args.out
        return eval_run.RunOutcome(2)

    monkeypatch.setattr(eval_run, "run", fake_run)
    orin.main(["--model", "octo-small"])
    assert seen["out"] == "runs/orin/octo-small" and "run folder: runs/orin/octo-small" in capsys.readouterr().err
    assert orin.default_out("my_pkg.policies:MyPolicy") == "runs/orin/MyPolicy"
    with pytest.raises(SystemExit):
        eval_run.build_parser().parse_args(["--model", "octo-small"])
