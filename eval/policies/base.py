"""One interface for every policy, whatever its track.

A policy is reset with the try's instruction, then asked for one action per
control step. It declares its track (spec section 4) and what it observes:
``state`` policies read the exact simulator state, ``cameras`` policies read
the two camera images, proprioception and the instruction. Every query's
latency is recorded by :meth:`Policy.query`, which the runner calls.
"""

from __future__ import annotations

import abc
import time
from typing import Any, Mapping

import numpy as np

TRACKS = ("reference", "sanity", "frozen", "adapted")
ACTION_DIM = 7  # end-effector delta xyz, delta roll-pitch-yaw, gripper (+1 open, -1 close)


class BadActionError(RuntimeError):
    """A policy returned an action the scene cannot apply (NaN, wrong shape)."""


class Policy(abc.ABC):
    name: str = "policy"
    track: str = "reference"
    observes: str = "state"  # "state" | "cameras"
    backend: str = "python"

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []

    @abc.abstractmethod
    def reset(self, instruction: str, seed: int | None = None) -> None:
        """Start a new try; ``seed`` seeds any randomness of the policy for this try."""

    @abc.abstractmethod
    def act(self, observation: Mapping[str, Any]) -> np.ndarray:
        """Return one normalised action of shape (7,) in [-1, 1]."""

    def query(self, observation: Mapping[str, Any]) -> np.ndarray:
        """Timed, checked call of :meth:`act`."""
        t0 = time.perf_counter()
        action = self.act(observation)
        self.latencies_ms.append((time.perf_counter() - t0) * 1e3)
        action = np.asarray(action, dtype=np.float32)
        if action.shape != (ACTION_DIM,):
            raise BadActionError(f"{self.name} returned an action of shape {action.shape}, expected ({ACTION_DIM},)")
        if not np.all(np.isfinite(action)):
            raise BadActionError(f"{self.name} returned a non-finite action {action.tolist()}")
        return action
