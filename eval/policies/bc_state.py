"""bc-state (track: adapted): the MLP on exact state, run through ONNX Runtime or torch."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from engines.bc_mlp import DEFAULT_WEIGHTS, export_onnx, load, numpy_forward
from engines.backends import onnx_cache_dir
from engines.onnx_utils import BadModelFileError, check_onnx_file, sha256_file
from eval.policies.base import Policy
from eval.training.state_features import ActionHistory, policy_input

BACKENDS = ("ort", "trt", "torch")
TRT_PRECISION = "fp32"  # a 0.3 MB MLP: fp16 would save nothing measurable and cost sub-millimetre precision
TRT_BATCH_MAX = 256  # the engine's profile covers every --num-envs batch up to this


def weights_sha256(weights: str | Path | None = None) -> str:
    """sha256 of a weights file (default: the shipped ones): what a run's records and run.json name."""
    return sha256_file(weights or DEFAULT_WEIGHTS)


def onnx_for(weights: Path, sha256: str) -> Path:
    """The ONNX export of a weights file, made once and cached under a name from the weights' sha256; a
    cached file that fails the ONNX check (truncated, corrupt) is exported again."""
    digest = sha256[:16]
    path = onnx_cache_dir() / f"bc_state_{digest}.onnx"
    if path.exists():
        try:
            check_onnx_file(path)
        except BadModelFileError as e:
            print(f"cached ONNX export {path} fails its check ({str(e).split('; ')[0]}); exporting it again from "
                  f"{weights}", file=sys.stderr)
            path.unlink()
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
    batchable = True

    def __init__(self, weights: str | Path | None = None, backend: str = "ort") -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"bc-state backend {backend!r} unknown; valid: {', '.join(BACKENDS)}")
        self.weights = Path(weights) if weights else DEFAULT_WEIGHTS
        self.backend = backend
        self.model, self.config, self.meta = load(self.weights)  # checks shapes and normalisation, one line
        self.weights_sha256 = weights_sha256(self.weights)
        if backend in ("ort", "trt"):
            from engines.backends import BackendSpec, make_runner, unavailable_reason

            reason = unavailable_reason(backend)  # before any export: one line saying why not
            if reason:
                raise ValueError(f"bc-state backend {backend!r} {reason}")
            spec = BackendSpec(backend, precision=TRT_PRECISION, max_batch=TRT_BATCH_MAX, threads=1)
            self.runner = make_runner(onnx_for(self.weights, self.weights_sha256), spec)
        else:
            from engines.runners import CallableRunner

            self.runner = CallableRunner("torch", lambda state: {"action": numpy_forward(self.model, state)}).activate()

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
