"""Sanity track: policies that must not pass the benchmark by chance."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from eval.policies.base import ACTION_DIM, HOLD_ACTION, Policy


class RandomPolicy(Policy):
    """Uniform random normalised actions; seeded per try so runs repeat exactly."""

    name = "random"
    track = "sanity"
    observes = "state"  # reads nothing, but needs no cameras

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def reset(self, instruction: str, seed: int | None = None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)

    def act(self, observation: Mapping[str, Any]) -> np.ndarray:
        return self.rng.uniform(-1.0, 1.0, ACTION_DIM).astype(np.float32)


class HoldPolicy(Policy):
    """Holds the arm still with the gripper open."""

    name = "hold"
    track = "sanity"
    observes = "state"

    def reset(self, instruction: str, seed: int | None = None) -> None:
        pass

    def act(self, observation: Mapping[str, Any]) -> np.ndarray:
        return HOLD_ACTION.copy()
