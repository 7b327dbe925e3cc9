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

import hashlib
from dataclasses import asdict, dataclass

import numpy as np

from env import geometry
from env.setups import Setup

ROBOT_BASE_XY = (-0.615, 0.0)
BOARD_NOMINAL_XY = (0.03, 0.0)
BLOCK_NOMINAL_XY = (-0.18, 0.0)
BLOCK_SLOT_Y = (-0.10, 0.0, 0.10)  # nominal y of up to three blocks
FAR_REACH_RADIUS_M = (0.68, 0.74)  # distance from the robot base for B05
FAR_REACH_ANGLE_DEG = (25.0, 35.0)  # off the board's axis, either side
MIN_GAP_M = 0.005  # smallest gap between start footprints
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
class StartState:
    target: str  # shape of the block to insert ("all" on the full board)
    blocks: tuple[BlockStart, ...]
    board_x: float
    board_y: float
    board_yaw: float  # radians

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StartState":
        return cls(
            target=d["target"],
            blocks=tuple(BlockStart(**b) for b in d["blocks"]),
            board_x=d["board_x"], board_y=d["board_y"], board_yaw=d["board_yaw"],
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
    setup_code = int.from_bytes(hashlib.sha256(setup_id.encode()).digest()[:2], "big") % 100
    return _SPLIT_SEED_BASE[split] + setup_code * 100_000 + try_index


def _footprint_radius(shape: str) -> float:
    return float(np.max(np.linalg.norm(geometry.block_outline(shape), axis=1)))


def _board_clear_of(board_xy, board_yaw, xy, radius) -> bool:
    """True when a disc at xy is outside the board's rectangle (with the gap)."""
    c, s = np.cos(-board_yaw), np.sin(-board_yaw)
    d = np.asarray(xy) - np.asarray(board_xy)
    local = np.array([c * d[0] - s * d[1], s * d[0] + c * d[1]])
    half = np.array([geometry.CELL_SIZE / 2, 1.5 * geometry.CELL_SIZE])
    gap = np.maximum(np.abs(local) - half, 0.0)
    return float(np.linalg.norm(gap)) > radius + MIN_GAP_M if np.all(np.abs(local) < half + radius + MIN_GAP_M) else True


def _draw_yaw(rng: np.random.Generator, setup: Setup) -> float:
    return float(np.deg2rad(rng.uniform(-setup.block_yaw_noise_deg, setup.block_yaw_noise_deg)))


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
    slots = list(BLOCK_SLOT_Y) if n > 1 else [BLOCK_NOMINAL_XY[1]]
    for _ in range(max_attempts):
        order = rng.permutation(len(active))
        blocks = []
        for slot, idx in zip(slots, order):
            shape = active[idx]
            if setup.far_reach:
                r = rng.uniform(*FAR_REACH_RADIUS_M)
                ang = np.deg2rad(rng.uniform(*FAR_REACH_ANGLE_DEG)) * rng.choice([-1.0, 1.0])
                xy = np.array(ROBOT_BASE_XY) + r * np.array([np.cos(ang), np.sin(ang)])
            else:
                xy = np.array([BLOCK_NOMINAL_XY[0], slot]) + rng.uniform(-1, 1, 2) * setup.block_xy_noise_m
            blocks.append(BlockStart(shape, float(xy[0]), float(xy[1]), _draw_yaw(rng, setup)))
        if _valid(blocks, board_xy, board_yaw):
            blocks.sort(key=lambda b: shapes.index(b.shape))
            return StartState(target, tuple(blocks), float(board_xy[0]), float(board_xy[1]), board_yaw)
    raise RuntimeError(f"could not draw a non-overlapping start for {setup.id} in {max_attempts} attempts")


def _valid(blocks: list[BlockStart], board_xy, board_yaw) -> bool:
    for i, a in enumerate(blocks):
        ra = _footprint_radius(a.shape)
        if not _board_clear_of(board_xy, board_yaw, (a.x, a.y), ra):
            return False
        for b in blocks[i + 1:]:
            if np.hypot(a.x - b.x, a.y - b.y) < ra + _footprint_radius(b.shape) + MIN_GAP_M:
                return False
    return True
