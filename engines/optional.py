"""The one place that knows the optional dependencies and which extra installs each."""

from __future__ import annotations

import importlib
from types import ModuleType

# module -> (pip extra of this project, or how to get it)
OPTIONAL = {
    "onnx": "pip install -e '.[export]'",
    "onnxruntime": "pip install -e '.[export]'",
    "jax2onnx": "pip install -e '.[export]'",
    "jax": "pip install -e '.[jax]'",
    "flax": "pip install -e '.[jax]'",
    # PyPI's tensorrt and tensorrt-cu12 are stubs whose wheels live on NVIDIA's index (fetched from there at
    # install time); the bare tensorrt is the CUDA 13 build, while this project's CUDA calls target CUDA 12
    "tensorrt": "on Jetson it comes with JetPack (apt install python3-libnvinfer); on x86: "
                "pip install --extra-index-url https://pypi.nvidia.com tensorrt-cu12",
    # the CUDA major of the platform's driver: 12 on JetPack 6 (CUDA 12.6); 13.x needs a CUDA 13 driver
    "cuda": "pip install -e '.[trt]' (cuda-python>=12.6,<14: 12.x for a CUDA 12 driver, 13.x for CUDA 13)",
    "cuda.cudart": "pip install -e '.[trt]' (cuda-python>=12.6,<14: 12.x for a CUDA 12 driver, 13.x for CUDA 13)",
    "cuda.bindings": "pip install -e '.[trt]' (cuda-python>=12.6,<14: 12.x for a CUDA 12 driver, 13.x for CUDA 13)",
    "jtop": "pip install -e '.[jetson]'",
    "pynvml": "pip install nvidia-ml-py",
    "ray": "pip install -e '.[ray]'",
    "websockets": "pip install -e '.[remote]'",
    "msgpack": "pip install -e '.[remote]'",
    "vla_eval": "pip install -e '.[remote]'",
    # declares numpy<2 (JAX here needs numpy>=2); the modules used need only websockets and msgpack
    "openpi_client": "pip install --no-deps openpi-client==0.1.2",
}


class MissingDependencyError(ImportError):
    """An optional module is not installed; the message says how to install it."""


def require(module: str, extra: str | None = None) -> ModuleType:
    """Import an optional module or fail with one line naming what to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        how = OPTIONAL.get(module, f"pip install -e '.[{extra}]'" if extra else f"pip install {module}")
        raise MissingDependencyError(f"{module} is not installed; install it with: {how}") from None


def available(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except ImportError:
        return False
