"""The scripted reference controller (track: reference).

Closed loop on the exact simulator state: every step it reads the poses of the
gripper, the target block and its hole, decides its phase from them and
commands an end-effector delta toward the phase's goal. If the block moves
(shove, slip, drop), the next step's goal moves with it, and losing the block
sends the controller back to the approach.

Phases: approach above the knob -> descend -> close -> lift -> carry over the
hole while turning by the shortest yaw that matches the hole's symmetry ->
insert (descend slowly, still correcting xy and yaw) -> open -> retreat. On
the full board it repeats this for every block not yet in its hole.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from scipy.spatial.transform import Rotation

from env import geometry
from env.setups import ACTION_ROTATION_RAD, ACTION_TRANSLATION_M
from eval.policies.base import Policy

POS_SCALE = ACTION_TRANSLATION_M  # metres per unit action (pd_ee_delta_pose)
ROT_SCALE = ACTION_ROTATION_RAD  # radians per unit action
APPROACH_HEIGHT = 0.08  # above the knob top
CARRY_CLEARANCE = 0.035  # block bottom above the plate top while carrying
GRASP_DEPTH = 0.012  # tcp below the knob top when grasping
FAST_STEP = 0.03  # metres per control step, free motion
SLOW_STEP = 0.003  # metres per control step asked while inserting (the arm lags: about 2.5 cm/s)
CLOSE_STEPS = 6
OPEN_STEPS = 6
LOST_STEPS = 3
# share of a commanded delta the arm covers in the control step it is applied (measured about 0.35 on the
# Panda at 20 Hz); the latency predictor counts pending commands at this share, which keeps a 3-step delay
# stable and as fast as no delay (a full share over-predicts and crawls, none oscillates)
PENDING_REACH = 0.4
INTEGRAL_GAIN = 0.3
FUNNEL_SLOPE = 0.05  # labeler mode: xy tolerance of a block going down, clearance + 1 mm per 2 cm above the plate
JAM_TILT_DEG = 5.0  # labeler mode: a block this tilted at the plate is jammed (re-grasped after a drop): back up


def _wxyz_to_rot(q: np.ndarray) -> Rotation:
    return Rotation.from_quat([q[1], q[2], q[3], q[0]])


def _yaw(q: np.ndarray) -> float:
    w, x, y, z = q
    return float(np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z)))


def _wrap(a: float) -> float:
    return float((a + np.pi) % (2 * np.pi) - np.pi)


def _top_down(closing_angle: float) -> Rotation:
    """Gripper orientation pointing down with fingers closing along ``closing_angle``."""
    approaching = np.array([0.0, 0.0, -1.0])
    closing = np.array([np.cos(closing_angle), np.sin(closing_angle), 0.0])
    ortho = np.cross(closing, approaching)
    return Rotation.from_matrix(np.stack([ortho, closing, approaching], axis=1))


class ScriptedPolicy(Policy):
    name = "scripted"
    track = "reference"
    observes = "state"

    def __init__(self, clearance: float = geometry.DEFAULT_CLEARANCE, latency_steps: int = 0,
                 labeler: bool = False) -> None:
        super().__init__()
        self.clearance = clearance
        # labeler mode (demonstrations and DAgger labels for bc-state, never scored): the phase is read from
        # the scene and the last executed gripper command at every step (see _phase_from_scene) instead of
        # following the reference's own history, so that one state gets one label whoever drove the arm
        # there. With the history, a learner that hovered over the hole was labelled "descend" and "climb
        # back to carry height" in turn and learned to stay put
        self.labeler = labeler
        # actions reach the arm this many steps late (F01/F02/G02): the controller predicts where its
        # pending commands will take the gripper (a Smith predictor) instead of correcting twice
        self.latency_steps = latency_steps
        self.reset("")

    def reset(self, instruction: str, seed: int | None = None) -> None:
        self.phase = "approach"
        self.counter = 0
        self.lost = 0
        self.block_k: int | None = None
        self.hold_z: float | None = None
        self.stall = 0
        self.last_bottom = np.inf
        self.xy_integral = np.zeros(2)
        self.pending: list[tuple[np.ndarray, Rotation]] = []  # issued but not yet applied (pos m, rotation)
        self.executed_gripper, self.executed_hold, self.executed_dz = 1.0, 0, 0.0  # labeler mode: what was sent

    def observe_executed(self, action: np.ndarray) -> None:
        """Labeler mode: the action really sent this step (the reference's own, or a learner's)."""
        same = (action[6] >= 0) == (self.executed_gripper >= 0)
        self.executed_hold = self.executed_hold + 1 if same else 1
        self.executed_gripper, self.executed_dz = float(action[6]), float(action[2])

    # -------------------------------------------------------------- helpers
    def _closing_angle(self, tcp_q: np.ndarray) -> float:
        y_axis = _wxyz_to_rot(tcp_q).as_matrix()[:, 1]
        return float(np.arctan2(y_axis[1], y_axis[0]))

    def _action(self, s, goal_p, goal_angle, gripper, max_step) -> np.ndarray:
        tcp_p = s["tcp_p"] + PENDING_REACH * sum((p for p, _ in self.pending), np.zeros(3))
        tcp_r = _wxyz_to_rot(s["tcp_q"])
        for _, r in self.pending:
            tcp_r = r * tcp_r
        d = goal_p - tcp_p
        n = np.linalg.norm(d)
        if n > max_step:
            d = d * (max_step / n)
        rot = (_top_down(goal_angle) * tcp_r.inv()).as_rotvec() / ROT_SCALE
        if np.linalg.norm(rot) > 1.0:  # the controller limits the rotation's norm, not each axis
            rot = rot / np.linalg.norm(rot)
        a = np.clip(np.concatenate([d / POS_SCALE, rot, [gripper]]), -1.0, 1.0).astype(np.float32)
        if self.latency_steps:
            self.pending.append((a[:3] * POS_SCALE, Rotation.from_rotvec(PENDING_REACH * a[3:6] * ROT_SCALE)))
            del self.pending[: -self.latency_steps]
        return a

    def _pick_block(self, s) -> int | None:
        """Next target block not yet in its hole (full board: in cell order)."""
        for k in range(3):
            if s["target"][k] and not self._inserted(s, k):
                return k
        return None

    def _inserted(self, s, k) -> bool:
        bottom = s["block_p"][k][2] - geometry.BLOCK_HEIGHT / 2
        xy_err = np.linalg.norm(s["block_p"][k][:2] - s["hole_xy"][k])
        return bottom <= s["board_top_z"] - 0.026 and xy_err <= self.clearance + 0.003

    def _phase_from_scene(self, s) -> None:
        """Labeler mode: the phase (and block, counters) that the scene and the last commands imply."""
        closed = self.executed_gripper < 0
        hold = self.executed_hold
        grasped = bool(s["is_grasped"])
        tcp_p = s["tcp_p"]
        angle = self._closing_angle(s["tcp_q"])
        for k in range(3):
            if not s["target"][k]:
                continue
            bp = s["block_p"][k]
            knob_top = bp[2] + geometry.BLOCK_HEIGHT / 2 + geometry.KNOB_HEIGHT
            if self._inserted(s, k):
                retreat_z = knob_top - GRASP_DEPTH + 0.08
                if closed or hold < OPEN_STEPS + self.latency_steps:  # release, for a fixed number of steps
                    self.block_k, self.phase, self.counter = k, "open", 0 if closed else hold
                    return
                if tcp_p[2] < retreat_z - 0.01:
                    self.block_k, self.phase, self.hold_z = k, "retreat", retreat_z
                    return
                continue  # done with this block
            self.block_k = k
            byaw = _yaw(s["block_q"][k])
            grip_angle = byaw + np.pi / 2 * np.round(_wrap(angle - byaw) / (np.pi / 2))
            grasp_p = np.array([bp[0], bp[1], knob_top - GRASP_DEPTH])
            if not closed:
                if np.linalg.norm(grasp_p - tcp_p) < 0.004:
                    self.phase, self.counter = "close", 0
                elif (np.linalg.norm(grasp_p[:2] - tcp_p[:2]) < 0.006 and abs(_wrap(grip_angle - angle)) < np.deg2rad(5)
                      and tcp_p[2] < grasp_p[2] + APPROACH_HEIGHT + 0.01):
                    self.phase = "descend"
                else:
                    self.phase = "approach"
                return
            if hold < CLOSE_STEPS + self.latency_steps:
                self.phase, self.counter = "close", hold
                return
            if not grasped:  # closed on nothing, or the block slipped: start over
                self.phase = "approach"
                return
            bottom = bp[2] - geometry.BLOCK_HEIGHT / 2
            top_z = s["board_top_z"]
            xy_err = float(np.linalg.norm(s["hole_xy"][k] - bp[:2]))
            yaw_err = abs(geometry.yaw_error(geometry.SHAPES[k], byaw, float(s["hole_yaw"][k])))
            xy_tol = max(0.0003, 0.3 * self.clearance)
            # below carry height and above the plate, the block is on its way into the hole (lifting starts far
            # from it): it may sway by a millimetre or two as the descent starts, which the insertion corrects on
            # the way down, so it counts as inserting within a funnel that narrows to the clearance at the plate
            funnel = self.clearance + FUNNEL_SLOPE * max(0.0, bottom - top_z)
            below_carry = bottom < top_z + CARRY_CLEARANCE - 0.001
            if xy_err > 0.02 and (top_z + CARRY_CLEARANCE) - bottom > 0.005:
                self.phase = "lift"  # away from the hole and low: straight up first, clear of the board
            elif bottom > top_z + 0.002:  # clear of the plate
                if xy_err < xy_tol and yaw_err < np.deg2rad(0.7):
                    self.phase = "insert"
                elif below_carry and xy_err < funnel and yaw_err < np.deg2rad(3):
                    self.phase = "insert"
                else:
                    self.phase = "carry"
            else:  # at the plate: going into the hole, or stuck on its rim (back up and realign)
                tilt = float(np.arccos(np.clip(_wxyz_to_rot(s["block_q"][k]).as_matrix()[2, 2], -1.0, 1.0)))
                fits = xy_err < self.clearance and tilt < np.deg2rad(JAM_TILT_DEG)
                self.phase = "insert" if fits else "carry"
            self.stall, self.last_bottom = 0, bottom
            return
        self.phase = "done"

    # ----------------------------------------------------------------- act
    def act(self, observation: Mapping[str, Any]) -> np.ndarray:
        s = observation["state"]
        if self.labeler:
            self._phase_from_scene(s)
        if self.block_k is None or self.phase == "next":
            self.block_k = self._pick_block(s)
            self.phase = "approach" if self.block_k is not None else "done"
        if self.phase == "done":
            return np.array([0, 0, 0, 0, 0, 0, 1], dtype=np.float32)
        k = self.block_k
        shape = geometry.SHAPES[k]
        bp, bq = s["block_p"][k], s["block_q"][k]
        byaw = _yaw(bq)
        tcp_p = s["tcp_p"]
        angle = self._closing_angle(s["tcp_q"])
        knob_top = bp[2] + geometry.BLOCK_HEIGHT / 2 + geometry.KNOB_HEIGHT
        bottom = bp[2] - geometry.BLOCK_HEIGHT / 2
        top_z = s["board_top_z"]
        grasped = bool(s["is_grasped"])

        if self.phase in ("lift", "carry", "insert"):
            self.lost = 0 if grasped else self.lost + 1
            if self.lost >= LOST_STEPS:  # block slipped or was knocked away: start over
                self.phase, self.counter = "approach", 0

        if self.phase in ("approach", "descend", "close"):
            # square knob: close along the block's x or y axis, the one nearest the current grip
            grip_angle = byaw + np.pi / 2 * np.round(_wrap(angle - byaw) / (np.pi / 2))
            grasp_p = np.array([bp[0], bp[1], knob_top - GRASP_DEPTH])
            if self.phase == "approach":
                goal = grasp_p + [0, 0, APPROACH_HEIGHT]
                if np.linalg.norm(goal - tcp_p) < 0.01 and abs(_wrap(grip_angle - angle)) < np.deg2rad(3):
                    self.phase = "descend"
                return self._action(s, goal, grip_angle, 1.0, FAST_STEP)
            if self.phase == "descend":
                if np.linalg.norm(grasp_p - tcp_p) < 0.004:
                    self.phase, self.counter = "close", 0
                return self._action(s, grasp_p, grip_angle, 1.0, FAST_STEP / 2)
            self.counter += 1
            if self.counter >= CLOSE_STEPS + self.latency_steps:
                self.phase, self.lost = "lift", 0
            return self._action(s, grasp_p, grip_angle, -1.0, FAST_STEP)

        hole_xy = s["hole_xy"][k]
        yaw_err = geometry.yaw_error(shape, byaw, float(s["hole_yaw"][k]))
        goal_angle = angle + yaw_err
        xy_err = hole_xy - bp[:2]
        carry_dz = (top_z + CARRY_CLEARANCE) - bottom

        if self.phase == "lift":
            goal = np.array([tcp_p[0], tcp_p[1], tcp_p[2] + carry_dz])
            if carry_dz < 0.005:
                self.phase = "carry"
            return self._action(s, goal, angle, -1.0, FAST_STEP)

        if self.phase == "carry":
            # the arm leaves a steady error of a few tenths of a millimetre; an integral term removes it
            self.xy_integral = self.xy_integral + xy_err if np.linalg.norm(xy_err) < 0.002 else np.zeros(2)
            xy_cmd = xy_err + INTEGRAL_GAIN * self.xy_integral
            goal = np.array([tcp_p[0] + xy_cmd[0], tcp_p[1] + xy_cmd[1], tcp_p[2] + carry_dz])
            xy_tol = max(0.0003, 0.3 * self.clearance)
            if np.linalg.norm(xy_err) < xy_tol and abs(yaw_err) < np.deg2rad(0.7) and abs(carry_dz) < 0.01:
                self.phase, self.stall, self.last_bottom = "insert", 0, bottom
            step = FAST_STEP if np.linalg.norm(xy_err) > 0.02 else FAST_STEP / 4
            return self._action(s, goal, goal_angle, -1.0, step)

        if self.phase == "insert":
            target_bottom = top_z - geometry.PLATE_TOP_Z - 0.01  # aim below the table: the table stops it
            step = FAST_STEP / 3 if bottom > top_z + 0.012 else SLOW_STEP
            # limit the descent only: scaled down with it, the xy correction shrank to a few percent
            dz = max(target_bottom - bottom, -step)
            goal = np.array([tcp_p[0] + xy_err[0], tcp_p[1] + xy_err[1], tcp_p[2] + dz])
            self.stall = self.stall + 1 if bottom > self.last_bottom - 0.0003 else 0
            self.last_bottom = min(self.last_bottom, bottom)
            through = bottom <= top_z - 0.027 or bottom <= 0.002
            if through and self.stall >= 2:
                self.phase, self.counter = "open", 0
            elif self.stall >= 8 and not through:  # jammed on the rim: back up and realign
                self.phase = "carry"
            return self._action(s, goal, goal_angle, -1.0, FAST_STEP)

        if self.phase == "open":
            self.counter += 1
            if self.counter >= OPEN_STEPS + self.latency_steps:
                self.phase, self.hold_z = "retreat", tcp_p[2] + 0.08
            return self._action(s, tcp_p, angle, 1.0, FAST_STEP)

        if self.phase == "retreat":
            goal = np.array([tcp_p[0], tcp_p[1], self.hold_z])
            if tcp_p[2] > self.hold_z - 0.01:
                self.phase = "next"
            return self._action(s, goal, angle, 1.0, FAST_STEP)
        raise AssertionError(f"unknown phase {self.phase}")
