"""The scene's appearance version and its visual meshes at the detail the cameras can show.

The cameras are 256x256 (third person) and 128x128 (wrist), and CPU rendering (lavapipe) is bound by the
triangles a frame sends, not by its pixels: as loaded, the Panda scene sent 582k triangles a frame, 425k of
them the wrist camera's housing (``camera_link``, a RealSense CAD model of 1083 pieces), 20k the ground
(ManiSkill's 100x100 grid of a plane), about 150k the Panda links. Appearance v2 renders:

- every visual mesh part of more than ``LOD_MIN_TRIANGLES`` triangles decimated to ``LOD_KEEP_FRACTION`` of
  them (quadric edge collapse: trimesh's ``simplify_quadric_decimation``, backed by fast-simplification), the
  level chosen by measured image difference (``benchmarks/render_cost.py``, ``results/benchmarks/
  render_cost.json``); flat-shaded like the source meshes (their vertex normals are their face normals);
- the ground as the two triangles of its corners, with the grid's own texture coordinates (the grid's are an
  affine function of x and y, so two triangles interpolate the same ones).

Only render bodies change: collision shapes, masses and every other physical property are the ones built
by ManiSkill and SAPIEN, so a try's physical state is the same under either appearance
(``tests/test_appearance.py``). Decimated meshes are built on first use and kept in the project's cache
(``<cache_root>/visual_meshes/``), named by the sha256 of the source file and the settings, so a scene built
again, by any worker, only reads them. Records and benchmark results name ``APPEARANCE_VERSION``.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np

from env.cache import cache_root, reuse, write_sealed

# v1: the visual meshes as ManiSkill and SAPIEN load them; v2: decimated visual meshes, the ground as a quad
APPEARANCE_VERSION = 2
VISUAL_MESHES = ("simplified", "source")  # source: v1's meshes, for the frame comparison and the tests only
LOD_MIN_TRIANGLES = 2000  # parts with fewer triangles are left as loaded (the boards, blocks, fingers, table)
LOD_KEEP_FRACTION = 0.35  # of a larger part's triangles (benchmarks/render_cost.py's lod part chose it)
# visual meshes drawn as their convex hull (trimesh's): the wrist camera's housing, a 10 x 2.3 x 2 cm bar of
# 1083 CAD pieces (boards, screws, lenses inside) that quadric decimation cannot merge below 14k triangles; it
# covers about 1% of the third-person frame and none of the wrist camera's
CONVEX_HULL_VISUALS = ("d415.stl",)
DECIMATION_PACKAGE = "fast_simplification"  # trimesh's quadric decimation backend, pinned in the lock
GROUND_NAME = "ground"  # ManiSkill's TableSceneBuilder names its ground actor so


class MissingDecimationError(ImportError):
    """A mesh has to be decimated and the decimation backend is not installed (one line)."""


def appearance_version(visual_meshes: str) -> int:
    """The appearance version a scene built with ``visual_meshes`` renders."""
    if visual_meshes not in VISUAL_MESHES:
        raise ValueError(f"visual_meshes {visual_meshes!r}: valid: {', '.join(VISUAL_MESHES)}")
    return APPEARANCE_VERSION if visual_meshes == "simplified" else 1


def _settings(keep_fraction: float) -> dict:
    import sapien

    # what the decimated parts depend on besides the source file: SAPIEN's loader (the parts it reads)
    return {"keep_fraction": keep_fraction, "min_triangles": LOD_MIN_TRIANGLES, "hulls": CONVEX_HULL_VISUALS, "sapien": sapien.__version__,
            "decimation": f"{DECIMATION_PACKAGE}=={_backend_version()}", "appearance": APPEARANCE_VERSION}


@functools.lru_cache(maxsize=None)
def _backend_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DECIMATION_PACKAGE.replace("_", "-"))
    except PackageNotFoundError:
        return "missing"


@functools.lru_cache(maxsize=None)
def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_key(source_file: str, keep_fraction: float = LOD_KEEP_FRACTION) -> str:
    """The cache name of a source file's decimated parts: its sha256 and the settings."""
    settings = json.dumps(_settings(keep_fraction), sort_keys=True)
    return hashlib.sha256(f"{_file_sha256(source_file)}\n{settings}".encode()).hexdigest()[:32]


def cache_dir() -> Path:
    return cache_root() / "visual_meshes"


def decimate_part(vertices: np.ndarray, triangles: np.ndarray, keep_fraction: float) -> dict[str, np.ndarray]:
    """One mesh part decimated to ``keep_fraction`` of its triangles, flat-shaded as the source meshes are
    (each face its own corners and normal), as the arrays a ``RenderShapeTriangleMesh`` is built from."""
    import trimesh

    try:
        __import__(DECIMATION_PACKAGE)
    except ImportError:
        raise MissingDecimationError(
            f"decimating the scene's visual meshes needs {DECIMATION_PACKAGE.replace('_', '-')} (trimesh's "
            "quadric decimation backend): pip install fast-simplification==0.2.0, or build the env with "
            "visual_meshes='source'") from None
    welded = trimesh.Trimesh(vertices, triangles, process=True)  # the loaded parts repeat corners: weld them
    simple = welded.simplify_quadric_decimation(face_count=max(4, int(round(keep_fraction * len(triangles)))))
    return _flat(simple)


def convex_hull_part(vertices: np.ndarray) -> dict[str, np.ndarray]:
    """One mesh part as its convex hull, flat-shaded."""
    import trimesh

    return _flat(trimesh.convex.convex_hull(vertices))


def _flat(mesh) -> dict[str, np.ndarray]:
    corners = mesh.vertices[mesh.faces].reshape(-1, 3)
    return {"vertices": corners.astype(np.float32), "triangles": np.arange(len(corners), dtype=np.uint32).reshape(-1, 3),
            "normals": np.repeat(mesh.face_normals, 3, axis=0).astype(np.float32)}


_DECIMATED: dict[str, tuple] = {}  # cache file -> parts, for the scenes this process builds again


def decimated_parts(shape, keep_fraction: float = LOD_KEEP_FRACTION) -> tuple:
    """The parts of a shape loaded from a file, each decimated, or ``None`` where it is small enough as it
    is: read from the cache (memory, then disk), else built from the loaded parts and stored."""
    path = cache_dir() / f"{cache_key(shape.filename, keep_fraction)}.npz"
    if str(path) in _DECIMATED:
        return _DECIMATED[str(path)]
    if reuse(path, "decimated visual mesh"):  # sealed (env.cache): a damaged file is built again
        with np.load(path) as z:
            out = tuple({"vertices": z[f"v{i}"], "triangles": z[f"t{i}"], "normals": z[f"n{i}"]}
                        if f"v{i}" in z.files else None for i in range(int(z["parts"])))
    else:
        hull = Path(shape.filename).name in CONVEX_HULL_VISUALS
        out = tuple(None if not _decimated(p) else convex_hull_part(p.vertices) if hull
                    else decimate_part(p.vertices, p.triangles, keep_fraction) for p in shape.parts)
        arrays = {"parts": np.array(len(out))}
        for i, part in enumerate(out):
            if part is not None:
                arrays.update({f"v{i}": part["vertices"], f"t{i}": part["triangles"], f"n{i}": part["normals"]})
        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)

        write_sealed(path, write)  # whole, then sealed: workers build scenes at once
    _DECIMATED[str(path)] = out
    return out


def _decimated(part) -> bool:
    """A part v2 decimates: large, and with no texture (decimation keeps no texture coordinates)."""
    m = part.material
    return len(part.triangles) > LOD_MIN_TRIANGLES and all(getattr(m, t) is None for t in (
        "base_color_texture", "normal_texture", "roughness_texture", "metallic_texture", "emission_texture"))


def _copy_of(shape, parts: list[dict | None]):
    """New triangle-mesh shapes for one loaded shape: each part as decimated, or as loaded where ``None``,
    with the part's own material object and the shape's pose, scale, front face and name."""
    import sapien

    new = []
    for part, arrays in zip(shape.parts, parts):
        if arrays is None:
            arrays = {"vertices": part.vertices, "triangles": part.triangles, "normals": part.get_vertex_normal(),
                      "uvs": part.get_vertex_uv()}
        uvs = arrays.get("uvs", np.zeros((len(arrays["vertices"]), 2), np.float32))
        s = sapien.render.RenderShapeTriangleMesh(arrays["vertices"], arrays["triangles"], arrays["normals"],
                                                  uvs, part.material)
        s.set_scale(shape.scale)
        s.set_front_face(shape.get_front_face())
        s.local_pose = shape.local_pose
        s.name = shape.name
        new.append(s)
    return new


def _replace_body(entity, shapes) -> None:
    import sapien

    old = entity.find_component_by_type(sapien.render.RenderBodyComponent)
    body = sapien.render.RenderBodyComponent()
    for s in shapes:
        body.attach(s)
    body.name = old.name
    body.visibility = old.visibility
    entity.remove_component(old)
    entity.add_component(body)


def _ground_quad(shape):
    """The ground grid's four corners as two triangles (same winding), with their normals and uvs."""
    import sapien

    (part,) = shape.parts
    v = part.vertices
    corner = [int(np.argmin(v[:, 0] + v[:, 1])), int(np.argmax(v[:, 0] - v[:, 1])),
              int(np.argmax(v[:, 0] + v[:, 1])), int(np.argmin(v[:, 0] - v[:, 1]))]  # counter-clockwise from z
    grid_up = np.cross(*(v[part.triangles[0][1:]] - v[part.triangles[0][0]]))[2] > 0
    tris = np.array([[0, 1, 2], [0, 2, 3]] if grid_up else [[0, 2, 1], [0, 3, 2]], np.uint32)
    quad = sapien.render.RenderShapeTriangleMesh(v[corner], tris, part.get_vertex_normal()[corner],
                                                 part.get_vertex_uv()[corner], part.material)
    quad.local_pose = shape.local_pose
    quad.name = shape.name
    return quad


def simplify_visuals(entities, keep_fraction: float = LOD_KEEP_FRACTION) -> dict[str, int]:
    """Give the entities' render bodies appearance v2's meshes (see the module docstring; another
    ``keep_fraction`` for the benchmark's level-of-detail sweep); returns the triangles their render bodies
    had and have."""
    import sapien

    before = after = 0
    for entity in entities:
        body = entity.find_component_by_type(sapien.render.RenderBodyComponent)
        if body is None or not body.render_shapes:
            continue
        shapes = body.render_shapes
        before += sum(_triangles(s) for s in shapes)
        if not all(isinstance(s, sapien.render.RenderShapeTriangleMesh) for s in shapes):
            after += sum(_triangles(s) for s in shapes)  # primitives (boxes): left as they are
            continue
        if entity.name.endswith(GROUND_NAME) and len(shapes) == 1 and not shapes[0].filename:
            new = [_ground_quad(shapes[0])]
        elif any(s.filename and any(_decimated(p) for p in s.parts) for s in shapes):
            new = [c for s in shapes for c in _copy_of(s, decimated_parts(s, keep_fraction) if s.filename else [None] * len(s.parts))]
        else:
            after += sum(_triangles(s) for s in shapes)
            continue
        _replace_body(entity, new)
        after += sum(_triangles(s) for s in new)
    return {"triangles_before": before, "triangles_after": after}


def _triangles(shape) -> int:
    return sum(len(p.triangles) for p in shape.parts) if hasattr(shape, "parts") else 12  # a primitive: a box's


def scene_triangles(scene) -> int:
    """Triangles the render bodies of a ManiSkill scene's first sub-scene hold (what one frame sends)."""
    import sapien

    return sum(_triangles(s) for e in scene.sub_scenes[0].entities
               for b in [e.find_component_by_type(sapien.render.RenderBodyComponent)] if b is not None
               for s in b.render_shapes)
