"""Record tries of a model on the train split as a LeRobotDataset v3.0 (demonstrations to train a policy on).

    python -m eval.record --setups A01,B01 --tries 10 --out data/demos_a01_b01            # the scripted reference
    python -m eval.record --model bc-state --setups all --tries 20 --out data/bc_state_all --workers 2
    python -m eval.record --setups A01 --tries 5 --out data/a01 --push-to-hub USER/shape-assembly-a01
    python -m eval.record --setups A01,B01 --tries 10 --noise 0.1 --out data/dart_a01_b01   # the reference, perturbed
    python -m eval.record --model bc-camera --tries 2 --first-try 20 --out data/dagger_20   # starts 20 and 21

Every try runs as eval.run runs it (the same episode loop, workers, watchdog,
task list and success predicate) with both cameras rendered at every step, and
is staged as an episode by the worker that ran it; when all have run, the
episodes become the dataset in OUT (``data/``, ``videos/``, ``meta/``: the
format in eval/lerobot/__init__.py), readable by LeRobot's ``LeRobotDataset``.
The run itself is ``OUT/recording/`` (run.json, tries.jsonl, REPORT.md):
rerunning the same command after a kill continues it, a finished try is never
recorded twice and a try cut off mid-way is recorded again from its start.
Only the train split's starts are recorded: dev, test and confirm never feed training.
With ``--noise S`` the scripted reference's action plus Gaussian noise is executed (DART, eval.policies.dart):
``action`` is what the arm received and ``action.expert`` the reference's clean label for the state reached.

Exit status: 0 done, 2 bad input (one line), 1 a worker or the writing failed, 130 interrupted,
3 done but some tries did not finish (left out of the dataset, flagged in the report).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from env.arms import ARMS
from eval.request import MODEL_CONFIGS, NoisyScriptedConfig, add_model_arguments

RECORD_SPLIT = "train"
RECORDING_DIR = "recording"  # OUT/recording: the eval.run run folder of the recording
DATASET_ENTRIES = ("data", "videos", "meta", "README.md", RECORDING_DIR)  # what --fresh removes from OUT


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.record", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="scripted",
                   help=f"the policy whose tries are recorded (default scripted): {', '.join(MODEL_CONFIGS)}; "
                        "or package.module:PolicyClass")
    p.add_argument("--split", default=RECORD_SPLIT, help="train (the only split recorded: the others never feed "
                   "training)")
    p.add_argument("--setups", default="all", help="ids, group letters (A..G), FB or all, comma-separated (default all)")
    p.add_argument("--tries", type=int, default=10, help="tries per setup: the first N of the train task list, or N "
                   "from --first-try")
    p.add_argument("--first-try", type=int, default=0, metavar="K",
                   help="record tries K .. K+N-1 of each setup (default 0): starts another recording has not seen, "
                        "e.g. for a policy's own tries in a DAgger round")
    p.add_argument("--arm", default="panda", help=f"one of: {', '.join(ARMS)}")
    p.add_argument("--workers", type=int, default=1, help="worker processes, each with its own scene")
    p.add_argument("--step-timeout", type=float, default=None,
                   help="seconds a policy query or a step's physics may take before the try is stopped as hung")
    p.add_argument("--max-steps", type=int, metavar="N",
                   help="a smoke recording: cut every try at N control steps (meta/recording.json and the dataset "
                        "card say so); episodes cut short are no demonstrations to train on")
    p.add_argument("--noise", type=float, metavar="S",
                   help="with --model scripted: execute the reference's action plus Gaussian noise of std S on each "
                        "motion component, seeded per try (DART); the dataset adds action.expert, the reference's "
                        "clean label for each step (default 0: no noise)")
    add_model_arguments(p)
    p.add_argument("--out", required=True, help="the dataset folder")
    p.add_argument("--fresh", action="store_true", help="discard the dataset or recording OUT holds and start over")
    p.add_argument("--push-to-hub", metavar="REPO", help="then upload the dataset to this Hugging Face dataset repo "
                   "(USER/NAME; the token from HF_TOKEN or huggingface-cli login), tagged v3.0 as LeRobot's reader asks")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")
    return p


def recorded_model(args: argparse.Namespace) -> NoisyScriptedConfig | None:
    """The recording's model configuration where eval.record makes it (``--noise``: the perturbed reference),
    else None (eval.run's, from --model and its options); one-line ValueError."""
    if args.noise is None:
        return None
    if args.model != "scripted":
        raise ValueError(f"--noise perturbs the scripted reference's actions (DART): it needs --model scripted, "
                         f"not {args.model}")
    from eval.request import model_config, options_from_args

    model_config(args.model, **options_from_args(args))  # the options the reference refuses, as eval.run says it
    config = NoisyScriptedConfig(name=args.model, noise=args.noise)
    return config if config.noise > 0 else None  # no noise: the reference as eval.run runs it, its dataset unchanged


def _fail(msg: str, code: int = 2) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return code


def check_out(out: Path, fresh: bool) -> None:
    """Refuse a folder holding a finished dataset or something else than a recording (ValueError, one line);
    with ``fresh``, remove what a recording put there first."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; name a folder for the dataset")
    if fresh and out.is_dir():
        for name in DATASET_ENTRIES:
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    if (out / "meta" / "info.json").exists():
        raise ValueError(f"{out} holds a finished dataset (meta/info.json); use --fresh to record it again, or "
                         f"another --out")
    if out.is_dir():
        for p in out.glob(".assembling-*"):  # a dataset being written when the recording was killed
            shutil.rmtree(p, ignore_errors=True)
        others = sorted(p.name for p in out.iterdir() if p.name not in DATASET_ENTRIES)
        if others or (any(out.iterdir()) and not (out / RECORDING_DIR).is_dir()):
            raise ValueError(f"{out} exists and is not a recording of eval.record (it holds "
                             f"{', '.join(others[:3]) or 'a dataset without meta/info.json'}); use another --out")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from eval.console import tolerant_output

    tolerant_output()
    try:
        return _main(args)
    except KeyboardInterrupt:
        return _fail("interrupted; finished tries are saved, rerun the same command to continue", 130)


def _main(args: argparse.Namespace) -> int:
    if args.split != RECORD_SPLIT:
        return _fail(f"eval.record records the {RECORD_SPLIT} split only, not {args.split!r}: the dev, test and "
                     f"confirm starts never feed training")
    try:
        config = recorded_model(args)
    except ValueError as e:  # UnknownModelError is one
        return _fail(str(e))
    if not str(args.out).strip():
        return _fail("--out is empty; name the dataset's folder, e.g. data/NAME")
    if args.private and not args.push_to_hub:
        return _fail("--private needs --push-to-hub")
    if args.push_to_hub:
        from eval.lerobot.hub import check_repo_id

        try:
            check_repo_id(args.push_to_hub)
        except ValueError as e:
            return _fail(str(e))
    out = Path(args.out)
    if args.push_to_hub and not args.fresh and (out / "meta" / "info.json").is_file():
        # the dataset of this command is written and its upload failed: the same command uploads it
        try:
            check_same_recording(out, args)
        except ValueError as e:
            return _fail(str(e))
        print(f"{out} holds this command's finished dataset: uploading it (nothing is recorded again)")
        return _push(out, args)
    try:
        check_out(out, args.fresh)
    except ValueError as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(f"cannot prepare {out}: {e.strerror or e}")
    from eval import run as eval_run

    # eval.run's run of the request, into OUT/recording, its tries staged as episodes (RunRequest.record)
    run_args = argparse.Namespace(**vars(args))
    run_args.out = str(out / RECORDING_DIR)
    run_args.record, run_args.fresh = True, False
    for name, value in (("executor", "local"), ("address", None), ("gpus_per_actor", 0.0), ("video", 0),
                        ("num_envs", 1), ("sim", "cpu"), ("replay_latency", None)):
        setattr(run_args, name, value)
    outcome = eval_run.run(run_args, config=config)
    if outcome.rc not in (0, eval_run.EXIT_HUNG):
        return outcome.rc
    try:
        info = assemble(out, outcome.request)
    except KeyboardInterrupt:
        return _fail("interrupted while writing the dataset; rerun the same command to write it", 130)
    except (ValueError, OSError) as e:
        return _fail(str(e), 1)
    print(f"wrote the LeRobot v3.0 dataset {out}: {info['total_episodes']} episodes, {info['total_frames']} frames "
          f"at {info['fps']} fps")
    if args.push_to_hub:
        return _push(out, args) or outcome.rc
    return outcome.rc


def check_same_recording(out: Path, args: argparse.Namespace) -> None:
    """A finished dataset is this command's: the same model, noise, arm, setups and tries (ValueError, one
    line)."""
    import json

    from env.setups import resolve_setups

    try:
        made = json.loads((out / "meta" / "recording.json").read_text())
        # the noise is a model option (NoisyScriptedConfig): the recording's options hold it where there was one
        made["noise"] = (made.get("options") or {}).get("noise", 0.0)
        asked = {"model": args.model, "noise": args.noise or 0.0, "arm": args.arm,
                 "setups": list(resolve_setups(args.setups)), "tries_per_setup": args.tries,
                 "first_try": args.first_try, "max_steps": args.max_steps}
        made.setdefault("first_try", 0)  # recordings made before --first-try: their tries are the first N
        differ = [k for k, v in asked.items() if made.get(k) != v]
    except (OSError, ValueError, AttributeError) as e:  # AttributeError: JSON that is not an object
        raise ValueError(f"{out} holds a finished dataset whose meta/recording.json cannot be read "
                         f"({' '.join(str(e).split())}); use --fresh to record it again") from None
    if differ:
        raise ValueError(f"{out} holds a finished dataset of another recording ({', '.join(differ)} differ); use "
                         f"--fresh to record this one, or another --out")


def _push(out: Path, args: argparse.Namespace) -> int:
    """Upload the finished dataset ``out`` to ``--push-to-hub``: 0, or 1 and one line (the dataset stays)."""
    from eval.lerobot.hub import push

    try:
        url = push(out, args.push_to_hub, private=args.private)
    except Exception as e:  # noqa: BLE001 - the Hub's refusal (auth, network, name): one line
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        server = getattr(e, "server_message", None)  # the Hub's own words (huggingface_hub's HfHubHTTPError)
        if server and server not in detail:
            detail += f" ({' '.join(str(server).split())})"
        return _fail(f"the dataset is written in {out} but the upload to {args.push_to_hub} failed: {detail}; "
                     f"rerun the same command to upload it", 1)
    print(f"pushed to {url}")
    return 0


def assemble(out: Path, request) -> dict:
    """The dataset from the recording's staged episodes, in the run's order (setups as asked, tries ascending);
    tries that did not finish (hung) have none and are left out. The staged episodes go once it is written."""
    from tqdm import tqdm

    from env.appearance import APPEARANCE_VERSION
    from eval.lerobot.dataset import EpisodeSource, write_dataset
    from eval.lerobot.episode import episode_name
    from eval.records import UNFINISHED_FLAGS
    from eval.run_folder import read_records

    recording = out / RECORDING_DIR
    records = {(r["setup"], r["try"]): r for r in read_records(recording / "tries.jsonl")}
    staged = recording / "episodes"
    sources, left_out = [], []
    for setup in request.setups:
        for t in range(request.first_try, request.first_try + request.tries):
            r = records[(setup.id, t)]
            folder = staged / episode_name(setup.id, t)
            if set(r.get("flags", ())) & set(UNFINISHED_FLAGS):
                left_out.append(f"{setup.id} try {t}")
                continue
            if not folder.is_dir():
                raise ValueError(f"{recording}: the try {setup.id} {t} is recorded but its episode is not staged "
                                 f"in {folder}; rerun with --fresh")
            sources.append(EpisodeSource(folder, bool(r["success"]), tuple(r.get("flags", ()))))
    if left_out:
        print(f"left out of the dataset (did not finish): {', '.join(left_out)}", file=sys.stderr)
    meta = {"format": "shape-assembly-bench/recording/1", "model": request.model.name, "track": request.track,
            "options": request.options(), "split": request.split, "arm": request.arm,
            "setups": [s.id for s in request.setups], "tries_per_setup": request.tries,
            "first_try": request.first_try, "max_steps": request.max_steps,
            "tasklist_sha256": records[(request.setups[0].id, request.first_try)].get("tasklist_sha256"),
            "appearance": APPEARANCE_VERSION, "left_out": left_out}
    with tqdm(total=len(sources), unit="episode", desc="dataset") as bar:
        info = write_dataset(out, sources, meta, robot_type=request.arm, progress=bar.update)
    shutil.rmtree(staged, ignore_errors=True)
    return info


if __name__ == "__main__":
    sys.exit(main())
