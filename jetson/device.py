"""Identify the machine a run is on: a Jetson, another NVIDIA GPU, or the CPU.

Every reader takes a root directory (default "/") and a command runner, so the
same code runs on fake roots in tests: a runner gets an argv list and returns
the command's stdout, or None when the command is missing or fails. Optional
modules (pynvml, tensorrt) are imported inside the functions that need them.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Callable, Sequence

from engines.optional import available, require

CommandRunner = Callable[[Sequence[str]], "str | None"]

# L4T release -> JetPack release (NVIDIA's published pairs; jetson-stats keeps the
# same table). A release not listed gives jetpack=None and only the major line.
L4T_TO_JETPACK: dict[str, str] = {
    # JetPack 7.2 (Orin and Thor; Ubuntu 24.04, CUDA 13): L4T r39.2. NOT from NVIDIA's own pages, which were not
    # found here: the pairs are those of OE4T meta-tegra ("Update to L4T R39.2.0/JetPack 7.2", PR 2281;
    # "JetPack 7.2.1/L4T R39.2.1", PR 2339) and balena's Orin device types (L4T 39.2.0). Check against NVIDIA's
    # JetPack 7.2 release notes when at hand.
    "39.2.0": "7.2", "39.2.1": "7.2.1",
    # JetPack 7.0 and 7.1 (Thor only; r38 does not support the Orin): NVIDIA's JetPack 7.0 / 7.1 download pages
    "38.4.0": "7.1",
    "38.2.0": "7.0", "38.2.1": "7.0", "38.2.2": "7.0",
    # JetPack 6 (Orin)
    "36.4.7": "6.2.1", "36.4.4": "6.2.1", "36.4.3": "6.2", "36.4.2": "6.1.1", "36.4.0": "6.1",
    "36.3.0": "6.0", "36.2.0": "6.0 DP", "36.0.0": "6.0 EA",
    # JetPack 5 (Xavier, Orin)
    "35.6.2": "5.1.5", "35.6.1": "5.1.5", "35.6.0": "5.1.4", "35.5.0": "5.1.3", "35.4.1": "5.1.2",
    "35.3.1": "5.1.1", "35.2.1": "5.1", "35.1.0": "5.0.2", "34.1.1": "5.0.1 DP", "34.1.0": "5.0 DP",
    # JetPack 4 (Nano, TX1/TX2, Xavier)
    "32.7.6": "4.6.6", "32.7.5": "4.6.5", "32.7.4": "4.6.4", "32.7.3": "4.6.3", "32.7.2": "4.6.2",
    "32.7.1": "4.6.1", "32.6.1": "4.6", "32.5.2": "4.5.1", "32.5.1": "4.5.1", "32.5.0": "4.5",
    "32.4.4": "4.4.1", "32.4.3": "4.4", "32.3.1": "4.3",
}
# L4T major -> JetPack major, for releases newer than the table.
L4T_MAJOR_TO_JETPACK_MAJOR = {"32": "4", "34": "5", "35": "5", "36": "6", "38": "7", "39": "7"}

_TEGRA_RELEASE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([0-9.]+)(?:.*?BOARD:\s*([^,\s]+))?")
_NVPMODEL = re.compile(r"NV Power Mode:\s*(\S+)")
_GPU_DEVFREQ_NAMES = ("gpu", "ga10b", "gv11b", "gp10b", "gm20b", "gb10b")


def run_command(argv: Sequence[str], timeout_s: float = 5.0) -> str | None:
    """The default runner: stdout of argv, or None if it is missing, fails or hangs."""
    try:
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def _read(root: Path, rel: str) -> str | None:
    try:
        return (root / rel).read_text(errors="replace")
    except OSError:
        return None


# ----------------------------------------------------------------- dataclasses
@dataclass(frozen=True)
class JetsonInfo:
    model: str | None  # /proc/device-tree/model, e.g. "NVIDIA Jetson AGX Orin Developer Kit"
    l4t: str | None  # "36.4.4"
    jetpack: str | None  # "6.2.1", None when the release is not in the table
    jetpack_major: str | None  # "6", also for releases newer than the table
    board: str | None  # BOARD field of /etc/nv_tegra_release
    soc: str | None  # from /proc/device-tree/compatible, e.g. "tegra234" (Orin)
    power_mode: str | None  # nvpmodel mode name, e.g. "MAXN"
    power_mode_id: int | None
    jetson_clocks: str  # "on" | "off" | "unknown"
    jetson_clocks_how: str  # how jetson_clocks was judged


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    driver: str | None
    cuda_driver: str | None  # highest CUDA version the driver supports, e.g. "12.4"
    compute_capability: str | None  # "8.9"
    memory_total_mb: float | None


@dataclass(frozen=True)
class CpuInfo:
    model: str
    cores: int
    arch: str | None


@dataclass(frozen=True)
class SoftwareVersions:
    python: str
    cuda: str | None  # CUDA toolkit installed (Jetson: the JetPack's)
    tensorrt: str | None
    torch: str | None
    onnxruntime: str | None
    jax: str | None


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "jetson" | "nvidia-gpu" | "cpu"
    name: str  # one line for reports
    cpu: CpuInfo
    jetson: JetsonInfo | None = None
    gpus: tuple[GpuInfo, ...] = ()
    software: SoftwareVersions | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)  # why a field is unknown

    def to_dict(self) -> dict:
        return asdict(self)

    def summary_lines(self) -> list[str]:
        lines = [f"device: {self.name}"]
        j = self.jetson
        if j:
            jp = j.jetpack or (f"{j.jetpack_major}.x" if j.jetpack_major else "unknown")
            lines.append(f"L4T {j.l4t or 'unknown'}, JetPack {jp}, power mode {j.power_mode or 'unknown'}"
                         + (f" ({j.power_mode_id})" if j.power_mode_id is not None else "")
                         + f", jetson_clocks {j.jetson_clocks}")
        for g in self.gpus:
            lines.append(f"GPU {g.index}: {g.name}, driver {g.driver or '?'}, CUDA (driver) {g.cuda_driver or '?'}, "
                         f"compute capability {g.compute_capability or '?'}")
        cpu = f"{self.cpu.model}, {self.cpu.cores} cores" + (f" ({self.cpu.arch})" if self.cpu.arch else "")
        if self.kind == "cpu":  # the device is the CPU: named once
            lines[0] = f"device: CPU: {cpu}"
        else:
            lines.append(f"CPU: {cpu}")
        s = self.software
        if s:
            lines.append(f"software: Python {s.python}, CUDA {s.cuda or 'none'}, TensorRT {s.tensorrt or 'none'}, "
                         f"torch {s.torch or 'none'}, onnxruntime {s.onnxruntime or 'none'}")
        lines += [f"note: {n}" for n in self.notes]
        return lines


# -------------------------------------------------------------------- Jetson
def parse_nv_tegra_release(text: str) -> tuple[str, str | None] | None:
    """(L4T release "36.4.4", BOARD) from /etc/nv_tegra_release text, or None."""
    m = _TEGRA_RELEASE.search(text)
    if not m:
        return None
    rev = m.group(2).strip(".")
    if rev.count(".") == 0:  # "REVISION: 1" -> 32.1.0
        rev += ".0"
    return f"{m.group(1)}.{rev}", m.group(3)


def jetpack_for_l4t(l4t: str | None) -> tuple[str | None, str | None]:
    """(JetPack release or None, JetPack major or None) for an L4T release."""
    if not l4t:
        return None, None
    exact = L4T_TO_JETPACK.get(l4t)
    major = L4T_MAJOR_TO_JETPACK_MAJOR.get(l4t.split(".")[0])
    return exact, (exact.split(".")[0] if exact else major)


def parse_nvpmodel_query(text: str) -> tuple[str | None, int | None]:
    """(mode name, mode id) from `nvpmodel -q` output ("NV Power Mode: MAXN" then "0")."""
    name = mode_id = None
    lines = [ln.strip() for ln in text.splitlines()]
    for i, ln in enumerate(lines):
        m = _NVPMODEL.search(ln)
        if m:
            name = m.group(1)
            for nxt in lines[i + 1:]:
                if nxt.isdigit():
                    mode_id = int(nxt)
                    break
            break
    return name, mode_id


def nvpmodel_from_files(root: Path) -> tuple[str | None, int | None]:
    """Mode from /var/lib/nvpmodel/status ("pmode:0002 ...") named through /etc/nvpmodel.conf.

    For containers and other places where `nvpmodel -q` cannot run but the files are mounted.
    """
    status = _read(root, "var/lib/nvpmodel/status") or ""
    m = re.search(r"pmode:(\d+)", status)
    if not m:
        return None, None
    mode_id = int(m.group(1))
    conf = _read(root, "etc/nvpmodel.conf") or ""
    names = {int(i): n for i, n in re.findall(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+?)\s*>", conf)}
    return names.get(mode_id), mode_id


def parse_jetson_clocks_show(text: str) -> str:
    """"on" when every online CPU and the GPU run at MinFreq == MaxFreq (what jetson_clocks sets)."""
    pinned = []
    for ln in text.splitlines():
        ln = ln.strip()
        if not (re.match(r"cpu\d+:", ln) or ln.startswith("GPU ")):
            continue
        if "Online=0" in ln:
            continue
        mn, mx = re.search(r"MinFreq=(\d+)", ln), re.search(r"MaxFreq=(\d+)", ln)
        if mn and mx:
            pinned.append(mn.group(1) == mx.group(1))
    if not pinned:
        return "unknown"
    return "on" if all(pinned) else "off"


def _sysfs_clocks_pinned(root: Path) -> str:
    """jetson_clocks pins min == max for CPUs and the GPU; judge it from sysfs (no root needed)."""
    pinned = []
    for cpu in sorted(glob.glob(str(root / "sys/devices/system/cpu/cpu[0-9]*"))):
        online = _read(Path(cpu), "online")
        if online is not None and online.strip() == "0":
            continue
        mn, mx = _read(Path(cpu), "cpufreq/scaling_min_freq"), _read(Path(cpu), "cpufreq/scaling_max_freq")
        if mn and mx:
            pinned.append(mn.strip() == mx.strip())
    for dev in glob.glob(str(root / "sys/class/devfreq/*")):
        if not any(k in Path(dev).name for k in _GPU_DEVFREQ_NAMES):
            continue
        mn, mx = _read(Path(dev), "min_freq"), _read(Path(dev), "max_freq")
        if mn and mx:
            pinned.append(mn.strip() == mx.strip())
    if not pinned:
        return "unknown"
    return "on" if all(pinned) else "off"


def jetson_clocks_state(root: str | Path = "/", runner: CommandRunner = run_command) -> tuple[str, str]:
    """("on"|"off"|"unknown", how it was judged)."""
    out = runner(["jetson_clocks", "--show"])  # needs root; None otherwise
    if out:
        state = parse_jetson_clocks_show(out)
        if state != "unknown":
            return state, "jetson_clocks --show"
    state = _sysfs_clocks_pinned(Path(root))
    return state, ("sysfs min==max frequencies" if state != "unknown" else "no jetson_clocks output or cpufreq data")


def _device_tree(root: Path, name: str) -> str | None:
    text = _read(root, f"proc/device-tree/{name}")
    return text.replace("\x00", "\n").strip() if text else None


def detect_jetson(root: str | Path = "/", runner: CommandRunner = run_command) -> JetsonInfo | None:
    """JetsonInfo when the root looks like a Jetson (nv_tegra_release or a Jetson/Tegra device tree), else None."""
    root = Path(root)
    release_text = _read(root, "etc/nv_tegra_release")
    model = _device_tree(root, "model")
    compatible = _device_tree(root, "compatible") or ""
    socs = [c.split(",", 1)[1] for c in compatible.split() if c.startswith("nvidia,tegra")]
    looks_jetson = release_text is not None or (model and "jetson" in model.lower()) or bool(socs)
    if not looks_jetson:
        return None
    parsed = parse_nv_tegra_release(release_text) if release_text else None
    l4t, board = parsed if parsed else (None, None)
    jetpack, jp_major = jetpack_for_l4t(l4t)
    q = runner(["nvpmodel", "-q"])
    mode, mode_id = parse_nvpmodel_query(q) if q else (None, None)
    if mode is None and mode_id is None:
        mode, mode_id = nvpmodel_from_files(root)
    clocks, how = jetson_clocks_state(root, runner)
    return JetsonInfo(model, l4t, jetpack, jp_major, board, socs[0] if socs else None, mode, mode_id, clocks, how)


# ---------------------------------------------------------------------- NVML
def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def query_nvml(nvml: ModuleType | None = None) -> tuple[list[GpuInfo], str | None]:
    """NVIDIA GPUs through NVML: (gpus, None) or ([], reason)."""
    if nvml is None:
        if not available("pynvml"):
            return [], "pynvml is not installed (pip install nvidia-ml-py)"
        nvml = require("pynvml")
    try:
        nvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return [], f"NVML unavailable: {e}"
    try:
        driver = _opt(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        cuda_int = _opt(nvml.nvmlSystemGetCudaDriverVersion)
        cuda = f"{cuda_int // 1000}.{(cuda_int % 1000) // 10}" if isinstance(cuda_int, int) else None
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            cc = _opt(lambda: nvml.nvmlDeviceGetCudaComputeCapability(h))
            mem = _opt(lambda: nvml.nvmlDeviceGetMemoryInfo(h).total / 2**20)
            gpus.append(GpuInfo(i, _text(nvml.nvmlDeviceGetName(h)), driver, cuda,
                                f"{cc[0]}.{cc[1]}" if cc else None, mem))
        return gpus, (None if gpus else "NVML found no GPU")
    except Exception as e:
        return [], f"NVML query failed: {e}"
    finally:
        _opt(nvml.nvmlShutdown)


def _opt(fn):
    """fn() or None: NVML calls a given GPU or driver does not support raise NVMLError."""
    try:
        return fn()
    except Exception:
        return None


# ----------------------------------------------------------------------- CPU
def cpu_info(root: str | Path = "/") -> CpuInfo:
    text = _read(Path(root), "proc/cpuinfo") or ""
    model = None
    for key in ("model name", "Model", "Hardware", "cpu model"):
        m = re.search(rf"^{key}\s*:\s*(.+)$", text, re.MULTILINE)
        if m:
            model = m.group(1).strip()
            break
    if model is None:
        part = re.search(r"^CPU part\s*:\s*(\S+)", text, re.MULTILINE)
        model = f"ARM CPU part {part.group(1)}" if part else "unknown CPU"
    cores = len(re.findall(r"^processor\s*:", text, re.MULTILINE))
    real_root = Path(root).resolve() == Path("/")
    if not cores and real_root:
        cores = os.cpu_count() or 0
    return CpuInfo(model, cores, platform.machine() if real_root else None)


# ------------------------------------------------------------------ software
def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cuda_toolkit_version(root: str | Path = "/") -> str | None:
    root = Path(root)
    text = _read(root, "usr/local/cuda/version.json")
    if text:
        try:
            return json.loads(text)["cuda"]["version"]
        except (ValueError, KeyError, TypeError):
            pass
    text = _read(root, "usr/local/cuda/version.txt")  # CUDA <= 10.2: "CUDA Version 10.2.89"
    m = re.search(r"CUDA Version\s+([0-9.]+)", text or "")
    return m.group(1) if m else None


def tensorrt_version(root: str | Path = "/", host_packages: bool = True) -> str | None:
    """TensorRT: pip metadata, then the header JetPack installs, then (lazily) the module itself.

    host_packages=False (a fake root) reads only the root's header: this
    interpreter's packages say nothing about another root.
    """
    if host_packages:
        for dist in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt_libs"):
            v = _dist_version(dist)
            if v:
                return v
    headers = glob.glob(str(Path(root) / "usr/include/*/NvInferVersion.h")) + \
        glob.glob(str(Path(root) / "usr/include/NvInferVersion.h"))
    for header in headers:
        try:
            text = Path(header).read_text(errors="replace")
        except OSError:
            continue
        parts = dict(re.findall(r"#define\s+NV_TENSORRT_(MAJOR|MINOR|PATCH)\s+(\d+)", text))
        if {"MAJOR", "MINOR", "PATCH"} <= parts.keys():
            return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"
    if host_packages and available("tensorrt"):  # JetPack's apt bindings may lack pip metadata
        return getattr(require("tensorrt"), "__version__", None)
    return None


def software_versions(root: str | Path = "/") -> SoftwareVersions:
    """Versions of the CUDA toolkit and TensorRT under root, and of this interpreter's packages.

    For a root other than "/" the Python packages are left unknown (None).
    """
    host = Path(root).resolve() == Path("/")
    return SoftwareVersions(
        python=platform.python_version(),
        cuda=cuda_toolkit_version(root),
        tensorrt=tensorrt_version(root, host_packages=host),
        torch=_dist_version("torch") if host else None,
        onnxruntime=(_dist_version("onnxruntime") or _dist_version("onnxruntime-gpu")) if host else None,
        jax=_dist_version("jax") if host else None,
    )


# -------------------------------------------------------------------- device
def identify_device(root: str | Path = "/", runner: CommandRunner = run_command,
                    nvml: ModuleType | None = None, use_nvml: bool = True,
                    probe_software: bool = True) -> DeviceInfo:
    """What this run is on: a Jetson first, then NVIDIA GPUs through NVML, else the CPU."""
    notes: list[str] = []
    cpu = cpu_info(root)
    software = software_versions(root) if probe_software else None
    jetson = detect_jetson(root, runner)
    gpus: list[GpuInfo] = []
    if use_nvml:
        gpus, reason = query_nvml(nvml)
        if reason and not jetson:  # NVML is absent on Jetson before Thor; not worth a note there
            notes.append(reason)
    if jetson:
        name = jetson.model or f"NVIDIA Jetson ({jetson.soc or 'unknown module'})"
        if jetson.l4t is None:
            notes.append("no /etc/nv_tegra_release: L4T and JetPack unknown")
        if jetson.power_mode is None:
            notes.append("nvpmodel -q gave no power mode")
        return DeviceInfo("jetson", name, cpu, jetson, tuple(gpus), software, tuple(notes))
    if gpus:
        name = gpus[0].name + (f" (+{len(gpus) - 1} more)" if len(gpus) > 1 else "")
        return DeviceInfo("nvidia-gpu", name, cpu, None, tuple(gpus), software, tuple(notes))
    return DeviceInfo("cpu", f"CPU: {cpu.model}", cpu, None, (), software, tuple(notes))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m jetson.device`: print what this machine is."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m jetson.device", description="What this machine is: Jetson "
                                 "model, L4T / JetPack, power mode and clocks, GPUs, CPU, CUDA / TensorRT versions.")
    ap.add_argument("--json", action="store_true", help="also print everything as JSON")
    args = ap.parse_args(argv)
    info = identify_device()
    print("\n".join(info.summary_lines()))
    if args.json:
        print(json.dumps(info.to_dict(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
