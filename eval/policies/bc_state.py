"""bc-state (track: adapted): the MLP on exact state, run through ONNX Runtime or torch."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from engines.bc_mlp import DEFAULT_WEIGHTS, export_onnx, load, numpy_forward
from eval.policies.base import Policy
from eval.state_features import ActionHistory, policy_input

BACKENDS = ("ort", "torch")


def onnx_for(weights: Path) -> Path:
    """The ONNX export of a weights file, made once and cached under a name from the weights' sha256."""
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:16]
    root = Path(os.environ.get("SAB_CACHE_DIR") or Path.home() / ".cache" / "shape_assembly_bench")
    path = root / "onnx" / f"bc_state_{digest}.onnx"
    if not path.exists():
        model, config, _ = load(weights)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.onnx")
        export_onnx(model, config, tmp, source=f"{weights.name} sha256 {digest}")
        os.replace(tmp, path)
    return path


class BCStatePolicy(Policy):
    name = "bc-state"
    track = "adapted"
    observes = "state"

    def __init__(self, weights: str | Path | None = None, backend: str = "ort") -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"bc-state backend {backend!r} unknown; valid: {', '.join(BACKENDS)}")
        self.weights = Path(weights) if weights else DEFAULT_WEIGHTS
        self.backend = backend
        self.model, self.config, self.meta = load(self.weights)  # checks shapes and normalisation, one line
        if backend == "ort":
            from engines.runners import OnnxRuntimeRunner

            self.runner = OnnxRuntimeRunner(onnx_for(self.weights)).activate()
        else:
            from engines.runners import CallableRunner

            self.runner = CallableRunner("torch", lambda state: {"action": numpy_forward(self.model, state)}).activate()

        self.history = ActionHistory()

    def reset(self, instruction: str, seed: int | None = None) -> None:
        self.history.reset()

    def act(self, observation: Mapping[str, Any]) -> np.ndarray:
        with self.stage("preprocess"):
            x = policy_input(observation["state"], self.history)[None]
        with self.stage("inference"):
            action = self.runner.infer({"state": x})["action"][0]
        with self.stage("postprocess"):
            self.history.update(action)  # the scene applies what is returned, so this is what was sent
        return action
