"""Robot arms the task runs on, as a table of frozen specs.

Panda is the default and ships with mani-skill. Other arms are added as rows
here; an unknown arm name is an error listing the valid ones, never a silent
fallback to the Panda.

The xArm6 with a Robotiq 2F-85 gripper and the WidowX 250s need assets that
mani-skill downloads on demand (``python -m mani_skill.utils.download_asset
xarm6`` / ``widowx250s``). :func:`check_assets` looks for the URDF before a
scene is built, so missing files give one line naming the download command
instead of ManiSkill's interactive prompt.

Every arm is driven the same way: ``pd_ee_delta_pose`` with actions in [-1, 1]
(0.1 m and 0.1 rad per unit) and a gripper command of +1 open / -1 closed.
What differs between arms is in its row: ``gripper_action`` maps the command
onto the arm's gripper controller; ``grasp_frame`` places the frame the task
state reports as the TCP (between the finger tips, z along the approach, y
along the closing direction, as on the Panda) in the agent's TCP link; the
gripper joints and their open and closed values give the opening fraction.

ManiSkill's ``widowx250s`` agent has joint controllers only, and its
``xarm6_robotiq`` grips with about 1.5 N, so a carried block pivots between the
pads. :func:`register_agents` registers ``sab_widowx250s`` and
``sab_xarm6_robotiq``, the same robots with what the task needs (see their
docstrings); the env calls it before building a scene.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import numpy as np

from env.setups import ACTION_ROTATION_RAD, ACTION_TRANSLATION_M


_IDENTITY = (0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class ArmSpec:
    name: str  # name used on the command line and in records
    maniskill_uid: str  # ManiSkill agent uid (sab_*: variants registered by register_agents)
    base_xy: tuple[float, float]
    rest_qpos: tuple[float, ...]
    wrist_camera_uid: str  # the agent's own wrist camera sensor uid
    gripper_open_qpos: float  # finger joint value when fully open
    finger_links: tuple[str, str]  # links whose contacts count as touching a block
    download_command: str | None = None  # how to fetch assets mani-skill does not ship
    # URDF relative to ManiSkill's asset folder, checked by check_assets; None: ships with mani-skill
    urdf_file: str | None = None
    gripper_closed_qpos: float = 0.0  # finger joint value when fully closed
    gripper_qpos_idx: tuple[int, ...] = (-2, -1)  # qpos columns whose mean measures the opening
    # gripper controller action for (closed, open): the env maps the command -1..+1 onto it
    gripper_action: tuple[float, float] = (-1.0, 1.0)
    # pose of the reported TCP ("grasp frame") in the agent's TCP link: x, y, z, qw, qx, qy, qz
    grasp_frame: tuple[float, ...] = _IDENTITY

    def gripper_opening(self, gripper_qpos):
        """Opening as a fraction 0 (closed) .. 1 (fully open) of the gripper joint value(s)."""
        if not hasattr(gripper_qpos, "dtype"):
            gripper_qpos = np.asarray(gripper_qpos)
        return (gripper_qpos - self.gripper_closed_qpos) / (self.gripper_open_qpos - self.gripper_closed_qpos)

    def opening_from_qpos(self, qpos):
        """Opening fraction from full robot joint positions (numpy or torch, joints last)."""
        return self.gripper_opening(qpos[..., list(self.gripper_qpos_idx)].mean(-1))

    def grasp_pose(self, tcp_pose):
        """The TCP the task state reports: the agent's TCP link pose (ManiSkill Pose) times grasp_frame."""
        if self.grasp_frame == _IDENTITY:
            return tcp_pose
        import torch
        from mani_skill.utils.structs.pose import Pose

        g = torch.tensor(self.grasp_frame, dtype=torch.float32, device=tcp_pose.p.device)
        return tcp_pose * Pose.create_from_pq(g[:3], g[3:])

    def gripper_command_to_action(self, command):
        """Map the benchmark's gripper command (-1 closed .. +1 open) to the arm's controller action."""
        closed, opened = self.gripper_action
        if (closed, opened) == (-1.0, 1.0):
            return command
        return closed + (command + 1.0) * 0.5 * (opened - closed)


_PANDA = ArmSpec(
    name="panda",
    maniskill_uid="panda_wristcam",
    base_xy=(-0.615, 0.0),
    rest_qpos=(0.0, np.pi / 8, 0.0, -np.pi * 5 / 8, 0.0, np.pi * 3 / 4, -np.pi / 4, 0.04, 0.04),
    wrist_camera_uid="hand_camera",
    gripper_open_qpos=0.04,
    finger_links=("panda_leftfinger", "panda_rightfinger"),
)

# xArm6 + Robotiq 2F-85, base where ManiSkill's table scene puts it (reaches B05). Rest: the
# gripper 0.18 m above the board's centre, pointing down, as the Panda's. The TCP link "eef"
# follows the Panda convention (z approach, y closing) at the pad tips; the grasp frame is
# 13 mm higher, so the scripted grasp (12 mm below the knob top) closes the pads over 25 mm
# of the 30 mm knob. The knuckle joints read 0 open, 0.81 rad closed; the gripper action of
# sab_xarm6_robotiq is -1 open .. +1 closed, hence gripper_action (closed, open) = (1, -1).
_XARM6 = ArmSpec(
    name="xarm6_robotiq",
    maniskill_uid="sab_xarm6_robotiq",
    base_xy=(-0.522, 0.0),
    rest_qpos=(0.0, 0.22, -1.23, 0.0, 1.01, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
    wrist_camera_uid="hand_camera",
    gripper_open_qpos=0.0,
    gripper_closed_qpos=0.81,
    gripper_qpos_idx=(6, 8),  # left and right outer knuckle joints
    gripper_action=(1.0, -1.0),
    finger_links=("left_inner_finger_pad", "right_inner_finger_pad"),
    download_command="python -m mani_skill.utils.download_asset xarm6",
    urdf_file="robots/xarm6/xarm6_robotiq.urdf",
    grasp_frame=(0.0, 0.0, -0.013, 1.0, 0.0, 0.0, 0.0),
)

# WidowX 250s: about 0.45 m of top-down reach at carrying height, so the base stands
# 0.215 m closer to the board than the Panda's, as close as the block starts allow: its
# base reaches 0.077 m forward and B01 blocks start as near as x = -0.28 m (edge -0.311).
# It reaches the holes of A and B01-B04 (B03 corners barely), not the B05 blocks (0.49-0.58
# m away). Rest: the gripper above the block start area, 0.2 m up, pointing down. The TCP
# link "ee_gripper_link" (15 mm behind the finger tips) has x along the approach and y along
# the closing direction: the grasp frame turns it +90 deg about y (z_grasp = x_tcp).
_WIDOWX = ArmSpec(
    name="widowx250s",
    maniskill_uid="sab_widowx250s",
    base_xy=(-0.40, 0.0),
    rest_qpos=(0.0, -0.3, 0.3, 0.0, np.pi / 2, 0.0, 0.037, 0.037),
    wrist_camera_uid="hand_camera",
    gripper_open_qpos=0.037,
    gripper_closed_qpos=0.015,
    finger_links=("left_finger_link", "right_finger_link"),
    download_command="python -m mani_skill.utils.download_asset widowx250s",
    urdf_file="robots/widowx/wx250s.urdf",
    grasp_frame=(0.0, 0.0, 0.0, float(np.cos(np.pi / 4)), 0.0, float(np.sin(np.pi / 4)), 0.0),
)

ARMS: Mapping[str, ArmSpec] = MappingProxyType({a.name: a for a in (_PANDA, _XARM6, _WIDOWX)})


class UnknownArmError(ValueError):
    pass


class MissingAssetsError(FileNotFoundError):
    pass


def get_arm(name: str) -> ArmSpec:
    try:
        return ARMS[name]
    except KeyError:
        raise UnknownArmError(f"unknown arm {name!r}; valid: {', '.join(ARMS)}") from None


def asset_dir() -> Path:
    """ManiSkill's asset folder (``mani_skill.ASSET_DIR``) without importing mani-skill."""
    return Path(os.getenv("MS_ASSET_DIR", os.path.join(os.path.expanduser("~"), ".maniskill"))) / "data"


def check_assets(arm: str | ArmSpec, asset_root: str | os.PathLike | None = None) -> None:
    """Raise MissingAssetsError, one line naming the download command, if the arm's URDF is absent."""
    spec = arm if isinstance(arm, ArmSpec) else get_arm(arm)
    if spec.urdf_file is None:
        return
    root = Path(asset_root) if asset_root is not None else asset_dir()
    urdf = root / spec.urdf_file
    if not urdf.is_file():
        raise MissingAssetsError(
            f"assets for {spec.name} are missing at {urdf.parent}; download them with: {spec.download_command}"
        )


def register_agents() -> None:
    """Register the agent variants the rows above name that mani-skill does not define (idempotent)."""
    from mani_skill.agents.registration import REGISTERED_AGENTS

    if "sab_xarm6_robotiq" not in REGISTERED_AGENTS:
        _register_xarm6()
    if "sab_widowx250s" not in REGISTERED_AGENTS:
        _register_widowx()


def _register_xarm6() -> None:
    from mani_skill.agents.registration import register_agent
    from mani_skill.agents.robots.xarm6.xarm6_robotiq import XArm6RobotiqWristCamera

    @register_agent(asset_download_ids=["xarm6"])
    class SabXArm6Robotiq(XArm6RobotiqWristCamera):
        """ManiSkill's ``xarm6_robotiq_wristcam`` with a firmer grip and a normalised gripper action.

        ManiSkill limits the knuckle drive to 0.1 N m: the pads then press the knob with about
        1.5 N and the block pivots up to 45 deg between them while carried. 0.5 N m gives about
        8 N per pad. In pd_ee_delta_pose the gripper action is normalised, -1 open .. +1 closed
        (knuckle 0 .. 0.81 rad), instead of the raw knuckle angle.
        """

        uid = "sab_xarm6_robotiq"
        gripper_force_limit = 0.5

        @property
        def _controller_configs(self):
            configs = super()._controller_configs
            gripper = configs["pd_ee_delta_pose"]["gripper_active"]
            gripper.lower, gripper.upper, gripper.normalize_action = 0.0, 0.81, True
            return configs


def _register_widowx() -> None:
    from copy import deepcopy

    import sapien

    from mani_skill.agents.controllers import PDEEPoseControllerConfig, PDJointPosMimicControllerConfig, deepcopy_dict
    from mani_skill.agents.registration import register_agent
    from mani_skill.agents.robots.widowx.widowx import WidowX250S
    from mani_skill.sensors.camera import CameraConfig

    @register_agent(asset_download_ids=["widowx250s"])
    class SabWidowX250S(WidowX250S):
        """ManiSkill's ``widowx250s`` with the EE delta-pose controller every arm is driven by, and a wrist camera.

        ManiSkill's agent has joint controllers only and no TCP. Gains: the Panda's (1000/100,
        a 0.1 s time constant; the real2sim gains of ``widowx250s_bridgedataset_*`` are tuned
        for 5 Hz control and lag 0.3 s). Fingers get ManiSkill's usual gripper material
        (friction 2, as on the Panda and the Robotiq pads) and a firmer finger drive
        (5000 N/m, about 30 N on a 20 mm knob): with 6 N and friction 0.45 the block tilts
        3-5 deg in the fingers while it is turned, and does not enter a 0.5 mm clearance hole.
        """

        uid = "sab_widowx250s"
        ee_link_name = "ee_gripper_link"
        urdf_config = dict(
            _materials=dict(gripper=dict(static_friction=2.0, dynamic_friction=2.0, restitution=0.0)),
            link=dict(
                left_finger_link=dict(material="gripper", patch_radius=0.1, min_patch_radius=0.1),
                right_finger_link=dict(material="gripper", patch_radius=0.1, min_patch_radius=0.1),
            ),
        )
        arm_stiffness = 1e3
        arm_damping = 1e2
        arm_force_limit = 100
        gripper_stiffness = 5e3
        gripper_damping = 2e2
        gripper_force_limit = 60

        @property
        def _controller_configs(self):
            arm = PDEEPoseControllerConfig(
                joint_names=self.arm_joint_names, pos_lower=-ACTION_TRANSLATION_M, pos_upper=ACTION_TRANSLATION_M,
                rot_lower=-ACTION_ROTATION_RAD, rot_upper=ACTION_ROTATION_RAD,
                stiffness=self.arm_stiffness, damping=self.arm_damping, force_limit=self.arm_force_limit,
                ee_link=self.ee_link_name, urdf_path=self.urdf_path,
            )
            gripper = PDJointPosMimicControllerConfig(
                joint_names=self.gripper_joint_names, lower=0.015, upper=0.037,
                stiffness=self.gripper_stiffness, damping=self.gripper_damping,
                force_limit=self.gripper_force_limit,
                mimic={"right_finger": {"joint": "left_finger"}},
            )
            target = deepcopy(arm)
            target.use_target = True
            return deepcopy_dict(dict(
                pd_ee_delta_pose=dict(arm=arm, gripper=gripper),
                pd_ee_target_delta_pose=dict(arm=target, gripper=gripper),
            ))

        @property
        def _sensor_configs(self):
            # behind and above the fingers, looking along the approach a little toward them
            pitch = np.deg2rad(25)
            return [CameraConfig(
                uid="hand_camera",
                pose=sapien.Pose(p=[0.055, 0, 0.05], q=[np.cos(pitch / 2), 0, np.sin(pitch / 2), 0]),
                width=128, height=128, fov=np.pi / 2, near=0.01, far=100,
                mount=self.robot.links_map["gripper_link"],
            )]

        def _after_init(self):
            self.tcp = self.robot.links_map[self.ee_link_name]

        @property
        def tcp_pos(self):
            return self.tcp.pose.p

        @property
        def tcp_pose(self):
            return self.tcp.pose
