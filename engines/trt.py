"""TensorRT engines: build from ONNX through the TensorRT Python API, with a strict cache.

An engine is only valid for the ONNX file, TensorRT version, GPU, precision
and optimisation profile it was built for. Each engine file has a JSON sidecar
holding that key; loading an engine whose key differs from the running system
fails with one line saying what differs (or rebuilds when asked). tensorrt and
the CUDA bindings are imported only when a build or a load happens, so this
module imports on a CPU-only machine.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from engines.onnx_utils import BadModelFileError, sha256_file
from engines.optional import available, require

PRECISIONS = ("fp32", "fp16", "int8", "fp8")


@dataclass(frozen=True)
class EngineKey:
    onnx_sha256: str
    tensorrt: str
    gpu: str
    compute_capability: str
    precision: str
    batch_min: int
    batch_opt: int
    batch_max: int
    l4t: str | None = None  # Jetson only

    def file_stem(self, name: str) -> str:
        return f"{name}_{self.precision}_b{self.batch_max}_{self.onnx_sha256[:12]}"

    def differences(self, other: "EngineKey") -> list[str]:
        return [f"{f.name}: engine {getattr(other, f.name)!r}, here {getattr(self, f.name)!r}"
                for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


class EngineMismatchError(RuntimeError):
    """The cached engine was built for another system or input (one line)."""


class TensorRTUnavailable(RuntimeError):
    """No TensorRT or no NVIDIA GPU here; the message is the reason shown when skipping."""


def unavailable_reason() -> str | None:
    """Why TensorRT engines cannot be built here, or None when they can."""
    if not available("tensorrt"):
        return "tensorrt is not installed (JetPack ships it; on x86: pip install tensorrt)"
    if not Path("/dev/nvidia0").exists() and not Path("/dev/nvhost-ctrl").exists():
        return "no NVIDIA GPU device found"
    return None


def l4t_version() -> str | None:
    """L4T release from /etc/nv_tegra_release on Jetson, else None."""
    p = Path("/etc/nv_tegra_release")
    if not p.exists():
        return None
    head = p.read_text().split(",")
    try:
        release = head[0].split("R")[1].split()[0]
        revision = head[1].split(":")[1].strip()
        return f"{release}.{revision}"
    except IndexError:
        return p.read_text().splitlines()[0].strip()


def system_key(onnx_path: str | Path, precision: str, batch_max: int = 1) -> EngineKey:
    """The key an engine for this ONNX file would have on this machine."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    reason = unavailable_reason()
    if reason:
        raise TensorRTUnavailable(reason)
    trt = require("tensorrt")
    import torch  # for the device query; torch is always installed with the sim extra

    if not torch.cuda.is_available():
        raise TensorRTUnavailable("CUDA is not available to torch")
    major, minor = torch.cuda.get_device_capability(0)
    return EngineKey(sha256_file(onnx_path), trt.__version__, torch.cuda.get_device_name(0), f"{major}.{minor}",
                     precision, 1, 1, batch_max, l4t_version())


def write_sidecar(engine_path: Path, key: EngineKey, extra: dict | None = None) -> None:
    engine_path.with_suffix(".json").write_text(json.dumps({"key": asdict(key), **(extra or {})}, indent=1) + "\n")


def read_sidecar(engine_path: Path) -> EngineKey:
    side = engine_path.with_suffix(".json")
    if not engine_path.is_file():
        raise BadModelFileError(f"engine {engine_path} does not exist; build it with: make engines")
    if not side.is_file():
        raise EngineMismatchError(f"engine {engine_path} has no sidecar {side.name}; rebuild it with: make engines")
    try:
        return EngineKey(**json.loads(side.read_text())["key"])
    except (ValueError, KeyError, TypeError) as e:
        raise EngineMismatchError(f"sidecar {side} is unreadable ({e}); rebuild with: make engines") from None


def check_engine(engine_path: Path, expected: EngineKey) -> None:
    """Refuse an engine whose key is not the running system's, naming every difference."""
    found = read_sidecar(engine_path)
    diff = expected.differences(found)
    if diff:
        raise EngineMismatchError(f"engine {engine_path.name} was built for another setup ({'; '.join(diff)}); "
                                  "rebuild it with: make engines")


def build_engine(onnx_path: str | Path, out_dir: str | Path, name: str, precision: str = "fp16",
                 batch_max: int = 1, input_shapes: dict[str, tuple[int, ...]] | None = None,
                 timing_cache: str | Path | None = None, rebuild: bool = False) -> Path:
    """Build (or reuse from the cache) a serialized engine; returns its path."""
    onnx_path = Path(onnx_path)
    key = system_key(onnx_path, precision, batch_max)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    engine_path = out_dir / f"{key.file_stem(name)}.engine"
    if engine_path.exists() and not rebuild:
        check_engine(engine_path, key)
        return engine_path
    trt = require("tensorrt")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes()):
        errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BadModelFileError(f"TensorRT cannot parse {onnx_path}: {errs}")
    config = builder.create_builder_config()
    if precision == "fp32" and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)  # TF32 is on by default (Ampere+); fp32 should mean fp32
    if precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    elif precision == "int8":
        if not builder.platform_has_fast_int8:
            raise TensorRTUnavailable("this GPU has no fast INT8")
        config.set_flag(trt.BuilderFlag.INT8)
    elif precision == "fp8":
        major = int(key.compute_capability.split(".")[0])
        if major < 9 or not hasattr(trt.BuilderFlag, "FP8"):
            raise TensorRTUnavailable(f"FP8 needs compute capability 8.9+ and TensorRT with FP8; here {key.compute_capability}")
        config.set_flag(trt.BuilderFlag.FP8)
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        inp = network.get_input(i)
        shape = list((input_shapes or {}).get(inp.name, inp.shape))
        dims = [max(1, d) for d in shape[1:]]
        profile.set_shape(inp.name, [1, *dims], [1, *dims], [batch_max, *dims])
    config.add_optimization_profile(profile)
    cache = None
    if timing_cache is not None and Path(timing_cache).exists():
        cache = config.create_timing_cache(Path(timing_cache).read_bytes())
    else:
        cache = config.create_timing_cache(b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"TensorRT failed to build {name} ({precision})")
    engine_path.write_bytes(bytes(serialized))
    if timing_cache is not None:
        Path(timing_cache).write_bytes(bytes(config.get_timing_cache().serialize()))
    write_sidecar(engine_path, key, {"onnx": str(onnx_path)})
    return engine_path
