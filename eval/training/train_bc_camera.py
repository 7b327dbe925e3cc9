"""Train bc-camera (engines.bc_camera) on recorded demonstrations, on the CPU, resumably.

    python -m eval.record --split train --setups all --tries 4 --noise 0.1 --out data/demos_cam_n01
    python -m eval.training.train_bc_camera --datasets data/demos_cam_n01 --work build/train_bc_camera \\
        --out engines/weights/bc_camera.safetensors

The demonstrations are LeRobotDataset v3.0 folders as ``python -m eval.record`` writes them (docs/datasets.md),
of the train split's starts only: a folder recorded on another task list (its ``meta/recording.json``
``tasklist_sha256`` is not this code's train list) or another split is refused in one line. The label of a
step is ``action.expert`` where the recording has it (``--noise``: the reference's action for the state
reached, every step used), else ``action`` (what was executed; successful episodes only).

The recipe (what ``training.json`` reports):

- inputs: both cameras averaged to 64 x 64 (the graph's own first step), the joint positions, the instruction
  (one-hot) and the last gripper command sent with its hold, computed from the executed actions as the policy
  computes them at evaluation (eval.training.state_features.ActionHistory; engines.bc_camera says why not the
  last motion);
- augmentation: each camera's brightness and contrast scaled by up to ``COLOUR`` relative, per sample, and its
  frame shifted by up to ``Recipe.shift`` pixels (edge pixels repeated; DrQ, Kostrikov et al. 2020; 0 by
  default: see Recipe);
- targets: the next ``chunk`` labels of the episode (the last one repeated past its end), as signed square roots;
  mean squared error, AdamW, cosine learning rate; whole episodes held out for validation;
- the frames are decoded once into a uint8 cache (``WORK/frames``), reused by later runs on the same folders.

``WORK`` holds the run: ``train.json`` (what it trains: the folders' identities and the recipe),
``checkpoint.pt`` (written after every epoch, atomically) and ``training.json``. Rerunning the same command
continues from the last finished epoch; another recipe or other folders into the same ``WORK`` are refused in
one line unless ``--fresh``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from engines.bc_camera import DEFAULT_WEIGHTS, IMAGE_SIDE, BCCameraNetConfig, build, pool_frames, save, to_raw

COLOUR = 0.1
VAL_FRACTION = 0.05
FORMAT = "shape-assembly-bench/train-bc-camera/1"


class TrainingInputError(ValueError):
    """A dataset or work folder this command cannot train from (one line, naming it)."""


@dataclass(frozen=True)
class Recipe:
    epochs: int = 12
    batch: int = 256
    # random shift of each frame by up to this many pixels of 64 (DrQ). 0: both cameras are fixed to the scene
    # or the gripper, so where the block is in the frame is what says where to move; trained with 4 (6% of the
    # frame) the network lost the block's position (it moved as the average demonstration moves, dev 0/14)
    shift: int = 0
    lr: float = 1e-3
    weight_decay: float = 1e-4
    seed: int = 0
    config: BCCameraNetConfig = field(default_factory=BCCameraNetConfig)


# ------------------------------------------------------------------ reading a recorded dataset
@dataclass
class Demos:
    """Every step of the folders' used episodes, in order: uint8 frames per camera (N, 3, 64, 64), the
    low-dimensional input (N, LOW_DIM), the chunk labels (N, chunk, 7) and each step's episode number."""

    frames: dict[str, np.ndarray]
    low_dim: np.ndarray
    labels: np.ndarray
    episode: np.ndarray
    episodes_used: int
    episodes_recorded: int
    relabeled: bool


def _json(path: Path, what: str) -> dict:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise TrainingInputError(f"{path} does not exist: {what}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise TrainingInputError(f"{path} is not JSON ({e}); record the dataset again with python -m eval.record") from None
    if not isinstance(doc, dict):
        raise TrainingInputError(f"{path} is not a JSON object; record the dataset again with python -m eval.record")
    return doc


def check_dataset(root: Path) -> dict:
    """The folder's meta/recording.json, once the folder is a finished v3.0 recording of this code's train list."""
    from env.tasklist import load
    from eval.lerobot import CODEBASE_VERSION

    info = _json(root / "meta" / "info.json", "not a finished dataset of python -m eval.record")
    if info.get("codebase_version") != CODEBASE_VERSION:
        raise TrainingInputError(f"{root} is a LeRobot dataset of version {info.get('codebase_version')!r}; this "
                                 f"code reads {CODEBASE_VERSION!r}")
    rec = _json(root / "meta" / "recording.json", "not a recording of python -m eval.record (no meta/recording.json)")
    if rec.get("split") != "train":
        raise TrainingInputError(f"{root} records the {rec.get('split')!r} split; bc-camera trains on the train "
                                 f"split's starts only (dev, test and confirm never feed training)")
    train = load("train")
    if rec.get("tasklist_sha256") != train.sha256:
        raise TrainingInputError(f"{root} was recorded on another task list (train sha256 "
                                 f"{str(rec.get('tasklist_sha256'))[:16]}..., this code's is {train.sha256[:16]}...); "
                                 f"record it again with python -m eval.record --split train")
    return rec


def dataset_key(root: Path) -> str:
    """sha256 of what the frames and steps come from: info.json, the episodes and data tables, the videos' sizes."""
    h = hashlib.sha256()
    for p in sorted((root / "meta").rglob("*.parquet")) + sorted((root / "data").rglob("*.parquet")) + \
            [root / "meta" / "info.json"]:
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    for p in sorted((root / "videos").rglob("*.mp4")):
        h.update(f"{p.relative_to(root).as_posix()}\0{p.stat().st_size}".encode())
    return h.hexdigest()


def _vectors(table, name: str, width: int) -> np.ndarray:
    col = table.column(name).combine_chunks()
    return np.asarray(col.flatten().to_numpy(zero_copy_only=False), np.float32).reshape(-1, width)


def _frames_cache(root: Path, key: str, episodes: list[dict], n: int, config: BCCameraNetConfig, cache: Path,
                  show: bool) -> dict[str, np.ndarray]:
    """Every step's frame of each camera, averaged to 64 x 64 (uint8 (n, 3, 64, 64)), decoded from the videos
    once and kept in ``cache`` under the dataset's key."""
    from tqdm import tqdm

    from eval.lerobot.dataset import video_key
    from eval.video import video_frames

    out = {}
    for camera, side in config.cameras:
        path = cache / f"{key[:24]}_{camera}.npy"
        if path.is_file():
            arr = np.load(path, mmap_mode="r")
            if arr.shape == (n, 3, IMAGE_SIDE, IMAGE_SIDE):
                out[camera] = arr
                continue
        vkey = video_key(camera)
        arr = np.empty((n, 3, IMAGE_SIDE, IMAGE_SIDE), np.uint8)
        by_file: dict[tuple[int, int], list[dict]] = {}
        for e in episodes:
            by_file.setdefault((e[f"videos/{vkey}/chunk_index"], e[f"videos/{vkey}/file_index"]), []).append(e)
        fps = json.loads((root / "meta" / "info.json").read_text())["fps"]
        bar = tqdm(total=n, desc=f"decoding {camera}", unit="frame", disable=not show)
        for (chunk, file), eps in sorted(by_file.items()):
            video = root / "videos" / vkey / f"chunk-{chunk:03d}" / f"file-{file:03d}.mp4"
            starts = {int(round(e[f"videos/{vkey}/from_timestamp"] * fps)): e for e in eps}
            pending: list[np.ndarray] = []
            current = None
            for j, frame in enumerate(video_frames(video)):
                if frame.shape[:2] != (side, side):
                    raise TrainingInputError(f"{video} has {frame.shape[1]}x{frame.shape[0]} frames; bc-camera's "
                                             f"{camera} is {side}x{side}")
                if j in starts:
                    current, pending = starts[j], []
                if current is None:
                    continue
                pending.append(frame)
                if len(pending) == current["length"]:
                    lo = current["dataset_from_index"]
                    arr[lo:lo + len(pending)] = pool_frames(np.stack(pending), config.pool(side))
                    bar.update(len(pending))
                    current, pending = None, []
            if current is not None or len([e for e in eps]) != len(starts):
                raise TrainingInputError(f"{video} ends before its episodes' frames do; record the dataset again")
        bar.close()
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npy")
        np.save(tmp, arr)
        os.replace(tmp, path)
        out[camera] = np.load(path, mmap_mode="r")
    return out


def read_demos(roots: list[Path], config: BCCameraNetConfig, cache: Path, show: bool = True) -> Demos:
    """The training steps of the dataset folders (each checked: :func:`check_dataset`)."""
    import pyarrow.parquet as pq

    from eval.training.state_features import HISTORY_DIM, ActionHistory

    if not all(0 <= i < HISTORY_DIM for i in config.history):
        raise TrainingInputError(f"the config reads action-history numbers {list(config.history)}; "
                                 f"eval.training.state_features keeps {HISTORY_DIM}")
    parts = []
    relabeled_all = None
    recorded = 0
    for root in roots:
        check_dataset(root)
        key = dataset_key(root)
        episodes = []
        for p in sorted((root / "meta" / "episodes").rglob("*.parquet")):
            episodes += pq.read_table(p).to_pylist()
        data = [pq.read_table(p) for p in sorted((root / "data").rglob("*.parquet"))]
        import pyarrow as pa

        table = pa.concat_tables(data)
        n = table.num_rows
        if n != sum(e["length"] for e in episodes):
            raise TrainingInputError(f"{root}: its data tables hold {n} steps, its episodes {sum(e['length'] for e in episodes)}")
        state = _vectors(table, "observation.state", config.proprio_dim) if table.schema.field(
            "observation.state").type.list_size == config.proprio_dim else None
        if state is None:
            raise TrainingInputError(f"{root}: observation.state has {table.schema.field('observation.state').type.list_size} "
                                     f"numbers, bc-camera's proprioception {config.proprio_dim}")
        executed = _vectors(table, "action", config.action_dim)
        relabeled = "action.expert" in table.schema.names
        labels = _vectors(table, "action.expert", config.action_dim) if relabeled else executed
        if relabeled_all is not None and relabeled_all != relabeled:
            raise TrainingInputError("the folders mix recordings with and without --noise; train on one kind")
        relabeled_all = relabeled
        tasks = pq.read_table(root / "meta" / "tasks.parquet").to_pandas()
        task_of = {int(i): str(t) for t, i in zip(tasks.index, tasks["task_index"])}
        task_index = table.column("task_index").to_numpy()
        frames = _frames_cache(root, key, episodes, n, config, cache, show)
        from engines.bc_camera import instruction_one_hot

        recorded += len(episodes)
        for e in episodes:
            if not (relabeled or e["success"]):
                continue
            lo, hi = e["dataset_from_index"], e["dataset_to_index"]
            history, hist = ActionHistory(), []
            for a in executed[lo:hi]:
                hist.append(history.vector()[list(config.history)])
                history.update(a)
            onehot = instruction_one_hot(task_of[int(task_index[lo])], config)
            low = np.concatenate([state[lo:hi], np.repeat(onehot[None], hi - lo, 0), np.stack(hist)], axis=1)
            steps = np.arange(hi - lo)
            ahead = np.minimum(steps[:, None] + np.arange(config.chunk)[None], hi - lo - 1)
            parts.append((root, lo, hi, low, labels[lo:hi][ahead], frames))
    if not parts:
        raise TrainingInputError(f"no episode to train on in {', '.join(map(str, roots))} (a recording without "
                                 f"--noise gives its successful episodes only)")
    cams = [c for c, _ in config.cameras]
    return Demos(frames={c: np.concatenate([np.asarray(p[5][c][p[1]:p[2]]) for p in parts]) for c in cams},
                 low_dim=np.concatenate([p[3] for p in parts]).astype(np.float32),
                 labels=np.concatenate([p[4] for p in parts]).astype(np.float32),
                 episode=np.concatenate([np.full(p[2] - p[1], i) for i, p in enumerate(parts)]),
                 episodes_used=len(parts), episodes_recorded=recorded, relabeled=bool(relabeled_all))


# ------------------------------------------------------------------ training
def augment(x, generator, shift: int):
    """uint8 (N, 3, 64, 64) frames -> float in [0, 1], each shifted by up to ``shift`` pixels (edges repeated) and
    its brightness and contrast scaled by up to COLOUR."""
    import torch
    import torch.nn.functional as F

    x = x.float() / 255.0
    n, c = x.shape[:2]
    shifted = x
    if shift:
        padded = F.pad(x, (shift,) * 4, mode="replicate")  # (N, 3, 64 + 2 shift, 64 + 2 shift)
        dy = torch.randint(0, 2 * shift + 1, (n,), generator=generator)
        dx = torch.randint(0, 2 * shift + 1, (n,), generator=generator)
        span = torch.arange(IMAGE_SIDE)
        rows = (dy[:, None] + span)[:, None, :, None].expand(n, c, IMAGE_SIDE, padded.shape[3])
        cols = (dx[:, None] + span)[:, None, None, :].expand(n, c, IMAGE_SIDE, IMAGE_SIDE)
        shifted = padded.gather(2, rows).gather(3, cols)
    mean = shifted.mean(dim=(1, 2, 3), keepdim=True)
    contrast = 1 + (torch.rand(n, 1, 1, 1, generator=generator) * 2 - 1) * COLOUR
    bright = 1 + (torch.rand(n, 1, 1, 1, generator=generator) * 2 - 1) * COLOUR
    return ((shifted - mean) * contrast + mean * bright).clamp(0.0, 1.0)


def run_identity(roots: list[Path], recipe: Recipe) -> dict:
    """What a work folder trains: the datasets (by content) and the recipe."""
    return {"format": FORMAT, "datasets": [{"path": str(r.resolve()), "sha256": dataset_key(r)} for r in roots],
            "recipe": json.loads(json.dumps(asdict(recipe)))}


def train(demos: Demos, recipe: Recipe, work: Path, show: bool = True, log=print):
    """Train, continuing from ``work/checkpoint.pt`` where one exists; (model, history). A checkpoint is written
    after every epoch (atomically), with what the next epoch needs: each epoch's shuffle and augmentation are
    drawn from generators seeded by (seed, epoch), so a resumed run draws what an uninterrupted one would."""
    import torch
    from tqdm import tqdm

    config = recipe.config
    torch.manual_seed(recipe.seed)
    rng = np.random.default_rng(recipe.seed)
    episodes = np.unique(demos.episode)
    n_val = max(1, int(round(len(episodes) * VAL_FRACTION))) if len(episodes) >= 2 else 0
    val_mask = np.isin(demos.episode, rng.choice(episodes, n_val, replace=False))
    tr, va = np.flatnonzero(~val_mask), np.flatnonzero(val_mask)
    model = build(config)
    low = torch.as_tensor(demos.low_dim)
    # a constant input (the instruction of a list whose tries all say one thing) gets std 1: not a 1/1e-3 blow-up
    std = low[tr].std(0)
    model.low_mean.copy_(low[tr].mean(0))
    model.low_std.copy_(torch.where(std > 1e-3, std, torch.ones_like(std)))
    target = to_raw(torch.as_tensor(demos.labels))
    frames = {c: torch.from_numpy(np.ascontiguousarray(demos.frames[c])) for c, _ in config.cameras}
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    steps_per_epoch = (len(tr) + recipe.batch - 1) // recipe.batch
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=recipe.epochs * steps_per_epoch)
    history: list[dict] = []
    start = 0
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "checkpoint.pt"
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        history, start = state["history"], state["epoch"]
        log(f"resuming {work} after epoch {start} of {recipe.epochs}")

    def evaluate(idx: np.ndarray) -> tuple[float, float]:
        model.eval()
        total = first = 0.0
        with torch.no_grad():
            for i in range(0, len(idx), 1024):
                j = torch.as_tensor(idx[i:i + 1024])
                out = model.raw({c: frames[c][j].float() / 255.0 for c in frames}, low[j])
                total += float(((out - target[j]) ** 2).mean()) * len(j)
                first += float(((out[:, 0] - target[j][:, 0]) ** 2).mean()) * len(j)
        return total / max(len(idx), 1), first / max(len(idx), 1)

    for epoch in range(start, recipe.epochs):
        t0 = time.monotonic()
        model.train()
        order = torch.as_tensor(np.random.default_rng([recipe.seed, epoch]).permutation(tr))
        gen = torch.Generator().manual_seed(recipe.seed * 1_000_003 + epoch)
        total = 0.0
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch + 1}/{recipe.epochs}", unit="batch", disable=not show)
        for i in bar:
            j = order[i * recipe.batch:(i + 1) * recipe.batch]
            out = model.raw({c: augment(frames[c][j], gen, recipe.shift) for c in frames}, low[j])
            loss = torch.nn.functional.mse_loss(out, target[j])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(j)
            bar.set_postfix(mse=f"{float(loss.detach()):.4f}")
        bar.close()
        val, val_first = evaluate(va) if len(va) else (float("nan"), float("nan"))
        history.append({"epoch": epoch + 1, "train_mse": total / len(tr), "val_mse": val, "val_first_action_mse": val_first,
                        "seconds": round(time.monotonic() - t0, 1)})
        tmp = ckpt.with_name(ckpt.name + ".tmp")
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                    "history": history, "epoch": epoch + 1}, tmp)
        os.replace(tmp, ckpt)
        log(f"epoch {epoch + 1}/{recipe.epochs}: train {total / len(tr):.5f}  validation {val:.5f} "
            f"(first action {val_first:.5f})  {history[-1]['seconds']:.0f} s; checkpoint {ckpt}")
    model.eval()
    return model, history, {"train_steps": int(len(tr)), "validation_steps": int(len(va)),
                            "validation_episodes": int(n_val)}


def flops_per_query(model, config: BCCameraNetConfig) -> int:
    """FLOPs of one query (batch 1) of the exported graph, counted by engines.flops (multiply-adds x 2)."""
    import tempfile

    from engines.bc_camera import dummy_inputs, export_onnx
    from engines.flops import graph_flops

    with tempfile.TemporaryDirectory() as tmp:
        path = export_onnx(model, config, Path(tmp) / "bc_camera.onnx")
        return int(graph_flops(str(path), dummy_inputs(config))["total"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.training.train_bc_camera", description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", required=True, nargs="+", metavar="DIR",
                   help="LeRobotDataset v3.0 folders of python -m eval.record --split train")
    p.add_argument("--work", default="build/train_bc_camera", metavar="DIR",
                   help="the run's folder: frame cache, checkpoint (rerun the same command to continue)")
    p.add_argument("--out", default=str(DEFAULT_WEIGHTS), help="weights file (safetensors)")
    p.add_argument("--report-dir", default="results/bc_camera/training", help="training.json goes here")
    defaults = Recipe()
    p.add_argument("--epochs", type=int, default=defaults.epochs)
    p.add_argument("--batch", type=int, default=defaults.batch)
    p.add_argument("--lr", type=float, default=defaults.lr)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--shift", type=int, default=defaults.shift, help="random shift augmentation, pixels of 64")
    p.add_argument("--fresh", action="store_true", help="start the work folder's training again")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    try:
        if args.epochs < 1 or args.batch < 1 or not args.lr > 0 or not np.isfinite(args.lr) or not 0 <= args.shift < 32:
            raise TrainingInputError("--epochs and --batch must be at least 1, --lr a positive number and --shift "
                                     "0 to 31 pixels")
        roots = [Path(d) for d in args.datasets]
        for root in roots:
            if not root.is_dir():
                raise TrainingInputError(f"{root} is not a folder; record demonstrations with python -m eval.record "
                                         f"--split train --out {root}")
            check_dataset(root)
        recipe = Recipe(epochs=args.epochs, batch=args.batch, lr=args.lr, seed=args.seed, shift=args.shift)
        work = Path(args.work)
        ident = run_identity(roots, recipe)
        ident_path = work / "train.json"
        if ident_path.is_file() and not args.fresh:
            try:
                old = json.loads(ident_path.read_text())
            except (ValueError, UnicodeDecodeError):
                old = None
            if old != ident:
                what = "another recipe" if old and old.get("datasets") == ident["datasets"] else "other datasets"
                raise TrainingInputError(f"{work} holds a training of {what}; use --fresh to start this one there, "
                                         f"or another --work")
        if args.fresh:
            (work / "checkpoint.pt").unlink(missing_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        ident_path.write_text(json.dumps(ident, indent=1) + "\n")
        t0 = time.monotonic()
        demos = read_demos(roots, recipe.config, work / "frames", show=not args.quiet)
    except TrainingInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{len(demos.low_dim)} steps from {demos.episodes_used} of {demos.episodes_recorded} recorded episodes "
          f"({'labels: action.expert, every episode' if demos.relabeled else 'labels: action, successful episodes'})")
    try:
        model, history, split = train(demos, recipe, work, show=not args.quiet)
    except KeyboardInterrupt:
        print(f"error: interrupted; the last finished epoch is in {work}/checkpoint.pt: rerun the same command to "
              f"continue", file=sys.stderr)
        return 130
    elapsed = time.monotonic() - t0
    out = Path(args.out)
    save(model, recipe.config, out, extra={"seed": recipe.seed, "epochs": recipe.epochs, "steps": len(demos.low_dim),
                                           "episodes": demos.episodes_used,
                                           "datasets": ",".join(d["sha256"][:16] for d in ident["datasets"])})
    from eval.records import machine_info

    params = sum(int(t.numel()) for t in model.parameters())
    report = {
        "datasets": ident["datasets"], "episodes_recorded": demos.episodes_recorded,
        "episodes_used": demos.episodes_used, "steps": int(len(demos.low_dim)),
        "labels": "action.expert (every episode)" if demos.relabeled else "action (successful episodes)", **split,
        "recipe": ident["recipe"], "augmentation": {"shift_pixels": recipe.shift, "colour_relative": COLOUR},
        "parameters": params, "weights_bytes": out.stat().st_size,
        "flops_per_query": flops_per_query(model, recipe.config),
        "wall_seconds_this_run": round(elapsed, 1),
        "train_seconds_all_epochs": round(sum(h["seconds"] for h in history), 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "final": history[-1], "history": history, "machine": machine_info(), "weights": str(out)}
    rdir = Path(args.report_dir)
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out} ({report['weights_bytes'] / 1e6:.2f} MB, {params} parameters, "
          f"{report['flops_per_query'] / 1e6:.1f} MFLOP a query) and {rdir}/training.json in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
