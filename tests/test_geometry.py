"""Tests of env/geometry.py: fit logic, symmetry, plate decomposition, helpers."""

import itertools
import math

import numpy as np
import pytest
import trimesh
from scipy.spatial import ConvexHull
from shapely.geometry import Polygon, box
from shapely.ops import unary_union

from env import geometry as g

CLEARANCES = np.arange(0.5, 3.01, 0.25) * 1e-3  # metres
YAW_STEP_DEG = 0.5


def sweep_yaws(shape):
    """Yaw samples every 0.5 deg over the block's own period (360 deg for the
    circle block, which is a 32-gon and not truly round)."""
    period = g.symmetry_period(shape) or 2 * math.pi
    return np.deg2rad(np.arange(0.0, math.degrees(period) - 1e-9, YAW_STEP_DEG))


def dual_margins(block_xy, hole_xy, yaws):
    """Independent, vectorised oracle for fit_margin via LP duality.

    margin(yaw) = min over dual vertices λ (supported on <= 3 hole edges whose
    normals hold the origin in their convex hull, Σλ=1, Σλ n = 0) of
    Σ λ_i (d_i - h_B(n_i)).  All such triples are enumerated.
    """
    hole = np.asarray(hole_xy, float)
    edges = np.roll(hole, -1, axis=0) - hole
    n = np.column_stack([edges[:, 1], -edges[:, 0]])
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    d = np.einsum("ij,ij->i", n, hole)
    triples = np.array(list(itertools.combinations(range(len(hole)), 3)))
    mats = np.ones((len(triples), 3, 3))
    mats[:, :2, :] = n[triples].transpose(0, 2, 1)
    lam = np.linalg.solve(mats, np.broadcast_to([0.0, 0.0, 1.0], (len(triples), 3))[..., None])[..., 0]
    keep = (lam >= -1e-12).all(axis=1)
    weights = np.zeros((keep.sum(), len(hole)))
    np.put_along_axis(weights, triples[keep], lam[keep], axis=1)
    c, s = np.cos(yaws), np.sin(yaws)
    rot = np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2)  # (Y, 2, 2)
    blocks = np.einsum("yij,vj->yvi", rot, np.asarray(block_xy, float))
    support = np.einsum("mi,yvi->ymv", n, blocks).max(axis=2)  # (Y, m)
    return (weights @ (d[None, :] - support).T).min(axis=0)


# ---------------------------------------------------------------- shapes / symmetry


def test_check_shape():
    for s in g.SHAPES:
        assert g.check_shape(s) == s
    with pytest.raises(ValueError, match="unknown shape 'hexagon'; valid: circle, square, triangle"):
        g.check_shape("hexagon")


def test_symmetry_period():
    assert g.symmetry_period("circle") == 0.0
    assert g.symmetry_period("square") == pytest.approx(math.pi / 2)
    assert g.symmetry_period("triangle") == pytest.approx(2 * math.pi / 3)


@pytest.mark.parametrize(
    "shape, block_deg, hole_deg, expected_deg",
    [
        ("square", 0, 10, 10),
        ("square", 10, 0, -10),
        ("square", 0, 90, 0),
        ("square", 0, 100, 10),
        ("square", 80, 0, 10),  # wrap-around: 80 -> 90 == 0
        ("square", -170, 170, -20),
        ("square", 0, 45, -45),  # half-open interval [-45, 45)
        ("square", 45, 0, -45),
        ("triangle", 0, 110, -10),
        ("triangle", 0, 60, -60),
        ("triangle", 350, 5, 15),
        ("triangle", 0, -240, 0),
        ("circle", 0, 123, 0),
        ("circle", 1.0, -2.0, 0),
    ],
)
def test_yaw_error(shape, block_deg, hole_deg, expected_deg):
    err = g.yaw_error(shape, math.radians(block_deg), math.radians(hole_deg))
    assert isinstance(err, float)
    assert err == pytest.approx(math.radians(expected_deg), abs=1e-12)
    period = g.symmetry_period(shape)
    if period:
        assert -period / 2 <= err < period / 2


def test_yaw_error_range_random():
    rng = np.random.default_rng(0)
    for shape in ("square", "triangle"):
        p = g.symmetry_period(shape)
        for b, h in rng.uniform(-20, 20, size=(200, 2)):
            err = g.yaw_error(shape, b, h)
            assert -p / 2 <= err < p / 2
            k = (h - (b + err)) / p
            assert k == pytest.approx(round(k), abs=1e-9)


# ---------------------------------------------------------------- outlines


@pytest.mark.parametrize("shape", g.SHAPES)
def test_outlines_ccw_centred(shape):
    block, hole = g.block_outline(shape), g.hole_outline(shape, 0.002)
    for poly in (block, hole):
        assert Polygon(poly).exterior.is_ccw
        assert np.allclose(Polygon(poly).centroid.coords[0], 0.0, atol=1e-12)
        assert len(ConvexHull(poly).vertices) == len(poly)
    assert Polygon(hole).contains(Polygon(block))


def test_outline_dimensions():
    circle, square, tri = (g.block_outline(s) for s in g.SHAPES)
    assert len(circle) == g.CIRCLE_SEGMENTS
    assert np.allclose(np.linalg.norm(circle, axis=1), g.CIRCLE_DIAMETER / 2)
    assert np.allclose(np.ptp(square, axis=0), g.SQUARE_SIDE)
    sides = np.linalg.norm(np.roll(tri, -1, axis=0) - tri, axis=1)
    assert np.allclose(sides, g.TRIANGLE_SIDE)
    assert np.argmax(tri[:, 0]) == 0 and tri[0, 1] == pytest.approx(0.0, abs=1e-15)  # vertex on +x


def edge_lines(poly):
    edges = np.roll(poly, -1, axis=0) - poly
    n = np.column_stack([edges[:, 1], -edges[:, 0]])
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    return n, np.einsum("ij,ij->i", n, poly)


@pytest.mark.parametrize("clearance", [0.0, 0.001, 0.003])
def test_hole_is_mitred_offset(clearance):
    for shape in ("square", "triangle"):
        hole, block = g.hole_outline(shape, clearance), g.block_outline(shape)
        (nh, dh), (nb, db) = edge_lines(hole), edge_lines(block)
        assert np.allclose(nh, nb, atol=1e-12)  # same edge directions, sharp corners
        assert np.allclose(dh, db + clearance, atol=1e-12)  # every edge moved out by c
    circle = g.hole_outline("circle", clearance)
    assert len(circle) == g.CIRCLE_SEGMENTS
    n, d = edge_lines(circle)
    assert np.allclose(d, g.CIRCLE_DIAMETER / 2 + clearance)  # inradius r + c
    facing = np.roll(g.block_outline("circle"), -1, axis=0) / (g.CIRCLE_DIAMETER / 2)
    assert np.allclose(n, facing)  # each hole edge faces a block vertex at yaw 0


def test_hole_rejects_bad_clearance():
    with pytest.raises(ValueError):
        g.hole_outline("square", -0.001)
    with pytest.raises(ValueError):
        g.hole_outline("square", float("nan"))


def test_cell_centres():
    cc = g.cell_centres()
    assert list(cc) == list(g.SHAPES)
    assert np.allclose(cc["circle"], [0, -0.110])
    assert np.allclose(cc["square"], [0, 0])
    assert np.allclose(cc["triangle"], [0, 0.110])
    cc["square"][0] = 1.0
    assert g.cell_centres()["square"][0] == 0.0  # fresh arrays every call


# ---------------------------------------------------------------- fit logic


def test_dual_oracle_matches_linprog():
    rng = np.random.default_rng(1)
    for block_shape, hole_shape in itertools.product(g.SHAPES, g.SHAPES):
        block = g.block_outline(block_shape)
        for clearance in (0.0005, 0.002, 0.012):
            hole = g.hole_outline(hole_shape, clearance)
            yaws = rng.uniform(-math.pi, math.pi, size=4)
            expected = dual_margins(block, hole, yaws)
            got = [g.fit_margin(block, hole, y) for y in yaws]
            assert np.allclose(got, expected, atol=1e-9)


@pytest.mark.parametrize("clearance", CLEARANCES, ids=lambda c: f"{c * 1e3:.2f}mm")
def test_no_cross_fit(clearance):
    for block_shape in g.SHAPES:
        block = g.block_outline(block_shape)
        yaws = sweep_yaws(block_shape)
        for hole_shape in g.SHAPES:
            if hole_shape == block_shape:
                continue
            hole = g.hole_outline(hole_shape, clearance)
            margins = dual_margins(block, hole, yaws)
            assert margins.max() < 0, (block_shape, hole_shape, math.degrees(yaws[margins.argmax()]))
            # the LP-based public API agrees: at the best sampled yaw and every 5 deg
            worst = int(margins.argmax())
            assert g.fit_margin(block, hole, yaws[worst]) == pytest.approx(margins[worst], abs=1e-9)
            for yaw in yaws[::10]:
                assert not g.fits(block_shape, hole_shape, clearance, yaw)


@pytest.mark.parametrize("clearance", CLEARANCES, ids=lambda c: f"{c * 1e3:.2f}mm")
def test_own_hole_fit(clearance):
    for shape in g.SHAPES:
        block, hole = g.block_outline(shape), g.hole_outline(shape, clearance)
        assert g.fit_margin(block, hole, 0.0) == pytest.approx(clearance, abs=1e-6)
        assert g.fits(shape, shape, clearance, 0.0)
        period = g.symmetry_period(shape)
        if period:
            assert g.fit_margin(block, hole, period) == pytest.approx(clearance, abs=1e-6)
            assert g.fit_margin(block, hole, -2 * period) == pytest.approx(clearance, abs=1e-6)
        else:  # the circle block fits its hole at any yaw, never with less than c
            assert dual_margins(block, hole, sweep_yaws(shape)).min() >= clearance - 1e-9
    if clearance <= 0.003:
        assert not g.fits("square", "square", clearance, math.radians(45))
        assert not g.fits("triangle", "triangle", clearance, math.radians(60))


def test_fit_margin_is_gap_for_translated_hole():
    block = g.block_outline("square")
    hole = g.hole_outline("square", 0.002) + [0.3, -0.2]  # hole off the origin: translation found
    assert g.fit_margin(block, hole, 0.0) == pytest.approx(0.002, abs=1e-9)
    assert g.fit_margin(block, hole[::-1], 0.0) == pytest.approx(0.002, abs=1e-9)  # CW input


# ---------------------------------------------------------------- plate / rails


@pytest.mark.parametrize("clearance", [0.0005, 0.002, 0.003])
def test_plate_pieces(clearance):
    pieces = g.plate_pieces(clearance)
    assert len(pieces) > 3 * 3
    z0, z1 = g.PLATE_TOP_Z - g.PLATE_THICKNESS, g.PLATE_TOP_Z
    holes = {s: Polygon(g.hole_outline(s, clearance) + c) for s, c in g.cell_centres().items()}
    polys = []
    for piece in pieces:
        assert piece.ndim == 2 and piece.shape[1] == 3
        assert len(ConvexHull(piece).vertices) == len(piece)  # convex, no redundant vertices
        assert set(np.round(piece[:, 2], 12)) == {round(z0, 12), round(z1, 12)}
        k = len(piece) // 2
        assert np.allclose(piece[:k, :2], piece[k:, :2])
        poly = Polygon(piece[:k, :2])
        assert poly.is_valid and poly.area > 1e-10
        for hole in holes.values():
            assert poly.intersection(hole).area < 1e-12
        polys.append(poly)
    h = g.CELL_SIZE / 2
    for shape, (cx, cy) in g.cell_centres().items():
        cell = box(cx - h, cy - h, cx + h, cy + h)
        mine = [p for p in polys if cell.contains(p.representative_point())]
        assert unary_union(mine).area == pytest.approx(cell.area - holes[shape].area, abs=1e-9)
        assert unary_union(mine).symmetric_difference(cell.difference(holes[shape])).area < 1e-12
    board = box(-h, -3 * h, h, 3 * h)
    union = unary_union(polys)
    expected = board.area - sum(hole.area for hole in holes.values())
    assert union.area == pytest.approx(expected, abs=1e-9)
    assert sum(p.area for p in polys) == pytest.approx(expected, abs=1e-9)  # no overlaps
    assert board.buffer(1e-12).contains(union)


def test_rail_boxes_leave_holes_free():
    rails = g.rail_boxes()
    assert len(rails) == 2
    holes = [Polygon(g.hole_outline(s, 0.003) + c) for s, c in g.cell_centres().items()]
    for centre, half in rails:
        assert centre[2] - half[2] == pytest.approx(0.0)
        assert centre[2] + half[2] == pytest.approx(g.PLATE_TOP_Z - g.PLATE_THICKNESS)
        assert 2 * half[1] == pytest.approx(3 * g.CELL_SIZE)
        assert 2 * half[0] == pytest.approx(g.RAIL_WIDTH)
        assert abs(centre[0]) + half[0] == pytest.approx(g.CELL_SIZE / 2)
        footprint = box(centre[0] - half[0], centre[1] - half[1], centre[0] + half[0], centre[1] + half[1])
        for hole in holes:
            assert footprint.distance(hole) > 0.005


# ---------------------------------------------------------------- block parts / helpers


@pytest.mark.parametrize("shape", g.SHAPES)
def test_block_collision_parts(shape):
    prism, knob = g.block_collision_parts(shape)
    assert len(ConvexHull(prism).vertices) == len(prism)
    assert prism[:, 2].min() == pytest.approx(-g.BLOCK_HEIGHT / 2)
    assert prism[:, 2].max() == pytest.approx(g.BLOCK_HEIGHT / 2)
    assert knob[:, 2].min() == pytest.approx(g.BLOCK_HEIGHT / 2)
    assert knob[:, 2].max() == pytest.approx(g.BLOCK_HEIGHT / 2 + g.KNOB_HEIGHT)
    assert np.allclose(np.abs(knob[:, :2]), g.KNOB_SIDE / 2)  # axis-aligned, centred
    outline = g.block_outline(shape)
    assert all(g.point_in_polygon(v, outline) for v in knob[:, :2])  # knob sits on the top face


def test_block_bottom_z():
    assert g.block_bottom_z("square", [0.1, 0.2, 0.5], [1, 0, 0, 0]) == pytest.approx(0.5 - g.BLOCK_HEIGHT / 2)
    s = math.sqrt(0.5)
    # 90 deg about x: the triangle's y-extent (±side/2) becomes vertical
    assert g.block_bottom_z("triangle", [0, 0, 0.5], [s, s, 0, 0]) == pytest.approx(0.5 - g.TRIANGLE_SIDE / 2)
    # non-normalised quaternion, 180 deg about x: symmetric prism
    assert g.block_bottom_z("circle", [0, 0, 0.1], [0, 2, 0, 0]) == pytest.approx(0.1 - g.BLOCK_HEIGHT / 2)


def test_point_in_polygon():
    tri = g.hole_outline("triangle", 0.002) + [0, 0.11]
    assert g.point_in_polygon([0, 0.11], tri)
    assert not g.point_in_polygon([0, 0], tri)
    assert not g.point_in_polygon(np.array([0.0, 0.11 + 0.03]), tri)
    concave = np.array([[0, 0], [2, 0], [2, 2], [1, 1], [0, 2]], float)
    assert g.point_in_polygon([0.5, 1.2], concave)
    assert not g.point_in_polygon([1.0, 1.5], concave)


def test_write_convex_obj(tmp_path):
    verts = g.plate_pieces(0.002)[0]
    a, b = tmp_path / "sub" / "a.obj", tmp_path / "b.obj"
    g.write_convex_obj(verts, a)
    g.write_convex_obj(verts, str(b))
    assert a.read_bytes() == b.read_bytes()
    mesh = trimesh.load(a, force="mesh")
    assert mesh.is_watertight and mesh.is_convex
    assert mesh.volume == pytest.approx(ConvexHull(verts).volume, rel=1e-6)
    assert not list(tmp_path.glob("**/*.tmp"))


@pytest.mark.parametrize("kind", ["cube", "hexagon", "bar"])
def test_distractors_fit_no_hole(kind):
    outline = g.distractor_outline(kind)
    for hole in g.SHAPES:
        hole_xy = g.hole_outline(hole, 0.003)
        for yaw in np.deg2rad(np.arange(0.0, 180.0, 1.0)):
            assert g.fit_margin(outline, hole_xy, yaw) < 0, (kind, hole, yaw)
