"""Latency in the loop: a measured latency distribution applied as action delay in the simulation.

    python -m eval.orin --model bc-state --replay-latency results/some_run/tries.jsonl ...

The benchmark's own controller is synchronous: the scene waits for every query.
On a robot it does not. With a replayed profile each query is given a latency
drawn from the measured values; its action reaches the arm only at the first
control step (50 ms each) after that latency has passed, and until a newer
action has arrived the arm holds still with the last gripper command. So a CPU
machine shows what a model's Orin latency would do to its success.

A profile is a ``tries.jsonl`` (every try's ``infer_ms``), a ``summary.json`` of
such a run is not enough (it keeps percentiles only), a JSON list of ms, or
``published:LABEL``: the ms/query the benchmark publishes for LABEL on the Orin
(docs/BENCHMARK.md section 8, e.g. ``published:octo-small-1.5``, 327.8 ms), as
one constant latency.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from env.setups import CONTROL_DT_S
from eval.policies.base import Policy

CONTROL_PERIOD_MS = CONTROL_DT_S * 1e3
REPLAY_SEED_OFFSET = 104_729  # the latency draws of a try differ from its other random streams


PUBLISHED_PREFIX = "published:"  # --replay-latency published:LABEL: the spec's own Orin ms/query for LABEL


class LatencyProfileError(ValueError):
    """A latency profile that cannot be replayed (one line)."""


def is_published(profile: str | Path) -> bool:
    return isinstance(profile, str) and profile.startswith(PUBLISHED_PREFIX)


def published_profile(profile: str, published: Mapping[str, float]) -> np.ndarray:
    """``published:LABEL`` as a profile of one latency, from ``published`` (label -> ms per query: the spec's
    section 8, :func:`eval.site.published.orin_ms_per_query`, which the command line reads once)."""
    label = profile[len(PUBLISHED_PREFIX):]
    if label not in published:
        raise LatencyProfileError(f"latency profile {profile}: the spec (docs/BENCHMARK.md section 8) publishes no "
                                  f"ms/query of {label!r}; it does of: {', '.join(published)}")
    return np.asarray([published[label]], dtype=float)


def load_profile(path: str | Path) -> np.ndarray:
    """Per-query latencies (ms) from a tries.jsonl (read as every records file is, :func:`eval.records.read_tries`)
    or a JSON list; a :class:`LatencyProfileError` naming the file (and the line) for anything else."""
    from eval.records import RecordsError, read_tries

    p = Path(path)
    if p.is_dir():
        raise LatencyProfileError(f"latency profile {p} is a folder: name its tries.jsonl")
    if not p.is_file():
        raise LatencyProfileError(f"latency profile {p} does not exist")
    if p.suffix == ".jsonl":
        try:
            values = [v for r in read_tries(p) for v in r.get("infer_ms") or ()]
        except RecordsError as e:
            raise LatencyProfileError(f"latency profile {e}") from None
    else:
        try:
            values = json.loads(p.read_bytes().decode("utf-8"))
        except OSError as e:
            raise LatencyProfileError(f"latency profile {p}: cannot read ({e.strerror or e})") from None
        except UnicodeDecodeError:
            raise LatencyProfileError(f"latency profile {p}: not UTF-8 text (a binary file?): give a run's "
                                      f"tries.jsonl or a JSON list of ms") from None
        except ValueError as e:
            raise LatencyProfileError(f"latency profile {p}: not JSON ({' '.join(str(e).split())}): give a run's "
                                      f"tries.jsonl or a JSON list of ms") from None
        if isinstance(values, dict):
            raise LatencyProfileError(f"latency profile {p}: a JSON object (a summary.json keeps percentiles only): "
                                      f"give the run's tries.jsonl or a JSON list of ms")
        if not isinstance(values, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise LatencyProfileError(f"latency profile {p}: expected a JSON list of ms (numbers) or a tries.jsonl "
                                      f"with infer_ms lists")
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise LatencyProfileError(f"latency profile {p} holds no per-query latencies (infer_ms)")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise LatencyProfileError(f"latency profile {p} holds negative or non-finite latencies")
    return arr


class ReplayLatencyPolicy(Policy):
    """Wraps a policy: each query's action is delayed by a latency drawn from the profile."""

    def __init__(self, inner: Policy, latencies_ms: np.ndarray) -> None:
        super().__init__()
        self.inner = inner
        self.profile = np.asarray(latencies_ms, dtype=float)
        self.name, self.track, self.observes = inner.name, inner.track, inner.observes
        self.backend = getattr(inner, "backend", "python")
        self.note = getattr(inner, "note", None)
        self._restart(None)  # the inner policy is reset by the loop with the try's instruction, never with none here

    def reset(self, instruction: str, seed: int | None = None) -> None:
        self.inner.reset(instruction, seed=seed)
        self._restart(seed)

    def _restart(self, seed: int | None) -> None:
        self.rng = np.random.default_rng(None if seed is None else seed + REPLAY_SEED_OFFSET)
        self.step = 0
        self.pending: list[tuple[int, np.ndarray]] = []  # (step it reaches the arm, action)
        self.current: np.ndarray | None = None
        self.delays: list[int] = []

    def set_start(self, start) -> None:
        self.inner.set_start(start)

    def record_fields(self) -> dict:
        return self.inner.record_fields()

    def reads_observation(self, step: int) -> bool:
        return self.inner.reads_observation(step)

    def act(self, observation: Mapping[str, Any]) -> np.ndarray:
        action = np.asarray(self.inner.query(observation), dtype=np.float32)
        latency = float(self.rng.choice(self.profile))
        # ready within this step's period: no delay; else the first step boundary after it
        delay = max(0, math.ceil(latency / CONTROL_PERIOD_MS) - 1)
        self.delays.append(delay)
        self.pending.append((self.step + delay, action))
        arrived = [a for t, a in self.pending if t <= self.step]
        if arrived:
            self.current = arrived[-1]
            self.pending = [(t, a) for t, a in self.pending if t > self.step]
        self.step += 1
        if arrived:
            return self.current
        # nothing new: the arm holds its pose, the gripper keeps its last command (open before the first)
        return np.array([0, 0, 0, 0, 0, 0, 1 if self.current is None else self.current[6]], dtype=np.float32)
