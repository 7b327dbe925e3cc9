"""Record demonstrations of the scripted reference on the train split, for bc-state.

    python -m eval.demos --tries 60 --out data/demos_train.h5

One HDF5 file: ``states`` (N, 29) float32 and ``actions`` (N, 7) float32, the
per-step pairs of every try in order, and an ``episodes`` table (setup, try,
seed, success, start, length) giving the boundaries. Only the train split's
starts are used (never dev, test or confirm); failed tries are kept in the file
with success = 0 and left out of training.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time

import numpy as np

from env.setups import SCORED_IDS, resolve_setups


def _record_setup(job):
    """Worker: every try of one setup; returns (setup, [(try, seed, success, states, actions)])."""
    import torch

    torch.set_num_threads(1)
    from env import make_env
    from env.setups import get_setup
    from env.tasklist import load
    from eval.policies.scripted import ScriptedPolicy
    from eval.runner import observation_for
    from eval.state_features import state_vector

    setup_id, tries = job
    tl = load("train")
    setup = get_setup(setup_id)
    env = make_env(setup_id, obs_mode="state")
    out = []
    try:
        for t in tries:
            policy = ScriptedPolicy(clearance=setup.clearance_m, latency_steps=setup.latency_steps)
            obs, _ = env.reset(seed=tl.seed(setup_id, t), options={"start": tl.start(setup_id, t)})
            policy.reset(env.unwrapped.instructions[0])
            states, actions = [], []
            while True:
                o = observation_for(policy, env, obs)
                action = policy.query(o)
                states.append(state_vector(o["state"]))
                actions.append(action)
                obs, _, term, trunc, info = env.step(action)
                if bool(term[0]) or bool(trunc[0]):
                    break
            out.append((t, tl.seed(setup_id, t), bool(info["success"][0]), np.stack(states), np.stack(actions)))
    finally:
        env.close()
    return setup_id, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.demos", description=__doc__.split("\n\n")[0])
    p.add_argument("--setups", default="all", help="setups to record (default: the 30 scored)")
    p.add_argument("--tries", type=int, default=60, help="train-split tries per setup (at most 100)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", required=True, help="HDF5 file to write")
    args = p.parse_args(argv)
    try:
        setups = resolve_setups(args.setups)
        if not 1 <= args.tries <= 100:
            raise ValueError(f"--tries must be 1..100 (the train list has 100 per setup), got {args.tries}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import h5py
    from tqdm import tqdm

    # split each setup in chunks so that both workers stay busy to the end
    chunk = max(1, args.tries // 4)
    jobs = [(s, list(range(i, min(i + chunk, args.tries)))) for s in setups for i in range(0, args.tries, chunk)]
    t0 = time.monotonic()
    results: dict[str, list] = {s: [] for s in setups}
    with mp.get_context("spawn").Pool(args.workers) as pool, tqdm(total=len(setups) * args.tries, unit="try") as bar:
        for setup_id, recs in pool.imap_unordered(_record_setup, jobs):
            results[setup_id].extend(recs)
            bar.update(len(recs))
    states, actions, table = [], [], []
    start = 0
    for sid in setups:
        for t, seed, success, s, a in sorted(results[sid], key=lambda r: r[0]):
            states.append(s)
            actions.append(a)
            table.append((sid.encode(), t, seed, success, start, len(s)))
            start += len(s)
    episodes = np.array(table, dtype=[("setup", "S4"), ("try", "i4"), ("seed", "i8"), ("success", "?"),
                                      ("start", "i8"), ("length", "i4")])
    with h5py.File(args.out, "w") as f:
        f.create_dataset("states", data=np.concatenate(states), compression="gzip")
        f.create_dataset("actions", data=np.concatenate(actions), compression="gzip")
        f.create_dataset("episodes", data=episodes)
        f.attrs["split"] = "train"
        f.attrs["tries_per_setup"] = args.tries
        f.attrs["policy"] = "scripted"
        f.attrs["state"] = "eval.state_features v1 (29 numbers)"
    ok = int(episodes["success"].sum())
    print(f"wrote {args.out}: {len(episodes)} tries ({ok} successful), {start} steps, "
          f"in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
