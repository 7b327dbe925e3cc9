"""Octo through ONNX: the exported backbone and unrolled sampler against the JAX model on fresh random inputs
(fp32 relative error <= 1e-4), dynamic batch, metadata, no sampling inside graphs, the export cache."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax2onnx")
onnx = pytest.importorskip("onnx")
import jax.numpy as jnp  # noqa: E402

from engines.backends import rel_err  # noqa: E402
from engines.octo.export import (  # noqa: E402
    EXPORT_FORMAT, backbone_input_names, onnx_for_octo, params_digest)
from engines.octo.model import make_backbone, make_infer, make_sampler  # noqa: E402
from engines.octo.params import init_params, without_t5  # noqa: E402
from engines.octo.testing import tiny_octo  # noqa: E402
from engines.octo.runners import OnnxOcto  # noqa: E402
from engines.runners import JaxRunner, OnnxRuntimeRunner  # noqa: E402

REL_TOL = 1e-4


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "sab-cache"


@pytest.fixture(scope="module")
def exported(shared_cache):
    mp = pytest.MonkeyPatch()
    mp.setenv("SAB_CACHE_DIR", str(shared_cache))
    engine = tiny_octo()
    graphs = onnx_for_octo(engine, search=(), progress=False)
    mp.undo()
    return engine, graphs


@pytest.fixture(scope="module")
def ort_octo(exported):
    engine, graphs = exported
    return OnnxOcto(engine.cfg, OnnxRuntimeRunner(graphs.backbone), OnnxRuntimeRunner(graphs.sampler)).activate()


def fresh_inputs(cfg, seed, batch):
    rs = np.random.default_rng(seed)
    images = [rs.integers(0, 256, (batch, cfg.window, *c.image_size, 3), dtype=np.uint8) for c in cfg.cameras]
    masks = np.ones((batch, cfg.window, 1 + len(cfg.cameras)), np.float32)
    masks[0, 0, 0] = 0.0  # a padded first step
    if batch > 1:
        masks[1, :, 2] = 0.0  # no wrist camera
    lang = rs.normal(size=(batch, cfg.lang_tokens, cfg.t5.d_model)).astype(np.float32)
    init = rs.normal(size=(batch, cfg.flat_action_dim)).astype(np.float32)
    steps = rs.normal(size=(cfg.diffusion_steps, batch, cfg.flat_action_dim)).astype(np.float32)
    return images, masks, lang, (init, steps)


@pytest.mark.kernels
@pytest.mark.parametrize("batch,seed", [(1, 11), (3, 12)])
def test_backbone_matches_jax(exported, ort_octo, batch, seed):
    engine, _ = exported
    cfg = engine.cfg
    images, masks, lang, _ = fresh_inputs(cfg, seed, batch)
    lang_mask = np.ones(batch, np.float32)
    lang_mask[-1] = 0.0 if batch > 1 else 1.0
    ref = np.asarray(jax.jit(make_backbone(cfg))(engine.params, images, lang, masks, lang_mask))
    got = ort_octo.readout(images, masks, lang, lang_mask)
    assert got.shape == (batch, cfg.token_dim) and got.dtype == np.float32
    assert rel_err(got, ref) <= REL_TOL


@pytest.mark.kernels
@pytest.mark.parametrize("batch,seed", [(2, 22)])
def test_sampler_and_whole_query_match_jax(exported, ort_octo, batch, seed):
    engine, _ = exported
    cfg = engine.cfg
    images, masks, lang, (init, steps) = fresh_inputs(cfg, seed, batch)
    readout = np.random.default_rng(seed).normal(size=(batch, cfg.token_dim)).astype(np.float32)
    ref = np.asarray(jax.jit(make_sampler(cfg))(engine.params, readout, init, steps))
    got = ort_octo.sampler.infer({"readout": readout, "init_noise": init,
                                  "step_noise": np.ascontiguousarray(np.swapaxes(steps, 0, 1))})["actions"]
    assert got.shape == (batch, cfg.action_horizon, cfg.action_dim) and rel_err(got, ref) <= REL_TOL
    whole = np.asarray(jax.jit(make_infer(cfg))(engine.params, images, lang, masks, init, steps))
    assert rel_err(ort_octo.predict(images, masks, lang, (init, steps)), whole) <= REL_TOL


def test_graph_interface_and_metadata(exported):
    engine, graphs = exported
    cfg = engine.cfg
    bb, sm = (onnx.load(str(p)) for p in (graphs.backbone, graphs.sampler))
    for m in (bb, sm):
        onnx.checker.check_model(m)
        meta = {p.key: p.value for p in m.metadata_props}
        assert meta["format"] == EXPORT_FORMAT and meta["exporter"].startswith("jax2onnx ")
        assert meta["opset"] == str(m.opset_import[0].version) == "18" and meta["jax"] == jax.__version__
        assert meta["params_sha256"] == params_digest(engine.params) and meta["latency_only"] == "true"
        ops = {n.op_type for n in m.graph.node}
        assert not ops & {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial"}
        assert not ops & {"Loop", "Scan", "If", "Einsum"}  # unrolled, and matmuls as MatMul/Gemm
        for i in m.graph.input:  # batch dynamic, the rest fixed
            dims = i.type.tensor_type.shape.dim
            assert dims[0].dim_param and all(d.dim_value > 0 for d in dims[1:])
    elem = {i.name: i.type.tensor_type.elem_type for i in bb.graph.input}
    assert list(elem) == backbone_input_names(cfg) == ["image_primary", "image_wrist", "lang_embedding", "masks",
                                                       "lang_mask", "goal_primary", "goal_wrist"]
    assert [elem[n] for n in elem] == ([onnx.TensorProto.UINT8] * 2 + [onnx.TensorProto.FLOAT] * 3  # float masks
                                       + [onnx.TensorProto.UINT8] * 2)  # goal images (tests/test_octo_goal.py)
    assert [o.name for o in bb.graph.output] == ["readout"]
    assert [i.name for i in sm.graph.input] == ["readout", "init_noise", "step_noise"]
    assert [o.name for o in sm.graph.output] == ["actions"]


def test_export_is_cached_by_parameter_digest(exported, shared_cache, monkeypatch):
    engine, graphs = exported
    monkeypatch.setenv("SAB_CACHE_DIR", str(shared_cache))
    import engines.octo.export as ex

    def no_export(*a, **k):
        raise AssertionError("exported again although the cache holds these weights")

    monkeypatch.setattr(ex, "export_octo", no_export)
    assert onnx_for_octo(engine, search=()) == graphs
    other = tiny_octo(seed=5)  # other weights: a different digest, so not the cached files
    assert params_digest(other.params) != params_digest(engine.params)
    with pytest.raises(AssertionError, match="exported again"):
        onnx_for_octo(other, search=())


def test_the_parameter_digest_is_the_weights_not_the_order_of_their_dicts():
    """`make engines` digests the tree it initialised or loaded (numpy, insertion order); a policy digests
    the OctoModel's tree (through jax.tree_util: keys sorted). The same weights must give one digest, or the
    policy never finds the graphs make engines built and exports its own (measured: random weights of
    octo-small were 07f1be2c... in the build and 8f1dd18b... in the policy)."""
    from engines.octo.testing import tiny_config

    engine = tiny_octo(seed=1)
    from dataclasses import replace

    built = init_params(replace(tiny_config(), diffusion_steps=engine.cfg.diffusion_steps), seed=1, with_t5=False)
    assert params_digest(built) == params_digest(engine.params)

    def reversed_tree(tree):
        return {k: reversed_tree(tree[k]) if isinstance(tree[k], dict) else tree[k] for k in reversed(list(tree))}

    assert params_digest(reversed_tree(built)) == params_digest(built)


@pytest.mark.kernels
def test_jax_runner_behind_the_same_interface(exported, ort_octo):
    engine, _ = exported
    cfg = engine.cfg
    images, masks, lang, noise = fresh_inputs(cfg, 31, 1)
    infer = make_infer(cfg)
    params = jax.tree_util.tree_map(jnp.asarray, without_t5(engine.params))

    def fn(image_primary, image_wrist, lang_embedding, masks, init_noise, step_noise):
        return {"actions": infer(params, [image_primary, image_wrist], lang_embedding, masks, init_noise,
                                 step_noise)}

    feeds = dict(zip(backbone_input_names(cfg)[:3], (*images, lang)), masks=masks, init_noise=noise[0],
                 step_noise=noise[1])
    with JaxRunner(fn, warmup=feeds) as r:
        got = r.infer(feeds)["actions"]
    assert rel_err(ort_octo.predict(images, masks, lang, noise), got) <= REL_TOL


_EXPORT_ONCE = """
import contextlib, hashlib, sys
from pathlib import Path
from engines.octo import export, jax2onnx_fast
from engines.octo.testing import tiny_octo
if sys.argv[2] == "jax2onnx":  # jax2onnx's own output check, unchanged
    jax2onnx_fast.fast_output_check = contextlib.nullcontext
m = tiny_octo(seed=3)
o = export.export_octo(m.cfg, m.params, sys.argv[1], "t", random_weights=True)
print(" ".join(hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in (o.backbone, o.sampler)))
"""


@pytest.mark.slow
def test_the_fast_output_check_exports_the_same_bytes_as_jax2onnxs_own(tmp_path):
    """engines.octo.jax2onnx_fast answers only where jax2onnx's scan would answer the same: the graphs of an
    export with it and without it are the same bytes. Each export is the first of a fresh process (a second
    export in one process traces other constants, so two of them differ whatever the check)."""
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    digests = {}
    for mode in ("fast", "jax2onnx"):
        proc = subprocess.run([sys.executable, "-c", _EXPORT_ONCE, str(tmp_path / mode), mode], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        digests[mode] = proc.stdout.split()
    assert digests["fast"] == digests["jax2onnx"]


def test_the_fast_output_check_answers_most_checks_without_the_scan(tmp_path, monkeypatch):
    """The check is in jax2onnx's hot path (one scan of the graph per equation output): with it, jax2onnx's
    own scan runs for almost none of them; a jax2onnx release that moved or renamed it fails here."""
    from jax2onnx.converter import output_binding

    from engines.octo import export
    from engines.octo.jax2onnx_fast import fast_output_check

    calls = {"all": 0, "scan": 0}
    scan = output_binding._value_is_graph_connected

    def counted_scan(ctx, value):
        calls["scan"] += 1
        return scan(ctx, value)

    monkeypatch.setattr(output_binding, "_value_is_graph_connected", counted_scan)
    real_check = fast_output_check

    @contextlib.contextmanager
    def counted_check():
        with real_check():
            fast = output_binding._value_is_graph_connected

            def counted_fast(ctx, value):
                calls["all"] += 1
                return fast(ctx, value)

            output_binding._value_is_graph_connected = counted_fast
            yield

    import engines.octo.jax2onnx_fast as fast_module

    monkeypatch.setattr(fast_module, "fast_output_check", counted_check)
    m = tiny_octo(seed=4)
    export.export_octo(m.cfg, m.params, tmp_path, "t", random_weights=True)
    assert calls["all"] > 100, calls
    assert calls["scan"] <= 0.05 * calls["all"], calls
