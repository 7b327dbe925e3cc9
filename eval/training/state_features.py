"""The fixed input of the adapted track (bc-state): 32 numbers of scene state and 8 of the policy's own
action history, no camera input.

Built from ``ShapeAssemblyEnv.task_state()`` for one scene. Angles enter as
cosine/sine pairs of multiples that remove the symmetries, so that equivalent
poses give equal features. Positions in metres in the world frame (the robot
base is at x = -0.615, the table top is z = 0).

| index | name | meaning |
|---|---|---|
| 0-2 | tcp_p | gripper centre point |
| 3-4 | grip_cs | cos, sin of 2 x the finger closing angle (the gripper is symmetric under a half turn) |
| 5 | opening | gripper opening, 0 closed .. 1 open |
| 6-8 | block_p | target block centre |
| 9-10 | block_hole_yaw_cs | cos, sin of n x (hole yaw - block yaw), n = 4 square, 3 triangle; (1, 0) for the circle |
| 11-12 | grip_knob_cs | cos, sin of 4 x (closing angle - block yaw): the square knob's quarter-turn symmetry |
| 13-15 | hole | target hole centre xy and the plate's top z |
| 16-18 | block_minus_tcp | block centre - tcp |
| 19-21 | hole_minus_block | hole centre - block centre (xy) and plate top - block bottom (z) |
| 22 | tilt | block tilt from upright, rad |
| 23 | grasped | 1 when both fingers hold the target block |
| 24-26 | shape | one-hot circle, square, triangle |
| 27-28 | hole_yaw_cs | cos, sin of the board's yaw |
| 29-30 | tcp_tilt | x, y of the rotation vector (rad, world frame) that turns the gripper back to pointing straight down |
| 31 | yaw_err | the shortest block yaw (rad) that matches the hole modulo the shape's symmetry, 0 for the circle |

| 32-38 | last_action | the action the policy sent at the previous step (hold still, gripper open at a try's start) |
| 39 | gripper_hold | steps the current gripper command has been held, / 12, at most 1 |

Version 2 added 29-31: without the tilt a learned policy cannot see (so cannot undo) a gripper pushed off
vertical, and cos/sin of n x yaw fold large yaw errors onto small ones. Version 3 added 32-39: the
scripted reference closes and opens its gripper for a fixed number of steps and changes from approach to
descent with hysteresis, so one scene state carries two labels there (stay or lift, hover or descend) and
a policy that sees the scene alone settles between them and stalls. Its own last action and how long it
has held the gripper command tell those phases apart.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from engines.bc_mlp import HISTORY_DIM, SCENE_DIM
from env import geometry
from eval.policies.base import HOLD_ACTION

# one name per scene feature, in order (the table above): the names of a recording's observation.environment_state
SCENE_NAMES = ("tcp_x", "tcp_y", "tcp_z", "grip_cos", "grip_sin", "opening", "block_x", "block_y", "block_z",
               "block_hole_yaw_cos", "block_hole_yaw_sin", "grip_knob_cos", "grip_knob_sin", "hole_x", "hole_y",
               "plate_top_z", "block_minus_tcp_x", "block_minus_tcp_y", "block_minus_tcp_z", "hole_minus_block_x",
               "hole_minus_block_y", "plate_top_minus_block_bottom", "tilt", "grasped", "shape_circle",
               "shape_square", "shape_triangle", "hole_yaw_cos", "hole_yaw_sin", "tcp_tilt_x", "tcp_tilt_y", "yaw_err")
STATE_DIM = SCENE_DIM + HISTORY_DIM
VERSION = "eval.training.state_features v3 (32 scene + 8 history numbers)"
GRIPPER_HOLD_CAP = 12  # steps; the reference's longest fixed gripper phase is 6 + 3 latency steps
_ORDER = {"circle": 1, "square": 4, "triangle": 3}


def _yaw(q: np.ndarray) -> float:
    w, x, y, z = q
    return float(np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z)))


def _rotation(q: np.ndarray) -> np.ndarray:
    w, x, y, z = q
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def tilt_rotvec(rot: np.ndarray) -> np.ndarray:
    """Rotation vector (world frame) taking the gripper to pointing down with the same closing direction."""
    approach = rot[:, 2]
    down = np.array([0.0, 0.0, -1.0])
    axis = np.cross(approach, down)
    s, c = np.linalg.norm(axis), float(np.dot(approach, down))
    return axis / s * np.arctan2(s, c) if s > 1e-9 else np.zeros(3)


def target_index(state: Mapping[str, np.ndarray]) -> int:
    """The block to work on: the single target, or on the full board the first one not yet inserted."""
    targets = np.flatnonzero(state["target"])
    for k in targets:
        bottom = state["block_p"][k][2] - geometry.BLOCK_HEIGHT / 2
        xy = np.linalg.norm(state["block_p"][k][:2] - state["hole_xy"][k])
        if not (bottom <= state["board_top_z"] - 0.026 and xy <= 0.006):
            return int(k)
    return int(targets[-1])


def state_vector(state: Mapping[str, np.ndarray]) -> np.ndarray:
    """Features of one scene's ``task_state`` (arrays without the batch dimension)."""
    k = target_index(state)
    shape = geometry.SHAPES[k]
    rot = _rotation(state["tcp_q"])
    closing = float(np.arctan2(rot[1, 1], rot[0, 1]))
    bq = state["block_q"][k]
    byaw = _yaw(bq)
    hole_yaw = float(state["hole_yaw"][k])
    n = _ORDER[shape]
    dyaw = hole_yaw - byaw if n > 1 else 0.0
    bp = state["block_p"][k]
    bottom = bp[2] - geometry.BLOCK_HEIGHT / 2
    hole = np.array([*state["hole_xy"][k], float(state["board_top_z"])])
    tilt = float(np.arccos(np.clip(_rotation(bq)[2, 2], -1.0, 1.0)))
    onehot = np.eye(3)[k]
    v = np.concatenate([
        state["tcp_p"], [np.cos(2 * closing), np.sin(2 * closing)], [float(state["gripper_opening"])],
        bp, [np.cos(n * dyaw), np.sin(n * dyaw)], [np.cos(4 * (closing - byaw)), np.sin(4 * (closing - byaw))],
        hole, bp - state["tcp_p"], [hole[0] - bp[0], hole[1] - bp[1], hole[2] - bottom], [tilt],
        [float(state["is_grasped"])], onehot, [np.cos(hole_yaw), np.sin(hole_yaw)],
        tilt_rotvec(rot)[:2], [geometry.yaw_error(shape, byaw, hole_yaw)],
    ]).astype(np.float32)
    assert v.shape == (SCENE_DIM,)
    return v


class ActionHistory:
    """The policy's own recent actions, as the last 8 input numbers: update it with every action sent."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.last = HOLD_ACTION.copy()
        self.hold = 0

    def update(self, action: np.ndarray) -> None:
        action = np.asarray(action, dtype=np.float32)
        same = (action[6] >= 0) == (self.last[6] >= 0)
        self.hold = self.hold + 1 if same else 1
        self.last = action.copy()

    def vector(self) -> np.ndarray:
        return np.concatenate([self.last, [min(self.hold, GRIPPER_HOLD_CAP) / GRIPPER_HOLD_CAP]]).astype(np.float32)


def policy_input(state: Mapping[str, np.ndarray], history: ActionHistory) -> np.ndarray:
    """The full bc-state input: scene features then the action history."""
    return np.concatenate([state_vector(state), history.vector()])
