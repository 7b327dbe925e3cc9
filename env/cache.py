"""The project's one cache folder: ``$SAB_CACHE_DIR``, else ``~/.cache/shape_assembly_bench``. It holds what
is built on first use and can be rebuilt at any time: collision meshes (``meshes/``), ONNX exports
(``onnx/``), TensorRT engines (``engines/``) and instruction embeddings."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("SAB_CACHE_DIR") or Path.home() / ".cache" / "shape_assembly_bench")
