"""What both executors share: the job, its result, and the worker that runs it (:class:`TryWorker`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from env.setups import Setup

STEP_TIMEOUT_S = 120.0  # a policy query, or one control step's physics, taking longer than this is a hang
STARTUP_TIMEOUT_S = 900.0  # starting a worker or building a scene: slow under load, but not a step


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
    """What one worker owns, whatever runs it (a local process or a Ray actor): the run's request (the model
    resolved once, in the parent), the scenes of its current setup (state or camera observations, as the
    model observes; N of them with --num-envs N), the policies for that setup (one per scene), and the task
    list.

    ``run`` runs one job through :func:`eval.rollout.rollout`; ``on_step(stage)`` is the watchdog's heartbeat.
    A bad action raises :class:`eval.policies.base.BadActionError`.
    """

    def __init__(self, request):
        from env import one_torch_thread
        from env.tasklist import load

        one_torch_thread()  # before the policies are built: one core per worker, W workers on W cores

        self.request = request
        self.tasklist = load(request.split)
        self._key = None  # (setup id, cameras) of the scenes held
        self.scenes = None
        self.members: list = []

    def prepare(self, job: Job):
        """(scenes, policies) for the job: built when the setup (or the need for cameras) changes, else kept."""
        from eval.rollout import Scenes, make_members

        r = self.request
        cameras = job.video or r.observes == "cameras" or r.record
        key = (job.setup.id, cameras)
        if key != self._key:
            if self.scenes is not None and self._key[0] == job.setup.id:
                self.scenes.close()  # same setup, other observations (a video try): keep the policies
                self.scenes = None
            else:
                self.close()
                factory = lambda: r.policy(job.setup)  # noqa: E731
                self.members = make_members(factory(), r.num_envs, factory)
            self.scenes = Scenes(job.setup, r.num_envs, sim=r.sim, arm=r.arm, cameras=cameras, max_steps=r.max_steps)
            self._key = key
        return self.scenes, self.members

    def run(self, job: Job, on_step: Callable[[str], None] | None = None, video_path: str | None = None,
            episode_dir: str | None = None) -> BatchResult:
        """The job's tries; with ``episode_dir`` each is staged there as a dataset episode (eval.record)."""
        from eval.lerobot.episode import episode_name
        from eval.rollout import labelled, rollout

        from eval.policies.base import ConnectionLost

        def attempt():
            scenes, members = self.prepare(job)
            if on_step is not None:
                on_step("sim")  # from here on the watchdog times every stage of every control step
            episodes = None if episode_dir is None else [
                str(Path(episode_dir, episode_name(job.setup.id, t))) for t in job.try_indices()]
            return rollout(scenes, members, self.request.split, job.try_indices(), self.tasklist, on_step=on_step,
                           videos=[video_path] if (job.video and video_path) else None, episodes=episodes)

        try:
            records, batch = attempt()
        except ConnectionLost as e:  # a model server's connection dropped: once more, on new connections
            print(f"{job.setup.id} try {job.try_index}: {e}; running it again on a new connection", file=sys.stderr)
            self.close()
            records, batch = attempt()  # a second loss propagates: the run stops in one line
            records = [replace(r, flags=tuple(sorted({*r.flags, "server_error"}))) for r in records]
        return BatchResult(labelled(records, self.request.identity()), batch if self.request.num_envs > 1 else None)

    def close(self) -> None:
        if self.scenes is not None:
            self.scenes.close()
        for m in self.members:  # a served model's policies hold connections
            getattr(m, "close", lambda: None)()
        self.scenes, self.members, self._key = None, [], None
