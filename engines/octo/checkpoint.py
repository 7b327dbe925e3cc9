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
mis-shaped parameter is reported in one line (name, expected and found shape),
with how to get the files. Nothing is ever downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from engines.octo.config import HF_REPOS, OctoConfig, config_from_release, release_config_dict
from engines.octo.errors import OctoCheckpointError
from engines.octo.params import flatten, param_shapes
from engines.octo.text import hf_snapshots
from engines.optional import require

REQUIRED_FILES = ("config.json", "dataset_statistics.json", "example_batch.msgpack")


def get_hint(model: str | None) -> str:
    repo = HF_REPOS.get(model or "", "rail-berkeley/octo-small-1.5 (or octo-base-1.5)")
    return (f"get the files with `huggingface-cli download {repo}` and its tokenizer with `huggingface-cli download "
            f"google-t5/t5-base spiece.model` on a machine with internet, then pass --checkpoint DIR (the downloaded "
            f"folder, spiece.model beside it) or copy both into the Hugging Face cache here")


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


def find_hf_checkpoint(model: str) -> Path | None:
    """The local Hugging Face cache snapshot of the released model, if one holds a config.json."""
    repo = HF_REPOS[model]
    return next((s for s in hf_snapshots(repo) if (s / "config.json").is_file()), None)


def resolve(model: str, checkpoint: str | Path | None) -> Path:
    """The checkpoint folder: ``checkpoint`` when given, else the HF cache; a one-line error otherwise."""
    if checkpoint:
        p = Path(checkpoint).expanduser()
        if not p.is_dir():
            raise OctoCheckpointError(f"checkpoint folder {p} does not exist; {get_hint(model)}")
        return p
    p = find_hf_checkpoint(model)
    if p is None:
        raise OctoCheckpointError(f"no {model} checkpoint: {HF_REPOS[model]} is not in the Hugging Face cache "
                                  f"(HF_HOME / ~/.cache/huggingface/hub) and no --checkpoint was given; "
                                  f"{get_hint(model)}; or run with --random-weights for latency only")
    return p


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
    raw = _read_json(path / "config.json", model)
    eb_file = path / "example_batch.msgpack"
    if not eb_file.is_file():
        raise OctoCheckpointError(f"{eb_file} is missing; {get_hint(model)}")
    example_batch = _to_numpy(_msgpack_restore(eb_file.read_bytes(), eb_file))
    if "tasks" in example_batch and "task" not in example_batch:
        example_batch["task"] = example_batch.pop("tasks")
    stats = _read_json(path / "dataset_statistics.json", model)
    cfg = config_from_release(raw, example_batch, name=model or "octo", where=str(path / "config.json"))
    if expect is not None:
        from engines.octo.config import same_architecture

        if not same_architecture(cfg, expect):
            diff = [f"{k} {getattr(cfg, k)} (expected {getattr(expect, k)})"
                    for k in ("token_dim", "num_layers", "num_heads", "mlp_dim", "window", "lang_tokens",
                              "repeat_task_tokens", "use_correct_attention", "action_horizon", "action_dim")
                    if getattr(cfg, k) != getattr(expect, k)]
            if not diff:
                diff = ["cameras or language encoder differ"]
            raise OctoCheckpointError(f"{path / 'config.json'} is not {expect.name}: {'; '.join(diff)}; "
                                      f"{get_hint(model)}")
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
