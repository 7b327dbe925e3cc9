"""A run folder: its identity, its one writer, its records.

Every finished try is appended to ``tries.jsonl`` and flushed to disk at once, so a killed run loses nothing:
started again with the same settings it skips the tries already recorded. ``run.json`` holds the folder's
identity (the settings that must match to share it), the run's request as resolved
(:meth:`eval.request.RunRequest.to_json`, under ``request``; credentials only as where they came from) and,
under ``environment``, the machine and every installed package's version; a second run with other settings
into the same folder is refused, and so is a second run into a folder another process is writing
(``RunFolderLock``). Every record carries the digest of that identity (``run_identity``), so the folder's
identity lives in its records too: a run.json lost or replaced lets no other run in, and the same run
writes it again.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from env.predicate import SUCCESS_PREDICATE_VERSION
from env.setups import Setup
from eval.records import (INT1, OBJ, SCALAR, STR, RecordsError, TryRecord, machine_info,  # noqa: F401 - what runs name
                          map_of, nullable, obj, problem_text, read_tries, read_tries_numbered, record_label, record_problem,
                          torn_tail)

# what run.json holds (written by _resume_state; read by resume and the results page, eval.site)
RUN_JSON_CHECK = obj({
    "model": STR, "split": STR, "arm": STR, "tasklist_sha256": nullable(STR), "options": OBJ, "predicate": INT1,
    "sim": STR, "weights_sha256": STR, "runtime": obj({"backend": STR, "precision": nullable(STR)}),
    "appearance": INT1, "first_try": INT1, "run_identity": STR, "request": OBJ, "credentials": OBJ,
    "environment": obj({"machine": map_of(SCALAR), "packages": map_of(STR)}),
})


def run_json_problem(run_json) -> str | None:
    """What is wrong with a run.json's fields, naming the field; None when each holds what its readers expect."""
    bad = RUN_JSON_CHECK(run_json)
    return None if bad is None else problem_text(bad)


@dataclass(frozen=True)
class RunConfig:
    """A run folder's identity, made from the run's request (:meth:`of`)."""

    model: str
    split: str
    setups: tuple[str, ...]
    tries: int
    out: str
    arm: str = "panda"
    first_try: int = 0
    tasklist_sha256: str | None = None
    options: tuple = ()  # model options, as sorted (name, value) pairs (credentials are not options here)
    sim: str = "cpu"  # physics: cpu (PhysX on the CPU, one scene or a batch) or gpu (GPU PhysX, eval.rollout)
    # of the weights file the model options select, where the model has one: a run resumed after the
    # weights changed would otherwise mix two policies' tries in one file
    weights_sha256: str | None = None
    predicate: int = SUCCESS_PREDICATE_VERSION  # the success predicate the tries are scored with
    runtime: tuple = ()  # (backend, precision) the model runs on; () for models that run in Python
    appearance: int | None = None  # a camera model's frames' appearance version (env.appearance); None: no frames
    request: dict = field(default_factory=dict, compare=False)  # the resolved request, as run.json keeps it

    def __post_init__(self):
        object.__setattr__(self, "options", tuple(tuple(o) for o in self.options))

    @classmethod
    def of(cls, request, out: str | Path, tasklist_sha256: str | None) -> "RunConfig":
        m = request.model
        runtime = (m.backend, m.precision) if m.runtime is not None else ()
        return cls(model=m.name, split=request.split, setups=tuple(s.id for s in request.setups),
                   tries=request.tries, out=str(out), arm=request.arm, first_try=request.first_try,
                   tasklist_sha256=tasklist_sha256,
                   options=tuple(sorted(request.options().items())), sim=request.sim,
                   weights_sha256=m.config.weights_sha256(), runtime=runtime,
                   appearance=request.identity().get("appearance"), request=request.to_json())

    def identity(self) -> dict:
        """Settings that must match for two runs to share an output folder (credentials are not settings:
        their values are never written, and a new token does not make another run)."""
        d = {"model": self.model, "split": self.split, "arm": self.arm, "tasklist_sha256": self.tasklist_sha256,
             "options": {k: v for k, v in self.options}, "predicate": self.predicate}
        if self.first_try:  # other tries than the first N: never mixed with theirs in one folder; older runs match
            d["first_try"] = self.first_try
        if self.sim != "cpu":  # CPU physics gives the same tries batched or not (tested): older runs match
            d["sim"] = self.sim
        if self.weights_sha256 is not None:  # models without a weights file: older runs match
            d["weights_sha256"] = self.weights_sha256
        if self.runtime:
            d["runtime"] = {"backend": self.runtime[0], "precision": self.runtime[1]}
        if self.appearance is not None:  # frames of another appearance make other tries
            d["appearance"] = self.appearance
        return d


    @property
    def run_identity(self) -> str:
        """A digest of :meth:`identity`, which every record of the run carries (``run_identity``): a folder's
        records say which run made them, so a lost run.json lets no other run in (:func:`_resume_state`)."""
        return identity_digest(self.identity())


def identity_digest(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


class RunMismatchError(RuntimeError):
    pass


@functools.lru_cache(maxsize=1)
def package_versions() -> dict[str, str]:
    """Every installed distribution's version (what ``requirements/lock.txt`` pins, and torch), by its
    normalised name (PEP 503: lower case, runs of ``-_.`` as one ``-``)."""
    import re
    from importlib import metadata

    versions = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in metadata.distributions()}
    return dict(sorted(versions.items()))


def environment_info() -> dict:
    return {"machine": machine_info(), "packages": package_versions()}


class RunFolderLock:
    """One writer per run folder: an exclusive ``flock`` on ``<out>/.writer.lock`` held while the run
    writes. The kernel drops it when the holder dies, so a killed run's lock is simply taken over."""

    NAME = ".writer.lock"

    def __init__(self, out: Path):
        self.path = out / self.NAME
        created = not self.path.exists()
        try:
            self._f = open(self.path, "a+", encoding="utf-8")
        except OSError as e:
            raise RunMismatchError(f"cannot write the lock file {self.path} ({e.strerror or e}): free space or "
                                   "choose a writable --out") from None
        try:
            fcntl.flock(self._f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._f.seek(0)
            holder = self._f.read().strip() or "unknown"
            self._f.close()
            raise RunMismatchError(f"{out} is being written by another run (pid {holder}); wait for it to "
                                   f"finish or use another --out") from None
        try:
            self._f.seek(0)
            self._f.truncate()
            self._f.write(f"{os.getpid()}\n")
            self._f.flush()
        except OSError as e:  # disk full: the folder holds no lock of ours afterwards
            try:
                self._f.close()
            except OSError:  # the buffered pid cannot be written either
                pass
            if created:
                self.path.unlink(missing_ok=True)
            raise RunMismatchError(f"cannot write the lock file {self.path} ({e.strerror or e}): free space, then "
                                   "rerun the same command; the finished tries are kept") from None

    def release(self) -> None:
        if not self._f.closed:
            fcntl.flock(self._f.fileno(), fcntl.LOCK_UN)
            self._f.close()


def read_records(path: Path) -> list[dict]:
    """Records of a tries.jsonl (none when it does not exist yet); :func:`eval.records.read_tries` reads them."""
    return read_tries(path) if Path(path).exists() else []


class TryLog:
    """Append-only, flushed per record; on open, cuts off a torn last line (:func:`eval.records.torn_tail`) and
    ends a whole last record that lost only its newline. ``stamp`` is added to every record: the run's
    ``run_identity`` (:attr:`RunConfig.run_identity`)."""

    def __init__(self, path: Path, stamp: dict | None = None):
        self.path = path
        self.stamp = dict(stamp or {})
        if path.exists():
            data = path.read_bytes()
            cut = torn_tail(data)
            if cut < len(data):
                with open(path, "r+b") as f:
                    f.truncate(cut)
            elif data and not data.endswith(b"\n"):
                with open(path, "ab") as f:
                    f.write(b"\n")
        self._f = open(path, "a", encoding="utf-8")

    def append(self, record: dict, kind: str = "try") -> None:
        """Append one record (``kind``: "try", or "batch" for batches.jsonl). A record its readers would refuse
        (a policy's field of the wrong type) is a :class:`RecordsError` and is not written: the folder stays
        readable and resumable."""
        record = {**record, **self.stamp}
        problem = record_problem(record, kind)
        if problem is not None:
            raise RecordsError(f"{self.path}: the record of {record_label(record)} would not be readable ({problem}): "
                               f"not written; the policy's record fields (Policy.record_fields) need fixing")
        self._f.write(json.dumps(record, sort_keys=True) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        try:
            self._f.close()
        except OSError:  # the last write failed (disk full): its torn line is cut off when the file reopens
            pass


def _writable_folder(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise RunMismatchError(f"--out {out} is a file, not a folder: name a folder (new or a run's)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise RunMismatchError(f"cannot write to --out {out}: {e.strerror or e}; choose a writable folder") from None


def prepare_out(cfg: RunConfig, fresh: bool = False) -> tuple[Path, set[tuple[str, int]], RunFolderLock]:
    """The output folder, the (setup, try) pairs it already holds, and its writer lock (release it when
    the run ends). Raises RunMismatchError (one line) for a folder this run may not write."""
    out = Path(cfg.out)
    _writable_folder(out)
    lock = RunFolderLock(out)
    try:
        done = _resume_state(cfg, out, fresh)
    except BaseException:
        lock.release()
        raise
    return out, done, lock


def _resume_state(cfg: RunConfig, out: Path, fresh: bool) -> set[tuple[str, int]]:
    run_file = out / "run.json"
    tries_file = out / "tries.jsonl"
    if fresh:
        for p in (run_file, tries_file, out / "summary.json", out / "batches.jsonl"):
            p.unlink(missing_ok=True)
    try:
        numbered = read_tries_numbered(tries_file) if tries_file.exists() else []
    except RecordsError as e:
        raise RunMismatchError(str(e)) from None
    if run_file.exists():
        _check_run_json(cfg, out, run_file)
    # every record names the run that made it: one of another run (another model, task list, options...) in
    # this folder, or one a run.json no longer vouches for, is refused, whatever run.json says
    unstamped = [(n, r) for n, r in numbered if "run_identity" not in r]
    for n, r in numbered:
        if r.get("run_identity", cfg.run_identity) != cfg.run_identity:
            raise RunMismatchError(
                f"{tries_file}: line {n} ({record_label(r)}) was recorded by another run (model "
                f"{r.get('model')!r}, run identity {r['run_identity']}; this run: model {cfg.model!r}, "
                f"{cfg.run_identity}): use another --out, or --fresh to start over")
    ours = {"model": cfg.model, "split": cfg.split, "arm": cfg.arm, "tasklist_sha256": cfg.tasklist_sha256,
            "predicate": cfg.predicate}
    for n, r in numbered:  # and what they carry of their run must be this run's (older records carry only this)
        other = {k: r[k] for k, v in ours.items() if r.get(k) is not None and r[k] != v}
        if other:
            raise RunMismatchError(
                f"{tries_file}: line {n} ({record_label(r)}) was recorded by another run ({other}; this run: "
                f"{ {k: ours[k] for k in other} }): use another --out, or --fresh to start over")
    if not run_file.exists():
        if unstamped:
            raise RunMismatchError(
                f"{out} has no run.json and its tries.jsonl holds {len(unstamped)} records written before records "
                f"named their run (line {unstamped[0][0]}), so which run made them cannot be told: restore "
                f"run.json, or use another --out, or --fresh to start over")
        if numbered:  # every record is this run's: run.json is re-derived from this run's settings
            print(f"{run_file} was missing: written again from this run's settings, which made the folder's "
                  f"{len(numbered)} records (their run identity {cfg.run_identity})", file=sys.stderr)
        tmp = run_file.with_suffix(".json.tmp")
        try:
            written = {**cfg.identity(), "run_identity": cfg.run_identity, "request": cfg.request,
                       "environment": environment_info()}
            if cfg.request.get("credentials"):
                written["credentials"] = cfg.request["credentials"]
            tmp.write_text(json.dumps(written, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, run_file)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise RunMismatchError(f"cannot write {run_file} ({e.strerror or e}): free space, then rerun the same "
                                   "command") from None
    return {(r["setup"], r["try"]) for _, r in numbered}


_RUN_JSON_FIX = ("delete it and rerun the same command (it is written again where the folder's records are this "
                 "run's), or --fresh to start over")


def _check_run_json(cfg: RunConfig, out: Path, run_file: Path) -> None:
    """Refuse (one line) a run.json that is not this run's identity."""
    try:
        previous = json.loads(run_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        why = e.strerror if isinstance(e, OSError) else "not JSON"
        raise RunMismatchError(f"{run_file}: {why} (a damaged run.json): {_RUN_JSON_FIX}") from None
    problem = run_json_problem(previous)
    if problem is not None:
        raise RunMismatchError(f"{run_file}: {problem} (a damaged run.json): {_RUN_JSON_FIX}")
    for key in ("environment", "credentials", "request", "run_identity"):  # described, not compared
        previous.pop(key, None)
    if isinstance(previous.get("options"), dict):  # folders written before credentials were kept apart
        from eval.request import secret_options

        previous["options"] = {k: v for k, v in previous["options"].items() if k not in secret_options()}
    identity = cfg.identity()
    if "runtime" not in previous:  # folders written before the runtime was part of a folder's identity
        identity.pop("runtime", None)
    if "appearance" in identity and "model" in previous:  # camera folders from before versions: appearance 1
        previous.setdefault("appearance", 1)
    old_predicate = previous.get("predicate", 1)  # run folders from before predicate versions are v1
    if old_predicate != cfg.predicate:
        raise RunMismatchError(
            f"{out} holds tries scored with success predicate v{old_predicate}, this release scores "
            f"v{cfg.predicate} (docs/BENCHMARK.md section 1): use another --out, or --fresh to start over")
    if previous != identity:
        # keys only run.json has (another release's settings) count as differences too
        diff = {k: (previous.get(k), identity.get(k)) for k in sorted(set(identity) | set(previous))
                if previous.get(k) != identity.get(k)}
        raise RunMismatchError(
            f"{out} holds a run with other settings {diff}; use another --out or --fresh to start over"
        )


def planned_tries(cfg: RunConfig) -> list[tuple[str, int]]:
    return [(s, t) for s in cfg.setups for t in range(cfg.first_try, cfg.first_try + cfg.tries)]


def hang_record(cfg: RunConfig, tasklist, setup: Setup, try_index: int, flag: str = "sim_hang") -> TryRecord:
    """Record of a try that could not finish: failed, flagged ``policy_hang`` or ``sim_hang`` (the watchdog
    stopped it in a policy query or in the physics) or ``actor_died`` (its Ray actor died twice)."""
    return TryRecord(setup=setup.id, try_index=try_index, seed=tasklist.seed(setup.id, try_index), split=cfg.split,
                     disturbance=setup.disturbance, tasklist_sha256=tasklist.sha256, flags=(flag,), finished=False)
