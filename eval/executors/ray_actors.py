"""The Ray executor (``eval.run --executor ray``): tries sharded over the actors of a Ray cluster.

Each actor owns one :class:`eval.executors.base.TryWorker` (its scenes and its policy), exactly as a local worker
process does, and declares its resources (one CPU, ``gpus_per_actor`` GPUs). The driver hands out one try
at a time per actor and gets each record back as it finishes; ``eval.run`` appends it to ``tries.jsonl``
on the driver, so resume and dedup are those of a local run. With ``--num-envs N`` a job is a batch of up to
N tries of one setup, as in a local run. Because every try rebuilds its physics scene (eval.rollout) a
record does not depend on which actor ran it: a Ray run and a local run of the same tries give the same
records (timings aside).

Failures:

- an actor that dies (process killed, node lost) has its try retried once on a fresh actor; a second
  death records the try as failed with the flag ``actor_died`` and the run goes on;
- a try whose control steps stop (no step for ``step_timeout_s``) is a hang as in a local run: the actor
  is killed, the try recorded failed with the flag ``sim_hang``, a fresh actor takes over. Progress is a
  step counter the driver polls, timed with the driver's own monotonic clock (clocks of different
  machines are not comparable);
- a bad action or a policy that fails to load stops the run with one line (:class:`WorkerError`).

Videos are written by the actor to a temporary file on its own node and sent back to the driver, so
``--video`` works on a multi-machine cluster too. ``ray`` is imported only when a pool is made.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Callable, Iterator

from eval.executors.base import STARTUP_TIMEOUT_S, STEP_TIMEOUT_S, BatchResult, Job, WorkerError, video_file
from eval.records import HANG_FLAGS

_POLL_S = 0.2
_PROGRESS_EVERY_S = 1.0  # how often the driver asks a busy actor for its step count
_WATCH_GROUP = "watch"  # the actor's second thread: answers progress while a try runs in the first
MAX_RETRIES = 1  # a dead actor's try is run once more, then recorded as actor_died


def require_ray():
    """The ray module, or a one-line MissingDependencyError naming the extra."""
    from engines.optional import require

    return require("ray", "ray")


class _TryActor:
    """A Ray actor: one TryWorker, built on the first try (so that a model that fails to load is reported
    as an error of the run, not as a dead actor). ``progress`` runs in its own concurrency group."""

    def __init__(self, request):
        self.args = (request,)
        self.worker = None
        self.seq = -1
        self.steps = 0
        self.stage = "sim"

    def where(self) -> tuple[str, int]:
        import socket

        return socket.gethostname(), os.getpid()

    def progress(self) -> tuple[int, int, str]:
        """(sequence number of the current try, stages entered in it (0 while setting up), the stage it is
        in: "policy" or "sim")."""
        return self.seq, self.steps, self.stage

    def _beat(self, stage: str = "sim") -> None:
        self.stage = stage
        self.steps += 1

    def run(self, seq: int, job: Job) -> tuple[str, object, bytes | None]:
        from eval.policies.base import BadActionError
        from eval.executors.base import TryWorker

        self.seq, self.steps, self.stage = seq, 0, "sim"
        video_path = None
        try:
            if self.worker is None:
                self.worker = TryWorker(*self.args)
            if job.video:
                fd, video_path = tempfile.mkstemp(suffix=".mp4", prefix="sab_video_")
                os.close(fd)
            result = self.worker.run(job, on_step=self._beat, video_path=video_path)
            video = Path(video_path).read_bytes() if video_path else None
            return "record", result, video
        except BadActionError as e:
            return "error", f"{job.setup.id} try {job.try_index}: {e}", None
        except Exception as e:  # noqa: BLE001 - one line to the driver, as a local worker reports it
            return "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}", None
        finally:
            if video_path:
                Path(video_path).unlink(missing_ok=True)


class RayPool:
    """The executor interface (:class:`eval.executors.Executor`) over Ray actors: ``run`` yields (job, BatchResult) in
    completion order; ``close`` kills the actors (and stops Ray if this pool started it).

    ``address``: a cluster to connect to (``ray.init(address=...)``; "auto" finds a local one); None starts
    a local instance unless this process is already connected (as tests are). ``n`` actors, capped by what
    the cluster can place at once so that no try waits on an actor that cannot be scheduled.
    """

    def __init__(self, n: int, request, video_dir: str | None, step_timeout_s: float = STEP_TIMEOUT_S,
                 address: str | None = None, gpus_per_actor: float = 0.0, startup_timeout_s: float = STARTUP_TIMEOUT_S,
                 max_retries: int = MAX_RETRIES):
        ray = require_ray()
        self.ray = ray
        self.video_dir = video_dir
        self.step_timeout_s = step_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.max_retries = max_retries
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            try:
                ray.init(address=address, include_dashboard=False, logging_level="WARNING")
            except Exception as e:  # noqa: BLE001 - ConnectionError, ValueError...: one line
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise WorkerError(f"cannot start or reach Ray{f' at {address}' if address else ''}: {first}") from None
        resources = ray.cluster_resources()
        cpus, gpus = float(resources.get("CPU", 0)), float(resources.get("GPU", 0))
        if gpus_per_actor > gpus:
            self.close()
            raise WorkerError(f"each actor asks for {gpus_per_actor:g} GPU but the Ray cluster has {gpus:g}")
        fit = int(cpus) if gpus_per_actor <= 0 else min(int(cpus), int(gpus / gpus_per_actor + 1e-9))
        if fit < 1:
            self.close()
            raise WorkerError(f"the Ray cluster has no room for one actor (CPU {cpus:g}, GPU {gpus:g})")
        if n > fit:
            print(f"note: the Ray cluster holds {fit} actors at once (CPU {cpus:g}, GPU {gpus:g}); "
                  f"running {fit}, not {n}", file=sys.stderr)
            n = fit
        self.actor_cls = ray.remote(num_cpus=1, num_gpus=gpus_per_actor, max_restarts=0,
                                    concurrency_groups={_WATCH_GROUP: 1})(_TryActor)
        self.args = (request,)
        self.actors: dict[int, dict] = {}
        self._next_id = 0
        self._seq = 0
        for _ in range(n):
            self._start_actor()

    # ------------------------------------------------------------ actors
    def _start_actor(self) -> int:
        aid = self._next_id
        self._next_id += 1
        self.actors[aid] = {"handle": self.actor_cls.remote(*self.args), "job": None, "ref": None, "seq": -1,
                            "progress_ref": None, "polled": 0.0, "steps": 0, "changed": 0.0, "alive": False}
        return aid

    def _kill(self, aid: int) -> None:
        a = self.actors.pop(aid)
        try:
            self.ray.kill(a["handle"], no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def _feed(self, aid: int, pending: deque) -> None:
        a = self.actors[aid]
        if pending:
            job = pending.popleft()
            self._seq += 1
            now = time.monotonic()
            a.update(job=job, seq=self._seq, steps=0, changed=now, polled=0.0)
            a["since"] = now  # setup clock (imports, scene); restarted until the actor first answers
            a["ref"] = a["handle"].run.remote(self._seq, job)

    # ------------------------------------------------------------ the run
    def run(self, jobs: list[Job], failed_record: Callable[..., object]) -> Iterator[tuple[Job, BatchResult]]:
        """Yield (job, BatchResult) as jobs finish. ``failed_record(job, flag)`` makes the record of a try
        that could not finish (flag ``policy_hang``, ``sim_hang`` or ``actor_died``)."""

        def failed(job: Job, flag: str) -> BatchResult:
            return BatchResult([failed_record(j, flag) for j in job.tries()])

        ray = self.ray
        pending = deque(jobs)
        deaths: dict[Job, int] = {}
        yielded: set[tuple[str, int]] = set()  # a try is recorded once, whatever happens to its actors
        for aid in list(self.actors):
            self._feed(aid, pending)
        while any(a["job"] is not None for a in self.actors.values()):
            refs = {a["ref"]: aid for aid, a in self.actors.items() if a["ref"] is not None}
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=_POLL_S)
            for ref in ready:
                aid = refs[ref]
                job = self.actors[aid]["job"]
                try:
                    kind, payload, video = ray.get(ref)
                except ray.exceptions.RayTaskError as e:  # our code raised outside run's own handler
                    self.close()
                    raise WorkerError(str(e).strip().splitlines()[0]) from None
                except ray.exceptions.RayError as e:  # the actor or its node died
                    if getattr(e, "actor_init_failed", False) or "creation task" in str(e):
                        # the constructor is trivial, so a failed one means the code does not load on that node
                        self.close()
                        detail = [ln.strip() for ln in str(e).splitlines() if "Error" in ln]
                        raise WorkerError("a Ray actor could not start (is this project installed on every node?)"
                                          + (f": {detail[-1]}" if detail else "")) from None
                    self._kill(aid)
                    deaths[job] = deaths.get(job, 0) + 1
                    if deaths[job] > self.max_retries:
                        if (job.setup, job.try_index) not in yielded:
                            yielded.add((job.setup, job.try_index))
                            yield job, failed(job, "actor_died")
                    else:
                        pending.appendleft(job)  # retried first, on the fresh actor
                    if pending:  # a fresh actor only where a try waits for it (an idle one is a worker's start-up)
                        self._feed(self._start_actor(), pending)
                    continue
                if kind == "error":
                    self.close()
                    raise WorkerError(payload.splitlines()[0] if payload else "actor failed")
                a = self.actors[aid]
                a.update(job=None, ref=None, progress_ref=None)
                if (job.setup, job.try_index) not in yielded:
                    yielded.add((job.setup, job.try_index))
                    if video is not None and self.video_dir:
                        Path(self.video_dir, video_file(job)).write_bytes(video)
                    yield job, payload
                self._feed(aid, pending)
            for job, flag in self._check_hangs(pending):
                if (job.setup, job.try_index) not in yielded:
                    yielded.add((job.setup, job.try_index))
                    yield job, failed(job, flag)

    def _check_hangs(self, pending: deque) -> list[tuple[Job, str]]:
        ray = self.ray
        now = time.monotonic()
        hung = []
        for aid, a in list(self.actors.items()):
            if a["job"] is None:
                continue
            if a["progress_ref"] is not None:
                done, _ = ray.wait([a["progress_ref"]], timeout=0)
                if done:
                    try:
                        seq, steps, stage = ray.get(done[0])
                    except ray.exceptions.RayError:  # dying: the run ref reports it
                        seq, steps, stage = None, 0, "sim"
                    a["progress_ref"] = None
                    if seq is not None:
                        a["alive"] = True
                    if seq == a["seq"] and steps != a["steps"]:
                        a["steps"], a["changed"], a["stage"] = steps, now, stage
            if a["progress_ref"] is None and now - a["polled"] >= _PROGRESS_EVERY_S:
                a["progress_ref"] = a["handle"].progress.options(concurrency_group=_WATCH_GROUP).remote()
                a["polled"] = now
            if not a["alive"]:
                a["since"] = now  # not placed or not started yet: waiting for resources is not a hang
                continue
            stepping_hung = a["steps"] > 0 and now - a["changed"] > self.step_timeout_s
            startup_hung = a["steps"] == 0 and now - a["since"] > self.startup_timeout_s
            if stepping_hung or startup_hung:
                job = a["job"]
                self._kill(aid)
                hung.append((job, HANG_FLAGS[a.get("stage", "sim")] if stepping_hung else "sim_hang"))
                if pending:
                    self._feed(self._start_actor(), pending)
        return hung

    def close(self) -> None:
        for aid in list(self.actors):
            self._kill(aid)
        if self._owns_ray and self.ray.is_initialized():
            self.ray.shutdown()
            self._owns_ray = False
