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

Beside each timed query's latency the host-to-device traffic of its model call is kept: the bytes copied
from host to device and the device time of those copies, as the policy's runner reports them after a call
(``last_h2d_bytes``, ``last_h2d_ms``: TensorRT runners and :class:`engines.octo.runners.OnnxOcto`, which
says 0 bytes and no time on ONNX Runtime on the CPU). :meth:`Policy.record_fields` gives the try's summary,
``h2d_bytes_per_query`` (mean) and ``h2d_ms_p50``, which the try record holds beside ``infer_ms``
(:class:`eval.records.TryRecord`); a runner that reports nothing (JAX, a served model) gives neither.
"""

from __future__ import annotations

import abc
import time
from contextlib import contextmanager
from typing import Any, Mapping, Sequence

import numpy as np

from engines.zero_copy import concat_rows
from env import setups as env_setups

TRACKS = ("reference", "sanity", "frozen", "adapted")
ACTION_DIM = 7  # end-effector delta xyz, delta roll-pitch-yaw, gripper (+1 open, -1 close)
ACTION_BOUND = 1.0  # the controller's normalised range is [-1, 1] in every component; it clips the rest
# the arm held still with the gripper open: what the hold policy sends, what scenes whose try has ended are
# stepped with while the others of their batch go on, and the "last action" before a try's first
HOLD_ACTION = np.array(env_setups.HOLD_ACTION, dtype=np.float32)
HOLD_ACTION.setflags(write=False)


class BadActionError(RuntimeError):
    """A policy returned an action the scene cannot apply (NaN, wrong shape)."""


class ConnectionLost(BadActionError):
    """A policy lost the connection to its model (a server): new policies, with new connections, may go on.
    The worker runs the try once more on them and flags it ``server_error``; a second loss stops the run."""


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
    # batchable policies split a query into encode (observation -> runner feeds with a batch axis of 1, or None
    # when this step's action needs no model call, e.g. served from a predicted chunk), one ``infer`` for the
    # stacked feeds of every scene that needs one, and decode (row i of the outputs, or None -> action), so
    # that the scenes of a batch (eval.rollout) share one model call; ``spawn`` gives a policy for another
    # scene that shares the runner and weights
    batchable: bool = False
    _h2d_of: list | None = None  # the latencies_ms list the host-traffic samples go with (record_latency)

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.warmup_ms: list[float] = []
        self.stage_ms: dict[str, float] = {}  # stages of the last query
        self.queries = 0  # over the object's life: the first warmup_queries are warm-up
        self._h2d: list[tuple[int | None, float | None]] = []  # (bytes, ms) of each query in latencies_ms
        self._h2d_of: list | None = None  # the latencies_ms list _h2d goes with (the rollout gives a new one per try)

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

    def set_start(self, start: Any) -> None:
        """The try's start (:class:`env.starts.Start`), given by the rollout just before ``reset``: what a
        policy may know of its try besides the instruction (Octo's goal image rendered from it). Ignored by
        default; a wrapper passes it on."""

    def act(self, observation: Mapping[str, Any]) -> np.ndarray:
        """Return one normalised action of shape (7,) in [-1, 1]. Batchable policies need not define it."""
        if not self.batchable:
            raise NotImplementedError(f"{self.name} defines neither act nor encode/infer/decode")
        feeds = self.encode(observation)
        return self.decode(None if feeds is None else self.infer(feeds), 0)

    def expert_label(self) -> np.ndarray | None:
        """The action an expert gives the state of the last query where that is not the action returned (the
        scripted reference's clean action while its perturbed one is executed: eval.policies.dart); None: the
        action returned is its own label. A recorded try keeps it beside the action (``action.expert``)."""
        return None

    def reads_observation(self, step: int) -> bool:
        """Whether the observation of control step ``step`` of a try (0: the one after reset) is read. The
        rollout renders the cameras only for steps some policy reads; the others get no images."""
        return True

    def record_fields(self) -> dict[str, Any]:
        """Fields this policy adds to its try's record (JSON-ready): a served model's round trips, for one. By
        default the try's host-to-device traffic per timed query (:meth:`host_traffic`); subclasses that add
        their own fields keep these (``{**super().record_fields(), ...}``)."""
        return self.host_traffic()

    def last_h2d(self) -> tuple[int | None, float | None]:
        """(bytes, ms) its runner copied from host to device in its last call, as the runner reports them
        (``last_h2d_bytes``, ``last_h2d_ms``: TensorRT runners, Octo's graph pair); (None, None) where it does not
        (a bare ONNX Runtime or JAX runner, no runner)."""
        runner = getattr(self, "runner", None)
        return getattr(runner, "last_h2d_bytes", None), getattr(runner, "last_h2d_ms", None)

    def host_traffic(self) -> dict[str, Any]:
        """``h2d_bytes_per_query``: mean host-to-device bytes per timed query (those in ``latencies_ms``, warm-up
        excluded) and ``h2d_ms_p50``: the median device time of those copies (ms); each only when every such
        query's runner reported it (ONNX Runtime on the CPU: bytes 0, no time)."""
        samples = self._h2d if self._h2d_of is self.latencies_ms else []
        samples = samples[-len(self.latencies_ms):] if self.latencies_ms else []
        out: dict[str, Any] = {}
        nbytes, ms = [b for b, _ in samples], [t for _, t in samples]
        if samples and None not in nbytes:
            out["h2d_bytes_per_query"] = round(float(np.mean(nbytes)), 1)
        if samples and None not in ms:
            out["h2d_ms_p50"] = float(f"{float(np.median(ms)):.3g}")  # 3 significant digits, as infer_ms
        return out

    def moved_image_bytes(self) -> int:
        """Image bytes the policy's runner has moved between host and device so far (0: none, or no runner
        that could); the rollout reports them per step beside the scenes' own."""
        copies = getattr(getattr(self, "runner", None), "copies", None)
        return 0 if copies is None else copies.h2d_bytes + copies.d2h_bytes

    def prepare_batch(self, n: int) -> None:
        """Called once before a rollout of ``n`` scenes: compile or warm the model for that batch (untimed)."""

    def record_latency(self, ms: float, h2d: tuple[int | None, float | None] = (None, None)) -> None:
        """One query's time: warm-up for the first ``warmup_queries`` of this object, latency after; ``h2d``:
        the (bytes, ms) its model call copied from host to device (:meth:`last_h2d`), kept beside a latency."""
        if self.queries < self.warmup_queries:
            self.warmup_ms.append(ms)
        else:
            if self._h2d_of is not self.latencies_ms:  # a new list (a new try, a spawned policy): start again
                self._h2d, self._h2d_of = [], self.latencies_ms
            self.latencies_ms.append(ms)
            self._h2d.append(h2d)
            del self._h2d[:-len(self.latencies_ms)]  # one sample per latency, whatever emptied the list
        self.queries += 1

    def query(self, observation: Mapping[str, Any]) -> np.ndarray:
        """Timed, checked action for one scene (a batch of one, as the rollout asks a batch)."""
        actions, _, ran = query_members([self], [observation])
        return actions[0]

    def encode(self, observation: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
        raise NotImplementedError(f"{self.name} is not batchable")

    def infer(self, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """One model call for stacked feeds (batch first); by default the policy's runner."""
        return self.runner.infer(feeds)

    def decode(self, outputs: Mapping[str, np.ndarray] | None, row: int) -> np.ndarray:
        raise NotImplementedError(f"{self.name} is not batchable")

    def spawn(self) -> "Policy":
        raise NotImplementedError(f"{self.name} is not batchable")


def query_members(members: Sequence[Policy], observations: Sequence[Mapping[str, Any]]
                  ) -> tuple[np.ndarray, dict[str, float], list[bool]]:
    """Actions (n, 7) of n scenes' policies, the query's stage times (ms), and which members ran the model.

    Batchable policies (all of one kind, sharing a runner) make one model call for the scenes that need one;
    others are asked scene by scene. A member's latency is recorded for the queries it ran the model in:
    the whole query's time (for a batch, the batched call's, shared by its rows)."""
    lead = members[0]
    if not lead.batchable:
        actions, stage = [], {}
        for m, o in zip(members, observations):
            m.stage_ms = {}
            t0 = time.perf_counter()
            action = m.act(o)
            m.record_latency((time.perf_counter() - t0) * 1e3)
            actions.append(check_action(m.name, action))
            for k, v in m.stage_ms.items():
                stage[k] = stage.get(k, 0.0) + v
        return np.stack(actions), stage, [True] * len(members)
    lead.stage_ms = {}
    t0 = time.perf_counter()
    with lead.stage("preprocess"):
        parts = [m.encode(o) for m, o in zip(members, observations)]
    ran = [p is not None for p in parts]
    outputs, rows, h2d = None, {}, (None, None)
    if any(ran):
        with lead.stage("preprocess"):
            rows = {i: r for r, i in enumerate(i for i, p in enumerate(parts) if p is not None)}
            used = [p for p in parts if p is not None]
            feeds = {k: concat_rows([p[k] for p in used]) for k in used[0]}
        with lead.stage("inference"):
            outputs = lead.infer(feeds)
        h2d = lead.last_h2d()
    with lead.stage("postprocess"):
        actions = [check_action(lead.name, m.decode(outputs if i in rows else None, rows.get(i, -1)))
                   for i, m in enumerate(members)]
    ms = (time.perf_counter() - t0) * 1e3
    for m, r in zip(members, ran):
        if r:
            m.record_latency(ms, h2d)
    return np.stack(actions), dict(lead.stage_ms), ran
