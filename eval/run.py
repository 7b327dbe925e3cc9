"""Evaluate a model on the shape-assembly benchmark.

Example:
    python -m eval.run --model scripted --split dev --setups A01 --tries 20 --out runs/a01

Writes OUT/tries.jsonl (one JSON object per finished try, flushed as it ends)
and OUT/summary.json. Rerunning the same command continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from env.arms import ARMS, UnknownArmError, get_arm
from env.setups import UnknownSetupError, get_setup, resolve_setups
from env.starts import SPLITS
from eval.policies import MODELS, UnknownModelError, get_model
from eval.policies.base import BadActionError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help=f"one of: {', '.join(MODELS)}")
    p.add_argument("--split", default="dev", help=f"one of: {', '.join(SPLITS)} (default dev)")
    p.add_argument("--setups", default="A01", help="ids, group letters (A..G), FB or all, comma-separated")
    p.add_argument("--tries", type=int, default=1, help="tries per setup (the first N of the split)")
    p.add_argument("--arm", default="panda", help=f"one of: {', '.join(ARMS)}")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--fresh", action="store_true", help="discard what OUT holds and start over")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        spec = get_model(args.model)
        setups = resolve_setups(args.setups)
        arm = get_arm(args.arm)
        if args.split not in SPLITS:
            raise ValueError(f"unknown split {args.split!r}; valid: {', '.join(SPLITS)}")
        if args.tries < 1:
            raise ValueError(f"--tries must be at least 1, got {args.tries}")
        from env.task import check_simulated

        for sid in setups:
            check_simulated(get_setup(sid))
    except (UnknownModelError, UnknownSetupError, UnknownArmError, ValueError, NotImplementedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    from tqdm import tqdm

    from env import make_env
    from eval.runner import RunConfig, RunMismatchError, TryLog, planned_tries, prepare_out, read_records, run_try, summarise

    cfg = RunConfig(model=spec.name, split=args.split, setups=tuple(setups), tries=args.tries, out=args.out, arm=arm.name)
    try:
        out, done = prepare_out(cfg, fresh=args.fresh)
    except RunMismatchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    todo = [t for t in planned_tries(cfg) if t not in done]
    log = TryLog(out / "tries.jsonl")
    t0 = time.monotonic()
    obs_mode = "state" if spec.observes == "state" else "rgb"
    envs: dict[str, object] = {}
    successes = 0
    bar = tqdm(total=len(planned_tries(cfg)), initial=len(planned_tries(cfg)) - len(todo), unit="try", desc=spec.name)
    try:
        for setup_id, try_index in todo:
            if setup_id not in envs:
                for e in envs.values():
                    e.close()
                envs = {setup_id: make_env(setup_id, arm=arm.name, obs_mode=obs_mode)}
            env = envs[setup_id]
            policy = spec.factory(clearance=env.unwrapped.task_setup.clearance_m)
            record = run_try(env, policy, setup_id, args.split, try_index)
            record.update(model=spec.name, track=spec.track, arm=arm.name, backend=policy.backend)
            log.append(record)
            successes += record["success"]
            bar.update(1)
            bar.set_postfix(success=f"{successes}/{bar.n - (len(planned_tries(cfg)) - len(todo))}", setup=setup_id)
    except BadActionError as e:
        print(f"error: {setup_id} try {try_index}: {e}", file=sys.stderr)
        return 1
    finally:
        bar.close()
        log.close()
        for e in envs.values():
            e.close()
    records = read_records(out / "tries.jsonl")
    summary = summarise(records, cfg, wall_s=round(time.monotonic() - t0, 2))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    rate = summary["success_rate"]
    print(f"{spec.name} on {args.split} {','.join(setups)}: {summary['successes']}/{summary['tries']} successes"
          f" ({100 * rate:.1f}%), flags {summary['flags']}; wrote {out / 'tries.jsonl'} and {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
