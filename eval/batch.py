"""GPU-parallel scenes: N tries of one setup stepped together, their policy queries batched.

``python -m eval.orin --num-envs N`` (or ``eval.run --num-envs N``) hands each worker
batches of N tries of one setup. :class:`SceneBatch` holds the N scenes:

* ``sim="gpu"``: one ManiSkill environment with ``num_envs=N`` on SAPIEN's GPU
  PhysX (``physx_cuda``); every step advances all N scenes at once. Scenes
  whose try has ended keep stepping on a hold action until the batch ends.
* ``sim="cpu"``: N CPU scenes stepped one after another in one process. It
  is no faster than ``--workers``; it runs the same loop where there is no GPU
  (tests, a laptop), and it is the reference the GPU physics is compared with.

A batchable policy (``Policy.batchable``, e.g. bc-state) gets one runner call
per step for all live scenes: the inputs are stacked on the batch axis, the
engine runs once, row i goes back to scene i. Other policies are queried
scene by scene, and the batch record says so. Only policies that read the
exact state are run in batches: a camera policy would need per-scene
appearance and frames kept on the GPU, which this release does not do.

Every try's record is the one ``run_try`` writes (success, flags, steps ...),
plus ``num_envs``; its ``step_ms`` is its share of the batch's time (a step's
time split evenly over the scenes live in it) and its ``infer_ms`` is empty:
the batched queries are timed once per batch, in the batch record
(``batches.jsonl``: query ms with the live batch size, steps, wall time,
bytes copied between host and device per step), which the report reads for
latency at batch N and throughput.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from env.predicate import MARGIN_KEYS, STICKY_FLAGS
from eval.policies.base import ACTION_BOUND, Policy, check_action

SIMS = ("cpu", "gpu")
BATCH_RECORD_VERSION = 1


class BatchError(ValueError):
    """A batch that cannot run as asked (one line)."""


def gpu_sim_unavailable_reason() -> str | None:
    """Why GPU simulation cannot run here, or None."""
    from jetson.zero_copy import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    return f"{reason} (SAPIEN's GPU PhysX needs an NVIDIA GPU)" if reason else None


def check_batch_request(num_envs: int, sim: str, observes: str, executor: str = "local") -> None:
    """One-line BatchError for a --num-envs request this machine or model cannot run."""
    if num_envs < 1:
        raise BatchError(f"--num-envs must be at least 1, got {num_envs}")
    if sim not in SIMS:
        raise BatchError(f"unknown --sim {sim!r}; valid: {', '.join(SIMS)}")
    if num_envs == 1:
        return
    if observes != "state":
        raise BatchError("--num-envs > 1 runs policies that read the exact state (scripted, random, hold, bc-state); "
                         "camera policies run one scene per worker: use --num-envs 1 and --workers")
    if executor != "local":
        raise BatchError("--num-envs > 1 runs with the local executor; leave out --executor ray")
    if sim == "gpu":
        reason = gpu_sim_unavailable_reason()
        if reason:
            raise BatchError(f"--num-envs {num_envs} --sim gpu needs GPU simulation: {reason}; "
                             "use --sim cpu to run the batched loop on CPU scenes")


class SceneBatch:
    """N scenes of one setup behind one interface, batch first (see the module docstring)."""

    def __init__(self, setup_id: str, num_envs: int, sim: str = "cpu", arm: str = "panda"):
        from env import make_env

        if sim not in SIMS:
            raise BatchError(f"unknown sim {sim!r}; valid: {', '.join(SIMS)}")
        self.setup_id, self.num_envs, self.sim = setup_id, num_envs, sim
        if sim == "gpu":
            self.envs = [make_env(setup_id, arm=arm, obs_mode="state", num_envs=num_envs, sim_backend="physx_cuda")]
        else:
            self.envs = [make_env(setup_id, arm=arm, obs_mode="state") for _ in range(num_envs)]
        self.instructions: list[str] = []

    def reset(self, seeds: Sequence[int], starts: Sequence[Any]) -> None:
        """Fresh scenes (rebuilt, as run_try does) at the given starts."""
        if self.sim == "gpu":
            u = self.envs[0].unwrapped
            self.envs[0].reset(seed=[int(s) for s in seeds], options={"starts": list(starts), "reconfigure": True})
            self.instructions = list(u.instructions)
        else:
            self.instructions = []
            for env, seed, start in zip(self.envs, seeds, starts):
                env.reset(seed=int(seed), options={"start": start, "reconfigure": True})
                self.instructions.append(env.unwrapped.instructions[0])

    def states(self, idx: Sequence[int]) -> list[dict[str, np.ndarray]]:
        """The exact state (numpy, no batch axis) of the scenes ``idx``."""
        if self.sim == "gpu":
            batch = self.envs[0].unwrapped.task_state()  # one read-out for the whole simulation
            return [{k: v[i] for k, v in batch.items()} for i in idx]
        return [{k: v[0] for k, v in self.envs[i].unwrapped.task_state().items()} for i in idx]

    def step(self, actions: np.ndarray, live: np.ndarray) -> dict[str, np.ndarray]:
        """Apply (N, 7) actions (rows of ended tries are ignored); the info of every scene as numpy (N,) arrays,
        with ``done`` = terminated or truncated. CPU scenes whose try ended are not stepped."""
        if self.sim == "gpu":
            import torch

            u = self.envs[0].unwrapped
            a = torch.as_tensor(np.asarray(actions, dtype=np.float32), device=u.device)
            _, _, term, trunc, info = self.envs[0].step(a)
            out = {k: _numpy(v) for k, v in info.items() if k in INFO_KEYS}
            out["done"] = _numpy(term) | _numpy(trunc)
            return out
        rows: list[dict[str, Any] | None] = []
        for i, env in enumerate(self.envs):
            if not live[i]:
                rows.append(None)
                continue
            _, _, term, trunc, info = env.step(actions[i])
            row = {k: _numpy(info[k])[0] for k in INFO_KEYS}
            row["done"] = bool(term[0]) or bool(trunc[0])
            rows.append(row)
        template = next(r for r in rows if r is not None)
        return {k: np.array([(r if r is not None else template)[k] for r in rows]) for k in template}

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []


INFO_KEYS = ("success", "success_raw", *STICKY_FLAGS, "rim", "blocks_inserted", "disturbance_fired",
             "disturbance_step", *MARGIN_KEYS)


def _numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()  # a few booleans per scene: the only device->host copy of a step
    return np.asarray(x)


def make_members(policy: Policy, n: int, factory: Callable[[], Policy]) -> list[Policy]:
    """N policies, one per scene: spawned from ``policy`` (shared runner) when batchable, else built anew."""
    if policy.batchable:
        return [policy] + [policy.spawn() for _ in range(n - 1)]
    return [policy] + [factory() for _ in range(n - 1)]


def query_batch(members: Sequence[Policy], observations: Sequence[dict]) -> tuple[np.ndarray, dict[str, float]]:
    """Actions (n, 7) for n live scenes and the query's stage times (ms): one runner call when batchable."""
    lead = members[0]
    if lead.batchable:
        lead.stage_ms = {}
        with lead.stage("preprocess"):
            parts = [m.encode(o) for m, o in zip(members, observations)]
            feeds = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        with lead.stage("inference"):
            outputs = lead.runner.infer(feeds)
        with lead.stage("postprocess"):
            actions = [check_action(lead.name, m.decode(outputs, i)) for i, m in enumerate(members)]
        return np.stack(actions), dict(lead.stage_ms)
    stage: dict[str, float] = {}
    actions = []
    for m, o in zip(members, observations):
        actions.append(m.query(o))
        for k, v in m.stage_ms.items():
            stage[k] = stage.get(k, 0.0) + v
    return np.stack(actions), stage


def run_batch(scenes: SceneBatch, members: Sequence[Policy], setup_id: str, split: str,
              try_indices: Sequence[int], tasklist, on_step: Callable[[], None] | None = None,
              ) -> tuple[list[dict], dict[str, Any]]:
    """Run up to N tries of one setup together; (records of the given tries, the batch record).

    Fewer tries than scenes: the spare scenes repeat the last try's start and their records are dropped,
    so a setup keeps one scene batch (rebuilding a GPU scene costs more than the spare scenes' physics).
    """
    from eval.runner import STAGES, try_record

    n = scenes.num_envs
    k = len(try_indices)
    if not 1 <= k <= n:
        raise BatchError(f"a batch of {n} scenes takes 1..{n} tries, got {k}")
    padded = list(try_indices) + [try_indices[-1]] * (n - k)
    seeds = [tasklist.seed(setup_id, t) for t in padded]
    starts = [tasklist.start(setup_id, t) for t in padded]
    scenes.reset(seeds, starts)
    for m, instruction, seed in zip(members, scenes.instructions, seeds):
        m.reset(instruction, seed=seed)
    t_start = time.monotonic()
    live = np.ones(n, dtype=bool)
    live[k:] = False  # spare scenes step on hold actions and are never queried
    steps = np.zeros(n, dtype=int)
    clipped = np.zeros(n, dtype=int)
    flags: list[set[str]] = [set() for _ in range(n)]
    margins = [dict.fromkeys(MARGIN_KEYS, 0.0) for _ in range(n)]
    finals: dict[int, dict[str, Any]] = {}  # a scene's info at the step its try ended
    share = [dict.fromkeys(STAGES, 0.0) for _ in range(n)]
    wall_end = np.zeros(n)
    query_ms: list[float] = []
    query_n: list[int] = []
    hold = np.array([0, 0, 0, 0, 0, 0, 1], dtype=np.float32)
    bytes_per_step: list[int] = []
    total_steps = 0
    while live.any():
        idx = np.flatnonzero(live)
        t0 = time.perf_counter()
        states = scenes.states(idx)
        t1 = time.perf_counter()
        if on_step is not None:
            on_step("policy")
        actions, stage = query_batch([members[i] for i in idx], [{"state": st, "instruction": scenes.instructions[i]}
                                                                  for i, st in zip(idx, states)])
        t2 = time.perf_counter()
        full = np.tile(hold, (n, 1))
        full[idx] = actions
        clipped[idx] += np.any(np.abs(actions) > ACTION_BOUND, axis=1)
        if on_step is not None:
            on_step("sim")
        info = scenes.step(full, live)
        t3 = time.perf_counter()
        total_steps += 1
        query_ms.append((t2 - t1) * 1e3)
        query_n.append(len(idx))
        # state read out and actions sent: what a state policy moves between host and device per step
        bytes_per_step.append(int(sum(v.nbytes for v in states[0].values()) * n + full.nbytes)
                              if scenes.sim == "gpu" else 0)
        pre, post = stage.get("preprocess", 0.0), stage.get("postprocess", 0.0)
        inference = stage.get("inference", (t2 - t1) * 1e3 - pre - post)
        this = {"observe": (t1 - t0) * 1e3, "preprocess": pre, "inference": inference, "postprocess": post,
                "physics": (t3 - t2) * 1e3, "render": 0.0,
                "other": max(0.0, (t2 - t1) * 1e3 - pre - post - inference)}
        for i in idx:
            for name, ms in this.items():
                share[i][name] += ms / len(idx)
            steps[i] += 1
            for name in STICKY_FLAGS:
                if bool(info[name][i]):
                    flags[i].add(name)
            for name in MARGIN_KEYS:
                margins[i][name] = max(margins[i][name], float(info[name][i]))
        ended = idx[np.array([bool(info["success"][i]) or bool(info["done"][i]) for i in idx], dtype=bool)]
        live[ended] = False
        wall_end[ended] = time.monotonic() - t_start
        for i in ended:
            finals[int(i)] = {key: info[key][i] for key in INFO_KEYS}
    records = []
    for i, t in enumerate(try_indices):
        f = finals[i]
        success, success_raw = bool(f["success"]), bool(f["success_raw"])
        if bool(f["rim"]) and not success_raw:
            flags[i].add("rim")
        fired = bool(f["disturbance_fired"])
        m = members[i]
        rec = try_record(setup_id, t, seeds[i], split, starts[i], tasklist, m, success=success,
                         success_raw=success_raw, flags=flags[i], margins=margins[i],
                         steps=int(steps[i]), blocks_inserted=int(f["blocks_inserted"]),
                         disturbance_step=int(f["disturbance_step"]) if fired else None, wall_s=float(wall_end[i]),
                         latencies_ms=[], warmup_ms=[], step_ms=share[i], actions_clipped=int(clipped[i]))
        rec["infer_queries"] = int(steps[i])
        rec["num_envs"] = n
        records.append(rec)
    wall = time.monotonic() - t_start
    warm = min(len(query_ms), members[0].warmup_queries)
    batch = {
        "v": BATCH_RECORD_VERSION, "setup": setup_id, "tries": list(try_indices), "num_envs": n, "sim": scenes.sim,
        "batched_queries": bool(members[0].batchable), "backend": members[0].backend, "steps": total_steps,
        "scene_steps": int(steps[:k].sum()), "wall_s": round(wall, 3),
        "query_ms": [float(f"{x:.3g}") for x in query_ms[warm:]], "query_batch": query_n[warm:],
        "warmup_ms": [float(f"{x:.3g}") for x in query_ms[:warm]],
        "host_device_bytes_per_step": float(np.mean(bytes_per_step)) if bytes_per_step else 0.0,
        "image_bytes_per_step": 0,  # state policies: no frames leave the simulator
    }
    return records, batch


def batch_summary(batches: Sequence[dict]) -> dict[str, Any] | None:
    """Latency at batch N and throughput over a run's batch records (None when the run had none)."""
    if not batches:
        return None
    q = np.array([x for b in batches for x in b["query_ms"]], dtype=float)
    sizes = np.array([x for b in batches for x in b["query_batch"]], dtype=float)
    wall = sum(b["wall_s"] for b in batches)
    tries = sum(len(b["tries"]) for b in batches)
    scene_steps = sum(b["scene_steps"] for b in batches)
    out = {
        "num_envs": sorted({b["num_envs"] for b in batches}), "sim": sorted({b["sim"] for b in batches}),
        "batched_queries": all(b["batched_queries"] for b in batches), "batches": len(batches), "tries": tries,
        "wall_s": round(wall, 3), "tries_per_s": tries / wall if wall else None,
        "scene_steps_per_s": scene_steps / wall if wall else None,
        "host_device_bytes_per_step": float(np.mean([b["host_device_bytes_per_step"] for b in batches])),
        "image_bytes_per_step": max(b["image_bytes_per_step"] for b in batches),
        "query_ms": None,
    }
    if len(q):
        out["query_ms"] = {"count": int(len(q)), "mean": float(q.mean()), "p50": float(np.percentile(q, 50)),
                           "p90": float(np.percentile(q, 90)), "p99": float(np.percentile(q, 99)),
                           "max": float(q.max()), "mean_batch": float(sizes.mean()),
                           "ms_per_scene": float((q / sizes).mean())}
    return out
