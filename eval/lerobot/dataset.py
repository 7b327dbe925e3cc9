"""Assemble staged episodes (eval.lerobot.episode) into a LeRobotDataset v3.0 (the format: eval/lerobot/__init__).

:func:`write_dataset` writes ``data/``, ``videos/`` and ``meta/`` into a
temporary folder beside the dataset and moves them into place, ``meta/info.json``
last: a dataset folder with ``meta/info.json`` is complete. Rows, frames and
episodes keep the order of the episodes given (the run's plan: setups in the
order asked, tries ascending), so the same recording gives the same dataset.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from eval.lerobot import CODEBASE_VERSION
from eval.lerobot.episode import CAMERAS, QUANTILES, read_staged
from eval.training.state_features import SCENE_NAMES
from eval.training.state_features import VERSION as STATE_FEATURES_VERSION
from eval.video import VIDEO_CODEC_NAME, VIDEO_PIX_FMT

# LeRobot's defaults (datasets/utils.py DEFAULT_CHUNK_SIZE, DEFAULT_DATA_FILE_SIZE_IN_MB, DEFAULT_VIDEO_FILE_SIZE_IN_MB,
# DEFAULT_DATA_PATH, DEFAULT_VIDEO_PATH, DEFAULT_EPISODES_PATH)
CHUNKS_SIZE = 1000
DATA_FILE_MB = 100
VIDEO_FILE_MB = 200
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
INFO_FILE = "meta/info.json"
RECORDING_FILE = "meta/recording.json"  # this project's: what recorded the episodes (LeRobot never reads it)
ACTION_NAMES = ("dx", "dy", "dz", "droll", "dpitch", "dyaw", "gripper")  # eval.policies.base ACTION_DIM's order
# utils/constants.py DEFAULT_FEATURES: each (1,), stored as a plain column
DEFAULT_FEATURES = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64",
                    "task_index": "int64"}
STEP_FLAGS = ("next.success", "next.done")  # the success predicate after the step; the try's last step
# a perturbed recording's (eval.policies.dart): the expert's label for the state reached, where ``action`` is what
# was executed
EXPERT_ACTION = "action.expert"
# LeRobot's key for a simulator's privileged state (utils/constants.py OBS_ENV_STATE; its PushT datasets carry
# one): here the scene features bc-state reads (eval.training.state_features), for training a camera policy to
# estimate them; no camera policy observes it
ENVIRONMENT_STATE = "observation.environment_state"


class DatasetWriteError(ValueError):
    """A dataset that cannot be written from these episodes (one line)."""


def video_key(camera: str) -> str:
    return f"observation.images.{camera}"


@dataclass(frozen=True)
class EpisodeSource:
    """A staged episode and what the run's record says of its try."""

    folder: Path
    success: bool
    flags: tuple[str, ...]


def _next_file(chunk: int, file: int) -> tuple[int, int]:
    """datasets/utils.py update_chunk_file_indices."""
    return (chunk + 1, 0) if file == CHUNKS_SIZE - 1 else (chunk, file + 1)


def _ffmpeg() -> str:
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def concat_videos(parts: Sequence[Path], out: Path) -> None:
    """The mp4 files one after another in ``out``, their streams copied (no re-encoding), as LeRobot's writer
    appends episodes (datasets/video_utils.py concatenate_video_files: ffmpeg's concat demuxer)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", dir=out.parent, delete=False) as f:
        for p in parts:
            f.write("file '" + str(Path(p).resolve()).replace("'", "'\\''") + "'\n")
        listing = f.name
    try:
        done = subprocess.run([_ffmpeg(), "-v", "error", "-y", "-f", "concat", "-safe", "0", "-i", listing, "-c", "copy",
                               "-movflags", "+faststart", str(out)], capture_output=True, text=True)
    finally:
        os.unlink(listing)
    if done.returncode != 0:
        raise DatasetWriteError(f"ffmpeg could not join the videos into {out}: {done.stderr.strip().splitlines()[-1:]}")


def _vector_stats(x: np.ndarray) -> dict[str, list]:
    """datasets/compute_stats.py get_feature_stats for a (N, D) feature: each stat (D,), count [N]."""
    x = x.astype(np.float64)
    out = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0)}
    for q in QUANTILES:
        out[f"q{round(q * 100):02d}"] = np.quantile(x, q, axis=0)
    stats = {k: np.atleast_1d(v).tolist() for k, v in out.items()}
    stats["count"] = [int(len(x))]
    return stats


def _image_stats(per_episode: Sequence[dict[str, Any]]) -> dict[str, list]:
    """datasets/compute_stats.py aggregate_feature_stats: min/max over episodes, count-weighted mean, pooled
    variance, and the quantiles' envelope (lowest of the episodes' q01..q50, highest of q90, q99)."""
    arr = {k: np.array([e[k] for e in per_episode], dtype=np.float64) for k in per_episode[0]}
    counts = arr["count"].reshape(-1, 1, 1, 1)
    total = counts.sum()
    mean = (arr["mean"] * counts).sum(0) / total
    var = ((arr["std"] ** 2 + (arr["mean"] - mean) ** 2) * counts).sum(0) / total
    out = {"min": arr["min"].min(0), "max": arr["max"].max(0), "mean": mean, "std": np.sqrt(var)}
    for q in QUANTILES:
        key = f"q{round(q * 100):02d}"
        out[key] = arr[key].min(0) if q <= 0.5 else arr[key].max(0)
    stats = {k: v.tolist() for k, v in out.items()}
    stats["count"] = [int(total)]
    return stats


def _pandas_index_metadata(index: str, column: str) -> bytes:
    """The ``pandas`` schema metadata of a frame with one int64 column and a string index named ``index``, as
    pandas' to_parquet writes it (pyarrow/pandas_compat.py construct_metadata): LeRobot reads meta/tasks.parquet
    with pandas.read_parquet and looks a task's text up as the index (datasets/io_utils.py load_tasks)."""
    import pyarrow as pa

    doc = {"index_columns": [index],
           "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                               "metadata": {"encoding": "UTF-8"}}],
           "columns": [{"name": column, "field_name": column, "pandas_type": "int64", "numpy_type": "int64",
                        "metadata": None},
                       {"name": index, "field_name": index, "pandas_type": "unicode", "numpy_type": "object",
                        "metadata": None}],
           "creator": {"library": "pyarrow", "version": pa.__version__}, "pandas_version": "2.2.3"}
    return json.dumps(doc).encode()


def write_tasks(path: Path, tasks: Sequence[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()), "task": pa.array(list(tasks), pa.string())})
    table = table.replace_schema_metadata({b"pandas": _pandas_index_metadata("task", "task_index")})
    pq.write_table(table, path)


def features(state_names: Sequence[str], frame_sizes: dict[str, Sequence[int]], fps: int,
             expert_actions: bool = False) -> dict[str, Any]:
    """info.json's ``features`` (utils/feature_utils.py hw_to_dataset_features: user features, then the defaults);
    ``expert_actions``: a perturbed recording's, with ``action.expert``."""
    out: dict[str, Any] = {}
    for camera in CAMERAS:
        h, w = frame_sizes[camera]
        out[video_key(camera)] = {
            "dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"],
            "info": {"video.height": h, "video.width": w, "video.codec": VIDEO_CODEC_NAME, "video.pix_fmt": VIDEO_PIX_FMT,
                     "video.is_depth_map": False, "video.fps": fps, "video.channels": 3, "has_audio": False}}
    out["observation.state"] = {"dtype": "float32", "shape": [len(state_names)], "names": list(state_names)}
    out[ENVIRONMENT_STATE] = {"dtype": "float32", "shape": [len(SCENE_NAMES)], "names": list(SCENE_NAMES)}
    out["action"] = {"dtype": "float32", "shape": [len(ACTION_NAMES)], "names": list(ACTION_NAMES)}
    if expert_actions:
        out[EXPERT_ACTION] = {"dtype": "float32", "shape": [len(ACTION_NAMES)], "names": list(ACTION_NAMES)}
    for name in STEP_FLAGS:
        out[name] = {"dtype": "bool", "shape": [1], "names": None}
    for name, dtype in DEFAULT_FEATURES.items():
        out[name] = {"dtype": dtype, "shape": [1], "names": None}
    return out


def step_features(steps: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A staged episode's per-step features by name (eval.lerobot.episode's arrays), in the data table's order
    before LeRobot's defaults: the vectors (N, D), then the flags (N,)."""
    n = len(steps["state"])
    done = np.zeros(n, dtype=bool)
    done[-1] = True
    out = {"observation.state": steps["state"], ENVIRONMENT_STATE: steps["environment_state"],
           "action": steps["action"]}
    if "action_expert" in steps:
        out[EXPERT_ACTION] = steps["action_expert"]
    out["next.success"] = steps["success"].astype(bool)
    out["next.done"] = done
    return out


def _data_table(columns: dict[str, np.ndarray], episode_index: int, first_index: int, task_index: int, fps: int):
    """An episode's rows: its :func:`step_features`, then LeRobot's default features."""
    import pyarrow as pa

    n = len(columns["next.done"])
    frame = np.arange(n, dtype=np.int64)

    def vectors(x: np.ndarray):
        x = np.ascontiguousarray(x, dtype=np.float32)
        return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), pa.float32()), x.shape[1])

    return pa.table({
        **{name: vectors(x) if x.ndim == 2 else pa.array(x) for name, x in columns.items()},
        "timestamp": pa.array((frame / fps).astype(np.float32)), "frame_index": pa.array(frame),
        "episode_index": pa.array(np.full(n, episode_index, dtype=np.int64)),
        "index": pa.array(first_index + frame), "task_index": pa.array(np.full(n, task_index, dtype=np.int64)),
    })


def _card(info: dict[str, Any], recording: dict[str, Any]) -> str:
    """The dataset card LeRobot pushes beside a dataset (datasets/utils.py create_lerobot_dataset_card)."""
    return ("---\nlicense: apache-2.0\ntask_categories:\n- robotics\ntags:\n- LeRobot\n- shape-assembly-bench\n"
            "configs:\n- config_name: default\n  data_files: data/*/*.parquet\n---\n\n"
            "# Shape assembly demonstrations\n\n"
            f"Tries of `{recording['model']}` on the {recording['split']} split of the shape-assembly benchmark "
            f"({recording['arm']} arm, setups {', '.join(recording['setups'])}"
            + (f"; tries {recording['first_try']} to {recording['first_try'] + recording['tries_per_setup'] - 1} "
               f"of each" if recording.get("first_try") else "") + "), recorded by "
            f"`python -m eval.record`: {info['total_episodes']} episodes, {info['total_frames']} frames at "
            f"{info['fps']} fps, {recording['successful_episodes']} successful"
            + (f" (a smoke recording: every try cut at {recording['max_steps']} control steps)"
               if recording.get("max_steps") else "") + ". Both cameras are video features; "
            "`meta/episodes` adds each try's setup, try index, seed, success and flags; `meta/recording.json` "
            "names the task list (sha256) the starts came from. `observation.environment_state` is the simulator's "
            "state of the scene as the state policies read it (the target block's and hole's poses, the gripper's; "
            f"{recording['environment_state']}): no camera policy observes it, but one may be trained to estimate "
            "it.\n\n" + _expert_paragraph(info, recording)
            + "```json\n" + json.dumps(info, indent=2) + "\n```\n")


def _expert_paragraph(info: dict[str, Any], recording: dict[str, Any]) -> str:
    """What the card says of ``action.expert``, in a perturbed recording (else nothing)."""
    if EXPERT_ACTION not in info["features"]:
        return ""
    noise = (recording.get("options") or {}).get("noise")
    return ("The scripted reference's action plus Gaussian noise"
            + (f" (std {noise:g} per motion component, seeded per try)" if noise else "")
            + " was executed (DART, Laskey et al. 2017): `action` is what the arm received, `action.expert` the "
            "reference's clean action for the state reached (in its labeler mode), the label a learner trains "
            "on; the gripper's command is never perturbed.\n\n")


def write_dataset(root: Path, episodes: Sequence[EpisodeSource], recording: dict[str, Any], robot_type: str,
                  progress=None) -> dict[str, Any]:
    """Write the dataset of ``episodes`` (in that order) into ``root``; its info.json. ``recording``: what
    meta/recording.json keeps of the run (model, split, setups, arm, task list sha256, ...)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not episodes:
        raise DatasetWriteError("no finished tries to write: every try of the recording failed to finish")
    work = Path(tempfile.mkdtemp(prefix=".assembling-", dir=root))
    try:
        tasks: dict[str, int] = {}
        rows: list[dict[str, Any]] = []
        per_step: dict[str, list[np.ndarray]] = {}  # each step feature's values, episode by episode
        image_stats: dict[str, list] = {c: [] for c in CAMERAS}
        fps = frame_sizes = state_names = step_names = None
        data_file = (0, 0)
        writer = None
        video_parts: dict[str, list[Path]] = {c: [] for c in CAMERAS}
        video_file = {c: (0, 0) for c in CAMERAS}
        video_bytes = {c: 0 for c in CAMERAS}
        video_frames = {c: 0 for c in CAMERAS}
        total = 0

        def flush_video(camera: str) -> None:
            if video_parts[camera]:
                c, f = video_file[camera]
                concat_videos(video_parts[camera], work / VIDEO_PATH.format(video_key=video_key(camera), chunk_index=c,
                                                                               file_index=f))
                video_parts[camera] = []

        for e, src in enumerate(episodes):
            meta, steps = read_staged(src.folder)
            columns = step_features(steps)
            if fps is None:
                fps, frame_sizes, state_names = meta["fps"], meta["frame_size"], meta["joint_names"]
                step_names = list(columns)
            elif (meta["fps"], meta["frame_size"], meta["joint_names"], list(columns)) != (
                    fps, frame_sizes, state_names, step_names):
                raise DatasetWriteError(f"staged episode {src.folder} differs from the first in fps, frame size, "
                                        f"joints or step features ({EXPERT_ACTION}); rerun with --fresh")
            n = meta["length"]
            task = meta["instruction"]
            task_index = tasks.setdefault(task, len(tasks))
            table = _data_table(columns, e, total, task_index, fps)
            path = work / DATA_PATH.format(chunk_index=data_file[0], file_index=data_file[1])
            if writer is not None and path.stat().st_size >= DATA_FILE_MB * 1e6:
                writer.close()
                writer, data_file = None, _next_file(*data_file)
                path = work / DATA_PATH.format(chunk_index=data_file[0], file_index=data_file[1])
            if writer is None:
                path.parent.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table)  # one row group per episode, as LeRobot's writer
            row = {"episode_index": e, "tasks": [task], "length": n, "data/chunk_index": data_file[0],
                   "data/file_index": data_file[1], "dataset_from_index": total, "dataset_to_index": total + n}
            for camera in CAMERAS:
                part = src.folder / f"{camera}.mp4"
                size = part.stat().st_size
                if video_parts[camera] and video_bytes[camera] + size >= VIDEO_FILE_MB * 1e6:
                    flush_video(camera)
                    video_file[camera] = _next_file(*video_file[camera])
                    video_bytes[camera] = video_frames[camera] = 0
                key = video_key(camera)
                row[f"videos/{key}/chunk_index"], row[f"videos/{key}/file_index"] = video_file[camera]
                # frames, not container durations: frame j of an episode is at from_timestamp + j / fps exactly
                row[f"videos/{key}/from_timestamp"] = video_frames[camera] / fps
                row[f"videos/{key}/to_timestamp"] = (video_frames[camera] + n) / fps
                video_parts[camera].append(part)
                video_bytes[camera] += size
                video_frames[camera] += n
                image_stats[camera].append(meta["image_stats"][camera])
            row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0, "setup": meta["setup"],
                        "try_index": meta["try_index"], "seed": meta["seed"], "split": meta["split"],
                        "success": bool(src.success), "flags": list(src.flags)})
            rows.append(row)
            for name, values in columns.items():
                per_step.setdefault(name, []).append(values)
            total += n
            if progress is not None:
                progress(1)
        writer.close()
        for camera in CAMERAS:
            flush_video(camera)

        meta_dir = work / "meta"
        (meta_dir / "episodes/chunk-000").mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), work / EPISODES_PATH.format(chunk_index=0, file_index=0))
        write_tasks(meta_dir / "tasks.parquet", list(tasks))
        n_ep = len(rows)
        index = np.arange(total)
        episode_of = np.concatenate([np.full(r["length"], r["episode_index"]) for r in rows])
        frame_of = np.concatenate([np.arange(r["length"]) for r in rows])
        task_of = np.concatenate([np.full(r["length"], tasks[r["tasks"][0]]) for r in rows])
        stats = {video_key(c): _image_stats(image_stats[c]) for c in CAMERAS}
        for name, parts in per_step.items():
            values = np.concatenate(parts)
            stats[name] = _vector_stats(values.reshape(len(values), -1))  # a flag as a (N, 1) feature
        for name, values in (("timestamp", frame_of / fps), ("frame_index", frame_of), ("episode_index", episode_of),
                             ("index", index), ("task_index", task_of)):
            stats[name] = _vector_stats(np.asarray(values, dtype=np.float64).reshape(-1, 1))
        (meta_dir / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
        info = {"codebase_version": CODEBASE_VERSION, "fps": fps,
                "features": features(state_names, frame_sizes, fps, expert_actions=EXPERT_ACTION in step_names),
                "total_episodes": n_ep, "total_frames": total, "total_tasks": len(tasks), "chunks_size": CHUNKS_SIZE,
                "data_files_size_in_mb": DATA_FILE_MB, "video_files_size_in_mb": VIDEO_FILE_MB, "data_path": DATA_PATH,
                "video_path": VIDEO_PATH, "robot_type": robot_type, "splits": {"train": f"0:{n_ep}"}}
        recording = {**recording, "environment_state": STATE_FEATURES_VERSION, "episodes": n_ep, "frames": total,
                     "successful_episodes": int(sum(r["success"] for r in rows))}
        (work / RECORDING_FILE).write_text(json.dumps(recording, indent=1) + "\n")
        (work / "README.md").write_text(_card(info, recording))
        info_text = json.dumps(info, indent=4) + "\n"
        for name in ("data", "videos", "meta", "README.md"):  # into place; meta/info.json written last
            if (root / name).exists():
                shutil.rmtree(root / name) if (root / name).is_dir() else (root / name).unlink()
            os.replace(work / name, root / name)
        tmp = root / (INFO_FILE + ".partial")
        tmp.write_text(info_text)
        os.replace(tmp, root / INFO_FILE)
        return info
    finally:
        shutil.rmtree(work, ignore_errors=True)
