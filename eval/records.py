"""The record of one try (one line of ``tries.jsonl``), typed, written in one place.

:class:`TryRecord` is what the rollout returns for a finished try and what the executors return for a try
that could not finish (the watchdog stopped it, or its Ray actor died twice): ``finished=False``, failed,
with the flag saying why. :meth:`TryRecord.to_json` gives the JSON object a run appends; its keys are those
of record version 2, so files written before this class existed read the same. :func:`read_tries` is the one
reader of a records file (``tries.jsonl``, ``batches.jsonl``) that resume, report, site and the latency replay
use; it checks every field a reader reads against :data:`TRY_FIELDS` / :data:`BATCH_FIELDS` (the one
definition of a record's types), so a damaged field is named where it is read and never reaches a number.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from env.predicate import SUCCESS_PREDICATE_VERSION
from env.setups import CONTROL_DT_S, SETUPS

RECORD_VERSION = 2  # v2: success predicate v2, success_raw beside the scored success
# the flag of a try that could not finish, by the stage it hung in (the watchdog), and a lost Ray actor's
HANG_FLAGS = {"policy": "policy_hang", "sim": "sim_hang"}
UNFINISHED_FLAGS = (*HANG_FLAGS.values(), "actor_died")
# every flag a record can hold, in the order reports list them
FLAG_NAMES = ("wrong_hole", "rim", "penetration", "glitch", "dropped", *UNFINISHED_FLAGS)
# every flag a record can hold: the reports' flags, and the executors' flag of a try that was run again after
# its model's connection was lost (eval.executors.base)
RECORD_FLAGS = (*FLAG_NAMES, "server_error")
# host-to-device traffic per model query (eval.policies.base.Policy.host_traffic), beside infer_ms: mean bytes
# copied from host to device per timed query, and the median device time of those copies (ms); absent where
# the runner reports none (JAX, a bare ONNX Runtime runner, a served model); Octo on ONNX Runtime on the CPU has
# bytes 0 and no time. Single-scene tries only, as infer_ms (a batch's tries share its calls)
HOST_TRAFFIC_FIELDS = ("h2d_bytes_per_query", "h2d_ms_p50")


@functools.lru_cache(maxsize=1)
def machine_info() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
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
    # the run's cap on a try's control steps (eval.run --max-steps: a smoke run, success meaningless); None: the
    # setup's own
    max_steps: int | None = None
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
        for key in ("model", "track", "arm", "precision", "profile", "weights", "appearance", "max_steps"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d


def max_steps_label(max_steps: int) -> str:
    """What a run with ``--max-steps`` is, wherever it is shown (the run's last line, REPORT.md, the results page)."""
    return f"tries cut at {max_steps} control steps (--max-steps): a smoke run, success meaningless"


class RecordsError(ValueError):
    """A records file that cannot be read as records; the message names the file, the line and what to do."""


# Field types, as small checkers: a checker takes a value and gives None when it holds what its readers expect,
# else (where, value, expected) naming the part that does not ("" the value itself, ".k" / "[i]" a part).
Check = Callable[[Any], "tuple[str, Any, str] | None"]


def _finite(v) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return -1e308 < v < 1e308  # NaN and infinities fail; so does an int no float holds (float() would raise)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def leaf(test: Callable[[Any], bool], expected: str) -> Check:
    return lambda v: None if test(v) else ("", v, expected)


def nullable(check: Check) -> Check:
    def f(v):
        bad = None if v is None else check(v)
        return bad if bad is None or bad[0] else ("", v, bad[2] + " or null")
    return f


def list_of(check: Check, fast: Callable[[list], bool] | None = None) -> Check:
    """A list, each item ``check``ed; ``fast(list)`` True passes it at once (long lists of latencies)."""
    def f(v):
        if not isinstance(v, list):
            return ("", v, "a list")
        if fast is not None and fast(v):
            return None
        for i, x in enumerate(v):
            bad = check(x)
            if bad:
                return (f"[{i}]{bad[0]}", bad[1], bad[2])
        return None
    return f


def map_of(check: Check) -> Check:
    def f(v):
        if not isinstance(v, dict):
            return ("", v, "a JSON object")
        for k, x in v.items():
            bad = check(x)
            if bad:
                return (f".{k}{bad[0]}", bad[1], bad[2])
        return None
    return f


_MISSING = object()


def obj(fields: dict[str, Check], required: tuple[str, ...] = ()) -> Check:
    """A JSON object: the keys in ``required`` present, every key of ``fields`` it has checked (other keys are
    not read, and not checked)."""
    def f(v):
        if not isinstance(v, dict):
            return ("", v, "a JSON object")
        for k in required:
            if k not in v:
                return (f".{k}", _MISSING, "")
        for k, x in v.items():
            bad = fields[k](x) if k in fields else None
            if bad:
                return (f".{k}{bad[0]}", bad[1], bad[2])
        return None
    return f


def problem_text(bad: tuple[str, Any, str], top: str = "") -> str:
    """'field 'success' is NaN, expected true or false' of a checker's finding."""
    where, value, expected = bad
    name = (top + where).lstrip(".")
    if value is _MISSING:
        return f"lacks field '{name}'"
    if isinstance(value, float) and not math.isfinite(value):
        shown = str(value).replace("nan", "NaN").replace("inf", "Infinity")
    else:
        shown = json.dumps(value, default=str)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"field '{name}' is {shown}, expected {expected}" if name else f"{shown}, expected {expected}"


BOOL = leaf(lambda v: isinstance(v, bool), "true or false")
STR = leaf(lambda v: isinstance(v, str), "a string")
INT0 = leaf(lambda v: _int(v) and v >= 0, "an integer >= 0")
INT1 = leaf(lambda v: _int(v) and v >= 1, "an integer >= 1")
NUM = leaf(_finite, "a finite number")
NUM0 = leaf(lambda v: _finite(v) and v >= 0, "a finite number >= 0")
OBJ = leaf(lambda v: isinstance(v, dict), "a JSON object")
SCALAR = leaf(lambda v: v is None or isinstance(v, (str, bool)) or _finite(v), "a string, number or null")


def _ms_fast(v: list) -> bool:
    """Plain finite numbers >= 0, checked in C (a try's latencies are hundreds of numbers)."""
    if not set(map(type, v)) <= {int, float}:
        return False
    try:
        a = np.asarray(v, dtype=float)
    except OverflowError:  # an int no float holds: the item-by-item check names it
        return False
    return bool(np.isfinite(a).all() and (a >= 0).all())


MS = list_of(NUM0, fast=_ms_fast)

# The one definition of what a record's fields hold (tries.jsonl: TryRecord.to_json and what policies add;
# batches.jsonl: eval.rollout's batch record). Every reader (resume, report, results page, eval.orin) gets
# records through read_tries / record_problem, so a field of the wrong type (a NaN success, which bool() calls
# True; a string try) is named where it is read and never reaches a number. Keys not listed are a policy's own
# fields (Policy.record_fields), which no reader reads.
TRY_FIELDS: dict[str, Check] = {
    "v": leaf(lambda v: _int(v) and 1 <= v <= RECORD_VERSION,
              f"a record version 1..{RECORD_VERSION} (a newer release wrote it? read it with that release)"),
    "setup": leaf(lambda v: isinstance(v, str) and v in SETUPS,
                  "a setup of this release (unknown setup: a record of another setup list?)"),
    "try": INT0, "seed": INT0, "split": STR, "predicate": INT1,
    "success": BOOL, "success_raw": BOOL, "dropped": BOOL, "disturbance_fired": BOOL,
    "flags": list_of(leaf(lambda v: v in RECORD_FLAGS, f"a flag ({', '.join(RECORD_FLAGS)})")),
    "steps": nullable(INT0), "time_s": nullable(NUM0), "disturbance": nullable(STR),
    "disturbance_step": nullable(INT0), "tasklist_sha256": nullable(STR), "machine": map_of(SCALAR),
    "infer_queries": INT0, "infer_ms": MS, "infer_ms_mean": nullable(NUM0), "infer_ms_p99": nullable(NUM0),
    "warmup_ms": MS, **{k: nullable(NUM0) for k in HOST_TRAFFIC_FIELDS},
    "target": nullable(STR), "max_plate_overlap_mm": NUM, "max_free_energy_gain_mj": NUM,
    "actions_clipped": INT0, "blocks_inserted": INT0, "backend": nullable(STR), "weights_sha256": nullable(STR),
    "note": nullable(STR), "wall_s": NUM0, "step_ms": map_of(NUM), "num_envs": INT1,
    "model": nullable(STR), "track": nullable(STR), "arm": nullable(STR), "precision": nullable(STR),
    "profile": nullable(STR), "appearance": nullable(INT1), "weights": nullable(OBJ), "run_identity": STR,
    "max_steps": nullable(INT1),
    # what policies add that reports read (eval.remote.client, eval.policies.octo)
    "remote_ms": map_of(MS), "remote_warmup_ms": map_of(MS), "protocol": nullable(STR), "stale_steps": INT0,
    "stale_ratio": NUM0, "goal_image": nullable(STR), "goal_sha256": nullable(STR),
}
TRY_REQUIRED = ("setup", "try", "success")  # records of old releases and by hand carry at least these
BATCH_FIELDS: dict[str, Check] = {
    "v": INT1, "setup": STR, "tries": list_of(INT0), "num_envs": INT1, "sim": STR, "batched_queries": BOOL,
    "backend": nullable(STR), "steps": INT0, "scene_steps": INT0, "wall_s": NUM0, "query_ms": MS,
    "query_batch": list_of(INT1), "warmup_ms": MS, "host_device_bytes_per_step": NUM0,
    "image_bytes_per_step": NUM0,
}
BATCH_REQUIRED = tuple(k for k in BATCH_FIELDS if k not in ("backend", "warmup_ms"))
_CHECKS = {"try": obj(TRY_FIELDS, TRY_REQUIRED), "batch": obj(BATCH_FIELDS, BATCH_REQUIRED)}


def record_problem(record, kind: str = "try") -> str | None:
    """What is wrong with one record (``kind`` "try": a tries.jsonl line; "batch": a batches.jsonl line), in
    words naming the field, or None when every field it has holds what its readers expect."""
    bad = _CHECKS[kind](record)
    return None if bad is None else problem_text(bad)


def record_label(record) -> str:
    """'setup A01 try 3' of a record, as far as it says."""
    if not isinstance(record, dict):
        return "?"
    if "tries" in record and "try" not in record:  # a batch record
        return f"setup {record.get('setup')!s:.20} tries {json.dumps(record['tries'], default=str):.40}"
    return f"setup {record.get('setup')!s:.20} try {record.get('try')!s:.20}"


FIX_LINE = "correct it, or delete that line and rerun to redo its try; the other records are kept"
FIX_BATCH_LINE = "correct it, or delete that line (its batch's timing leaves the report; the tries are kept)"


def read_tries(path, kind: str = "try") -> list[dict]:
    """The records of a ``tries.jsonl`` (``kind`` "batch": a ``batches.jsonl``), each checked field by field
    (:func:`record_problem`); :func:`read_tries_numbered` gives their line numbers too."""
    return [r for _, r in read_tries_numbered(path, kind)]


def read_tries_numbered(path, kind: str = "try") -> list[tuple[int, dict]]:
    """(line number, record) of a records file: one JSON object per line, blank lines skipped.

    Every record is written with its newline in one write (``eval.run_folder.TryLog``), so only a last line
    without a newline can be torn by a kill: when it is not a whole JSON object it is ignored (and cut off
    when the run resumes). Any other line that is not a JSON object, the last one included when it ends in a
    newline, is a damaged record, and so is a record with a field of the wrong type, or a second record of one
    try: :class:`RecordsError` names the file, the line and the field.
    """
    from pathlib import Path

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark an editor added is not a record's
    except FileNotFoundError:
        raise RecordsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise RecordsError(f"{path}: a folder, not a records file: name its tries.jsonl") from None
    except UnicodeDecodeError:
        raise RecordsError(f"{path}: not UTF-8 text (a damaged records file): move it away and rerun") from None
    except OSError as e:
        raise RecordsError(f"{path}: cannot read ({e.strerror or e})") from None
    lines = text.split("\n")  # the last item is "" when the file ends in a newline, else an unterminated tail
    out: list[tuple[int, dict]] = []
    seen: dict[tuple, int] = {}
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
        problem = record_problem(record, kind)
        if problem is not None:
            fix = FIX_LINE if kind == "try" else FIX_BATCH_LINE
            raise RecordsError(f"{path}: line {i + 1} ({record_label(record)}): {problem}: {fix}")
        if kind == "try":  # a try recorded twice would count twice
            key = (record["setup"], record["try"])
            if key in seen:
                raise RecordsError(f"{path}: line {i + 1} records {record_label(record)} again (first on line "
                                   f"{seen[key]}): delete one of the two lines and rerun")
            seen[key] = i + 1
        out.append((i + 1, record))
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
