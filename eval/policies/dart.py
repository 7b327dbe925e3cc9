"""The scripted reference, perturbed (DART, Laskey et al. 2017): its action plus Gaussian noise is executed, and
the reference labels every state reached with its clean action.

The noise (std ``noise`` per motion unit) is added to the six motion components only, never the gripper's
command, clipped to [-1, 1] as the controller clips them, and seeded by the try, so that a try is executed the
same way whichever recording runs it. The reference runs in its labeler mode (``ScriptedPolicy(labeler=True)``):
its phase is read from the scene and the last executed command at every step, not from its own history, so a
state gets one label whoever drove the arm there. Both recordings of demonstrations run it: ``python -m
eval.record --noise S`` (a LeRobot dataset: ``action`` what was executed, ``action.expert`` the label) and
``python -m eval.training.demos --noise S`` (bc-state's HDF5 files, where a learner may act instead: DAgger).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from eval.policies.base import ACTION_BOUND, Policy

NOISE_SEED_OFFSET = 7_919  # the noise stream of a try differs from its start's stream
MOTION = slice(0, 6)  # dx dy dz droll dpitch dyaw: the components the noise perturbs (not the gripper, 6)


class NoisyReference(Policy):
    """The reference in labeler mode labels each state (:meth:`expert_label`); its label plus the try's noise is
    executed. Subclasses may execute another action before the noise (:meth:`label`, :meth:`perturbed` and
    :meth:`observe_executed` are the steps of :meth:`act`)."""

    name = "scripted-dart"
    track = "reference"
    observes = "state"

    def __init__(self, setup, noise: float) -> None:
        super().__init__()
        self.setup, self.noise = setup, noise
        self.last_label: np.ndarray | None = None

    def reset(self, instruction: str, seed: int | None = None) -> None:
        from eval.policies.scripted import ScriptedPolicy

        self.rng = np.random.default_rng(None if seed is None else seed + NOISE_SEED_OFFSET)
        self.expert = ScriptedPolicy(clearance=self.setup.clearance_m, latency_steps=self.setup.latency_steps,
                                     labeler=True)
        self.expert.reset(instruction)
        self.last_label = None

    def act(self, observation: Mapping[str, Any]) -> np.ndarray:
        executed = self.perturbed(self.label(observation))
        self.observe_executed(executed)
        return executed

    def expert_label(self) -> np.ndarray | None:
        return self.last_label

    def label(self, observation: Mapping[str, Any]) -> np.ndarray:
        """The reference's action for the state observed: this step's label."""
        self.last_label = self.expert.act(observation)
        return self.last_label

    def perturbed(self, action: np.ndarray) -> np.ndarray:
        """``action`` plus the try's next noise on the motion components (a copy); itself without noise."""
        if self.noise <= 0:
            return action
        out = action.copy()
        out[MOTION] = np.clip(out[MOTION] + self.rng.normal(0.0, self.noise, 6), -ACTION_BOUND, ACTION_BOUND)
        return out

    def observe_executed(self, executed: np.ndarray) -> None:
        """Tell the labeler what was really sent this step: its gripper phase follows the executed command, and
        on a latency setup its predictor must count the pending command sent, not the one it wished."""
        from eval.policies.scripted import PENDING_REACH, POS_SCALE, ROT_SCALE

        if self.expert.latency_steps and executed is not self.last_label:
            from scipy.spatial.transform import Rotation

            self.expert.pending[-1] = (executed[:3] * POS_SCALE,
                                       Rotation.from_rotvec(PENDING_REACH * executed[3:6] * ROT_SCALE))
        self.expert.observe_executed(executed)
