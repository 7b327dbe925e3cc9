"""bc-camera: a policy that sees what the camera models see (both cameras, the arm's joint positions, the
instruction) and its own recent actions: a convolutional network estimates the scene's state from the frames,
and bc-state's network acts on the estimate.

The graph (``BCCameraNetConfig``; its FLOPs in ``flops_per_query`` of eval.training.train_bc_camera):

- each camera's frame enters as rendered, uint8 (N, H, W, 3): the graph itself averages it down to
  ``image_sides`` (third person 256 -> 64 by 4 x 4 blocks, wrist 128 -> 64 by 2 x 2), so a camera frame goes to
  the engine as the renderer wrote it (the zero-copy path on a GPU: no resize or layout change on the host);
- the **estimator**: per camera, three convolutions (5x5 stride 2, 3x3 stride 2, 3x3), then a 1x1 convolution and a
  spatial softmax, the expected image position of each of ``keypoints`` feature maps (Levine et al. 2016), and
  beside them a stride-2 3x3 convolution to ``grid_channels`` maps an eighth of the image side, flattened (how a
  thing is turned, which a keypoint does not say). The 32 scene features bc-state reads
  (eval.training.state_features) are then put together as one consistent scene (versions 4 to 8): the
  gripper's (its position, closing angle, opening and tilt) by the Panda's forward kinematics from the joint
  positions (engines.panda_kinematics: exact, nothing learnt); the block's and the hole's (positions, yaws,
  tilt, whether it is held, its shape) by an MLP from the camera features and the instruction as a one-hot
  (versions 4 and 5 gave it the gripper's features too, and it put the block under the gripper wherever the
  gripper was: ``estimator_reads_gripper``); the knob's angle to the fingers by a small MLP from the wrist camera's features alone
  (version 5: version 4 composed it from the closing angle and the estimated block yaw, and its estimator put
  the block aligned with the fingers wherever they hovered); near the block (where the estimator puts it
  within ``OFFSET_NEAR`` across of the gripper) its position across is the gripper's plus an offset read by a
  second small head on the wrist camera's features (version 7: the frames at 64 pixels place the block to
  about a centimetre, and over it bc-state needs a few millimetres); where the estimator says the block is held,
  the block is where the gripper holds it (the tcp less the knob's top, plus the head's grasp depth), and the hole
  near it is the block's position plus the hole head's offset (wrist camera; version 8: version 7 left a lifted
  block near the table and placed the hole 5 to 30 mm off); the wrist heads read these offsets across along
  the hand's axes, turned into the world's by the forward kinematics (version 9: the wrist camera turns with the
  hand, its yaw spanning 80 degrees at the hover, and version 8's heads, reading the world's axes, were
  uncorrelated with the truth on its own tries); a held block's yaw to its hole composed from the board's yaw
  (the estimator's), the closing angle (forward kinematics) and the block's turn in the fingers (the knob head's
  for the square, a triangle head's; version 10: version 8's estimator (docs/models.md's v10), reading it from
  the frames at once, was 31 degrees off for a held square on its own tries); and the relations bc-state acts
  on (block to gripper, hole to block) computed from those. From version 11 the third person is read as the
  try's first step rendered it (``first_frame_cameras``; the policy keeps that frame): read every step, v12's
  estimate of a block not yet held followed the arm in the frame. Version 12 can place the block before the grasp,
  away from the gripper, with a **locator**, an MLP of its own on that first frame's features and the instruction
  alone (``locator_hidden``, off by default: fitted onto v14 it inserted fewer blocks, docs/models.md): the
  estimator, which also reads the wrist camera, still moved its block with the gripper (v14's own tries at new
  starts: by 0.60 in x, 0.92 in y). Version 13 reads the block away from the gripper as the estimator read it at
  the try's first step, from every camera's first frame (``far_block_first_frame``; the wrist's first frame enters
  as ``wrist_first``, kept by the policy as the third person's is): what the wrist camera shows later no longer
  moves it. On v15's weights (off in the shipped file) it inserted no more blocks at new starts; a try whose block
  it placed within 25 mm at the first step inserted it 31 times in 75, one placed further off 2 in 45
  (docs/models.md). With a locator, version 13's reads both cameras' first frames. Version 14 scales a frame
  darker than its camera's ``brightness_floor`` up to it before the encoders read it (a dimmer scene's frame is
  the scene's frame scaled down; frames at or above the floor are read as they are): v15 inserted none of its
  dim-light tries (D01, G02). Version 3's MLP estimated all
  32 apart, from the raw joints, and closed loop put the block at the gripper when the gripper came over it 120 mm
  up (docs/models.md). The estimator is trained on a recording's ``observation.environment_state``, which the
  policy never observes (privileged supervision at training time only);
- the **policy head**: bc-state's MLP (engines.bc_mlp, its weights copied in and frozen while the estimator
  trains) on the estimate and the 8 action-history numbers (eval.training.state_features.ActionHistory), to the
  action. It reads the last action sent, as bc-state does; the estimator does not (a network that sees it learns
  to copy it). The head may then be tuned on the trained estimator's own estimates, against bc-state's action on
  the truth (eval.training.train_bc_camera.tune_head, ``--head-epochs``): bc-state on an estimate kept turning a
  held block that was aligned, acting on a yaw error the estimate had wrong by a degree (docs/models.md). The
  tuned head has bc-state's shape; the graph and the file's format are unchanged.

The output keeps the runners' chunk axis: actions (N, 1, 7). Weights, the normalisation and the configuration
(the head's too) live in one safetensors file; a file that does not match the code fails in one line naming
what differs. Version 1 (an MLP from the keypoints straight to a chunk of actions) failed every dev try; version 2
(keypoints only) never estimated the block's yaw; version 3 (the grid, every feature estimated) failed every dev
try, and so did versions 4 to 9 (docs/models.md).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from engines.bc_mlp import HISTORY_DIM, SCENE_DIM, BCConfig, mlp
from engines.bc_mlp import build as build_policy_head
from engines.panda_kinematics import gripper_module
from engines.weights_file import BadCheckpointError, load_checked, read_checkpoint, write_checkpoint
from env.arms import get_arm
from env.geometry import BLOCK_HEIGHT, KNOB_HEIGHT
from env.instructions import all_instructions

FORMAT = "shape-assembly-bench/bc-camera/10"
DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "weights" / "bc_camera.safetensors"
INPUT_NAMES = ("third_person", "wrist", "low_dim")
FIRST_SUFFIX = "_first"  # a camera's frame at the try's first step, as an input of its own (far_block_first_frame)
MAX_BRIGHTNESS_GAIN = 8.0  # brightness_floor scales a dark frame up by at most this (a black frame stays black)
ARM_JOINTS = 7  # of the proprioception: the Panda's arm joints, then its 2 fingers
# scene features (eval.training.state_features) read from the joints by forward kinematics: tcp_p, grip_cs,
# opening, tcp_tilt
GRIPPER_FEATURES = (0, 1, 2, 3, 4, 5, 29, 30)
# scene features the estimator finds in the frames: the block's position, its yaw to the hole's, the hole,
# tilt, grasped, shape, the board's yaw, the yaw error. Of the rest, grip_knob (11-12) comes from the wrist
# camera alone (KNOB) and the relations are computed from these and the gripper's: block_minus_tcp (16-18),
# hole_minus_block (19-21)
FREE_FEATURES = (6, 7, 8, 9, 10, 13, 14, 15, 22, 23, 24, 25, 26, 27, 28, 31)
GRASPED = 23  # whether the fingers hold the block, 0 .. 1
KNOB = [11, 12]  # grip_knob: (cos, sin) of 4 x the knob's angle to the fingers, from the wrist camera alone
KNOB_HIDDEN = 64
# the block's offset across from the gripper (version 7): read by a wrist-camera head where the estimator puts the
# block within OFFSET_NEAR of the gripper (blended over OFFSET_SOFTNESS), the estimator's farther away. The frames
# at 64 pixels place the block to about a centimetre; over the block bc-state needs a few millimetres, which the
# wrist camera shows (docs/models.md)
OFFSET_NEAR = 0.05  # m
OFFSET_SOFTNESS = 0.005  # m
OFFSET_SCALE = 0.03  # m: the head's output unit
# the held block (version 8): where the estimator says the block is held, the block is where the gripper is, its
# centre below the tcp by the knob's top (BLOCK_HEIGHT / 2 + KNOB_HEIGHT) less the wrist head's third number (the
# grasp's depth on the knob). Version 7's estimator, reading the frames alone, left a lifted block near the table
# (its height 40 to 90 mm low on its own tries: docs/models.md); the demonstrations hold it 38.5 mm below the tcp
# to within 1.5 mm
HELD_SOFTNESS = 0.1  # of the estimated grasped feature (0 .. 1), about 0.5
KNOB_TOP_ABOVE_CENTRE = BLOCK_HEIGHT / 2 + KNOB_HEIGHT  # m
# and the hole near a held block: its position across is the block's plus the hole head's offset (wrist camera),
# where the estimator puts it within OFFSET_NEAR across of the block (blended as the block's). Inserting needs the
# hole to about the clearance (2 mm); the estimator's hole was 5 to 30 mm off on version 7's own tries
# (docs/models.md)
# and the held block's yaw to its hole (version 10): n x (hole yaw - block yaw) = n x the board's yaw (the
# estimator's, from the third-person camera: within a degree on the own tries of docs/models.md's v10, version 8)
# - n x the closing angle (forward kinematics) + n x the block's turn in the fingers (wrist camera: the knob head's
# for the square, n = 4; the triangle head's, n = 3). That v10's estimator, reading it from the frames at once, was
# 31 degrees off for a held square on its own tries; composed so, with its own knob head, 3 degrees
SHAPE_ONE_HOT = (24, 25, 26)  # circle, square, triangle (env.instructions.SHAPES)
BLOCK_HOLE_YAW = [9, 10]  # cos, sin of n x (hole yaw - block yaw)
HOLE_YAW = [27, 28]  # cos, sin of the board's yaw
BLOCK_XY = [6, 7]  # the scene's block x, y
LOCATOR_CAMERA = "third_person"  # the camera the locator reads (at the try's first step)
YAW_ERR = 31  # the block's yaw to the hole, rad, modulo the shape's symmetry


@dataclass(frozen=True)
class BCCameraNetConfig:
    # (observation key, rendered side in pixels): the project's cameras (env/arms.py), square frames
    cameras: tuple[tuple[str, int], ...] = (("third_person", 256), ("wrist", 128))
    # each camera's side once the graph has averaged it, in the order of ``cameras``; the keypoint maps are a
    # quarter of it. The third person at 128 (2.5 x the FLOPs and training time) placed the block no better
    # before the grasp than at 64 (docs/models.md)
    image_sides: tuple[int, ...] = (64, 64)
    proprio_dim: int = 9  # the Panda's 7 arm joints and 2 fingers, as Scenes.proprio gives them
    instructions: tuple[str, ...] = all_instructions()
    channels: tuple[int, int, int] = (32, 32, 32)
    keypoints: int = 32
    # channels of each camera's coarse feature grid (a stride-2 convolution of the keypoint network's last maps,
    # an eighth of the image side), flattened beside the keypoints: where a keypoint says where a thing is, the
    # grid also says how it is turned (the block's yaw, never learnt from keypoints alone: docs/models.md).
    # 0: keypoints only (version 2)
    grid_channels: int = 16
    hidden: tuple[int, ...] = (256, 256)
    # whether the estimator's MLP reads the gripper's features (version 4 and 5) beside the frames and the
    # instruction. False (version 6): given the arm's pose it learnt the demonstrations' tie of the block to the
    # gripper and, on the camera policy's own tries, put the block under the gripper wherever it was (offset
    # estimated 8 mm where truly 77, uncorrelated with the truth: docs/models.md)
    estimator_reads_gripper: bool = False
    # cameras whose frame the network reads as it was at the try's first step (the policy keeps it), not the
    # step's. The third person (version 11): read every step, its estimate of a block not yet held followed the
    # arm in the frame (v12's own tries at new starts, far from the block: its error moved with the gripper's
    # offset from the block by 0.78 in x, 0.97 in y; docs/models.md). At the first step the arm is at its home
    # pose in every try, so only the scene can say where the block is; what moves later is read from the wrist
    # camera and the joints. Weights files written before this field read every step's frames
    # (``config_from_json``)
    first_frame_cameras: tuple[str, ...] = ("third_person",)
    # the locator's hidden widths (version 12; --locator-hidden): the block's x, y before the grasp, away from the
    # gripper, from the third person's first frame (its encoder's features, the estimator's) and the instruction,
    # nothing the arm moves; fitted on the trained encoder's features (eval.training.train_bc_camera.fit_locator).
    # () (the default, and weights files written before the field): the estimator's block x, y. Fitted onto v14
    # (locator 12 mm off at held-out starts, the estimator 22), its own tries at new starts inserted 2 of 60
    # against v14's 5 and spent longer far from the block: where the locator is a few cm off, the wrist head
    # takes over and reads the block under the gripper (docs/models.md)
    locator_hidden: tuple[int, ...] = ()
    # the block's x, y away from the gripper as the estimator read it at the try's first step, from every camera's
    # first frame (version 13; the cameras not in first_frame_cameras enter again as ``<camera>_first`` inputs, the
    # frame the policy kept): the same estimator, so nothing is fitted. Read from the step's wrist frame, v15's
    # estimate of a block far from the gripper still followed the gripper (by 0.69 in x, 0.99 in y on its own tries
    # at new starts, docs/models.md); at the first step the arm is at its home pose in every try. False (the
    # default, and files written before the field): the step's estimate
    far_block_first_frame: bool = False
    # each camera's brightness floor (version 14; in the order of ``cameras``, the mean of its averaged frame over
    # pixels and channels, 0..1): a frame darker than its camera's floor is scaled up to it (by at most
    # MAX_BRIGHTNESS_GAIN) before the encoders read it, and a frame at or above it is read as it is. Rendered
    # light is scaled alike in every channel and the sRGB curve is a power, so a scene lit dimmer is the same frame
    # scaled down: D01's (dim light) are 0.43 of the nominal scene's (third person and wrist alike), and v15,
    # trained on every setup's demonstrations with brightness scaled by up to 10%, inserted none of its test
    # tries in D01 or G02 (dim light too). The floors sit at the nominal scenes' darkest frames, so their frames
    # are not changed. () (the default, and files written before the field): frames as they are
    brightness_floor: tuple[float, ...] = ()
    action_dim: int = 7
    # bc-state's network (engines.bc_mlp.BCConfig) as the policy head
    policy: BCConfig = field(default_factory=BCConfig)

    @property
    def low_dim(self) -> int:
        """The graph's ``low_dim`` input: joint positions, instruction one-hot, then the action history."""
        return self.proprio_dim + len(self.instructions) + HISTORY_DIM

    @property
    def chunk(self) -> int:
        return 1  # one action a query (the output keeps the runners' chunk axis)

    def image_side(self, name: str) -> int:
        """Camera ``name``'s side once the graph has averaged it."""
        return self.image_sides[[n for n, _ in self.cameras].index(name)]

    def pool(self, name: str) -> int:
        """The averaging factor of camera ``name`` (its rendered side over its image side)."""
        rendered, side = dict(self.cameras)[name], self.image_side(name)
        if len(self.image_sides) != len(self.cameras) or side < 4 or rendered % side:
            raise ValueError(f"a {name} camera of side {rendered} does not average down to {side} pixels")
        return rendered // side

    def __post_init__(self) -> None:
        unknown = sorted(set(self.first_frame_cameras) - {n for n, _ in self.cameras})
        if unknown:
            raise ValueError(f"first_frame_cameras names {', '.join(unknown)}, not one of the network's cameras "
                             f"({', '.join(n for n, _ in self.cameras)})")
        if self.locator_hidden and LOCATOR_CAMERA not in self.first_frame_cameras:
            raise ValueError(f"the locator reads the {LOCATOR_CAMERA} camera's first frame; add it to "
                             f"first_frame_cameras or set locator_hidden to ()")
        if self.brightness_floor and (len(self.brightness_floor) != len(self.cameras)
                                      or not all(0 < f <= 1 for f in self.brightness_floor)):
            raise ValueError(f"brightness_floor takes one number in (0, 1] for each camera "
                             f"({', '.join(n for n, _ in self.cameras)}); got {self.brightness_floor}")
        if self.far_block_first_frame and self.estimator_reads_gripper:
            raise ValueError("the first step's estimate reads the frames and the instruction alone: "
                             "far_block_first_frame needs estimator_reads_gripper False")

    @property
    def locator_cameras(self) -> tuple[str, ...]:
        """The cameras whose first frame the locator reads: every camera's with ``far_block_first_frame``
        (version 13), else the third person's (version 12)."""
        return tuple(n for n, _ in self.cameras) if self.far_block_first_frame else (LOCATOR_CAMERA,)

    @property
    def first_inputs(self) -> tuple[str, ...]:
        """The cameras that enter a second time, as their frame at the try's first step (``<camera>_first``)."""
        if not self.far_block_first_frame:
            return ()
        return tuple(n for n, _ in self.cameras if n not in self.first_frame_cameras)

    @property
    def input_names(self) -> tuple[str, ...]:
        """The graph's inputs, in order: INPUT_NAMES, then ``<camera>_first`` for each of ``first_inputs``."""
        return INPUT_NAMES + tuple(n + FIRST_SUFFIX for n in self.first_inputs)


def instruction_one_hot(instruction: str, config: BCCameraNetConfig) -> np.ndarray:
    """The instruction as a one-hot over ``config.instructions``; one-line ValueError for another."""
    try:
        i = config.instructions.index(instruction)
    except ValueError:
        raise ValueError(f"bc-camera knows the instructions {list(config.instructions)}, not {instruction!r}") from None
    out = np.zeros(len(config.instructions), np.float32)
    out[i] = 1.0
    return out


def pool_frames(frames: np.ndarray, factor: int) -> np.ndarray:
    """uint8 (N, H, W, 3) frames averaged by ``factor`` x ``factor`` blocks to uint8 (N, 3, H/f, W/f): what the
    graph computes from a rendered frame (to rounding), for the training set's frame cache."""
    n, h, w, c = frames.shape
    x = frames.reshape(n, h // factor, factor, w // factor, factor, c).mean(axis=(2, 4), dtype=np.float32)
    return np.clip(np.rint(x), 0, 255).astype(np.uint8).transpose(0, 3, 1, 2)


def camera_encoder(config: BCCameraNetConfig, side: int, name: str = ""):
    """One camera's encoder: a float (N, 3, side, side) frame in [0, 1], centred and scaled -> its keypoints (2K) and,
    with ``grid_channels``, its flattened coarse grid (``encoder_features`` numbers). ``name``: a camera of
    ``config`` whose frames must average down to ``side`` (checked in one line); empty for another view."""
    import torch
    from torch import nn

    class SpatialSoftmax(nn.Module):
        """(N, K, H, W) maps -> (N, 2K): each map's softmax-weighted x and y in [-1, 1]."""

        def __init__(self, side: int):
            super().__init__()
            grid = torch.linspace(-1.0, 1.0, side)
            self.register_buffer("xs", grid.repeat(side), persistent=False)
            self.register_buffer("ys", grid.repeat_interleave(side), persistent=False)

        def forward(self, maps):
            p = torch.softmax(maps.flatten(2), dim=-1)
            return torch.cat([p @ self.xs, p @ self.ys], dim=-1)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            c1, c2, c3 = config.channels
            if name:
                config.pool(name)  # a side the frames do not average down to is one line here
            self.trunk = nn.Sequential(
                nn.Conv2d(3, c1, 5, stride=2, padding=2), nn.GELU(),
                nn.Conv2d(c1, c2, 3, stride=2, padding=1), nn.GELU(),
                nn.Conv2d(c2, c3, 3, padding=1), nn.GELU())
            self.keypoints = nn.Sequential(nn.Conv2d(c3, config.keypoints, 1), SpatialSoftmax(side // 4))
            self.grid = (nn.Sequential(nn.Conv2d(c3, config.grid_channels, 3, stride=2, padding=1), nn.GELU(),
                                       nn.Flatten()) if config.grid_channels else None)

        def forward(self, x):
            maps = self.trunk(x)
            return self.keypoints(maps) if self.grid is None else torch.cat([self.keypoints(maps), self.grid(maps)], -1)

    return Encoder()


def encoder_features(config: BCCameraNetConfig, side: int) -> int:
    """How many numbers :func:`camera_encoder` gives for frames of ``side`` pixels."""
    return 2 * config.keypoints + config.grid_channels * (side // 8) ** 2


def unit(v):
    """(N, 2) -> the same directions, of length 1 (a complex number's phase)."""
    import torch

    return v / torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp_min(1e-6)


def times(a, b):
    """The complex product of (N, 2) (real, imaginary) rows: their angles add."""
    import torch

    return torch.stack([a[:, 0] * b[:, 0] - a[:, 1] * b[:, 1], a[:, 0] * b[:, 1] + a[:, 1] * b[:, 0]], -1)


def conjugate(a):
    return a * a.new_tensor([1.0, -1.0])


def power(a, n: int):
    out = a
    for _ in range(n - 1):
        out = times(out, a)
    return out


def angle(a):
    """(N, 2) unit rows -> their angles (N, 1) in (-pi, pi]: atan2 by its half-angle form (ONNX has Atan, not
    Atan2), as engines.panda_kinematics."""
    import torch

    return 2 * torch.atan(a[:, 1:2] / (1 + a[:, 0:1]).clamp_min(1e-6))


def triangle_turn_truth(rot, scene):
    """cos, sin of 3 x (closing angle - block yaw), the triangle head's target, from the TCP's rotation (N, 3, 3)
    and true scene features: the closing angle's turn less the board's plus the block's yaw to the hole (3 x each,
    features 9-10 being 3 x (hole yaw - block yaw) for a triangle)."""
    import torch

    closing, board = unit(rot[:, 0:2, 1]), unit(scene[:, HOLE_YAW])
    return times(times(power(closing, 3), conjugate(power(board, 3))), unit(scene[:, BLOCK_HOLE_YAW]))


def build(config: BCCameraNetConfig):
    import torch
    from torch import nn

    if config.policy.state_dim != SCENE_DIM + HISTORY_DIM or config.policy.action_dim != config.action_dim:
        raise ValueError(f"the policy head maps {config.policy.state_dim} -> {config.policy.action_dim} numbers; "
                         f"bc-camera feeds it {SCENE_DIM} scene + {HISTORY_DIM} history numbers for "
                         f"{config.action_dim}-number actions")

    def features_of(name: str) -> int:
        return encoder_features(config, config.image_side(name))

    seen = config.proprio_dim + len(config.instructions)  # the estimator's part of low_dim (no action history)
    floors = dict(zip((n for n, _ in config.cameras), config.brightness_floor))

    def brightened(x, floor: float):
        # (N, 3, side, side) in [0, 1]: scaled up to the floor where its mean is below it, else as it is
        gain = torch.clamp(floor / torch.clamp(x.mean(dim=(1, 2, 3), keepdim=True), min=1e-6), min=1.0,
                           max=MAX_BRIGHTNESS_GAIN)
        return torch.clamp(x * gain, max=1.0)
    arm = get_arm("panda")
    free, gripper = list(FREE_FEATURES), list(GRIPPER_FEATURES)

    class BCCameraNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoders = nn.ModuleDict({name: camera_encoder(config, config.image_side(name), name)
                                           for name, _ in config.cameras})
            dims = (sum(features_of(name) for name, _ in config.cameras) + len(config.instructions)
                    + (len(GRIPPER_FEATURES) if config.estimator_reads_gripper else 0), *config.hidden)
            self.estimator = mlp(dims, len(FREE_FEATURES))
            # the knob's angle to the fingers from the wrist camera alone: it turns with the fingers, so its frames
            # show that angle as it is; given the arm's pose, version 4's estimator read the closing angle and
            # put the block aligned with it where the demonstrations always are (docs/models.md)
            self.knob = mlp((features_of("wrist"), KNOB_HIDDEN), 2)
            # x, y: the block's offset across from the gripper along the hand's axes; z: the grasp's depth on the
            # knob when held
            self.offset = mlp((features_of("wrist"), KNOB_HIDDEN), 3)
            self.hole_offset = mlp((features_of("wrist"), KNOB_HIDDEN), 2)
            # cos, sin of 3 x (closing angle - block yaw): a held triangle's turn in the fingers, which the knob's
            # quarter-turn symmetry does not say
            self.triangle_turn = mlp((features_of("wrist"), KNOB_HIDDEN), 2)
            if config.locator_hidden:
                dims = (sum(features_of(name) for name in config.locator_cameras) + len(config.instructions),
                        *config.locator_hidden)
                self.locator = mlp(dims, 2)
                # its input's normalisation (the features and the one-hot), set by the fit
                self.register_buffer("locator_mean", torch.zeros(dims[0]))
                self.register_buffer("locator_std", torch.ones(dims[0]))
            self.register_buffer("low_mean", torch.zeros(seen))
            self.register_buffer("low_std", torch.ones(seen))
            self.register_buffer("scene_mean", torch.zeros(SCENE_DIM))
            self.register_buffer("scene_std", torch.ones(SCENE_DIM))
            self.policy = build_policy_head(config.policy)
            self.policy.requires_grad_(False)  # bc-state's trained network, frozen
            self.gripper = gripper_module((*arm.base_xy, 0.0))

        def locate(self, features, instruction):
            """The locator's block x, y (N, 2), m, from its cameras' first-frame encoder features (concatenated in
            ``config.locator_cameras``' order) and the instruction's
            one-hot (the raw ``low_dim`` columns)."""
            x = (torch.cat([features, instruction], -1) - self.locator_mean) / self.locator_std
            return self.locator(x) * self.scene_std[BLOCK_XY] + self.scene_mean[BLOCK_XY]

        def estimate(self, images: dict, low_dim, with_offset: bool = False):
            """The scene features (N, 32) from ``images`` (camera -> float (N, 3, side, side) in [0, 1], averaged
            down to its image side) and the estimator's part of ``low_dim``: the gripper's features from the
            joints (forward kinematics), the block's and hole's from the frames, the relations between them
            computed from those (so an estimate is one consistent scene). Near the block its position across is
            the gripper's plus the wrist head's offset; held, the block is the gripper's position less the knob's
            top plus the grasp's depth, and near a held block the hole's position across is the block's plus the
            hole head's offset. ``with_offset``: (scene, the wrist heads' (N, 7): the block's offset across from
            the gripper, the grasp depth, the hole's offset across from the block (m; across in the world's
            axes), and the triangle's turn in the fingers (cos, sin)), for their training losses. Where the block
            away from the gripper is read at the try's first step (``far_block_first_frame``), ``images`` also holds
            ``<camera>_first`` for each of ``config.first_inputs``: that camera's frame at that step."""
            proprio = low_dim[:, :config.proprio_dim]
            tcp, rot = self.gripper.tcp_pose(proprio[:, :ARM_JOINTS])
            grip = self.gripper.features(tcp, rot, arm.gripper_opening(proprio[:, ARM_JOINTS:].mean(-1)))

            def to_world(across):
                # (N, 2) along the hand's x and y axes -> the world's x, y: the wrist camera turns with the hand
                return rot[:, 0:2, 0] * across[:, 0:1] + rot[:, 0:2, 1] * across[:, 1:2]
            mean, std = self.scene_mean, self.scene_std
            if config.brightness_floor:
                images = {key: brightened(x, floors[key.removesuffix(FIRST_SUFFIX)]) for key, x in images.items()}
            feats = {name: self.encoders[name]((images[name] - 0.5) * 4.0) for name, _ in config.cameras}
            instruction = (low_dim[:, config.proprio_dim:seen] - self.low_mean[config.proprio_dim:]) \
                / self.low_std[config.proprio_dim:]
            seen_grip = [(grip - mean[gripper]) / std[gripper]] if config.estimator_reads_gripper else []
            out = self.estimator(torch.cat([*feats.values(), instruction, *seen_grip], -1))
            e = out * std[free] + mean[free]
            at_first = feats  # (version 13) every camera's features at the try's first step
            if config.far_block_first_frame:
                missing = [n + FIRST_SUFFIX for n in config.first_inputs if n + FIRST_SUFFIX not in images]
                if missing:
                    raise ValueError(f"the block away from the gripper is read at the try's first step: the "
                                     f"estimate needs {', '.join(missing)}")
                at_first = {name: self.encoders[name]((images[name + FIRST_SUFFIX] - 0.5) * 4.0)
                            if name in config.first_inputs else feats[name] for name, _ in config.cameras}
                if not config.locator_hidden:
                    e_first = self.estimator(torch.cat([*at_first.values(), instruction], -1)) * std[free] \
                        + mean[free]
            knob = self.knob(feats["wrist"]) * std[KNOB] + mean[KNOB]
            col = {i: e[:, j:j + 1] for j, i in enumerate(FREE_FEATURES)}
            col.update({i: grip[:, j:j + 1] for j, i in enumerate(GRIPPER_FEATURES)})
            offset = self.offset(feats["wrist"]) * OFFSET_SCALE
            offset = torch.cat([to_world(offset[:, 0:2]), offset[:, 2:3]], -1)
            # the block's x, y away from the gripper: the locator's (version 12; reading every camera's first frame
            # from version 13), the estimator's at the try's first step (version 13), or the step's estimator's
            if config.locator_hidden:
                far = self.locate(torch.cat([at_first[name] for name in config.locator_cameras], -1),
                                  low_dim[:, config.proprio_dim:seen])
            else:
                far = e_first[:, 0:2] if config.far_block_first_frame else e[:, 0:2]
            near = torch.sigmoid((OFFSET_NEAR - torch.linalg.vector_norm(far - tcp[:, 0:2], dim=-1, keepdim=True))
                                 / OFFSET_SOFTNESS)
            under = tcp[:, 0:2] + offset[:, 0:2]  # the block's x, y as the wrist camera places it
            across = near * under + (1 - near) * far
            held = torch.sigmoid((col[GRASPED] - 0.5) / HELD_SOFTNESS)
            in_hand = torch.cat([under, tcp[:, 2:3] - KNOB_TOP_ABOVE_CENTRE + offset[:, 2:3]], -1)
            block = held * in_hand + (1 - held) * torch.cat([across, col[8]], -1)
            col[6], col[7], col[8] = block[:, 0:1], block[:, 1:2], block[:, 2:3]
            hole_offset = to_world(self.hole_offset(feats["wrist"]) * OFFSET_SCALE)
            hole = torch.cat([col[13], col[14]], -1)
            hole_near = held * torch.sigmoid((OFFSET_NEAR - torch.linalg.vector_norm(hole - block[:, 0:2], dim=-1,
                                                                                    keepdim=True)) / OFFSET_SOFTNESS)
            hole = hole_near * (block[:, 0:2] + hole_offset) + (1 - hole_near) * hole
            col[13], col[14] = hole[:, 0:1], hole[:, 1:2]
            col[11], col[12] = knob[:, 0:1], knob[:, 1:2]
            # held: the block's yaw to the hole composed from the board's yaw, the closing angle and the block's
            # turn in the fingers (n x each, as complex numbers); the circle's is (1, 0) and 0
            board, closing = unit(torch.cat([col[27], col[28]], -1)), unit(rot[:, 0:2, 1])
            composed = col[24] * torch.cat([torch.ones_like(col[24]), torch.zeros_like(col[24])], -1)
            yaw_err = torch.zeros_like(col[24])
            triangle_turn = unit(self.triangle_turn(feats["wrist"]))
            for n, shape, turn in ((4, col[25], unit(knob)), (3, col[26], triangle_turn)):
                cs = times(times(power(board, n), conjugate(power(closing, n))), turn)
                composed = composed + shape * cs
                yaw_err = yaw_err + shape * angle(cs) / n
            for i, value in ((9, composed[:, 0:1]), (10, composed[:, 1:2]), (YAW_ERR, yaw_err)):
                col[i] = held * value + (1 - held) * col[i]
            for j in range(3):
                col[16 + j] = block[:, j:j + 1] - tcp[:, j:j + 1]
            col[19], col[20] = col[13] - col[6], col[14] - col[7]
            col[21] = col[15] - (col[8] - BLOCK_HEIGHT / 2)
            scene = torch.cat([col[i] for i in range(SCENE_DIM)], -1)
            return (scene, torch.cat([offset, hole_offset, triangle_turn], -1)) if with_offset else scene

        def act(self, scene, low_dim):
            """The policy head's actions (N, 7) on scene features and the action history (``low_dim``'s last 8)."""
            return self.policy(torch.cat([scene, low_dim[:, seen:]], dim=-1))

        input_names = config.input_names

        def forward(self, third_person, wrist, low_dim, *first_frames):
            """Rendered uint8 frames (N, H, W, 3) of each camera, the low-dimensional input, then the first frames
            of ``config.first_inputs`` -> actions (N, 1, 7)."""
            def pooled(name, frame):
                x = frame.float().permute(0, 3, 1, 2)  # cast first: TensorRT's Transpose on uint8 is not a given
                f = config.pool(name)
                return (torch.nn.functional.avg_pool2d(x, f) if f > 1 else x) / 255.0
            images = {name: pooled(name, frame) for (name, _), frame in zip(config.cameras, (third_person, wrist))}
            images.update({name + FIRST_SUFFIX: pooled(name, frame)
                           for name, frame in zip(config.first_inputs, first_frames)})
            return self.act(self.estimate(images, low_dim), low_dim)[:, None, :]

    return BCCameraNet()


def save(model, config: BCCameraNetConfig, path: str | Path, extra: dict | None = None) -> None:
    write_checkpoint(model, FORMAT, asdict(config), path, extra)


def config_from_json(text: str) -> BCCameraNetConfig:
    d = json.loads(text)
    p = d["policy"]
    policy = BCConfig(**{**p, "hidden": tuple(p["hidden"]), "fine": tuple(tuple(f) for f in p["fine"])})
    return BCCameraNetConfig(**{**d, "cameras": tuple((str(n), int(s)) for n, s in d["cameras"]),
                             "image_sides": tuple(d["image_sides"]),
                             "instructions": tuple(d["instructions"]), "channels": tuple(d["channels"]),
                             "hidden": tuple(d["hidden"]), "policy": policy,
                             # files written before the field (versions 10 and older) read every step's frames
                             "first_frame_cameras": tuple(d.get("first_frame_cameras", ())),
                             # and before version 12 the estimator placed the block before the grasp
                             "locator_hidden": tuple(d.get("locator_hidden", ())),
                             # and before version 13 the step's estimate
                             "far_block_first_frame": bool(d.get("far_block_first_frame", False)),
                             # and before version 14 frames as they are
                             "brightness_floor": tuple(float(f) for f in d.get("brightness_floor", ()))})


def load(path: str | Path = DEFAULT_WEIGHTS):
    """(model in eval mode, config, metadata); one-line BadCheckpointError on any mismatch."""
    path = Path(path)
    tensors, meta = read_checkpoint(path, "bc-camera", FORMAT, "python -m eval.training.train_bc_camera")
    try:
        config = config_from_json(meta["config"])
    except KeyError:
        raise BadCheckpointError(f"{path} has no 'config' metadata; save checkpoints with "
                                 f"eval.training.train_bc_camera") from None
    except (TypeError, ValueError, KeyError) as e:
        raise BadCheckpointError(f"{path} has a config this code cannot read ({e})") from None
    if config.action_dim != BCCameraNetConfig.action_dim:
        raise BadCheckpointError(f"{path} predicts {config.action_dim}-number actions; the scene takes "
                                 f"{BCCameraNetConfig.action_dim}")
    try:
        model = build(config)
    except ValueError as e:
        raise BadCheckpointError(f"{path}: {e}") from None
    model = load_checked(model, tensors, path, positive=("low_std", "scene_std", "policy.obs_std")
                         + (("locator_std",) if config.locator_hidden else ()))
    return model, config, meta


def dummy_inputs(config: BCCameraNetConfig, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds of the graph's shapes and dtypes (random frames, zero low-dimensional input)."""
    rng = np.random.default_rng(seed)
    feeds = {name: rng.integers(0, 256, (batch, side, side, 3), dtype=np.uint8) for name, side in config.cameras}
    for name in config.first_inputs:
        side = dict(config.cameras)[name]
        feeds[name + FIRST_SUFFIX] = rng.integers(0, 256, (batch, side, side, 3), dtype=np.uint8)
    feeds["low_dim"] = np.zeros((batch, config.low_dim), np.float32)
    return feeds


def export_onnx(model, config: BCCameraNetConfig, path: str | Path, source: str = "") -> Path:
    """ONNX with a dynamic batch: inputs ``third_person`` (N, 256, 256, 3) and ``wrist`` (N, 128, 128, 3) uint8,
    ``low_dim`` (N, LOW_DIM) float32, then ``<camera>_first`` (uint8) for each of ``config.first_inputs``; output
    ``actions`` (N, 1, 7)."""
    import torch

    from engines.onnx_utils import check_onnx_file, set_metadata

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    feeds = dummy_inputs(config)
    args = tuple(torch.as_tensor(feeds[name]) for name in config.input_names)
    dynamic = {name: {0: "batch"} for name in (*config.input_names, "actions")}
    # the TorchScript exporter, as bc-state's: the dynamo one needs onnxscript
    torch.onnx.export(model, args, str(path), input_names=list(config.input_names), output_names=["actions"],
                      dynamic_axes=dynamic, opset_version=17, dynamo=False)
    set_metadata(path, exporter=f"torch.onnx {torch.__version__}", opset="17", model="bc-camera", source=source)
    check_onnx_file(path)
    return path


def numpy_forward(model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(*(torch.as_tensor(feeds[name]) for name in model.input_names)).numpy()


def torch_outputs(model, feeds) -> dict[str, np.ndarray]:
    """The graph's outputs computed by the torch network (the ``torch`` backend)."""
    return {"actions": numpy_forward(model, feeds)}
