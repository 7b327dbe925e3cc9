"""Recorded tries as a LeRobotDataset v3.0, written without importing lerobot (its pins conflict with the lock).

The on-disk format, as LeRobot's own writer makes it and its reader expects it
(huggingface/lerobot ``src/lerobot/datasets/``: ``utils.py`` for the paths and
``DatasetInfo``, ``dataset_writer.py`` and ``dataset_metadata.py`` for what each
file holds, ``dataset_reader.py`` for what a read needs)::

    DIR/meta/info.json                      codebase_version "v3.0", fps, features, totals, path templates
    DIR/meta/stats.json                     per feature: min max mean std count q01 q10 q50 q90 q99
    DIR/meta/tasks.parquet                  the instructions: pandas index "task", column task_index
    DIR/meta/episodes/chunk-000/file-000.parquet   one row per episode: where its rows and frames are
    DIR/data/chunk-000/file-000.parquet     one row per control step (no images: they are in the videos)
    DIR/videos/observation.images.<camera>/chunk-000/file-000.mp4   episodes one after another, CFR

What this project adds, all in files or columns LeRobot's reader leaves alone:
the episodes table's ``setup``, ``try_index``, ``seed``, ``split``, ``success``
and ``flags`` columns, per step ``observation.environment_state`` (LeRobot's key for
a simulator's state, ``OBS_ENV_STATE``: here bc-state's 32 scene features, the
labels a camera policy's state estimator trains on), ``next.success`` and
``next.done`` (and, in a
recording whose executed actions were perturbed, ``eval.record --noise``,
``action.expert``: the expert's label for the state reached), and
``meta/recording.json`` (the run: model, task list sha256, setups, appearance).
The run folder the tries were recorded by is ``DIR/recording/`` (eval.run's:
``run.json``, ``tries.jsonl``, the staged episodes while a recording is under
way), so ``python -m eval.record`` resumes a killed recording like eval.run.

Videos are H.264 (yuv420p, no B-frames, a keyframe every 2 frames as LeRobot's
own encoder settings have it): both of LeRobot's decoders (torchcodec and PyAV)
read it with any FFmpeg, where AV1, LeRobot's default, needs an AV1 decoder.
"""

DATASET_FORMAT = "lerobot-v3.0"  # what a recording run's options say it records (its run identity)
CODEBASE_VERSION = "v3.0"  # LeRobot's datasets/dataset_metadata.py CODEBASE_VERSION
