"""Worker processes for ``eval.run``: each owns its scenes and its policy; a watchdog guards every step.

The parent hands out tries one at a time and appends each finished record
itself, so records are written in one place and a killed run loses at most the
tries in flight. A worker stamps a shared heartbeat before every policy query and
before every physics step, with the stage it enters; a worker whose heartbeat is
older than ``step_timeout_s`` is killed, its try is recorded as failed with the
flag ``policy_hang`` or ``sim_hang`` (the stage it hung in), and a fresh worker
takes over.
Starting a worker and building a scene are not steps: they get their own,
longer limit, so a heavily loaded machine does not turn slow imports into hangs.

What a worker owns and does per try is :class:`TryWorker`, shared with the Ray actors of
:mod:`eval.ray_executor`, so both executors run a try the same way.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Iterator

from env.setups import Setup

STEP_TIMEOUT_S = 120.0  # a policy query, or one control step's physics, taking longer than this is a hang
HANG_FLAGS = {"policy": "policy_hang", "sim": "sim_hang"}  # the flag of a try that hung in each stage
_STAGE_CODES = tuple(HANG_FLAGS)  # stage names by the code a worker writes into its shared stage value
SETUP_TIMEOUT_S = 900.0  # starting a worker or building a scene: slow under load, but not a step
_POLL_S = 0.2
_ORPHAN_CHECK_S = 2.0  # an idle worker checks this often whether its parent still exists


@dataclass(frozen=True)
class Job:
    setup: Setup
    try_index: int  # the first try of the job
    video: bool = False
    batch: tuple[int, ...] = ()  # --num-envs N: up to N tries of the setup run together (try_index the first)

    def try_indices(self) -> tuple[int, ...]:
        return self.batch or (self.try_index,)

    def tries(self) -> list["Job"]:
        """One job per try (a batch job's tries, or this job)."""
        return [Job(self.setup, t) for t in self.batch] if self.batch else [self]


@dataclass
class BatchResult:
    """What a job returns: the records of its tries (eval.records.TryRecord) and, for a batch of N > 1
    scenes, the batch record (None when it hung)."""
    records: list
    batch: dict | None = None


def video_file(job: Job) -> str:
    """File name of a try's video (under the run's videos/ folder)."""
    return f"{job.setup.id}_try{job.try_index:03d}.mp4"


class WorkerError(RuntimeError):
    """A worker stopped the run: bad action, bad model, or an unexpected exception (one line)."""


class TryWorker:
    """What one worker owns, whatever runs it (a local process or a Ray actor): the scenes of its current
    setup (state or camera observations, N of them with --num-envs N), the policies for that setup (one per
    scene), and the task list.

    ``run`` runs one job through :func:`eval.rollout.rollout`; ``on_step(stage)`` is the watchdog's heartbeat.
    A bad action raises :class:`eval.policies.base.BadActionError`.
    """

    def __init__(self, model: str, split: str, arm: str, options: dict | None = None, num_envs: int = 1,
                 sim: str = "cpu"):
        import torch

        torch.set_num_threads(1)  # one core per worker: W workers on W cores, no oversubscription
        from env.tasklist import load
        from eval.policies import get_model

        self.spec = get_model(model)
        self.split, self.arm, self.options = split, arm, dict(options or {})
        self.num_envs, self.sim = num_envs, sim
        self.tasklist = load(split)
        self._key = None  # (setup id, cameras) of the scenes held
        self.scenes = None
        self.members: list = []

    def prepare(self, job: Job):
        """(scenes, policies) for the job: built when the setup (or the need for cameras) changes, else kept."""
        from eval.rollout import Scenes, make_members

        cameras = job.video or self.spec.observes == "cameras"
        key = (job.setup.id, cameras)
        if key != self._key:
            if self.scenes is not None and self._key[0] == job.setup.id:
                self.scenes.close()  # same setup, other observations (a video try): keep the policies
                self.scenes = None
            else:
                self.close()
                factory = lambda: self.spec.factory(setup=job.setup, **self.options)  # noqa: E731
                self.members = make_members(factory(), self.num_envs, factory)
            self.scenes = Scenes(job.setup, self.num_envs, sim=self.sim, arm=self.arm, cameras=cameras)
            self._key = key
        return self.scenes, self.members

    def run(self, job: Job, on_step: Callable[[str], None] | None = None, video_path: str | None = None
            ) -> BatchResult:
        from eval.rollout import labelled, rollout

        scenes, members = self.prepare(job)
        if on_step is not None:
            on_step("sim")  # from here on the watchdog times every stage of every control step
        records, batch = rollout(scenes, members, self.split, job.try_indices(), self.tasklist, on_step=on_step,
                                 videos=[video_path] if (job.video and video_path) else None)
        return BatchResult(labelled(records, self.spec.name, self.spec.track, self.arm),
                           batch if self.num_envs > 1 else None)

    def close(self) -> None:
        if self.scenes is not None:
            self.scenes.close()
        self.scenes, self.members, self._key = None, [], None


def _worker_main(worker_id, model, split, arm, video_dir, options, num_envs, sim, jobs, results, heartbeat,
                 stage_code):
    """Loop of one worker process: run jobs until a None job arrives."""
    from eval.policies.base import BadActionError

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops the pool
    try:
        worker = TryWorker(model, split, arm, options, num_envs=num_envs, sim=sim)

        def beat(stage: str = "sim"):
            stage_code.value = _STAGE_CODES.index(stage)
            heartbeat.value = time.monotonic()

        parent = os.getppid()
        while True:
            try:
                job = jobs.get(timeout=_ORPHAN_CHECK_S)
            except queue.Empty:
                if os.getppid() != parent:  # the run was killed without closing its pool: do not linger
                    break
                continue
            if job is None:
                break
            video_path = os.path.join(video_dir, video_file(job)) if job.video else None
            try:
                result = worker.run(job, on_step=beat, video_path=video_path)
            except BadActionError as e:
                results.put(("error", worker_id, job, f"{job.setup.id} try {job.try_index}: {e}"))
                return
            except Exception as e:  # noqa: BLE001 - the policy or the scene raised: one line naming the try
                results.put(("error", worker_id, job, f"{job.setup.id} try {job.try_index}: {type(e).__name__}: "
                                                       f"{e}\n{traceback.format_exc()}"))
                return
            results.put(("record", worker_id, job, result))
        worker.close()
    except Exception as e:  # noqa: BLE001 - reported to the parent as one line, with the trace for debugging
        results.put(("error", worker_id, None, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


class WorkerPool:
    def __init__(self, n: int, model: str, split: str, arm: str, video_dir: str | None, options: dict | None = None,
                 step_timeout_s: float = STEP_TIMEOUT_S, num_envs: int = 1, sim: str = "cpu"):
        self.ctx = mp.get_context("spawn")  # no forked simulator state
        self.args = (model, split, arm, video_dir, dict(options or {}), num_envs, sim)
        self.step_timeout_s = step_timeout_s
        self.results = self.ctx.Queue()
        self.workers: dict[int, dict] = {}
        self._next_id = 0
        for _ in range(n):
            self._start_worker()

    def _start_worker(self) -> int:
        wid = self._next_id
        self._next_id += 1
        jobs = self.ctx.Queue()
        heartbeat = self.ctx.Value("d", time.monotonic())
        stage_code = self.ctx.Value("i", 0)
        proc = self.ctx.Process(target=_worker_main, args=(wid, *self.args, jobs, self.results, heartbeat, stage_code),
                                daemon=True)
        proc.start()
        self.workers[wid] = {"proc": proc, "jobs": jobs, "heartbeat": heartbeat, "stage": stage_code, "job": None,
                             "since": 0.0}
        return wid

    def run(self, jobs: list[Job], hang_record: Callable[..., object]) -> Iterator[tuple[Job, BatchResult]]:
        """Yield (job, BatchResult) as jobs finish, in completion order. ``hang_record(job, flag)`` makes the
        record of a try that could not finish."""
        pending = list(jobs)
        for wid in list(self.workers):
            self._feed(wid, pending)
        while any(w["job"] is not None for w in self.workers.values()):
            try:
                kind, wid, job, payload = self.results.get(timeout=_POLL_S)
            except queue.Empty:
                yield from self._check_hangs(pending, hang_record)
                continue
            if kind == "error":
                self.close()
                raise WorkerError(payload.splitlines()[0] if payload else "worker failed")
            self.workers[wid]["job"] = None
            yield job, payload
            self._feed(wid, pending)

    def _feed(self, wid: int, pending: list[Job]) -> None:
        w = self.workers[wid]
        if pending:
            w["job"] = pending.pop(0)
            w["heartbeat"].value = 0.0  # setting up (imports, scene); the worker stamps its first step
            w["since"] = time.monotonic()
            w["jobs"].put(w["job"])

    def _check_hangs(self, pending: list[Job], hang_record) -> Iterator[tuple[Job, dict]]:
        now = time.monotonic()
        for wid, w in list(self.workers.items()):
            if w["job"] is None:
                continue
            if not w["proc"].is_alive():
                self.close()
                raise WorkerError(f"worker {wid} died (exit code {w['proc'].exitcode}) during "
                                  f"{w['job'].setup.id} try {w['job'].try_index}")
            beat = w["heartbeat"].value
            stepping_hung = beat > 0 and now - beat > self.step_timeout_s
            setup_hung = beat == 0 and now - w["since"] > SETUP_TIMEOUT_S
            if stepping_hung or setup_hung:
                job = w["job"]
                flag = HANG_FLAGS[_STAGE_CODES[w["stage"].value]] if stepping_hung else "sim_hang"
                w["proc"].kill()
                w["proc"].join()
                del self.workers[wid]
                yield job, BatchResult([hang_record(j, flag) for j in job.tries()])
                new = self._start_worker()
                self._feed(new, pending)

    def close(self) -> None:
        for w in self.workers.values():
            if w["proc"].is_alive():
                w["jobs"].put(None)
        deadline = time.monotonic() + 5
        for w in self.workers.values():
            w["proc"].join(timeout=max(0.0, deadline - time.monotonic()))
            if w["proc"].is_alive():
                w["proc"].kill()
        self.workers.clear()
