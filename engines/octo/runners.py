"""Octo behind the runner interface (``activate`` / ``infer`` / ``deactivate``), on every backend.

One query's feeds, batch first, whatever the backend::

    image_<camera>  uint8 (B, window, H, W, 3) per camera in config order
    masks           float32 (B, window, 1 + cameras)
    lang            float32 (B, lang_tokens, d_t5)
    init_noise      float32 (B, horizon * dim)
    step_noise      float32 (B, diffusion_steps, horizon * dim)
    goal_<camera>   uint8 (B, H, W, 3), optional, per camera that stacks a goal image (upstream's
                    task_stack_keys): the task's goal image; absent = language only (zero goal images)

and its output ``{"actions": (B, horizon, dim)}``, normalised. Images may be numpy arrays or torch tensors (a
camera frame on the GPU stays there: it reaches JAX by DLPack and TensorRT by device pointer; only a frame that
must cross between host and device is copied, and its bytes are counted in ``copies``).

- :class:`JaxOcto`: the engine's jitted JAX model (CPU or GPU, wherever JAX runs). JAX compiles once per
  batch size, so a batch is padded to the next power of two (rows do not depend on the padding rows).
- :class:`OnnxOcto`: the two exported graphs (backbone, unrolled sampler; :mod:`engines.octo.export`) behind
  any pair of graph runners: ONNX Runtime or TensorRT.

:func:`engines.backends.model_runner` builds either from a model and a :class:`~engines.backends.BackendSpec`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from engines.octo.config import OctoConfig
from engines.runners import JaxRunner, Runner
from engines.zero_copy import CopyCounter, as_host_view, is_torch_tensor, to_jax


def image_names(cfg: OctoConfig) -> list[str]:
    return [f"image_{c.name}" for c in cfg.cameras]


def goal_feeds(cfg: OctoConfig, feeds: Mapping[str, Any]) -> dict[str, Any] | None:
    """The goal images among a query's feeds, {camera: (B, H, W, 3)}; None when there are none."""
    goals = {c.name: feeds[f"goal_{c.name}"] for c in cfg.cameras if f"goal_{c.name}" in feeds}
    return goals or None


def padded_batch(b: int) -> int:
    """The batch JAX runs ``b`` rows as: the next power of two, so that few sizes are ever compiled."""
    return 1 << (b - 1).bit_length()


def _pad_rows(x, pad: int):
    if is_torch_tensor(x):
        import torch

        return torch.cat([x, x[:1].expand(pad, *x.shape[1:])])
    return np.concatenate([x, np.repeat(np.asarray(x)[:1], pad, axis=0)])


class JaxOcto(JaxRunner):
    """An :class:`~engines.octo.octo_model.OctoModel`'s jitted model as a runner (see the module docstring)."""

    name = "jax"

    def __init__(self, engine, counter: CopyCounter | None = None) -> None:
        super().__init__(self._predict, jit=False)  # the engine's function is jitted already
        self.engine = engine
        self.cfg = engine.cfg
        self.copies = counter if counter is not None else CopyCounter()

    def batch_sizes(self, n: int) -> list[int]:
        """The batch sizes a rollout of up to ``n`` scenes runs (to compile before the tries)."""
        return sorted({padded_batch(b) for b in range(1, n + 1)})

    def _predict(self, **feeds) -> dict[str, Any]:
        b = int(feeds["masks"].shape[0])
        pad = padded_batch(b) - b
        if pad:
            feeds = {k: _pad_rows(v, pad) for k, v in feeds.items()}
        images = [to_jax(feeds[n], self.copies) for n in image_names(self.cfg)]
        e = self.engine
        steps = np.swapaxes(np.asarray(feeds["step_noise"], np.float32), 0, 1)  # the model takes steps first
        goals = goal_feeds(self.cfg, feeds)
        kw = {} if goals is None else {"goals": {k: to_jax(v, self.copies) for k, v in goals.items()}}
        out = e._infer(e.params, images, np.asarray(feeds["lang"], np.float32), np.asarray(feeds["masks"], np.float32),
                       np.asarray(feeds["init_noise"], np.float32), steps, **kw)
        return {"actions": out[:b]}


class OnnxOcto(Runner):
    """One Octo query through two graph runners (backbone, sampler), same feeds and output as
    :class:`JaxOcto`. ``readout`` and ``predict`` take ``OctoModel.predict``'s arguments (tests, benchmarks).

    Host-to-device traffic of the last query (``infer``), over both graphs: ``last_h2d_bytes`` and
    ``last_h2d_ms``. TensorRT: the host feeds its runners copied and the device time of those copies (CUDA
    events; frames on the GPU are bound by address and count 0, and so does a read-only feed the runner holds
    already: the try's language embedding and goal images after its first query); this includes the readout,
    which comes back to the host between the graphs. ONNX Runtime on the CPU has no device: 0 bytes and no
    time (None). ONNX Runtime on CUDA copies inside the session, unseen: None for both."""

    def __init__(self, cfg: OctoConfig, backbone: Runner, sampler: Runner, counter: CopyCounter | None = None):
        super().__init__()
        self.cfg = cfg
        self.backbone = backbone
        self.sampler = sampler
        self.name = backbone.name
        self.copies = counter if counter is not None else CopyCounter()
        # TensorRT binds device tensors by address; ONNX Runtime on the CPU needs host arrays
        self.device_feeds = backbone.name == "trt"
        self.last_h2d_bytes: int | None = None
        self.last_h2d_ms: float | None = None

    def batch_sizes(self, n: int) -> list[int]:
        return [n]

    def _activate(self) -> None:
        self.backbone.activate()
        self.sampler.activate()

    def _deactivate(self) -> None:
        self.backbone.deactivate()
        self.sampler.deactivate()

    def _image(self, x):
        if self.device_feeds and getattr(x, "is_cuda", False):
            return x.contiguous()  # bound by device pointer: no copy over the bus
        return as_host_view(x, self.copies, dtype=np.uint8)

    def readout(self, images: Sequence[Any], masks, lang, lang_mask=None, goals=None) -> np.ndarray:
        """``goals``: None (zero goal images) or {camera: uint8 goal image}, as ``OctoModel.predict``."""
        from engines.octo.export import backbone_feeds

        if goals:
            goals = {k: None if v is None else as_host_view(v, self.copies, dtype=np.uint8) for k, v in goals.items()}
        feeds = backbone_feeds(self.cfg, [self._image(i) for i in images], masks, lang, lang_mask, goals)
        return self.backbone.infer(feeds)["readout"]

    def predict(self, images: Sequence[Any], masks, lang, noise: tuple[Any, Any], goals=None) -> np.ndarray:
        """``noise``: (init (B, flat), steps (diffusion_steps, B, flat)), as ``OctoModel.predict`` takes it."""
        from engines.octo.export import sampler_feeds

        readout = self.readout(images, masks, lang, goals=goals)
        return self.sampler.infer(sampler_feeds(readout, *noise))["actions"]

    def _infer(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        images = [feeds[n] for n in image_names(self.cfg)]
        noise = (feeds["init_noise"], np.swapaxes(np.asarray(feeds["step_noise"]), 0, 1))
        self.last_h2d_bytes = self.last_h2d_ms = None
        out = {"actions": self.predict(images, feeds["masks"], feeds["lang"], noise, goal_feeds(self.cfg, feeds))}
        parts = [self.h2d_of(r) for r in (self.backbone, self.sampler)]
        nbytes, ms = [p[0] for p in parts], [p[1] for p in parts]
        self.last_h2d_bytes = None if None in nbytes else sum(nbytes)
        self.last_h2d_ms = None if None in ms else sum(ms)
        return out

    @staticmethod
    def h2d_of(runner: Runner) -> tuple[int | None, float | None]:
        """(bytes, ms) a graph runner copied from host to device in its last call (:func:`engines.runners.h2d_of`)."""
        from engines.runners import h2d_of

        return h2d_of(runner)

