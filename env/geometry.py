"""Pure geometry of the shape-assembly task (numpy/scipy/trimesh only).

Units are metres and radians.  Frames:

* block frame: origin at the prism's centroid at mid-height, prism z in
  [-BLOCK_HEIGHT/2, BLOCK_HEIGHT/2], grasp knob on top; outlines at yaw 0.
* cell frame: origin at a cell centre, hole outline at yaw 0.
* board frame: origin on the table (z = 0) under the middle cell; cells lie
  along +y in the order of ``SHAPES``; plate top at z = PLATE_TOP_Z, held up
  by two rails along the long edges so that the space under every hole is free.

Holes are the block outline grown by the clearance.  Polygons use the
*mitred* offset (every edge pushed outward by exactly the clearance, sharp
corners), so the wall gap at the matching yaw is the clearance on every side,
not more at the corners.  The circle block is a regular CIRCLE_SEGMENTS-gon
with its vertices on the 24 mm circle; its hole is a regular N-gon whose
*inradius* is r + clearance, so the hole wall is never closer than r + c to
the centre and a circle block fits at any yaw with a margin of at least c.
The plate is built from convex pieces around each hole (see ``plate_pieces``),
so physics engines that convexify collision shapes still see a real hole.
"""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np

from env.instructions import SHAPES  # noqa: E402 (the one definition; also the board cell order)

BLOCK_HEIGHT = 0.040
SQUARE_SIDE = 0.040
CIRCLE_DIAMETER = 0.048
TRIANGLE_SIDE = 0.054
KNOB_SIDE = 0.020
KNOB_HEIGHT = 0.030

CELL_SIZE = 0.110
PLATE_THICKNESS = 0.012
PLATE_TOP_Z = 0.030
CIRCLE_SEGMENTS = 32
RAIL_WIDTH = 0.008
DEFAULT_CLEARANCE = 0.002

_AREA_EPS = 1e-10  # m^2; pieces smaller than this are dropped
_LEN_EPS = 1e-12  # m; vertex merge / collinearity tolerance


def check_shape(shape) -> str:
    """Return ``shape`` if it is a known shape name, else raise ValueError."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; valid: {', '.join(SHAPES)}")
    return shape


def symmetry_period(shape) -> float:
    """Yaw symmetry period in radians; 0.0 means continuous (circle)."""
    return {"circle": 0.0, "square": math.pi / 2, "triangle": 2 * math.pi / 3}[check_shape(shape)]


def yaw_error(shape, block_yaw, hole_yaw) -> float:
    """Signed smallest rotation to add to ``block_yaw`` to match ``hole_yaw``
    modulo the shape's symmetry period, in [-period/2, period/2); 0.0 for circle."""
    period = symmetry_period(shape)
    if period == 0.0:
        return 0.0
    err = (float(hole_yaw) - float(block_yaw) + period / 2) % period - period / 2
    if err >= period / 2:  # float rounding of % can return exactly `period`
        err -= period
    return float(err)


def _regular_polygon(n: int, circumradius: float, phase: float = 0.0) -> np.ndarray:
    angles = phase + 2 * np.pi * np.arange(n) / n
    return circumradius * np.column_stack([np.cos(angles), np.sin(angles)])


def block_outline(shape) -> np.ndarray:
    """(N, 2) CCW outline of the block at yaw 0, centroid at the origin.
    The triangle has one vertex pointing +x; the circle has a vertex on +x."""
    shape = check_shape(shape)
    if shape == "circle":
        return _regular_polygon(CIRCLE_SEGMENTS, CIRCLE_DIAMETER / 2)
    if shape == "square":
        return _regular_polygon(4, SQUARE_SIDE / math.sqrt(2), math.pi / 4)
    return _regular_polygon(3, TRIANGLE_SIDE / math.sqrt(3))


def _signed_area(poly: np.ndarray) -> float:
    x, y = poly[:, 0], poly[:, 1]
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(np.roll(x, -1), y))


def _halfplanes(poly: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit outward normals n_i and offsets d_i with poly = {x : n_i.x <= d_i}."""
    poly = np.asarray(poly, dtype=float)
    if _signed_area(poly) < 0:
        poly = poly[::-1]
    edges = np.roll(poly, -1, axis=0) - poly
    normals = np.column_stack([edges[:, 1], -edges[:, 0]])
    normals /= np.linalg.norm(normals, axis=1, keepdims=True)
    return normals, np.einsum("ij,ij->i", normals, poly)


def _mitred_offset(poly: np.ndarray, distance: float) -> np.ndarray:
    """Move every edge of a CCW convex polygon outward by ``distance``."""
    normals, _ = _halfplanes(poly)
    prev = np.roll(normals, 1, axis=0)  # normal of the edge ending at vertex i
    bisector = (prev + normals) / (1.0 + np.einsum("ij,ij->i", prev, normals))[:, None]
    return poly + distance * bisector


def hole_outline(shape, clearance=DEFAULT_CLEARANCE) -> np.ndarray:
    """(N, 2) CCW outline of the hole for ``shape`` at yaw 0 in its cell frame."""
    shape = check_shape(shape)
    clearance = float(clearance)
    if not (math.isfinite(clearance) and clearance >= 0.0):
        raise ValueError(f"clearance must be a finite value >= 0, got {clearance}")
    if shape == "circle":
        n = CIRCLE_SEGMENTS
        inradius = CIRCLE_DIAMETER / 2 + clearance
        # Edge midpoints at the block's vertex angles: margin is exactly c at yaw 0.
        return _regular_polygon(n, inradius / math.cos(math.pi / n), math.pi / n)
    return _mitred_offset(block_outline(shape), clearance)


def cell_centres() -> dict[str, np.ndarray]:
    """Board-frame xy of each cell centre (cells along +y, x = 0)."""
    return {s: np.array([0.0, (i - 1) * CELL_SIZE]) for i, s in enumerate(SHAPES)}


def _rot2(yaw: float) -> np.ndarray:
    c, s = math.cos(yaw), math.sin(yaw)
    return np.array([[c, -s], [s, c]])


def fit_margin(block_xy: np.ndarray, hole_xy: np.ndarray, yaw: float) -> float:
    """Largest uniform wall gap s (metres) with which the convex polygon
    ``block_xy`` rotated by ``yaw`` can be translated inside the convex polygon
    ``hole_xy``.  s >= 0: it fits (s = smallest wall gap); s < 0: it cannot.

    2-D LP: hole = {x : n_i.x <= d_i}; max s s.t. n_i.t + h_B(n_i) + s <= d_i.
    """
    from scipy.optimize import linprog  # here: a third of a second that every CLI importing env would pay

    normals, offsets = _halfplanes(hole_xy)
    block = np.asarray(block_xy, dtype=float) @ _rot2(float(yaw)).T
    support = (normals @ block.T).max(axis=1)
    scale = float(np.abs(hole_xy).max())  # solve in hole units for tight tolerances
    res = linprog(
        c=[0.0, 0.0, -1.0],
        A_ub=np.column_stack([normals, np.ones(len(normals))]),
        b_ub=(offsets - support) / scale,
        bounds=[(None, None)] * 3,
        method="highs",
    )
    if res.status != 0:
        raise RuntimeError(f"fit_margin LP failed: {res.message}")
    return float(res.x[2] * scale)


def fits(block_shape, hole_shape, clearance, yaw) -> bool:
    """Whether ``block_shape`` at ``yaw`` fits through the ``hole_shape`` hole."""
    margin = fit_margin(block_outline(block_shape), hole_outline(hole_shape, clearance), yaw)
    return margin >= -1e-9


def _clip(poly: np.ndarray, a: np.ndarray, b: float) -> np.ndarray:
    """Sutherland-Hodgman: keep the part of ``poly`` with a.x <= b."""
    out = []
    f = poly @ a - b
    for i in range(len(poly)):
        j = (i + 1) % len(poly)
        if f[i] <= 0:
            out.append(poly[i])
        if (f[i] < 0 < f[j]) or (f[j] < 0 < f[i]):
            out.append(poly[i] + f[i] / (f[i] - f[j]) * (poly[j] - poly[i]))
    return np.array(out).reshape(-1, 2)


def _drop_collinear(poly: np.ndarray) -> np.ndarray:
    """Remove duplicate and collinear vertices of a convex polygon."""
    changed = True
    while changed and len(poly) >= 3:
        changed = False
        for i in range(len(poly)):
            p, v, q = poly[i - 1], poly[i], poly[(i + 1) % len(poly)]
            u, w = p - v, q - v
            if abs(u[0] * w[1] - u[1] * w[0]) <= _LEN_EPS * max(np.linalg.norm(u), np.linalg.norm(w)):
                poly = np.delete(poly, i, axis=0)
                changed = True
                break
    return poly


def _extrude(poly: np.ndarray, z0: float, z1: float) -> np.ndarray:
    n = len(poly)
    return np.vstack([np.column_stack([poly, np.full(n, z0)]), np.column_stack([poly, np.full(n, z1)])])


def plate_pieces(clearance=DEFAULT_CLEARANCE) -> list[np.ndarray]:
    """Convex collision pieces of the plate in board frame, each (M, 3) prism
    vertices with z in [PLATE_TOP_Z - PLATE_THICKNESS, PLATE_TOP_Z].

    Per cell and hole edge (v_i, v_i+1): cell square ∩ sector between the rays
    from the cell centre through v_i and v_i+1 ∩ outer half-plane of the edge.
    The hole is convex and contains the centre, so the pieces of a cell tile
    exactly (cell square − hole); every sector is < 180° so each is convex.
    """
    h = CELL_SIZE / 2
    square = np.array([[h, -h], [h, h], [-h, h], [-h, -h]])
    z0, z1 = PLATE_TOP_Z - PLATE_THICKNESS, PLATE_TOP_Z
    pieces = []
    for shape, centre in cell_centres().items():
        hole = hole_outline(shape, clearance)
        normals, offsets = _halfplanes(hole)
        for i in range(len(hole)):
            v0, v1 = hole[i], hole[(i + 1) % len(hole)]
            poly = _clip(square, np.array([v0[1], -v0[0]]), 0.0)  # left of ray v0
            poly = _clip(poly, np.array([-v1[1], v1[0]]), 0.0)  # right of ray v1
            poly = _clip(poly, -normals[i], -offsets[i])  # outside edge i
            poly = _drop_collinear(poly)
            if len(poly) < 3 or abs(_signed_area(poly)) < _AREA_EPS:
                continue
            pieces.append(_extrude(poly + centre, z0, z1))
    return pieces


def rail_boxes() -> list[tuple[np.ndarray, np.ndarray]]:
    """(centre xyz, half sizes xyz) in board frame of the two rails under the
    plate's long edges, from the table up to the plate bottom."""
    height = PLATE_TOP_Z - PLATE_THICKNESS
    half = np.array([RAIL_WIDTH / 2, len(SHAPES) * CELL_SIZE / 2, height / 2])
    x = CELL_SIZE / 2 - RAIL_WIDTH / 2
    return [(np.array([sx * x, 0.0, height / 2]), half.copy()) for sx in (-1.0, 1.0)]


def block_collision_parts(shape) -> list[np.ndarray]:
    """Convex vertex arrays [prism, knob] in block frame."""
    half_h = BLOCK_HEIGHT / 2
    k = KNOB_SIDE / 2
    knob = np.array([[k, -k], [k, k], [-k, k], [-k, -k]])
    return [
        _extrude(block_outline(shape), -half_h, half_h),
        _extrude(knob, half_h, half_h + KNOB_HEIGHT),
    ]


# Distractor objects (clutter setups): prisms that pass no hole in any orientation (standing, lying or
# tilted) at every clearance up to 3 mm, checked by ``distractor_fit_margin`` in a test and by a drop
# test. The bar is 50 mm tall: at 30 mm its 30 x 30 end fitted the square and circle holes.
DISTRACTOR_HEIGHT = {"cube": 0.055, "hexagon": 0.040, "bar": 0.050}


def distractor_outline(kind) -> np.ndarray:
    """(N,2) CCW outline of a distractor at yaw 0, centred on its centroid."""
    if kind == "cube":
        h = 0.0275
        return np.array([[h, -h], [h, h], [-h, h], [-h, -h]])
    if kind == "hexagon":
        return _regular_polygon(6, 0.032)
    if kind == "bar":
        return np.array([[0.035, -0.015], [0.035, 0.015], [-0.035, 0.015], [-0.035, -0.015]])
    raise ValueError(f"unknown distractor {kind!r}; valid: {', '.join(DISTRACTOR_HEIGHT)}")


def distractor_collision_parts(kind) -> list[np.ndarray]:
    """Convex vertex arrays in the distractor's frame (origin at mid-height)."""
    h = DISTRACTOR_HEIGHT[kind] / 2
    return [_extrude(distractor_outline(kind), -h, h)]


def _quat_wxyz_to_matrix(q) -> np.ndarray:
    w, x, y, z = np.asarray(q, dtype=float) / np.linalg.norm(q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def block_bottom_z(shape, position, quat_wxyz) -> float:
    """Lowest world z of the block prism's vertices (knob excluded) for a pose."""
    prism = block_collision_parts(shape)[0]
    world = prism @ _quat_wxyz_to_matrix(quat_wxyz).T + np.asarray(position, dtype=float)
    return float(world[:, 2].min())


def point_in_polygon(xy, poly) -> bool:
    """Even-odd ray-casting test of a 2-D point against a simple polygon."""
    x, y = float(xy[0]), float(xy[1])
    poly = np.asarray(poly, dtype=float)
    xi, yi = poly[:, 0], poly[:, 1]
    xj, yj = np.roll(xi, 1), np.roll(yi, 1)
    crosses = (yi > y) != (yj > y)
    with np.errstate(divide="ignore", invalid="ignore"):
        x_at = xj + (y - yj) * (xi - xj) / (yi - yj)
    return bool(np.count_nonzero(crosses & (x < x_at)) % 2)


def write_convex_obj(vertices: np.ndarray, path) -> None:
    """Write the convex hull of ``vertices`` as a Wavefront .obj (deterministic;
    written atomically so concurrent writers never expose a partial file)."""
    import trimesh

    mesh = trimesh.convex.convex_hull(np.asarray(vertices, dtype=float))
    text = trimesh.exchange.obj.export_obj(
        mesh, include_normals=False, include_color=False, include_texture=False, header=None
    )
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".obj.tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------ upright and through
def _tilted_slab_footprint(shape, tilt: float, azimuth: float, thickness: float) -> np.ndarray:
    """xy points whose hull is the part of the block prism inside a slab of ``thickness``, projected down.

    The prism spans the whole slab (it is through the plate). Tilted by ``tilt`` towards ``azimuth`` (in
    the block frame), each horizontal section is the outline stretched by 1/cos(tilt) along the azimuth,
    and the sections at the slab's bottom and top are T tan(tilt) apart: the part inside the slab is the
    hull of those two sections.
    """
    d = np.array([math.cos(azimuth), math.sin(azimuth)])
    outline = block_outline(shape)
    along = outline @ d
    section = outline + np.outer(along * (1.0 / math.cos(tilt) - 1.0), d)
    return np.vstack([section, section + thickness * math.tan(tilt) * d])


def slab_fit_margin(shape, clearance, tilt: float, azimuth: float) -> float:
    """Fit margin (m, >= 0 fits) of a block standing tilted through its own hole at its matching yaw."""
    pts = _tilted_slab_footprint(shape, tilt, azimuth, PLATE_THICKNESS)
    return fit_margin(pts, hole_outline(shape, clearance), 0.0)


def max_upright_tilt(shape, clearance, azimuths: int = 12) -> float:
    """The largest tilt (rad) of a block's axis from vertical with which it can stand through its own hole.

    Only the plate's 12 mm slab holds a block that is through the plate, so the bound is where the
    slab part of the tilted prism (``slab_fit_margin``) stops fitting the hole: the largest over tilt
    directions of the tilt found by bisection (to 0.005 deg), at the matching yaw (the worst case).
    The outline and its hole are symmetric about a vertex's axis and repeat every 360/N deg for N
    vertices, so directions over half of that period cover every direction: a grid of ``azimuths``
    of them, then a golden-section search around the grid's best. Square at
    2 mm: 15.9 deg (towards a corner; about 13 towards a side), roughly atan(extra width / plate
    thickness). A block tilted more is wedged, not standing.
    """
    half_period = math.pi / len(block_outline(shape))

    def tilt_limit(azimuth: float) -> float:
        if slab_fit_margin(shape, clearance, 0.0, azimuth) < 0:
            return 0.0
        lo, hi = 0.0, math.radians(60.0)
        while hi - lo > math.radians(5e-3):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if slab_fit_margin(shape, clearance, mid, azimuth) >= 0 else (lo, mid)
        return lo

    grid = np.linspace(0.0, half_period, azimuths)
    limits = [tilt_limit(a) for a in grid]
    # the largest lies between grid points: golden-section search around the best one
    i = int(np.argmax(limits))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    g = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = tilt_limit(c), tilt_limit(d)
    for _ in range(14):
        if fc >= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = tilt_limit(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = tilt_limit(d)
    return max(max(limits), fc, fd)


def tilt_of(quat_wxyz) -> float:
    """Angle (rad) between a body's z axis and world z."""
    return float(math.acos(np.clip(_quat_wxyz_to_matrix(quat_wxyz)[2, 2], -1.0, 1.0)))


def block_vertices(shape) -> np.ndarray:
    """(V, 3) every collision vertex of a block (prism and knob) in block frame."""
    return np.vstack(block_collision_parts(shape))


def bottom_face(shape) -> np.ndarray:
    """(N, 3) vertices of the prism's bottom face in block frame."""
    prism = block_collision_parts(shape)[0]
    return prism[: len(prism) // 2]


def _fibonacci_directions(n: int) -> np.ndarray:
    """n near-uniform unit vectors on the upper hemisphere (a body and its flip pass the same holes)."""
    i = np.arange(n) + 0.5
    z = i / n
    phi = i * math.pi * (3.0 - math.sqrt(5.0))
    r = np.sqrt(1.0 - z * z)
    return np.column_stack([r * np.cos(phi), r * np.sin(phi), z])


def distractor_fit_margin(kind, hole_shape, clearance, directions: int = 600, yaws: int = 36) -> float:
    """The largest fit margin (m; >= 0 means it passes) of a distractor through a hole over orientations.

    A body passes a hole going straight down only if its shadow (its vertices projected along the
    vertical) fits the hole. Every orientation is a direction of the body that points up (sampled on the
    hemisphere) and a yaw about it; the shadow's widths are checked against the hole's first (a shadow
    wider than the hole in some direction cannot fit) and the LP of ``fit_margin`` decides the rest.
    """
    verts = distractor_collision_parts(kind)[0]
    hole = hole_outline(hole_shape, clearance)
    angles = np.arange(90) * math.pi / 90
    dirs = np.column_stack([np.cos(angles), np.sin(angles)])
    hole_width = (hole @ dirs.T).max(0) - (hole @ dirs.T).min(0)
    best = -np.inf
    for up in _fibonacci_directions(directions):
        # a frame with ``up`` as its third axis; the shadow is the first two coordinates
        a = np.array([1.0, 0.0, 0.0]) if abs(up[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
        e1 = np.cross(up, a)
        e1 /= np.linalg.norm(e1)
        e2 = np.cross(up, e1)
        shadow0 = verts @ np.column_stack([e1, e2])
        for yaw in np.arange(yaws) * 2 * math.pi / yaws:
            shadow = shadow0 @ _rot2(yaw).T
            proj = shadow @ dirs.T
            if np.any(proj.max(0) - proj.min(0) > hole_width + 1e-9):
                continue  # wider than the hole in some direction: it cannot fit
            best = max(best, fit_margin(shadow, hole, 0.0))
    return best
