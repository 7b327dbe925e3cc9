"""Where the engines keep what they build on first use (folders under :func:`env.cache.cache_root`); every
entry is written and trusted the one way :mod:`env.cache` defines (written whole, sealed by its sha256,
rebuilt in one said line when damaged). A run reads none of them for TensorRT engines, which only ``make engines``
builds (into the engines folder: :mod:`engines.folder`).

- :func:`onnx_dir`: ONNX exports made on first use (keyed by the weights' digest in the file name);
- :func:`ort_optimized_dir`: the rewritten graphs ONNX Runtime loads (:mod:`engines.octo.optimize`);
- :func:`embeddings_dir`: instruction embeddings (:class:`engines.octo.text.InstructionCache`).
"""

from __future__ import annotations

from pathlib import Path

from env.cache import cache_root, damaged, reuse, seal_path, sha256_file, write_sealed  # noqa: F401


def onnx_dir() -> Path:
    return cache_root() / "onnx"


def ort_optimized_dir() -> Path:
    return onnx_dir() / "ort-optimized"


def embeddings_dir() -> Path:
    return cache_root() / "embeddings"
