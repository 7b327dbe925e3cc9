"""engines/octo/optimize.py: the ORT rewrites fire on an exported Octo graph, keep JAX parity (readout
<= 1e-4, actions <= 1e-3 relative) at batch 1 and 3, leave TensorRT-readable ops only in the standard
passes, and are cached per source file."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax2onnx")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from engines.backends import rel_err  # noqa: E402
from engines.octo.export import backbone_feeds, onnx_for_octo, sampler_feeds  # noqa: E402
from engines.octo.model import make_backbone, make_infer, prefix_groups, structural_mask  # noqa: E402
from engines.octo.optimize import (  # noqa: E402
    MS_DOMAIN, STANDARD_PASSES, optimize_model, ort_optimized)
from engines.octo.runners import OnnxOcto  # noqa: E402
from engines.octo.testing import tiny_octo  # noqa: E402
from engines.runners import OnnxRuntimeRunner  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("SAB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "sab-cache"))
    engine = tiny_octo()
    graphs = onnx_for_octo(engine, search=(), progress=False)
    mp.undo()
    return engine, graphs


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    """The rewritten copies go to this session's cache, not the user's."""
    monkeypatch.setenv("SAB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "sab-cache"))


def inputs(cfg, batch, seed):
    rs = np.random.default_rng(seed)
    images = [rs.integers(0, 256, (batch, cfg.window, *c.image_size, 3), dtype=np.uint8) for c in cfg.cameras]
    masks = np.ones((batch, cfg.window, 1 + len(cfg.cameras)), np.float32)
    masks[0, 0, 0] = 0.0
    if batch > 1:
        masks[1, :, -1] = 0.0
    lang = rs.normal(size=(batch, cfg.lang_tokens, cfg.t5.d_model)).astype(np.float32)
    noise = (rs.normal(size=(batch, cfg.flat_action_dim)).astype(np.float32),
             rs.normal(size=(cfg.diffusion_steps, batch, cfg.flat_action_dim)).astype(np.float32))
    return images, masks, lang, noise


def test_rewrites_fire_on_the_backbone(exported):
    engine, graphs = exported
    layers = engine.cfg.num_layers
    model = onnx.load(str(graphs.backbone))
    stats = optimize_model(model)
    assert stats["static_reshapes"] > 0 and stats["gemm_bias"] > 0
    # two layer norms per block and the final one; one GELU per block and one attention per block and query
    # group of the block-causal structure (engines.octo.model.prefix_groups)
    groups = len(prefix_groups(structural_mask(engine.cfg)))
    assert (stats["layer_norm"], stats["gelu"], stats["attention"]) == (2 * layers + 1, layers, groups * layers)
    assert stats["nodes_after"] < stats["nodes_before"] * 3 // 4
    ops = {n.op_type for n in model.graph.node}
    assert {"LayerNormalization", "FastGelu", "MultiHeadAttention"} <= ops
    # no attention has a bias or mask input: ONNX Runtime runs every one as its fused (flash) CPU kernel
    mha = [n for n in model.graph.node if n.op_type == "MultiHeadAttention"]
    assert all(len([i for i in n.input if i]) == 3 and len(n.input) == 3 for n in mha)
    assert not {"Tanh", "Softmax"} & ops  # nothing of the decomposed GELU and attention is left
    # (the conv stem's group norms keep their ReduceMeans: not a layer norm, left alone)
    onnx.checker.check_model(model)


def test_standard_passes_use_standard_ops_only(exported):
    _, graphs = exported
    model = onnx.load(str(graphs.backbone))
    stats = optimize_model(model, STANDARD_PASSES)
    assert stats["layer_norm"] > 0
    assert not [n for n in model.graph.node if n.domain == MS_DOMAIN]
    assert not [o for o in model.opset_import if o.domain == MS_DOMAIN]


@pytest.mark.kernels
@pytest.mark.parametrize("batch,seed", [(1, 31), (3, 32)])
def test_rewritten_graphs_match_jax(exported, batch, seed):
    engine, graphs = exported
    cfg = engine.cfg
    images, masks, lang, noise = inputs(cfg, batch, seed)
    ref_readout = np.asarray(jax.jit(make_backbone(cfg))(engine.params, images, lang, masks))
    ref = np.asarray(jax.jit(make_infer(cfg))(engine.params, images, lang, masks, *noise))
    runners = OnnxOcto(cfg, OnnxRuntimeRunner(graphs.backbone), OnnxRuntimeRunner(graphs.sampler)).activate()
    plain = OnnxOcto(cfg, OnnxRuntimeRunner(graphs.backbone, rewrite=False),
                     OnnxRuntimeRunner(graphs.sampler, rewrite=False)).activate()
    try:
        assert runners.backbone.loaded_path != graphs.backbone  # the rewritten copy is what ran
        assert plain.backbone.loaded_path == graphs.backbone
        readout = runners.readout(images, masks, lang)
        assert rel_err(readout, ref_readout) <= 1e-4
        assert rel_err(runners.predict(images, masks, lang, noise), ref) <= 1e-3
        assert rel_err(readout, plain.readout(images, masks, lang)) <= 1e-4
        feeds = sampler_feeds(readout, *noise)
        assert rel_err(runners.sampler.infer(feeds)["actions"], plain.sampler.infer(feeds)["actions"]) <= 1e-4
    finally:
        runners.deactivate()
        plain.deactivate()


def test_rewritten_copy_is_cached_and_keyed(exported, tmp_path):
    _, graphs = exported
    first = ort_optimized(graphs.backbone, cache=tmp_path)
    assert first.parent == tmp_path and first != graphs.backbone
    meta = {p.key: p.value for p in onnx.load(str(first), load_external_data=False).metadata_props}
    assert meta["ort_optimize"].startswith("v") and meta["params_sha256"]  # the export's metadata is kept
    mtime = first.stat().st_mtime_ns
    assert ort_optimized(graphs.backbone, cache=tmp_path) == first and first.stat().st_mtime_ns == mtime
    other = ort_optimized(graphs.backbone, passes=STANDARD_PASSES, cache=tmp_path)
    assert other != first  # other passes: another file


def test_runner_copy_lives_in_the_onnx_cache(exported):
    from engines.octo.optimize import ort_cache_dir

    _, graphs = exported
    r = OnnxRuntimeRunner(graphs.sampler).activate()
    assert r.loaded_path.parent == ort_cache_dir() and r.loaded_path.name.startswith(graphs.sampler.stem)
    r.deactivate()


def test_graph_without_patterns_is_used_as_is(tmp_path):
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert ort_optimized(path, cache=tmp_path / "c") == path
    assert ort_optimized(path, cache=tmp_path / "c") == path  # remembered, not re-checked
    r = OnnxRuntimeRunner(path).activate()
    assert r.loaded_path == path and np.allclose(r.infer({"x": np.array([-1, 2], np.float32)})["y"], [0, 2])
    r.deactivate()


def test_backbone_feeds_helper_still_fits(exported):
    engine, graphs = exported
    images, masks, lang, _ = inputs(engine.cfg, 1, 5)
    r = OnnxRuntimeRunner(graphs.backbone).activate()
    assert r.infer(backbone_feeds(engine.cfg, images, masks, lang))["readout"].shape == (1, engine.cfg.token_dim)
    r.deactivate()


def _one_line(capsys, *needles) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def test_a_damaged_rewritten_copy_is_built_again_with_one_line(exported, tmp_path, capsys):
    _, graphs = exported
    first = ort_optimized(graphs.backbone, cache=tmp_path)
    good = first.read_bytes()
    first.write_bytes(good[: len(good) // 2])  # what a killed copy or a full disk leaves
    capsys.readouterr()
    assert ort_optimized(graphs.backbone, cache=tmp_path) == first
    _one_line(capsys, str(first), "damaged", "building it again")
    assert first.read_bytes() == good
    import onnxruntime as ort

    ort.InferenceSession(str(first), providers=["CPUExecutionProvider"])  # loads: the INVALID_PROTOBUF is gone


def test_a_damaged_export_in_the_build_folder_is_named_and_not_used(exported, tmp_path, capsys):
    import shutil

    from engines.octo.export import file_stem, matching_export, params_digest

    engine, graphs = exported
    stem = file_stem(engine.cfg.name)
    for part, src in (("backbone", graphs.backbone), ("sampler", graphs.sampler)):
        shutil.copy(src, tmp_path / f"{stem}_{part}.onnx")
    digest = params_digest(engine.params)
    assert matching_export(tmp_path, stem, digest) is not None
    broken = tmp_path / f"{stem}_backbone.onnx"
    broken.write_bytes(broken.read_bytes()[:1000])
    capsys.readouterr()
    assert matching_export(tmp_path, stem, digest) is None
    _one_line(capsys, str(broken), "delete it or rebuild it with make engines")


def test_a_damaged_export_in_the_cache_is_exported_again(exported, capsys):
    engine, graphs = exported
    good = graphs.sampler.read_bytes()
    graphs.sampler.write_bytes(good[:100])
    capsys.readouterr()
    again = onnx_for_octo(engine, search=(), progress=False)
    assert again == graphs and graphs.sampler.read_bytes() == good  # the export is byte-stable
    _one_line(capsys, str(graphs.sampler), "damaged")
