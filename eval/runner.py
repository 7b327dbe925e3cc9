"""Run tries of one model on the shape-assembly scenes and record them.

Every finished try is appended to ``tries.jsonl`` and flushed to disk at once,
so a killed run loses nothing: started again with the same settings it skips
the tries already recorded. ``run.json`` in the output folder holds the run's
settings; a second run with different settings into the same folder is refused.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from env import geometry
from env.setups import get_setup
from env.starts import derive_seed, sample_start

RECORD_VERSION = 1
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

    def identity(self) -> dict:
        """Settings that must match for two runs to share an output folder."""
        d = asdict(self)
        for k in ("out", "tries", "setups", "first_try"):
            d.pop(k)
        return d


class RunMismatchError(RuntimeError):
    pass


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
                raise ValueError(f"{path}: line {i + 1} is not JSON") from None
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
        self._f.close()


def prepare_out(cfg: RunConfig, fresh: bool = False) -> tuple[Path, set[tuple[str, int]]]:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    run_file = out / "run.json"
    tries_file = out / "tries.jsonl"
    if fresh:
        for p in (run_file, tries_file, out / "summary.json"):
            p.unlink(missing_ok=True)
    if run_file.exists():
        previous = json.loads(run_file.read_text())
        if previous != cfg.identity():
            diff = {k: (previous.get(k), v) for k, v in cfg.identity().items() if previous.get(k) != v}
            raise RunMismatchError(
                f"{out} holds a run with other settings {diff}; use another --out or --fresh to start over"
            )
    else:
        run_file.write_text(json.dumps(cfg.identity(), indent=1, sort_keys=True) + "\n")
    done = {(r["setup"], int(r["try"])) for r in read_records(tries_file)}
    return out, done


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


def run_try(env, policy, setup_id: str, split: str, try_index: int) -> dict[str, Any]:
    """One try from its seeded start to success or the step limit."""
    setup = get_setup(setup_id)
    seed = derive_seed(split, setup_id, try_index)
    start = sample_start(setup, np.random.default_rng(seed))
    obs, info = env.reset(seed=seed, options={"start": start})
    u = env.unwrapped
    policy.reset(u.instructions[0], seed=seed)
    policy.latencies_ms = []
    t0 = time.monotonic()
    steps, success, rim = 0, False, False
    flags: set[str] = set()
    blocks_inserted = 0
    while True:
        action = policy.query(observation_for(policy, env, obs))
        obs, _, terminated, truncated, info = env.step(action)
        steps += 1
        for name in ("wrong_hole", "penetration", "dropped"):
            if bool(info[name][0]):
                flags.add(name)
        rim = bool(info["rim"][0])
        blocks_inserted = int(info["blocks_inserted"][0])
        success = bool(info["success"][0])
        if success or bool(terminated[0]) or bool(truncated[0]):
            break
    if rim and not success:
        flags.add("rim")
    lat = policy.latencies_ms
    return {
        "v": RECORD_VERSION,
        "setup": setup_id,
        "try": try_index,
        "seed": seed,
        "split": split,
        "target": start.target,
        "success": success,
        "flags": sorted(flags),
        "dropped": "dropped" in flags,
        "steps": steps,
        "time_s": round(steps * CONTROL_DT_S, 3),
        "blocks_inserted": blocks_inserted,
        "wall_s": round(time.monotonic() - t0, 3),
        "infer_ms_mean": round(float(np.mean(lat)), 4) if lat else None,
        "infer_queries": len(lat),
        "infer_ms_p99": round(float(np.percentile(lat, 99)), 4) if lat else None,
    }


def summarise(records: Iterable[dict], cfg: RunConfig, wall_s: float | None = None) -> dict:
    from eval.stats import wilson

    records = list(records)
    per_setup = {}
    for sid in cfg.setups:
        rs = [r for r in records if r["setup"] == sid]
        k = sum(bool(r["success"]) for r in rs)
        ci = wilson(k, len(rs)) if rs else None
        per_setup[sid] = {
            "k": k, "n": len(rs), "rate": k / len(rs) if rs else None,
            "wilson95": [ci.low, ci.high] if rs else None,
            "flags": {f: sum(f in r["flags"] for r in rs) for f in ("wrong_hole", "rim", "penetration", "dropped")},
        }
    k = sum(bool(r["success"]) for r in records)
    succ = [r["time_s"] for r in records if r["success"]]
    return {
        "model": cfg.model, "split": cfg.split, "arm": cfg.arm,
        "tries": len(records), "planned": len(planned_tries(cfg)),
        "successes": k, "success_rate": k / len(records) if records else None,
        "mean_completion_s": float(np.mean(succ)) if succ else None,
        "flags": {f: sum(f in r["flags"] for r in records) for f in ("wrong_hole", "rim", "penetration", "dropped")},
        "setups": per_setup,
        "machine": machine_info(),
        "wall_s": wall_s,
        "geometry": {"plate_top_z_m": geometry.PLATE_TOP_Z, "block_height_m": geometry.BLOCK_HEIGHT},
    }
