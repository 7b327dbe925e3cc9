"""The benchmark's task setups as data (spec section 2).

Every setup is one row built from the default scene A01 by its changes
(``dataclasses.replace``); nothing in the code branches on setup ids. Units are
in the field names: metres (``_m``), degrees (``_deg``), metres per second
(``_mps``), control steps (``_steps``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Mapping

CONTROL_FREQ = 20  # control steps per second: every ``_steps`` field and every try's time_s counts these
CONTROL_DT_S = 1.0 / CONTROL_FREQ
# the controller every arm is driven by (pd_ee_delta_pose, env.arms): an action's translation and rotation in
# [-1, 1] per unit are this many metres and radians (ManiSkill's Panda configuration; the other arms set the same)
ACTION_TRANSLATION_M = 0.1
ACTION_ROTATION_RAD = 0.1
HOLD_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)  # the arm held still, gripper open (+1 open / -1 closed)

GROUPS = (
    "Clearance",
    "Pose and layout",
    "Clutter",
    "Appearance",
    "Viewpoint",
    "Latency and disturbance",
    "Combined stress",
)
DIFFICULTIES = ("easy", "medium", "hard")


@dataclass(frozen=True)
class Setup:
    id: str
    name: str
    group: str
    difficulty: str
    # geometry and starting poses
    clearance_m: float = 0.002
    block_xy_noise_m: float = 0.03
    block_yaw_noise_deg: float = 30.0
    board_xy_offset_m: float = 0.0
    board_yaw_deg: float = 0.0
    far_reach: bool = False
    # clutter
    n_blocks: int = 1
    n_distractors: int = 0
    packed: bool = False
    # appearance (cameras only, never physics)
    lighting: str = "default"  # default | dim | colored
    random_colors: bool = False
    color_swap: bool = False
    # viewpoint (third-person camera only)
    camera_shift_m: float = 0.0
    camera_shift_deg: float = 0.0
    occlusion: bool = False
    # latency and disturbances
    latency_steps: int = 0
    shove_step: int | None = None
    shove_speed_mps: tuple[float, float] = (0.8, 1.1)
    forced_drop_steps: int = 0
    forced_drop_lift_m: float = 0.04
    nudge_m: float = 0.0
    nudge_deg: float = 0.0
    # task
    full_board: bool = False
    max_steps: int = 300

    @property
    def disturbance(self) -> str | None:
        """Name of the disturbance this setup fires, if any."""
        if self.shove_step is not None:
            return "shove"
        if self.forced_drop_steps:
            return "forced_drop"
        if self.nudge_m or self.nudge_deg:
            return "nudge"
        return None


_A01 = Setup("A01", "nominal", "Clearance", "easy")

# camera shifts of the third-person view (E01/E02); the offset direction is drawn per try
_SMALL_SHIFT = dict(camera_shift_m=0.03, camera_shift_deg=3.0)
_LARGE_SHIFT = dict(camera_shift_m=0.12, camera_shift_deg=12.0)

# (id, name, group, difficulty, changes from A01)
_ROWS: tuple[tuple[str, str, str, str, dict], ...] = (
    ("A01", "nominal", "Clearance", "easy", {}),
    ("A02", "clearance loose", "Clearance", "easy", dict(clearance_m=0.003)),
    ("A03", "clearance tight", "Clearance", "medium", dict(clearance_m=0.001)),
    ("A04", "clearance very tight", "Clearance", "hard", dict(clearance_m=0.0005)),
    ("B01", "wide block xy", "Pose and layout", "medium", dict(block_xy_noise_m=0.10)),
    ("B02", "full block yaw", "Pose and layout", "medium", dict(block_yaw_noise_deg=180.0)),
    ("B03", "board offset", "Pose and layout", "medium", dict(board_xy_offset_m=0.05)),
    ("B04", "board yaw", "Pose and layout", "medium", dict(board_yaw_deg=30.0)),
    ("B05", "far reach", "Pose and layout", "hard", dict(far_reach=True, block_yaw_noise_deg=180.0)),
    ("C01", "two blocks", "Clutter", "easy", dict(n_blocks=2)),
    ("C02", "three blocks", "Clutter", "medium", dict(n_blocks=3)),
    ("C03", "distractor objects", "Clutter", "medium", dict(n_distractors=3)),
    ("C04", "blocks and distractors", "Clutter", "hard", dict(n_blocks=3, n_distractors=3)),
    ("C05", "packed blocks", "Clutter", "hard", dict(n_blocks=3, packed=True)),
    ("D01", "dim light", "Appearance", "easy", dict(lighting="dim")),
    ("D02", "colored light", "Appearance", "medium", dict(lighting="colored")),
    ("D03", "random colors", "Appearance", "medium", dict(random_colors=True)),
    ("D04", "color swap", "Appearance", "medium", dict(n_blocks=3, color_swap=True)),
    ("D05", "colors and light", "Appearance", "hard", dict(random_colors=True, lighting="dim")),
    ("E01", "camera shift small", "Viewpoint", "easy", _SMALL_SHIFT),
    ("E02", "camera shift large", "Viewpoint", "hard", _LARGE_SHIFT),
    ("E03", "partial occlusion", "Viewpoint", "medium", dict(occlusion=True)),
    ("E04", "shift and occlusion", "Viewpoint", "hard", dict(occlusion=True, **_SMALL_SHIFT)),
    ("F01", "latency 1", "Latency and disturbance", "easy", dict(latency_steps=1)),
    ("F02", "latency 3", "Latency and disturbance", "hard", dict(latency_steps=3)),
    ("F03", "shove before grasp", "Latency and disturbance", "medium", dict(shove_step=15)),
    ("F04", "drop after lift", "Latency and disturbance", "hard", dict(forced_drop_steps=10)),
    ("F05", "nudge near hole", "Latency and disturbance", "medium", dict(nudge_m=0.015, nudge_deg=10.0)),
    (
        "G01", "stress geometry clutter", "Combined stress", "hard",
        dict(clearance_m=0.001, block_yaw_noise_deg=180.0, n_blocks=3, n_distractors=3, random_colors=True),
    ),
    (
        "G02", "stress perception dynamics", "Combined stress", "hard",
        dict(clearance_m=0.001, occlusion=True, latency_steps=1, lighting="dim", shove_step=15, **_SMALL_SHIFT),
    ),
    # full-board task: separate from the score
    ("FB01", "full board nominal", "Full board", "medium", dict(n_blocks=3, full_board=True, max_steps=900)),
    (
        "FB02", "full board tight", "Full board", "hard",
        dict(n_blocks=3, full_board=True, max_steps=900, clearance_m=0.001),
    ),
    (
        "FB03", "full board any yaw", "Full board", "hard",
        dict(n_blocks=3, full_board=True, max_steps=900, block_yaw_noise_deg=180.0),
    ),
)

SETUPS: Mapping[str, Setup] = MappingProxyType(
    {sid: replace(_A01, id=sid, name=name, group=group, difficulty=diff, **changes)
     for sid, name, group, diff, changes in _ROWS}
)
SCORED_IDS: tuple[str, ...] = tuple(s.id for s in SETUPS.values() if not s.full_board)
FULL_BOARD_IDS: tuple[str, ...] = tuple(s.id for s in SETUPS.values() if s.full_board)


class UnknownSetupError(ValueError):
    pass


def get_setup(setup_id: str) -> Setup:
    try:
        return SETUPS[setup_id]
    except KeyError:
        raise UnknownSetupError(
            f"unknown setup id {setup_id!r}; valid: {', '.join(SETUPS)}"
        ) from None


def resolve_setups(spec: str) -> list[str]:
    """Expand a comma-separated list of ids, group letters (``A``..``G``, ``FB``) or ``all``."""
    out: list[str] = []
    for token in (t.strip() for t in spec.split(",")):
        if not token:
            continue
        if token == "all":
            ids = list(SCORED_IDS)
        elif token in SETUPS:
            ids = [token]
        elif token == "FB":
            ids = list(FULL_BOARD_IDS)
        elif any(s.startswith(token) and s[len(token):].isdigit() for s in SCORED_IDS):
            ids = [s for s in SCORED_IDS if s.startswith(token) and s[len(token):].isdigit()]
        else:
            raise UnknownSetupError(
                f"unknown setup {token!r}; valid: all, groups A..G, FB, or ids {', '.join(SETUPS)}"
            )
        out.extend(i for i in ids if i not in out)
    if not out:
        raise UnknownSetupError("no setup given; valid: all, groups A..G, FB, or ids " + ", ".join(SETUPS))
    return out


def group_of() -> dict[str, str]:
    return {sid: SETUPS[sid].group for sid in SCORED_IDS}


def difficulty_of() -> dict[str, str]:
    return {sid: SETUPS[sid].difficulty for sid in SCORED_IDS}


def parameter_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(Setup))
