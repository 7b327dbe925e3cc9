"""Evaluate a model on the shape-assembly benchmark.

Example:
    python -m eval.run --model scripted --split dev --setups A01 --tries 20 --out runs/a01

Writes OUT/tries.jsonl (one JSON object per finished try, flushed as it ends),
then the report (summary.json, per_config.csv, REPORT.md, plots) into OUT.
Rerunning the same command continues where it stopped; --fresh starts over.
Exit status: 0 done, 2 bad input (one line), 1 a worker failed, 130 interrupted,
3 done but some tries did not finish (flagged policy_hang, sim_hang or actor_died).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from env.arms import ARMS, UnknownArmError
from env.setups import UnknownSetupError
from env.starts import SPLITS
from eval.executors import EXECUTORS
from eval.records import UNFINISHED_FLAGS, RecordsError, max_steps_label
from eval.request import MODEL_CONFIGS, ModelConfig, RunRequest, UnknownModelError, add_model_arguments

EXIT_HUNG = 3  # the run finished, but some tries were stopped by the watchdog or lost with their actor


def build_parser(prog: str = "python -m eval.run", description: str | None = None,
                 out_default: str | None = None) -> argparse.ArgumentParser:
    """eval.run's options (eval.orin adds its own); ``out_default``: --out may be left out (its help names it)."""
    p = argparse.ArgumentParser(prog=prog, description=description or __doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help=f"one of: {', '.join(MODEL_CONFIGS)}; or package.module:PolicyClass")
    p.add_argument("--split", default="dev", help=f"one of: {', '.join(SPLITS)} (default dev)")
    p.add_argument("--setups", default="A01", help="ids, group letters (A..G), FB or all, comma-separated")
    p.add_argument("--tries", type=int, default=1, help="tries per setup: the first N of the split's task list")
    p.add_argument("--arm", default="panda", help=f"one of: {', '.join(ARMS)}")
    p.add_argument("--workers", type=int, default=1, help="worker processes, each with its own scene")
    p.add_argument("--video", type=int, default=0, metavar="K", help="mp4 of the first K tries of each setup")
    p.add_argument("--num-envs", type=int, default=1, metavar="N",
                   help="scenes per worker stepped together, their policy queries batched into one model "
                        "call (eval.rollout)")
    p.add_argument("--sim", default=None, choices=("cpu", "gpu"),
                   help="physics of --num-envs scenes: gpu (SAPIEN GPU PhysX, needs CUDA) or cpu; "
                        "default gpu where CUDA is available")
    p.add_argument("--step-timeout", type=float, default=None,
                   help="seconds a policy query, or one control step's physics, may take before the watchdog "
                        "stops the try and flags it policy_hang or sim_hang")
    x = p.add_argument_group("executor (where the tries run)")
    x.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local: worker processes on this machine; ray: actors of a Ray cluster "
                        "(pip install -e '.[ray]'), --workers of them")
    x.add_argument("--address", help="Ray cluster to connect to (e.g. auto or HOST:6379); default: a local "
                   "instance, or $RAY_ADDRESS (ray only)")
    x.add_argument("--gpus-per-actor", type=float, default=0.0, metavar="G",
                   help="GPUs each Ray actor declares, e.g. 1 or 0.5, for GPU policies (ray only; default 0)")
    add_model_arguments(p)
    p.add_argument("--replay-latency", metavar="FILE", help="any model: delay every action by a latency drawn from "
                   "a measured profile (a tries.jsonl with infer_ms, or a JSON list of ms), or by published:LABEL, "
                   "the spec's Orin ms/query of LABEL (e.g. published:octo-small-1.5): what a device's latency does "
                   "to success")
    p.add_argument("--max-steps", type=int, metavar="N",
                   help="a smoke run: cut every try at N control steps (the setups' own: 300, full board 900). Its "
                        "records, report and results page say so; success is meaningless and it is never ranked")
    p.add_argument("--out", required=out_default is None,
                   help="output folder" + (f" (default: {out_default})" if out_default else ""))
    p.add_argument("--fresh", action="store_true", help="discard what OUT holds and start over")
    # an evaluation runs each setup's first N tries; eval.record alone takes others (--first-try), through this
    p.set_defaults(first_try=0)
    return p


@dataclass(frozen=True)
class ExecutorSettings:
    """Where the tries run (not part of what they are: two runs of a request on different executors give the
    same records)."""

    kind: str = "local"
    workers: int = 1
    address: str | None = None
    gpus_per_actor: float = 0.0
    step_timeout_s: float | None = None
    video: int = 0

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {self.workers}")
        if self.step_timeout_s is not None and not 0 < self.step_timeout_s < float("inf"):
            raise ValueError(f"--step-timeout must be a positive, finite number of seconds (the watchdog cannot be "
                             f"turned off), got {self.step_timeout_s:g}")
        if self.video < 0:
            raise ValueError(f"--video must be 0 or more, got {self.video}")
        if self.kind != "ray" and (self.address or self.gpus_per_actor):
            raise ValueError("--address and --gpus-per-actor need --executor ray")
        if not 0 <= self.gpus_per_actor < float("inf"):  # nan passed "< 0" and Ray's fit then crashed
            raise ValueError(f"--gpus-per-actor must be a finite number, 0 or more, got {self.gpus_per_actor:g}")


def request_from_args(args: argparse.Namespace, device_default: bool = False,
                      config: ModelConfig | None = None) -> tuple[RunRequest, ExecutorSettings]:
    """The run's request, resolved once (the model, its runtime, the setups, the scenes), and where it runs;
    one-line errors (ValueError and its kinds, FileNotFoundError, ImportError) for anything that cannot run,
    before any scene is built or any run folder is written. ``config``: the model's configuration where the
    caller made it (eval.record's perturbed reference); by default the one ``args.model`` and its options name."""
    from env.arms import check_assets, get_arm
    from env.setups import get_setup, resolve_setups
    from eval.request import ResolvedModel, model_config, options_from_args
    from eval.rollout import check_batch_request, gpu_sim_unavailable_reason

    if not str(args.out).strip():  # Path("") is the current folder: the run would be written into it
        raise ValueError("--out is empty; name the run's folder, e.g. runs/NAME")
    if config is None:
        config = model_config(args.model, **options_from_args(args))  # options the model takes, their values
    setups = tuple(get_setup(s) for s in resolve_setups(args.setups))
    arm = get_arm(args.arm)
    if args.split not in SPLITS:
        raise ValueError(f"unknown split {args.split!r}; valid: {', '.join(SPLITS)}")
    if args.tries < 1:
        raise ValueError(f"--tries must be at least 1, got {args.tries}")
    if args.max_steps is not None and args.max_steps < 1:
        raise ValueError(f"--max-steps must be at least 1 (control steps per try), got {args.max_steps}")
    settings = ExecutorSettings(args.executor, args.workers, args.address, args.gpus_per_actor, args.step_timeout,
                                args.video)
    sim = args.sim
    if sim is None:  # camera policies: CPU scenes unless asked (the GPU camera path has not met a GPU)
        sim = ("gpu" if args.num_envs > 1 and config.observes == "state" and gpu_sim_unavailable_reason() is None
               else "cpu")
    check_batch_request(args.num_envs, sim, config.observes, setups)
    if args.num_envs > 1 and args.video:
        raise ValueError("--video records one scene per worker: use --num-envs 1")
    if args.executor == "ray":
        from eval.executors.ray_actors import require_ray

        require_ray()  # before any work: one line naming the extra when ray is missing
    check_assets(arm)
    replay = replay_ms = None
    if args.replay_latency:
        from eval.latency_replay import is_published, load_profile, published_profile

        # read once, here: a bad profile fails in one line before any scene, and every worker replays the same
        if is_published(args.replay_latency):
            from eval.site.published import orin_ms_per_query

            replay = args.replay_latency
            replay_ms = published_profile(replay, orin_ms_per_query())
        else:
            replay = str(Path(args.replay_latency).resolve())
            replay_ms = load_profile(replay)
    model = ResolvedModel.of(config, device_default=device_default)  # the runtime, then weights or server
    request = RunRequest(model=model, setups=setups, split=args.split, tries=args.tries, arm=arm.name, sim=sim,
                         num_envs=args.num_envs, first_try=args.first_try, replay_latency=replay,
                         replay_ms=None if replay_ms is None else tuple(float(x) for x in replay_ms),
                         max_steps=args.max_steps,
                         record=bool(getattr(args, "record", False)))
    return request, settings


def _chunks(items: list, n: int) -> list[tuple]:
    return [tuple(items[i:i + n]) for i in range(0, len(items), n)]


def _interrupt(signum, frame):
    raise KeyboardInterrupt


INTERRUPTED = ("interrupted; finished tries are saved, rerun the same command to continue", 130)


@contextmanager
def _signals_held():
    """SIGINT and SIGTERM held while the run closes its files and workers, so that a second Ctrl-C cannot cut
    the cleanup short (a traceback from inside it); the list it yields tells whether one arrived."""
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in (signal.SIGINT,
                                                                                           signal.SIGTERM)}
    try:
        yield caught
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _fail(msg: str, code: int = 2) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return code


@dataclass
class RunOutcome:
    """What a run ended with: its exit status and, when it got that far, its summary (summary.json's)."""

    rc: int
    summary: dict | None = None
    request: RunRequest | None = None


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv)).rc


def run(args: argparse.Namespace, device_default: bool = False,
        report_extra: Callable[[RunRequest, list[dict]], dict] | None = None,
        config: ModelConfig | None = None) -> RunOutcome:
    """The run of parsed command-line ``args`` (eval.run's, eval.orin's or eval.record's). ``device_default``:
    the model's backend, when not given, is the fastest this machine runs (eval.orin). ``report_extra(request,
    records)``, called once the tries have run, gives more fields for the report (eval.orin: the device and its
    telemetry), so that the report and summary.json are written once. ``config``: the model's configuration,
    where the caller made it (:func:`request_from_args`)."""
    from eval.console import tolerant_output

    tolerant_output()  # a model name or path the locale cannot encode never ends the run in a traceback
    try:
        return _run(args, device_default, report_extra, config)
    except KeyboardInterrupt:  # Ctrl-C outside the tries (checks, start-up, the report): one line too
        return RunOutcome(_fail(*INTERRUPTED))


def _run(args, device_default, report_extra, config) -> RunOutcome:
    try:
        request, settings = request_from_args(args, device_default, config)
    except (UnknownModelError, UnknownSetupError, UnknownArmError, ValueError, FileNotFoundError, ImportError) as e:
        return RunOutcome(_fail(str(e)))  # BatchError is a ValueError
    except Exception as e:  # noqa: BLE001 - missing assets and the like: one line
        return RunOutcome(_fail(str(e).splitlines()[0] if str(e) else type(e).__name__))
    if device_default:
        print(f"backend: {request.model.backend} ({request.model.runtime_reason})", file=sys.stderr)

    from env.tasklist import TaskListError, load

    try:
        tasklist = load(request.split)
        for s in request.setups:
            if request.first_try + request.tries > tasklist.tries(s.id):
                asked = (f"--tries {request.tries}" if not request.first_try else
                         f"--first-try {request.first_try} --tries {request.tries} (tries {request.first_try}.."
                         f"{request.first_try + request.tries - 1})")
                raise ValueError(f"the {request.split} task list has {tasklist.tries(s.id)} tries of {s.id}; "
                                 f"{asked} asks for more")
    except (TaskListError, ValueError) as e:
        return RunOutcome(_fail(str(e)))

    from eval.run_folder import RunConfig, RunMismatchError, prepare_out

    try:
        cfg = RunConfig.of(request, args.out, tasklist.sha256)
    except OSError as e:  # a --checkpoint that cannot be read: one line, before any worker starts
        return RunOutcome(_fail(f"cannot read the weights: {e}"))
    try:
        out, done, lock = prepare_out(cfg, fresh=args.fresh)
    except RunMismatchError as e:
        return RunOutcome(_fail(str(e)))
    try:
        return _execute(request, settings, tasklist, cfg, out, done, report_extra)
    finally:
        lock.release()


def _execute(request: RunRequest, settings: ExecutorSettings, tasklist, cfg, out: Path, done,
             report_extra=None) -> RunOutcome:
    """The tries still to run, then the report; the caller holds the folder's writer lock."""
    from tqdm import tqdm

    from eval.executors import STEP_TIMEOUT_S, Job, WorkerError, make_executor
    from eval.run_folder import TryLog, hang_record, planned_tries, read_records

    from engines.octo.config import RANDOM_WEIGHTS_LABEL

    name, identity = request.model.name, request.identity()
    random_weights = bool(request.model.config.options().get("random_weights"))
    plan = planned_tries(cfg)
    setup_of = {s.id: s for s in request.setups}  # resolved once: jobs carry the Setup itself
    todo = [Job(setup_of[s], t, video=t < settings.video) for s, t in plan if (s, t) not in done]
    n_todo = len(todo)
    if request.num_envs > 1:  # batches of up to N tries of one setup
        todo = [Job(s, ts[0], batch=ts) for s in request.setups
                for ts in _chunks([j.try_index for j in todo if j.setup.id == s.id], request.num_envs)]
    if settings.video:
        (out / "videos").mkdir(exist_ok=True)
    t0 = time.monotonic()
    if todo:
        def failed(job, flag):  # a try that could not finish: policy_hang, sim_hang, or actor_died (ray)
            return replace(hang_record(cfg, tasklist, job.setup, job.try_index, flag=flag), **identity)

        n_workers = min(settings.workers, len(todo))
        if request.num_envs > 1:
            print(f"{request.num_envs} scenes per worker on {request.sim.upper()} physics"
                  + (" (stepped one after another: no GPU speed-up)" if request.sim == "cpu" else ""), file=sys.stderr)
        step_timeout = settings.step_timeout_s if settings.step_timeout_s is not None else STEP_TIMEOUT_S
        try:
            episode_dir = None
            if request.record:  # eval.record: each try staged as a dataset episode by the worker that ran it
                episode_dir = str(out / "episodes")
                Path(episode_dir).mkdir(exist_ok=True)
            pool = make_executor(settings.kind, n_workers, request, str(out / "videos"), step_timeout_s=step_timeout,
                                 address=settings.address, gpus_per_actor=settings.gpus_per_actor,
                                 episode_dir=episode_dir)
        except WorkerError as e:
            return RunOutcome(_fail(str(e)), request=request)
        log = TryLog(out / "tries.jsonl", stamp={"run_identity": cfg.run_identity})  # records name their run
        batch_log = TryLog(out / "batches.jsonl") if request.num_envs > 1 else None
        signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops like Ctrl-C: workers closed, tries kept
        successes = n_new = 0
        if random_weights:
            print(f"{name} with {RANDOM_WEIGHTS_LABEL}: success meaningless", file=sys.stderr)
        if request.max_steps is not None:
            print(f"{name}: {max_steps_label(request.max_steps)}", file=sys.stderr)
        bar = tqdm(total=len(plan), initial=len(plan) - n_todo, unit="try", desc=name, smoothing=0.05)
        failure = None
        try:
            for job, result in pool.run(todo, failed):
                if result.batch is not None:
                    batch_log.append(result.batch, kind="batch")
                for record in result.records:
                    log.append(record.to_json())
                    successes += record.success
                    n_new += 1
                    bar.update(1)
                bar.set_postfix_str(f"success {successes}/{n_new} last {job.setup.id}")
        except WorkerError as e:
            failure = (str(e), 1)
        except KeyboardInterrupt:
            failure = INTERRUPTED
        except OSError as e:  # the tries file cannot take another record: disk full, read-only remount
            failure = (f"cannot append to {out / 'tries.jsonl'} ({e.strerror or e}): free space, then rerun the "
                       f"same command; the finished tries are kept", 1)
        except RecordsError as e:  # a record its readers would refuse: not written (eval.run_folder.TryLog)
            failure = (str(e), 1)
        finally:
            with _signals_held() as caught:
                bar.close()
                log.close()
                if batch_log is not None:
                    batch_log.close()
                pool.close()
        if caught and failure is None:
            failure = INTERRUPTED
        if failure is not None:
            return RunOutcome(_fail(*failure), request=request)
    from eval.report import ReportError, write_report

    try:
        records = read_records(out / "tries.jsonl")
        meta = {"planned": len(plan), "wall_s_this_session": round(time.monotonic() - t0, 1),
                "workers": settings.workers, "executor": settings.kind, "num_envs": request.num_envs,
                "sim": request.sim}
        extra = {**(report_extra(request, records) if report_extra else {}), "run": meta}
        summary = write_report([out / "tries.jsonl"], out, extra=extra)  # summary.json written once, with these
    except (ReportError, RecordsError) as e:  # a records file damaged while the tries ran: one line
        return RunOutcome(_fail(str(e), 1), request=request)
    scored = [s for s in request.setups if not s.id.startswith("FB")]
    n = sum(v["n"] for v in summary["setups"].values()) + sum(v["n"] for v in summary.get("full_board", {}).values())
    k = sum(v["k"] for v in summary["setups"].values()) + sum(v["k"] for v in summary.get("full_board", {}).values())
    s_txt = f"S {100 * summary['S']:.1f}%" if summary.get("S") is not None else "S n/a (not all 30 setups)"
    hung = Counter(f for r in records for f in r.get("flags", ()) if f in UNFINISHED_FLAGS)
    hung_txt = ""
    if hung:
        hung_txt = (f"; {sum(hung.values())} tries did not finish ("
                    + ", ".join(f"{flag} {hung[flag]}" for flag in UNFINISHED_FLAGS if hung[flag])
                    + "): a hung policy or simulator, see the flags in REPORT.md")
    random_txt = f" ({RANDOM_WEIGHTS_LABEL}, success meaningless)" if random_weights else ""
    if request.max_steps is not None:
        random_txt += f" ({max_steps_label(request.max_steps)})"
    print(f"{name}{random_txt} on {request.split} ({len(scored)} scored setups): {k}/{n} successes, {s_txt}; "
          f"report in {out / 'REPORT.md'}{hung_txt}")
    return RunOutcome(EXIT_HUNG if hung else 0, summary, request)


if __name__ == "__main__":
    sys.exit(main())
