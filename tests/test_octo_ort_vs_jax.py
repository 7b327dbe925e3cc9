"""benchmarks/octo_ort_vs_jax.py's pieces that need no model: the graph variants it times by default, the
efficiency row (achieved GFLOP/s over the peak at the same thread count) and the warm-up-free profile."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from benchmarks.octo_ort_vs_jax import NO_SPIN, _efficiency, default_variants, profile_ops  # noqa: E402


def test_default_variants_time_the_runner_graph_and_the_export():
    graphs = SimpleNamespace(backbone=Path("/nonexistent/b.onnx"), sampler=Path("/nonexistent/s.onnx"))
    vs = default_variants(graphs, "0" * 64, cores=2)
    assert [(v.name, v.rewrite, v.sampler_threads) for v in vs] == [
        ("fp32", True, 1), ("fp32 sampler at backbone threads", True, None), ("fp32 as exported", False, None)]
    assert vs[0].trials(2) == [(2, {}), (2, dict(NO_SPIN)), (1, {})]
    assert vs[1].trials(2) == vs[2].trials(2) == [(2, {})]
    assert default_variants(graphs, "0" * 64, cores=1)[0].trials(1) == [(1, {})]


def test_the_run_time_sampler_runs_on_one_thread_beside_the_backbone():
    """What the benchmark's headline variant times is what --backend ort builds: the sampler on one thread,
    without a second spinning pool."""
    from engines.backends import BackendSpec, octo_sampler_spec

    assert octo_sampler_spec(BackendSpec("ort", threads=None)).threads == 1
    assert octo_sampler_spec(BackendSpec("ort", "int8", threads=2)) == BackendSpec("ort", "fp32", threads=1)
    assert octo_sampler_spec(BackendSpec("trt", "fp16", max_batch=64)) == BackendSpec("trt", "fp16", max_batch=64)


def test_efficiency_row():
    row = _efficiency("jax", "fp32", 2, flops=40_000_000_000, p50_ms=200.0, peak={2: 250.0, 1: 130.0})
    assert row["achieved_gflops"] == 200.0 and row["achieved_over_peak"] == 0.8 and row["peak_gflops"] == 250.0
    assert _efficiency("ort", "int8", 4, 10**9, 10.0, {2: 1.0})["achieved_over_peak"] is None  # no peak measured


def test_profile_leaves_out_warm_up(tmp_path):
    from tests.test_flops import tiny_graph

    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_graph(), str(path))
    p = profile_ops(path, {"x": np.ones((1, 3, 8, 8), np.float32)}, threads=1, runs=3, warmup=1)
    ops = {o["op"] for o in p["by_op"]}
    assert {"Gemm", "MatMul", "Einsum"} <= ops and abs(sum(o["share"] for o in p["by_op"]) - 1.0) < 0.01
    assert p["top_nodes"] and p["run_ms_p50"] > 0


def test_interleaved_times_every_call_in_turn():
    from benchmarks.octo_ort_vs_jax import interleaved

    seen = []
    calls = {"a": lambda: seen.append("a"), "b": lambda: seen.append("b")}
    wall, cpu = interleaved(calls, n=4, warmup=2, rounds=2)
    assert [len(v) for v in wall.values()] == [4, 4] and set(cpu) == {"a", "b"}
    # round 1: a (2 warm-up + 2), b (2 + 2); round 2, order rotated: b (1 + 2), a (1 + 2)
    assert seen == ["a"] * 4 + ["b"] * 4 + ["b"] * 3 + ["a"] * 3
