"""The record of one try (one line of ``tries.jsonl``), typed, written in one place.

:class:`TryRecord` is what the rollout returns for a finished try and what the executors return for a try
that could not finish (the watchdog stopped it, or its Ray actor died twice): ``finished=False``, failed,
with the flag saying why. :meth:`TryRecord.to_json` gives the JSON object a run appends; its keys are those
of record version 2, so files written before this class existed read the same. :func:`read_tries` is the one
reader of a records file (``tries.jsonl``, ``batches.jsonl``) that resume, report and site use.
"""

from __future__ import annotations

import functools
import json
import os
import platform
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from env.predicate import SUCCESS_PREDICATE_VERSION
from env.setups import CONTROL_DT_S

RECORD_VERSION = 2  # v2: success predicate v2, success_raw beside the scored success
# the flag of a try that could not finish, by the stage it hung in (the watchdog), and a lost Ray actor's
HANG_FLAGS = {"policy": "policy_hang", "sim": "sim_hang"}
UNFINISHED_FLAGS = (*HANG_FLAGS.values(), "actor_died")
# every flag a record can hold, in the order reports list them
FLAG_NAMES = ("wrong_hole", "rim", "penetration", "glitch", "dropped", *UNFINISHED_FLAGS)
# host-to-device traffic per model query (eval.policies.base.Policy.host_traffic), beside infer_ms: mean bytes
# copied from host to device per timed query, and the median device time of those copies (ms); absent where
# the runner reports none (JAX, a bare ONNX Runtime runner, a served model); Octo on ONNX Runtime on the CPU has
# bytes 0 and no time. Single-scene tries only, as infer_ms (a batch's tries share its calls)
HOST_TRAFFIC_FIELDS = ("h2d_bytes_per_query", "h2d_ms_p50")


@functools.lru_cache(maxsize=1)
def machine_info() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": str(os.cpu_count()), "os": platform.platform(), "python": platform.python_version()}


def _sig3(values) -> list[float]:
    return [float(f"{x:.3g}") for x in values]  # 3 significant digits: enough for run percentiles


@dataclass(frozen=True)
class TryRecord:
    setup: str
    try_index: int
    seed: int
    split: str
    disturbance: str | None  # the setup's disturbance (None: none)
    tasklist_sha256: str | None
    success: bool = False  # scored: the predicate held and no vetoing flag was raised
    success_raw: bool = False  # the predicate's own verdict (a vetoed try has True here, False above)
    flags: tuple[str, ...] = ()
    finished: bool = True  # False: stopped by the watchdog or lost with its actor (see the flags)
    target: Any = None  # the start's target block (its shape, or "all" on the full board)
    max_plate_overlap_mm: float = 0.0  # deepest plate overlap of the try
    max_free_energy_gain_mj: float = 0.0  # most kinetic energy a block gained untouched
    steps: int | None = None
    # actions with a component outside the controller's [-1, 1], which it clips (ManiSkill's normalised
    # end-effector controller): a policy that saturates or emits nonsense shows here
    actions_clipped: int = 0
    blocks_inserted: int = 0
    disturbance_step: int | None = None  # the control step the setup's disturbance fired at (None: not fired)
    backend: str | None = None
    weights_sha256: str | None = None
    note: str | None = None
    wall_s: float = 0.0
    infer_ms: tuple[float, ...] = ()  # every query after warm-up (empty for batched scenes: see batches.jsonl)
    warmup_ms: tuple[float, ...] = ()  # a fresh policy's first queries
    infer_queries: int = 0  # all queries, warm-up included
    # host-to-device traffic of the queries in infer_ms (HOST_TRAFFIC_FIELDS; None: not reported). The policy
    # hands them over with its fields (Policy.record_fields): taken out of policy_fields into these
    h2d_bytes_per_query: float | None = None
    h2d_ms_p50: float | None = None
    step_ms: dict[str, float] = field(default_factory=dict)  # per-stage totals of the try's control steps
    num_envs: int = 1  # scenes stepped together (written when more than one)
    model: str | None = None
    track: str | None = None
    arm: str | None = None
    precision: str | None = None  # of the model's runtime (None: runs in Python)
    profile: str | None = None  # a served model's profile (eval.remote.profiles)
    appearance: int | None = None  # the appearance version of a camera model's frames (env.appearance)
    weights: dict | None = None  # the released files the model loaded: repo, commit, each file's sha256
    policy_fields: dict[str, Any] = field(default_factory=dict)  # what the policy adds (Policy.record_fields)

    def __post_init__(self) -> None:
        fields = dict(self.policy_fields)
        for key in HOST_TRAFFIC_FIELDS:
            value = fields.pop(key, None)
            if getattr(self, key) is None and value is not None:
                object.__setattr__(self, key, value)
            value = getattr(self, key)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
                        or not np.isfinite(value) or value < 0:
                    raise ValueError(f"try record: {key} must be a finite number >= 0 or None, got {value!r}")
                object.__setattr__(self, key, float(value))
        object.__setattr__(self, "policy_fields", fields)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "v": RECORD_VERSION, "setup": self.setup, "try": self.try_index, "seed": self.seed, "split": self.split,
            "predicate": SUCCESS_PREDICATE_VERSION, "success": self.success, "success_raw": self.success_raw,
            "flags": sorted(self.flags), "dropped": "dropped" in self.flags, "steps": self.steps,
            "time_s": round(self.steps * CONTROL_DT_S, 3) if self.steps is not None else None,
            "disturbance": self.disturbance, "disturbance_fired": self.disturbance_step is not None,
            "tasklist_sha256": self.tasklist_sha256, "machine": machine_info(), "infer_queries": self.infer_queries,
            "infer_ms": _sig3(self.infer_ms),
            "infer_ms_mean": round(float(np.mean(self.infer_ms)), 4) if self.infer_ms else None,
        }
        for key in HOST_TRAFFIC_FIELDS:  # beside the latency, only where the runner reported them
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.finished:
            d.update({
                "target": self.target,
                "max_plate_overlap_mm": round(self.max_plate_overlap_mm, 3),
                "max_free_energy_gain_mj": round(self.max_free_energy_gain_mj, 3),
                "actions_clipped": self.actions_clipped, "blocks_inserted": self.blocks_inserted,
                "disturbance_step": self.disturbance_step, "backend": self.backend,
                "weights_sha256": self.weights_sha256, "note": self.note, "wall_s": round(self.wall_s, 3),
                "infer_ms_p99": round(float(np.percentile(self.infer_ms, 99)), 4) if self.infer_ms else None,
                "warmup_ms": _sig3(self.warmup_ms),
                "step_ms": {k: round(v, 3) for k, v in self.step_ms.items()},
            })
        if self.finished:
            d.update(self.policy_fields)
        if self.num_envs > 1:
            d["num_envs"] = self.num_envs
        for key in ("model", "track", "arm", "precision", "profile", "weights", "appearance"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d


class RecordsError(ValueError):
    """A records file that cannot be read as records; the message names the file, the line and what to do."""


def read_tries(path) -> list[dict]:
    """The records of a ``tries.jsonl`` (or ``batches.jsonl``): one JSON object per line, blank lines skipped.

    Every record is written with its newline in one write (``eval.run_folder.TryLog``), so only a last line
    without a newline can be torn by a kill: when it is not a whole JSON object it is ignored (and cut off
    when the run resumes). Any other line that is not a JSON object, the last one included when it ends in a
    newline, is a damaged record: :class:`RecordsError` names the file and the line.
    """
    from pathlib import Path

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecordsError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise RecordsError(f"{path}: not UTF-8 text (a damaged records file): move it away and rerun") from None
    except OSError as e:
        raise RecordsError(f"{path}: cannot read ({e.strerror or e})") from None
    lines = text.split("\n")  # the last item is "" when the file ends in a newline, else an unterminated tail
    out: list[dict] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        record = _json_object(line)
        if record is None:
            if i == len(lines) - 1:
                break  # a torn last line: no newline, not a whole record
            raise RecordsError(
                f"{path}: line {i + 1} is not a JSON record (a damaged record, not a torn last line, which has "
                f"no newline): delete that line and rerun to redo its try; the other records are kept")
        out.append(record)
    return out


def torn_tail(data: bytes) -> int:
    """Where a records file's torn last line starts (``len(data)`` when it has none): what resume cuts off."""
    if not data or data.endswith(b"\n"):
        return len(data)
    start = data.rfind(b"\n") + 1
    try:
        whole = _json_object(data[start:].decode("utf-8")) is not None
    except UnicodeDecodeError:
        whole = False
    return len(data) if whole else start


def _json_object(line: str) -> dict | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None
