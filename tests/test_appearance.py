"""Appearance v2 (env.appearance): decimated visual meshes, the housing's hull, the ground as a quad; physics
untouched, meshes built once and read from the cache."""

from __future__ import annotations

import numpy as np
import pytest
import sapien
import trimesh

from env import appearance, make_env
from env.appearance import (APPEARANCE_VERSION, CONVEX_HULL_VISUALS, LOD_KEEP_FRACTION, LOD_MIN_TRIANGLES,
                            appearance_version, cache_key, scene_triangles, simplify_visuals)
from env.setups import get_setup
from env.tasklist import load
from eval.policies.scripted import ScriptedPolicy


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SAB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _render_body(entity):
    return entity.find_component_by_type(sapien.render.RenderBodyComponent)


def _entities(env):
    return [e for sub in env.unwrapped.scene.sub_scenes for e in sub.entities]


def _state(env) -> dict[str, np.ndarray]:
    u = env.unwrapped
    out = {k: v[0] for k, v in u.task_state().items()}
    out["qpos"] = u.agent.robot.get_qpos().numpy()
    out["qvel"] = u.agent.robot.get_qvel().numpy()
    for e in _entities(env):  # every body's pose, the robot's links included
        out[f"pose {e.name} {e.per_scene_id}"] = np.concatenate([e.pose.p, e.pose.q])
    return out


@pytest.mark.sim
def test_a_try_has_the_same_physical_state_under_either_appearance():
    """A scripted dev try of a clutter setup, stepped in both appearances: every state bit for bit equal."""
    setup, dev = "C02", load("dev")
    envs = [make_env(setup, obs_mode="state", visual_meshes=v) for v in ("source", "simplified")]
    try:
        for env in envs:
            env.reset(seed=dev.seed(setup, 0), options={"start": dev.start(setup, 0)})
        assert scene_triangles(envs[1].unwrapped.scene) < scene_triangles(envs[0].unwrapped.scene) / 5
        s = get_setup(setup)
        policy = ScriptedPolicy(clearance=s.clearance_m, latency_steps=s.latency_steps)
        policy.reset(envs[0].unwrapped.instructions[0], seed=0)
        for step in range(80):
            ref, other = _state(envs[0]), _state(envs[1])
            assert ref.keys() == other.keys()
            for k in ref:
                assert np.array_equal(ref[k], other[k]), f"step {step}: {k}"
            action = policy.act({"state": {k: v[0] for k, v in envs[0].unwrapped.task_state().items()}})
            infos = [env.step(action)[-1] for env in envs]
            assert {k: bool(v) for k, v in infos[0].items() if v.dtype == bool} == \
                   {k: bool(v) for k, v in infos[1].items() if v.dtype == bool}
    finally:
        for env in envs:
            env.close()


def _collision_description(env) -> dict:
    out = {}
    for e in _entities(env):
        for comp in e.components:
            if not isinstance(comp, sapien.physx.PhysxRigidBaseComponent):
                continue
            shapes = []
            for sh in comp.collision_shapes:
                geo = {"type": type(sh).__name__, "pose": np.concatenate([sh.local_pose.p, sh.local_pose.q]).tolist()}
                if hasattr(sh, "vertices"):
                    geo["vertices"] = np.asarray(sh.vertices).round(9).tolist()
                if hasattr(sh, "half_size"):
                    geo["half_size"] = np.asarray(sh.half_size).tolist()
                shapes.append(geo)
            mass = getattr(comp, "mass", None)
            out[f"{e.name} {e.per_scene_id}"] = (shapes, mass, np.asarray(getattr(comp, "inertia", [])).tolist())
    return out


def test_collision_shapes_and_masses_are_those_of_the_source_scene():
    a, b = (make_env("A01", obs_mode="state", visual_meshes=v) for v in ("source", "simplified"))
    try:
        assert _collision_description(a) == _collision_description(b)
    finally:
        a.close()
        b.close()


def test_v2_meshes_decimated_hulled_and_the_ground_two_triangles():
    a, b = (make_env("A01", obs_mode="state", visual_meshes=v) for v in ("source", "simplified"))
    try:
        source = {e.name: _render_body(e) for e in _entities(a) if _render_body(e) is not None}
        simple = {e.name: _render_body(e) for e in _entities(b) if _render_body(e) is not None}
        assert source.keys() == simple.keys()
        for name, body in source.items():
            parts = [p for s in body.render_shapes for p in getattr(s, "parts", [])]
            new = [p for s in simple[name].render_shapes for p in getattr(s, "parts", [])]
            files = {s.filename.rsplit("/", 1)[-1] for s in body.render_shapes if getattr(s, "filename", "")}
            if name.endswith(appearance.GROUND_NAME):
                assert [len(p.triangles) for p in new] == [2]
                continue
            assert len(new) == len(parts), name
            for p, q in zip(parts, new):
                for prop in ("base_color", "roughness", "metallic", "specular", "emission"):
                    assert np.allclose(getattr(q.material, prop), getattr(p.material, prop)), (name, prop)
                if len(p.triangles) <= LOD_MIN_TRIANGLES:
                    assert np.array_equal(p.vertices, q.vertices) and np.array_equal(p.triangles, q.triangles)
                elif files & set(CONVEX_HULL_VISUALS):
                    assert len(q.triangles) == len(trimesh.convex.convex_hull(p.vertices).faces)
                else:  # decimated to the kept fraction (the quadric decimation stops at its target)
                    assert len(q.triangles) <= round(LOD_KEEP_FRACTION * len(p.triangles)), name
                    assert len(q.triangles) >= 0.8 * LOD_KEEP_FRACTION * len(p.triangles), name
                    # it keeps the part's extent to within a third-person pixel at the arm, 2 mm (fov 1 rad over
                    # 256 pixels at about 0.5 m); quadric collapses move corners slightly
                    for got, want in ((q.vertices.min(0), p.vertices.min(0)), (q.vertices.max(0), p.vertices.max(0))):
                        assert np.abs(got - want).max() <= 2e-3, name
    finally:
        a.close()
        b.close()


def _images(env) -> dict[str, np.ndarray]:
    data = env.unwrapped._get_obs_sensor_data()
    return {k: v["rgb"][0].numpy() for k, v in data.items()}


@pytest.mark.sim
def test_the_ground_quad_renders_as_the_grid():
    """ManiSkill's grid's uvs are affine in x and y, so its corners' two triangles draw the same floor; pixels
    may differ only where rasterising another set of edges rounds an interpolated uv the other way."""
    a, b = (make_env("A01", obs_mode="rgb", visual_meshes="source") for _ in range(2))
    try:
        for env in (a, b):
            env.reset(seed=0)
        ground = [e for e in _entities(b) if e.name.endswith(appearance.GROUND_NAME)]
        assert simplify_visuals(ground) == {"triangles_before": 20000, "triangles_after": 2}
        ia, ib = _images(a), _images(b)
        hidden = b
        for k in ia:
            changed = (ia[k] != ib[k]).any(-1)
            assert changed.mean() <= 1e-3, k
        _render_body(ground[0]).visibility = 0.0  # and the ground is in the picture: hiding it shows
        assert (ia["third_person"] != _images(hidden)["third_person"]).any(-1).mean() > 0.01
    finally:
        a.close()
        b.close()


def test_decimated_meshes_are_built_once_and_read_from_the_cache(monkeypatch):
    env = make_env("A01", obs_mode="state")
    env.close()
    files = sorted(appearance.cache_dir().glob("*.npz"))
    assert files, "no decimated mesh was cached"
    panda = next(p for p in files if p.stem == cache_key(_link_file("link0.glb")))
    assert panda.exists()
    monkeypatch.setattr(appearance, "_DECIMATED", {})  # a new process: only the disk cache is left

    def refuse(*a, **k):
        raise AssertionError("decimated again although the cache has it")

    monkeypatch.setattr(appearance, "decimate_part", refuse)
    monkeypatch.setattr(appearance, "convex_hull_part", refuse)
    env = make_env("A01", obs_mode="state")
    try:
        assert scene_triangles(env.unwrapped.scene) < 100_000
    finally:
        env.close()
    # the key is the source file's sha256 and the settings
    assert cache_key(_link_file("link0.glb")) != cache_key(_link_file("link1.glb"))
    assert cache_key(_link_file("link0.glb"), 0.5) != cache_key(_link_file("link0.glb"))


def _link_file(name: str) -> str:
    import mani_skill

    from pathlib import Path

    return str(Path(mani_skill.__file__).parent / "assets/robots/panda/franka_description/meshes/visual" / name)


def test_appearance_version_names_the_meshes():
    assert appearance_version("simplified") == APPEARANCE_VERSION == 2
    assert appearance_version("source") == 1
    with pytest.raises(ValueError, match="visual_meshes 'low'"):
        appearance_version("low")
