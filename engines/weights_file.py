"""Strict loading of the project's own weights files (bc-state's, bc-camera's): one safetensors file holding the
network's tensors, its normalisation and, in the metadata, a format tag and the configuration. A file that does
not match the code fails in one line (:class:`BadCheckpointError`) naming what differs."""

from __future__ import annotations

from pathlib import Path


class BadCheckpointError(ValueError):
    """Weights or normalisation that do not match the model (one line)."""


def write_checkpoint(model, fmt: str, config: dict, path: str | Path, extra: dict | None = None) -> None:
    """``model``'s tensors into the safetensors file ``path``, its metadata the format tag ``fmt``, the
    configuration (JSON) and ``extra`` (as strings): what :func:`read_checkpoint` reads back."""
    import json

    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    meta = {"format": fmt, "config": json.dumps(config), **{k: str(v) for k, v in (extra or {}).items()}}
    save_file(tensors, str(path), metadata=meta)


def read_checkpoint(path: str | Path, model: str, fmt: str, train: str) -> tuple[dict, dict[str, str]]:
    """(tensors, metadata) of ``model``'s weights file ``path``, whose metadata says ``fmt``; one line naming the
    file otherwise (``train``: the command that makes such a file)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise BadCheckpointError(f"{model} weights {path} do not exist; train them with: {train}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - safetensors raises several error types for bad files
        raise BadCheckpointError(f"{model} weights {path} are corrupt or not safetensors ({e})") from None
    if meta.get("format") != fmt:
        raise BadCheckpointError(f"{path} is not a {model} checkpoint (format {meta.get('format')!r}, expected {fmt!r})")
    return tensors, meta


def load_checked(model, tensors: dict, path: str | Path, positive: tuple[str, ...]):
    """``model`` (eval mode) with ``tensors`` loaded, once each of its tensors is there with its shape, none is
    left over, every value is finite and the normalisation stds ``positive`` are above 0; one line otherwise."""
    import torch

    expected = model.state_dict()
    for name in positive:
        if name not in tensors:
            raise BadCheckpointError(f"{path} has no normalisation tensor {name!r}")
    for name, ref in expected.items():
        if name not in tensors:
            raise BadCheckpointError(f"{path} lacks tensor {name!r}")
        if tuple(tensors[name].shape) != tuple(ref.shape):
            raise BadCheckpointError(f"{path}: tensor {name!r} has shape {tuple(tensors[name].shape)}, "
                                     f"expected {tuple(ref.shape)}")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise BadCheckpointError(f"{path} has unexpected tensors {', '.join(unexpected)}")
    if not all(torch.all(tensors[n] > 0) for n in positive) or not all(torch.isfinite(t).all() for t in tensors.values()):
        raise BadCheckpointError(f"{path} holds non-finite weights or a non-positive normalisation std")
    model.load_state_dict(tensors)
    model.eval()
    return model
