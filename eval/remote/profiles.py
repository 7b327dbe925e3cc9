"""Profiles: how this scene's observation becomes a model server's input, and its output this scene's action.

A profile is a row of :data:`PROFILES` (a frozen dataclass, no code): which camera goes to which key, the image
size, the instruction key, the proprioception layout, the action chunk and how much of it is executed, the
gripper convention, the action's units and who unnormalises. Two kinds:

- **native** (``octo-small``, ``octo-base``, ``bc-state``): a server of this project (``python -m eval.serve``).
  The client sends the scene's own observation (camera frames as rendered, or the exact state for bc-state,
  the instruction, and the try's seed at each episode's start) and the server runs the in-process policy
  (:mod:`eval.policies.octo`, :mod:`eval.policies.bc_state`) on it, one per scene: its resize and crop, history
  window, chunk queue, noise key per try and conversion to the controller are those of the in-process
  adapter, so a served engine is scored exactly as the in-process one (same seeds, same actions). The reply
  is the scene's action (7,) per scene.
- **foreign** (``openvla-7b``, ``openvla-oft``, ``pi0-libero``, ``pi05-droid``): a model's own server. The
  client maps the frames to the model's keys and sizes and converts the returned (unnormalised) actions to
  the scene's controller (normalised delta end-effector: ``action[:3] * 0.1 m`` translation and
  ``action[3:6] * 0.1 rad`` angles in the robot-base frame, ``action[6]`` +1 open / -1 close; see
  :func:`eval.policies.octo.octo_to_scene`). None of these has run with released weights here.

Where each convention comes from:

- ``openvla-7b``: OpenVLA's ``predict_action(..., unnorm_key="bridge_orig")`` returns one unnormalised Bridge
  action (delta xyz m, delta roll-pitch-yaw rad, gripper 0..1 with 1 = open), no chunk; 224x224 third-person
  image only; prompt ``"In: What action should the robot take to {instruction}?\\nOut:"`` built by the server
  (vla-eval's ``model_servers/openvla.py`` sends ``images`` + ``task_description``). Converted exactly as the
  Octo adapter converts Bridge actions (:func:`~eval.policies.octo.octo_to_scene`).
- ``openvla-oft``: its LIBERO checkpoint (openvla-oft ``experiments/robot/libero``): two 224x224 images
  (agent view, wrist), 8-number proprioception (end-effector position, axis-angle, two finger positions),
  chunks of 8 actions all executed (``NUM_ACTIONS_CHUNK = 8``), unnormalised by the server with the LIBERO
  statistics; LIBERO's actions are robosuite OSC deltas normalised to [-1, 1] (0.05 m and 0.5 rad per unit)
  and the gripper is -1 open / +1 close after the adapter's ``invert_gripper_action``; vla-eval's
  ``model_servers/oft.py`` takes ``images`` (first = agent view, second = wrist), ``state``, ``task_description``.
- ``pi0-libero``: openpi ``examples/libero/main.py``: keys ``observation/image``, ``observation/wrist_image``
  (224x224, uint8), ``observation/state`` (8: eef position, axis-angle, gripper qpos), ``prompt``; the reply's
  ``actions`` is a chunk of 10 (``action_horizon``), of which the example executes 5 (``replan_steps``);
  actions are LIBERO's (as ``openvla-oft``, gripper -1 open / +1 close), unnormalised by the server.
- ``pi05-droid``: openpi ``examples/droid/main.py``: ``observation/exterior_image_1_left``,
  ``observation/wrist_image_left`` (224x224, resize with padding), ``observation/joint_position`` (7),
  ``observation/gripper_position`` (1), ``prompt``; chunks of 15 joint *velocities* (7) + gripper position
  (0 open .. 1 closed), 8 executed (``open_loop_horizon``). This scene's controller takes end-effector
  deltas, so its actions cannot be applied: the profile is listed for its inputs and refused at start.

Proprioception: camera observations of this scene carry the joint positions (``proprio``, Panda: 7 joints, 2
fingers); the end-effector pose of the LIBERO layouts is not observed, so the profiles send the finger
positions there and zeros for the pose (written in each row's ``state`` field).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

import numpy as np

from env.setups import ACTION_ROTATION_RAD, ACTION_TRANSLATION_M


@dataclass(frozen=True)
class Profile:
    name: str
    native: bool  # a server of this project: the observation as it is, the scene's action back
    observes: str  # "state" | "cameras"
    track: str
    description: str
    # foreign models: camera of this scene -> the model's image key (vla-eval: the key in ``images``)
    cameras: tuple[tuple[str, str], ...] = ()
    image_size: tuple[int, int] | None = None  # (h, w) the images are resized to (None: as rendered)
    resize: str = "lanczos"  # "lanczos" | "pad" (openpi's resize_with_pad)
    instruction_key: str = "task_description"
    state_key: str | None = None
    state: str | None = None  # proprioception layout: None, "libero8" (eef pos, axis-angle, fingers), "droid"
    action: str = "scene"  # units of the model's output: "scene", "bridge", "libero", "joint_velocity"
    chunk: int = 1  # actions per reply
    execute: int = 1  # of them executed before the next query
    gripper: str = "scene"  # "scene" (+1 open), "open1" (0..1, 1 = open), "libero" (-1 open, +1 close)
    unnormalised_by: str = "server"


PROFILES: Mapping[str, Profile] = MappingProxyType({p.name: p for p in (
    Profile("octo-small", True, "cameras", "frozen", "octo-small served by eval.serve (the in-process adapter)"),
    Profile("octo-base", True, "cameras", "frozen", "octo-base served by eval.serve (the in-process adapter)"),
    Profile("bc-state", True, "state", "adapted", "bc-state served by eval.serve (the in-process adapter)"),
    Profile("openvla-7b", False, "cameras", "frozen", "OpenVLA 7B, Bridge conventions (unnorm_key bridge_orig)",
            cameras=(("third_person", "primary"),), image_size=(224, 224), action="bridge", gripper="open1"),
    Profile("openvla-oft", False, "cameras", "frozen", "OpenVLA-OFT, its LIBERO checkpoint",
            cameras=(("third_person", "agentview"), ("wrist", "wrist")), image_size=(224, 224),
            state_key="state", state="libero8", action="libero", chunk=8, execute=8, gripper="libero"),
    Profile("pi0-libero", False, "cameras", "frozen", "openpi pi0 LIBERO example config",
            cameras=(("third_person", "observation/image"), ("wrist", "observation/wrist_image")),
            image_size=(224, 224), instruction_key="prompt", state_key="observation/state", state="libero8",
            action="libero", chunk=10, execute=5, gripper="libero"),
    Profile("pi05-droid", False, "cameras", "frozen", "openpi pi0.5 DROID example config",
            cameras=(("third_person", "observation/exterior_image_1_left"),
                     ("wrist", "observation/wrist_image_left")), image_size=(224, 224), resize="pad",
            instruction_key="prompt", state_key="observation/joint_position", state="droid",
            action="joint_velocity", chunk=15, execute=8, gripper="closed1"),
)})

LIBERO_TRANSLATION_M, LIBERO_ROTATION_RAD = 0.05, 0.5  # robosuite OSC_POSE output_max per unit action


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; valid: {', '.join(PROFILES)}")
    p = PROFILES[name]
    if p.action == "joint_velocity":
        raise ValueError(f"profile {name!r}: the model outputs joint velocities and this scene's controller takes "
                         "end-effector deltas; it cannot be evaluated here (valid: "
                         + ", ".join(n for n, q in PROFILES.items() if q.action != "joint_velocity") + ")")
    return p


def resize_image(img: np.ndarray, size: tuple[int, int], how: str) -> np.ndarray:
    from eval.policies.octo import lanczos_resize

    img = np.asarray(img)[..., :3]
    if img.dtype != np.uint8:
        img = np.clip(np.round(img), 0, 255).astype(np.uint8)
    if how == "pad" and img.shape[0] != img.shape[1]:  # openpi's resize_with_pad: keep the aspect, pad black
        s = max(img.shape[:2])
        out = np.zeros((s, s, 3), np.uint8)
        y, x = (s - img.shape[0]) // 2, (s - img.shape[1]) // 2
        out[y:y + img.shape[0], x:x + img.shape[1]] = img
        img = out
    return lanczos_resize(img, size)


def foreign_inputs(p: Profile, observation: Mapping, protocol: str) -> dict:
    """The model's input map of one scene observation (images, instruction, proprioception)."""
    images = observation.get("images") or {}
    mapped = {key: resize_image(images[cam], p.image_size, p.resize) for cam, key in p.cameras
              if images.get(cam) is not None}
    out: dict = {}
    if protocol == "vla-eval":
        out["images"] = mapped
    else:
        out.update(mapped)
    out[p.instruction_key] = observation.get("instruction", "")
    if p.state_key:
        q = np.asarray(observation.get("proprio", np.zeros(9)), np.float64).ravel()
        if p.state == "libero8":  # end-effector pose not observed here: zeros, then the two finger positions
            out[p.state_key] = np.concatenate([np.zeros(6), q[-2:]])
        else:
            out[p.state_key] = q[:7]
    return out


def to_scene(p: Profile, action) -> np.ndarray:
    """One model action (unnormalised, the model's units) as the scene's normalised action (7,)."""
    from eval.policies.octo import octo_to_scene, octo_rotation, scene_angles

    a = np.asarray(action, np.float64).ravel()
    if p.action == "scene":
        return a.astype(np.float32)
    if p.action == "bridge":
        return octo_to_scene(a[:7])
    if p.action == "libero":  # normalised OSC deltas (axis-angle rotation), gripper -1 open / +1 close
        pos = np.clip(a[:3] * LIBERO_TRANSLATION_M / ACTION_TRANSLATION_M, -1, 1)
        rotvec = a[3:6] * LIBERO_ROTATION_RAD
        from scipy.spatial.transform import Rotation

        rpy = Rotation.from_rotvec(rotvec).as_euler("xyz")  # extrinsic roll-pitch-yaw
        rot = scene_angles(octo_rotation(rpy)) / ACTION_ROTATION_RAD
        n = float(np.linalg.norm(rot))
        rot = rot / n if n > 1 else rot
        return np.concatenate([pos, rot, [1.0 if a[6] < 0 else -1.0]]).astype(np.float32)
    raise ValueError(f"profile {p.name}: actions in {p.action!r} cannot be applied by this scene's controller")
