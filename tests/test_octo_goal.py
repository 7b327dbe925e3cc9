"""Goal-image conditioning of Octo (upstream's task_stack_keys): the JAX model, the engine, the backbone ONNX
graph (ORT against JAX), the policy and its records, ``--goal-image`` on the command line, and the goal
rendered from a try's solved start."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from engines.backends import rel_err  # noqa: E402
from engines.octo.octo_model import goal_arrays  # noqa: E402
from engines.octo.model import embed_tokens, goal_cameras, make_backbone, make_infer  # noqa: E402
from engines.octo.params import init_params  # noqa: E402
from engines.octo.testing import tiny_config, tiny_octo  # noqa: E402
from tests.tolerances import reblocking_bound  # noqa: E402

REL_TOL = 1e-4  # as test_octo_export: fp32 graphs against JAX
INSTRUCTION = "put the square block into the square hole"


@pytest.fixture(scope="module")
def tiny():
    cfg = tiny_config()
    return cfg, init_params(cfg, seed=1)


@pytest.fixture(scope="module")
def backbone(tiny):
    cfg, _ = tiny
    return jax.jit(make_backbone(cfg))


def inputs(cfg, seed=0, batch=1):
    rs = np.random.default_rng(seed)
    images = [rs.integers(0, 256, (batch, cfg.window, *c.image_size, 3), dtype=np.uint8) for c in cfg.cameras]
    masks = np.ones((batch, cfg.window, 1 + len(cfg.cameras)), np.float32)
    masks[0, 0, 0] = 0.0  # a padded first step
    lang = rs.normal(size=(batch, cfg.lang_tokens, cfg.t5.d_model)).astype(np.float32)
    return images, masks, lang


def goal_images(cfg, seed=5, batch=1, cameras=None):
    rs = np.random.default_rng(seed)
    return {c.name: rs.integers(0, 256, (batch, *c.image_size, 3), dtype=np.uint8) for c in cfg.cameras
            if c.stack_task_image and (cameras is None or c.name in cameras)}


# ------------------------------------------------------------------ the JAX model and engine
def test_goal_cameras_are_the_task_stacking_ones(tiny):
    cfg, _ = tiny
    assert goal_cameras(cfg) == ["primary", "wrist"]  # Octo 1.5: task_stack_keys on both tokenizers


@pytest.mark.kernels
@pytest.mark.slow
def test_zero_goal_is_todays_model_bit_for_bit(tiny, backbone):
    """A goal of zeros (upstream's stand-in for a language-only task) gives exactly the readout and actions of
    the model given no goal, the path every pinned value and parity test runs."""
    cfg, params = tiny
    images, masks, lang = inputs(cfg, batch=2)
    zeros = {k: np.zeros_like(v) for k, v in goal_images(cfg, batch=2).items()}
    plain = np.asarray(backbone(params, images, lang, masks))
    np.testing.assert_array_equal(np.asarray(backbone(params, images, lang, masks, goals=zeros)), plain)
    # the tokens themselves: zeros stacked after the observation's channels are today's constant -1
    a = np.asarray(embed_tokens(params, cfg, images, lang))
    b = np.asarray(embed_tokens(params, cfg, images, lang, goals=zeros))
    np.testing.assert_array_equal(a, b)
    engine = tiny_octo()
    rs = np.random.default_rng(3)
    noise = (rs.normal(size=(2, engine.cfg.flat_action_dim)).astype(np.float32),
             rs.normal(size=(engine.cfg.diffusion_steps, 2, engine.cfg.flat_action_dim)).astype(np.float32))
    today = engine.predict(images, masks, lang, noise=noise)
    given = engine.predict(images, masks, lang, noise=noise,
                           goals={"primary": np.zeros((32, 32, 3), np.uint8)})  # one image, broadcast
    np.testing.assert_array_equal(given, today)


@pytest.mark.kernels
def test_a_goal_image_changes_the_readout_and_only_its_rows(tiny, backbone):
    cfg, params = tiny
    images, masks, lang = inputs(cfg, seed=1, batch=2)
    plain = np.asarray(backbone(params, images, lang, masks))
    goals = goal_images(cfg, batch=2, cameras=("primary",))
    goals["primary"][1] = 0  # row 1 keeps the zero goal
    got = np.asarray(backbone(params, images, lang, masks, goals=goals))
    assert rel_err(got[0], plain[0]) > 1e-2  # the goal is seen
    np.testing.assert_array_equal(got[1], plain[1])  # rows do not mix
    # (the tiny wrist camera's 16x16 image shrinks to 1x1 before its last GroupNorm, which then outputs a
    # constant: neither its frames nor its goal can change anything, so only the primary goal is checked)


@pytest.mark.kernels
def test_goal_is_stacked_after_the_observation_channels_as_upstream(tiny):
    """Upstream ImageTokenizer: concatenate([observation, goal repeated over the window], -1) before the
    encoder, which normalises the stack (per pixel, so as normalising each part): the primary tokens equal a
    stem run on that stack, and not on the other order."""
    from engines.octo.model import dense, normalize_images, small_stem

    cfg, params = tiny
    images, _, lang = inputs(cfg, seed=2)
    goal = goal_images(cfg, cameras=("primary",))["primary"]
    cam = cfg.cameras[0]
    ot = params["octo_transformer"]
    w = cfg.window
    obs = normalize_images(images[0][0])  # (W, H, W, 3)
    g = jnp.broadcast_to(normalize_images(goal), obs.shape)
    tokens = np.asarray(embed_tokens(params, cfg, images, lang, goals={"primary": goal}))[0]
    per = cfg.tokens_per_step
    got = np.stack([tokens[cfg.n_task_tokens + t * per:][:cam.num_tokens] for t in range(w)])
    for stack, same in (([obs, g], True), ([g, obs], False)):
        t = small_stem(ot["observation_tokenizers_primary"]["SmallStem16_0"], cam, jnp.concatenate(stack, -1))
        ref = np.asarray(dense(ot["obs_primary_projection"], t[None]) + ot["obs_primary_pos_embedding"][:, :w])[0]
        assert (rel_err(got, ref) <= 1e-5) == same


def test_goal_arrays_check_cameras_and_shapes(tiny):
    cfg, _ = tiny
    assert goal_arrays(cfg, None, 2) is None and goal_arrays(cfg, {}, 2) is None
    g = goal_arrays(cfg, {"primary": np.ones((32, 32, 3), np.uint8)}, 3)
    assert list(g) == ["primary"] and g["primary"].shape == (3, 32, 32, 3)
    with pytest.raises(ValueError, match="expected"):
        goal_arrays(cfg, {"primary": np.ones((16, 16, 3), np.uint8)}, 1)
    with pytest.raises(ValueError, match="uint8"):
        goal_arrays(cfg, {"primary": np.ones((32, 32, 3), np.float32)}, 1)
    with pytest.raises(ValueError, match="takes no goal"):
        goal_arrays(cfg, {"elbow": np.ones((32, 32, 3), np.uint8)}, 1)


# ------------------------------------------------------------------ the ONNX backbone against JAX
@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    pytest.importorskip("jax2onnx")
    pytest.importorskip("onnxruntime")
    from engines.octo.export import onnx_for_octo
    from engines.octo.runners import OnnxOcto
    from engines.runners import OnnxRuntimeRunner

    mp = pytest.MonkeyPatch()
    mp.setenv("SAB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "sab-cache"))  # shared with test_octo_export
    engine = tiny_octo()
    graphs = onnx_for_octo(engine, search=(), progress=False)
    mp.undo()
    ort = OnnxOcto(engine.cfg, OnnxRuntimeRunner(graphs.backbone), OnnxRuntimeRunner(graphs.sampler)).activate()
    return engine, graphs, ort


def test_backbone_graph_takes_goal_inputs_and_a_new_cache_name(exported):
    import onnx

    from engines.octo.export import EXPORT_FORMAT, backbone_input_names, goal_input_names

    engine, graphs, _ = exported
    assert goal_input_names(engine.cfg) == ["goal_primary", "goal_wrist"]
    bb = onnx.load(str(graphs.backbone))
    inputs_ = {i.name: i for i in bb.graph.input}
    assert list(inputs_) == backbone_input_names(engine.cfg)
    for name, (h, w) in (("goal_primary", (32, 32)), ("goal_wrist", (16, 16))):
        t = inputs_[name].type.tensor_type
        dims = t.shape.dim
        assert t.elem_type == onnx.TensorProto.UINT8 and dims[0].dim_param
        assert [d.dim_value for d in dims[1:]] == [h, w, 3]
    # graphs of the format before goal inputs are never taken: another format, another file name
    assert EXPORT_FORMAT.endswith("/2") and graphs.backbone.name.endswith("_f2_backbone.onnx")


@pytest.mark.kernels
@pytest.mark.parametrize("batch,seed", [(1, 41), (3, 42)])
def test_ort_matches_jax_with_a_goal(exported, backbone, batch, seed):
    engine, _, ort = exported
    cfg = engine.cfg
    images, masks, lang = inputs(cfg, seed, batch)
    goals = goal_images(cfg, seed + 1, batch, cameras=("primary",) if batch == 1 else None)
    ref = np.asarray(backbone(engine.params, images, lang, masks, goals=goals))
    got = ort.readout(images, masks, lang, goals=goals)
    assert got.shape == (batch, cfg.token_dim) and rel_err(got, ref) <= REL_TOL
    plain = np.asarray(backbone(engine.params, images, lang, masks))
    assert rel_err(got, plain) > 100 * REL_TOL  # the graph sees the goal
    # no goal: the graph is fed zeros, today's readout
    assert rel_err(ort.readout(images, masks, lang), plain) <= REL_TOL


@pytest.mark.kernels
@pytest.mark.slow
def test_runners_take_goal_feeds_alike(exported):
    """The runner interface (feeds): JaxOcto and OnnxOcto give the same actions with a goal_primary feed."""
    from engines.octo.runners import JaxOcto

    engine, _, ort = exported
    cfg = engine.cfg
    images, masks, lang = inputs(cfg, 51, 2)
    init, steps = engine.draw_noise(jax.random.PRNGKey(4), 2)
    feeds = {f"image_{c.name}": img for c, img in zip(cfg.cameras, images)}
    feeds.update(masks=masks, lang=lang, init_noise=init, step_noise=np.swapaxes(steps, 0, 1),
                 goal_primary=goal_images(cfg, 52, 2)["primary"])
    jax_runner = JaxOcto(engine).activate()
    a_jax = jax_runner.infer(feeds)["actions"]
    ref = np.asarray(jax.jit(make_infer(cfg))(engine.params, images, lang, masks, init, steps,
                                              goals={"primary": feeds["goal_primary"]}))
    np.testing.assert_allclose(a_jax, ref, rtol=0, atol=1e-6)
    assert rel_err(ort.infer(feeds)["actions"], a_jax) <= 1e-3  # the sampler amplifies readout rounding
    without = jax_runner.infer({k: v for k, v in feeds.items() if k != "goal_primary"})["actions"]
    assert not np.allclose(without, a_jax)

    def rows(n):  # the two rows, then the first repeated up to n rows: the runner's own padding
        return {k: np.concatenate([v] + [v[:1]] * (n - 2)) for k, v in feeds.items()}

    # three rows run as the padded batch of four, its goal rows padded like the others: the same program on the
    # same inputs as four rows given, so equal bit for bit
    three = jax_runner.infer(rows(3))["actions"]
    np.testing.assert_array_equal(three, jax_runner.infer(rows(4))["actions"][:3])
    # and the two rows in a batch of four agree with them alone to the rounding another blocking gives (the
    # same rows at batch 1, 8 and 16, measured here: XLA blocks GEMMs per batch size and CPU)
    alone = np.concatenate([jax_runner.infer({k: v[i:i + 1] for k, v in feeds.items()})["actions"] for i in (0, 1)])
    bound = reblocking_bound(a_jax, [alone] + [jax_runner.infer(rows(n))["actions"][:2] for n in (8, 16)])
    assert np.max(np.abs(three[:2] - a_jax)) <= bound
    assert bound < 1e-2 * np.max(np.abs(a_jax - without))  # far below what a wrong goal row would change


# ------------------------------------------------------------------ the policy
def _png(path, img):
    from PIL import Image

    Image.fromarray(img).save(path)
    return path


def _observation(seed=0):
    rs = np.random.default_rng(seed)
    return {"images": {"third_person": rs.integers(0, 256, (256, 256, 3), dtype=np.uint8),
                       "wrist": rs.integers(0, 256, (128, 128, 3), dtype=np.uint8)},
            "proprio": np.zeros(9, np.float32), "instruction": INSTRUCTION}


@pytest.mark.slow
def test_policy_with_a_goal_file(tmp_path):
    from eval.request import make_policy
    from eval.policies.octo import preprocess

    engine = tiny_octo()
    goal = np.random.default_rng(9).integers(0, 256, (64, 80, 3), dtype=np.uint8)
    path = _png(tmp_path / "goal.png", goal)
    plain = make_policy("octo-small", engine=engine)
    with_goal = make_policy("octo-small", engine=engine, goal_image=str(path))
    assert plain.record_fields() == {}
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert with_goal.record_fields() == {"goal_image": "file", "goal_sha256": sha}
    for p in (plain, with_goal):
        p.reset(INSTRUCTION, seed=2)
    feeds = with_goal.encode(_observation(0))
    # the goal is preprocessed as the primary frames are: resized to the camera's size, average crop
    np.testing.assert_array_equal(feeds["goal_primary"][0], preprocess(goal, (32, 32), average_crop=True))
    assert "goal_wrist" not in feeds and "goal_primary" not in plain.encode(_observation(0))
    plain.reset(INSTRUCTION, seed=2)
    with_goal.reset(INSTRUCTION, seed=2)
    a_plain = plain.query(_observation(0))
    a_goal = with_goal.query(_observation(0))
    assert a_plain.shape == a_goal.shape == (7,)
    assert not np.allclose(plain.last_chunk, with_goal.last_chunk)
    # spawned scenes share the goal and batch it
    other = with_goal.spawn()
    other.reset(INSTRUCTION, seed=3)
    assert other.record_fields() == with_goal.record_fields()
    from eval.policies.base import query_members

    with_goal.reset(INSTRUCTION, seed=2)
    actions, _, ran = query_members([with_goal, other], [_observation(0), _observation(0)])
    assert ran == [True, True] and actions.shape == (2, 7)


def test_policy_with_a_goal_source_per_try():
    """A callable goal (what ``--goal-image solved`` gives) is asked at every reset with the try's start (given
    by the rollout through set_start) and instruction; the record names it and the pixels' sha256."""
    from eval.request import make_policy

    asked = []

    class Source:
        label = "solved"

        def __call__(self, start, instruction):
            asked.append((start, instruction))
            return np.full((256, 256, 3), start, np.uint8)

    pol = make_policy("octo-small", engine=tiny_octo(), goal_image=None)
    from eval.policies.octo import OctoPolicy

    pol = OctoPolicy(pol.engine, pol.runner, goal=Source())
    pol.set_start(7)  # a stand-in for the try's start
    pol.reset(INSTRUCTION, seed=3)
    assert asked == [(7, INSTRUCTION)]
    rec = pol.record_fields()
    assert rec == {"goal_image": "solved",
                   "goal_sha256": hashlib.sha256(np.full((256, 256, 3), 7, np.uint8).tobytes()).hexdigest()}
    feeds = pol.encode(_observation(0))
    assert feeds["goal_primary"].shape == (1, 32, 32, 3) and np.all(feeds["goal_primary"] == 7)


# ------------------------------------------------------------------ the command line
def _main(capsys, *args):
    from eval.run import main

    rc = main(list(args))
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return rc, lines


@pytest.mark.parametrize("kind", ["missing", "not_an_image", "wrong_model"])
def test_bad_goal_image_is_one_line(tmp_path, capsys, kind):
    out = tmp_path / "run"
    if kind == "missing":
        args = ("--model", "octo-small", "--random-weights", "--goal-image", str(tmp_path / "nope.png"))
        needle = "cannot read it"
    elif kind == "not_an_image":
        bad = tmp_path / "goal.png"
        bad.write_text("not a picture\n")
        args = ("--model", "octo-small", "--random-weights", "--goal-image", str(bad))
        needle = "not an image"
    else:
        good = _png(tmp_path / "goal.png", np.zeros((8, 8, 3), np.uint8))
        args = ("--model", "bc-state", "--goal-image", str(good))
        needle = "bc-state takes no --goal-image"
    rc, lines = _main(capsys, *args, "--split", "dev", "--setups", "A01", "--tries", "1", "--out", str(out))
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert not (out / "run.json").exists()


def test_goal_image_option_reaches_the_factory_as_an_absolute_path(tmp_path, monkeypatch):
    from eval.request import MODEL_CONFIGS, model_config, options_from_args
    from eval.run import build_parser

    assert "goal_image" in {f.name for f in MODEL_CONFIGS["octo-small"].option_fields()}
    assert "goal_image" not in {f.name for f in MODEL_CONFIGS["bc-state"].option_fields()}
    args = build_parser().parse_args(["--model", "octo-small", "--goal-image", "solved", "--out", "x"])
    assert options_from_args(args)["goal_image"] == "solved"
    monkeypatch.chdir(tmp_path)
    assert model_config("octo-small", goal_image="g.png").goal_image == str(tmp_path / "g.png")
    from eval.orin import build_parser as orin_parser

    assert orin_parser().parse_args(["--model", "octo-small", "--goal-image", "g.png", "--out", "x"]).goal_image


def test_solved_goal_needs_a_setup():
    from eval.policies.octo import GoalImageError, resolve_goal

    with pytest.raises(GoalImageError, match="needs a setup"):
        resolve_goal("solved", None)
    assert resolve_goal(None) is None


# ------------------------------------------------------------------ the goal rendered from the solved start
def test_solved_start_seats_the_target_blocks_in_their_holes():
    from env import geometry
    from env.setups import get_setup
    from env.starts import sample_start
    from eval.policies.octo import solved_start

    for sid in ("A01", "B01"):
        start = sample_start(get_setup(sid), np.random.default_rng(11))
        solved = solved_start(start)
        c, s = np.cos(start.board_yaw), np.sin(start.board_yaw)
        for before, after in zip(start.blocks, solved.blocks):
            if start.target in ("all", before.shape):
                cx, cy = geometry.cell_centres()[before.shape]
                hole = np.array([start.board_x + c * cx - s * cy, start.board_y + s * cx + c * cy])
                np.testing.assert_allclose([after.x, after.y], hole, atol=1e-12)
                assert after.yaw == start.board_yaw
            else:
                assert after == before
        assert (solved.board_x, solved.board_y, solved.colors) == (start.board_x, start.board_y, start.colors)


@pytest.mark.sim
def test_solved_goal_renders_the_try_with_its_block_in_the_hole():
    pytest.importorskip("mani_skill")
    import torch

    from env import geometry
    from env.setups import get_setup
    from env.tasklist import load
    from eval.policies.octo import GoalImageError, SolvedGoal, solved_start

    setup = get_setup("A01")
    start = load("dev").start("A01", 1)
    goal = SolvedGoal(setup)
    try:
        from env.task import INSTRUCTION as SAID

        with pytest.raises(GoalImageError, match="needs the try's start"):
            goal(None, SAID.format(shape=start.target))
        img = goal(start, SAID.format(shape=start.target))
        assert img.shape == (256, 256, 3) and img.dtype == np.uint8
        u = goal._env.unwrapped
        k = geometry.SHAPES.index(start.target)
        xy = u.blocks[start.target].pose.p[0, :2]
        assert torch.allclose(xy, u._hole_world_xy(k)[0], atol=1e-4)  # in its hole
        before = goal.render_start(start)
        assert before.shape == img.shape and np.abs(before.astype(int) - img.astype(int)).max() > 50
        with pytest.raises(ValueError, match="but the try says"):
            goal(start, "put the nothing block into the nothing hole")
    finally:
        goal.close()


def test_solved_goal_is_rendered_with_the_runs_arm():
    """The executors give policy factories the run's --arm: a solved goal shows the robot of the run."""
    from env.arms import ARMS
    from env.setups import get_setup
    from eval.request import make_policy

    arm = [a for a in ARMS if a != "panda"][0]
    pol = make_policy("octo-small", setup=get_setup("A01"), arm=arm, goal_image="solved", engine=tiny_octo())
    try:
        assert pol._goal_source.arm == arm and pol._goal_source.setup.id == "A01"
    finally:
        pol.close()
