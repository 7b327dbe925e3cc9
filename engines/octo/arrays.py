"""Octo's inputs and outputs as NumPy arrays, without JAX: what a run on ONNX Runtime or TensorRT needs besides
the graphs (goal images as the model takes them, unnormalisation, blank inputs for warm-up). The JAX model
(:mod:`engines.octo.model`, :mod:`engines.octo.octo_model`) uses these same functions."""

from __future__ import annotations

import numpy as np

from engines.octo.config import UNNORM_KEY, OctoConfig


def goal_cameras(cfg: OctoConfig) -> list[str]:
    """Names of the cameras that stack a goal image (upstream ``task_stack_keys``), in config order."""
    return [c.name for c in cfg.cameras if c.stack_task_image]


def goal_arrays(cfg: OctoConfig, goals, batch: int) -> dict[str, np.ndarray] | None:
    """Goal images as the model takes them: {camera: uint8 (batch, H, W, 3)} for the cameras that stack a
    goal (a (H, W, 3) image or a batch of one is repeated over the batch); None when no goal is given.
    A camera without task stacking, or an image of the wrong size, is a ValueError (one line)."""
    if not goals:
        return None
    stacked = {c.name: c for c in cfg.cameras if c.name in goal_cameras(cfg)}
    out = {}
    for name, img in goals.items():
        if img is None:
            continue
        if name not in stacked:
            raise ValueError(f"camera {name!r} takes no goal image (goal cameras of {cfg.name}: "
                             f"{', '.join(stacked) or 'none'})")
        a = np.asarray(img)
        a = a[None] if a.ndim == 3 else a
        want = (*stacked[name].image_size, 3)
        if a.ndim != 4 or tuple(a.shape[1:]) != want or a.shape[0] not in (1, batch):
            raise ValueError(f"goal image of camera {name!r} has shape {tuple(np.shape(img))}; "
                             f"expected {want} or ({batch}, {', '.join(map(str, want))}) uint8")
        if a.dtype != np.uint8:
            raise ValueError(f"goal image of camera {name!r} is {a.dtype}, expected uint8")
        out[name] = a if a.shape[0] == batch and a.flags.c_contiguous else np.ascontiguousarray(
            np.broadcast_to(a, (batch, *want)))
    return out or None


def unnormalize(actions, stats: dict) -> np.ndarray:
    """Mean/std unnormalisation of upstream ``sample_actions``: dims where ``mask`` is false stay as they are."""
    mean = np.asarray(stats["mean"], np.float32)
    std = np.asarray(stats["std"], np.float32)
    mask = np.asarray(stats.get("mask", np.ones_like(mean, dtype=bool)), bool)
    a = np.asarray(actions, np.float32)[..., : len(mask)]
    return np.where(mask, a * std + mean, a)


def blank_inputs(cfg: OctoConfig, batch: int = 1):
    """Zero images, full masks, zero language: shapes of one query (for warm-up and tests)."""
    images = [np.zeros((batch, cfg.window, *c.image_size, 3), np.uint8) for c in cfg.cameras]
    masks = np.ones((batch, cfg.window, 1 + len(cfg.cameras)), np.float32)
    lang = np.zeros((batch, cfg.lang_tokens, cfg.t5.d_model), np.float32)
    return images, masks, lang


def statistics_of(dataset_statistics: dict, key: str) -> dict:
    """The action statistics of ``key`` (one line when the checkpoint has none)."""
    from engines.octo.errors import OctoCheckpointError

    if key not in dataset_statistics:
        have = ", ".join(dataset_statistics)
        raise OctoCheckpointError(f"dataset_statistics.json has no {key!r} (has {have})")
    return dataset_statistics[key]["action"]


class ModelArrays:
    """What an Octo model answers from its configuration and dataset statistics alone (``self.cfg``,
    ``self.dataset_statistics``), whatever runs it: the loaded model (:class:`engines.octo.octo_model.OctoModel`)
    and the engines folder's (:class:`engines.octo.deployed.DeployedOcto`)."""

    cfg: OctoConfig
    dataset_statistics: dict

    def statistics(self, key: str = UNNORM_KEY) -> dict:
        return statistics_of(self.dataset_statistics, key)

    def unnormalize(self, actions, key: str = UNNORM_KEY) -> np.ndarray:
        return unnormalize(actions, self.statistics(key))

    def blank_inputs(self, batch: int = 1):
        """Zero images, full masks, zero language: shapes of one query (for warm-up and tests)."""
        return blank_inputs(self.cfg, batch)
