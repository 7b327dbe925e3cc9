"""One recorded try, staged in its own folder while a recording runs (eval.rollout writes it, in the worker).

A staged episode is a folder ``<setup>_try<NNN>`` holding ``third_person.mp4``
and ``wrist.mp4`` (the frames each step's action was chosen from, encoded as
they arrive), ``steps.npz`` (per step: ``state``, the arm's joint positions
including the gripper's; ``environment_state``, the scene's state as
bc-state reads it (eval.training.state_features.state_vector: the target
block's and hole's poses, the gripper's, whether it holds the block), which a
camera policy never observes but may be trained to estimate; ``action``, what
the controller received: the
command clipped to [-1, 1] as the controller clips it; ``action_expert``,
only where the action sent was a perturbed one, the expert's label for the
state, eval.policies.dart; ``success``, the success predicate after the step)
and ``episode.json`` (the instruction, the joint names, the frame sizes, and
each camera's image statistics computed on the raw frames). It is written
under a temporary name and renamed into place once complete, so a folder with
that name is never a torn episode.

On a setup with control latency (F01, F02, G02) the
arm applies a command that many steps after it was sent (env.task); the
action of a step is the command sent at it, as a policy must learn to send it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from eval.policies.base import ACTION_BOUND
from eval.video import video_writer

CAMERAS = ("third_person", "wrist")  # the (third-person, wrist) frames of eval.rollout.Scenes.frames
EPISODE_FILE = "episode.json"
STEPS_FILE = "steps.npz"
STAGED_VERSION = 2  # 2: environment_state
# image statistics from every 4th frame's every 4th pixel row and column: about 1/64 of a try's pixels
STATS_FRAME_STRIDE = 4
STATS_PIXEL_STRIDE = 4
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)  # LeRobot's q01 q10 q50 q90 q99 (datasets/compute_stats.py)


class StagedEpisodeError(ValueError):
    """A staged episode that cannot be read (one line naming it)."""


def episode_name(setup_id: str, try_index: int) -> str:
    return f"{setup_id}_try{try_index:03d}"


class EpisodeRecording:
    """What a try's steps write while it runs: :meth:`add` per control step, :meth:`finish` at its end."""

    def __init__(self, folder: str | Path, fps: int, joint_names: Sequence[str]):
        self.folder = Path(folder)
        self.tmp = self.folder.with_name(f".{self.folder.name}.partial")
        shutil.rmtree(self.tmp, ignore_errors=True)  # what a killed worker left
        self.tmp.mkdir(parents=True)
        self.fps, self.joint_names = fps, list(joint_names)
        self.writers: dict[str, Any] = {}
        self.sizes: dict[str, tuple[int, int]] = {}
        self.samples: dict[str, list[np.ndarray]] = {c: [] for c in CAMERAS}
        self.states: list[np.ndarray] = []
        self.environment_states: list[np.ndarray] = []
        self.actions: list[np.ndarray] = []
        self.expert_actions: list[np.ndarray] = []  # the expert's labels, where the policy gives them
        self.success: list[bool] = []

    def add(self, frames: Sequence[np.ndarray], state: np.ndarray, environment_state: np.ndarray,
            action: np.ndarray, expert_action: np.ndarray | None = None) -> None:
        """One step: the (third-person, wrist) frames the action was chosen from, the joint positions then, the
        scene's state features then, the action sent, and the expert's label for the state where the action sent
        is not it (None: it is)."""
        if frames is None:
            raise StagedEpisodeError("a recorded step has no camera frames: the scene did not render it")
        k = len(self.states)
        for camera, frame in zip(CAMERAS, frames):
            frame = np.ascontiguousarray(frame)
            if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
                raise StagedEpisodeError(f"{camera} frame of {frame.dtype} {frame.shape}; expected uint8 (H, W, 3)")
            if camera not in self.writers:
                self.sizes[camera] = frame.shape[:2]
                self.writers[camera] = video_writer(self.tmp / f"{camera}.mp4", frame.shape[1], frame.shape[0],
                                                    self.fps)
            self.writers[camera].send(frame)
            if k % STATS_FRAME_STRIDE == 0:
                self.samples[camera].append(frame[::STATS_PIXEL_STRIDE, ::STATS_PIXEL_STRIDE].reshape(-1, 3).copy())
        self.states.append(np.asarray(state, dtype=np.float32).copy())
        self.environment_states.append(np.asarray(environment_state, dtype=np.float32).copy())
        self.actions.append(np.clip(np.asarray(action, dtype=np.float32), -ACTION_BOUND, ACTION_BOUND))
        if expert_action is not None:
            self.expert_actions.append(np.asarray(expert_action, dtype=np.float32).copy())

    def step_result(self, success: bool) -> None:
        """The success predicate after the step just added."""
        self.success.append(bool(success))

    def finish(self, meta: dict[str, Any]) -> Path:
        """Close the videos, write the arrays and ``episode.json`` (``meta``: the try's setup, try index, seed,
        instruction), and rename the folder into place."""
        for w in self.writers.values():
            w.close()
        self.writers = {}
        n = len(self.states)
        if n == 0 or len(self.success) != n:
            raise StagedEpisodeError(f"{self.folder.name}: {n} steps and {len(self.success)} results recorded")
        if len(self.expert_actions) not in (0, n):
            raise StagedEpisodeError(f"{self.folder.name}: {n} steps and {len(self.expert_actions)} expert labels "
                                     f"recorded")
        expert = {"action_expert": np.stack(self.expert_actions)} if self.expert_actions else {}
        np.savez(self.tmp / STEPS_FILE, state=np.stack(self.states),
                 environment_state=np.stack(self.environment_states), action=np.stack(self.actions),
                 success=np.array(self.success, dtype=bool), **expert)
        doc = {"v": STAGED_VERSION, **meta, "length": n, "fps": self.fps, "joint_names": self.joint_names,
               "frame_size": {c: list(self.sizes[c]) for c in CAMERAS},
               "image_stats": {c: image_stats(np.concatenate(self.samples[c]), n_frames=len(self.samples[c]))
                               for c in CAMERAS}}
        (self.tmp / EPISODE_FILE).write_text(json.dumps(doc) + "\n")
        for f in self.tmp.iterdir():  # on disk before the rename makes the episode count
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if self.folder.exists():  # a try run again after the run was killed between staging and its record
            shutil.rmtree(self.folder)
        os.replace(self.tmp, self.folder)
        return self.folder

    def abandon(self) -> None:
        for w in self.writers.values():
            try:
                w.close()
            except Exception:  # noqa: BLE001 - the try already failed; its partial folder goes
                pass
        self.writers = {}
        shutil.rmtree(self.tmp, ignore_errors=True)


def image_stats(pixels: np.ndarray, n_frames: int) -> dict[str, Any]:
    """LeRobot's statistics of an RGB camera (datasets/compute_stats.py): per channel, as (3, 1, 1) nested lists,
    values scaled to [0, 1]; ``count`` the frames sampled."""
    x = pixels.astype(np.float64) / 255.0
    out = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0)}
    for q in QUANTILES:
        out[f"q{round(q * 100):02d}"] = np.quantile(x, q, axis=0)
    stats = {k: v.reshape(3, 1, 1).tolist() for k, v in out.items()}
    stats["count"] = [int(n_frames)]  # every frame sampled alike: episodes are weighted by it when pooled
    return stats


def read_staged(folder: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(episode.json, the step arrays: ``state``, ``environment_state``, ``action``, ``success``, and
    ``action_expert`` where the try
    has expert labels) of a staged episode; one-line StagedEpisodeError when it is damaged."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / EPISODE_FILE).read_text())
        with np.load(folder / STEPS_FILE) as z:
            steps = {k: z[k] for k in ("state", "environment_state", "action", "success")}
            if "action_expert" in z.files:
                steps["action_expert"] = z["action_expert"]
    except (OSError, ValueError, KeyError) as e:
        raise StagedEpisodeError(f"staged episode {folder} cannot be read ({' '.join(str(e).split())}); "
                                 f"rerun with --fresh") from None
    if not isinstance(meta, dict) or meta.get("v") != STAGED_VERSION:
        raise StagedEpisodeError(f"staged episode {folder} is not of version {STAGED_VERSION}; rerun with --fresh")
    n = meta.get("length")
    if (not isinstance(n, int) or n < 1 or any(len(v) != n for v in steps.values())
            or any(not (folder / f"{c}.mp4").is_file() for c in CAMERAS)):
        raise StagedEpisodeError(f"staged episode {folder} is incomplete; rerun with --fresh")
    return meta, steps
