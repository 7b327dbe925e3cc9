"""Profiles: how this scene's observation becomes a model server's input, and its reply this scene's action.

A profile is a row of :data:`PROFILES` (a frozen dataclass, no code) written for one server's code: which
camera goes to which key and at what size, the instruction key, the proprioception layout, the shape of a
reply's ``actions``, how many of them are executed, their units and the gripper's sign, and where each of
these was read (:attr:`Profile.sources`: the upstream file and commit). ``python -m eval.remote.profiles``
prints the table (docs/servers.md, "The profiles", quotes it; a test checks they agree). Two kinds:

- **native** (``octo-small``, ``octo-base``, ``bc-state``): a server of this project (``python -m eval.serve``).
  The client sends the scene's own observation (camera frames as rendered, or the exact state for bc-state,
  the instruction, and the try's seed at each episode's start) and the server runs the in-process policy
  (:mod:`eval.policies.octo`, :mod:`eval.policies.bc_state`) on it, one per scene: its resize and crop, history
  window, chunk queue, noise key per try and conversion to the controller are those of the in-process
  adapter, so a served engine is scored exactly as the in-process one (same seeds, same actions). The reply
  is the scene's action (7,) per scene.
- **foreign**: a model's own server, each profile bound to the protocol of the server it was read from
  (:attr:`Profile.protocols`). The client maps the frames to the model's keys, checks every reply against
  :attr:`Profile.reply_shape` and converts its actions to the scene's controller (normalised delta
  end-effector: ``action[:3] * 0.1 m`` translation and ``action[3:6] * 0.1 rad`` angles in the robot-base
  frame, ``action[6]`` +1 open / -1 close; see :func:`eval.policies.octo.octo_to_scene`): the motion by
  :attr:`Profile.action`, the gripper by :attr:`Profile.gripper`. None of these has run with released
  weights here; the tests run each server's own code (vla-eval's model servers, openpi's wire, a stub of
  openvla-oft's deploy.py) with a stub model in place of the weights.

Proprioception: camera observations of this scene carry the joint positions (``proprio``, Panda: 7 joints, 2
fingers); the end-effector pose of the LIBERO layouts is not observed, so the profiles send the finger
positions there and zeros for the pose. openpi's ``pi0_libero`` adds the state it is sent to its actions
(``extra_delta_transform``: ``AbsoluteActions`` on the first 6 dimensions), so through this profile its motions
are off by the unobserved pose; ``pi05_libero`` does not (``extra_delta_transform=False``).
LIBERO's cameras render upside down and its clients flip them (``[::-1, ::-1]``); this scene renders upright,
so nothing is flipped.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

import numpy as np

from env.setups import ACTION_ROTATION_RAD, ACTION_TRANSLATION_M

# where each convention was read: the upstream repository at the commit read, or the package version
OPENPI = "Physical-Intelligence/openpi@15a9616"
OPENVLA_OFT = "moojink/openvla-oft@213c5ff"
VLA_EVAL = "vla-eval 0.8.0 (PyPI)"
ROBOSUITE = "ARISE-Initiative/robosuite@03f55e5"
NATIVE_SOURCE = "this project: eval/serve.py runs the in-process adapter (eval/policies/octo.py, bc_state.py)"

# what the conventions of the table mean, in words (the keys of Profile.sources)
CONVENTIONS = ("images", "image size", "instruction", "state", "reply", "executed", "actions", "gripper")
RESIZES = {
    "none": "as rendered (the server resizes)",
    "pad_bilinear": "bilinear, aspect kept, padded black (openpi_client.image_tools.resize_with_pad)",
}
STATES = {
    None: "none",
    "libero8": "8: end-effector position (3), axis-angle (3), finger joints (2); the pose is not observed "
               "here: zeros",
    "droid": "7 joint positions; gripper position apart",
}
ACTIONS = {
    "scene": "the scene's normalised action (the in-process adapter converts on the server)",
    "bridge": "Bridge deltas, unnormalised (unnorm_key bridge_orig): xyz m, roll-pitch-yaw rad, robot base; "
              "converted as the Octo adapter converts them",
    "libero": "LIBERO deltas, unnormalised: robosuite OSC_POSE input in [-1, 1], xyz x 0.05 m, axis-angle "
              "x 0.5 rad (output_max)",
    "joint_velocity": "7 joint velocities + gripper position: not this scene's controller (refused)",
}
GRIPPERS = {  # named as vla-eval's DimSpec formats where it has one
    "binary_close_negative": "+1 open, -1 close (the scene's own)",
    "binary_close_positive": "-1 open, +1 close; below 0 is open (as vla-eval's LIBERO benchmark binarises)",
    "open_01": "0..1, 1 = open (RLDS); above 0.5 is open (openvla-oft's normalize_gripper_action, "
               "invert_gripper_action)",
    "closed_01": "0 open .. 1 closed (DROID gripper position)",
}
LIBERO_TRANSLATION_M, LIBERO_ROTATION_RAD = 0.05, 0.5  # robosuite OSC_POSE output_max per unit action


@dataclass(frozen=True)
class Profile:
    name: str
    native: bool  # a server of this project: the observation as it is, the scene's action back
    observes: str  # "state" | "cameras"
    track: str
    description: str
    protocols: tuple[str, ...] = ("openpi", "vla-eval")  # the protocols of the servers it is written for
    # foreign models: camera of this scene -> the model's image key (vla-eval: the key in ``images``)
    cameras: tuple[tuple[str, str], ...] = ()
    image_size: tuple[int, int] | None = None  # (h, w) the client resizes to (None: as rendered)
    resize: str = "none"  # a key of RESIZES
    instruction_key: str = "task_description"
    state_key: str | None = None
    state: str | None = None  # a key of STATES
    action: str = "scene"  # units of the model's motion, a key of ACTIONS
    gripper: str = "binary_close_negative"  # a key of GRIPPERS
    reply_shape: tuple[int, ...] | None = None  # foreign: the shape of a reply's 'actions'
    execute: int = 1  # actions of a reply executed before the next query
    hello_gripper: str | None = None  # vla-eval: the gripper format its HELLO's action_spec declares
    hello_needs: tuple[str, ...] = ()  # vla-eval: observation_spec components the model must take
    hello_fix: str = ""  # what to restart the server with when it takes fewer
    sources: Mapping[str, str] = field(default_factory=dict)  # convention -> where it was read

    def conventions(self) -> list[tuple[str, str, str]]:
        """(convention, value, source) rows of the profile's table."""
        if self.native:
            return [("all", "the scene's observation in, the scene's action (7,) out", NATIVE_SOURCE)]
        where = "in 'images': " if "vla-eval" in self.protocols else ""
        size = (f"{self.image_size[0]}x{self.image_size[1]}, {RESIZES[self.resize]}" if self.image_size
                else RESIZES["none"])
        values = {
            "images": where + ", ".join(f"{cam} -> '{key}'" for cam, key in self.cameras),
            "image size": size,
            "instruction": f"'{self.instruction_key}'",
            "state": f"'{self.state_key}': {STATES[self.state]}" if self.state_key else STATES[None],
            "reply": f"'actions' {self.reply_shape}",
            "executed": f"{self.execute} per query",
            "actions": ACTIONS[self.action],
            "gripper": GRIPPERS[self.gripper],
        }
        return [(c, values[c], self.sources.get(c, "")) for c in CONVENTIONS]


LIBERO_ACTIONS = f"{ROBOSUITE} robosuite/controllers/config/osc_pose.json (output_max)"
OFT_IMAGE_SIZE = (f"{OPENVLA_OFT} experiments/robot/openvla_utils.py (prepare_images_for_vla: JPEG round trip, "
                  "TF Lanczos to 224x224, centre crop 0.9)")
OPENPI_LIBERO = f"{OPENPI} examples/libero/main.py"
OPENPI_LIBERO_GRIPPER = (f"{OPENPI} examples/libero/convert_libero_data_to_lerobot.py (LIBERO's raw actions); "
                         f"{OPENVLA_OFT} prismatic/vla/datasets/rlds/oxe/transforms.py (raw: -1 open, +1 close)")


_PI0_LIBERO = Profile(
        "pi0-libero", False, "cameras", "frozen", "openpi pi0, its pi0_libero config", protocols=("openpi",),
        cameras=(("third_person", "observation/image"), ("wrist", "observation/wrist_image")),
        image_size=(224, 224), resize="pad_bilinear", instruction_key="prompt", state_key="observation/state",
        state="libero8", action="libero", gripper="binary_close_positive", reply_shape=(50, 7), execute=5,
        sources={
            "images": OPENPI_LIBERO, "instruction": OPENPI_LIBERO, "state": OPENPI_LIBERO,
            "image size": f"{OPENPI_LIBERO} (resize_with_pad 224), packages/openpi-client/src/openpi_client/"
                          "image_tools.py",
            "reply": f"{OPENPI} src/openpi/models/pi0_config.py (action_horizon 50), "
                     "src/openpi/policies/libero_policy.py (LiberoOutputs: [..., :7])",
            "executed": f"{OPENPI_LIBERO} (replan_steps 5)",
            "actions": LIBERO_ACTIONS, "gripper": OPENPI_LIBERO_GRIPPER})

PROFILES: Mapping[str, Profile] = MappingProxyType({p.name: p for p in (
    Profile("octo-small", True, "cameras", "frozen", "octo-small served by eval.serve (the in-process adapter)"),
    Profile("octo-base", True, "cameras", "frozen", "octo-base served by eval.serve (the in-process adapter)"),
    Profile("bc-state", True, "state", "adapted", "bc-state served by eval.serve (the in-process adapter)"),
    Profile("openvla-7b", False, "cameras", "frozen", "OpenVLA 7B behind vla-eval's OpenVLA server, Bridge "
            "un-normalisation", protocols=("vla-eval",), cameras=(("third_person", "primary"),),
            action="bridge", gripper="binary_close_positive", reply_shape=(7,), hello_gripper="binary_close_positive",
            sources={
                "images": f"{VLA_EVAL} vla_eval/model_servers/openvla.py (_preprocess_image: the first image)",
                "image size": f"{VLA_EVAL} model_servers/openvla.py (_preprocess_image: PIL Lanczos to 224x224)",
                "instruction": f"{VLA_EVAL} model_servers/openvla.py (predict: task_description in the prompt)",
                "state": f"{VLA_EVAL} model_servers/openvla.py (get_observation_spec: image, language)",
                "reply": f"{VLA_EVAL} model_servers/openvla.py (chunk_size=1: predict_action's one action)",
                "executed": f"{VLA_EVAL} model_servers/predict.py (one action per observation)",
                "actions": f"{OPENVLA_OFT} prismatic/vla/datasets/rlds/oxe/transforms.py (bridge_orig: "
                           "world_vector, rotation_delta)",
                "gripper": f"{VLA_EVAL} model_servers/openvla.py (predict: -sign(2g - 1); action_spec "
                           "binary_close_positive)"}),
    Profile("openvla-oft", False, "cameras", "frozen", "OpenVLA-OFT (LIBERO checkpoint) behind vla-eval's OFT "
            "server", protocols=("vla-eval",), cameras=(("third_person", "agentview"), ("wrist", "wrist")),
            state_key="states", state="libero8", action="libero", gripper="binary_close_positive", reply_shape=(7,),
            hello_gripper="binary_close_positive", hello_needs=("wrist_image", "state"),
            hello_fix="--args.num_images_in_input 2 --args.use_proprio true",
            sources={
                "images": f"{VLA_EVAL} vla_eval/benchmarks/libero/benchmark.py (make_obs: agentview, wrist), "
                          "model_servers/oft.py (first = full_image, second = wrist_image)",
                "image size": OFT_IMAGE_SIZE,
                "instruction": f"{VLA_EVAL} model_servers/oft.py (predict: task_description)",
                "state": f"{VLA_EVAL} benchmarks/libero/benchmark.py (make_obs: 'states')",
                "reply": f"{VLA_EVAL} model_servers/predict.py (the chunk buffered: one action per observation)",
                "executed": f"{OPENVLA_OFT} prismatic/vla/constants.py (LIBERO NUM_ACTIONS_CHUNK 8, all executed)",
                "actions": LIBERO_ACTIONS,
                "gripper": f"{VLA_EVAL} model_servers/oft.py (predict: -sign(2g - 1); action_spec "
                           "binary_close_positive)"}),
    Profile("openvla-oft-http", False, "cameras", "frozen", "OpenVLA-OFT (LIBERO checkpoint) behind its own "
            "deploy.py server (POST /act)", protocols=("openvla-http",),
            cameras=(("third_person", "full_image"), ("wrist", "wrist_image")), instruction_key="instruction",
            state_key="state", state="libero8", action="libero", gripper="open_01", reply_shape=(8, 7), execute=8,
            sources={
                "images": f"{OPENVLA_OFT} experiments/robot/openvla_utils.py (get_vla_action: full_image, keys "
                          "with 'wrist')",
                "image size": OFT_IMAGE_SIZE,
                "instruction": f"{OPENVLA_OFT} vla-scripts/deploy.py (get_server_action: 'instruction')",
                "state": f"{OPENVLA_OFT} experiments/robot/libero/run_libero_eval.py (prepare_observation)",
                "reply": f"{OPENVLA_OFT} vla-scripts/deploy.py, experiments/robot/openvla_utils.py (get_vla_action:"
                         " a list of NUM_ACTIONS_CHUNK 8 actions of 7)",
                "executed": f"{OPENVLA_OFT} experiments/robot/libero/run_libero_eval.py (num_open_loop_steps 8)",
                "actions": LIBERO_ACTIONS,
                "gripper": f"{OPENVLA_OFT} experiments/robot/libero/run_libero_eval.py (process_action), "
                           "prismatic/vla/datasets/rlds/oxe/transforms.py (libero_dataset_transform: 1 = open)"}),
    _PI0_LIBERO,
    replace(_PI0_LIBERO, name="pi05-libero", description="openpi pi0.5, its pi05_libero config", reply_shape=(10, 7),
            sources={**_PI0_LIBERO.sources, "reply": f"{OPENPI} src/openpi/training/config.py (pi05_libero: "
                     "action_horizon 10), src/openpi/policies/libero_policy.py (LiberoOutputs: [..., :7])"}),
    Profile("pi05-droid", False, "cameras", "frozen", "openpi pi0.5, its pi05_droid config", protocols=("openpi",),
            cameras=(("third_person", "observation/exterior_image_1_left"),
                     ("wrist", "observation/wrist_image_left")), image_size=(224, 224), resize="pad_bilinear",
            instruction_key="prompt", state_key="observation/joint_position", state="droid",
            action="joint_velocity", gripper="closed_01", reply_shape=(15, 8), execute=8,
            sources={c: f"{OPENPI} examples/droid/main.py" for c in CONVENTIONS} | {
                "reply": f"{OPENPI} src/openpi/training/config.py (pi05_droid: action_horizon 15)"}),
)})


def get_profile(name: str, protocol: str | None = None) -> Profile:
    """The profile ``name`` (one line naming the valid ones), refused where this scene cannot apply its
    actions or ``protocol`` is not its server's."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; valid: {', '.join(PROFILES)}")
    p = PROFILES[name]
    if p.action == "joint_velocity":
        raise ValueError(f"profile {name!r}: the model outputs joint velocities and this scene's controller takes "
                         "end-effector deltas; it cannot be evaluated here (valid: "
                         + ", ".join(n for n, q in PROFILES.items() if q.action != "joint_velocity") + ")")
    if protocol is not None and protocol not in p.protocols:
        raise ValueError(f"profile {name!r} is written for {' or '.join(p.protocols)} servers, not --protocol "
                         f"{protocol}; use --protocol {p.protocols[0]}")
    return p


def resize_with_pad(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """openpi-client's ``image_tools.resize_with_pad`` (Pillow bilinear to fit, pasted centred on black)."""
    from PIL import Image

    h, w = size
    if img.shape[:2] == (h, w):
        return img
    ratio = max(img.shape[1] / w, img.shape[0] / h)
    rh, rw = int(img.shape[0] / ratio), int(img.shape[1] / ratio)
    resized = Image.fromarray(img).resize((rw, rh), resample=Image.BILINEAR)
    out = Image.new(resized.mode, (w, h), 0)
    out.paste(resized, (max(0, int((w - rw) / 2)), max(0, int((h - rh) / 2))))
    return np.asarray(out)


def _image(img, p: Profile) -> np.ndarray:
    if hasattr(img, "detach"):  # torch tensors of GPU scenes
        img = img.detach().cpu().numpy()
    img = np.asarray(img)[..., :3]
    if img.dtype != np.uint8:
        img = np.clip(np.round(img), 0, 255).astype(np.uint8)
    img = np.ascontiguousarray(img)
    return resize_with_pad(img, p.image_size) if p.image_size else img


def foreign_inputs(p: Profile, observation: Mapping, protocol: str) -> dict:
    """The model's input map of one scene observation (images, instruction, proprioception)."""
    images = observation.get("images") or {}
    mapped = {key: _image(images[cam], p) for cam, key in p.cameras if images.get(cam) is not None}
    out: dict = {}
    if protocol == "vla-eval":
        out["images"] = mapped
    else:
        out.update(mapped)
    out[p.instruction_key] = observation.get("instruction", "")
    if p.state_key:
        q = observation.get("proprio")
        q = np.zeros(9) if q is None else np.asarray(q.detach().cpu().numpy() if hasattr(q, "detach") else q)
        q = q.astype(np.float64).ravel()
        if p.state == "libero8":  # end-effector pose not observed here: zeros, then the two finger positions
            out[p.state_key] = np.concatenate([np.zeros(6), q[-2:]])
        else:
            out[p.state_key] = q[:7]
    return out


def gripper_to_scene(convention: str, g: float) -> float:
    """A model's gripper command in ``convention`` as the scene's (+1 open, -1 close)."""
    if convention == "binary_close_negative":
        return 1.0 if g > 0 else -1.0
    if convention == "binary_close_positive":
        return 1.0 if g < 0 else -1.0
    if convention == "open_01":
        return 1.0 if g > 0.5 else -1.0
    raise ValueError(f"gripper convention {convention!r} has no conversion to this scene's")


def to_scene(p: Profile, action) -> np.ndarray:
    """One model action (unnormalised, the model's units) as the scene's normalised action (7,)."""
    from eval.policies.octo import octo_rotation, octo_to_scene, scene_angles

    a = np.asarray(action, np.float64).ravel()
    if p.action == "scene":  # a server of this project answers with the scene's action
        return a.astype(np.float32)
    if p.action == "bridge":
        motion = octo_to_scene(np.concatenate([a[:6], [1.0]]))[:6].astype(np.float64)
    elif p.action == "libero":  # normalised OSC deltas (axis-angle rotation)
        from scipy.spatial.transform import Rotation

        pos = np.clip(a[:3] * LIBERO_TRANSLATION_M / ACTION_TRANSLATION_M, -1, 1)
        rpy = Rotation.from_rotvec(a[3:6] * LIBERO_ROTATION_RAD).as_euler("xyz")  # extrinsic roll-pitch-yaw
        rot = scene_angles(octo_rotation(rpy)) / ACTION_ROTATION_RAD
        n = float(np.linalg.norm(rot))
        motion = np.concatenate([pos, rot / n if n > 1 else rot])
    else:
        raise ValueError(f"profile {p.name}: actions in {p.action!r} cannot be applied by this scene's controller")
    return np.concatenate([motion, [gripper_to_scene(p.gripper, a[6])]]).astype(np.float32)


def markdown_table() -> str:
    """Every profile's conventions and their sources, as docs/servers.md quotes them."""
    out = ["| profile | protocol | convention | value | read from |", "|---|---|---|---|---|"]
    for p in PROFILES.values():
        for i, (conv, value, source) in enumerate(p.conventions()):
            lead = (f"`{p.name}`", " / ".join(p.protocols)) if i == 0 else ("", "")
            out.append(f"| {lead[0]} | {lead[1]} | {conv} | {value} | {source} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(prog="python -m eval.remote.profiles",
                            description="Print every remote profile's conventions and where each was read "
                                        "(the Markdown table docs/servers.md's 'The profiles' quotes).").parse_args(argv)
    sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
