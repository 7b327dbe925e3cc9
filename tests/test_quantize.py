"""engines.quantize: the INT8 Q/DQ graphs of the tiny Octo backbone and of bc-state run on ONNX Runtime within
their parity bounds; bf16 and other unsupported (backend, precision) pairs are one line; calibration hashes
are canonical. The real numbers (octo-small on 226 recorded dev queries, bc-state's dev successes) are
benchmarks/octo_precision's."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from engines import quantize  # noqa: E402

# INT8 parity bounds (relative error: max abs over the fp32 reference's max magnitude)
TINY_OCTO_READOUT_REL = 0.15  # the tiny random-weights backbone; octo-small on recorded dev queries: see docs/engines.md
BC_STATE_ACTION_MEAN_ABS = 0.05  # bc-state's trained weights, normalised actions in [-1, 1]
BC_STATE_ACTION_MAX_ABS = 1.0  # its worst row (a z translation near a tanh knee) is reported, not bounded tighter


def _run(path, feeds):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, dict(feeds))[0]


def _ops(path):
    import onnx

    return {n.op_type for n in onnx.load(str(path)).graph.node}


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("jax")
    pytest.importorskip("jax2onnx")
    from engines.octo.export import onnx_for_octo, params_digest
    from engines.octo.testing import tiny_octo

    engine = tiny_octo(seed=1)
    return engine, onnx_for_octo(engine, progress=False), params_digest(engine.params)


def _tiny_feeds(cfg, n, seed):
    from engines.octo.export import backbone_feeds

    rs = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        # smooth images (a gradient and noise), like frames, not uniform noise
        imgs = [np.clip(np.linspace(0, 255, c.image_size[1])[None, None, None, :, None] * 0.8
                        + rs.normal(0, 20, (1, cfg.window, *c.image_size, 3)), 0, 255).astype(np.uint8)
                for c in cfg.cameras]
        masks = np.ones((1, cfg.window, 1 + len(cfg.cameras)), np.float32)
        lang = rs.normal(size=(1, cfg.lang_tokens, cfg.t5.d_model)).astype(np.float32)
        out.append(backbone_feeds(cfg, imgs, masks, lang))
    return out


def _calibration(name, rows):
    digest = quantize.arrays_sha256({f"{i}/{k}": v for i, r in enumerate(rows) for k, v in r.items()})
    return quantize.Calibration(name, digest, lambda: rows, len(rows))


@pytest.mark.kernels
def test_tiny_octo_backbone_int8_has_qdq_runs_and_is_within_bound(tiny, tmp_path):
    engine, onnx, digest = tiny
    cal = _calibration("tiny synthetic", _tiny_feeds(engine.cfg, 6, seed=0))
    out = quantize.int8_graph(onnx.backbone, cal, weights_digest=digest, out_path=tmp_path / "bb.int8.onnx")
    ops = _ops(out)
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops and quantize.has_qdq(out)
    assert not quantize.has_qdq(onnx.backbone)
    from engines.onnx_utils import metadata

    meta = metadata(out)
    assert meta["calibration_sha256"] == cal.sha256 and meta["int8_weights_sha256"] == digest
    assert meta["int8_pass"] == quantize.INT8_PASS and meta["calibration"] == "tiny synthetic"
    worst = 0.0
    for feeds in _tiny_feeds(engine.cfg, 3, seed=1):  # held-out feeds
        ref, got = _run(onnx.backbone, feeds), _run(out, feeds)
        assert got.shape == ref.shape and np.isfinite(got).all()
        worst = max(worst, float(np.abs(got - ref).max() / np.abs(ref).max()))
    assert worst <= TINY_OCTO_READOUT_REL, worst
    # found again for these weights, reused for this calibration (not rebuilt), refused for other weights
    assert quantize.find_int8([out], digest, onnx.backbone) == out
    assert quantize.find_int8([out], "0" * 64, onnx.backbone) is None
    mtime = out.stat().st_mtime_ns
    assert quantize.int8_graph(onnx.backbone, cal, weights_digest=digest, out_path=out) == out
    assert out.stat().st_mtime_ns == mtime


def test_every_weight_product_is_quantized_and_attention_stays_float(tiny, tmp_path):
    import onnx as onnx_mod

    engine, onnx, digest = tiny
    cal = _calibration("tiny synthetic", _tiny_feeds(engine.cfg, 2, seed=0))
    out = quantize.quantize_int8(onnx.backbone, tmp_path / "bb.int8.onnx", cal, weights_digest=digest)
    m = onnx_mod.load(str(out))
    produced = {o: n for n in m.graph.node for o in n.output}
    inits = {t.name for t in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type in ("MatMul", "Conv") and len(n.input) > 1:
            b = produced.get(n.input[1])
            weight = b is not None and b.op_type == "DequantizeLinear" and b.input[0] in inits
            a = produced.get(n.input[0])
            # a weight product reads dequantized int8 on both sides; a product of two activations reads floats
            assert weight == (a is not None and a.op_type == "DequantizeLinear"), n.name
    assert not any(n.op_type == "Gemm" for n in m.graph.node)  # plain Gemms became MatMuls (fusable)


@pytest.mark.kernels
def test_bc_state_int8_is_within_bound(tmp_path):
    pytest.importorskip("torch")
    from engines.bc_mlp import DEFAULT_WEIGHTS, export_onnx, load, numpy_forward

    if not DEFAULT_WEIGHTS.exists():
        pytest.skip("no bc-state weights")
    net, config, _ = load(DEFAULT_WEIGHTS)
    fp32 = export_onnx(net, config, tmp_path / "bc.onnx")
    mean, std = net.obs_mean.numpy(), net.obs_std.numpy()
    rs = np.random.default_rng(0)
    states = (mean + 0.5 * std * rs.standard_normal((512, config.state_dim))).astype(np.float32)
    cal = _calibration("bc synthetic", [{"state": states[i:i + 64]} for i in range(0, 256, 64)])
    out = quantize.int8_graph(fp32, cal, weights_digest="bc-test")
    assert out == tmp_path / "bc.int8.onnx" and quantize.has_qdq(out)
    held = states[256:]
    ref = numpy_forward(net, held)
    got = _run(out, {"state": held})
    err = np.abs(got - ref)
    assert err.mean() <= BC_STATE_ACTION_MEAN_ABS and err.max() <= BC_STATE_ACTION_MAX_ABS, (err.mean(), err.max())
    assert np.abs(_run(fp32, {"state": held}) - ref).max() <= 1e-4  # the fp32 graph itself is exact


def test_calibration_hash_is_canonical(tmp_path):
    rs = np.random.default_rng(0)
    a = {"masks": rs.normal(size=(3, 2, 3)).astype(np.float32), "image": rs.integers(0, 255, (3, 4), np.uint8),
         "setup": np.array(["A01", "B01", "C01"])}
    h = quantize.arrays_sha256(a)
    assert h == quantize.arrays_sha256(dict(reversed(list(a.items()))))  # key order does not matter
    np.savez(tmp_path / "a.npz", **a)
    np.savez_compressed(tmp_path / "b.npz", **a)
    assert quantize.arrays_sha256(quantize.load_npz(tmp_path / "a.npz")) == h  # nor the container
    assert quantize.arrays_sha256(quantize.load_npz(tmp_path / "b.npz")) == h
    b = {k: v.copy() for k, v in a.items()}
    b["image"][0, 0] ^= 1
    assert quantize.arrays_sha256(b) != h  # one bit changes it
    c = {**a, "masks": a["masks"].astype(np.float64)}
    assert quantize.arrays_sha256(c) != h  # so does a dtype
    assert len(h) == 64


def test_calibration_files_name_their_tries_and_hash(tmp_path):
    rs = np.random.default_rng(0)
    arrays = {"state": rs.normal(size=(130, 40)).astype(np.float32), "setup": np.array(["A01"] * 100 + ["B01"] * 30),
              "try_index": np.array([10] * 130, np.int32)}
    np.savez(tmp_path / "bc.npz", **arrays)
    cal = quantize.bc_calibration(tmp_path / "bc.npz")
    assert cal.sha256 == quantize.arrays_sha256(arrays) and cal.samples == 130
    assert "A01/10, B01/10" in cal.name and "130 states" in cal.name
    assert sum(len(f["state"]) for f in cal.feeds()) == 130
    with pytest.raises(FileNotFoundError, match="python -m benchmarks.record_queries --only bc-calib"):
        quantize.bc_calibration(tmp_path / "missing" / quantize.BC_CALIB.name)
    damaged = tmp_path / "damaged.npz"
    damaged.write_bytes((tmp_path / "bc.npz").read_bytes()[:500])
    from engines.onnx_utils import BadModelFileError

    with pytest.raises(BadModelFileError) as e:
        quantize.bc_calibration(damaged)
    assert str(damaged) in str(e.value) and "delete it and run make engines" in str(e.value)
    assert "\n" not in str(e.value)


def test_goal_inputs_missing_from_a_recording_are_fed_zeros():
    specs = {"image_primary": ((-1, 2, 4, 4, 3), np.dtype(np.uint8)),
             "goal_primary": ((-1, 4, 4, 3), np.dtype(np.uint8))}
    feeds = quantize.complete_feeds({"image_primary": np.ones((2, 2, 4, 4, 3), np.uint8)}, specs)
    assert feeds["goal_primary"].shape == (2, 4, 4, 3) and not feeds["goal_primary"].any()
    with pytest.raises(ValueError, match="no input 'lang'"):
        quantize.complete_feeds({"image_primary": np.ones((2, 2, 4, 4, 3), np.uint8)},
                                {**specs, "lang": ((-1, 3), np.dtype(np.float32))})


@pytest.mark.parametrize("backend,precision,needle", [
    ("ort", "bf16", "no bfloat16 MatMul/Gemm kernels"),
    ("ort", "fp16", "not one of ONNX Runtime's: fp32, int8"),
    ("jax", "int8", "runs fp32 only"),
    ("torch", "bf16", "runs fp32 only"),
    ("trt", "fp4", "not one of TensorRT's"),
])
def test_unsupported_precisions_are_one_line(backend, precision, needle):
    with pytest.raises(quantize.PrecisionUnavailable, match=needle) as e:
        quantize.check_precision(backend, precision)
    assert "\n" not in str(e.value)
    for ok in (("ort", "fp32"), ("ort", "int8"), ("jax", "fp32"), ("trt", "int8"), ("trt", "fp16")):
        quantize.check_precision(*ok)


def test_ort_has_no_bf16_kernels_here():
    """Say plainly what docs/engines.md says: this ONNX Runtime's CPU provider cannot run a bfloat16 MatMul."""
    reason = quantize.ort_bf16_reason()
    assert reason is not None and "bfloat16" in reason and "\n" not in reason


def test_the_runtime_refuses_bad_precisions_and_bc_states_int8_in_one_line(monkeypatch):
    pytest.importorskip("torch")
    from engines.backends import BackendUnavailable, resolve_runtime
    from engines.bc_mlp import DEFAULT_WEIGHTS

    if not DEFAULT_WEIGHTS.exists():
        pytest.skip("no bc-state weights")
    with pytest.raises(BackendUnavailable, match="bfloat16") as e:  # the runtime is resolved (and refused) once
        resolve_runtime("bc-state", "ort", "bf16")
    assert "\n" not in str(e.value)
    # bc-state's INT8 is refused (on every backend that runs here), with the reason the committed measurement gives
    measured = _bc_state_measured()["dev_successes"]
    int8, fp32 = measured["int8"]["graph_tries"], measured["fp32"]
    with pytest.raises(BackendUnavailable, match=f"{int8['k']}/{int8['n']} dev tries against "
                                                 f"{fp32['k']}/{fp32['n']}") as e:
        resolve_runtime("bc-state", "ort", "int8")
    assert "\n" not in str(e.value)


def _bc_state_measured() -> dict:
    """bc-state's rows of the committed precision benchmark (results/benchmarks/octo_precision.json)."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "octo_precision.json"
    return json.loads(path.read_text())["results"]["bc_state"]


def _int8_slowdown() -> str:
    """The refusal's "N.Nx slower at batch 1", N.N the committed INT8 / fp32 p50 of bc-state."""
    return f"{_bc_state_measured()['precisions']['int8']['p50_over_ort_fp32']:.1f}x slower at batch 1"


@pytest.mark.parametrize("args,needle", [
    (["--model", "bc-state", "--backend", "ort", "--precision", "bf16"], "bfloat16"),
    (["--model", "bc-state", "--backend", "torch", "--precision", "int8"], "does not run at int8"),
    (["--model", "bc-state", "--backend", "ort", "--precision", "int8"], _int8_slowdown()),
    (["--model", "scripted", "--precision", "int8"], "scripted takes no --precision"),
])
def test_eval_run_precision_errors_are_one_line(args, needle, tmp_path, capsys):
    from eval.run import main

    assert main([*args, "--split", "dev", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_octo_policy_runs_the_int8_backbone_and_the_fp32_sampler(tiny):
    pytest.importorskip("flax")
    pytest.importorskip("sentencepiece")
    from eval.request import make_policy

    engine, onnx, digest = tiny
    cal = _calibration("tiny synthetic", _tiny_feeds(engine.cfg, 2, seed=0))
    int8 = quantize.int8_graph(onnx.backbone, cal, weights_digest=digest)  # beside the cached fp32 export
    policy = make_policy("octo-small", engine=engine, backend="ort", precision="int8")
    assert policy.runner.backbone.onnx_path == int8 and policy.runner.sampler.onnx_path == onnx.sampler
    fp32 = make_policy("octo-small", engine=engine, backend="ort")
    assert fp32.runner.backbone.onnx_path == onnx.backbone
    feeds = fp32._blank_feeds(1)
    a, b = policy.infer(feeds)["actions"], fp32.infer(feeds)["actions"]
    assert a.shape == b.shape and np.isfinite(a).all()


def test_make_engines_refuses_bc_state_int8_with_its_reason_and_lists_bf16_as_skipped(tmp_path, capsys,
                                                                                      monkeypatch):
    pytest.importorskip("torch")
    from engines import bc_mlp, build
    from engines.onnx_utils import metadata, sha256_file

    weights = tmp_path / "bc_state.safetensors"
    bc_mlp.save(bc_mlp.build(bc_mlp.BCConfig()), bc_mlp.BCConfig(), weights)
    monkeypatch.setattr(bc_mlp, "DEFAULT_WEIGHTS", weights)
    rs = np.random.default_rng(0)
    calib = tmp_path / quantize.BC_CALIB.name  # a recorded set's layout, synthetic states (no sim in tests)
    arrays = {"state": rs.normal(size=(128, 40)).astype(np.float32), "setup": np.array(["A01"] * 128),
              "try_index": np.full(128, 10, np.int32)}
    np.savez(calib, **arrays)
    monkeypatch.setattr(quantize, "BC_CALIB", calib)
    rc = build.main(["--out", str(tmp_path / "out"), "--models", "bc-state", "--precisions", "fp32"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    int8 = [line for line in lines if line.split()[:3] == ["bc-state", "onnx", "int8"]]
    assert len(int8) == 1 and "skipped" in int8[0] and quantize.INT8_REFUSED["bc-state"] in int8[0]
    assert not (tmp_path / "out" / "bc_state.int8.onnx").exists()
    bf16 = [line for line in lines if "onnx bf16" in line]
    assert len(bf16) == 1 and "skipped" in bf16[0] and "bfloat16" in bf16[0]
    assert metadata(tmp_path / "out" / "bc_state.onnx")["source"].endswith(sha256_file(weights)[:16])
    # the graph its INT8 decision is measured on is still built from the same calibration (octo_precision)
    q = quantize.int8_graph(tmp_path / "out" / "bc_state.onnx", quantize.bc_calibration(calib),
                            weights_digest=sha256_file(weights), out_path=tmp_path / "bc.int8.onnx")
    assert metadata(q)["calibration_sha256"] == quantize.arrays_sha256(arrays)
    # a second build with nothing changed exports nothing again (the weights' export is kept)
    assert build.main(["--out", str(tmp_path / "out"), "--models", "bc-state", "--precisions", "fp32"]) == 0
    assert any("bc-state" in line and "(unchanged)" in line for line in capsys.readouterr().out.splitlines())
    out = subprocess_run_build(["--ort-precisions", "fp16"])
    assert out.returncode == 2 and "unknown ONNX Runtime precision fp16" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def subprocess_run_build(args):
    import subprocess
    import sys
    from pathlib import Path

    return subprocess.run([sys.executable, "-m", "engines.build", *args], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.kernels
def test_activation_ranges_are_onnx_runtimes_minmax_over_every_feed_and_give_its_graph(tiny, tmp_path):
    """The ranges make engines computes are ONNX Runtime's own MinMax calibrator's over the same feeds, value for
    value, and the INT8 graph is the one quantize_static gives with that calibrator, byte for byte. (The build
    once passed CalibMaxIntermediateOutputs=16, with which ONNX Runtime 1.32's calibrator drops every full block
    of 16 feeds unmerged, microsoft/onnxruntime#18893: 150 recorded queries calibrated on their last 6.)"""
    import onnx as onnx_lib
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          create_calibrator, quantize_static)

    engine, exported, digest = tiny
    rows = _tiny_feeds(engine.cfg, 20, seed=3)
    rows[0] = {k: (v * 3 if v.dtype == np.float32 else v) for k, v in rows[0].items()}  # the widest feed first
    cal = _calibration("tiny, 20 feeds", rows)
    specs = quantize.input_specs(exported.backbone)
    folded = tmp_path / "folded.onnx"
    quantize._fold(exported.backbone, folded)
    nodes = quantize.prepare(folded, quantize.DEFAULT_OPS)
    ours = quantize.activation_ranges(folded, nodes, cal, specs)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(rows)

        def get_next(self):
            row = next(self.it, None)
            return None if row is None else quantize.complete_feeds(row, specs)

    calibrator = create_calibrator(folded, list(quantize.DEFAULT_OPS), augmented_model_path=str(tmp_path / "aug.onnx"),
                                   calibrate_method=CalibrationMethod.MinMax, providers=["CPUExecutionProvider"])
    calibrator.collect_data(Reader())
    theirs = calibrator.compute_data()
    assert len(ours.data) > 10 and set(ours.data) <= set(theirs.data)
    for name, r in ours.data.items():
        assert np.array_equal(np.asarray(r.range_value), np.asarray(theirs[name].range_value)), name

    ours_path = quantize.quantize_int8(exported.backbone, tmp_path / "ours.int8.onnx", cal, weights_digest=digest)
    theirs_path = tmp_path / "theirs.int8.onnx"
    quantize_static(str(folded), str(theirs_path), Reader(), quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=list(quantize.DEFAULT_OPS), nodes_to_quantize=nodes, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, "DedicatedQDQPair": True})
    a, b = onnx_lib.load(str(ours_path)), onnx_lib.load(str(theirs_path))
    quantize.unshare_quantize(b)  # what quantize_int8 does after quantize_static
    assert a.graph.SerializeToString() == b.graph.SerializeToString()
