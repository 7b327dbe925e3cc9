"""Octo 1.5 (frozen track) as a closed-loop policy: the released model, zero-shot, on the scene's cameras.

What the adapter does, step by step, as upstream's evaluation wrappers do
(``octo/utils/gym_wrappers.py``):

- **Images.** The third-person camera is the primary image, the wrist camera
  the wrist image. Each is resized to the size the model takes (256x256 and
  128x128, the cameras' own sizes, so the Lanczos resize is the identity; other
  sizes use Pillow's Lanczos). The primary image (the one augmented with random
  resized crops in training) is then cropped to the average crop, the centre
  sqrt(0.9) of each side, and resized back bilinearly (``tf.image.crop_and_resize``
  semantics), rounded to uint8. A missing camera (``None`` or absent) is
  masked out of attention, which gives the readout upstream's model gives when
  the image key is left out.
- **History.** A window of 2 observations with the timestep pad mask: the first
  query of a try sees the first observation twice, the copy masked.
- **Chunks.** The model predicts 4 actions; ``exec_horizon`` of them (default
  4, the whole chunk) are executed before the next query (receding horizon).
  Temporal ensembling (``temporal_ensembling=True``, off by default as in the
  published runs) queries every step and averages the predictions made for the
  current step by the last 4 chunks (uniform weights, upstream's exp_weight 0).
- **Unnormalisation.** With the ``bridge_dataset`` statistics (mean/std; the mask
  leaves the gripper as output): Bridge's actions are delta end-effector
  position (m) and roll-pitch-yaw (rad) in the robot base frame, with an
  absolute gripper command 0..1 where 1 = open (upstream binarises Bridge's
  gripper to 1 = open, 0 = closed; Fractal's is 1 = open too).
- **Conversion to the scene's controller** (:func:`octo_to_scene`): the scene
  takes normalised actions: ``action[:3] * 0.1 m`` is the end-effector
  translation in the robot-base frame (world-aligned, x forward, y left, z up,
  as Bridge's WidowX base frame), ``action[3:6] * 0.1 rad`` are angles (a, b, c)
  composed as Rx(a) Ry(b) Rz(c) (ManiSkill's "XYZ" Euler convention, after the
  scene's sign fix) and applied about world-aligned axes at the end effector,
  norm clipped to 1; ``action[6]`` is +1 open, -1 close. Octo's rotation delta
  is read as extrinsic roll-pitch-yaw (R = Rz(yaw) Ry(pitch) Rx(roll), the
  convention of SimplerEnv's Octo/Bridge adapter) and re-expressed in the
  scene's convention exactly; translation and angles are divided by 0.1 and
  clipped; the gripper is +1 when Octo's command is above 0.5. One action is
  applied per 50 ms control step (Bridge was recorded at 5 Hz: the same
  displacement per step, four times as fast).
- Proprioception is not used (Octo 1.5 has no proprio tokenizer).
- **Goal image** (optional; default: language only, zero goal images as
  upstream): ``goal`` gives the primary camera a goal image, stacked with
  every observation frame (upstream's ``task_stack_keys``) together with the
  instruction (upstream's ``create_tasks(goals=..., texts=...)``); it is
  preprocessed as the primary frames are (resize, average crop), and the wrist
  camera's goal stays zeros. Either a fixed image (:func:`read_goal_image`,
  ``--goal-image FILE``) or :class:`SolvedGoal` (``--goal-image solved``):
  each try's own start with its target block(s) seated in their holes,
  rendered by the third-person camera at reset. The try's record says which
  (``goal_image``: "file" or "solved", ``goal_sha256``: of the file, or of the
  rendered pixels).

Backends: the policy receives its runner from the one backend factory
(:func:`engines.backends.model_runner`, assembled by :class:`eval.request.OctoConfig`):
``jax`` runs the jitted JAX model (on the CPU, or on the GPU where JAX has CUDA); ``ort``
runs the exported ONNX graphs (backbone, unrolled sampler; see :mod:`engines.octo.export`)
through ONNX Runtime on the CPU; ``trt`` runs the TensorRT engines ``make engines`` built from them
(fp16 unless asked: ``engines.backends.MODEL_RUNTIMES``) on the GPU. On ``ort`` and ``trt`` a run's model
is the engines folder's (:class:`engines.octo.deployed.DeployedOcto`: no JAX), on ``jax`` the loaded
checkpoint (:class:`engines.octo.octo_model.OctoModel`). Either makes the try's key and draws every
query's noise as JAX does (``engine.new_key``, ``split_key``, ``draw_noise``: JAX itself, or
:mod:`engines.octo.prng`, its threefry in NumPy: the same keys, normals to a few ulps), so equal seeds
give the same actions on every backend (to float rounding). The instruction embedding is T5's, run in JAX
once per instruction by the loaded model, or computed by ``make engines`` for every instruction of every
task list and looked up.

Frames on the GPU: camera frames that arrive as torch tensors (GPU scenes render into CUDA
tensors) are preprocessed with torch on their device (the same crop and rounding, byte for
byte; Lanczos resizing is not done there, so the cameras must have the model's image sizes)
and stay there: the runner takes them by DLPack (JAX) or device pointer (TensorRT).

Batches and rendering: the policy is batchable (``encode`` / ``infer`` /
``decode``): the scenes of a rollout that query on the same step share one
model call, and a step served from the chunk makes none. It reads the cameras
only on the steps of its history window before each query
(:meth:`OctoPolicy.reads_observation`), so the rollout renders half of a try's
steps at the default horizon.

Latency: a time is recorded only for the steps that ran the model, so the
records' ``infer_ms_*`` are milliseconds per model query. The first reset
compiles the model (untimed), and a rollout of N scenes compiles its batch
sizes first (``prepare_batch``).

With ``random_weights`` the policy's ``note`` is "random weights: latency
only, success meaningless"; reports should carry it.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from engines.zero_copy import is_torch_tensor, stack_rows
from env.setups import ACTION_ROTATION_RAD, ACTION_TRANSLATION_M
from eval.policies.base import Policy

TRANSLATION_SCALE_M = ACTION_TRANSLATION_M  # the scene's controller: metres and radians per unit action
ROTATION_SCALE_RAD = ACTION_ROTATION_RAD
CAMERA_OF = {"primary": "third_person", "wrist": "wrist"}  # Octo image -> observation["images"] key
AVG_CROP_SCALE, AVG_CROP_RATIO = 0.9, 1.0  # the mean of upstream's random_resized_crop (scale 0.8..1)
AUGMENTED_KEYS = ("image_primary",)


# ------------------------------------------------------------------ action conversion
def _rx(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def _ry(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])


def _rz(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def octo_rotation(rpy) -> np.ndarray:
    """Rotation matrix of Octo's delta (roll, pitch, yaw): extrinsic x-y-z, R = Rz(yaw) Ry(pitch) Rx(roll)."""
    r, p, y = (float(v) for v in rpy)
    return _rz(y) @ _ry(p) @ _rx(r)


def scene_angles(rot: np.ndarray) -> np.ndarray:
    """(a, b, c) with Rx(a) Ry(b) Rz(c) = rot: the angles the scene's controller composes."""
    b = math.asin(max(-1.0, min(1.0, rot[0, 2])))
    a = math.atan2(-rot[1, 2], rot[2, 2])
    c = math.atan2(-rot[0, 1], rot[0, 0])
    return np.array([a, b, c])


def octo_to_scene(action) -> np.ndarray:
    """One unnormalised Octo action (dx, dy, dz [m], droll, dpitch, dyaw [rad], gripper 0..1 with 1 = open)
    to the scene's normalised action (7,) float32 in [-1, 1]."""
    a = np.asarray(action, np.float64)
    pos = np.clip(a[:3] / TRANSLATION_SCALE_M, -1.0, 1.0)
    rot = scene_angles(octo_rotation(a[3:6])) / ROTATION_SCALE_RAD
    n = float(np.linalg.norm(rot))
    if n > 1.0:
        rot = rot / n
    grip = 1.0 if a[6] > 0.5 else -1.0
    return np.concatenate([pos, rot, [grip]]).astype(np.float32)


# ------------------------------------------------------------------ image preprocessing
def lanczos_resize(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize uint8 HxWx3 to (h, w); the identity at the same size (as tf.image.resize lanczos3 is)."""
    if tuple(img.shape[:2]) == tuple(size):
        return img
    from PIL import Image

    return np.asarray(Image.fromarray(img).resize((size[1], size[0]), Image.LANCZOS))


def average_crop_box(scale: float = AVG_CROP_SCALE, ratio: float = AVG_CROP_RATIO) -> np.ndarray:
    h = np.clip(np.sqrt(np.float32(scale / ratio)), 0, 1)
    w = np.clip(np.sqrt(np.float32(scale * ratio)), 0, 1)
    y0, x0 = (1 - h) / 2, (1 - w) / 2
    return np.array([y0, x0, y0 + h, x0 + w], np.float32)


def _crop_grid(hgt: int, wid: int, box: np.ndarray, size: tuple[int, int]):
    """The source rows and columns and blend weights of ``tf.image.crop_and_resize``: (top, left, bottom, right,
    y weights (h, 1, 1), x weights (1, w, 1)). float32 - int64 is float64 in numpy, so the weights (and the
    blend) are float64, as they have always been here."""
    ch, cw = size
    y1, x1, y2, x2 = (np.float32(v) for v in box)

    def coords(c0, c1, n_in, n_out):
        if n_out > 1:
            return c0 * (n_in - 1) + np.arange(n_out, dtype=np.float32) * ((c1 - c0) * (n_in - 1) / (n_out - 1))
        return np.full(1, 0.5 * (c0 + c1) * (n_in - 1), np.float32)

    ys, xs = coords(y1, y2, hgt, ch).astype(np.float32), coords(x1, x2, wid, cw).astype(np.float32)
    ys, xs = np.clip(ys, 0, hgt - 1), np.clip(xs, 0, wid - 1)  # the average crop is inside the image
    top, left = np.floor(ys).astype(int), np.floor(xs).astype(int)
    bottom, right = np.ceil(ys).astype(int), np.ceil(xs).astype(int)
    return top, left, bottom, right, (ys - top)[:, None, None], (xs - left)[None, :, None]


def crop_and_resize(img, box: np.ndarray, size: tuple[int, int]):
    """``tf.image.crop_and_resize`` (bilinear, normalised box y1, x1, y2, x2) of one HxWxC image. A torch
    tensor is resized on its own device with the same operations on the same dtypes in the same order (eager
    kernels, nothing fused), so the same bits as a numpy image."""
    grid = _crop_grid(int(img.shape[0]), int(img.shape[1]), box, size)
    if is_torch_tensor(img):
        import torch

        x = img.to(torch.float32)
        top, left, bottom, right, yl, xl = (torch.from_numpy(np.ascontiguousarray(a)).to(x.device) for a in grid)
    else:
        x = np.asarray(img, np.float32)
        top, left, bottom, right, yl, xl = grid
    tl, tr = x[top][:, left], x[top][:, right]
    bl, br = x[bottom][:, left], x[bottom][:, right]
    t = tl + (tr - tl) * xl
    b = bl + (br - bl) * xl
    return t + (b - t) * yl


def preprocess_torch(img, size: tuple[int, int], average_crop: bool):
    """:func:`preprocess` of a torch tensor, on its device (the GPU path): uint8 out, byte-identical."""
    import torch

    from engines.octo.errors import OctoError

    if img.dtype != torch.uint8:
        img = torch.clamp(torch.round(img), 0, 255).to(torch.uint8)
    img = img[..., :3]
    if tuple(img.shape[:2]) != tuple(size):
        raise OctoError(f"a camera frame of {tuple(img.shape[:2])} on the device needs resizing to {tuple(size)}, "
                        "which only the host path does: give the camera the model's image size")
    if average_crop:
        img = torch.clamp(torch.round(crop_and_resize(img, average_crop_box(), size)), 0, 255).to(torch.uint8)
    return img


def preprocess(img: np.ndarray, size: tuple[int, int], average_crop: bool) -> np.ndarray:
    """Upstream ResizeImageWrapper: Lanczos resize, then (augmented images only) the average crop, uint8."""
    img = np.asarray(img)
    if img.dtype != np.uint8:
        img = np.clip(np.round(img), 0, 255).astype(np.uint8)
    img = lanczos_resize(img[..., :3], size)
    if average_crop:
        img = np.clip(np.round(crop_and_resize(img, average_crop_box(), size)), 0, 255).astype(np.uint8)
    return img


# ------------------------------------------------------------------ goal images
GOAL_CAMERA = "primary"  # the Octo camera a goal image is given for (the third-person view)


class GoalImageError(ValueError):
    """A goal image that cannot be used (one line)."""


def read_goal_image(path: str | Path) -> tuple[np.ndarray, str]:
    """(uint8 HxWx3 RGB, sha256 of the file) of a PNG/JPEG goal image; GoalImageError in one line."""
    from PIL import Image, UnidentifiedImageError

    p = Path(path).expanduser()
    try:
        data = p.read_bytes()
    except OSError as e:
        raise GoalImageError(f"--goal-image {path}: cannot read it ({e.strerror or e})") from None
    try:
        import io

        with Image.open(io.BytesIO(data)) as im:
            img = np.asarray(im.convert("RGB"), np.uint8)
    except UnidentifiedImageError:
        raise GoalImageError(f"--goal-image {path}: not an image Pillow can read (PNG, JPEG)") from None
    except (OSError, ValueError) as e:  # a truncated or broken file
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise GoalImageError(f"--goal-image {path}: a broken image ({why})") from None
    if img.ndim != 3 or min(img.shape[:2]) < 1:
        raise GoalImageError(f"--goal-image {path}: an image of shape {img.shape}")
    return img, hashlib.sha256(data).hexdigest()


def solved_start(start):
    """The start with its target block(s) (all blocks on the full board) seated in their holes: on the table
    at the hole's centre, at the board's yaw (the hole outlines are the blocks' at yaw 0 in the board frame);
    everything else, appearance included, as in the start. Disturbances are left out (nothing is stepped)."""
    from env import geometry

    cells = geometry.cell_centres()
    c, s = math.cos(start.board_yaw), math.sin(start.board_yaw)
    blocks = []
    for b in start.blocks:
        if start.target in ("all", b.shape):
            cx, cy = (float(v) for v in cells[b.shape])
            b = replace(b, x=start.board_x + c * cx - s * cy, y=start.board_y + s * cx + c * cy, yaw=start.board_yaw)
        blocks.append(b)
    return replace(start, blocks=tuple(blocks), shove_velocity=None, nudge=None)


class SolvedGoal:
    """``--goal-image solved``: per try, its start (given by the rollout, :meth:`OctoPolicy.set_start`) with
    the target block(s) in their holes (:func:`solved_start`), rendered by the scene's third-person camera
    (uint8 HxWx3), in a scene of the setup and arm kept for the policy's life (built on the first try: about
    as long as the worker's own)."""

    label = "solved"

    def __init__(self, setup, arm: str = "panda"):
        if setup is None:
            raise GoalImageError("--goal-image solved needs a setup (eval.run, eval.orin): it renders each try's "
                                 "start with the blocks in their holes")
        self.setup = setup
        self.arm = arm
        self._env = None

    def render_start(self, start) -> np.ndarray:
        if self._env is None:
            from env import make_env

            self._env = make_env(self.setup, arm=self.arm, obs_mode="rgb")
        u = self._env.unwrapped
        render = getattr(u, "render_sensors", True)
        u.render_sensors = True
        try:
            obs, _ = self._env.reset(seed=0, options={"start": start})
        finally:
            u.render_sensors = render
        return np.asarray(obs["sensor_data"]["third_person"]["rgb"][0].cpu().numpy(), np.uint8)

    def __call__(self, start, instruction: str | None = None) -> np.ndarray:
        from env.task import INSTRUCTION, INSTRUCTION_FULL_BOARD

        if start is None:
            raise GoalImageError("--goal-image solved needs the try's start, which eval.rollout gives the policy "
                                 "(set_start) before each reset")
        said = INSTRUCTION_FULL_BOARD if start.target == "all" else INSTRUCTION.format(shape=start.target)
        if instruction is not None and instruction != said:
            raise GoalImageError(f"--goal-image solved: the start of {self.setup.id} is {said!r}, but the try "
                                 f"says {instruction!r}")
        return self.render_start(solved_start(start))

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


def resolve_goal(goal_image: str | None, setup=None, arm: str = "panda"):
    """``--goal-image``: None (language only), ``solved`` (a :class:`SolvedGoal`), or a file: (uint8 image,
    its sha256). GoalImageError in one line."""
    if not goal_image:
        return None
    if str(goal_image) == "solved":
        return SolvedGoal(setup, arm)
    return read_goal_image(goal_image)


# ------------------------------------------------------------------ the policy
class OctoPolicy(Policy):
    """Octo 1.5 zero-shot on the scene's two cameras (frozen track; JAX, ONNX Runtime or TensorRT backend)."""

    track = "frozen"
    observes = "cameras"
    batchable = True
    backend = "jax"

    def __init__(self, engine: Any, runner: Any, name: str | None = None, exec_horizon: int | None = None,
                 temporal_ensembling: bool = False, unnorm_key: str | None = None, goal: Any = None):
        """``engine``: the :class:`~engines.octo.octo_model.OctoModel` (config, T5, noise, statistics); ``runner``:
        its model on one backend (:mod:`engines.octo.runners`), from the backend factory. ``goal``: None
        (language only), a (uint8 HxWx3 image, sha256) pair, or a callable ``(seed, instruction) -> image``
        called at every reset (:class:`SolvedGoal`); the image goes to the primary camera."""
        super().__init__()
        from engines.octo.config import UNNORM_KEY

        self.engine = engine
        self.runner = runner
        self.name = name or engine.cfg.name
        self.backend = runner.name
        cfg = self.engine.cfg
        self.cfg = cfg
        horizon = cfg.action_horizon
        self.exec_horizon = int(exec_horizon) if exec_horizon is not None else horizon
        if not 1 <= self.exec_horizon <= horizon:
            raise ValueError(f"--exec-horizon must be 1..{horizon} (the predicted chunk), got {exec_horizon}")
        self.temporal_ensembling = bool(temporal_ensembling)
        self.unnorm_key = unnorm_key or UNNORM_KEY
        self.engine.statistics(self.unnorm_key)  # a missing key fails now, in one line
        self.note = self.engine.note
        self.weights_sha256 = getattr(engine, "weights_sha256", None)  # of the files loaded (None: random weights)
        self.model_queries = 0
        self._warm = False
        self._lang = None
        self._rng = None
        self._history: deque = deque(maxlen=cfg.window)
        self._num_obs = 0
        self._queue: list[np.ndarray] = []
        self._chunks: deque = deque(maxlen=horizon)
        self._warm_batches: set[int] = set()  # batch sizes compiled (JAX) or run once (graphs)
        self.last_chunk: np.ndarray | None = None  # unnormalised Octo actions of the last query (horizon, dim)
        self._goal_source: Callable[..., np.ndarray] | None = None  # (start, instruction) -> uint8 HxWx3
        self._start = None  # this try's start (set_start), for a goal source
        self._goal: dict[str, np.ndarray] | None = None  # {camera: (1, H, W, 3)} preprocessed, this try's
        self._goal_fields: dict[str, str] = {}
        if goal is not None:
            from engines.octo.arrays import goal_cameras

            if GOAL_CAMERA not in goal_cameras(cfg):
                raise GoalImageError(f"{self.name}'s {GOAL_CAMERA} camera takes no goal image")
            if callable(goal):
                self._goal_source = goal
                self._goal_fields = {"goal_image": getattr(goal, "label", "callable")}
            else:
                img, sha = goal
                self._set_goal(img)
                self._goal_fields = {"goal_image": "file", "goal_sha256": str(sha)}

    # ------------------------------------------------------------ Policy interface
    def set_start(self, start) -> None:
        self._start = start

    def reset(self, instruction: str, seed: int | None = None) -> None:
        if not self._warm:
            self._warmup()
            self._warm = True
        # the try's own read-only copy, fed as this same object on every query: TensorRT copies it to the device
        # once per try (the engines folder's embeddings are writable arrays; a view of one would be copied each time)
        self._lang = np.array(self.engine.embed(instruction)[None], np.float32, order="C")
        self._lang.setflags(write=False)
        if self._goal_source is not None:  # this try's own goal, from its start
            raw = np.ascontiguousarray(self._goal_source(self._start, instruction))
            self._set_goal(raw)
            self._goal_fields["goal_sha256"] = hashlib.sha256(raw.tobytes()).hexdigest()
        self._rng = self.engine.new_key(int(seed or 0))  # the try's key: jax.random.PRNGKey(seed), JAX or not
        self._history.clear()
        self._num_obs = 0
        self._queue = []
        self._chunks.clear()

    def reads_observation(self, step: int) -> bool:
        """The frames of the history window of every query step: with a window of 2 and chunks of 4, steps
        3, 4, 7, 8, ... (and 0), half of a try's steps; every step with temporal ensembling."""
        return self.temporal_ensembling or (-step) % self.exec_horizon < self.cfg.window

    def encode(self, observation: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
        """Take the step's frames into the history; the model's feeds (batch of one) on a query step, else None
        (the action comes from the last chunk). A step the rollout did not render has ``images`` None."""
        if self._lang is None:
            raise RuntimeError("OctoPolicy queried before reset")
        frame = None if observation.get("images") is None else self._frame(observation)
        if self._num_obs == 0:
            if frame is None:
                raise RuntimeError("Octo's first observation of a try has no images")
            self._history.extend([frame] * self.cfg.window)
        else:
            self._history.append(frame)
        self._num_obs += 1
        if self._queue and not self.temporal_ensembling:
            return None
        images, masks = self.model_inputs()
        self._rng, key = self.engine.split_key(self._rng)  # as upstream's evaluation splits a try's key per query
        init, steps = self.engine.draw_noise(key)  # the draws predict(rng=key) makes
        feeds = {f"image_{c.name}": img for c, img in zip(self.cfg.cameras, images)}
        feeds.update({f"goal_{k}": g for k, g in (self._goal or {}).items()})
        # batch first, as every feed: (1, diffusion_steps, flat)
        return {**feeds, "masks": masks, "lang": self._lang, "init_noise": init, "step_noise": np.swapaxes(steps, 0, 1)}

    def record_fields(self) -> dict[str, Any]:
        """The goal image of the try when one was given (``goal_image``: "file" or "solved", ``goal_sha256``);
        nothing for language only; and the host-to-device traffic per query (:meth:`Policy.record_fields`)."""
        return {**super().record_fields(), **self._goal_fields}

    def decode(self, outputs: Mapping[str, np.ndarray] | None, row: int) -> np.ndarray:
        if outputs is not None:
            chunk = self.engine.unnormalize(outputs["actions"][row], self.unnorm_key)
            self.last_chunk = chunk
            self.model_queries += 1
            if self.temporal_ensembling:
                self._chunks.append(chunk)
                n = len(self._chunks)
                preds = np.stack([c[i] for i, c in zip(range(n - 1, -1, -1), self._chunks)])
                return octo_to_scene(preds.mean(axis=0))
            self._queue = [octo_to_scene(a) for a in chunk[: self.exec_horizon]]
        return self._queue.pop(0)

    def spawn(self) -> "OctoPolicy":
        """A policy for another scene: the same engine and graphs, its own history, chunk and latencies."""
        other = copy.copy(self)
        other._history = deque(maxlen=self.cfg.window)
        other._chunks = deque(maxlen=self.cfg.action_horizon)
        other._queue, other._num_obs, other._lang, other._rng, other.last_chunk = [], 0, None, None, None
        other._goal_fields = dict(self._goal_fields)  # a solved goal is each scene's own (set at reset)
        other.latencies_ms, other.warmup_ms, other.stage_ms, other.queries, other.model_queries = [], [], {}, 0, 0
        return other

    def close(self) -> None:
        """Close the scene a solved goal is rendered in (the executors close their policies)."""
        getattr(self._goal_source, "close", lambda: None)()

    def prepare_batch(self, n: int) -> None:
        """Compile (JAX: every padded batch size up to n) or run once (ONNX Runtime, TensorRT) for n scenes."""
        for b in self.runner.batch_sizes(n):
            if b not in self._warm_batches:
                self.infer(self._blank_feeds(b))
                self._warm_batches.add(b)

    # ------------------------------------------------------------ internals
    def _frame(self, observation: Mapping[str, Any]) -> dict[str, tuple[np.ndarray, float]]:
        images = observation.get("images") or {}
        device = next((img for img in images.values() if is_torch_tensor(img)), None)  # frames on a device
        frame = {}
        for cam in self.cfg.cameras:
            img = images.get(CAMERA_OF.get(cam.name, cam.name))
            crop = cam.obs_key in AUGMENTED_KEYS  # upstream's ResizeImageWrapper crops only image_primary
            if img is None:
                blank = np.zeros((*cam.image_size, 3), np.uint8)
                frame[cam.name] = (blank if device is None else _torch_like(blank, device), 0.0)
            elif is_torch_tensor(img):
                frame[cam.name] = (preprocess_torch(img, cam.image_size, average_crop=crop), 1.0)
            else:
                frame[cam.name] = (preprocess(img, cam.image_size, average_crop=crop), 1.0)
        return frame

    def model_inputs(self) -> tuple[list[np.ndarray], np.ndarray]:
        """Images (one (1, W, H, W, 3) per camera) and masks (1, W, 1 + cameras) of the current history."""
        w = self.cfg.window
        hist = list(self._history)
        if any(f is None for f in hist):
            raise RuntimeError("a frame of Octo's history window was not rendered (reads_observation is wrong)")
        images = [stack_rows([f[c.name][0] for f in hist])[None] for c in self.cfg.cameras]
        masks = np.zeros((1, w, 1 + len(self.cfg.cameras)), np.float32)
        pad = w - min(self._num_obs, w)
        masks[0, pad:, 0] = 1.0
        for k, c in enumerate(self.cfg.cameras):
            masks[0, :, 1 + k] = [f[c.name][1] for f in hist]
        return images, masks

    def _blank_feeds(self, batch: int) -> dict[str, np.ndarray]:
        images, masks, lang = self.engine.blank_inputs(batch)
        init, steps = self.engine.draw_noise(self.engine.new_key(0), batch)
        feeds = {f"image_{c.name}": img for c, img in zip(self.cfg.cameras, images)}
        if self._goal_source is not None or self._goal is not None:  # the goal's inputs compile another function
            cam = next(c for c in self.cfg.cameras if c.name == GOAL_CAMERA)
            feeds[f"goal_{GOAL_CAMERA}"] = np.zeros((batch, *cam.image_size, 3), np.uint8)
        return {**feeds, "masks": masks, "lang": lang, "init_noise": init, "step_noise": np.swapaxes(steps, 0, 1)}

    def _set_goal(self, img) -> np.ndarray:
        """Preprocess a goal image as the primary camera's frames (resize, average crop): (H, W, 3) kept."""
        cam = next(c for c in self.cfg.cameras if c.name == GOAL_CAMERA)
        img = np.asarray(img)
        if img.ndim != 3 or img.shape[-1] < 3:
            raise GoalImageError(f"a goal image of shape {img.shape}; expected HxWx3")
        g = preprocess(img, cam.image_size, average_crop=cam.obs_key in AUGMENTED_KEYS)
        # one read-only array of its own for the try, fed as this same object on every query: a TensorRT runner
        # copies it to the device once (engines.runners.TensorRtRunner), not on every query
        goal = np.array(g[None], np.uint8, order="C")  # the crop's result is not C-ordered
        goal.setflags(write=False)
        self._goal = {GOAL_CAMERA: goal}
        return g

    def _warmup(self) -> None:
        """Compile (JAX) or load and run once (ONNX Runtime, TensorRT) the query of one scene, untimed."""
        self.prepare_batch(1)


def _torch_like(array: np.ndarray, like):
    import torch

    return torch.from_numpy(array).to(like.device)
