"""Octo checkpoints in the released layout: find, read, check, write.

A released Octo checkpoint (``rail-berkeley/octo-small-1.5``, ``octo-base-1.5``)
is a folder::

    config.json                  architecture (module specs) and text processor
    dataset_statistics.json      per-dataset action/proprio mean, std, mask, ...
    example_batch.msgpack        a batch of inputs (shapes: image sizes, window)
    <step>/default/checkpoint    parameters, written by orbax with every array
                                 aggregated into this one msgpack file
    <step>/commit_success.txt, <step>/default/commit_success.txt

The parameters are read from either form:

- single-file msgpack (the release): ``<step>/default/checkpoint`` (or
  ``<step>/checkpoint``), decoded with flax's msgpack format, no orbax needed;
- an orbax PyTree folder (``<step>/default`` or ``<step>`` holding
  ``_METADATA``/``manifest.ocdbt``), as newer orbax writes it; read with orbax.

The newest step is used unless a step is given. Every parameter is checked
against the architecture of ``config.json``: the first missing, unexpected or
mis-shaped parameter is reported in one line (name, expected and found shape).

Where the files come from is :func:`resolve_weights`: ``--checkpoint DIR`` (a
folder in this layout), else a Hub repo (``--checkpoint hf://ORG/NAME``, or the
model's released one) through :mod:`engines.hub` (the Hugging Face cache, or a
download of only the files above and the newest step's folder), together with
t5-base's tokenizer (:func:`engines.octo.text.resolve_spiece`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from engines import hub
from engines.octo.config import HF_REPOS, OctoConfig, config_from_release, release_config_dict
from engines.octo.errors import OctoCheckpointError
from engines.optional import require

REQUIRED_FILES = ("config.json", "dataset_statistics.json", "example_batch.msgpack")
COMMIT_MARKER = "commit_success.txt"  # orbax's mark of a finished save, read by no loader
RELEASE_FILES = ", ".join(REQUIRED_FILES) + " and the newest <step>/ folder"
RANDOM_FLAG = ", or --random-weights for latency only"


def get_hint(model: str | None) -> str:
    """What to do about a checkpoint that cannot be used."""
    repo = HF_REPOS.get(model or "", "rail-berkeley/octo-small-1.5 (or octo-base-1.5)")
    return (f"the released files are {repo} on the Hugging Face Hub (fetched into its cache when no --checkpoint is "
            f"given); --checkpoint DIR takes a folder with {RELEASE_FILES}")


@dataclass
class Checkpoint:
    path: Path
    step: int | None
    config: OctoConfig
    params: dict
    dataset_statistics: dict
    example_batch: dict
    raw_config: dict

    @property
    def identity(self) -> str:
        return f"{self.path.resolve()}@{self.step}"


def release_files(paths: Sequence[str]) -> list[str]:
    """The files of a checkpoint in the released layout the loader reads, of a repo's (or folder's) ``paths``:
    the three at the top and every file of the newest step's folder but orbax's commit markers
    (:class:`engines.hub.LayoutError` when any is missing)."""
    have = set(paths)
    missing = [f for f in REQUIRED_FILES if f not in have]
    if missing:
        raise hub.LayoutError(f"not an Octo checkpoint in the released layout: no {', '.join(missing)}")
    steps = sorted({int(p.split("/", 1)[0]) for p in paths if p.split("/", 1)[0].isdigit() and "/" in p})
    if not steps:
        raise hub.LayoutError("not an Octo checkpoint in the released layout: no <step>/ folder with the parameters")
    return list(REQUIRED_FILES) + sorted(p for p in paths if p.startswith(f"{steps[-1]}/")
                                         and not p.endswith(COMMIT_MARKER))


def checkpoint_repo(model: str, checkpoint: str | Path | None) -> str | None:
    """The Hub repo the checkpoint comes from (``hf://ORG/NAME``, or the model's released one when none is
    given), or None for a folder."""
    if checkpoint:
        return hub.parse_repo(str(checkpoint))
    if model not in HF_REPOS:
        raise OctoCheckpointError(f"--model {model} needs --checkpoint DIR or hf://ORG/NAME (an Octo checkpoint in "
                                  f"the released layout); the released models are {', '.join(HF_REPOS)}")
    return HF_REPOS[model]


def resolve(model: str, checkpoint: str | Path | None, revision: str | None = None,
            local_flag: str = "--checkpoint DIR", also: str = RANDOM_FLAG) -> hub.Files:
    """The checkpoint's files: ``checkpoint`` a folder, else its Hub repo (the cache, or a download); one-line
    errors (:class:`engines.hub.HubError` and kinds). ``local_flag``, ``also``: what the error offers instead."""
    repo = checkpoint_repo(model, checkpoint)
    if repo is None:
        if revision:
            raise OctoCheckpointError(f"--revision names a commit of a Hub repo; {checkpoint} is a folder")
        p = Path(checkpoint).expanduser().absolute()  # workers, and the records, name it wherever they run
        if not p.is_dir():
            raise OctoCheckpointError(f"checkpoint folder {p} does not exist; {get_hint(model)}")
        return hub.local(p, release_files, f"{model} checkpoint")
    release = hub.Release(repo, what=f"{model} weights", files=RELEASE_FILES, select=release_files)
    return hub.fetch(release, revision, local_flag=local_flag, also=also)


@dataclass(frozen=True)
class OctoWeights:
    """The files an Octo engine loads: its checkpoint and t5-base's tokenizer (:class:`engines.hub.Files`)."""

    checkpoint: hub.Files
    tokenizer: hub.Files

    @property
    def sha256(self) -> str:
        return hub.digest([self.checkpoint, self.tokenizer])

    def to_json(self) -> dict:
        """What the run's identity keeps: each part's repo, commit and files' sha256 (or folder and sha256s)."""
        return {"sha256": self.sha256, "checkpoint": self.checkpoint.to_json(), "tokenizer": self.tokenizer.to_json()}


def resolve_weights(model: str, checkpoint: str | Path | None, revision: str | None = None,
                    spiece: str | Path | None = None, check_size: bool = True) -> OctoWeights:
    """The checkpoint (:func:`resolve`; with ``check_size``, of the architecture of the model's preset) and the
    tokenizer it needs (:func:`engines.octo.text.resolve_spiece`)."""
    from engines.octo.config import PRESETS
    from engines.octo.text import resolve_spiece

    files = resolve(model, checkpoint, revision)
    if check_size and model in PRESETS:  # another size: one line before the tokenizer is looked for
        check_architecture(read_config(files.folder, model)[0], PRESETS[model](), files.folder, model)
    return OctoWeights(files, resolve_spiece(files, spiece=spiece))


def read_config(path: Path, model: str | None = None) -> tuple[OctoConfig, dict, dict]:
    """The architecture of a checkpoint folder (from ``config.json`` and ``example_batch.msgpack``), the raw
    config and the example batch, without its parameters."""
    raw = _read_json(path / "config.json", model)
    eb_file = path / "example_batch.msgpack"
    if not eb_file.is_file():
        raise OctoCheckpointError(f"{eb_file} is missing; {get_hint(model)}")
    example_batch = _to_numpy(_msgpack_restore(eb_file.read_bytes(), eb_file))
    if "tasks" in example_batch and "task" not in example_batch:
        example_batch["task"] = example_batch.pop("tasks")
    cfg = config_from_release(raw, example_batch, name=model or "octo", where=str(path / "config.json"))
    return cfg, raw, example_batch


def check_architecture(cfg: OctoConfig, expect: OctoConfig, path: Path, model: str | None = None) -> None:
    """A checkpoint of another architecture than ``expect`` (octo-small's, say) is refused in one line."""
    from engines.octo.config import ANY_SIZE, same_architecture

    if not same_architecture(cfg, expect):
        diff = [f"{k} {getattr(cfg, k)} (expected {getattr(expect, k)})"
                for k in ("token_dim", "num_layers", "num_heads", "mlp_dim", "window", "lang_tokens",
                          "repeat_task_tokens", "use_correct_attention", "action_horizon", "action_dim")
                if getattr(cfg, k) != getattr(expect, k)]
        if not diff:
            diff = ["cameras or language encoder differ"]
        raise OctoCheckpointError(f"{path / 'config.json'} is not {expect.name}: {'; '.join(diff)}; a checkpoint of "
                                  f"any size runs as --model {ANY_SIZE}")


def step_dirs(path: Path) -> list[int]:
    return sorted(int(d.name) for d in path.iterdir() if d.is_dir() and d.name.isdigit())


def _msgpack_restore(data: bytes, where: Path) -> Any:
    serialization = require("flax.serialization", "jax")

    try:
        return serialization.msgpack_restore(data)
    except Exception as e:  # noqa: BLE001 - corrupt or foreign file: one line
        raise OctoCheckpointError(f"{where}: not a readable msgpack file ({type(e).__name__}); "
                                  f"the download may be incomplete") from None


def _has_placeholders(tree: Any) -> bool:
    if isinstance(tree, Mapping):
        return any(_has_placeholders(v) for v in tree.values())
    return isinstance(tree, str) and tree.startswith("PLACEHOLDER://")


def _orbax_restore(folder: Path) -> Any:
    ocp = require("orbax.checkpoint", "jax")
    try:
        tree = ocp.PyTreeCheckpointer().restore(str(folder.resolve()))
    except Exception as e:  # noqa: BLE001
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise OctoCheckpointError(f"{folder}: orbax could not read the checkpoint ({msg})") from None
    return tree


def read_params(path: Path, step: int | None = None) -> tuple[dict, int | None]:
    """The raw parameter tree of a checkpoint folder (numpy float32 leaves) and its step."""
    steps = step_dirs(path)
    if step is None and not steps:
        raise OctoCheckpointError(f"{path}: no step folder (e.g. 300000/default/checkpoint) with the parameters")
    if step is not None and step not in steps:
        raise OctoCheckpointError(f"{path}: no step folder {step} (found {steps or 'none'})")
    step = steps[-1] if step is None else step
    sdir = path / str(step)
    tree = None
    for folder in (sdir / "default", sdir):
        f = folder / "checkpoint"
        if f.is_file():
            tree = _msgpack_restore(f.read_bytes(), f)
            if _has_placeholders(tree):  # arrays stored beside the msgpack: let orbax assemble them
                tree = _orbax_restore(folder)
            break
        if any((folder / n).exists() for n in ("_METADATA", "manifest.ocdbt", "_sharding", "d")):
            tree = _orbax_restore(folder)
            break
    if tree is None:
        raise OctoCheckpointError(f"{sdir}: no parameters (expected {sdir / 'default' / 'checkpoint'} "
                                  f"or an orbax folder)")
    if not isinstance(tree, Mapping):
        raise OctoCheckpointError(f"{sdir}: the parameters are not a tree of named arrays")
    if "params" in tree and "octo_transformer" not in tree:
        tree = tree["params"]
    return _to_numpy(tree), step


def _to_numpy(tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {str(k): _to_numpy(v) for k, v in tree.items()}
    a = np.asarray(tree)
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
        a = a.astype(np.float32)
    return a


def check_params(params: Mapping[str, Any], cfg: OctoConfig, where: Path, model: str | None = None) -> None:
    """Raise a one-line OctoCheckpointError naming the first parameter that differs from the architecture."""
    from engines.octo.params import flatten, param_shapes  # imports JAX: only where parameters are read

    expected = dict(flatten(param_shapes(cfg)))
    found = dict(flatten(params))
    hint = get_hint(model)
    for name, spec in expected.items():
        if name not in found:
            raise OctoCheckpointError(f"{where}: parameter {name} missing (expected shape {tuple(spec.shape)}); "
                                      f"{hint}")
        shape = tuple(np.shape(found[name]))
        if shape != tuple(spec.shape):
            raise OctoCheckpointError(f"{where}: parameter {name} has shape {shape}, expected {tuple(spec.shape)}; "
                                      f"{hint}")
    extra = [n for n in found if n not in expected]
    if extra:
        shape = tuple(np.shape(found[extra[0]]))
        raise OctoCheckpointError(f"{where}: unexpected parameter {extra[0]} with shape {shape} "
                                  f"({len(extra)} unexpected in all); {hint}")


def _read_json(f: Path, model: str | None) -> Any:
    if not f.is_file():
        raise OctoCheckpointError(f"{f} is missing; {get_hint(model)}")
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise OctoCheckpointError(f"{f}: not readable JSON ({type(e).__name__}); {get_hint(model)}") from None


def load(path: str | Path, model: str | None = None, step: int | None = None,
         expect: OctoConfig | None = None) -> Checkpoint:
    """Read and check a checkpoint folder in the released layout.

    ``expect``: the architecture the caller wants (e.g. the octo-small preset);
    a checkpoint of another size is refused in one line.
    """
    path = Path(path)
    cfg, raw, example_batch = read_config(path, model)
    stats = _read_json(path / "dataset_statistics.json", model)
    if expect is not None:
        check_architecture(cfg, expect, path, model)
    params, step = read_params(path, step)
    check_params(params, cfg, path / str(step), model)
    return Checkpoint(path=path, step=step, config=cfg, params=params, dataset_statistics=stats,
                      example_batch=example_batch, raw_config=raw)


# ------------------------------------------------------------------ writing (tests, conversions)
def example_batch_for(cfg: OctoConfig, batch: int = 1) -> dict:
    """An example batch in the released layout (zeros), as ``save_pretrained`` stores it."""
    obs: dict[str, Any] = {}
    task: dict[str, Any] = {}
    for cam in cfg.cameras:
        obs[cam.obs_key] = np.zeros((batch, cfg.window, *cam.image_size, 3), np.uint8)
        task[cam.obs_key] = np.zeros((batch, *cam.image_size, 3), np.uint8)
    obs["timestep_pad_mask"] = np.ones((batch, cfg.window), bool)
    obs["pad_mask_dict"] = {c.obs_key: np.ones((batch, cfg.window), bool) for c in cfg.cameras}
    obs["timestep"] = np.zeros((batch, cfg.window), np.int32)
    task["language_instruction"] = {"input_ids": np.zeros((batch, cfg.lang_tokens), np.int32),
                                    "attention_mask": np.zeros((batch, cfg.lang_tokens), np.int32)}
    task["pad_mask_dict"] = {**{c.obs_key: np.zeros((batch,), bool) for c in cfg.cameras},
                             "language_instruction": np.ones((batch,), bool)}
    return {"observation": obs, "task": task, "action": np.zeros((batch, cfg.window, cfg.action_horizon,
                                                                   cfg.action_dim), np.float32)}


def save(path: str | Path, cfg: OctoConfig, params: Mapping[str, Any], dataset_statistics: Mapping[str, Any],
         step: int = 300000, form: str = "msgpack", example_batch: Mapping[str, Any] | None = None) -> Path:
    """Write a checkpoint folder in the released layout; ``form``: "msgpack" (as released) or "orbax"."""
    from flax import serialization

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(release_config_dict(cfg), indent=1))

    def tolist(x):
        if isinstance(x, Mapping):
            return {k: tolist(v) for k, v in x.items()}
        return np.asarray(x).tolist() if isinstance(x, (np.ndarray, list, tuple)) else x

    (path / "dataset_statistics.json").write_text(json.dumps(tolist(dataset_statistics)))
    eb = example_batch if example_batch is not None else example_batch_for(cfg)
    (path / "example_batch.msgpack").write_bytes(serialization.msgpack_serialize(_plain(eb)))
    tree = _plain(params)
    folder = path / str(step) / "default"
    if form == "msgpack":
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "checkpoint").write_bytes(serialization.msgpack_serialize(tree))
        (folder / "commit_success.txt").write_text("Checkpoint commit was successful to " + str(folder))
        (folder.parent / "commit_success.txt").write_text("Checkpoint commit was successful to " + str(folder.parent))
    elif form == "orbax":
        import orbax.checkpoint as ocp

        folder.parent.mkdir(parents=True, exist_ok=True)
        ocp.PyTreeCheckpointer().save(str(folder.resolve()), tree)
    else:
        raise ValueError(f"unknown checkpoint form {form!r}; valid: msgpack, orbax")
    return path


def _plain(tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {str(k): _plain(v) for k, v in tree.items()}
    return np.asarray(tree)
