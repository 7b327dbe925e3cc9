"""Where the tries run: one executor interface, two implementations.

An executor takes a list of :class:`Job` (one try, or with ``--num-envs N`` up to N tries of one setup)
and yields ``(job, BatchResult)`` as jobs finish, in completion order; the caller (``eval.run``) appends
the records, so resume, dedup and the run folder's lock are the caller's and the same for every executor.
Each job runs on a :class:`TryWorker` (its scenes, its policies, the task list) through the one rollout
loop (:mod:`eval.rollout`); a watchdog turns a hung policy query or physics step into a failed try flagged
``policy_hang`` or ``sim_hang``.

- ``local`` (:mod:`eval.executors.local`): worker processes on this machine;
- ``ray`` (:mod:`eval.executors.ray_actors`): actors of a Ray cluster (``pip install -e '.[ray]'``); a dead
  actor's job is retried once, then its tries are recorded ``actor_died``.
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol

from eval.executors.base import (STARTUP_TIMEOUT_S, STEP_TIMEOUT_S, BatchResult, Job, TryWorker,  # noqa: F401
                                 WorkerError, video_file)

EXECUTORS = ("local", "ray")


class Executor(Protocol):
    def run(self, jobs: list[Job], failed_record: Callable[[Job, str], object]) -> Iterator[tuple[Job, BatchResult]]:
        """Run the jobs; ``failed_record(job, flag)`` makes the record of a try that could not finish."""

    def close(self) -> None:
        """Stop the workers (and what the executor started)."""


def make_executor(kind: str, n: int, request, video_dir: str | None, *, step_timeout_s: float = STEP_TIMEOUT_S,
                  address: str | None = None, gpus_per_actor: float = 0.0, episode_dir: str | None = None) -> Executor:
    """An executor of ``kind`` with ``n`` workers (processes or actors), each given the run's
    :class:`eval.request.RunRequest`; WorkerError (one line) if it cannot start. ``episode_dir``: where every
    try is staged as a dataset episode (eval.record; local workers, which share this machine's disk)."""
    if kind == "local":
        if address or gpus_per_actor:
            raise WorkerError("--address and --gpus-per-actor need --executor ray")
        from eval.executors.local import WorkerPool

        return WorkerPool(n, request, video_dir, step_timeout_s=step_timeout_s, episode_dir=episode_dir)
    if episode_dir is not None:
        raise WorkerError("recording a dataset runs on the local executor (its workers write the episodes)")
    if kind == "ray":
        from eval.executors.ray_actors import RayPool

        return RayPool(n, request, video_dir, step_timeout_s=step_timeout_s, address=address,
                       gpus_per_actor=gpus_per_actor)
    raise WorkerError(f"unknown executor {kind!r}; valid: {', '.join(EXECUTORS)}")
