"""Policies that misbehave on purpose, loaded by tests as ``--model tests.fault_policies:Name``."""

from __future__ import annotations

import time

import numpy as np

from eval.policies.base import Policy
from eval.policies.scripted import ScriptedPolicy


class NaNPolicy(Policy):
    """Returns a NaN action at its third query."""

    name = "nan-test"
    track = "sanity"

    def reset(self, instruction, seed=None):
        self.n = 0

    def act(self, observation):
        self.n += 1
        a = np.zeros(7, dtype=np.float32)
        if self.n >= 3:
            a[0] = np.nan
        return a


class HangPolicy(Policy):
    """Never returns from its third query, as a hung simulator step would never return."""

    name = "hang-test"
    track = "sanity"

    def reset(self, instruction, seed=None):
        self.n = 0

    def act(self, observation):
        self.n += 1
        if self.n >= 3:
            time.sleep(3600)
        return np.zeros(7, dtype=np.float32)


class SimHangPolicy(Policy):
    """Makes the simulator hang: from its third query on, the scene's physics step never returns (the
    worker's env class is patched in the worker process only)."""

    name = "sim-hang-test"
    track = "sanity"

    def reset(self, instruction, seed=None):
        self.n = 0

    def act(self, observation):
        self.n += 1
        if self.n == 3:
            from env.task import ShapeAssemblyEnv

            ShapeAssemblyEnv._after_simulation_step = lambda self: time.sleep(3600)
        return np.zeros(7, dtype=np.float32)


class HugeActionPolicy(Policy):
    """Returns 1e30 in every component: finite, far outside the controller's range."""

    name = "huge-test"
    track = "sanity"

    def reset(self, instruction, seed=None):
        pass

    def act(self, observation):
        return np.full(7, 1e30, dtype=np.float64)


class RaisePolicy(Policy):
    """Raises at its second query."""

    name = "raise-test"
    track = "sanity"

    def reset(self, instruction, seed=None):
        self.n = 0

    def act(self, observation):
        self.n += 1
        if self.n >= 2:
            raise RuntimeError("the policy's server went away")
        return np.zeros(7, dtype=np.float32)


class LosesConnectionOnce(Policy):
    """Holds still; the first of its kind built in a process loses its model server's connection at its third
    query (as a dropped WebSocket would), the ones built after it do not."""

    name = "loses-connection-once-test"
    track = "sanity"
    built = 0

    def __init__(self):
        super().__init__()
        LosesConnectionOnce.built += 1
        self.first = LosesConnectionOnce.built == 1

    def reset(self, instruction, seed=None):
        self.n = 0

    def act(self, observation):
        from eval.policies.base import ConnectionLost

        self.n += 1
        if self.first and self.n == 3:
            raise ConnectionLost("the connection to the model server at ws://127.0.0.1:9 dropped (test)")
        return np.array([0, 0, 0, 0, 0, 0, 1], dtype=np.float32)


class AlwaysLosesConnection(LosesConnectionOnce):
    """Loses its connection at the third query of every try, on every new connection too."""

    name = "always-loses-connection-test"

    def __init__(self):
        super().__init__()
        self.first = True


class TorchThreadsPolicy(ScriptedPolicy):
    """Writes the torch thread count its worker runs with (to ``$SAB_TEST_TORCH_THREADS_OUT``) once per try, when
    the rollout hands it the try's start; drives the arm as the scripted reference does, so that an A01 try ends
    once the block is in (about 130 steps) instead of running all 300."""

    name = "torch-threads-test"
    track = "sanity"

    def set_start(self, start):
        import os

        import torch

        with open(os.environ["SAB_TEST_TORCH_THREADS_OUT"], "a") as f:
            f.write(f"{torch.get_num_threads()}\n")
        super().set_start(start)
