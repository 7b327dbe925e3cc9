"""Train bc-camera (engines.bc_camera) on recorded demonstrations, on the CPU, resumably.

    python -m eval.record --split train --setups all --tries 10 --noise 0.02 --out data/demos_cam_env_n002
    python -m eval.training.train_bc_camera --datasets data/demos_cam_env_n002 --work build/train_bc_camera \\
        --out engines/weights/bc_camera.safetensors

The demonstrations are LeRobotDataset v3.0 folders as ``python -m eval.record`` writes them (docs/datasets.md),
of the train split's starts only: a folder recorded on another task list (its ``meta/recording.json``
``tasklist_sha256`` is not this code's train list), another split, or without this code's
``observation.environment_state`` is refused in one line.

What is trained is the estimator: from both cameras, the joint positions and the instruction to the scene's
state features (``observation.environment_state``, eval.training.state_features). The policy head is bc-state's
network (``--policy``, default the shipped engines/weights/bc_state.safetensors), copied into the weights file
and frozen. Every recorded step is used, successful try or not: its label is the scene's true state. Each step
feeds the network what the policy would: the cameras of ``first_frame_cameras`` (the third person, from version
11) as the episode's first step recorded them, the others as the step did (:func:`frame_rows`).

The recipe (what ``training.json`` reports):

- loss, in what bc-state reads: the squared error of the estimate in bc-state's input normalisation, plus
  ``Recipe.fine_weight`` x that of its fine-scale copies (engines.bc_mlp: the relative vectors at 4 mm, the tilts
  and yaw error at 0.02 rad), plus ``Recipe.action_weight`` x the squared error of bc-state's action (trained
  space, signed square roots) on the estimate against its action on the true state, with the step's true action
  history (both 0 by default: with them the uncertain estimates collapsed to 0); steps before the grasp drawn
  ``Recipe.before_grasp_weight`` times as often as grasped ones, and each folder's steps as often as its
  ``Recipe.dataset_weights`` (``--dataset-weights``) says against the others';
- augmentation: each camera's brightness and contrast scaled by up to ``COLOUR`` relative, per sample, and its
  frame shifted by up to ``Recipe.shift`` pixels (edge pixels repeated; DrQ, Kostrikov et al. 2020; 0 by
  default: both cameras are fixed to the scene or the gripper, so where a thing is in the frame says where it is);
- AdamW, cosine learning rate; whole episodes held out for validation, on which the errors that matter are
  reported in their units (block to gripper and block to hole in mm, yaw error in degrees);
- the frames are decoded once into a uint8 cache (``WORK/frames``), reused by later runs on the same folders.

A **locator** (``--locator-hidden``, off by default: docs/models.md) is fitted after the epochs, on the trained
third-person encoder's features of each episode's first frame (:func:`fit_locator`); ``--locator-from W`` fits one
onto weights trained without it, running no epochs.

The **policy head** can then be tuned (``--head-epochs N``, off by default: :func:`tune_head`) on the trained
estimator's own estimates of the recorded steps, against bc-state's action on the true state; ``--head-from W``
tunes the head of trained weights W, running no epochs.

``--init-from W`` starts the epochs from trained weights W, its normalisation and policy head as W has them: a
DAgger round trained on the new round's folders alone (W's own tries at new starts), where the earlier rounds'
recordings are not kept; the validation before the first epoch (epoch 0 in the history) is W's on the held-out
episodes.

``WORK`` holds the run: ``train.json`` (what it trains: the folders' identities, the policy head's and the
recipe), ``checkpoint.pt`` (written after every epoch, atomically) and ``training.json``. Rerunning the same
command continues from the last finished epoch; another recipe or other folders into the same ``WORK`` are
refused in one line unless ``--fresh``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from engines.bc_camera import (ARM_JOINTS, DEFAULT_WEIGHTS, FIRST_SUFFIX, GRASPED, KNOB_TOP_ABOVE_CENTRE,
                               OFFSET_NEAR, OFFSET_SCALE, SHAPE_ONE_HOT, BCCameraNetConfig, build, pool_frames, save,
                               triangle_turn_truth)
from engines.bc_mlp import DEFAULT_WEIGHTS as BC_STATE_WEIGHTS
from engines.bc_mlp import HISTORY_DIM, SCENE_DIM
from env.instructions import SHAPES

COLOUR = 0.1
VAL_FRACTION = 0.05
# steps whose block is tilted more than this from upright (rad) are left out of training and validation: a block
# lying on its side, which no demonstration shows (their tilt stays under 0.25 rad) and bc-state never learnt to
# right. Four DAgger rounds hold such steps (1,136, tilted up to 2.0 rad: some 200 of the demonstrations' standard
# deviations), and those few made most of the squared loss: v13's validation loss was 40 where v12's was 1.4
TOPPLED_TILT = 0.5
OVER_HOLE_XY = 0.015  # m: a held block this near its hole across is over it (:func:`over_the_hole`)
TILT = 22  # the scene's block tilt (eval.training.state_features)
TRIANGLE = SHAPE_ONE_HOT[SHAPES.index("triangle")]  # the scene's triangle one-hot
FORMAT = "shape-assembly-bench/train-bc-camera/3"  # 3: toppled steps left out, first-frame cameras


class TrainingInputError(ValueError):
    """A dataset or work folder this command cannot train from (one line, naming it)."""


@dataclass(frozen=True)
class Recipe:
    epochs: int = 12
    batch: int = 256
    # random shift of each frame by up to this many pixels (DrQ). 0: both cameras are fixed to the scene
    # or the gripper, so where the block is in the frame is what says where it is; version 1, trained with 4
    # (6% of the frame), lost the block's position
    shift: int = 0
    lr: float = 1e-3
    weight_decay: float = 1e-4
    # of the policy head's action error beside the feature error. 0: with it and the fine-scale copies (both at 1),
    # the estimates of the yaw error and the block's lateral offset collapsed to near 0; the two were turned off
    # together (docs/models.md)
    action_weight: float = 0.0
    # how much more often a step before the grasp is drawn than a grasped one: 73% of the recorded steps carry a
    # grasped block (which the wrist camera sees large), and an estimator trained on them uniformly does not find
    # the block before the grasp (docs/models.md)
    before_grasp_weight: float = 1.0
    # how often each dataset's steps are drawn against the others', one per --datasets folder in order (empty:
    # 1 each): the camera policy's own tries (a DAgger round) hold the states where the demonstrations' ties
    # (the block under a hovering gripper) do not hold, a tenth of the steps
    dataset_weights: tuple[float, ...] = ()
    # of the loss on bc-state's fine-scale copies (tanh of the relative vectors over 4 mm, of the tilts and yaw
    # error over 0.02 rad): near a step function of the sign beyond its scale, so where the frames leave the sign
    # uncertain it pulls the estimate to 0, "the block is under the gripper, turned right" (docs/models.md)
    fine_weight: float = 0.0
    # the locator's fit (:func:`fit_locator`): batches of ``batch`` first frames, AdamW at ``lr``, and its weight
    # decay (1e-3: v14's folders hold some 700 starts; fitted to 1.2 mm there, it is 12 mm off at held-out ones)
    locator_batches: int = 3000
    locator_weight_decay: float = 1e-3
    # the policy head's tuning (:func:`tune_head`; 0 epochs: bc-state's head as it is): epochs over the standing
    # steps, batches of ``head_batch``, AdamW at ``head_lr``; the estimate's error scaled by a factor drawn from
    # 0 .. ``head_error_scale`` (the trained estimator is nearer the truth on the steps it was trained on than at
    # new starts: v14's held square's yaw 0.56 to 0.73 degrees off there, 1.64 at new starts, docs/models.md), and
    # ``head_anchor`` x the same loss on the true state, so the tuned head still acts as bc-state on a true scene
    head_epochs: int = 0
    head_batch: int = 1024
    head_lr: float = 3e-4
    head_error_scale: float = 5.0
    head_anchor: float = 0.5
    # with --init-from W: the block's x, y far from the gripper before the grasp (across, beyond OFFSET_NEAR) trained
    # toward W's own estimate of it, not the truth. Where it is comes from the first frame, which takes many starts
    # to learn (v14's folders: some 700); a round of 120 starts, trained on the truth, placed it 22 mm off at
    # held-out episodes where W was 12.5, and its tries grasped 20 blocks of 60 where W's grasped 29
    # (docs/models.md, v16)
    keep_far_block: bool = False
    seed: int = 0
    config: BCCameraNetConfig = field(default_factory=BCCameraNetConfig)


# ------------------------------------------------------------------ reading a recorded dataset
@dataclass
class Demos:
    """Every step of the folders' episodes, in order: uint8 frames per camera (N, 3, side, side), the
    low-dimensional input (N, LOW_DIM: joints, instruction, action history), the scene's true state features
    (N, 32) and each step's episode number."""

    frames: dict[str, np.ndarray]
    low_dim: np.ndarray
    scene: np.ndarray
    episode: np.ndarray
    episodes_used: int
    source: np.ndarray | None = None  # each step's dataset: its index in the folders read
    # each episode's recorded success (meta/episodes' ``success``: 1.0, 0.0, nan where the recording has none), in
    # episode order
    success: np.ndarray | None = None


def _json(path: Path, what: str) -> dict:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise TrainingInputError(f"{path} does not exist: {what}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise TrainingInputError(f"{path} is not JSON ({e}); record the dataset again with python -m eval.record") from None
    if not isinstance(doc, dict):
        raise TrainingInputError(f"{path} is not a JSON object; record the dataset again with python -m eval.record")
    return doc


def check_dataset(root: Path) -> dict:
    """The folder's meta/recording.json, once the folder is a finished v3.0 recording of this code's train list."""
    from env.tasklist import load
    from eval.lerobot import CODEBASE_VERSION

    info = _json(root / "meta" / "info.json", "not a finished dataset of python -m eval.record")
    if info.get("codebase_version") != CODEBASE_VERSION:
        raise TrainingInputError(f"{root} is a LeRobot dataset of version {info.get('codebase_version')!r}; this "
                                 f"code reads {CODEBASE_VERSION!r}")
    rec = _json(root / "meta" / "recording.json", "not a recording of python -m eval.record (no meta/recording.json)")
    if rec.get("split") != "train":
        raise TrainingInputError(f"{root} records the {rec.get('split')!r} split; bc-camera trains on the train "
                                 f"split's starts only (dev, test and confirm never feed training)")
    train = load("train")
    if rec.get("tasklist_sha256") != train.sha256:
        raise TrainingInputError(f"{root} was recorded on another task list (train sha256 "
                                 f"{str(rec.get('tasklist_sha256'))[:16]}..., this code's is {train.sha256[:16]}...); "
                                 f"record it again with python -m eval.record --split train")
    from eval.lerobot.dataset import ENVIRONMENT_STATE
    from eval.training.state_features import VERSION

    if ENVIRONMENT_STATE not in info.get("features", {}) or rec.get("environment_state") != VERSION:
        raise TrainingInputError(f"{root} has no {ENVIRONMENT_STATE} of {VERSION!r} (it has "
                                 f"{rec.get('environment_state')!r}), the estimator's labels; record it again with "
                                 f"this code's python -m eval.record --split train")
    return rec


def dataset_key(root: Path) -> str:
    """sha256 of what the frames and steps come from: info.json, the episodes and data tables, the videos' sizes."""
    h = hashlib.sha256()
    for p in sorted((root / "meta").rglob("*.parquet")) + sorted((root / "data").rglob("*.parquet")) + \
            [root / "meta" / "info.json"]:
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    for p in sorted((root / "videos").rglob("*.mp4")):
        h.update(f"{p.relative_to(root).as_posix()}\0{p.stat().st_size}".encode())
    return h.hexdigest()


def _vectors(table, name: str, width: int) -> np.ndarray:
    col = table.column(name).combine_chunks()
    return np.asarray(col.flatten().to_numpy(zero_copy_only=False), np.float32).reshape(-1, width)


def _frames_cache(root: Path, key: str, episodes: list[dict], n: int, config: BCCameraNetConfig, cache: Path,
                  show: bool) -> dict[str, np.ndarray]:
    """Every step's frame of each camera, averaged to its image side (uint8 (n, 3, side, side)), decoded from the videos
    once and kept in ``cache`` under the dataset's key."""
    from tqdm import tqdm

    from eval.lerobot.dataset import video_key
    from eval.video import video_frames

    out = {}
    for camera, side in config.cameras:
        image = config.image_side(camera)
        path = cache / f"{key[:24]}_{camera}_{image}.npy"
        if path.is_file():
            arr = np.load(path, mmap_mode="r")
            if arr.shape == (n, 3, image, image):
                out[camera] = arr
                continue
        vkey = video_key(camera)
        arr = np.empty((n, 3, image, image), np.uint8)
        by_file: dict[tuple[int, int], list[dict]] = {}
        for e in episodes:
            by_file.setdefault((e[f"videos/{vkey}/chunk_index"], e[f"videos/{vkey}/file_index"]), []).append(e)
        fps = json.loads((root / "meta" / "info.json").read_text())["fps"]
        bar = tqdm(total=n, desc=f"decoding {camera}", unit="frame", disable=not show)
        for (chunk, file), eps in sorted(by_file.items()):
            video = root / "videos" / vkey / f"chunk-{chunk:03d}" / f"file-{file:03d}.mp4"
            starts = {int(round(e[f"videos/{vkey}/from_timestamp"] * fps)): e for e in eps}
            pending: list[np.ndarray] = []
            current = None
            for j, frame in enumerate(video_frames(video)):
                if frame.shape[:2] != (side, side):
                    raise TrainingInputError(f"{video} has {frame.shape[1]}x{frame.shape[0]} frames; bc-camera's "
                                             f"{camera} is {side}x{side}")
                if j in starts:
                    current, pending = starts[j], []
                if current is None:
                    continue
                pending.append(frame)
                if len(pending) == current["length"]:
                    lo = current["dataset_from_index"]
                    arr[lo:lo + len(pending)] = pool_frames(np.stack(pending), config.pool(camera))
                    bar.update(len(pending))
                    current, pending = None, []
            if current is not None or len([e for e in eps]) != len(starts):
                raise TrainingInputError(f"{video} ends before its episodes' frames do; record the dataset again")
        bar.close()
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npy")
        np.save(tmp, arr)
        os.replace(tmp, path)
        out[camera] = np.load(path, mmap_mode="r")
    return out


def read_demos(roots: list[Path], config: BCCameraNetConfig, cache: Path, show: bool = True) -> Demos:
    """The training steps of the dataset folders (each checked: :func:`check_dataset`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from engines.bc_camera import instruction_one_hot
    from eval.lerobot.dataset import ENVIRONMENT_STATE
    from eval.training.state_features import ActionHistory

    parts = []
    for source, root in enumerate(roots):
        check_dataset(root)
        key = dataset_key(root)
        episodes = []
        for p in sorted((root / "meta" / "episodes").rglob("*.parquet")):
            episodes += pq.read_table(p).to_pylist()
        table = pa.concat_tables([pq.read_table(p) for p in sorted((root / "data").rglob("*.parquet"))])
        n = table.num_rows
        if n != sum(e["length"] for e in episodes):
            raise TrainingInputError(f"{root}: its data tables hold {n} steps, its episodes {sum(e['length'] for e in episodes)}")
        for name, width in (("observation.state", config.proprio_dim), (ENVIRONMENT_STATE, SCENE_DIM),
                            ("action", config.action_dim)):
            if table.schema.field(name).type.list_size != width:
                raise TrainingInputError(f"{root}: {name} has {table.schema.field(name).type.list_size} numbers; "
                                         f"bc-camera reads {width}")
        state = _vectors(table, "observation.state", config.proprio_dim)
        scene = _vectors(table, ENVIRONMENT_STATE, SCENE_DIM)
        executed = _vectors(table, "action", config.action_dim)
        tasks = pq.read_table(root / "meta" / "tasks.parquet").to_pandas()
        task_of = {int(i): str(t) for t, i in zip(tasks.index, tasks["task_index"])}
        task_index = table.column("task_index").to_numpy()
        frames = _frames_cache(root, key, episodes, n, config, cache, show)
        for e in episodes:
            lo, hi = e["dataset_from_index"], e["dataset_to_index"]
            history, hist = ActionHistory(), []
            for a in executed[lo:hi]:  # what the policy's ActionHistory holds when it is asked at each step
                hist.append(history.vector())
                history.update(a)
            onehot = instruction_one_hot(task_of[int(task_index[lo])], config)
            low = np.concatenate([state[lo:hi], np.repeat(onehot[None], hi - lo, 0), np.stack(hist)], axis=1)
            ok = e.get("success")
            parts.append((lo, hi, low, scene[lo:hi], frames, source, float(ok) if isinstance(ok, bool) else np.nan))
    if not parts:
        raise TrainingInputError(f"no episode to train on in {', '.join(map(str, roots))}")
    cams = [c for c, _ in config.cameras]
    return Demos(frames={c: np.concatenate([np.asarray(p[4][c][p[0]:p[1]]) for p in parts]) for c in cams},
                 low_dim=np.concatenate([p[2] for p in parts]).astype(np.float32),
                 scene=np.concatenate([p[3] for p in parts]).astype(np.float32),
                 episode=np.concatenate([np.full(p[1] - p[0], i) for i, p in enumerate(parts)]),
                 episodes_used=len(parts),
                 source=np.concatenate([np.full(p[1] - p[0], p[5]) for p in parts]),
                 success=np.array([p[6] for p in parts]))


def episode_starts(demos: Demos) -> np.ndarray:
    """The rows of ``demos`` that begin an episode (its steps are in order, an episode's together)."""
    return np.flatnonzero(np.r_[True, demos.episode[1:] != demos.episode[:-1]])


def frame_rows(demos: Demos, config: BCCameraNetConfig) -> dict[str, np.ndarray]:
    """For each of the network's image inputs, the row of its camera's ``demos.frames`` read at each step: the
    step's own, or its episode's first step's for ``config.first_frame_cameras`` and ``<camera>_first``
    (``config.first_inputs``): what the policy keeps from a try's first step."""
    steps = np.arange(len(demos.episode))
    starts = episode_starts(demos)
    first = starts[np.searchsorted(starts, steps, side="right") - 1]
    rows = {c: first if c in config.first_frame_cameras else steps for c, _ in config.cameras}
    return {**rows, **{c + FIRST_SUFFIX: first for c in config.first_inputs}}


def frame_source(key: str) -> str:
    """The camera of a :func:`frame_rows` key (``<camera>_first`` reads that camera's frames)."""
    return key.removesuffix(FIRST_SUFFIX)


def estimates(model, demos: Demos, config: BCCameraNetConfig, show: bool = False) -> np.ndarray:
    """``model``'s estimate (N, 32) of every step's scene, from what the policy would have fed it (:func:`frame_rows`)."""
    import torch
    from tqdm import tqdm

    rows = frame_rows(demos, config)
    low = torch.as_tensor(demos.low_dim)
    model.eval()
    with torch.no_grad():
        return torch.cat([model.estimate({c: torch.from_numpy(np.ascontiguousarray(
                                              demos.frames[frame_source(c)][rows[c][i:i + 1024]])).float() / 255.0
                                          for c in rows}, low[i:i + 1024])
                          for i in tqdm(range(0, len(low), 1024), desc="estimates", unit="batch", disable=not show)
                          ]).numpy()


def over_the_hole(scene: np.ndarray) -> np.ndarray:
    """The steps whose true scene holds the block within OVER_HOLE_XY across of its hole (where a try that gets there
    inserts or runs out of time)."""
    return (scene[:, GRASPED] > 0.5) & (np.linalg.norm(scene[:, 19:21], axis=1) < OVER_HOLE_XY)


# ------------------------------------------------------------------ training
def augment(x, generator, shift: int):
    """uint8 (N, 3, side, side) frames -> float in [0, 1], each shifted by up to ``shift`` pixels (edges repeated) and
    its brightness and contrast scaled by up to COLOUR."""
    import torch
    import torch.nn.functional as F

    x = x.float() / 255.0
    n, c = x.shape[:2]
    shifted = x
    if shift:
        padded = F.pad(x, (shift,) * 4, mode="replicate")  # (N, 3, side + 2 shift, side + 2 shift)
        dy = torch.randint(0, 2 * shift + 1, (n,), generator=generator)
        dx = torch.randint(0, 2 * shift + 1, (n,), generator=generator)
        side = x.shape[-1]
        span = torch.arange(side)
        rows = (dy[:, None] + span)[:, None, :, None].expand(n, c, side, padded.shape[3])
        cols = (dx[:, None] + span)[:, None, None, :].expand(n, c, side, side)
        shifted = padded.gather(2, rows).gather(3, cols)
    mean = shifted.mean(dim=(1, 2, 3), keepdim=True)
    contrast = 1 + (torch.rand(n, 1, 1, 1, generator=generator) * 2 - 1) * COLOUR
    bright = 1 + (torch.rand(n, 1, 1, 1, generator=generator) * 2 - 1) * COLOUR
    return ((shifted - mean) * contrast + mean * bright).clamp(0.0, 1.0)


def run_identity(roots: list[Path], recipe: Recipe, policy: Path) -> dict:
    """What a work folder trains: the datasets (by content), the policy head (by content) and the recipe."""
    from engines.onnx_utils import sha256_file

    return {"format": FORMAT, "datasets": [{"path": str(r.resolve()), "sha256": dataset_key(r)} for r in roots],
            "policy": {"path": str(policy.resolve()), "sha256": sha256_file(policy)},
            "recipe": json.loads(json.dumps(asdict(recipe)))}


# what the validation reports, in units a reader checks against the task's tolerances (the hole's clearance is
# 2 mm a side: env.geometry.DEFAULT_CLEARANCE): (name, scene-feature slice, scale to the unit, unit)
# (yaw_err: over the steps whose true yaw error is over 5 degrees; grip_knob: the fingers' angle to the block's
# knob, from its cos and sin of 4 x the angle, what version 3 missed when its gripper came over the block)
ERRORS = (("block_minus_tcp", slice(16, 19), 1000.0, "mm"), ("hole_minus_block", slice(19, 22), 1000.0, "mm"),
          ("tcp", slice(0, 3), 1000.0, "mm"), ("block", slice(6, 9), 1000.0, "mm"),
          ("yaw_err", slice(31, 32), 180 / np.pi, "deg"), ("tcp_tilt", slice(29, 31), 180 / np.pi, "deg"),
          ("grasped", slice(23, 24), 1.0, ""), ("grip_knob", slice(11, 13), 180 / np.pi, "deg"))


class _Loss:
    """The recipe's loss on estimates against true scene features: in bc-state's input space (its normalisation
    and fine-scale copies of the scene part) and on its action."""

    def __init__(self, model, config: BCCameraNetConfig, weight: float, fine_weight: float = 1.0):
        import torch

        head = model.policy
        fine = [(lo, hi, scale) for lo, hi, scale in config.policy.fine if hi <= SCENE_DIM]
        self.mean, self.std = head.obs_mean[:SCENE_DIM].clone(), head.obs_std[:SCENE_DIM].clone()
        self.fine, self.model, self.weight, self.torch = fine, model, weight, torch
        self.fine_weight = fine_weight

    def features(self, scene):
        t = self.torch
        return t.cat([(scene - self.mean) / self.std, *[t.tanh(scene[:, lo:hi] / sc) * self.fine_weight ** 0.5
                                                         for lo, hi, sc in self.fine]], -1)

    def __call__(self, estimate, scene, low):
        t = self.torch
        feature = ((self.features(estimate) - self.features(scene)) ** 2).mean()
        if not self.weight:
            return feature, feature
        seen = low.shape[1] - HISTORY_DIM
        raw_est = self.model.policy.raw(t.cat([estimate, low[:, seen:]], -1))
        with t.no_grad():
            raw_true = self.model.policy.raw(t.cat([scene, low[:, seen:]], -1))
        action = ((raw_est - raw_true) ** 2).mean()
        return feature + self.weight * action, action


def load_policy_head(model, config: BCCameraNetConfig, policy: Path) -> None:
    """bc-state's weights (``policy``) into the network's policy head; one line where they do not fit."""
    from engines import bc_mlp

    try:
        head, head_config, _ = bc_mlp.load(policy)
    except bc_mlp.BadCheckpointError as e:
        raise TrainingInputError(f"--policy: {e}") from None
    if head_config != config.policy:
        raise TrainingInputError(f"--policy {policy} is a bc-state network of another shape ({head_config}); "
                                 f"bc-camera's head is {config.policy}")
    model.policy.load_state_dict(head.state_dict())


def train(demos: Demos, recipe: Recipe, work: Path, policy: Path, show: bool = True, log=print, init=None):
    """Train, continuing from ``work/checkpoint.pt`` where one exists; (model, history, split). A checkpoint is
    written after every epoch (atomically), with what the next epoch needs: each epoch's shuffle and
    augmentation are drawn from generators seeded by (seed, epoch), so a resumed run draws what an
    uninterrupted one would. ``init``: a trained network (``--init-from``) the epochs start from, its
    normalisation and policy head kept (the estimator was trained in that normalisation), not bc-state's head
    and the folders' statistics."""
    import torch
    from tqdm import tqdm

    config = recipe.config
    torch.manual_seed(recipe.seed)
    rng = np.random.default_rng(recipe.seed)
    episodes = np.unique(demos.episode)
    n_val = max(1, int(round(len(episodes) * VAL_FRACTION))) if len(episodes) >= 2 else 0
    val_mask = np.isin(demos.episode, rng.choice(episodes, n_val, replace=False))
    standing = demos.scene[:, TILT] <= TOPPLED_TILT
    tr, va = np.flatnonzero(~val_mask & standing), np.flatnonzero(val_mask & standing)
    model = build(config)
    low = torch.as_tensor(demos.low_dim)
    scene = torch.as_tensor(demos.scene)
    seen = model.low_mean.shape[0]
    if init is not None:
        model.load_state_dict(init.state_dict())
    else:
        load_policy_head(model, config, policy)
        # a constant input (the instruction of a list whose tries all say one thing) gets std 1: not a 1/1e-3
        # blow-up
        std = low[tr, :seen].std(0)
        model.low_mean.copy_(low[tr, :seen].mean(0))
        model.low_std.copy_(torch.where(std > 1e-3, std, torch.ones_like(std)))
        std = scene[tr].std(0)
        model.scene_mean.copy_(scene[tr].mean(0))
        model.scene_std.copy_(torch.where(std > 1e-3, std, torch.ones_like(std)))
    loss_fn = _Loss(model, config, recipe.action_weight, recipe.fine_weight)
    if recipe.keep_far_block and init is None:
        raise TrainingInputError("--keep-far-block keeps W's estimate of the far block: give --init-from W")
    # the far block's teacher: W as loaded, in eval mode (the network trained is a copy of it)
    kept = init if recipe.keep_far_block else None
    frame_row = {c: torch.as_tensor(r) for c, r in frame_rows(demos, config).items()}
    # each image input's camera frames (``<camera>_first`` shares its camera's tensor)
    cached = {c: torch.from_numpy(np.ascontiguousarray(demos.frames[c])) for c, _ in config.cameras}
    frames = {c: cached[frame_source(c)] for c in frame_row}
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=recipe.lr, weight_decay=recipe.weight_decay)
    steps_per_epoch = (len(tr) + recipe.batch - 1) // recipe.batch
    # (--epochs 0 with --init-from: W on the held-out episodes alone)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, recipe.epochs * steps_per_epoch))
    history: list[dict] = []
    start = 0
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "checkpoint.pt"
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        history, start = state["history"], state["epoch"]
        log(f"resuming {work} after epoch {start} of {recipe.epochs}")

    grasped = demos.scene[:, GRASPED] > 0.5
    first = np.zeros(len(demos.episode), bool)
    first[episode_starts(demos)] = True
    # a median over every step hides the phase that fails: most steps carry a grasped block, which the wrist
    # camera sees large; the steps before the grasp must find the block in the frames
    phases = {"start": first, "before_grasp": ~grasped, "grasped": grasped}

    def evaluate(idx: np.ndarray) -> dict:
        model.eval()
        total = action = 0.0
        ests = []
        with torch.no_grad():
            for i in range(0, len(idx), 1024):
                j = torch.as_tensor(idx[i:i + 1024])
                est = model.estimate({c: frames[c][frame_row[c][j]].float() / 255.0 for c in frames}, low[j])
                lo, ac = loss_fn(est, scene[j], low[j])
                total += float(lo) * len(j)
                action += float(ac) * len(j)
                ests.append(est.numpy())
        est, true = np.concatenate(ests), demos.scene[idx]
        out = {"loss": total / len(idx), "action_mse": action / len(idx), "errors": {}}
        for phase, mask in phases.items():
            rows = mask[idx]
            errors = {"steps": int(rows.sum())}
            for name, sl, unit, label in ERRORS:
                if name == "grip_knob":
                    turn = np.arctan2(est[rows, sl][:, 1], est[rows, sl][:, 0]) - np.arctan2(true[rows, sl][:, 1],
                                                                                           true[rows, sl][:, 0])
                    e = np.abs(np.angle(np.exp(1j * turn))) / 4 * unit
                else:
                    e = np.linalg.norm((est[rows, sl] - true[rows, sl]) * unit, axis=1)
                if name == "yaw_err":  # where there is a yaw to correct: else 0 is right, and the median says nothing
                    e = e[np.abs(true[rows, sl][:, 0]) > np.radians(5)]
                key = f"{name}_{label}" if label else name
                errors[key] = {"median": round(float(np.median(e)), 2), "p90": round(float(np.quantile(e, 0.9)), 2),
                               "n": int(len(e))} if len(e) else None
            out["errors"][phase] = errors
        return out

    if init is not None and start == 0 and len(va):  # where the epochs start: W on the held-out episodes
        history.append({"epoch": 0, "train_loss": None, "validation": evaluate(va), "seconds": 0.0})
        log(f"before the epochs (--init-from): validation loss {history[0]['validation']['loss']:.5f}; "
            f"{_medians(history[0]['validation']['errors'])}")

    def far_block_kept(teacher, j):
        return far_block_target(teacher, scene[j], lambda far: (
            {c: frames[c][frame_row[c][j[far]]].float() / 255.0 for c in frames}, low[j[far]]))

    for epoch in range(start, recipe.epochs):
        t0 = time.monotonic()
        model.train()
        draw = np.random.default_rng([recipe.seed, epoch])
        if recipe.before_grasp_weight == 1.0 and not recipe.dataset_weights:
            order = torch.as_tensor(draw.permutation(tr))
        else:  # as many draws as steps, before-grasp steps and each dataset's steps weighted
            w = np.where(grasped[tr], 1.0, recipe.before_grasp_weight)
            if recipe.dataset_weights:
                w = w * np.asarray(recipe.dataset_weights)[demos.source[tr]]
            order = torch.as_tensor(draw.choice(tr, size=len(tr), p=w / w.sum()))
        gen = torch.Generator().manual_seed(recipe.seed * 1_000_003 + epoch)
        total = 0.0
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch + 1}/{recipe.epochs}", unit="batch", disable=not show)
        for i in bar:
            j = order[i * recipe.batch:(i + 1) * recipe.batch]
            est, offset = model.estimate({c: augment(frames[c][frame_row[c][j]], gen, recipe.shift) for c in frames},
                                         low[j], with_offset=True)
            loss, _ = loss_fn(est, scene[j] if kept is None else far_block_kept(kept, j), low[j])
            # the wrist heads: the block's offset across on the steps whose block is within OFFSET_NEAR across of
            # the gripper, the grasp depth on the held steps
            true_offset = scene[j][:, 16:18]
            near = torch.linalg.vector_norm(true_offset, dim=-1) < OFFSET_NEAR
            if near.any():
                loss = loss + (((offset[near, 0:2] - true_offset[near]) / OFFSET_SCALE) ** 2).mean()
            held = scene[j][:, GRASPED] > 0.5
            if held.any():
                depth = scene[j][held, 18] + KNOB_TOP_ABOVE_CENTRE
                loss = loss + (((offset[held, 2] - depth) / OFFSET_SCALE) ** 2).mean()
            # and its hole offset across from a held block, within OFFSET_NEAR of the hole
            true_hole = scene[j][:, 19:21]
            over = held & (torch.linalg.vector_norm(true_hole, dim=-1) < OFFSET_NEAR)
            if over.any():
                loss = loss + (((offset[over, 3:5] - true_hole[over]) / OFFSET_SCALE) ** 2).mean()
            # and a held triangle's turn in the fingers (trained through the composed yaw alone, it was 3.8 degrees
            # off on its own tries where the square's, from the knob head, was 1.4: docs/models.md)
            triangle = held & (scene[j][:, TRIANGLE] > 0.5)
            if triangle.any():
                with torch.no_grad():
                    _, rot = model.gripper.tcp_pose(low[j][triangle][:, :ARM_JOINTS])
                    truth = triangle_turn_truth(rot, scene[j][triangle])
                loss = loss + ((offset[triangle, 5:7] - truth) ** 2).sum(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(j)
            bar.set_postfix(loss=f"{float(loss.detach()):.4f}")
        bar.close()
        val = evaluate(va) if len(va) else {}
        history.append({"epoch": epoch + 1, "train_loss": total / len(tr), "validation": val,
                        "seconds": round(time.monotonic() - t0, 1)})
        tmp = ckpt.with_name(ckpt.name + ".tmp")
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                    "history": history, "epoch": epoch + 1}, tmp)
        os.replace(tmp, ckpt)
        said = f"validation loss {val['loss']:.5f}; {_medians(val['errors'])}" if val else "no validation episodes"
        log(f"epoch {epoch + 1}/{recipe.epochs}: train loss {total / len(tr):.5f}; {said}; "
            f"{history[-1]['seconds']:.0f} s; checkpoint {ckpt}")
    model.eval()
    return model, history, {"train_steps": int(len(tr)), "validation_steps": int(len(va)),
                            "toppled_steps_left_out": int((~standing).sum()),
                            "validation_episodes": int(n_val)}


def far_block_target(teacher, scene, inputs):
    """The steps' true ``scene`` features, with the block's x, y far from the gripper before the grasp (across,
    beyond ``OFFSET_NEAR``), and the relations that read it (block to gripper, hole to block), as ``teacher``
    estimates them (``Recipe.keep_far_block``); ``inputs(far)``: (images, low_dim) of the rows ``far`` selects."""
    import torch

    target = scene.clone()
    far = (target[:, GRASPED] <= 0.5) & (torch.linalg.vector_norm(target[:, 16:18], dim=-1) >= OFFSET_NEAR)
    if far.any():
        with torch.no_grad():
            xy = teacher.estimate(*inputs(far))[:, 6:8]
        target[far, 6:8] = xy
        target[far, 16:18] = xy - target[far, 0:2]
        target[far, 19:21] = target[far, 13:15] - xy
    return target


def fit_locator(model, demos: Demos, recipe: Recipe, show: bool = True, log=print) -> dict:
    """Fit ``model``'s locator (engines.bc_camera, ``locator_hidden``) in place: from the trained encoder's features
    of each episode's first third-person frame and its instruction to the block's x, y at that step, the rest of
    the network untouched. Starts (episodes of one block position and instruction: a DAgger round replays the
    demonstrations' starts) are held out whole, ``VAL_FRACTION`` of them, so the validation error is that at
    starts the fit never saw; returns the fit's report (errors in mm)."""
    import torch
    from tqdm import tqdm

    from engines.bc_camera import BLOCK_XY

    config = recipe.config
    seen = config.proprio_dim + len(config.instructions)
    first = episode_starts(demos)
    target = demos.scene[first][:, BLOCK_XY]
    instruction = demos.low_dim[first, config.proprio_dim:seen]
    start_of = np.unique(np.c_[np.round(target * 1e4), instruction.argmax(1)], axis=0, return_inverse=True)[1].ravel()
    rng = np.random.default_rng([recipe.seed, 12])
    n_starts = int(start_of.max()) + 1
    val = np.isin(start_of, rng.choice(n_starts, int(round(n_starts * VAL_FRACTION)) if n_starts >= 2 else 0,
                                       replace=False))
    model.eval()
    with torch.no_grad():  # each locator camera's features of the first frames, as BCCameraNet.locate reads them
        def features(rows):
            return torch.cat([model.encoders[c]((torch.from_numpy(np.asarray(demos.frames[c][rows])).float() / 255.0
                                                 - 0.5) * 4.0) for c in config.locator_cameras], -1)
        feats = torch.cat([features(first[i:i + 512]) for i in range(0, len(first), 512)])
    x = torch.cat([feats, torch.as_tensor(instruction)], -1)
    y = torch.as_tensor(target)
    tr = np.flatnonzero(~val)
    std = x[tr].std(0)
    model.locator_mean.copy_(x[tr].mean(0))
    model.locator_std.copy_(torch.where(std > 1e-3, std, torch.ones_like(std)))
    torch.manual_seed(recipe.seed)
    for p in model.locator.parameters():  # a refit starts afresh, as a first fit does
        if p.dim() > 1:
            torch.nn.init.kaiming_uniform_(p, a=5 ** 0.5)
        else:
            torch.nn.init.zeros_(p)
    opt = torch.optim.AdamW(model.locator.parameters(), lr=recipe.lr, weight_decay=recipe.locator_weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=recipe.locator_batches)
    draw = np.random.default_rng([recipe.seed, 13])
    scale = model.scene_std[BLOCK_XY]
    t0 = time.monotonic()
    for _ in tqdm(range(recipe.locator_batches), desc="locator", unit="batch", disable=not show):
        j = torch.as_tensor(draw.choice(tr, recipe.batch))
        loss = (((model.locate(feats[j], x[j, feats.shape[1]:]) - y[j]) / scale) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        err = np.linalg.norm(model.locate(feats, x[:, feats.shape[1]:]).numpy() - target, axis=1) * 1000.0

    def summary(mask):
        return {"episodes": int(mask.sum()), "starts": int(len(np.unique(start_of[mask]))),
                "median_mm": round(float(np.median(err[mask])), 2),
                "p90_mm": round(float(np.quantile(err[mask], 0.9)), 2)} if mask.any() else None
    report = {"train": summary(~val), "validation": summary(val), "seconds": round(time.monotonic() - t0, 1)}
    said = (f"{report['validation']['median_mm']:.1f} mm median, {report['validation']['p90_mm']:.1f} p90 at "
            f"{report['validation']['starts']} held-out starts" if report["validation"] else "no held-out starts")
    log(f"locator: block x, y {report['train']['median_mm']:.1f} mm median at the fitted starts, {said}")
    return report


def tune_head(model, demos: Demos, recipe: Recipe, policy: Path, show: bool = True, log=print) -> dict:
    """Tune ``model``'s policy head in place on its trained estimator's own estimates of the standing steps, each
    drawn alike: from the estimate (its error from the truth scaled by a factor drawn from 0 .. ``head_error_scale``)
    and the step's true action history to bc-state's (``policy``) action on the true state, the estimator untouched.
    bc-state, trained on true states, acts on every degree of the estimated yaw error (its fine-scale copy works at
    0.02 rad) and kept turning a held block that was aligned (docs/models.md); tuned so, the head acts on what an
    estimate of the scene says about it. Returns its report: bc-state's action on the truth against the head's on
    the estimate (median distance), before (``before``: bc-state's head, or W's under ``--init-from``; v15's report
    named it ``bc_state``) and after, over the steps it was tuned on (all, held, over the hole), and the tuned
    head's on the truth."""
    import torch
    from tqdm import tqdm

    from engines import bc_mlp

    est = torch.as_tensor(estimates(model, demos, recipe.config, show=show))
    try:
        teacher = bc_mlp.load(policy)[0]
    except bc_mlp.BadCheckpointError as e:
        raise TrainingInputError(f"--policy: {e}") from None
    keep = np.flatnonzero(demos.scene[:, TILT] <= TOPPLED_TILT)
    est, scene = est[keep], torch.as_tensor(demos.scene[keep])
    hist = torch.as_tensor(demos.low_dim[keep, -HISTORY_DIM:])
    head = model.policy

    def batched(fn, *xs):
        with torch.no_grad():
            return torch.cat([fn(torch.cat([x[i:i + 8192] for x in xs], -1)) for i in range(0, len(xs[0]), 8192)])
    target = batched(teacher.raw, scene, hist)
    truth_action = batched(teacher, scene, hist).numpy()
    over, held = over_the_hole(demos.scene[keep]), demos.scene[keep, GRASPED] > 0.5

    def action_errors(on) -> dict:
        a = batched(head, on, hist).numpy()
        err = np.linalg.norm(a - truth_action, axis=1)
        return {name: round(float(np.median(err[m])), 4) if m.any() else None
                for name, m in (("all", np.ones(len(err), bool)), ("held", held), ("over_the_hole", over))}
    before = action_errors(est)
    head.requires_grad_(True)
    opt = torch.optim.AdamW(head.parameters(), lr=recipe.head_lr, weight_decay=recipe.weight_decay)
    steps = recipe.head_epochs * max(1, len(est) // recipe.head_batch)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    gen = torch.Generator().manual_seed(recipe.seed)
    t0 = time.monotonic()
    for _ in tqdm(range(steps), desc="policy head", unit="batch", disable=not show, mininterval=5):
        j = torch.randint(0, len(est), (recipe.head_batch,), generator=gen)
        scale = torch.rand(recipe.head_batch, 1, generator=gen) * recipe.head_error_scale
        noisy = scene[j] + scale * (est[j] - scene[j])
        loss = ((head.raw(torch.cat([noisy, hist[j]], -1)) - target[j]) ** 2).mean()
        if recipe.head_anchor:
            loss = loss + recipe.head_anchor * ((head.raw(torch.cat([scene[j], hist[j]], -1)) - target[j]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    head.requires_grad_(False)
    model.eval()
    report = {"steps": int(len(est)), "batches": steps, "seconds": round(time.monotonic() - t0, 1),
              "action_error_on_the_estimate": {"before": before, "tuned": action_errors(est)},
              "action_error_on_the_truth": action_errors(scene)}
    log(f"policy head: its action on the estimate {before['over_the_hole']} -> "
        f"{report['action_error_on_the_estimate']['tuned']['over_the_hole']} off bc-state's on the truth over the "
        f"hole (median, on the tuned steps); on the truth {report['action_error_on_the_truth']['all']}")
    return report


def _medians(errors: dict) -> str:
    """The validation's medians that say whether the policy can act: the block's position before the grasp and,
    grasped, where it is against the hole."""
    def med(phase: str, key: str) -> str:
        e = errors[phase].get(key)
        return f"{e['median']:.1f}" if e else "-"

    return (f"block {med('before_grasp', 'block_mm')} mm, yaw error {med('before_grasp', 'yaw_err_deg')} deg and "
            f"knob {med('before_grasp', 'grip_knob_deg')} deg before the grasp, hole-block "
            f"{med('grasped', 'hole_minus_block_mm')} mm grasped (medians)")


def flops_per_query(model, config: BCCameraNetConfig) -> int:
    """FLOPs of one query (batch 1) of the exported graph, counted by engines.flops (multiply-adds x 2)."""
    import tempfile

    from engines.bc_camera import dummy_inputs, export_onnx
    from engines.flops import graph_flops

    with tempfile.TemporaryDirectory() as tmp:
        path = export_onnx(model, config, Path(tmp) / "bc_camera.onnx")
        return int(graph_flops(str(path), dummy_inputs(config))["total"])


def _trained_onto(flag: str, path: Path, config: BCCameraNetConfig, head_epochs: int):
    """(model, config, metadata) of the trained weights ``--locator-from``, ``--head-from`` or ``--init-from``
    (``flag``) names: one line where there are none, the file is not bc-camera's, what is to be fitted is not
    asked for (the locator's widths, the head's epochs), or W has it already (refit from the file it was fitted
    onto)."""
    from engines.bc_camera import BadCheckpointError, load

    locator = flag == "--locator-from"
    if locator and not config.locator_hidden:
        raise TrainingInputError("--locator-from fits a locator: give its hidden widths with --locator-hidden")
    if flag == "--head-from" and head_epochs < 1:
        raise TrainingInputError("--head-from tunes the policy head: give its epochs with --head-epochs")
    if not path.is_file():
        raise TrainingInputError(f"{flag} {path} does not exist; give trained bc-camera weights")
    try:
        model, trained, meta = load(path)
    except BadCheckpointError as e:
        raise TrainingInputError(f"{flag}: {e}") from None
    if locator and trained.locator_hidden:
        raise TrainingInputError(f"--locator-from {path} has a locator already; give the weights it was fitted onto")
    if flag == "--head-from" and meta.get("head_epochs", "0") != "0":
        raise TrainingInputError(f"--head-from {path} has a tuned policy head already; give the weights it was tuned "
                                 f"onto")
    return model, trained, meta


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.training.train_bc_camera", description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", required=True, nargs="+", metavar="DIR",
                   help="LeRobotDataset v3.0 folders of python -m eval.record --split train")
    p.add_argument("--work", default="build/train_bc_camera", metavar="DIR",
                   help="the run's folder: frame cache, checkpoint (rerun the same command to continue)")
    p.add_argument("--out", default=str(DEFAULT_WEIGHTS), help="weights file (safetensors)")
    p.add_argument("--policy", default=str(BC_STATE_WEIGHTS), metavar="W",
                   help="the bc-state weights that act on the estimate (copied in, frozen)")
    p.add_argument("--report-dir", default="results/bc_camera/training", help="training.json goes here")
    defaults = Recipe()
    p.add_argument("--epochs", type=int, default=defaults.epochs)
    p.add_argument("--batch", type=int, default=defaults.batch)
    p.add_argument("--lr", type=float, default=defaults.lr)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--shift", type=int, default=defaults.shift, help="random shift augmentation, pixels")
    p.add_argument("--action-weight", type=float, default=defaults.action_weight,
                   help="weight of the policy head's action error beside the feature error")
    p.add_argument("--before-grasp-weight", type=float, default=defaults.before_grasp_weight,
                   help="how much more often a step before the grasp is drawn than a grasped one")
    p.add_argument("--dataset-weights", type=float, nargs="+", metavar="W",
                   help="how often each --datasets folder's steps are drawn against the others' (default 1 each)")
    p.add_argument("--fine-weight", type=float, default=defaults.fine_weight,
                   help="weight of the loss on bc-state's fine-scale copies of the estimate")
    p.add_argument("--grid-channels", type=int, default=defaults.config.grid_channels,
                   help="channels of each camera's flattened coarse feature grid beside the keypoints (0: none)")
    p.add_argument("--locator-hidden", type=int, nargs="+", metavar="N", default=list(defaults.config.locator_hidden),
                   help="the locator's hidden widths (engines.bc_camera: the block before the grasp from the third "
                        "person's first frame and the instruction alone); default none")
    p.add_argument("--locator-from", metavar="W",
                   help="no epochs: fit the locator onto trained weights W (one without a locator, network version "
                        "11) on --datasets, the rest of W as it is")
    p.add_argument("--head-epochs", type=int, default=defaults.head_epochs,
                   help="after the epochs, tune the policy head this many epochs on the estimator's own estimates "
                        "(tune_head; default 0: bc-state's head as it is)")
    p.add_argument("--head-error-scale", type=float, default=defaults.head_error_scale,
                   help="the head's tuning scales the estimate's error by a factor drawn from 0 to this")
    p.add_argument("--head-from", metavar="W",
                   help="no epochs: tune the policy head of trained weights W (one not tuned so) on --datasets, the "
                        "rest of W as it is")
    p.add_argument("--init-from", metavar="W",
                   help="the epochs start from trained weights W (a DAgger round on new folders alone: the earlier "
                        "rounds' recordings need not be kept), its network, normalisation and policy head as they "
                        "are; --head-epochs tunes its head again")
    p.add_argument("--keep-far-block", action="store_true",
                   help="with --init-from W: the block's x, y far from the gripper before the grasp trained toward "
                        "W's own estimate, not the truth (a new round's few starts teach it worse)")
    p.add_argument("--far-block-first-frame", action="store_true",
                   help="the block away from the gripper as the estimator reads it at the try's first step, from "
                        "every camera's first frame (network version 13); with --init-from W and --epochs 0, W as it "
                        "is with that change")
    p.add_argument("--brightness-floor", type=float, nargs="+", metavar="F",
                   help="one number in (0, 1] for each camera (third person, wrist): a frame whose mean is darker is "
                        "scaled up to it before the encoders (network version 14); with --init-from W and --epochs "
                        "0, W as it is with that change")
    p.add_argument("--fresh", action="store_true", help="start the work folder's training again")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    try:
        if args.epochs == 0 and not args.init_from:
            raise TrainingInputError("--epochs 0 trains nothing: it takes --init-from W (W as it is, with "
                                     "--far-block-first-frame, --brightness-floor or --head-epochs)")
        if (args.epochs < 0 or args.batch < 1 or not args.lr > 0 or not np.isfinite(args.lr) or not 0 <= args.shift < 32
                or not 0 <= args.action_weight < float("inf") or not 0 < args.before_grasp_weight < float("inf")
                or not 0 <= args.fine_weight < float("inf") or args.head_epochs < 0
                or not 0 <= args.head_error_scale < float("inf")
                or not 0 <= args.grid_channels <= 256 or not all(1 <= n <= 1024 for n in args.locator_hidden)):
            raise TrainingInputError("--epochs must be at least 1 (0 with --init-from), --batch at least 1, --lr a "
                                     "positive number, --shift 0 to 31 pixels, --action-weight a number >= 0, "
                                     "--before-grasp-weight > 0, --fine-weight >= 0 and --grid-channels 0 to 256, "
                                     "--locator-hidden widths 1 to 1024, --head-epochs >= 0 and --head-error-scale a "
                                     "number >= 0")
        policy = Path(args.policy)
        if not policy.is_file():
            raise TrainingInputError(f"--policy {policy} does not exist; give bc-state weights "
                                     f"(python -m eval.training.train_bc makes them)")
        try:
            config = replace(BCCameraNetConfig(), grid_channels=args.grid_channels,
                             locator_hidden=tuple(args.locator_hidden),
                             far_block_first_frame=args.far_block_first_frame,
                             brightness_floor=tuple(args.brightness_floor or ()))
        except ValueError as e:
            raise TrainingInputError(f"--brightness-floor: {e}") from None
        if args.locator_from and args.head_from:
            raise TrainingInputError("--locator-from and --head-from each fit one part onto trained weights; give one "
                                     "(fit the other onto its output)")
        if args.keep_far_block and not args.init_from:
            raise TrainingInputError("--keep-far-block keeps W's estimate of the far block: give --init-from W")
        if args.init_from and (args.locator_from or args.head_from):
            raise TrainingInputError("--init-from trains W's network on; --locator-from and --head-from fit one part "
                                     "onto W without epochs: give one of them")
        if args.init_from and (args.grid_channels != defaults.config.grid_channels or args.locator_hidden):
            raise TrainingInputError("--init-from trains W's network as W's file configures it; leave out "
                                     "--grid-channels and --locator-hidden")
        # (flag, W) where this run fits one part onto trained weights W and runs no epochs, or (--init-from) starts
        # its epochs from W
        onto = ("--locator-from", args.locator_from) if args.locator_from else \
            ("--head-from", args.head_from) if args.head_from else \
            ("--init-from", args.init_from) if args.init_from else None
        fitted_onto = None
        if onto:
            fitted_onto = _trained_onto(onto[0], Path(onto[1]), config, args.head_epochs)
            try:
                config = replace(fitted_onto[1], locator_hidden=config.locator_hidden if args.locator_from
                                 else fitted_onto[1].locator_hidden,
                                 far_block_first_frame=fitted_onto[1].far_block_first_frame
                                 or args.far_block_first_frame,
                                 brightness_floor=config.brightness_floor or fitted_onto[1].brightness_floor)
            except ValueError as e:
                raise TrainingInputError(f"{onto[0]} {onto[1]} with --far-block-first-frame: {e}") from None
        roots = [Path(d) for d in args.datasets]
        weights = tuple(args.dataset_weights or ())
        if weights and (len(weights) != len(roots) or not all(0 < w < float("inf") for w in weights)):
            raise TrainingInputError(f"--dataset-weights takes one number > 0 for each of the {len(roots)} "
                                     f"--datasets folders, in order; got {len(weights)}")
        for root in roots:
            if not root.is_dir():
                raise TrainingInputError(f"{root} is not a folder; record demonstrations with python -m eval.record "
                                         f"--split train --out {root}")
            check_dataset(root)
        recipe = Recipe(epochs=args.epochs, batch=args.batch, lr=args.lr, seed=args.seed, shift=args.shift,
                        action_weight=args.action_weight, before_grasp_weight=args.before_grasp_weight,
                        fine_weight=args.fine_weight, dataset_weights=weights, head_epochs=args.head_epochs,
                        head_error_scale=args.head_error_scale, keep_far_block=args.keep_far_block, config=config)
        work = Path(args.work)
        ident = run_identity(roots, recipe, policy)
        onto_key = onto[0][2:].replace("-", "_") if onto else None  # locator_from, head_from, init_from
        if onto:
            from engines.onnx_utils import sha256_file

            ident[onto_key] = {"path": str(Path(onto[1]).resolve()), "sha256": sha256_file(onto[1])}
        ident_path = work / "train.json"
        if ident_path.is_file() and not args.fresh:
            try:
                old = json.loads(ident_path.read_text())
            except (ValueError, UnicodeDecodeError):
                old = None
            if old != ident:
                what = ("other datasets" if not old or old.get("datasets") != ident["datasets"] else
                        "another policy head" if old.get("policy") != ident["policy"] else "another recipe")
                raise TrainingInputError(f"{work} holds a training of {what}; use --fresh to start this one there, "
                                         f"or another --work")
        if args.fresh:
            (work / "checkpoint.pt").unlink(missing_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        ident_path.write_text(json.dumps(ident, indent=1) + "\n")
        t0 = time.monotonic()
        demos = read_demos(roots, recipe.config, work / "frames", show=not args.quiet)
        print(f"{len(demos.low_dim)} steps from {demos.episodes_used} recorded episodes (labels: "
              f"observation.environment_state, every episode)")
        if fitted_onto and not args.init_from:
            model, history, split = build(config), [], {}
            missing, unexpected = model.load_state_dict(fitted_onto[0].state_dict(), strict=False)
            if unexpected or not all(k.startswith("locator") for k in missing):  # the code's network, not W's
                raise TrainingInputError(f"{onto[0]} {onto[1]} does not fit this code's network")
        else:
            model, history, split = train(demos, recipe, work, policy, show=not args.quiet,
                                          init=fitted_onto[0] if fitted_onto else None)
        locator = fit_locator(model, demos, recipe, show=not args.quiet) \
            if config.locator_hidden and not args.head_from else None
        head = tune_head(model, demos, recipe, policy, show=not args.quiet) if recipe.head_epochs else None
    except TrainingInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"error: interrupted; the last finished epoch is in {work}/checkpoint.pt: rerun the same command to "
              f"continue", file=sys.stderr)
        return 130
    elapsed = time.monotonic() - t0
    out = Path(args.out)
    trained_here = {"seed": recipe.seed, "epochs": recipe.epochs, "steps": len(demos.low_dim),
                    "episodes": demos.episodes_used, "datasets": ",".join(d["sha256"][:16] for d in ident["datasets"]),
                    "policy_sha256": ident["policy"]["sha256"]}
    # a part fitted onto W: the rest is W's training, as W's file says, and W's sha256; trained on from W: this
    # run's training and W's sha256, and the head's tuning epochs, W's and this run's
    extra = {**trained_here, "init_from_sha256": ident[onto_key]["sha256"]} if args.init_from else \
        {**{k: fitted_onto[2][k] for k in trained_here if k in fitted_onto[2]},
         f"{onto_key}_sha256": ident[onto_key]["sha256"]} if fitted_onto else trained_here
    head_epochs = recipe.head_epochs + (int(fitted_onto[2].get("head_epochs", "0")) if args.init_from else 0)
    save(model, recipe.config, out, extra={**extra, "head_epochs": head_epochs} if head_epochs else extra)
    from eval.records import machine_info

    params = sum(int(t.numel()) for t in model.parameters())
    trained = sum(int(t.numel()) for t in model.parameters() if t.requires_grad)
    report = {
        "datasets": ident["datasets"], "policy_head": ident["policy"], "episodes_used": demos.episodes_used,
        "steps": int(len(demos.low_dim)), "labels": "observation.environment_state (every episode)", **split,
        "recipe": ident["recipe"], "augmentation": {"shift_pixels": recipe.shift, "colour_relative": COLOUR},
        "parameters": params, "parameters_trained": trained, "weights_bytes": out.stat().st_size,
        "flops_per_query": flops_per_query(model, recipe.config),
        "wall_seconds_this_run": round(elapsed, 1),
        "train_seconds_all_epochs": round(sum(h["seconds"] for h in history), 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "final": history[-1] if history else None, "history": history, "locator": locator, "policy_head_tuning": head,
        **({onto_key: ident[onto_key]} if fitted_onto else {}),
        "machine": machine_info(), "weights": str(out)}
    rdir = Path(args.report_dir)
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out} ({report['weights_bytes'] / 1e6:.2f} MB, {params} parameters, "
          f"{report['flops_per_query'] / 1e6:.1f} MFLOP a query) and {rdir}/training.json in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
