"""Host-to-device traffic of an Octo query on TensorRT (issue #44 item 6), with the fake tensorrt and cuda-python
of tests/fake_trt.py: frames of a GPU scene are bound by address (0 image bytes), the try's language embedding and
goal images are copied once per try (not once per query), the zero goal images and the language mask once per
batch size, and the bytes and event-timed copy time of each query reach the try record and the report."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engines.octo.runners import OnnxOcto
from engines.runners import Runner, TensorRtRunner
from tests import fake_trt

INSTRUCTION = "put the circle block into the circle hole"
MIB_PER_MS = 2 ** 20  # the fake device's host-to-device rate (fake_trt.make_cudart)


def nbytes(shape, dtype) -> int:
    return int(np.prod(shape)) * np.dtype(dtype).itemsize


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("jax")
    from engines.octo.testing import tiny_octo

    return tiny_octo(seed=5)


def _trt_runner(monkeypatch, tmp_path, engine):
    f = fake_trt.install(monkeypatch)
    backbone, sampler = fake_trt.octo_engines(f.trt, engine.cfg, tmp_path)
    return f, OnnxOcto(engine.cfg, TensorRtRunner(backbone), TensorRtRunner(sampler)).activate()


def _frames(cfg, seed):
    rs = np.random.default_rng(seed)
    sizes = {c.name: c.image_size for c in cfg.cameras}
    return {"third_person": rs.integers(0, 256, (*sizes["primary"], 3), dtype=np.uint8),
            "wrist": rs.integers(0, 256, (*sizes["wrist"], 3), dtype=np.uint8)}


def _obs(frames, device: bool):
    if device:
        pytest.importorskip("torch")  # GPU frames are torch tensors (fake_trt.fake_cuda: CPU ones that say CUDA)
    images = {k: fake_trt.fake_cuda(v) if device else v for k, v in frames.items()}
    return {"images": images, "proprio": np.zeros(9, np.float32), "instruction": INSTRUCTION}


def _sizes(cfg) -> dict[str, int]:
    """Bytes of each feed of one query (batch 1), from the graphs' shapes (engines.octo.export)."""
    cams = {c.name: c for c in cfg.cameras}
    flat = cfg.flat_action_dim
    return {"images": sum(nbytes((1, cfg.window, *c.image_size, 3), np.uint8) for c in cfg.cameras),
            "masks": nbytes((1, cfg.window, 1 + len(cfg.cameras)), np.float32),
            "lang": nbytes((1, cfg.lang_tokens, cfg.t5.d_model), np.float32),
            "goal": nbytes((1, *cams["primary"].image_size, 3), np.uint8),
            "readout": nbytes((1, cfg.token_dim), np.float32),  # back to the host between the two graphs
            "noise": nbytes((1, flat), np.float32) + nbytes((1, cfg.diffusion_steps, flat), np.float32)}


# ------------------------------------------------------------------ backbone_feeds
def test_backbone_feeds_pass_fixed_arrays_through_and_reuse_constants(engine):
    from engines.octo.arrays import blank_inputs
    from engines.octo.export import backbone_feeds

    cfg = engine.cfg
    images, masks, _ = blank_inputs(cfg, 1)
    lang = np.asarray(engine.embed(INSTRUCTION))[None]
    goal = np.zeros((1, *cfg.cameras[0].image_size, 3), np.uint8)
    goal.setflags(write=False)
    a = backbone_feeds(cfg, images, masks, lang, goals={"primary": goal})
    b = backbone_feeds(cfg, images, masks, lang, goals={"primary": goal})
    assert a["lang_embedding"] is lang and a["masks"] is masks and a["goal_primary"] is goal  # no copies
    assert all(a[f"image_{c.name}"] is img for c, img in zip(cfg.cameras, images))
    # language mask and the zero goal images: one read-only array per batch size, the same on every query
    assert a["lang_mask"] is b["lang_mask"] and a["goal_wrist"] is b["goal_wrist"]
    assert not a["lang_mask"].flags.writeable and not a["goal_wrist"].flags.writeable
    np.testing.assert_array_equal(a["lang_mask"], [1.0])
    assert not a["goal_wrist"].any() and a["goal_wrist"].shape == (1, *cfg.cameras[1].image_size, 3)
    images2, masks2, _ = blank_inputs(cfg, 2)
    c = backbone_feeds(cfg, images2, masks2, lang)  # one instruction for two rows: broadcast (a copy)
    assert c["lang_embedding"].shape == (2, *lang.shape[1:]) and c["lang_embedding"].flags.c_contiguous
    assert c["goal_primary"].shape[0] == 2 and c["goal_primary"] is not a["goal_wrist"]


# ------------------------------------------------------------------ the GPU-scene path
def test_gpu_scene_frames_are_bound_by_address_and_give_the_host_frames_actions(monkeypatch, tmp_path, engine):
    from eval.policies.octo import OctoPolicy

    f, runner = _trt_runner(monkeypatch, tmp_path, engine)
    cfg, sizes = engine.cfg, _sizes(engine.cfg)
    host, device = OctoPolicy(engine, runner, exec_horizon=1), OctoPolicy(engine, runner, exec_horizon=1)
    for p in (host, device):
        p.reset(INSTRUCTION, seed=3)
    bb = runner.backbone
    for step in range(4):
        frames = _frames(cfg, 10 + step)
        a_host = host.query(_obs(frames, device=False))
        host_bytes = runner.last_h2d_bytes
        a_dev = device.query(_obs(frames, device=True))
        np.testing.assert_array_equal(a_dev, a_host)  # the engine read the frames where they were bound
        read = bb.context.read[-1]
        for c in cfg.cameras:  # bound at the tensors' own addresses, not copied into the runner's buffers
            assert read[f"image_{c.name}"] != bb.buffers[f"image_{c.name}"].ptr
        # the device query copies everything the host one does but the images; the two policies' language
        # embeddings (one array each) take turns in one buffer here, so each query copies its own
        rest = sizes["masks"] + sizes["lang"] + sizes["readout"] + sizes["noise"]
        assert host_bytes == sizes["images"] + rest and runner.last_h2d_bytes == rest
    assert device.moved_image_bytes() == 0 and runner.copies.report()["zero_copy"]


def test_goal_and_language_are_copied_once_per_try(monkeypatch, tmp_path, engine):
    from eval.policies.octo import OctoPolicy

    f, runner = _trt_runner(monkeypatch, tmp_path, engine)
    cfg, s = engine.cfg, _sizes(engine.cfg)
    # exact byte counts of this tiny config (from the shapes above): what the test asserts
    assert s == {"images": 7680, "masks": 24, "lang": 1024, "goal": 3072, "readout": 128, "noise": 672}
    goals = iter(np.full((40, 40, 3), v, np.uint8) for v in (7, 9, 11))
    goal_source = lambda start, instruction: next(goals)  # noqa: E731 - a new goal per try (as SolvedGoal)
    p = OctoPolicy(engine, runner, exec_horizon=1, goal=goal_source)
    per_query = s["masks"] + s["readout"] + s["noise"]  # images are on the device: 824 bytes
    for t in range(2):
        p.reset(INSTRUCTION, seed=t)
        p.latencies_ms, p.warmup_ms = [], []  # as the rollout does per try
        got, ms = [], []
        for step in range(6):
            p.query(_obs(_frames(cfg, 100 * t + step), device=True))
            got.append(runner.last_h2d_bytes)
            ms.append(runner.last_h2d_ms)
        first = per_query + s["lang"] + s["goal"]  # 4920 bytes: the try's language and goal, once
        assert got == [first] + [per_query] * 5
        # device time of the copies: CUDA events around them (the fake device copies 1 MiB per ms)
        assert ms == [b / MIB_PER_MS for b in got]
        fields = p.record_fields()
        timed = got[-len(p.latencies_ms):]  # the object's first 3 queries are warm-up, not in infer_ms
        assert len(timed) == (3 if t == 0 else 6)
        assert fields["h2d_bytes_per_query"] == pytest.approx(np.mean(timed), abs=0.05)
        assert fields["h2d_ms_p50"] == float(f"{np.median(timed) / MIB_PER_MS:.3g}")
        assert fields["goal_image"] == "callable"
    # a file goal is fixed for the policy's life: after the warm-up it is copied once, then never again
    q = OctoPolicy(engine, runner, exec_horizon=1, goal=(np.full((40, 40, 3), 5, np.uint8), "sha"))
    for t in range(2):
        q.reset(INSTRUCTION, seed=t)
        got = []
        for step in range(3):
            q.query(_obs(_frames(cfg, step), device=True))
            got.append(runner.last_h2d_bytes)
        assert got == [per_query + s["lang"] + (s["goal"] if t == 0 else 0)] + [per_query] * 2


def test_language_only_feeds_the_zero_goal_images_once(monkeypatch, tmp_path, engine):
    from eval.policies.octo import OctoPolicy

    f, runner = _trt_runner(monkeypatch, tmp_path, engine)
    s = _sizes(engine.cfg)
    embed = engine.embed  # the engines folder's embeddings (DeployedOcto) are writable arrays: still once a try
    monkeypatch.setattr(engine, "embed", lambda text: np.array(embed(text)))
    p = OctoPolicy(engine, runner, exec_horizon=1)
    p.reset(INSTRUCTION, seed=0)  # the warm-up feeds the batch's zero goal images and language mask
    copies = f.cudart.h2d_bytes
    got = []
    for step in range(4):
        p.query(_obs(_frames(engine.cfg, step), device=True))
        got.append(runner.last_h2d_bytes)
    per_query = s["masks"] + s["readout"] + s["noise"]
    assert got == [per_query + s["lang"]] + [per_query] * 3
    assert f.cudart.h2d_bytes - copies == sum(got)
    assert runner.copies.h2d_bytes == 0  # OnnxOcto's own counter: images it moved (none)


# ------------------------------------------------------------------ ONNX Runtime on the CPU: 0 bytes, no time
class _CpuGraph(Runner):
    """A stand-in for an ONNX Runtime runner on the CPU: its providers, computing the fake engines' functions."""

    name = "ort"
    providers = ("CPUExecutionProvider",)

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def _activate(self):
        pass

    def _infer(self, feeds):
        return self.fn(**feeds)


def test_onnx_runtime_on_the_cpu_records_zero_bytes_and_no_time(engine):
    from engines.runners import OnnxRuntimeRunner
    from eval.policies.octo import OctoPolicy

    assert OnnxOcto.h2d_of(OnnxRuntimeRunner("x.onnx")) == (0, None)
    assert OnnxOcto.h2d_of(OnnxRuntimeRunner("x.onnx", providers="cuda")) == (None, None)  # copies unseen
    cfg = engine.cfg
    bb = _CpuGraph(lambda **x: {"readout": np.zeros((x["masks"].shape[0], cfg.token_dim), np.float32)})
    sm = _CpuGraph(lambda readout, init_noise, step_noise: {
        "actions": np.zeros((readout.shape[0], cfg.action_horizon, cfg.action_dim), np.float32)})
    runner = OnnxOcto(cfg, bb, sm).activate()
    p = OctoPolicy(engine, runner, exec_horizon=1)
    p.reset(INSTRUCTION, seed=0)
    for step in range(5):
        p.query(_obs(_frames(cfg, step), device=False))
    assert (runner.last_h2d_bytes, runner.last_h2d_ms) == (0, None)
    assert p.record_fields() == {"h2d_bytes_per_query": 0.0}  # the time is omitted, not 0


# ------------------------------------------------------------------ the runner alone
def test_the_runner_skips_only_a_frozen_array_its_buffer_holds(monkeypatch, tmp_path):
    f = fake_trt.install(monkeypatch)
    path = tmp_path / "fake.engine"
    path.write_bytes(fake_trt.ENGINE_BYTES)
    frozen = np.array(np.arange(8, dtype=np.float32).reshape(2, 4))  # its own memory (a reshape views arange's)
    frozen.setflags(write=False)
    writable = np.ones((2, 4), np.float32)
    view = writable.view()
    view.setflags(write=False)  # read-only, but its base is not: its contents may change
    with TensorRtRunner(path) as r:
        got = []
        for x in (frozen, frozen, writable, writable, view, view, frozen, frozen[:1], frozen, frozen):
            y = r.infer({"x": x})["y"]
            np.testing.assert_array_equal(y, 2 * np.maximum(x, 0))
            got.append((r.last_h2d_bytes, r.last_h2d_ms))
    full, row = (32, 32 / MIB_PER_MS), (16, 16 / MIB_PER_MS)
    # frozen: once; writable and a read-only view of a writable array: every time; another array in between
    # (or a batch of another size, which reallocates the buffer) makes the frozen one copied again
    assert got == [full, (0, 0.0), full, full, full, full, full, row, full, (0, 0.0)]
    assert f.cudart.h2d == 8


def test_host_traffic_is_typed_in_the_try_record():
    from eval.records import TryRecord

    rec = TryRecord(setup="A01", try_index=0, seed=1, split="dev", disturbance=None, tasklist_sha256=None,
                    infer_ms=(2.0, 3.0), policy_fields={"h2d_bytes_per_query": 824, "h2d_ms_p50": 0.000786,
                                                        "goal_image": "file"})
    assert rec.h2d_bytes_per_query == 824.0 and rec.h2d_ms_p50 == 0.000786
    assert rec.policy_fields == {"goal_image": "file"}
    d = rec.to_json()
    keys = list(d)
    assert d["h2d_bytes_per_query"] == 824.0 and d["h2d_ms_p50"] == 0.000786 and d["goal_image"] == "file"
    assert keys.index("h2d_bytes_per_query") == keys.index("infer_ms_mean") + 1  # beside the latency
    ort = TryRecord(setup="A01", try_index=0, seed=1, split="dev", disturbance=None, tasklist_sha256=None,
                    policy_fields={"h2d_bytes_per_query": 0.0}).to_json()
    assert ort["h2d_bytes_per_query"] == 0.0 and "h2d_ms_p50" not in ort
    jax = TryRecord(setup="A01", try_index=0, seed=1, split="dev", disturbance=None, tasklist_sha256=None).to_json()
    assert "h2d_bytes_per_query" not in jax and "h2d_ms_p50" not in jax
    for bad in (-1, math.nan, "824", True):
        with pytest.raises(ValueError, match="h2d_bytes_per_query"):
            TryRecord(setup="A01", try_index=0, seed=1, split="dev", disturbance=None, tasklist_sha256=None,
                      policy_fields={"h2d_bytes_per_query": bad})


def test_the_report_shows_host_traffic_beside_the_latency():
    from env.setups import SCORED_IDS
    from eval.report import ReportError, build_summary
    from eval.report.markdown import render_markdown

    def records(extra):
        return [{"setup": sid, "try": t, "success": t == 0, "infer_ms": [1.0, 2.0, 3.0, 4.0][: 1 + t], **extra(t)}
                for sid in SCORED_IDS for t in range(2)]

    trt = build_summary(records(lambda t: {"h2d_bytes_per_query": 4920.0 if t == 0 else 824.0,
                                           "h2d_ms_p50": 0.004 if t == 0 else 0.001}), model="octo-small")
    # weighted by timed queries: 1 try of 1 query at 4920, 1 of 2 queries at 824
    assert trt["host_traffic"]["bytes_per_query"] == pytest.approx((4920 + 2 * 824) / 3)
    assert trt["host_traffic"]["ms_p50"] == pytest.approx(0.0025) and trt["host_traffic"]["tries"] == 60
    md = render_markdown({"octo-small": trt})
    assert "Host to device per query: 2,189 bytes, copy time p50 0.0025 ms." in md
    ort = build_summary(records(lambda t: {"h2d_bytes_per_query": 0.0}), model="octo-small")
    assert ort["host_traffic"] == {"tries": 60, "bytes_per_query": 0.0, "ms_p50": None}
    assert "Host to device per query: 0 bytes, copy time p50 n/a (no device)." in render_markdown({"o": ort})
    assert "host_traffic" not in build_summary(records(lambda t: {}), model="jax")
    for bad in ("fast", "0.5", -1.0, True):
        with pytest.raises(ReportError, match="'h2d_ms_p50' is .*expected a finite number >= 0 or null"):
            build_summary(records(lambda t: {"h2d_bytes_per_query": 1.0, "h2d_ms_p50": bad}))
