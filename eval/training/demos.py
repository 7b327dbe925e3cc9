"""Record scripted-reference demonstrations on the train split, for bc-state.

    python -m eval.training.demos --tries 20 --out data/demos_m0.h5                                  # the reference
    python -m eval.training.demos --tries 25 --first-try 45 --noise 0.1 --out data/dart_n01.h5      # the reference, perturbed
    python -m eval.training.demos --tries 15 --first-try 20 --learner W.safetensors --out data/dagger_m1.h5   # DAgger

One HDF5 file: ``states`` (N, 40) float32 (the bc-state input, eval.training.state_features),
``actions`` (N, 7) float32 (the labels) and ``executed`` (N, 7) (what was sent), per
step for every try in order, and an ``episodes`` table (setup, try,
seed, success, start, length) giving the boundaries. Only the train split's
starts are used (never dev, test or confirm).

The label is always the scripted reference's action for the state reached. What
is executed can differ, so that the data covers the states a learned policy
drifts into, not only the reference's own path:

* ``--noise S``: the reference's action plus Gaussian noise (S per motion unit,
  seeded by the try) is executed (DART, Laskey et al. 2017; eval.policies.dart,
  which ``python -m eval.record --noise S`` runs too). These are still
  scripted runs: the track's definition of bc-state (BENCHMARK.md section 4,
  "trained on scripted runs from separate training starts"), and the recipe of
  the shipped weights;
* ``--learner W``: the bc-state weights W act and the reference, run alongside
  on the same observations, only labels (DAgger, Ross et al. 2011); ``--beta``
  is the share of steps on which the reference acts instead. The runs are then
  the learner's, outside the track's definition: for experiments (the
  ``bc_state_dagger`` weights and results), not for the scored bc-state.

The reference runs in its labeler mode in every recording: its phase is read
from the scene and the last executed gripper command at every step, not from
its own history, so a state gets one label whoever drove the arm there (see
ScriptedPolicy).

Files whose executed actions were the labels themselves (no noise, no learner)
are marked ``relabeled = 0``: training then uses their successful tries only.
Otherwise every step is used (``relabeled = 1``): the labels are right even
where the executed try went wrong.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time

import numpy as np

from env.setups import resolve_setups
from eval.policies.dart import NoisyReference
from eval.training.state_features import VERSION


class DemoRecorder(NoisyReference):
    """The policy a recording runs (through eval.rollout, as every evaluation): the scripted reference in its
    labeler mode labels every state; what is executed is its label, the label plus noise, or the learner's
    action (see the module docstring; the label and the noise are eval.policies.dart's). Each try's (states,
    labels, executed) are kept in ``tries``."""

    name = "demo-recorder"

    def __init__(self, setup, noise: float, learner=None, beta: float = 0.0) -> None:
        super().__init__(setup, noise)
        self.learner, self.beta = learner, beta
        self.tries: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def reset(self, instruction: str, seed: int | None = None) -> None:
        from eval.training.state_features import ActionHistory

        super().reset(instruction, seed)
        self.history = ActionHistory()  # of the executed actions: what the learner will see of its own
        self.states, self.labels, self.sent = [], [], []
        self.tries.append((self.states, self.labels, self.sent))

    def act(self, observation):
        from eval.training.state_features import policy_input

        x = policy_input(observation["state"], self.history)
        label = self.label(observation)
        executed = label
        if self.learner is not None and self.rng.random() >= self.beta:
            # the learner's input carries the history of what was sent, whoever sent it
            executed = self.learner.runner.infer({"state": x[None]})["action"][0]
        executed = self.perturbed(executed)
        self.observe_executed(executed)
        self.states.append(x)
        self.labels.append(label)
        self.sent.append(executed)
        self.history.update(executed)
        return executed


def _record_setup(job):
    """Worker: the given tries of one setup; returns (setup, [(try, seed, success, states, labels, executed)])."""
    import torch

    torch.set_num_threads(1)
    from env.setups import get_setup
    from env.tasklist import load
    from eval.rollout import Scenes, run_try

    setup_id, tries, noise, learner_path, beta = job
    tl = load("train")
    setup = get_setup(setup_id)
    learner = None
    if learner_path:
        from eval.request import make_policy

        learner = make_policy("bc-state", checkpoint=learner_path, backend="torch")
    recorder = DemoRecorder(setup, noise, learner, beta)
    scenes = Scenes(setup, 1)
    out = []
    try:
        for t in tries:
            record = run_try(scenes, recorder, "train", t, tasklist=tl)
            states, labels, sent = recorder.tries.pop()
            out.append((t, record.seed, record.success, np.stack(states), np.stack(labels), np.stack(sent)))
    finally:
        scenes.close()
    return setup_id, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.training.demos", description=__doc__.split("\n\n")[0])
    p.add_argument("--setups", default="all", help="setups to record (default: the 30 scored)")
    p.add_argument("--tries", type=int, default=60, help="train-split tries per setup")
    p.add_argument("--first-try", type=int, default=0, help="first train-split try of each setup")
    p.add_argument("--noise", type=float, default=0.0, help="std of the noise added to executed motion actions")
    p.add_argument("--learner", default=None, help="bc-state weights that act while the reference labels (DAgger)")
    p.add_argument("--beta", type=float, default=0.0, help="with --learner: share of steps the reference acts")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", required=True, help="HDF5 file to write")
    args = p.parse_args(argv)
    try:
        setups = resolve_setups(args.setups)
        if args.tries < 1 or args.first_try < 0 or args.first_try + args.tries > 100:
            raise ValueError(f"tries {args.first_try}..{args.first_try + args.tries - 1} are outside the train "
                             "list's 0..99 per setup")
        if args.noise < 0 or not 0 <= args.beta <= 1:
            raise ValueError("--noise must be >= 0 and --beta in [0, 1]")
        if args.learner:
            from engines.bc_mlp import load

            load(args.learner)  # one clear line now rather than in every worker
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import h5py
    from tqdm import tqdm

    # split each setup in chunks so that both workers stay busy to the end
    chunk = max(1, args.tries // 4)
    span = range(args.first_try, args.first_try + args.tries)
    jobs = [(s, list(span[i:i + chunk]), args.noise, args.learner, args.beta)
            for s in setups for i in range(0, args.tries, chunk)]
    t0 = time.monotonic()
    results: dict[str, list] = {s: [] for s in setups}
    with mp.get_context("spawn").Pool(args.workers) as pool, tqdm(total=len(setups) * args.tries, unit="try") as bar:
        for setup_id, recs in pool.imap_unordered(_record_setup, jobs):
            results[setup_id].extend(recs)
            bar.update(len(recs))
    states, actions, executed, table = [], [], [], []
    start = 0
    for sid in setups:
        for t, seed, success, s, a, x in sorted(results[sid], key=lambda r: r[0]):
            states.append(s)
            actions.append(a)
            executed.append(x)
            table.append((sid.encode(), t, seed, success, start, len(s)))
            start += len(s)
    episodes = np.array(table, dtype=[("setup", "S4"), ("try", "i4"), ("seed", "i8"), ("success", "?"),
                                      ("start", "i8"), ("length", "i4")])
    with h5py.File(args.out, "w") as f:
        f.create_dataset("states", data=np.concatenate(states), compression="gzip")
        f.create_dataset("actions", data=np.concatenate(actions), compression="gzip")
        f.create_dataset("executed", data=np.concatenate(executed), compression="gzip")
        f.create_dataset("episodes", data=episodes)
        f.attrs["split"] = "train"
        f.attrs["first_try"] = args.first_try
        f.attrs["tries_per_setup"] = args.tries
        f.attrs["policy"] = "scripted"
        f.attrs["noise"] = args.noise
        f.attrs["learner"] = args.learner or ""
        f.attrs["beta"] = args.beta
        f.attrs["relabeled"] = int(bool(args.learner) or args.noise > 0)
        f.attrs["labeler"] = 1  # the reference in its labeler mode (eval.policies.scripted)
        f.attrs["state"] = VERSION
    ok = int(episodes["success"].sum())
    print(f"wrote {args.out}: {len(episodes)} tries ({ok} successful), {start} steps, "
          f"in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
