"""The Panda's forward kinematics inside a network: the gripper's pose from the arm's joint positions, as ONNX
operators (no Atan2, which ONNX lacks), so that bc-camera reads the gripper's scene features from the joints it
observes exactly instead of estimating them.

The chain is ManiSkill's ``panda_v2.urdf`` (mani_skill/assets/robots/panda/panda_v2.urdf: joints panda_joint1..7,
the fixed panda_joint8, panda_hand_joint and panda_hand_tcp_joint), read from that file by
tests/test_bc_camera.py, with the base where env.arms places it. The TCP is ManiSkill's ``panda_hand_tcp``
link, the pose eval.training.state_features reads as ``tcp_p`` / ``tcp_q``.
"""

from __future__ import annotations

import math

# (xyz, rpy) of each revolute joint's origin in its parent link, panda_joint1..7 (each turns about its z)
ARM_JOINT_ORIGINS = (
    ((0.0, 0.0, 0.333), (0.0, 0.0, 0.0)),
    ((0.0, 0.0, 0.0), (-math.pi / 2, 0.0, 0.0)),
    ((0.0, -0.316, 0.0), (math.pi / 2, 0.0, 0.0)),
    ((0.0825, 0.0, 0.0), (math.pi / 2, 0.0, 0.0)),
    ((-0.0825, 0.384, 0.0), (-math.pi / 2, 0.0, 0.0)),
    ((0.0, 0.0, 0.0), (math.pi / 2, 0.0, 0.0)),
    ((0.088, 0.0, 0.0), (math.pi / 2, 0.0, 0.0)),
)
# the fixed joints from panda_link7 to panda_hand_tcp: panda_joint8, panda_hand_joint, panda_hand_tcp_joint
TCP_FIXED = (((0.0, 0.0, 0.107), (0.0, 0.0, 0.0)), ((0.0, 0.0, 0.0), (0.0, 0.0, -math.pi / 4)),
             ((0.0, 0.0, 0.1034), (0.0, 0.0, 0.0)))
URDF_JOINTS = ("panda_joint1", "panda_joint2", "panda_joint3", "panda_joint4", "panda_joint5", "panda_joint6",
               "panda_joint7", "panda_joint8", "panda_hand_joint", "panda_hand_tcp_joint")


def rpy_matrix(roll: float, pitch: float, yaw: float) -> list[list[float]]:
    """URDF's fixed-axis roll-pitch-yaw: R = Rz(yaw) Ry(pitch) Rx(roll)."""
    cr, sr, cp, sp, cy, sy = (math.cos(roll), math.sin(roll), math.cos(pitch), math.sin(pitch), math.cos(yaw),
                              math.sin(yaw))
    return [[cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
            [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
            [-sp, cp * sr, cp * cr]]


def _transform(xyz, rpy) -> list[list[float]]:
    r = rpy_matrix(*rpy)
    return [[*r[0], xyz[0]], [*r[1], xyz[1]], [*r[2], xyz[2]], [0.0, 0.0, 0.0, 1.0]]


def _matmul(a, b):
    return [[sum(a[i][k] * b[k][j] for k in range(4)) for j in range(4)] for i in range(4)]


def gripper_module(base_xyz: tuple[float, float, float]):
    """A torch module: (N, 7) arm joints and (N,) openings (0 closed .. 1 open) -> the gripper's scene features
    (eval.training.state_features: tcp_p, grip_cs, opening, tcp_tilt; (N, 8)), the arm's base at ``base_xyz``
    unrotated. Its constants are buffers (not saved with weights: they are the URDF's)."""
    import torch
    from torch import nn

    fixed = _transform(*TCP_FIXED[0])
    for xyz, rpy in TCP_FIXED[1:]:
        fixed = _matmul(fixed, _transform(xyz, rpy))

    class GripperFeatures(nn.Module):
        def __init__(self):
            super().__init__()
            base = torch.eye(4)
            base[:3, 3] = torch.tensor(base_xyz)
            self.register_buffer("base", base, persistent=False)
            self.register_buffer("origins", torch.tensor([_transform(xyz, rpy) for xyz, rpy in ARM_JOINT_ORIGINS]),
                                 persistent=False)
            self.register_buffer("tcp", torch.tensor(fixed), persistent=False)

        def tcp_pose(self, joints):
            """(position (N, 3), rotation (N, 3, 3)) of the TCP in the world."""
            zero, one = torch.zeros_like(joints[:, 0]), torch.ones_like(joints[:, 0])
            pose = self.base
            for i in range(len(ARM_JOINT_ORIGINS)):
                c, s = torch.cos(joints[:, i]), torch.sin(joints[:, i])
                turn = torch.stack([torch.stack([c, -s, zero, zero], -1), torch.stack([s, c, zero, zero], -1),
                                    torch.stack([zero, zero, one, zero], -1),
                                    torch.stack([zero, zero, zero, one], -1)], -2)
                pose = pose @ self.origins[i] @ turn
            pose = pose @ self.tcp
            return pose[:, :3, 3], pose[:, :3, :3]

        def forward(self, joints, opening):
            return self.features(*self.tcp_pose(joints), opening)

        def features(self, p, rot, opening):
            """The scene features (N, 8) from the TCP's pose (:meth:`tcp_pose`) and the openings."""
            # the closing direction: the TCP's y axis in the world's xy plane (state_features: atan2(r11, r01))
            ux, uy = rot[:, 0, 1], rot[:, 1, 1]
            r2 = (ux * ux + uy * uy).clamp_min(1e-12)
            cos2, sin2 = (ux * ux - uy * uy) / r2, 2 * ux * uy / r2
            # state_features.tilt_rotvec: (-a_y, a_x) / s * atan2(s, -a_z), a the approach (z) axis, s = |a_xy|;
            # atan2 by its half-angle form (ONNX has Atan, not Atan2)
            ax, ay, az = rot[:, 0, 2], rot[:, 1, 2], rot[:, 2, 2]
            s = torch.sqrt(ax * ax + ay * ay)
            one_plus_c = (1 - az).clamp_min(1e-6)
            angle_over_s = torch.where(s > 1e-6, 2 * torch.atan(s / one_plus_c) / s.clamp_min(1e-6), 2 / one_plus_c)
            tilt = torch.stack([-ay * angle_over_s, ax * angle_over_s], -1)
            return torch.cat([p, cos2[:, None], sin2[:, None], opening[:, None], tilt], -1)

    return GripperFeatures()
