"""Bind camera frames to engine inputs without copying, and count the bytes that do get copied.

On the CPU a frame reaches the runner as a numpy view of the observation
buffer (a batch axis added by indexing, never by copying). On a GPU, frames
that ManiSkill renders into torch CUDA tensors are bound to TensorRT by device
pointer (by :class:`engines.runners.TensorRtRunner`, which counts what it does
copy in a :class:`CopyCounter`), so an image never crosses the bus. Wherever a
frame does have to move between host and device (a CPU frame for a GPU engine,
a GPU frame for a CPU runner) the move is counted per control step; the report
shows 0 when nothing moved. torch and tensorrt are only touched through the
objects passed in, so this module imports on a CPU-only machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np


class ZeroCopyError(RuntimeError):
    """A frame cannot be bound as asked (one line)."""


def nbytes(x: Any) -> int:
    """Size in bytes of a numpy array or a torch tensor (duck-typed: no torch import)."""
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if hasattr(x, "element_size") and hasattr(x, "numel"):
        return int(x.element_size() * x.numel())
    return int(np.asarray(x).nbytes)


def is_cuda_tensor(x: Any) -> bool:
    return bool(getattr(x, "is_cuda", False))


def is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


@dataclass
class CopyCounter:
    """Host<->device bytes per control step; the report says 0 when no frame moved. ``h2d_ms``: the device
    time of the host-to-device copies, where the copier can time them (TensorRtRunner: CUDA events around
    its copies); 0.0 where nothing was timed."""

    h2d_bytes: int = 0
    d2h_bytes: int = 0
    host_copy_bytes: int = 0  # copies within host memory (layout or dtype changes), for completeness
    h2d_ms: float = 0.0  # device time of the timed host-to-device copies
    per_step: list[int] = field(default_factory=list)  # host<->device bytes of each finished step
    _step_bytes: int = 0

    def add_h2d(self, n: int) -> None:
        self.h2d_bytes += n
        self._step_bytes += n

    def add_h2d_ms(self, ms: float) -> None:
        self.h2d_ms += ms

    def add_d2h(self, n: int) -> None:
        self.d2h_bytes += n
        self._step_bytes += n

    def add_host_copy(self, n: int) -> None:
        self.host_copy_bytes += n

    def end_step(self) -> int:
        """Close the current control step; returns its host<->device bytes."""
        n, self._step_bytes = self._step_bytes, 0
        self.per_step.append(n)
        return n

    def report(self) -> dict:
        steps = len(self.per_step)
        return {
            "steps": steps,
            "h2d_bytes": self.h2d_bytes,
            "d2h_bytes": self.d2h_bytes,
            "host_copy_bytes": self.host_copy_bytes,
            "bytes_per_step_mean": (sum(self.per_step) / steps) if steps else 0.0,
            "bytes_per_step_max": max(self.per_step) if steps else 0,
            "zero_copy": self.h2d_bytes == 0 and self.d2h_bytes == 0,
        }


# ------------------------------------------------------------------------ CPU
def as_host_view(frame: Any, counter: CopyCounter | None = None, add_batch: bool = False,
                 dtype: np.dtype | str | None = None) -> np.ndarray:
    """A numpy array for a CPU runner that shares memory with the frame wherever possible.

    numpy frames and CPU torch tensors are viewed, not copied; a CUDA tensor has
    to come to the host (counted as device-to-host). A dtype change or a
    non-contiguous frame needs a host copy (counted separately).
    """
    if is_cuda_tensor(frame):
        if counter is not None:
            counter.add_d2h(nbytes(frame))
        arr = frame.detach().cpu().numpy()
    elif is_torch_tensor(frame):
        arr = frame.detach().numpy()  # shares the tensor's memory
    elif isinstance(frame, np.ndarray):
        arr = frame
    else:
        raise ZeroCopyError(f"cannot view a {type(frame).__name__} as a numpy array without copying")
    if dtype is not None and arr.dtype != np.dtype(dtype):
        if counter is not None:
            counter.add_host_copy(arr.size * np.dtype(dtype).itemsize)
        arr = arr.astype(dtype)
    if not arr.flags["C_CONTIGUOUS"]:  # runtimes want contiguous inputs; this is the only copy made here
        if counter is not None:
            counter.add_host_copy(arr.nbytes)
        arr = np.ascontiguousarray(arr)
    return arr[None] if add_batch else arr


def host_feeds(obs: Mapping[str, Any], bindings: Mapping[str, str], counter: CopyCounter | None = None,
               add_batch: bool = True) -> dict[str, np.ndarray]:
    """Runner feeds {input name: view of obs[key]} for bindings {input name: obs key}."""
    missing = [k for k in bindings.values() if k not in obs]
    if missing:
        raise ZeroCopyError(f"observation lacks {', '.join(missing)}; it has {', '.join(sorted(obs))}")
    return {name: as_host_view(obs[key], counter, add_batch=add_batch) for name, key in bindings.items()}


# ------------------------------------------------------------------------ GPU
# Binding frames to TensorRT by device pointer is engines.runners.TensorRtRunner's (the one binding path): it
# takes torch CUDA tensors (``__cuda_array_interface__``) without a copy, checks their dtype, layout and stream,
# and counts host frames it copies in a CopyCounter passed as ``counter``.


def _torch():
    from engines.optional import require

    return require("torch")


def cuda_unavailable_reason() -> str | None:
    """Why the GPU path cannot run here (shown when tests skip it), or None."""
    from engines.optional import available

    if not available("torch"):
        return "torch is not installed"
    torch = _torch()
    if not torch.cuda.is_available():
        return "CUDA is not available to torch"
    return None


# ------------------------------------------------------------------------ JAX
def to_jax(x: Any, counter: CopyCounter | None = None):
    """A JAX array of a frame for a JAX model: torch tensors by DLPack, sharing memory when JAX runs on the
    tensor's device (a CUDA frame into JAX on the GPU, a CPU frame into JAX on the CPU); a frame on another
    device than JAX's is moved, and its bytes counted (host<->device). numpy goes through ``jnp.asarray``,
    which copies to the GPU when JAX runs there (counted as host-to-device)."""
    import jax

    platform = jax.default_backend()  # "cpu", "gpu" (CUDA) or "tpu"
    if is_torch_tensor(x):
        t = x.detach()
        if t.is_cuda != (platform == "gpu"):
            if counter is not None:
                (counter.add_d2h if t.is_cuda else counter.add_h2d)(nbytes(t))
            return jax.numpy.asarray(t.cpu().numpy())
        import jax.dlpack

        return jax.dlpack.from_dlpack(t.contiguous())
    if platform != "cpu" and counter is not None:
        counter.add_h2d(nbytes(x))
    return jax.numpy.asarray(x)


def stack_rows(xs: list) -> Any:
    """``np.stack`` of numpy arrays, ``torch.stack`` of tensors (a GPU frame history stays on its device)."""
    if is_torch_tensor(xs[0]):
        import torch

        return torch.stack(xs)
    return np.stack(xs)


def concat_rows(xs: list) -> Any:
    """The rows of several feeds as one batch: ``np.concatenate``, or ``torch.cat`` for tensors (on their
    device); one feed is returned as it is."""
    if len(xs) == 1:
        return xs[0]
    if is_torch_tensor(xs[0]):
        import torch

        return torch.cat(xs)
    return np.concatenate(xs)
