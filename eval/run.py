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
from pathlib import Path
from typing import Callable

from env.arms import ARMS, UnknownArmError, get_arm
from env.setups import UnknownSetupError, resolve_setups
from env.starts import SPLITS
from eval.executors import EXECUTORS
from eval.policies import MODEL_OPTIONS, MODELS, UnknownModelError, get_model

EXIT_HUNG = 3  # the run finished, but some tries were stopped by the watchdog or lost with their actor
HUNG_FLAGS = ("policy_hang", "sim_hang", "actor_died")


def build_parser(prog: str = "python -m eval.run", description: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description or __doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help=f"one of: {', '.join(MODELS)}; or package.module:PolicyClass")
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
    m = p.add_argument_group("model options (only for models that take them)")
    m.add_argument("--checkpoint", help="checkpoint directory in the model's released layout")
    m.add_argument("--random-weights", action="store_true", help="the exact architecture with seeded random "
                   "weights: latency only, success meaningless")
    m.add_argument("--exec-horizon", type=int, help="actions executed per query from a predicted chunk")
    m.add_argument("--temporal-ensembling", action="store_true", help="average overlapping action chunks")
    m.add_argument("--goal-image", metavar="FILE|solved", help="Octo: condition on a goal image as well as the "
                   "instruction: a PNG/JPEG file, or 'solved' (each try's start rendered with its blocks in their "
                   "holes); default: language only")
    from engines.backends import MODEL_BACKENDS

    m.add_argument("--backend", help="runtime backend of the model (" + "; ".join(
        f"{family}: {', '.join(b)}, default {b[0]}" for family, b in MODEL_BACKENDS.items()) + ")")
    m.add_argument("--precision", help="numeric precision of the model's graphs: ort fp32 (default) or int8 (the "
                   "Q/DQ graph make engines builds; bf16 is refused: ONNX Runtime's CPU has no bf16 kernels); trt "
                   "fp32, fp16, int8, fp8 (default: the model's own); jax and torch fp32")
    m.add_argument("--replay-latency", metavar="FILE", help="delay every action by a latency drawn from a measured "
                   "profile (a tries.jsonl with infer_ms): what a device's latency does to success")
    r = p.add_argument_group("remote model (--model remote; see eval.remote)")
    r.add_argument("--server", metavar="URL", help="the model server, ws://HOST:PORT")
    r.add_argument("--protocol", help="openpi or vla-eval (default openpi)")
    r.add_argument("--profile", help="how observations and actions map to the model: octo-small, octo-base, "
                   "bc-state (servers of this project: python -m eval.serve), openvla-7b, openvla-oft, pi0-libero")
    r.add_argument("--token", help="the token the server was started with ($SAB_REMOTE_TOKEN is read when this is "
                   "not given); never written: run.json says only where it came from")
    r.add_argument("--live-latency", action="store_true", help="apply each action at the first control step after "
                   "its own measured round trip (the arm holds until then), as --replay-latency does with a profile")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--fresh", action="store_true", help="discard what OUT holds and start over")
    return p




def model_options(args: argparse.Namespace) -> dict:
    """The model options given on the command line (unset ones left out)."""
    return {k: getattr(args, k) for k in MODEL_OPTIONS if getattr(args, k) is not None and getattr(args, k) is not False}


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


def _credentials(spec, options: dict) -> tuple[tuple[str, str], ...]:
    """Where the run's token came from (run.json says that, never the token)."""
    if "token" not in spec.options:
        return ()
    from eval.remote.client import TOKEN_ENV

    if options.get("token"):
        return (("token", "--token"),)
    import os

    return (("token", f"${TOKEN_ENV}"),) if os.environ.get(TOKEN_ENV) else ()


def _fail(msg: str, code: int = 2) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None,
         report_extra: Callable[[list[dict]], dict] | None = None) -> int:
    """``report_extra(records)``, called once the tries have run, gives more fields for the report (eval.orin:
    the device and its telemetry), so that the report and summary.json are written once."""
    try:
        return _main(argv, parser, report_extra)
    except KeyboardInterrupt:  # Ctrl-C outside the tries (checks, start-up, the report): one line too
        return _fail(*INTERRUPTED)


def _main(argv, parser, report_extra) -> int:
    args = (parser or build_parser()).parse_args(argv)
    try:
        spec = get_model(args.model)
        if spec.name == "remote":  # what a served model observes, and its track, are its profile's
            from dataclasses import replace

            from eval.remote.profiles import get_profile

            profile = get_profile(args.profile or "")
            spec = replace(spec, track=profile.track, observes=profile.observes)
        setups = resolve_setups(args.setups)
        arm = get_arm(args.arm)
        if args.split not in SPLITS:
            raise ValueError(f"unknown split {args.split!r}; valid: {', '.join(SPLITS)}")
        for name in ("tries", "workers"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(args, name)}")
        if args.step_timeout is not None and not 0 < args.step_timeout < float("inf"):
            raise ValueError(f"--step-timeout must be a positive, finite number of seconds (the watchdog cannot be "
                             f"turned off), got {args.step_timeout:g}")
        if args.video < 0:
            raise ValueError(f"--video must be 0 or more, got {args.video}")
        if args.executor != "ray" and (args.address or args.gpus_per_actor):
            raise ValueError("--address and --gpus-per-actor need --executor ray")
        if args.gpus_per_actor < 0:
            raise ValueError(f"--gpus-per-actor must be 0 or more, got {args.gpus_per_actor:g}")
        from eval.rollout import check_batch_request, gpu_sim_unavailable_reason

        if args.sim is None:  # camera policies: CPU scenes unless asked (the GPU camera path has not met a GPU)
            args.sim = ("gpu" if args.num_envs > 1 and spec.observes == "state" and gpu_sim_unavailable_reason() is None
                        else "cpu")
        check_batch_request(args.num_envs, args.sim, spec.observes, setups)
        if args.num_envs > 1 and args.video:
            raise ValueError("--video records one scene per worker: use --num-envs 1")
        if args.executor == "ray":
            from eval.executors.ray_actors import require_ray

            require_ray()  # before any work: one line naming the extra when ray is missing
        from env.arms import check_assets

        check_assets(arm)
        options = model_options(args)
        if args.replay_latency:
            from eval.latency_replay import load_profile

            load_profile(args.replay_latency)  # a bad profile fails here in one line, not in every worker
            options["replay_latency"] = str(Path(args.replay_latency).resolve())
        if options.get("goal_image") not in (None, "solved"):  # workers (and Ray actors) read it by absolute path
            options["goal_image"] = str(Path(options["goal_image"]).expanduser().resolve())
        extra = sorted(set(options) - set(spec.options))
        if extra:
            raise ValueError(f"{spec.name} takes no {', '.join('--' + o.replace('_', '-') for o in extra)}")
        if spec.check is not None:
            spec.check(**options)  # weights that cannot load: one line, before any scene or run folder
    except (UnknownModelError, UnknownSetupError, UnknownArmError, ValueError, FileNotFoundError, ImportError) as e:
        return _fail(str(e))  # BatchError is a ValueError
    except Exception as e:  # noqa: BLE001 - missing assets and the like: one line
        return _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)

    from env.tasklist import TaskListError, load

    try:
        tasklist = load(args.split)
        for sid in setups:
            if args.tries > tasklist.tries(sid):
                raise ValueError(f"the {args.split} task list has {tasklist.tries(sid)} tries of {sid}; "
                                 f"--tries {args.tries} asks for more")
    except (TaskListError, ValueError) as e:
        return _fail(str(e))

    from eval.runner import RunConfig, RunMismatchError, prepare_out

    try:
        weights = spec.weights_sha256(**options) if spec.weights_sha256 else None
    except OSError as e:  # a --checkpoint that cannot be read: one line, before any worker starts
        return _fail(f"cannot read the weights: {e}")
    cfg = RunConfig(model=spec.name, split=args.split, setups=tuple(setups), tries=args.tries, out=args.out,
                    arm=arm.name, tasklist_sha256=tasklist.sha256, options=tuple(sorted(options.items())),
                    sim=args.sim, weights_sha256=weights, credentials=_credentials(spec, options))
    try:
        out, done, lock = prepare_out(cfg, fresh=args.fresh)
    except RunMismatchError as e:
        return _fail(str(e))
    try:
        return _execute(args, spec, arm, setups, options, tasklist, cfg, out, done, report_extra)
    finally:
        lock.release()


def _execute(args, spec, arm, setups, options, tasklist, cfg, out, done, report_extra=None) -> int:
    """The tries still to run, then the report; the caller holds the folder's writer lock."""
    from tqdm import tqdm

    from dataclasses import replace

    from env.setups import get_setup
    from eval.runner import TryLog, hang_record, planned_tries, read_records
    from eval.executors import STEP_TIMEOUT_S, Job, WorkerError, make_executor

    plan = planned_tries(cfg)
    setup_of = {s: get_setup(s) for s in setups}  # resolved once: jobs carry the Setup itself
    todo = [Job(setup_of[s], t, video=t < args.video) for s, t in plan if (s, t) not in done]
    n_todo = len(todo)
    if args.num_envs > 1:  # batches of up to N tries of one setup
        todo = [Job(setup_of[s], ts[0], batch=ts) for s in setups
                for ts in _chunks([j.try_index for j in todo if j.setup.id == s], args.num_envs)]
    if args.video:
        (out / "videos").mkdir(exist_ok=True)
    t0 = time.monotonic()
    if todo:
        def failed(job, flag):  # a try that could not finish: policy_hang, sim_hang, or actor_died (ray)
            return replace(hang_record(cfg, tasklist, job.setup, job.try_index, flag=flag), model=spec.name,
                           track=spec.track, arm=arm.name)

        n_workers = min(args.workers, len(todo))
        if args.num_envs > 1:
            print(f"{args.num_envs} scenes per worker on {args.sim.upper()} physics"
                  + (" (stepped one after another: no GPU speed-up)" if args.sim == "cpu" else ""), file=sys.stderr)
        step_timeout = args.step_timeout if args.step_timeout is not None else STEP_TIMEOUT_S
        try:
            pool = make_executor(args.executor, n_workers, spec.name, args.split, arm.name, str(out / "videos"),
                                 options, step_timeout_s=step_timeout, num_envs=args.num_envs, sim=args.sim,
                                 address=args.address, gpus_per_actor=args.gpus_per_actor)
        except WorkerError as e:
            return _fail(str(e))
        log = TryLog(out / "tries.jsonl")
        batch_log = TryLog(out / "batches.jsonl") if args.num_envs > 1 else None
        signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops like Ctrl-C: workers closed, tries kept
        successes = n_new = 0
        if options.get("random_weights"):
            print(f"{spec.name} with random weights: latency only, success meaningless", file=sys.stderr)
        bar = tqdm(total=len(plan), initial=len(plan) - n_todo, unit="try", desc=spec.name, smoothing=0.05)
        failure = None
        try:
            for job, result in pool.run(todo, failed):
                if result.batch is not None:
                    batch_log.append(result.batch)
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
            return _fail(*failure)
    from eval.report import ReportError, write_report

    try:
        records = read_records(out / "tries.jsonl")
        run = {"planned": len(plan), "wall_s_this_session": round(time.monotonic() - t0, 1),
               "workers": args.workers, "executor": args.executor, "num_envs": args.num_envs, "sim": args.sim}
        extra = {**(report_extra(records) if report_extra else {}), "run": run}
        summary = write_report([out / "tries.jsonl"], out, extra=extra)  # summary.json written once, with these
    except ReportError as e:
        return _fail(str(e), 1)
    scored = [s for s in setups if not s.startswith("FB")]
    n = sum(v["n"] for v in summary["setups"].values()) + sum(v["n"] for v in summary.get("full_board", {}).values())
    k = sum(v["k"] for v in summary["setups"].values()) + sum(v["k"] for v in summary.get("full_board", {}).values())
    s_txt = f"S {100 * summary['S']:.1f}%" if summary.get("S") is not None else "S n/a (not all 30 setups)"
    hung = Counter(f for r in records for f in r.get("flags", ()) if f in HUNG_FLAGS)
    hung_txt = ""
    if hung:
        hung_txt = (f"; {sum(hung.values())} tries did not finish ("
                    + ", ".join(f"{flag} {hung[flag]}" for flag in HUNG_FLAGS if hung[flag])
                    + "): a hung policy or simulator, see the flags in REPORT.md")
    random_txt = " (random weights: latency only, success meaningless)" if options.get("random_weights") else ""
    print(f"{spec.name}{random_txt} on {args.split} ({len(scored)} scored setups): {k}/{n} successes, {s_txt}; "
          f"report in {out / 'REPORT.md'}{hung_txt}")
    return EXIT_HUNG if hung else 0


if __name__ == "__main__":
    sys.exit(main())
