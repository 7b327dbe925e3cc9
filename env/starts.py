"""Starting states of tries: drawn from a seed, stored in task lists, replayed exactly.

A :class:`StartState` is everything random about a try, resolved to numbers, so
that every model meets the same try in the same state. ``sample_start`` draws
one from a setup and a numpy ``Generator``; the environment only places what it
is given.

World frame: the table top is z = 0, the robot base stands at x = -0.615 m,
+x points away from the robot. The board lies across the robot's view with its
cells along +y; blocks start between the robot and the board.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from env import exact, geometry
from env.setups import Setup

ROBOT_BASE_XY = (-0.615, 0.0)
BOARD_NOMINAL_XY = (0.03, 0.0)
BLOCK_NOMINAL_XY = (-0.18, 0.0)
BLOCK_SLOT_Y = (-0.10, 0.0, 0.10)  # nominal y of up to three blocks
FAR_REACH_RADIUS_M = (0.68, 0.74)  # distance from the robot base for B05
FAR_REACH_ANGLE_DEG = (25.0, 35.0)  # off the board's axis, either side
MIN_GAP_M = 0.005  # smallest gap between start footprints
PACKED_GAP_M = 0.0005  # packed blocks (C05) start this close: touching, not overlapping
DISTRACTOR_KINDS = ("cube", "hexagon", "bar")  # none passes any hole in any orientation (geometry.distractor_fit_margin)
DISTRACTOR_SLOT_Y = (-0.20, 0.20, 0.0)  # nominal y of distractors, beside and behind the blocks
DISTRACTOR_X = (-0.12, -0.12, -0.30)
PART_NAMES = ("circle", "square", "triangle", "board", "table")
SPLITS = ("train", "dev", "test", "confirm")
# seeds of different splits never meet: each split owns a block of 10^7 seeds
_SPLIT_SEED_BASE = {s: (i + 1) * 10_000_000 for i, s in enumerate(SPLITS)}


@dataclass(frozen=True)
class BlockStart:
    shape: str
    x: float
    y: float
    yaw: float  # radians


@dataclass(frozen=True)
class DistractorStart:
    kind: str  # one of DISTRACTOR_KINDS
    x: float
    y: float
    yaw: float


@dataclass(frozen=True)
class StartState:
    """Everything drawn for one try. Appearance fields change camera images only."""

    target: str  # shape of the block to insert ("all" on the full board)
    blocks: tuple[BlockStart, ...]
    board_x: float
    board_y: float
    board_yaw: float  # radians
    distractors: tuple[DistractorStart, ...] = ()
    colors: dict | None = None  # part ("circle", "square", "triangle", "board", "table") -> rgb; None: defaults
    light_color: tuple[float, float, float] | None = None  # coloured key light (D02)
    camera_offset: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, 0.0)  # dx, dy, dz (m), dyaw, dpitch (rad)
    shove_velocity: tuple[float, float] | None = None  # vx, vy (m/s) given to the target at the shove step
    nudge: tuple[float, float, float] | None = None  # board dx, dy (m), dyaw (rad) once the block nears its hole

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StartState":
        tup = lambda v: None if v is None else tuple(v)  # noqa: E731
        return cls(
            target=d["target"],
            blocks=tuple(BlockStart(**b) for b in d["blocks"]),
            board_x=d["board_x"], board_y=d["board_y"], board_yaw=d["board_yaw"],
            distractors=tuple(DistractorStart(**x) for x in d.get("distractors", ())),
            colors={k: tuple(v) for k, v in d["colors"].items()} if d.get("colors") else None,
            light_color=tup(d.get("light_color")),
            camera_offset=tuple(d.get("camera_offset", (0.0,) * 5)),
            shove_velocity=tup(d.get("shove_velocity")),
            nudge=tup(d.get("nudge")),
        )

    def block(self, shape: str) -> BlockStart:
        for b in self.blocks:
            if b.shape == shape:
                return b
        raise KeyError(f"no {shape} block in this start")


def derive_seed(split: str, setup_id: str, try_index: int) -> int:
    """Seed of one try; disjoint between splits by construction."""
    if split not in _SPLIT_SEED_BASE:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    if not 0 <= try_index < 100_000:
        raise ValueError(f"try index {try_index} out of range 0..99999")
    from env.setups import SETUPS

    if setup_id not in SETUPS:
        raise ValueError(f"unknown setup id {setup_id!r}")
    setup_code = list(SETUPS).index(setup_id)  # the table is append-only, so codes never change
    return _SPLIT_SEED_BASE[split] + setup_code * 100_000 + try_index


def _footprint_radius(shape: str) -> float:
    return float(np.max(np.linalg.norm(geometry.block_outline(shape), axis=1)))


def _distractor_radius(kind: str) -> float:
    return float(np.max(np.linalg.norm(geometry.distractor_outline(kind), axis=1)))


def _board_clear_of(board_xy, board_yaw, xy, radius) -> bool:
    """True when a disc at xy keeps MIN_GAP_M from the board's rectangle."""
    c, s = np.cos(-board_yaw), np.sin(-board_yaw)
    d = np.asarray(xy) - np.asarray(board_xy)
    local = np.array([c * d[0] - s * d[1], s * d[0] + c * d[1]])
    half = np.array([geometry.CELL_SIZE / 2, 1.5 * geometry.CELL_SIZE])
    outside = np.maximum(np.abs(local) - half, 0.0)
    return exact.norm(outside) > radius + MIN_GAP_M


def _draw_yaw(rng: np.random.Generator, setup: Setup) -> float:
    return float(np.deg2rad(rng.uniform(-setup.block_yaw_noise_deg, setup.block_yaw_noise_deg)))


def _y_extent(shape: str, yaw: float) -> tuple[float, float]:
    c, s = float(np.cos(yaw)), float(np.sin(yaw))
    # x s + y c per vertex as one fused multiply-add, rounded once: the bits of the BLAS kernel the locked
    # v1 lists were made with, on every CPU (a BLAS product picks its kernel, fused or not, per CPU)
    y = [exact.fma(float(vx), s, float(vy) * c) for vx, vy in geometry.block_outline(shape)]
    return min(y), max(y)


def _draw_blocks(setup: Setup, rng: np.random.Generator, active: list[str]) -> list[BlockStart]:
    n = len(active)
    order = rng.permutation(n)
    if setup.packed:  # a row along y, each block touching the next
        yaws = [_draw_yaw(rng, setup) for _ in range(n)]
        centre = np.array(BLOCK_NOMINAL_XY) + rng.uniform(-1, 1, 2) * setup.block_xy_noise_m
        shapes = [active[i] for i in order]
        ys, y = [], 0.0
        for k, (shape, yaw) in enumerate(zip(shapes, yaws)):
            lo, hi = _y_extent(shape, yaw)
            if k:
                y += PACKED_GAP_M - lo
            ys.append(y)
            y += hi
        ys = np.array(ys) - (ys[0] + ys[-1]) / 2
        return [BlockStart(sh, float(centre[0]), float(centre[1] + yy), yw) for sh, yy, yw in zip(shapes, ys, yaws)]
    slots = list(BLOCK_SLOT_Y) if n > 1 else [BLOCK_NOMINAL_XY[1]]
    blocks = []
    for slot, idx in zip(slots, order):
        if setup.far_reach:
            r = rng.uniform(*FAR_REACH_RADIUS_M)
            ang = np.deg2rad(rng.uniform(*FAR_REACH_ANGLE_DEG)) * rng.choice([-1.0, 1.0])
            xy = np.array(ROBOT_BASE_XY) + r * np.array([np.cos(ang), np.sin(ang)])
        else:
            xy = np.array([BLOCK_NOMINAL_XY[0], slot]) + rng.uniform(-1, 1, 2) * setup.block_xy_noise_m
        blocks.append(BlockStart(active[idx], float(xy[0]), float(xy[1]), _draw_yaw(rng, setup)))
    return blocks


def _draw_distractors(setup: Setup, rng: np.random.Generator) -> list[DistractorStart]:
    out = []
    for kind, x, y in zip(DISTRACTOR_KINDS[: setup.n_distractors], DISTRACTOR_X, DISTRACTOR_SLOT_Y):
        xy = np.array([x, y]) + rng.uniform(-1, 1, 2) * 0.02
        out.append(DistractorStart(kind, float(xy[0]), float(xy[1]), float(rng.uniform(-np.pi, np.pi))))
    return out


def _unit(rng: np.random.Generator) -> np.ndarray:
    a = rng.uniform(-np.pi, np.pi)
    return np.array([np.cos(a), np.sin(a)])


def _draw_appearance(setup: Setup, rng: np.random.Generator) -> dict:
    colors = None
    if setup.random_colors:
        colors = {part: tuple(float(c) for c in rng.uniform(0.05, 0.95, 3)) for part in PART_NAMES}
    elif setup.color_swap:  # every block wears another shape's colour: a derangement of the three
        shift = int(rng.choice([1, 2]))
        shapes = list(geometry.SHAPES)
        colors = {s: tuple(DEFAULT_BLOCK_RGB[shapes[(i + shift) % 3]]) for i, s in enumerate(shapes)}
    light = None
    if setup.lighting == "colored":
        hue = rng.uniform(0, 1)
        light = tuple(float(v) for v in 2.5 * np.array(_hue_rgb(hue)))
    cam = (0.0,) * 5
    if setup.camera_shift_m or setup.camera_shift_deg:
        d = rng.normal(size=3)
        d = d / exact.norm(d) * setup.camera_shift_m
        ang = np.deg2rad(setup.camera_shift_deg) * _unit(rng)
        cam = (float(d[0]), float(d[1]), float(d[2]), float(ang[0]), float(ang[1]))
    return dict(colors=colors, light_color=light, camera_offset=cam)


def _hue_rgb(h: float) -> tuple[float, float, float]:
    import colorsys

    return colorsys.hsv_to_rgb(h, 0.8, 1.0)


# block colours of the default scene (the env's materials use the same values)
DEFAULT_BLOCK_RGB = {"circle": (0.85, 0.2, 0.15), "square": (0.15, 0.35, 0.85), "triangle": (0.95, 0.75, 0.1)}


def sample_start(setup: Setup, rng: np.random.Generator, max_attempts: int = 1000) -> StartState:
    """Draw a start for ``setup``; rejection-samples until no footprints overlap."""
    board_xy = np.array(BOARD_NOMINAL_XY) + rng.uniform(-1, 1, 2) * setup.board_xy_offset_m
    board_yaw = float(np.deg2rad(rng.uniform(-setup.board_yaw_deg, setup.board_yaw_deg)))
    shapes = list(geometry.SHAPES)
    target = "all" if setup.full_board else str(rng.choice(shapes))
    n = len(shapes) if setup.full_board else setup.n_blocks
    others = [s for s in shapes if s != target]
    rng.shuffle(others)
    active = shapes if setup.full_board else [target] + others[: n - 1]
    for _ in range(max_attempts):
        blocks = _draw_blocks(setup, rng, active)
        distractors = _draw_distractors(setup, rng)
        if _valid(blocks, distractors, board_xy, board_yaw, packed=setup.packed):
            break
    else:
        raise RuntimeError(f"could not draw a non-overlapping start for {setup.id} in {max_attempts} attempts")
    blocks.sort(key=lambda b: shapes.index(b.shape))
    shove = None
    if setup.shove_step is not None:
        shove = tuple(float(v) for v in _unit(rng) * rng.uniform(*setup.shove_speed_mps))
    nudge = None
    if setup.nudge_m or setup.nudge_deg:
        d = _unit(rng) * setup.nudge_m
        nudge = (float(d[0]), float(d[1]), float(np.deg2rad(setup.nudge_deg) * rng.choice([-1.0, 1.0])))
    return StartState(
        target, tuple(blocks), float(board_xy[0]), float(board_xy[1]), board_yaw,
        distractors=tuple(distractors), shove_velocity=shove, nudge=nudge,
        **_draw_appearance(setup, rng),
    )


def _valid(blocks, distractors, board_xy, board_yaw, packed: bool = False) -> bool:
    discs = [((b.x, b.y), _footprint_radius(b.shape)) for b in blocks]
    discs += [((d.x, d.y), _distractor_radius(d.kind)) for d in distractors]
    for i, (xy, r) in enumerate(discs):
        if not _board_clear_of(board_xy, board_yaw, xy, r):
            return False
        for j, (xy2, r2) in enumerate(discs[i + 1:], start=i + 1):
            if packed and i < len(blocks) and j < len(blocks):
                continue  # packed blocks touch by construction, separated along y (see _draw_blocks)
            if np.hypot(xy[0] - xy2[0], xy[1] - xy2[1]) < r + r2 + MIN_GAP_M:
                return False
    return True
