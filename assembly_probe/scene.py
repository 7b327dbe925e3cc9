"""Static scenes for the reasoning probe: boards, blocks, cameras, placement and rendering.

A *state* is a plain JSON-able dict, the exact simulator state of a still scene::

    {"board": {"x", "y", "yaw", "cell_size", "cells": [[shape, cx, cy], ...]},
     "blocks": [{"id", "shape", "color", "x", "y", "z", "yaw"}, ...]}

(board frame as in env.geometry; block x, y, z is the prism centre in world
frame, yaw about world z). Poses are placed analytically, never simulated: a
block on the table has z = H/2, on another block z = below + H + knob, resting
on the plate z = plate top + H/2, inserted (fallen through its hole) it stands
on the table under the hole. The renderer draws the same meshes as the
benchmark task (env.geometry pieces, env.task mesh cache) without the robot.
"""

from __future__ import annotations

import hashlib
import json
import math
from functools import lru_cache

import numpy as np

from env import exact, geometry

H = geometry.BLOCK_HEIGHT
Z_TABLE = H / 2
Z_PLATE = geometry.PLATE_TOP_Z + H / 2
STACK_DZ = H + geometry.KNOB_HEIGHT  # the upper block rests on the lower block's knob
# 384 px and a workspace framed to fill each view: a block is 25-35 px across in the scene views (issue 35: at
# 256 px and the wide views before, 15-25 px)
IMAGE_SIZE = 384
FOVY = 0.7  # rad

# colour name -> rgb; names go into prompts, so every block in a scene has its own colour
PALETTE = {
    "red": (0.85, 0.2, 0.15), "blue": (0.15, 0.35, 0.85), "yellow": (0.95, 0.75, 0.1),
    "green": (0.2, 0.65, 0.25), "purple": (0.55, 0.25, 0.7), "orange": (1.0, 0.5, 0.05),
    "cyan": (0.1, 0.75, 0.8), "white": (0.95, 0.95, 0.95), "black": (0.08, 0.08, 0.08),
}
DEFAULT_COLOR = {"circle": "red", "square": "blue", "triangle": "yellow"}  # the benchmark's colours
BOARD_RGB = (0.55, 0.42, 0.3)
TABLE_RGB = (0.70, 0.63, 0.52)  # light warm beige: neither a block colour nor the board, and unlike white or black
# a key light with shadows (they show what rests on what, and how high) and a fill light without: (direction,
# intensity); the ambient keeps faces turned from both readable. No face saturates (all below 1.0 in linear rgb).
AMBIENT = 0.35
KEY_LIGHT = ((-0.35, 0.45, -1.0), 0.75)
FILL_LIGHT = ((0.3, -0.2, -1.0), 0.25)
SHADOW_MAP_SIZE = 1024
SHADOW_HALF_EXTENT = 0.6  # m: the key light's shadow box covers the workspace

# Where the scenes' blocks lie: the standard scenes' table region (x, y ranges) next to the benchmark board, and
# the planning scenes' stacks behind the 3x3 board. Each camera is framed on its scenes' workspace: the box over
# the board and these regions, up to the tallest stack, fills about 94% of the picture (tests check the corners).
TABLE_REGION = ((-0.21, -0.07), (-0.16, 0.16))
STACK_REGION = ((-0.28, -0.10), (-0.15, 0.15))
# camera name -> (eye, target); every camera looks at the workspace from its own side
CAMERAS = {
    "front": ((0.525, 0.0, 0.534), (-0.035, 0.0, 0.03)),  # from beyond the board, like the benchmark's third-person view
    "side": ((-0.035, 0.657, 0.543), (-0.035, 0.0, 0.03)),
    "robot": ((-0.667, 0.0, 0.523), (-0.035, 0.0, 0.03)),  # from the robot's base
    "top": ((-0.029, 0.0, 0.753), (-0.035, 0.0, 0.03)),
    "plan": ((0.473, 0.0, 0.685), (-0.06, 0.0, 0.05)),  # planning scenes: the 3x3 board and the stacks behind it
    "part": ((0.321, 0.0, 0.28), (-0.12, 0.0, 0.025)),  # a close view of parts alone (see part_state)
}
PART_XY = (-0.12, 0.0)  # where part_state puts its parts: the "part" camera's target
PART_SPACING = 0.075
PARKED_BOARD = (3.0, 0.0)  # a part image's board: on the table behind the "part" camera, out of view


def part_state(blocks: list[dict], board: dict) -> dict:
    """A picture of parts alone (LEGO instructions' part call-out): ``blocks`` side by side on the table at
    the "part" camera's target, the board moved out of view, yaws kept."""
    n = len(blocks)
    out = []
    for i, b in enumerate(blocks):
        dy = (i - (n - 1) / 2) * PART_SPACING
        out.append(dict(b, x=PART_XY[0], y=PART_XY[1] + dy, z=Z_TABLE))
    return {"board": dict(board, x=PARKED_BOARD[0], y=PARKED_BOARD[1], cells=[list(c) for c in board["cells"]]),
            "blocks": out}


def block_name(block: dict) -> str:
    return f"the {block['color']} {block['shape']}"


def canonical(obj) -> str:
    """JSON with sorted keys and floats rounded to 1e-6: the hashed form of a state."""
    def rnd(x):
        if isinstance(x, float):
            v = round(x, 6)
            return 0.0 if v == 0 else v
        if isinstance(x, dict):
            return {k: rnd(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [rnd(v) for v in x]
        return x
    return json.dumps(rnd(obj), sort_keys=True, separators=(",", ":"))


def image_key(state: dict, camera: str, size: int = IMAGE_SIZE) -> str:
    """File stem of a rendered state: a hash of the state, not of the pixels."""
    return hashlib.sha256(f"{camera}|{size}|{canonical(state)}".encode()).hexdigest()[:20]


def round_state(state: dict) -> dict:
    return json.loads(canonical(state))


# ----------------------------------------------------------------- boards
def standard_board(order=geometry.SHAPES, x=0.03, y=0.0, yaw=0.0) -> dict:
    """The benchmark's 3-cell board, cells along board +y in ``order``."""
    cells = [[s, 0.0, (i - 1) * geometry.CELL_SIZE] for i, s in enumerate(order)]
    return {"x": float(x), "y": float(y), "yaw": float(yaw), "cell_size": geometry.CELL_SIZE, "cells": cells}


GRID_CELL = 0.085  # planning board: 3x3 cells, every hole keeps >= 5 mm of plate to the cell edge


def grid_board(shapes, x=0.07, y=0.0, yaw=0.0) -> dict:
    """3x3 planning board (a variant built from env.geometry pieces); cells row-major along +x then +y."""
    cells = []
    for i, s in enumerate(shapes):
        r, c = divmod(i, 3)
        cells.append([s, (r - 1) * GRID_CELL, (c - 1) * GRID_CELL])
    return {"x": float(x), "y": float(y), "yaw": float(yaw), "cell_size": GRID_CELL, "cells": cells}


def cell_world(board: dict, i: int) -> np.ndarray:
    _, cx, cy = board["cells"][i]
    c, s = math.cos(board["yaw"]), math.sin(board["yaw"])
    return np.array([board["x"] + c * cx - s * cy, board["y"] + s * cx + c * cy])


def board_half_extent(board: dict) -> np.ndarray:
    xs = [c[1] for c in board["cells"]]
    ys = [c[2] for c in board["cells"]]
    h = board["cell_size"] / 2
    return np.array([max(abs(min(xs)), abs(max(xs))) + h, max(abs(min(ys)), abs(max(ys))) + h])


def over_board(board: dict, xy, radius: float, gap: float = 0.01) -> bool:
    """True when a disc at xy comes within ``gap`` of the board's rectangle."""
    c, s = math.cos(-board["yaw"]), math.sin(-board["yaw"])
    d = np.asarray(xy, dtype=float) - [board["x"], board["y"]]
    local = np.array([c * d[0] - s * d[1], s * d[0] + c * d[1]])
    outside = np.maximum(np.abs(local) - board_half_extent(board), 0.0)
    return exact.norm(outside) <= radius + gap


@lru_cache(maxsize=None)
def _hole(shape: str, clearance: float) -> np.ndarray:
    return geometry.hole_outline(shape, clearance)


def board_pieces(board: dict, clearance: float = geometry.DEFAULT_CLEARANCE) -> list[np.ndarray]:
    """Convex prisms of the plate (board frame), as env.geometry.plate_pieces but for any cell list."""
    h = board["cell_size"] / 2
    square = np.array([[h, -h], [h, h], [-h, h], [-h, -h]])
    z0, z1 = geometry.PLATE_TOP_Z - geometry.PLATE_THICKNESS, geometry.PLATE_TOP_Z
    pieces = []
    for shape, cx, cy in board["cells"]:
        hole = _hole(shape, clearance)
        normals, offsets = geometry._halfplanes(hole)
        for i in range(len(hole)):
            v0, v1 = hole[i], hole[(i + 1) % len(hole)]
            poly = geometry._clip(square, np.array([v0[1], -v0[0]]), 0.0)
            poly = geometry._clip(poly, np.array([-v1[1], v1[0]]), 0.0)
            poly = geometry._clip(poly, -normals[i], -offsets[i])
            poly = geometry._drop_collinear(poly)
            if len(poly) < 3 or abs(geometry._signed_area(poly)) < geometry._AREA_EPS:
                continue
            pieces.append(geometry._extrude(poly + [cx, cy], z0, z1))
    return pieces


def board_rails(board: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """Two rails under the plate's long edges (+-x), from the table to the plate bottom."""
    hx, hy = board_half_extent(board)
    height = geometry.PLATE_TOP_Z - geometry.PLATE_THICKNESS
    w = geometry.RAIL_WIDTH
    half = np.array([w / 2, hy, height / 2])
    return [(np.array([sx * (hx - w / 2), 0.0, height / 2]), half.copy()) for sx in (-1.0, 1.0)]


# ----------------------------------------------------------------- blocks and footprints
def yaw_fits(shape: str, block_yaw: float, hole_yaw: float, clearance: float = geometry.DEFAULT_CLEARANCE) -> bool:
    return geometry.fits(shape, shape, clearance, geometry.yaw_error(shape, block_yaw, hole_yaw) * -1.0)


def footprint(block: dict) -> np.ndarray:
    """World xy outline of a block's prism."""
    c, s = math.cos(block["yaw"]), math.sin(block["yaw"])
    return exact.rows_matmul(geometry.block_outline(block["shape"]), [[c, s], [-s, c]]) + [block["x"], block["y"]]


def radius(shape: str) -> float:
    return float(np.max(np.linalg.norm(geometry.block_outline(shape), axis=1)))


def polygon_distance(P: np.ndarray, Q: np.ndarray) -> float:
    """Distance between two convex polygons (0 when they overlap; separating-axis test)."""
    for poly in (P, Q):
        n, _ = geometry._halfplanes(poly)
        for axis in n:
            p, q = exact.rows_dot(P, axis), exact.rows_dot(Q, axis)
            if p.max() < q.min() or q.max() < p.min():
                break
        else:
            continue
        break
    else:
        return 0.0
    return min(_points_to_edges(P, Q), _points_to_edges(Q, P))


def _points_to_edges(P: np.ndarray, Q: np.ndarray) -> float:
    """Smallest distance from a vertex p of P to an edge [a, b] of Q, every pair at once: t = (p - a).(b - a) /
    |b - a|^2 clipped to [0, 1], then |p - (a + t (b - a))|, each product and sum rounded once and in that order,
    as :mod:`env.exact` does it (elementwise ufuncs, no BLAS): the same bits on every machine."""
    P, A = np.asarray(P, float), np.asarray(Q, float)
    AB = np.roll(A, -1, axis=0) - A
    px, py = P[:, None, 0], P[:, None, 1]
    pax, pay = px - A[None, :, 0], py - A[None, :, 1]
    den = np.maximum(AB[:, 0] * AB[:, 0] + AB[:, 1] * AB[:, 1], 1e-18)
    t = np.minimum(np.maximum((pax * AB[None, :, 0] + pay * AB[None, :, 1]) / den, 0.0), 1.0)
    dx = px - (A[None, :, 0] + t * AB[None, :, 0])
    dy = py - (A[None, :, 1] + t * AB[None, :, 1])
    return float(np.min(np.sqrt(dx * dx + dy * dy)))


def vertical_overlap(a: dict, b: dict) -> bool:
    """Whether the prisms' z ranges overlap (knob ignored)."""
    return abs(a["z"] - b["z"]) < H - 1e-9


def blocks_distance(a: dict, b: dict) -> float:
    """3-D gap between two blocks: footprint gap if side by side; the knob gap if stacked."""
    if vertical_overlap(a, b):
        return polygon_distance(footprint(a), footprint(b))
    lo, hi = (a, b) if a["z"] < b["z"] else (b, a)
    gap_z = (hi["z"] - H / 2) - (lo["z"] + H / 2 + geometry.KNOB_HEIGHT)
    if np.hypot(hi["x"] - lo["x"], hi["y"] - lo["y"]) < radius(hi["shape"]):  # the knob is under the upper block
        return max(gap_z, 0.0)
    return max(gap_z, polygon_distance(footprint(a), footprint(b)))


def place_beside(a: dict, shape: str, yaw: float, direction: float, gap: float) -> tuple[float, float]:
    """xy for a ``shape`` block at ``yaw`` beside block ``a`` along ``direction`` (rad) with footprint ``gap``."""
    u = np.array([math.cos(direction), math.sin(direction)])
    probe = {"shape": shape, "yaw": yaw}
    lo, hi = 0.0, radius(a["shape"]) + radius(shape) + gap + 0.01
    for _ in range(50):  # bisection on the centre distance: the footprint gap grows with it
        mid = (lo + hi) / 2
        probe["x"], probe["y"] = a["x"] + mid * u[0], a["y"] + mid * u[1]
        if polygon_distance(footprint(a), footprint(probe)) < gap:
            lo = mid
        else:
            hi = mid
    return float(a["x"] + hi * u[0]), float(a["y"] + hi * u[1])


# ----------------------------------------------------------------- cameras
def look_at_matrix(eye, target) -> np.ndarray:
    """Rotation with columns (forward, left, up): the SAPIEN camera convention."""
    eye, target = np.asarray(eye, float), np.asarray(target, float)
    f = target - eye
    f /= exact.norm(f)
    left = np.cross([0.0, 0.0, 1.0], f)
    left /= exact.norm(left)
    up = np.cross(f, left)
    return np.stack([f, left, up], axis=1)


def project(camera: str, points, size: int = IMAGE_SIZE) -> np.ndarray:
    """Pixel (u right, v down) of world points in a camera's image."""
    eye, target = CAMERAS[camera]
    R = look_at_matrix(eye, target)
    d = exact.rows_matmul(np.atleast_2d(np.asarray(points, float)) - eye, R)  # (forward, left, up)
    focal = (size / 2) / math.tan(FOVY / 2)
    return np.stack([size / 2 - focal * d[:, 1] / d[:, 0], size / 2 - focal * d[:, 2] / d[:, 0]], axis=1)


def _pose_from(eye, target):
    import sapien
    from scipy.spatial.transform import Rotation

    x, y, z, w = Rotation.from_matrix(look_at_matrix(eye, target)).as_quat()
    return sapien.Pose(p=list(map(float, eye)), q=[float(w), float(x), float(y), float(z)])


def _yaw_q(yaw: float) -> list[float]:
    return [math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]


def hull2d(pts) -> np.ndarray:
    """Convex hull of 2-D points, counter-clockwise (monotone chain, plain float arithmetic)."""
    pts = sorted({(float(x), float(y)) for x, y in pts})
    if len(pts) < 3:
        return np.asarray(pts, float)

    def cross(o, a, b):
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower, upper = [], []
    for p in pts:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    for p in reversed(pts):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return np.asarray(lower[:-1] + upper[:-1], float)


def block_points(block: dict, z_min: float | None = None) -> list[tuple[float, float, float]]:
    """Corners of a block's prism and of the knob on top (world frame); ``z_min`` cuts the prism from below
    (what shows above a plate)."""
    fp = footprint(block)
    z0, z1 = block["z"] - H / 2, block["z"] + H / 2
    if z_min is not None:
        z0 = max(z0, z_min)
    c, s_ = math.cos(block["yaw"]), math.sin(block["yaw"])
    h = geometry.KNOB_SIDE / 2
    knob = [(block["x"] + u * c - v * s_, block["y"] + u * s_ + v * c) for u in (-h, h) for v in (-h, h)]
    pts = [(float(x), float(y), z) for x, y in fp for z in (z0, z1)] if z1 > z0 else []
    return pts + [(x, y, z) for x, y in knob for z in (z1, z1 + geometry.KNOB_HEIGHT)]


def silhouette(block: dict, camera: str, size: int = IMAGE_SIZE, z_min: float | None = None) -> np.ndarray:
    """Image outline (convex hull, pixels) of a block: its prism and the knob on top."""
    return hull2d(project(camera, block_points(block, z_min), size))


def stack_silhouette(blocks: list[dict], camera: str, size: int = IMAGE_SIZE) -> np.ndarray:
    """Image outline (convex hull, pixels) of several blocks together, e.g. one stack."""
    return hull2d(project(camera, [p for b in blocks for p in block_points(b)], size))


# ----------------------------------------------------------------- rendering
class Renderer:
    """One SAPIEN scene reused for every still. Boards are assembled from pooled per-cell actors
    and blocks come from pools (recoloured per state); unused actors are parked below the table.
    A fixed set of actors matters: an actor per board layout exhausts lavapipe (segfault)."""

    PARK_Z = -5.0

    def __init__(self, size: int = IMAGE_SIZE, clearance: float = geometry.DEFAULT_CLEARANCE):
        import sapien

        from env.task import convex_mesh_file

        self._sapien = sapien
        self._mesh = convex_mesh_file
        self.size = size
        self.clearance = clearance
        self.scene = sapien.Scene()
        self.scene.set_ambient_light([AMBIENT] * 3)
        (key_dir, key), (fill_dir, fill) = KEY_LIGHT, FILL_LIGHT
        self.scene.add_directional_light(list(key_dir), [key] * 3, shadow=True, position=[0.0, 0.0, 0.0],
                                         shadow_scale=SHADOW_HALF_EXTENT, shadow_near=-2.0, shadow_far=2.0,
                                         shadow_map_size=SHADOW_MAP_SIZE)
        self.scene.add_directional_light(list(fill_dir), [fill] * 3)
        b = self.scene.create_actor_builder()
        b.add_box_visual(sapien.Pose(p=[0, 0, -0.01]), [1.5, 1.5, 0.01],
                         material=sapien.render.RenderMaterial(base_color=[*TABLE_RGB, 1], roughness=0.9))
        b.build_kinematic(name="table")
        self._pools: dict[tuple, list] = {}  # ("cell", shape, size) / ("rails", extent) / ("block", shape) -> actors
        self._materials: dict[int, object] = {}
        self._cams = {}

    def _pooled(self, key, i, build):
        """The i-th actor of a pool (built on first use and parked): a fixed set of actors, whatever the layouts."""
        pool = self._pools.setdefault(key, [])
        while len(pool) <= i:
            actor = build()
            actor.set_pose(self._sapien.Pose(p=[0, 0, self.PARK_Z]))
            pool.append(actor)
        return pool[i]

    def _cell_builder(self, shape: str, cell_size: float):
        sapien = self._sapien
        b = self.scene.create_actor_builder()
        mat = sapien.render.RenderMaterial(base_color=[*BOARD_RGB, 1], roughness=0.8)
        for piece in board_pieces({"cell_size": cell_size, "cells": [[shape, 0.0, 0.0]]}, self.clearance):
            b.add_visual_from_file(self._mesh(piece), material=mat)
        return b.build_kinematic(name=f"cell_{shape}")

    def _rail_builder(self, board: dict):
        sapien = self._sapien
        b = self.scene.create_actor_builder()
        mat = sapien.render.RenderMaterial(base_color=[*BOARD_RGB, 1], roughness=0.8)
        for centre, half in board_rails(board):
            b.add_box_visual(sapien.Pose(p=centre), half, material=mat)
        return b.build_kinematic(name="rails")

    def _place_board(self, board: dict, used: dict) -> None:
        """The board as one actor per cell (same pieces as ``board_pieces``) plus its rails."""
        sapien = self._sapien
        q = _yaw_q(board["yaw"])
        for i, (shape, _, _) in enumerate(board["cells"]):
            key = ("cell", shape, round(board["cell_size"], 6))
            actor = self._pooled(key, used.get(key, 0), lambda: self._cell_builder(shape, board["cell_size"]))
            used[key] = used.get(key, 0) + 1
            xy = cell_world(board, i)
            actor.set_pose(sapien.Pose(p=[float(xy[0]), float(xy[1]), 0.0], q=q))
        key = ("rails", canonical([round(float(v), 6) for v in board_half_extent(board)]))
        actor = self._pooled(key, 0, lambda: self._rail_builder(board))
        used[key] = 1
        actor.set_pose(sapien.Pose(p=[board["x"], board["y"], 0.0], q=q))

    def _block_builder(self, shape: str):
        sapien = self._sapien
        b = self.scene.create_actor_builder()
        mat = sapien.render.RenderMaterial(base_color=[1, 1, 1, 1], roughness=0.5)
        for part in geometry.block_collision_parts(shape):
            b.add_visual_from_file(self._mesh(part), material=mat)
        actor = b.build_kinematic(name=f"block_{shape}")
        self._materials[id(actor)] = mat
        return actor

    def _camera(self, name: str):
        if name not in self._cams:
            # the shader and picture format are process-wide settings that a ManiSkill env built earlier in
            # the same process may have changed (its "minimal" shader renders 8-bit colour): pin ours
            self._sapien.render.set_camera_shader_dir("default")
            self._sapien.render.set_picture_format("Color", "r32g32b32a32sfloat")
            cam = self.scene.add_camera(name, self.size, self.size, FOVY, 0.01, 10)
            cam.entity.set_pose(_pose_from(*CAMERAS[name]))
            self._cams[name] = cam
        return self._cams[name]

    def render(self, state: dict, camera: str) -> np.ndarray:
        """uint8 (size, size, 3) image of a state."""
        sapien = self._sapien
        used: dict = {}
        self._place_board(state["board"], used)
        for blk in state["blocks"]:
            key = ("block", blk["shape"])
            actor = self._pooled(key, used.get(key, 0), lambda: self._block_builder(blk["shape"]))
            used[key] = used.get(key, 0) + 1
            self._materials[id(actor)].set_base_color([*PALETTE[blk["color"]], 1.0])
            actor.set_pose(sapien.Pose(p=[blk["x"], blk["y"], blk["z"]], q=_yaw_q(blk["yaw"])))
        for key, pool in self._pools.items():
            for actor in pool[used.get(key, 0):]:
                actor.set_pose(sapien.Pose(p=[0, 0, self.PARK_Z]))
        cam = self._camera(camera)
        self.scene.update_render()
        cam.take_picture()
        rgb = cam.get_picture("Color")[..., :3]
        if rgb.dtype == np.uint8:
            return np.ascontiguousarray(rgb)
        return (np.clip(rgb, 0.0, 1.0) * 255).round().astype(np.uint8)
