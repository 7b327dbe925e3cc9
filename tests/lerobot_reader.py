"""Read a dataset of eval.record with LeRobot's own LeRobotDataset, in a venv with lerobot (not the project's:
see scripts/lerobot_venv.sh); print what it read as one JSON line for tests/test_record.py to compare.

    build/venv-py312-lerobot/bin/python tests/lerobot_reader.py DATASET_DIR

No Hub access: HF_HUB_OFFLINE=1, and LeRobot reads a complete local folder without asking the Hub.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(root: str) -> int:
    import lerobot
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/shape-assembly-demos", root=root)
    fps = ds.fps
    # an action chunk of 3 steps, as a chunking policy asks for it (padded past an episode's end)
    chunked = LeRobotDataset("local/shape-assembly-demos", root=root,
                             delta_timestamps={"action": [0.0, 1 / fps, 2 / fps]})
    picks = sorted({0, len(ds) // 2, len(ds) - 1})
    items = []
    for i in picks:
        item = ds[i]
        chunk = chunked[i]
        items.append({
            "index": int(item["index"]), "episode_index": int(item["episode_index"]),
            "frame_index": int(item["frame_index"]), "timestamp": float(item["timestamp"]), "task": item["task"],
            "state": [float(x) for x in item["observation.state"]],
            "action": [float(x) for x in item["action"]],
            "action_chunk_shape": list(chunk["action"].shape),
            "action_is_pad": [bool(x) for x in chunk["action_is_pad"]],
            "images": {k: {"shape": list(item[k].shape), "dtype": str(item[k].dtype),
                           "mean_rgb": [float(item[k][c].mean()) for c in range(item[k].shape[0])]}
                       for k in ds.meta.camera_keys},
        })
    print(json.dumps({"lerobot": lerobot.__version__, "len": len(ds), "num_episodes": ds.num_episodes, "fps": fps,
                      "camera_keys": list(ds.meta.camera_keys), "video_backend": getattr(ds, "_video_backend", None),
                      "stats_keys": sorted(ds.meta.stats), "items": items}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
