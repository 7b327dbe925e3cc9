"""bc-camera (track: adapted): a convolutional estimate of the scene's state from both cameras, the joint
positions and the instruction, and bc-state's network acting on it with the policy's own action history
(engines.bc_camera), run by a runner the backend factory built (ONNX Runtime, TensorRT or torch;
:class:`eval.request.BCCameraConfig` assembles it). It never observes the simulator's state.

Each step's frames go to the runner as the scene rendered them: numpy views on the CPU, the rendered CUDA
tensors on a GPU (the graph averages them down itself, so nothing is resized or copied on the host). The
policy asks at every step. The cameras of ``config.first_frame_cameras`` (the third person, from version 11 on)
go to the runner as they were at the try's first step: the policy keeps that frame, copied where it was
rendered (a CUDA tensor stays on the GPU), since the renderer reuses its buffers; where the network reads the
block away from the gripper at the first step (``far_block_first_frame``, version 13), the other cameras' first
frames go to it as well, beside the step's (``<camera>_first``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from engines.bc_camera import DEFAULT_WEIGHTS, FIRST_SUFFIX, BCCameraNetConfig, instruction_one_hot
from engines.onnx_utils import sha256_file
from eval.policies.base import BadActionError, Policy
from eval.training.state_features import ActionHistory


class BCCameraPolicy(Policy):
    name = "bc-camera"
    track = "adapted"
    observes = "cameras"
    batchable = True

    def __init__(self, runner, config: BCCameraNetConfig, weights: str | Path | None = None) -> None:
        """``runner``: the model's runner (``{"third_person", "wrist", "low_dim"} -> {"actions": (B, chunk, 7)}``);
        ``config``: the network's (its weights file's); ``weights``: the file, named in the records."""
        super().__init__()
        self.runner, self.config = runner, config
        self.backend = runner.name
        self.weights = Path(weights) if weights else DEFAULT_WEIGHTS
        self.weights_sha256 = sha256_file(self.weights)
        self.history = ActionHistory()
        self._instruction: np.ndarray | None = None
        self._first_frames: dict[str, Any] = {}

    def reset(self, instruction: str, seed: int | None = None) -> None:
        self.history.reset()
        self._instruction = instruction_one_hot(instruction, self.config)
        self._first_frames = {}

    def encode(self, observation: Mapping[str, Any]) -> dict[str, Any]:
        if self._instruction is None:
            raise RuntimeError("bc-camera queried before reset")
        images = observation.get("images")
        if images is None:
            raise RuntimeError("bc-camera reads every step's frames, and this step was not rendered")
        proprio = np.asarray(observation["proprio"], np.float32)
        if proprio.shape != (self.config.proprio_dim,):
            raise BadActionError(f"bc-camera was trained on {self.config.proprio_dim} joint positions; this arm "
                                 f"gives {proprio.shape[0] if proprio.ndim == 1 else proprio.shape}")
        low = np.concatenate([proprio, self._instruction, self.history.vector()])[None]
        for name in (*self.config.first_frame_cameras, *self.config.first_inputs):
            if name not in self._first_frames:
                frame = images[name]
                self._first_frames[name] = frame.copy() if isinstance(frame, np.ndarray) else frame.clone()
        seen = {name: (self._first_frames[name] if name in self.config.first_frame_cameras else images[name])[None]
                for name in ("third_person", "wrist")}
        first = {name + FIRST_SUFFIX: self._first_frames[name][None] for name in self.config.first_inputs}
        return {**seen, "low_dim": low, **first}

    def decode(self, outputs: Mapping[str, np.ndarray] | None, row: int) -> np.ndarray:
        action = np.array(outputs["actions"][row][0], dtype=np.float32)
        self.history.update(action)  # the scene applies what is returned, so this is what was sent
        return action

    def prepare_batch(self, n: int) -> None:
        """One call at batch n before the try (ONNX Runtime's and TensorRT's first run allocates)."""
        from engines.bc_camera import dummy_inputs

        self.infer(dummy_inputs(self.config, n))

    def spawn(self) -> "BCCameraPolicy":
        """A policy for another scene: same weights and runner, its own history, instruction and latencies."""
        other = copy.copy(self)
        other.history = ActionHistory()
        other._instruction = None
        other._first_frames = {}
        other.latencies_ms, other.warmup_ms, other.stage_ms, other.queries = [], [], {}, 0
        return other
