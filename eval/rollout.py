"""The one episode loop: N scenes of one setup stepped together, the batch of one included.

:func:`rollout` runs up to N tries of one setup on :class:`Scenes` and returns their
:class:`eval.records.TryRecord` and the batch's own record. Every evaluation runs
through it: ``eval.run`` and ``eval.orin`` (one scene per worker, or ``--num-envs N``),
``eval.training.demos``, the benchmarks and the tests.

Scenes (``sim``):

* ``cpu``: N CPU PhysX scenes in one process, stepped one after another. It is
  no faster than ``--workers`` for physics, but the policy's queries of all
  live scenes become one model call (a camera policy's frames are stacked into
  one batch), and it is the reference the GPU physics is compared with.
* ``gpu``: one ManiSkill environment with ``num_envs=N`` on SAPIEN's GPU PhysX
  (``physx_cuda``); every step advances all N scenes. With cameras, the N
  scenes are rendered in parallel into torch CUDA tensors, and a scene's
  frames reach the policy as views of them: a camera policy preprocesses them
  on the device and its runner takes them by DLPack (JAX) or device pointer
  (TensorRT), so no image crosses between host and device (counted per step
  in the batch record: ``image_bytes_per_step``, 0 on that path).

Scenes whose try has ended step on the hold action until the batch ends (GPU)
or are not stepped (CPU). Fewer tries than scenes: the spare scenes repeat the
last try's start and their records are dropped.

What is rendered: camera observations are rendered only for the steps some
live policy reads (``Policy.reads_observation``; Octo reads the frames of its
history window), or every step while a video is recorded. Other steps'
observations have ``images`` None. The frames a policy receives are those of a
renderer rendering every step (tested byte for byte).

Timing (each try's ``step_ms``): per control step, observe (state read-out or
frames taken from the scenes), preprocess, inference, postprocess (the query,
as the policy times its stages), physics (``env.step`` less its render),
render (the scenes' sensor renders, as the task times them), other (the rest
of the loop: bookkeeping, video). The stages of a step add up to its wall
time, and a step's time is split evenly over the scenes live in it. With one
scene a try's ``infer_ms`` holds its queries' times; with N scenes the batched
calls are timed once, in the batch record (``batches.jsonl``: query ms with the
live batch size, steps, wall time, bytes between host and device per step).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from env.predicate import MARGIN_KEYS, STICKY_FLAGS
from env.setups import Setup
from eval.policies.base import ACTION_BOUND, HOLD_ACTION, Policy, query_members
from eval.records import TryRecord

SIMS = ("cpu", "gpu")
BATCH_RECORD_VERSION = 1
STAGES = ("observe", "preprocess", "inference", "postprocess", "physics", "render", "other")
INFO_KEYS = ("success", "success_raw", *STICKY_FLAGS, "rim", "blocks_inserted", "disturbance_fired",
             "disturbance_step", *MARGIN_KEYS, "matched", "deep", "released", "settled", "success_streak")


class BatchError(ValueError):
    """Scenes or a batch that cannot run as asked (one line)."""


def gpu_sim_unavailable_reason() -> str | None:
    """Why GPU simulation cannot run here, or None."""
    from engines.zero_copy import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    return f"{reason} (SAPIEN's GPU PhysX needs an NVIDIA GPU)" if reason else None


def check_batch_request(num_envs: int, sim: str, observes: str, setups: Sequence[Setup] = ()) -> None:
    """One-line BatchError for a --num-envs request this machine, model or these setups cannot run."""
    if num_envs < 1:
        raise BatchError(f"--num-envs must be at least 1, got {num_envs}")
    if sim not in SIMS:
        raise BatchError(f"unknown --sim {sim!r}; valid: {', '.join(SIMS)}")
    if num_envs == 1:
        return
    if sim == "gpu":
        reason = gpu_sim_unavailable_reason()
        if reason:
            raise BatchError(f"--num-envs {num_envs} --sim gpu needs GPU simulation: {reason}; "
                             "use --sim cpu to run the batched loop on CPU scenes")
        # the rendered sub-scenes of one GPU simulation share their materials (env/task.py)
        per_try = [s.id for s in setups if s.random_colors or s.color_swap]
        if observes == "cameras" and per_try:
            raise BatchError(f"setups {', '.join(per_try)} draw colours per try, which the rendered GPU scenes of "
                             "one batch share: run them with --sim cpu, or --num-envs 1")


def _numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()  # a few booleans per scene on the GPU: the only device->host copy of a step
    return np.asarray(x)


class Scenes:
    """N scenes of one setup behind one interface, batch first (see the module docstring)."""

    def __init__(self, setup: Setup, num_envs: int = 1, sim: str = "cpu", arm: str = "panda",
                 cameras: bool = False, max_steps: int | None = None):
        from env import make_env, one_torch_thread

        if sim not in SIMS:
            raise BatchError(f"unknown sim {sim!r}; valid: {', '.join(SIMS)}")
        one_torch_thread()
        self.setup, self.num_envs, self.sim, self.cameras = setup, num_envs, sim, cameras
        obs_mode = "rgb" if cameras else "state"
        if sim == "gpu":
            # state scenes need no renderer, and without one a batch may mix appearances (env/task.py)
            render = {} if cameras else {"render_backend": "none"}
            self.envs = [make_env(setup, arm=arm, obs_mode=obs_mode, max_steps=max_steps, num_envs=num_envs,
                                  sim_backend="physx_cuda", **render)]
        else:
            self.envs = [make_env(setup, arm=arm, obs_mode=obs_mode, max_steps=max_steps) for _ in range(num_envs)]
        self.instructions: list[str] = []
        # the last observation (camera frames): one per CPU scene; one batched for the GPU simulation
        self._obs: list[Any] = [None] * (1 if sim == "gpu" else num_envs)
        self.image_bytes = 0  # image bytes copied from the device to the host so far

    def reset(self, seeds: Sequence[int], starts: Sequence[Any]) -> None:
        """Fresh scenes at the given starts: rebuilt (about 0.2 s on CPU), because PhysX keeps contact and
        solver warm-start caches across a plain reset, so that a try's outcome would otherwise depend on the
        tries run before it in the same scene (measured: up to 6 steps on G02)."""
        if self.sim == "gpu":
            u = self.envs[0].unwrapped
            u.render_sensors = True
            self._obs[0], _ = self.envs[0].reset(seed=[int(s) for s in seeds],
                                                 options={"starts": list(starts), "reconfigure": True})
            self.instructions = list(u.instructions)
            return
        self.instructions = []
        for i, (env, seed, start) in enumerate(zip(self.envs, seeds, starts)):
            env.unwrapped.render_sensors = True  # a try's first observation is always read
            self._obs[i], _ = env.reset(seed=int(seed), options={"start": start, "reconfigure": True})
            self.instructions.append(env.unwrapped.instructions[0])

    def observations(self, idx: Sequence[int], observes: str = "state") -> list[dict[str, Any]]:
        """What the policies of scenes ``idx`` observe (``observes``): the exact state, or the camera frames
        (numpy views of the rendered images, None where the step was not rendered), proprioception and the
        instruction, or both ("state+cameras": a state policy driving the arm while a camera model's queries
        are recorded, :mod:`eval.calibration`)."""
        if observes == "state+cameras":
            return [{**c, **s} for c, s in zip(self.observations(idx, "cameras"), self.observations(idx, "state"))]
        if observes == "state":
            if self.sim == "gpu":
                batch = self.envs[0].unwrapped.task_state()  # one read-out for the whole simulation
                return [{"state": {k: v[i] for k, v in batch.items()}, "instruction": self.instructions[i]}
                        for i in idx]
            return [{"state": {k: v[0] for k, v in self.envs[i].unwrapped.task_state().items()},
                     "instruction": self.instructions[i]} for i in idx]
        if not self.cameras:
            raise BatchError("a camera policy needs scenes made with cameras=True")
        out = []
        for i in idx:
            frames = self.frames(i, host=self.sim == "cpu")
            images = None if frames is None else {"third_person": frames[0], "wrist": frames[1]}
            out.append({"images": images, "proprio": self.proprio(i), "instruction": self.instructions[i]})
        return out

    def proprio(self, i: int) -> np.ndarray:
        """Scene i's joint positions (the arm's, then the gripper's), as camera policies observe them."""
        obs, row = (self._obs[0], i) if self.sim == "gpu" else (self._obs[i], 0)
        return _numpy(obs["agent"]["qpos"][row])

    def joint_names(self) -> list[str]:
        """The names of the joints :meth:`proprio` gives, in its order."""
        return [j.name for j in self.envs[0].unwrapped.agent.robot.get_active_joints()]

    def frames(self, i: int, host: bool = True) -> tuple[Any, Any] | None:
        """Scene i's last rendered (third-person, wrist) frames; None when that step was not rendered.
        ``host``: numpy (a frame rendered on a device is copied, its bytes counted); else GPU scenes' frames
        are views of the rendered CUDA tensors (no copy)."""
        obs, row = (self._obs[0], i) if self.sim == "gpu" else (self._obs[i], 0)
        frames = camera_frames(self.envs[0], obs, row)
        if frames is None or not host:
            return frames
        return self._host(frames[0], image=True), self._host(frames[1], image=True)

    def _host(self, tensor, image: bool = False) -> np.ndarray:
        """A numpy view of a CPU tensor (no copy); a CUDA tensor (a GPU renderer beside CPU physics) is copied
        to the host, and its bytes counted when it is an image."""
        if tensor.is_cuda:
            if image:
                self.image_bytes += tensor.numel() * tensor.element_size()
            return tensor.cpu().numpy()
        return tensor.numpy()

    def step(self, actions: np.ndarray, live: np.ndarray, render: np.ndarray) -> tuple[dict[str, np.ndarray], float]:
        """Apply (N, 7) actions (rows of ended tries are ignored), rendering the scenes ``render`` asks for;
        (the info of every scene as numpy (N,) arrays with ``done`` = terminated or truncated, render ms)."""
        if self.sim == "gpu":
            import torch

            u = self.envs[0].unwrapped
            u.render_sensors = bool(np.any(render & live))  # the N scenes render together or not at all
            u.last_render_ms = 0.0
            a = torch.as_tensor(np.asarray(actions, dtype=np.float32), device=u.device)
            self._obs[0], _, term, trunc, info = self.envs[0].step(a)
            out = {k: _numpy(v) for k, v in info.items() if k in INFO_KEYS}
            out["done"] = _numpy(term) | _numpy(trunc)
            return out, u.last_render_ms
        rows: list[dict[str, Any] | None] = []
        render_ms = 0.0
        for i, env in enumerate(self.envs):
            if not live[i]:
                rows.append(None)
                continue
            u = env.unwrapped
            u.render_sensors = bool(render[i])
            u.last_render_ms = 0.0
            self._obs[i], _, term, trunc, info = env.step(actions[i])
            render_ms += u.last_render_ms
            row = {k: _numpy(info[k])[0] for k in INFO_KEYS}
            row["done"] = bool(term[0]) or bool(trunc[0])
            rows.append(row)
        template = next(r for r in rows if r is not None)
        return {k: np.array([(r if r is not None else template)[k] for r in rows]) for k in template}, render_ms

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []


def camera_frames(env, obs, row: int = 0) -> tuple[Any, Any] | None:
    """The (third-person, wrist) RGB tensors of scene ``row`` in an observation of ``env``; None when the
    step was not rendered."""
    sensors = obs["sensor_data"]
    if not sensors:
        return None
    return sensors["third_person"]["rgb"][row], sensors[env.unwrapped.arm.wrist_camera_uid]["rgb"][row]


def _observation_bytes(observation: dict[str, Any]) -> int:
    if "state" in observation:
        return sum(v.nbytes for v in observation["state"].values())
    return int(observation["proprio"].nbytes)


def observation_for(policy: Policy, env, obs) -> dict[str, Any]:
    """What ``policy`` observes of one plain scene (``env``, its last ``obs``), as :meth:`Scenes.observations`
    gives it: for hand-written loops in tests and tools."""
    u = env.unwrapped
    if policy.observes == "state":
        return {"state": {k: v[0] for k, v in u.task_state().items()}, "instruction": u.instructions[0]}
    frames = camera_frames(env, obs)
    images = None if frames is None else {"third_person": _numpy(frames[0]), "wrist": _numpy(frames[1])}
    return {"images": images, "proprio": obs["agent"]["qpos"][0].cpu().numpy(), "instruction": u.instructions[0]}


def make_members(policy: Policy, n: int, factory: Callable[[], Policy]) -> list[Policy]:
    """N policies, one per scene: spawned from ``policy`` (shared runner) when batchable, else built anew."""
    if policy.batchable:
        return [policy] + [policy.spawn() for _ in range(n - 1)]
    return [policy] + [factory() for _ in range(n - 1)]


def try_starts(setup: Setup, split: str, try_indices: Sequence[int], tasklist=None) -> tuple[list[int], list]:
    """(seeds, starts) of tries: from the locked task list when given (every benchmark run), else drawn from
    each try's seed (tests, quick experiments)."""
    if tasklist is not None:
        return ([tasklist.seed(setup.id, t) for t in try_indices], [tasklist.start(setup.id, t) for t in try_indices])
    from env.starts import derive_seed, sample_start

    seeds = [derive_seed(split, setup.id, t) for t in try_indices]
    return seeds, [sample_start(setup, np.random.default_rng(s)) for s in seeds]


def rollout(scenes: Scenes, members: Sequence[Policy], split: str, try_indices: Sequence[int], tasklist=None,
            on_step: Callable[[str], None] | None = None, videos: Sequence[str | None] | None = None,
            episodes: Sequence[str | None] | None = None) -> tuple[list[TryRecord], dict[str, Any]]:
    """Run up to N tries of the scenes' setup together, from their starts to success or the step limit;
    (the tries' records, the batch record). ``on_step(stage)`` is called before every policy query
    ("policy") and every physics step ("sim"): the watchdog's heartbeat. ``videos``: an mp4 path per try
    (None: no video); a try with one renders every step. ``episodes``: a folder per try (None: not recorded)
    where the try is staged as a dataset episode (:mod:`eval.lerobot.episode`: the frames each action was
    chosen from, the joint positions, the actions, and the expert's labels where the policy gives them:
    :meth:`Policy.expert_label`); a recorded try renders every step."""
    setup, n = scenes.setup, scenes.num_envs
    k = len(try_indices)
    if not 1 <= k <= n:
        raise BatchError(f"a batch of {n} scenes takes 1..{n} tries, got {k}")
    if len(members) != n:
        raise BatchError(f"{n} scenes need {n} policies, got {len(members)}")
    padded = list(try_indices) + [try_indices[-1]] * (n - k)
    seeds, starts = try_starts(setup, split, padded, tasklist)
    if n > 1:
        members[0].prepare_batch(n)
    scenes.reset(seeds, starts)
    for m, instruction, seed, start in zip(members, scenes.instructions, seeds, starts):
        m.set_start(start)
        m.reset(instruction, seed=seed)
        m.latencies_ms, m.warmup_ms = [], []
    writers = [None] * n
    if videos is not None:
        from eval.video import TryVideo

        writers = [TryVideo(p) if p else None for p in list(videos) + [None] * (n - len(videos))]
    recorders: list[Any] = [None] * n
    if episodes is not None:
        from env.setups import CONTROL_FREQ
        from eval.lerobot.episode import EpisodeRecording

        if not scenes.cameras:
            raise BatchError("a recorded try needs scenes made with cameras=True")
        recorders = [EpisodeRecording(p, CONTROL_FREQ, scenes.joint_names()) if p else None
                     for p in list(episodes) + [None] * (n - len(episodes))]
    live = np.zeros(n, dtype=bool)
    live[:k] = True  # spare scenes are never queried (on GPU they step on the hold action)
    steps = np.zeros(n, dtype=int)
    clipped = np.zeros(n, dtype=int)
    queries = np.zeros(n, dtype=int)
    flags: list[set[str]] = [set() for _ in range(n)]
    margins = [dict.fromkeys(MARGIN_KEYS, 0.0) for _ in range(n)]
    finals: dict[int, dict[str, Any]] = {}  # a scene's info at the step its try ended
    share = [dict.fromkeys(STAGES, 0.0) for _ in range(n)]
    wall_end = np.zeros(n)
    query_ms: list[float] = []
    query_n: list[int] = []
    bytes_per_step: list[int] = []
    image_bytes_0 = scenes.image_bytes + members[0].moved_image_bytes()
    total_steps = 0
    t_start = time.monotonic()
    while live.any():
        t0 = time.perf_counter()
        idx = np.flatnonzero(live)
        observations = scenes.observations(idx, members[0].observes)
        t1 = time.perf_counter()
        if on_step is not None:
            on_step("policy")
        actions, stage, ran = query_members([members[i] for i in idx], observations)
        t2 = time.perf_counter()
        full = np.tile(HOLD_ACTION, (n, 1))
        full[idx] = actions
        for j, i in enumerate(idx):
            if recorders[i] is not None:  # the frames this action was chosen from: the scene has not stepped yet
                from eval.training.state_features import state_vector

                state = observations[j].get("state") or scenes.observations([i], "state")[0]["state"]
                recorders[i].add(scenes.frames(i), scenes.proprio(i), state_vector(state), actions[j],
                                 members[i].expert_label())
        clipped[idx] += np.any(np.abs(actions) > ACTION_BOUND, axis=1)
        queries[idx] += ran
        render = np.zeros(n, dtype=bool)
        for i in idx:
            render[i] = (writers[i] is not None or recorders[i] is not None
                         or members[i].reads_observation(int(steps[i]) + 1))
        if on_step is not None:
            on_step("sim")
        info, render_ms = scenes.step(full, live, render)
        t3 = time.perf_counter()
        total_steps += 1
        steps[idx] += 1
        if any(ran):
            query_ms.append((t2 - t1) * 1e3)
            query_n.append(int(sum(ran)))
        # state (or proprioception) read out and actions sent: what moves between host and device per step
        bytes_per_step.append(int(_observation_bytes(observations[0]) * n + full.nbytes) if scenes.sim == "gpu" else 0)
        for i in idx:
            if writers[i] is not None:
                writers[i].add(*scenes.frames(i), int(steps[i]), {key: v[i:i + 1] for key, v in info.items()})
            if recorders[i] is not None:
                recorders[i].step_result(bool(info["success"][i]))
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
        t4 = time.perf_counter()
        pre, post = stage.get("preprocess", 0.0), stage.get("postprocess", 0.0)
        query = (t2 - t1) * 1e3
        inference = stage.get("inference", query - pre - post)  # a policy that times no stage: all inference
        this = {"observe": (t1 - t0) * 1e3, "preprocess": pre, "inference": inference, "postprocess": post,
                "physics": (t3 - t2) * 1e3 - render_ms, "render": render_ms,
                "other": (t4 - t3) * 1e3 + (query - pre - post - inference)}
        for i in idx:
            for name, ms in this.items():
                share[i][name] += ms / len(idx)
    for w in writers:
        if w is not None:
            w.write()
    for i, r in enumerate(recorders[:k]):
        if r is not None:
            r.finish({"setup": setup.id, "try_index": int(try_indices[i]), "seed": int(seeds[i]), "split": split,
                      "instruction": scenes.instructions[i]})
    records = []
    for i, t in enumerate(try_indices):
        f, m = finals[i], members[i]
        if bool(f["rim"]) and not bool(f["success_raw"]):
            flags[i].add("rim")
        records.append(TryRecord(
            setup=setup.id, try_index=t, seed=seeds[i], split=split, disturbance=setup.disturbance,
            tasklist_sha256=tasklist.sha256 if tasklist is not None else None, success=bool(f["success"]),
            success_raw=bool(f["success_raw"]), flags=tuple(sorted(flags[i])), target=starts[i].target,
            max_plate_overlap_mm=margins[i]["plate_overlap"] * 1e3,
            max_free_energy_gain_mj=margins[i]["free_energy_gain"] * 1e3, steps=int(steps[i]),
            actions_clipped=int(clipped[i]), blocks_inserted=int(f["blocks_inserted"]),
            disturbance_step=int(f["disturbance_step"]) if bool(f["disturbance_fired"]) else None,
            backend=m.backend, weights_sha256=getattr(m, "weights_sha256", None), note=getattr(m, "note", None),
            wall_s=float(wall_end[i]), step_ms=share[i], num_envs=n,
            # one scene: its own queries' times; N scenes: the batched calls', in the batch record
            infer_ms=tuple(m.latencies_ms) if n == 1 else (), warmup_ms=tuple(m.warmup_ms) if n == 1 else (),
            infer_queries=int(queries[i]), policy_fields=m.record_fields() if n == 1 else {}))
    warm = min(len(query_ms), members[0].warmup_queries)
    # frames copied from a device renderer to the host, per step (0 where frames are rendered in host memory)
    image_bytes = (scenes.image_bytes + members[0].moved_image_bytes() - image_bytes_0) / total_steps
    batch = {
        "v": BATCH_RECORD_VERSION, "setup": setup.id, "tries": list(try_indices), "num_envs": n, "sim": scenes.sim,
        "batched_queries": bool(members[0].batchable), "backend": members[0].backend, "steps": total_steps,
        "scene_steps": int(steps[:k].sum()), "wall_s": round(time.monotonic() - t_start, 3),
        "query_ms": [float(f"{x:.3g}") for x in query_ms[warm:]], "query_batch": query_n[warm:],
        "warmup_ms": [float(f"{x:.3g}") for x in query_ms[:warm]],
        "host_device_bytes_per_step": float(np.mean(bytes_per_step)) if bytes_per_step else 0.0,
        "image_bytes_per_step": image_bytes,
    }
    return records, batch


def run_try(scenes: Scenes, policy: Policy, split: str, try_index: int, tasklist=None,
            on_step: Callable[[str], None] | None = None, video_path: str | None = None) -> TryRecord:
    """One try on a scene of one (a rollout of one): its record."""
    records, _ = rollout(scenes, [policy], split, [try_index], tasklist, on_step=on_step,
                         videos=[video_path] if video_path else None)
    return records[0]


# what the run's identity labels every record with (eval.import_vla_eval labels imported records the same way)
LABELS = ("model", "track", "arm", "precision", "profile", "weights", "appearance", "max_steps")


def labelled(records: Sequence[TryRecord], identity: dict[str, Any]) -> list[TryRecord]:
    """The records with the run's identity (:meth:`eval.request.RunRequest.identity`: model, track, arm,
    precision, profile, weights, appearance, max_steps; the backend is the one each policy ran on, as the
    rollout recorded it)."""
    keep = {k: v for k, v in identity.items() if k in LABELS}
    return [replace(r, **keep) for r in records]
