"""The benchmarks run: each in --quick mode into a temporary folder, its JSON has the fields the results
README (results/README.md) reads. No timing is asserted (quick numbers mean nothing, and this machine is shared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sim, pytest.mark.slow]  # runs the benchmarks (scenes, models) in quick mode

ROOT = Path(__file__).resolve().parents[1]


def _bench(name: str, out: Path, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--quick", "--no-progress", "--out-dir",
                           str(out), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / f"{name}.quick.json").read_text())
    assert doc["benchmark"] == name and doc["quick"] is True
    assert doc["command"].startswith(f"python -m benchmarks.{name} --quick")
    m = doc["machine"]
    for key in ("cpu", "cores", "os", "python", "usable_cores", "load_average_start", "load_average_end"):
        assert key in m, key
    return doc["results"]


def test_sim_throughput_quick(tmp_path):
    r = _bench("sim_throughput", tmp_path)
    for label in ("state", "cameras"):
        s = r["steps"][label]
        for key in ("steps", "bare_steps_per_s", "runner_steps_per_s", "harness_overhead_pct",
                    "runner_profile_ms_per_step"):
            assert key in s, (label, key)
        assert s["steps"] > 0 and s["bare_steps_per_s"] > 0 and s["runner_steps_per_s"] > 0
    w = r["workers"]
    assert [x["workers"] for x in w["runs"]] == [1, 2]
    assert all(x["tries"] == 2 and x["hangs"] == 0 and x["tries_per_s"] > 0 for x in w["runs"])
    assert w["speedup_2_vs_1"] > 0
    assert r["targets"] == {"harness_overhead_pct_max": 10.0, "speedup_2_vs_1_min": 1.8}


def test_inference_quick(tmp_path):
    r = _bench("inference", tmp_path)
    rows = {(x["model"], x["backend"], x["level"], x["batch"]): x for x in r["rows"]}
    assert ("scripted", "python", "policy", 1) in rows
    for row in r["rows"]:
        for key in ("n", "mean_ms", "p50_ms", "p99_ms", "per_sample_mean_ms", "threads"):
            assert key in row
        assert row["n"] > 0 and row["mean_ms"] > 0
    # bc-state runs on both backends, or each missing backend says why
    for backend in ("ort", "torch"):
        ran = ("bc-state", backend, "model", r["batch"]) in rows
        assert ran or any(s["model"] == "bc-state" and s["backend"] == backend and s["reason"] for s in r["skipped"])
    for ratio in r["ratios"]:
        assert ratio["mean_ratio"] > 0 and ratio["vs"] != ratio["backend"]


def test_octo_rollout_quick(tmp_path):
    pytest.importorskip("jax")
    r = _bench("octo_rollout", tmp_path)
    rows = {(x["backend"], x["num_envs"], x["every_step_rendered"]) for x in r["rows"]}
    assert {("jax", 1, True), ("jax", 1, False), ("jax", 2, False)} <= rows
    backends = sorted({x["backend"] for x in r["rows"]})
    default = r["rows"][-len(backends):]  # last, one per backend: torch on its default threads beside the rollout's 1
    assert sorted(x["backend"] for x in default) == backends and all(x["num_envs"] == 1 for x in default)
    assert [x["torch_threads"] for x in default] == [os.cpu_count() or 1] * len(backends)
    assert all(x["torch_threads"] == 1 for x in r["rows"][:-len(backends)])
    for row in r["rows"]:
        assert set(row["share"]) == {"render", "inference", "physics", "other"}
        assert abs(sum(row["share"].values()) - 1) < 0.01 and row["wall_per_inference"] >= 1
        assert row["steps_per_try"] == [12] * row["num_envs"] and row["queries"] == 3
    assert r["jax_n2_vs_one_tries_per_hour"] > 0


def test_eval_walltime_quick(tmp_path):
    r = _bench("eval_walltime", tmp_path)
    assert r["n_tries"] == 1 and r["successes"] == 1 and r["wall_s"] > 0 and r["tries_per_s"] > 0
    assert r["eval_run_command"].startswith("python -m eval.run --model scripted --split test")


def test_render_cost_quick(tmp_path):
    r = _bench("render_cost", tmp_path)
    f = r["frames"]
    assert f["per_frame"] and {"third_person", "wrist"} == set(f["summary"])
    for row in f["per_frame"]:
        for cam in ("third_person", "wrist"):
            assert 0 <= row[cam]["changed_share"] <= 1 and row[cam]["mean_abs"] >= 0
    lod = r["lod"]
    assert lod["levels"] and lod["source"]["triangles"] > lod["levels"][0]["triangles"] > 0
    c = r["cost"]
    assert c["steps"] == 3 and set(c["ms_per_step"]) >= {"physics", "render_both_v2", "render_floor_all_hidden"}
    assert set(c["v1_vs_v2"]["ms_per_step"]) >= {"render_both_v1", "render_both_v2"} and c["v1_vs_v2"]["v2_vs_v1"] > 0
    assert [t["lp_num_threads"] for t in c["lp_num_threads"]] == [1] and c["render_v2_over_physics"] > 0
    assert c["torch_threads"]["rollout"] == 1 and c["torch_threads"]["render_both_v2"]["n"] == 3
    doc = json.loads((tmp_path / "render_cost.quick.json").read_text())
    from env.appearance import APPEARANCE_VERSION

    assert doc["appearance_version"] == APPEARANCE_VERSION


@pytest.mark.parametrize("name,args,needle", [
    ("sim_throughput", ["--obs", "depth"], "valid: state, cameras"),
    ("sim_throughput", ["--setups", "Z09"], "Z09"),
    ("inference", ["--models", "gpt"], "valid: scripted, bc-state, octo-small"),
    ("eval_walltime", ["--tries", "0"], "at least 1"),
    ("gpu_physics_check", ["--sim", "cpu", "--tries", "0"], "at least 1"),
    ("render_cost", ["--parts", "pixels"], "valid: frames, lod, cost"),
])
def test_bad_input_is_one_line_and_nonzero(tmp_path, name, args, needle):
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--out-dir", str(tmp_path), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("name", ["sim_throughput", "inference", "eval_walltime", "gpu_physics_check", "render_cost",
                                  "engines_build", "orin_estimate", "bc_camera_int8"])
def test_help(name):
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "--quick" in proc.stdout and "--out-dir" in proc.stdout


def test_quick_results_never_go_under_results(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.cli_startup", "--quick", "--no-progress", "--out-dir",
                           str(ROOT / "results" / "benchmarks")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 2 and "never go under" in proc.stderr and "Traceback" not in proc.stderr
    assert not (ROOT / "results" / "benchmarks" / "cli_startup.quick.json").exists()


def test_cli_startup_quick(tmp_path):
    r = _bench("cli_startup", tmp_path)
    modules = {c["module"] for c in r["commands"]}
    assert {"eval.run", "eval.orin", "env.tasklist", "eval.report"} <= modules
    assert all(c["help_exit"] == [0] and c["bad_option_exit"] == [2] for c in r["commands"])


def test_orin_estimate_counts_the_built_graphs_and_labels_an_estimate(tmp_path):
    """The graphs `engines.build` writes (shipped weights), their FLOPs, and the estimate: the compute term is
    FLOPs over the stated peak times the efficiency, on the published bc-state floor read from the spec."""
    engines = tmp_path / "engines"
    proc = subprocess.run([sys.executable, "-m", "engines.build", "--models", "bc-state,bc-camera", "--out",
                           str(engines)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = _bench("orin_estimate", tmp_path, "--engines", str(engines), "--efficiency", "0.2")
    from benchmarks.orin_estimate import ORIN_PEAK_FLOPS

    assert r["label"] == "an estimate from FLOPs, not a measurement" and r["efficiency"] == 0.2
    assert r["floor_ms"] == 1.4  # docs/BENCHMARK.md section 8: bc-state's ms/query on the Orin
    by_model = {m["model"]: m for m in r["models"]}
    assert set(by_model) == {"bc-state", "bc-camera"}
    assert by_model["bc-camera"]["flops_per_query"] > 100 * by_model["bc-state"]["flops_per_query"] > 0
    for m in r["models"]:
        for e in m["estimates"]:
            compute = m["flops_per_query"] / (ORIN_PEAK_FLOPS[e["precision"]] * 0.2) * 1e3
            assert e["compute_ms"] == pytest.approx(compute, abs=1e-4)
            assert e["expected_ms"] == pytest.approx(1.4 + compute, abs=1e-3)


@pytest.mark.parametrize("args,needle", [
    (["--efficiency", "0"], "--efficiency must be in (0, 1]"),
    (["--engines", "NOWHERE"], "holds no engines"),
])
def test_orin_estimate_bad_input_is_one_line(tmp_path, args, needle):
    args = [str(tmp_path / a) if a == "NOWHERE" else a for a in args]
    proc = subprocess.run([sys.executable, "-m", "benchmarks.orin_estimate", "--out-dir", str(tmp_path), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
    assert not list(tmp_path.glob("*.json"))
