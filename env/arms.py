"""Robot arms the task runs on, as a table of frozen specs.

Panda is the default and ships with mani-skill. Other arms are added as rows
here; an unknown arm name is an error listing the valid ones, never a silent
fallback to the Panda.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

import numpy as np


@dataclass(frozen=True)
class ArmSpec:
    name: str  # name used on the command line and in records
    maniskill_uid: str  # ManiSkill agent uid
    base_xy: tuple[float, float]
    rest_qpos: tuple[float, ...]
    wrist_camera_uid: str  # the agent's own wrist camera sensor uid
    gripper_open_qpos: float  # finger joint value when fully open
    finger_links: tuple[str, str]  # links whose contacts count as touching a block
    download_command: str | None = None  # how to fetch assets mani-skill does not ship

    def gripper_opening(self, gripper_qpos: np.ndarray) -> np.ndarray:
        """Opening as a fraction 0 (closed) .. 1 (fully open)."""
        return np.asarray(gripper_qpos) / self.gripper_open_qpos


_PANDA = ArmSpec(
    name="panda",
    maniskill_uid="panda_wristcam",
    base_xy=(-0.615, 0.0),
    rest_qpos=(0.0, np.pi / 8, 0.0, -np.pi * 5 / 8, 0.0, np.pi * 3 / 4, -np.pi / 4, 0.04, 0.04),
    wrist_camera_uid="hand_camera",
    gripper_open_qpos=0.04,
    finger_links=("panda_leftfinger", "panda_rightfinger"),
)

ARMS: Mapping[str, ArmSpec] = MappingProxyType({a.name: a for a in (_PANDA,)})


class UnknownArmError(ValueError):
    pass


def get_arm(name: str) -> ArmSpec:
    try:
        return ARMS[name]
    except KeyError:
        raise UnknownArmError(f"unknown arm {name!r}; valid: {', '.join(ARMS)}") from None
