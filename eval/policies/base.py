"""One interface for every policy, whatever its track.

A policy is reset with the try's instruction, then asked for one action per
control step. It declares its track (spec section 4) and what it observes:
``state`` policies read the exact simulator state, ``cameras`` policies read
the two camera images, proprioception and the instruction. Every query's
latency is recorded by :meth:`Policy.query`, which the runner calls: the
first ``warmup_queries`` of a policy object (JIT compilation, caches, lazy
allocation) go to ``warmup_ms``, the rest to ``latencies_ms``. A policy may
time its own stages with ``with self.stage("preprocess"): ...`` (also
``inference`` and ``postprocess``) for the per-step breakdown.
"""

from __future__ import annotations

import abc
import time
from contextlib import contextmanager
from typing import Any, Mapping

import numpy as np

TRACKS = ("reference", "sanity", "frozen", "adapted")
ACTION_DIM = 7  # end-effector delta xyz, delta roll-pitch-yaw, gripper (+1 open, -1 close)
ACTION_BOUND = 1.0  # the controller's normalised range is [-1, 1] in every component; it clips the rest


class BadActionError(RuntimeError):
    """A policy returned an action the scene cannot apply (NaN, wrong shape)."""


def check_action(name: str, action) -> np.ndarray:
    """The action as float32 (7,), or one-line BadActionError."""
    action = np.asarray(action, dtype=np.float32)
    if action.shape != (ACTION_DIM,):
        raise BadActionError(f"{name} returned an action of shape {action.shape}, expected ({ACTION_DIM},)")
    if not np.all(np.isfinite(action)):
        raise BadActionError(f"{name} returned a non-finite action {action.tolist()}")
    return action


class Policy(abc.ABC):
    name: str = "policy"
    track: str = "reference"
    observes: str = "state"  # "state" | "cameras"
    backend: str = "python"
    weights_sha256: str | None = None  # of the weights file a learned policy loaded: records name it
    warmup_queries: int = 3
    queries: int = 0
    # batchable policies split a query into encode (observation -> runner feeds with a batch axis of 1),
    # one ``self.runner.infer`` and decode (row i of the outputs -> action), so that the scenes of a
    # GPU-parallel batch (eval.batch) share one runner call; ``spawn`` gives a policy for another scene
    # that shares the runner and weights
    batchable: bool = False

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.warmup_ms: list[float] = []
        self.stage_ms: dict[str, float] = {}  # stages of the last query
        self.queries = 0  # over the object's life: the first warmup_queries are warm-up

    @contextmanager
    def stage(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stage_ms[name] = self.stage_ms.get(name, 0.0) + (time.perf_counter() - t0) * 1e3

    @abc.abstractmethod
    def reset(self, instruction: str, seed: int | None = None) -> None:
        """Start a new try; ``seed`` seeds any randomness of the policy for this try."""

    @abc.abstractmethod
    def act(self, observation: Mapping[str, Any]) -> np.ndarray:
        """Return one normalised action of shape (7,) in [-1, 1]."""

    def query(self, observation: Mapping[str, Any]) -> np.ndarray:
        """Timed, checked call of :meth:`act`."""
        self.stage_ms = {}
        t0 = time.perf_counter()
        action = self.act(observation)
        ms = (time.perf_counter() - t0) * 1e3
        (self.warmup_ms if self.queries < self.warmup_queries else self.latencies_ms).append(ms)
        self.queries += 1
        return check_action(self.name, action)

    def encode(self, observation: Mapping[str, Any]) -> dict[str, np.ndarray]:
        raise NotImplementedError(f"{self.name} is not batchable")

    def decode(self, outputs: Mapping[str, np.ndarray], row: int) -> np.ndarray:
        raise NotImplementedError(f"{self.name} is not batchable")

    def spawn(self) -> "Policy":
        raise NotImplementedError(f"{self.name} is not batchable")
