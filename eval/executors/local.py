"""The local executor: worker processes on this machine, each owning its scenes and its policies; a watchdog
guards every step.

The parent hands out tries one at a time and appends each finished record
itself, so records are written in one place and a killed run loses at most the
tries in flight. A worker stamps a shared heartbeat before every policy query and
before every physics step, with the stage it enters; a worker whose heartbeat is
older than ``step_timeout_s`` is killed, its try is recorded as failed with the
flag ``policy_hang`` or ``sim_hang`` (the stage it hung in), and a fresh worker
takes over.
Starting a worker and building a scene are not steps: they get their own,
longer limit, so a heavily loaded machine does not turn slow imports into hangs.

What a worker owns and does per job is :class:`eval.executors.base.TryWorker`, shared with the Ray actors
of :mod:`eval.executors.ray_actors`, so both executors run a job the same way.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import time
import traceback
from typing import Callable, Iterator

from eval.records import HANG_FLAGS
from eval.executors.base import (STARTUP_TIMEOUT_S, STEP_TIMEOUT_S, BatchResult, Job, TryWorker,
                                 WorkerError, video_file)

_STAGE_CODES = tuple(HANG_FLAGS)  # stage names by the code a worker writes into its shared stage value
_POLL_S = 0.2
_ORPHAN_CHECK_S = 2.0  # an idle worker checks this often whether its parent still exists


def _worker_main(worker_id, request, video_dir, episode_dir, jobs, results, heartbeat, stage_code):
    """Loop of one worker process: run jobs until a None job arrives."""
    from eval.policies.base import BadActionError

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops the pool
    try:
        worker = TryWorker(request)

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
                result = worker.run(job, on_step=beat, video_path=video_path, episode_dir=episode_dir)
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
    def __init__(self, n: int, request, video_dir: str | None, step_timeout_s: float = STEP_TIMEOUT_S,
                 episode_dir: str | None = None):
        self.ctx = mp.get_context("spawn")  # no forked simulator state
        self.args = (request, video_dir, episode_dir)
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
            startup_hung = beat == 0 and now - w["since"] > STARTUP_TIMEOUT_S
            if stepping_hung or startup_hung:
                job = w["job"]
                flag = HANG_FLAGS[_STAGE_CODES[w["stage"].value]] if stepping_hung else "sim_hang"
                w["proc"].kill()
                w["proc"].join()
                del self.workers[wid]
                yield job, BatchResult([hang_record(j, flag) for j in job.tries()])
                if pending:  # a replacement only where a try waits for it (a worker's start-up is seconds of CPU)
                    self._feed(self._start_worker(), pending)

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
