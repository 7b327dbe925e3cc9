"""bc-state (track: adapted): the MLP on exact state, run by a runner the backend factory built (ONNX
Runtime, TensorRT or torch; :class:`eval.request.BCStateConfig` assembles it)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from engines.bc_mlp import DEFAULT_WEIGHTS
from engines.onnx_utils import sha256_file
from eval.policies.base import Policy
from eval.training.state_features import ActionHistory, policy_input



def weights_sha256(weights: str | Path | None = None) -> str:
    """sha256 of a weights file (default: the shipped ones): what a run's records and run.json name."""
    return sha256_file(weights or DEFAULT_WEIGHTS)


class BCStatePolicy(Policy):
    name = "bc-state"
    track = "adapted"
    observes = "state"
    batchable = True

    def __init__(self, runner, weights: str | Path | None = None) -> None:
        """``runner``: the model's runner (``{"state": (B, d)} -> {"action": (B, 7)}``); ``weights``: the file it
        was built from, named in the records."""
        super().__init__()
        self.runner = runner
        self.backend = runner.name
        self.weights = Path(weights) if weights else DEFAULT_WEIGHTS
        self.weights_sha256 = weights_sha256(self.weights)
        self.history = ActionHistory()

    def reset(self, instruction: str, seed: int | None = None) -> None:
        self.history.reset()

    def encode(self, observation: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {"state": policy_input(observation["state"], self.history)[None]}

    def decode(self, outputs: Mapping[str, np.ndarray], row: int) -> np.ndarray:
        action = np.array(outputs["action"][row], dtype=np.float32)
        self.history.update(action)  # the scene applies what is returned, so this is what was sent
        return action

    def spawn(self) -> "BCStatePolicy":
        """A policy for another scene: same weights and runner, its own action history and latencies."""
        other = copy.copy(self)
        other.history = ActionHistory()
        other.latencies_ms, other.warmup_ms, other.stage_ms, other.queries = [], [], {}, 0
        return other
