"""Run tries of one model on the shape-assembly scenes and record them.

Every finished try is appended to ``tries.jsonl`` and flushed to disk at once,
so a killed run loses nothing: started again with the same settings it skips
the tries already recorded. ``run.json`` in the output folder holds the run's
settings (and, under ``environment``, the machine and every installed package's version); a second run
with different settings into the same folder is refused, and so is a second run into a folder another
process is writing (``RunFolderLock``).
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from env.setups import get_setup
from eval.policies.base import ACTION_BOUND
from env.starts import derive_seed, sample_start
from env.predicate import MARGIN_KEYS, STICKY_FLAGS, SUCCESS_PREDICATE_VERSION

RECORD_VERSION = 2  # v2: success predicate v2, success_raw beside the scored success
CONTROL_DT_S = 0.05


@dataclass(frozen=True)
class RunConfig:
    model: str
    split: str
    setups: tuple[str, ...]
    tries: int
    out: str
    arm: str = "panda"
    first_try: int = 0
    tasklist_sha256: str | None = None
    options: tuple = ()  # model options, as sorted (name, value) pairs
    sim: str = "cpu"  # physics: cpu (PhysX on the CPU, one scene or a batch) or gpu (GPU PhysX, eval.batch)
    # of the weights file the model options select, where the model has one: a run resumed after the
    # weights changed would otherwise mix two policies' tries in one file
    weights_sha256: str | None = None
    predicate: int = SUCCESS_PREDICATE_VERSION  # the success predicate the tries are scored with

    def __post_init__(self):
        object.__setattr__(self, "options", tuple(tuple(o) for o in self.options))

    def identity(self) -> dict:
        """Settings that must match for two runs to share an output folder."""
        d = asdict(self)
        for k in ("out", "tries", "setups", "first_try"):
            d.pop(k)
        d["options"] = {k: v for k, v in self.options}
        if self.sim == "cpu":  # CPU physics gives the same tries batched or not (tested): older runs match
            d.pop("sim")
        if self.weights_sha256 is None:  # models without a weights file: older runs match
            d.pop("weights_sha256")
        return d


class RunMismatchError(RuntimeError):
    pass


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
        self._f = open(self.path, "a+")
        try:
            fcntl.flock(self._f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._f.seek(0)
            holder = self._f.read().strip() or "unknown"
            self._f.close()
            raise RunMismatchError(f"{out} is being written by another run (pid {holder}); wait for it to "
                                   f"finish or use another --out") from None
        self._f.seek(0)
        self._f.truncate()
        self._f.write(f"{os.getpid()}\n")
        self._f.flush()

    def release(self) -> None:
        if not self._f.closed:
            fcntl.flock(self._f.fileno(), fcntl.LOCK_UN)
            self._f.close()


class RecordsError(ValueError):
    """A tries file that cannot be read as records; the message names the file, the line and what to do."""


def read_records(path: Path) -> list[dict]:
    """Records of a tries.jsonl; a torn last line (killed mid-write) is ignored."""
    out = []
    if not path.exists():
        return out
    with open(path) as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 2:  # only the last line can be torn by a kill
                raise RecordsError(
                    f"{path}: line {i + 1} is not JSON (a damaged record, not a torn last line): delete that "
                    f"line and rerun to redo its try; the other records are kept") from None
    return out


class TryLog:
    """Append-only, flushed per record; repairs a torn last line on open."""

    def __init__(self, path: Path):
        self.path = path
        if path.exists():
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):
                cut = data.rfind(b"\n") + 1
                with open(path, "r+b") as f:
                    f.truncate(cut)
        self._f = open(path, "a")

    def append(self, record: dict) -> None:
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
    if run_file.exists():
        try:
            previous = json.loads(run_file.read_text())
        except ValueError:
            raise RunMismatchError(f"{run_file} is not JSON: use another --out, or --fresh to start over") from None
        previous.pop("environment", None)
        old_predicate = previous.get("predicate", 1)  # run folders from before predicate versions are v1
        if old_predicate != cfg.predicate:
            raise RunMismatchError(
                f"{out} holds tries scored with success predicate v{old_predicate}, this release scores "
                f"v{cfg.predicate} (docs/BENCHMARK.md section 1): use another --out, or --fresh to start over")
        if previous != cfg.identity():
            diff = {k: (previous.get(k), v) for k, v in cfg.identity().items() if previous.get(k) != v}
            raise RunMismatchError(
                f"{out} holds a run with other settings {diff}; use another --out or --fresh to start over"
            )
    else:
        tmp = run_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({**cfg.identity(), "environment": environment_info()}, indent=1,
                                  sort_keys=True) + "\n")
        os.replace(tmp, run_file)
    try:
        done = {(r["setup"], int(r["try"])) for r in read_records(tries_file)}
    except RecordsError as e:
        raise RunMismatchError(str(e)) from None
    return done


def planned_tries(cfg: RunConfig) -> list[tuple[str, int]]:
    return [(s, t) for s in cfg.setups for t in range(cfg.first_try, cfg.first_try + cfg.tries)]


def observation_for(policy, env, obs) -> dict[str, Any]:
    u = env.unwrapped
    if policy.observes == "state":
        return {"state": {k: v[0] for k, v in u.task_state().items()}, "instruction": u.instructions[0]}
    sensors = obs["sensor_data"]
    return {
        "images": {
            "third_person": sensors["third_person"]["rgb"][0].cpu().numpy(),
            "wrist": sensors[u.arm.wrist_camera_uid]["rgb"][0].cpu().numpy(),
        },
        "proprio": obs["agent"]["qpos"][0].cpu().numpy(),
        "instruction": u.instructions[0],
    }


STAGES = ("observe", "preprocess", "inference", "postprocess", "physics", "render", "other")


class StepProfile:
    """Where a try's control steps spend their time, summed per stage (ms).

    observe: the policy's observation taken from the scene (frames copied out); preprocess, inference,
    postprocess: the policy query as the policy times its stages (a policy that times none counts wholly
    as inference); physics: the scene's action and simulation substeps; render: sensor capture and
    observation; other: success evaluation, bookkeeping, video. The loop's own time is measured too, so
    the stages add up to the wall time of the steps.
    """

    def __init__(self, env):
        self.u = env.unwrapped
        self.ms = dict.fromkeys(STAGES, 0.0)
        self._inner = {"physics": 0.0, "render": 0.0}
        self._patched = []
        self._last_end: float | None = None
        for attr, stage in (("_step_action", "physics"), ("get_obs", "render")):
            self._patch(attr, stage)

    def _patch(self, attr: str, stage: str) -> None:
        original = getattr(self.u, attr)
        inner = self._inner

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                inner[stage] += (time.perf_counter() - t0) * 1e3

        setattr(self.u, attr, timed)  # an instance attribute shadows the method; close() removes it
        self._patched.append(attr)

    def add_step(self, t_start: float, t_obs: float, t_query: float, t_end: float, stage_ms: dict) -> None:
        if self._last_end is not None:  # the loop's bookkeeping between two steps
            self.ms["other"] += (t_start - self._last_end) * 1e3
        self._last_end = t_end
        self.ms["observe"] += (t_obs - t_start) * 1e3
        query = (t_query - t_obs) * 1e3
        pre, post = stage_ms.get("preprocess", 0.0), stage_ms.get("postprocess", 0.0)
        inference = stage_ms.get("inference", query - pre - post)
        self.ms["preprocess"] += pre
        self.ms["inference"] += inference
        self.ms["postprocess"] += post
        step = (t_end - t_query) * 1e3
        physics, render = self._inner["physics"], self._inner["render"]
        self._inner["physics"] = self._inner["render"] = 0.0
        self.ms["physics"] += physics
        self.ms["render"] += render
        self.ms["other"] += max(0.0, step - physics - render) + max(0.0, query - pre - post - inference)

    def close(self) -> None:
        for attr in self._patched:
            self.u.__dict__.pop(attr, None)
        self._patched = []

    def totals(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.ms.items()}


def run_try(env, policy, setup_id: str, split: str, try_index: int, tasklist=None,
            on_step=None, video_path: str | None = None, fresh_scene: bool = True) -> dict[str, Any]:
    """One try from its start to success or the step limit.

    The start comes from the locked ``tasklist`` when given (as every benchmark run does), else it is
    drawn from the try's seed (tests, quick experiments).

    ``fresh_scene`` rebuilds the physics scene before the try (about 0.2 s on CPU): PhysX keeps contact
    and solver warm-start caches across a plain reset, so a try's outcome would otherwise depend on which
    tries the same worker ran before it (measured: up to 6 steps on G02), and a resumed or re-sharded run
    would not reproduce an uninterrupted one.
    """
    if tasklist is not None:
        seed, start = tasklist.seed(setup_id, try_index), tasklist.start(setup_id, try_index)
    else:
        seed = derive_seed(split, setup_id, try_index)
        start = sample_start(get_setup(setup_id), np.random.default_rng(seed))
    obs, info = env.reset(seed=seed, options={"start": start, "reconfigure": fresh_scene})
    u = env.unwrapped
    policy.reset(u.instructions[0], seed=seed)
    policy.latencies_ms = []
    policy.warmup_ms = []
    profile = StepProfile(env)
    t0 = time.monotonic()
    steps, success, success_raw, rim, clipped = 0, False, False, False, 0
    margins = dict.fromkeys(MARGIN_KEYS, 0.0)
    flags: set[str] = set()
    blocks_inserted = 0
    video = None
    if video_path is not None:
        from eval.video import TryVideo

        video = TryVideo(video_path)
    try:
        while True:
            t_step = time.perf_counter()
            observation = observation_for(policy, env, obs)
            t_obs = time.perf_counter()
            if on_step is not None:
                on_step("policy")
            action = policy.query(observation)
            t_query = time.perf_counter()
            if on_step is not None:
                on_step("sim")
            clipped += bool(np.any(np.abs(action) > ACTION_BOUND))
            obs, _, terminated, truncated, info = env.step(action)
            profile.add_step(t_step, t_obs, t_query, time.perf_counter(), policy.stage_ms)
            steps += 1
            if video is not None:
                sensors = obs["sensor_data"]
                video.add(sensors["third_person"]["rgb"][0].cpu().numpy(),
                          sensors[u.arm.wrist_camera_uid]["rgb"][0].cpu().numpy(), steps, info)
            for name in STICKY_FLAGS:
                if bool(info[name][0]):
                    flags.add(name)
            for name in MARGIN_KEYS:
                margins[name] = max(margins[name], float(info[name][0]))
            rim = bool(info["rim"][0])
            blocks_inserted = int(info["blocks_inserted"][0])
            success, success_raw = bool(info["success"][0]), bool(info["success_raw"][0])
            if success or bool(terminated[0]) or bool(truncated[0]):
                break
    finally:
        profile.close()
    if video is not None:
        video.write()
    if rim and not success_raw:
        flags.add("rim")
    fired = bool(info["disturbance_fired"][0])
    return try_record(
        setup_id, try_index, seed, split, start, tasklist, policy, success=success, success_raw=success_raw,
        flags=flags, margins=margins, steps=steps,
        blocks_inserted=blocks_inserted, disturbance_step=int(info["disturbance_step"][0]) if fired else None,
        wall_s=time.monotonic() - t0, latencies_ms=policy.latencies_ms, warmup_ms=policy.warmup_ms,
        step_ms=profile.totals(), actions_clipped=clipped)


def try_record(setup_id: str, try_index: int, seed: int, split: str, start, tasklist, policy, *, success: bool,
               success_raw: bool, flags: set[str], margins: dict[str, float], steps: int, blocks_inserted: int, disturbance_step: int | None, wall_s: float,
               latencies_ms: list[float], warmup_ms: list[float], step_ms: dict[str, float],
               actions_clipped: int = 0) -> dict[str, Any]:
    """The record of one finished try (one line of tries.jsonl)."""
    lat = latencies_ms
    return {
        "v": RECORD_VERSION,
        "setup": setup_id,
        "try": try_index,
        "seed": seed,
        "split": split,
        "target": start.target,
        "predicate": SUCCESS_PREDICATE_VERSION,
        "success": success,  # scored: the predicate held and no vetoing flag was raised
        "success_raw": success_raw,  # the predicate's own verdict (a vetoed try has True here, False above)
        "flags": sorted(flags),
        # how close the try came to penetration and glitch: deepest plate overlap, most energy gained untouched
        "max_plate_overlap_mm": round(margins["plate_overlap"] * 1e3, 3),
        "max_free_energy_gain_mj": round(margins["free_energy_gain"] * 1e3, 3),
        "dropped": "dropped" in flags,
        "steps": steps,
        # actions with a component outside the controller's [-1, 1], which it clips (ManiSkill's normalised
        # end-effector controller): a policy that saturates or emits nonsense shows here
        "actions_clipped": actions_clipped,
        "time_s": round(steps * CONTROL_DT_S, 3),
        "blocks_inserted": blocks_inserted,
        "disturbance": get_setup(setup_id).disturbance,
        "disturbance_fired": disturbance_step is not None,
        "disturbance_step": disturbance_step,
        "tasklist_sha256": tasklist.sha256 if tasklist is not None else None,
        "backend": policy.backend,
        "weights_sha256": getattr(policy, "weights_sha256", None),
        "note": getattr(policy, "note", None),
        "machine": machine_info(),
        "wall_s": round(wall_s, 3),
        "infer_ms_mean": round(float(np.mean(lat)), 4) if lat else None,
        "infer_queries": len(lat) + len(warmup_ms),  # all queries; infer_ms holds those after warm-up
        "infer_ms_p99": round(float(np.percentile(lat, 99)), 4) if lat else None,
        "infer_ms": [float(f"{x:.3g}") for x in lat],  # every query, 3 significant digits: run percentiles
        "warmup_ms": [float(f"{x:.3g}") for x in warmup_ms],  # a fresh policy's first queries
        "step_ms": {k: round(v, 3) for k, v in step_ms.items()},
    }


def hang_record(cfg: RunConfig, tasklist, setup_id: str, try_index: int, flag: str = "sim_hang") -> dict[str, Any]:
    """Record of a try that could not finish: failed, flagged ``policy_hang`` or ``sim_hang`` (the watchdog
    stopped it in a policy query or in the physics) or ``actor_died`` (its Ray actor died twice)."""
    return {
        "v": RECORD_VERSION, "setup": setup_id, "try": try_index, "seed": tasklist.seed(setup_id, try_index),
        "split": cfg.split, "predicate": SUCCESS_PREDICATE_VERSION, "success": False, "success_raw": False,
        "flags": [flag], "dropped": False, "steps": None,
        "time_s": None, "disturbance": get_setup(setup_id).disturbance, "disturbance_fired": False,
        "tasklist_sha256": tasklist.sha256, "machine": machine_info(), "infer_queries": 0, "infer_ms_mean": None,
        "infer_ms": [],
    }
