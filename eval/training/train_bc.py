"""Train the bc-state MLP on recorded demonstrations, deterministically from a seed, on the CPU.

    python -m eval.training.train_bc --demos data/demos_m0.h5 data/dart_n01.h5 --out engines/weights/bc_state.safetensors

Writes the weights (safetensors, with the normalisation inside) and a training
report next to ``--report-dir``: the loss curve (PNG) and ``training.json``
(dataset size, epochs, time, final losses).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from engines.bc_mlp import DEFAULT_WEIGHTS, BCConfig, build, save


class DemoFileError(ValueError):
    """A demonstration file this code cannot train on (one line)."""


def load_demos(path: str):
    """States and actions to train on, plus the episode table.

    Pure demonstrations (``relabeled = 0``) give their successful tries only; relabeled files (perturbed or
    DAgger runs, labelled by the reference at every state) give every step.
    """
    import h5py

    from eval.training.state_features import VERSION

    with h5py.File(path, "r") as f:
        version = f.attrs.get("state", "")
        if version != VERSION:
            raise DemoFileError(f"{path} holds states of {version or 'an unknown version'!r}, this code uses "
                                f"{VERSION!r}; record them again with python -m eval.training.demos")
        states, actions, episodes = f["states"][:], f["actions"][:], f["episodes"][:]
        relabeled = bool(f.attrs.get("relabeled", 0))
    keep = np.zeros(len(states), dtype=bool)
    for e in episodes:
        if e["success"] or relabeled:
            keep[e["start"]:e["start"] + e["length"]] = True
    return states[keep], actions[keep], episodes


def train(states, actions, *, seed=0, epochs=40, batch=512, lr=1e-3, val_fraction=0.05, log=print):
    import torch

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # the same floating-point reductions on every run
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(states))
    n_val = int(len(states) * val_fraction)
    val, tr = order[:n_val], order[n_val:]
    config = BCConfig()
    model = build(config)
    x = torch.as_tensor(states)
    y = torch.as_tensor(actions)
    # trained on signed square roots: a 0.5 mm correction (action 0.005) weighs like 7 cm, not like 0.5 mm
    y_raw = torch.sign(y) * torch.sqrt(torch.abs(y))
    model.obs_mean.copy_(x[tr].mean(0))
    model.obs_std.copy_(x[tr].std(0).clamp_min(1e-3))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    steps_per_epoch = (len(tr) + batch - 1) // batch
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * steps_per_epoch)
    history = []
    for epoch in range(epochs):
        model.train()
        perm = torch.as_tensor(rng.permutation(tr))
        total = 0.0
        for i in range(steps_per_epoch):
            idx = perm[i * batch:(i + 1) * batch]
            loss = torch.nn.functional.mse_loss(model.raw(x[idx]), y_raw[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        model.eval()
        with torch.no_grad():
            val_loss = float(torch.nn.functional.mse_loss(model.raw(x[val]), y_raw[val])) if n_val else float("nan")
        history.append({"epoch": epoch + 1, "train_mse": total / len(tr), "val_mse": val_loss})
        log(f"epoch {epoch + 1}/{epochs}: train {total / len(tr):.5f}  val {val_loss:.5f}")
    return model, config, history


def plot_history(history, path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(111)
    ep = [h["epoch"] for h in history]
    ax.semilogy(ep, [h["train_mse"] for h in history], label="train")
    ax.semilogy(ep, [h["val_mse"] for h in history], label="validation (held-out steps)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("MSE of signed sqrt(action)")
    ax.set_title("bc-state training")
    ax.legend()
    fig.tight_layout()
    fig.savefig(str(path))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.training.train_bc", description=__doc__.split("\n\n")[0])
    p.add_argument("--demos", required=True, nargs="+", help="HDF5 files from python -m eval.training.demos")
    p.add_argument("--out", default=str(DEFAULT_WEIGHTS), help="weights file (safetensors)")
    p.add_argument("--report-dir", default="results/bc_state/training", help="loss curve and training.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=40)
    args = p.parse_args(argv)
    for path in args.demos:
        if not Path(path).is_file():
            print(f"error: demonstrations {path} do not exist; record them with: python -m eval.training.demos --out {path}",
                  file=sys.stderr)
            return 2
    t0 = time.monotonic()
    parts = []
    try:
        for path in args.demos:
            parts.append(load_demos(path))
    except DemoFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    states = np.concatenate([p[0] for p in parts])
    actions = np.concatenate([p[1] for p in parts])
    n_tries = sum(len(p[2]) for p in parts)
    n_ok = sum(int(p[2]["success"].sum()) for p in parts)
    print(f"{len(states)} state-action pairs from {n_tries} recorded tries ({n_ok} successful) in "
          f"{len(args.demos)} file(s)")
    model, config, history = train(states, actions, seed=args.seed, epochs=args.epochs)
    elapsed = time.monotonic() - t0
    save(model, config, args.out, extra={"seed": args.seed, "epochs": args.epochs, "pairs": len(states),
                                         "tries": n_tries})
    report = Path(args.report_dir)
    report.mkdir(parents=True, exist_ok=True)
    plot_history(history, report / "loss.png")
    from eval.records import machine_info

    (report / "training.json").write_text(json.dumps({
        "demos_files": [str(d) for d in args.demos], "tries_recorded": n_tries, "successful_tries": n_ok,
        "pairs": len(states), "epochs": args.epochs, "seed": args.seed, "train_seconds": round(elapsed, 1),
        "final": history[-1], "machine": machine_info(), "weights": str(args.out),
    }, indent=1) + "\n")
    print(f"wrote {args.out} and {report}/ in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
