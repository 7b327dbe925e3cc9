"""Device check for a lent GPU machine: one prepared run of at most 8 minutes that keeps every finished step.

    bash benchmarks/device_check.sh                 # on the GPU machine (its header has the exact call)
    bash benchmarks/device_check.sh --dry-run       # anywhere, on the CPU: every step's code at small sizes
    python -m benchmarks.device_check --list        # the steps, their timeouts and what each needs

Every step runs in its own process group under its timeout: a step that hangs (SAPIEN's get_picture_cuda is
known to on some H100 hosts, SAPIEN issue 290) is killed with its children and recorded as "timeout", and
the check goes on. The whole run has a budget (``--budget-s``, 450 s): a step gets at most what is left.
After every step one JSON line is appended to OUT/device_check.jsonl and flushed, so a killed run keeps what
finished. OUT receives four files at most: device_check.jsonl, device_check.log (every step's output),
device_check.json (the summary, at the end) and device_check_files.tar.gz (what the steps wrote themselves:
benchmark JSONs, reports; rebuilt after each step).

Steps, in order; the first five need nothing beyond a machine with torch and JAX on CUDA:

  system               the machine: GPU (nvidia-smi), Python, torch/JAX/ONNX Runtime/TensorRT/SAPIEN versions
  jax-octo-small       octo-small-1.5 (random weights) in JAX on the GPU at batch 1, 8, 64: latency with host
                       arrays in and with inputs already on the device, and parity with CPU JAX
  jax-octo-base        the same for octo-base-1.5
  bc-state-torch       the bc-state MLP on torch CUDA at batch 1..256 (CUDA events), parity with CPU torch
  dlpack               a torch CUDA frame batch handed to JAX by DLPack (engines.zero_copy.to_jax): same
                       memory, byte-identical, host<->device bytes counted; the numpy route as a control
  onnx-trt             ONNX export of bc-state and octo-small, ONNX Runtime (CPU) reference, TensorRT FP32/FP16
                       engines, parity and CUDA-event latency (where TensorRT exists)
  trt-int8-qdq         INT8 Q/DQ graphs of bc-state and the octo-small backbone (engines.quantize): ONNX Runtime
                       int8 vs fp32, and a TensorRT INT8 engine from the same Q/DQ graph (where TensorRT exists)
  gpu-physics          benchmarks.gpu_physics_check: the scripted reference on CPU PhysX vs one GPU batch
  octo-camera-batch    benchmarks.octo_rollout --sim gpu --num-envs 1,8,32,64 --backends jax
  bc-state-gpu-scenes  eval.orin, bc-state on 32 GPU-PhysX scenes of A01

Parity: the largest absolute and relative (engines.backends.rel_err) difference of the normalised actions for
identical inputs and noise. Octo's parity is checked at "highest" matmul precision (full fp32) for every batch,
against CPU JAX at "highest": JAX's default on Ampere and newer GPUs is TF32, which is not fp32 and would miss
the tolerance for reasons of its own. The timings stay at the default precision, as a user runs it, and the row
says so (``timed_at``); its difference from the CPU at that precision is recorded beside, for information.
Every batch size is compiled once per precision (inputs put on the device uncommitted, inside
``jax.default_device``), and the step checks it in the jitted function's cache: another compile fails the row.

The external steps (gpu-physics, octo-camera-batch) write each row as it finishes (benchmarks.common.RowLog),
and eval.orin each try (its tries.jsonl): a step killed at its timeout keeps those rows in its record.

``--dry-run`` runs the same steps on the CPU (JAX and torch on the CPU, the tiny test Octo of
engines.octo.testing in place of the real ones at the same batches, small batches elsewhere, TensorRT rows
skipped, CPU scenes) under the same limits: timeouts, budget, incremental JSON and file count.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks.common import ROWS_SUFFIX, JsonLines, json_default, read_json_lines, stats_ms

SCHEMA = "shape-assembly-bench/device_check/2"
ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 450.0  # the device tool runs a command for at most 10 minutes; this check stays under 8
MIN_STEP_S = 10.0  # a step is not started with less time left than this (or its own timeout, if smaller)
KILL_GRACE_S = 3.0  # between SIGTERM and SIGKILL of a timed-out step's process group
OUT_FILES = ("device_check.jsonl", "device_check.log", "device_check.json", "device_check_files.tar.gz")
TAR_SUFFIXES = (".json", ".jsonl", ".md", ".csv", ".txt")
TAR_FILE_MAX = 4 << 20  # bytes; larger files (ONNX, engines, videos) stay in the work folder
TAR_TOTAL_MAX = 15 << 20  # the device tool returns files of at most 16 MiB
# fp32 TensorRT engines are built with TF32 off (engines.trt), so they should match ORT closely; fp16 within a few %
TRT_TOLERANCE = {"fp32": 1e-3, "fp16": 5e-2}
OCTO_TOLERANCE = 1e-3  # relative, GPU JAX vs CPU JAX, both at PARITY_PRECISION
PARITY_PRECISION = "highest"  # full fp32 matmuls: JAX's GPU default (TF32 on Ampere and newer) is not fp32
BC_TOLERANCE = 1e-4  # relative, torch CUDA fp32 vs torch CPU
# relative, TensorRT INT8 vs ONNX Runtime running the same Q/DQ graph (same scales; kernels round differently)
TRT_INT8_TOLERANCE = 5e-2

WHY_MISSING = {
    "tensorrt": "tensorrt is not installed (JetPack ships it; NVIDIA's x86 wheels are over 1 GB, too big to carry "
                "in the device tool's 64 MiB tree)",
    "sapien": "sapien is not installed (its wheel, 51 MB, and mani-skill's, 101 MB, which it is used with, are too "
              "big to carry in the device tool's 64 MiB tree; pip install -e '.[sim]' where a registry is reachable)",
    "mani_skill": "mani_skill is not installed (its wheel, 101 MB, is too big to carry in the device tool's 64 MiB "
                  "tree; pip install -e '.[sim]' where a registry is reachable)",
    "jax2onnx": "jax2onnx is not installed (carry it in .whl/: see the header of benchmarks/device_check.sh)",
}
SIM = ("sapien", "mani_skill", "torch", "trimesh", "shapely", "gymnasium")


@dataclass(frozen=True)
class Step:
    name: str
    timeout_s: float
    what: str
    needs: tuple[str, ...] = ()  # importable modules, else the step is skipped with the reason
    needs_device: tuple[str, ...] = ()  # needed on the device only (not in a dry run)
    internal: bool = True  # run by this module (--step NAME); else an external command (benchmark, eval.orin)

    def missing(self, dry_run: bool) -> list[str]:
        mods = self.needs + (() if dry_run else self.needs_device)
        return [m for m in mods if not _importable(m)]


STEPS: tuple[Step, ...] = (
    Step("system", 40, "the machine: GPU, Python, package versions, what was carried"),
    Step("jax-octo-small", 120, "octo-small in JAX on the GPU, batch 1/8/64, parity with CPU JAX", ("jax", "flax")),
    Step("jax-octo-base", 160, "octo-base in JAX on the GPU, batch 1/8/64, parity with CPU JAX", ("jax", "flax")),
    Step("bc-state-torch", 60, "bc-state on torch CUDA, batch 1..256, CUDA events, parity with CPU torch",
         ("torch", "safetensors")),
    Step("dlpack", 40, "torch CUDA frames to JAX by DLPack: same memory, byte-identical, bytes counted",
         ("torch", "jax")),
    Step("onnx-trt", 150, "ONNX export, ONNX Runtime reference, TensorRT FP32/FP16 engines: parity, latency",
         ("torch", "onnx", "onnxruntime", "jax", "jax2onnx"), ("tensorrt",)),
    Step("trt-int8-qdq", 150, "INT8 Q/DQ graphs of bc-state and the octo-small backbone (engines.quantize): ONNX "
         "Runtime int8 vs fp32, and the TensorRT INT8 engine built from the same Q/DQ graph: parity, latency",
         ("torch", "onnx", "onnxruntime", "jax", "jax2onnx"), ("tensorrt",)),
    Step("gpu-physics", 150, "scripted reference on CPU PhysX vs one GPU-PhysX batch (A01..A04)", SIM, (),
         internal=False),
    Step("octo-camera-batch", 180, "octo-small through JAX on 1, 8, 32, 64 GPU scenes with cameras",
         SIM + ("jax", "flax"), (), internal=False),
    Step("bc-state-gpu-scenes", 90, "eval.orin: bc-state on 32 GPU-PhysX scenes of A01", SIM + ("onnxruntime",), (),
         internal=False),
)
BY_NAME = {s.name: s for s in STEPS}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def gpu_device_reason() -> str | None:
    """Why no step but ``system`` can run on the device path here (no NVIDIA device node), or None."""
    if Path("/dev/nvidia0").exists() or Path("/dev/nvhost-ctrl").exists():
        return None
    return "no NVIDIA GPU device found (/dev/nvidia0, /dev/nvhost-ctrl); --dry-run runs the steps on the CPU"


def missing_reason(missing: list[str]) -> str:
    known = [WHY_MISSING[m] for m in missing if m in WHY_MISSING]
    rest = [m for m in missing if m not in WHY_MISSING]
    return "; ".join(known + ([f"not installed: {', '.join(rest)}"] if rest else []))


def one_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


# ================================================================== the steps' own code (in a child process)
class StepContext:
    """What a step's process gets: the dry-run flag, its work folder and the rows file it appends to."""

    def __init__(self, name: str, dry_run: bool, work: Path, rows: Path):
        self.name, self.dry_run, self.work, self.rows_path = name, dry_run, work, rows
        self.work.mkdir(parents=True, exist_ok=True)
        self._rows = JsonLines(rows)  # each row flushed as it is emitted: a killed step keeps its finished rows

    def emit(self, row: dict) -> None:
        self._rows.write(row)
        print(f"{self.name}: {_brief(row)}", flush=True)

    def skip(self, reason: str) -> int:
        self.emit({"skipped": reason})
        return 0


def _brief(row: dict) -> str:
    keys = ("skipped", "model", "kind", "backend", "batch", "status")
    return ", ".join(f"{k}={row[k]}" for k in keys if k in row) or ", ".join(sorted(row))[:120]


def _stats(ms: list[float]) -> dict:
    return stats_ms(ms)


def _progress(iterable, desc: str):
    from tqdm import tqdm

    # a step's output goes to the log file: bars only where a person watches a terminal
    return tqdm(iterable, desc=desc, leave=False, disable=not sys.stderr.isatty())


def _versions(dists: tuple[str, ...]) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for d in dists:
        try:
            out[d] = version(d)
        except PackageNotFoundError:
            out[d] = None
    return out


def step_system(ctx: StepContext) -> int:
    import platform
    import shutil

    info: dict[str, Any] = {"kind": "system", "python": platform.python_version(), "executable": sys.executable,
                            "machine": platform.machine(), "cores": os.cpu_count(),
                            "pythonpath": os.environ.get("PYTHONPATH"),
                            "carried_wheels": sorted(p.name for p in (ROOT / ".whl").glob("*.whl"))}
    if shutil.which("nvidia-smi"):
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            info["nvidia_smi"] = smi.stdout.strip().splitlines() or smi.stderr.strip().splitlines()[:1]
        except subprocess.TimeoutExpired:
            info["nvidia_smi"] = "timed out after 20 s"
    else:
        info["nvidia_smi"] = None
    info["versions"] = _versions(("numpy", "torch", "jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin",
                                  "flax", "cupy-cuda13x", "onnx", "onnxruntime", "onnxruntime-gpu", "jax2onnx",
                                  "tensorrt", "cuda-python", "cuda-bindings", "sapien", "mani-skill", "trimesh",
                                  "gymnasium"))
    if _importable("torch"):
        import torch

        t: dict[str, Any] = {"cuda_available": torch.cuda.is_available(), "cuda": torch.version.cuda}
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            t.update(gpu=torch.cuda.get_device_name(0), compute_capability=f"{major}.{minor}",
                     memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2 ** 30, 1),
                     tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
        info["torch"] = t
    if _importable("jax"):
        import jax

        info["jax"] = {"default_backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
                       "default_matmul_precision": jax.config.jax_default_matmul_precision}
    if _importable("onnxruntime"):
        import onnxruntime

        info["onnxruntime_providers"] = onnxruntime.get_available_providers()
    from engines import trt

    info["tensorrt_unavailable"] = trt.unavailable_reason()
    info["l4t"] = trt.l4t_version()
    ctx.emit(info)
    return 0


# ------------------------------------------------------------------ Octo in JAX
def step_jax_octo(ctx: StepContext, model: str) -> int:
    import jax

    from engines.octo.octo_model import OctoModel, load_octo

    cpu = jax.devices("cpu")[0]
    if ctx.dry_run:
        accel = cpu
    else:
        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        if not gpus:
            return ctx.skip(f"JAX has no GPU backend here (default backend {jax.default_backend()}; "
                            f"install JAX with its CUDA plugin)")
        accel = gpus[0]
    batches, ref_batch = (1, 8, 64), 8  # the dry run too: the tiny model is cheap at 64
    queries = {1: 30, 8: 20, 64: 10}
    warmup = 2 if ctx.dry_run else 3

    t0 = time.monotonic()
    if ctx.dry_run:  # the tiny test model: same structure, tiny sizes, 5 diffusion steps
        from engines.octo.testing import tiny_octo

        with jax.default_device(accel):
            eng = tiny_octo(seed=1)
        with jax.default_device(cpu):
            ref = tiny_octo(seed=1)
        name = f"octo-tiny (dry run of {model})"
    else:  # seeded random weights: both engines get the same numpy draws
        with jax.default_device(accel):
            eng = load_octo(model, random_weights=True)
        with jax.default_device(cpu):
            ref = OctoModel.load(model, random_weights=True)
        name = model
    leaf_a, leaf_b = (jax.tree_util.tree_leaves(e.params)[0] for e in (eng, ref))
    if not np.array_equal(np.asarray(leaf_a), np.asarray(leaf_b)):
        raise RuntimeError("the GPU and CPU engines were given different weights")
    load_s = time.monotonic() - t0

    cfg = eng.cfg
    rs = np.random.default_rng(0)
    top = max(batches)
    images = [rs.integers(0, 256, (top, cfg.window, *c.image_size, 3), dtype=np.uint8) for c in cfg.cameras]
    masks = np.ones((top, cfg.window, 1 + len(cfg.cameras)), np.float32)
    lang = rs.normal(size=(top, cfg.lang_tokens, cfg.t5.d_model)).astype(np.float32)
    init = rs.normal(size=(top, cfg.flat_action_dim)).astype(np.float32)
    steps = rs.normal(size=(cfg.diffusion_steps, top, cfg.flat_action_dim)).astype(np.float32)

    def inputs(b: int):
        return [i[:b] for i in images], masks[:b], lang[:b], (init[:b], steps[:, :b])

    with jax.default_device(cpu), jax.default_matmul_precision(PARITY_PRECISION):
        imgs, m, lg, noise = inputs(ref_batch)
        t0 = time.monotonic()
        ref_out = ref.predict(imgs, m, lg, noise=noise)
        ref_s = time.monotonic() - t0
    del ref
    ctx.emit({"kind": "reference", "model": name, "device": str(cpu), "batch": ref_batch,
              "matmul_precision": PARITY_PRECISION, "first_call_s": round(ref_s, 2),
              "engines_load_s": round(load_s, 2)})

    timed_at = jax.config.jax_default_matmul_precision or "default"
    for b in _progress(batches, f"{name} batches"):
        n = min(b, ref_batch)
        with jax.default_device(accel):
            imgs, m, lg, noise = inputs(b)
            before = _jit_entries(eng)
            t0 = time.monotonic()
            out = eng.predict(imgs, m, lg, noise=noise)  # compiles this batch size
            first_s = time.monotonic() - t0
            q = 3 if ctx.dry_run else queries[b]
            host_ms = _time_predict(eng, (imgs, m, lg, noise), warmup, q)
            # uncommitted, on the default device (accel): committed arrays would be a second compile of this shape
            on_device = jax.device_put((imgs, m, lg, noise))
            jax.block_until_ready(on_device)
            dev_ms = _time_predict(eng, on_device, warmup, q)
            compiles = {timed_at: _jit_entries(eng) - before}
            with jax.default_matmul_precision(PARITY_PRECISION):  # another executable: one more compile
                before = _jit_entries(eng)
                hi = eng.predict(*on_device[:3], noise=on_device[3])
                compiles[PARITY_PRECISION] = compiles.get(PARITY_PRECISION, 0) + _jit_entries(eng) - before
        parity = {"rows_compared": n, "vs": f"CPU JAX at batch {ref_batch}, same inputs and noise",
                  "matmul_precision": PARITY_PRECISION, **_diff(hi[:n], ref_out[:n]), "tolerance": OCTO_TOLERANCE,
                  f"at_{timed_at}": _diff(out[:n], ref_out[:n])}
        row = {"model": name, "weights": eng.identity, "device": str(accel), "batch": b, "status": "ok",
               "timed_at": f"{timed_at} matmul precision" + (" (TF32 on Ampere and newer GPUs, fp32 on the CPU)"
                                                              if timed_at == "default" else ""),
               "first_call_s": round(first_s, 2),
               "predict_ms": _stats(host_ms), "device_inputs_ms": _stats(dev_ms),
               "h2d_bytes_per_query": int(sum(i.nbytes for i in imgs) + m.nbytes + lg.nbytes + noise[0].nbytes
                                          + noise[1].nbytes),
               "compiles": compiles, "parity": parity}
        if any(c != 1 for c in compiles.values()):
            row.update(status="failed", reason=f"batch {b}: compiles per matmul precision {compiles}, expected 1 "
                                               "each: the jit cache missed for inputs of a seen shape")
        elif parity["rel"] > OCTO_TOLERANCE:
            row["status"] = "parity-failed"
        ctx.emit(row)
    return 0


def _diff(a: np.ndarray, b: np.ndarray) -> dict:
    from engines.backends import rel_err

    return {"max_abs": float(np.max(np.abs(a - b))), "rel": rel_err(a, b)}


def _jit_entries(eng) -> int:
    """Entries in the cache of the engine's jitted query function (with noise given): one per compile."""
    return eng._infer._cache_size()


def _time_predict(eng, args, warmup: int, queries: int) -> list[float]:
    """Milliseconds per ``predict`` (it returns numpy actions, so each call waits for the device)."""
    imgs, m, lg, noise = args
    for _ in range(warmup):
        eng.predict(imgs, m, lg, noise=noise)
    ms = []
    for _ in range(queries):
        t0 = time.monotonic()
        eng.predict(imgs, m, lg, noise=noise)
        ms.append((time.monotonic() - t0) * 1e3)
    return ms


# ------------------------------------------------------------------ bc-state on torch
def step_bc_state(ctx: StepContext) -> int:
    import copy

    import torch

    from engines import bc_mlp
    from engines.backends import rel_err

    if not ctx.dry_run and not torch.cuda.is_available():
        return ctx.skip("CUDA is not available to torch")
    dev = "cpu" if ctx.dry_run else "cuda"
    try:
        model, config, _ = bc_mlp.load(bc_mlp.DEFAULT_WEIGHTS)
        weights = bc_mlp.DEFAULT_WEIGHTS.name
    except bc_mlp.BadCheckpointError:  # no trained weights: the architecture with its init weights
        config = bc_mlp.BCConfig()
        model, weights = bc_mlp.build(config).eval(), "untrained (latency only)"
    on_dev = copy.deepcopy(model).to(dev).eval()
    batches = (1, 2, 4, 8) if ctx.dry_run else tuple(2 ** k for k in range(9))  # 1..256
    warmup, queries = (3, 10) if ctx.dry_run else (20, 100)
    rs = np.random.default_rng(0)
    mean, std = model.obs_mean.numpy(), model.obs_std.numpy()
    state = (mean + std * rs.normal(size=(max(batches), config.state_dim))).astype(np.float32)
    for b in _progress(batches, "bc-state batches"):
        x = torch.from_numpy(state[:b])
        with torch.no_grad():
            ref = model(x).numpy()
            xd = x.to(dev)
            for _ in range(warmup):
                on_dev(xd)
            kernel_ms = []
            for _ in range(queries):
                if dev == "cuda":
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    on_dev(xd)
                    end.record()
                    end.synchronize()
                    kernel_ms.append(start.elapsed_time(end))
                else:
                    t0 = time.monotonic()
                    on_dev(xd)
                    kernel_ms.append((time.monotonic() - t0) * 1e3)
            wall_ms = []  # numpy state in, numpy action out: the copies to and from the device included
            for _ in range(queries):
                t0 = time.monotonic()
                out = on_dev(torch.from_numpy(state[:b]).to(dev)).cpu().numpy()
                wall_ms.append((time.monotonic() - t0) * 1e3)
        rel = rel_err(out, ref)
        ctx.emit({"model": "bc-state", "weights": weights, "device": dev, "batch": b,
                  "status": "ok" if rel <= BC_TOLERANCE else "parity-failed",
                  ("cuda_events_ms" if dev == "cuda" else "compute_ms"): _stats(kernel_ms),
                  "wall_with_copies_ms": _stats(wall_ms),
                  "parity": {"vs": "torch CPU fp32", "max_abs": float(np.max(np.abs(out - ref))), "rel": rel,
                             "tolerance": BC_TOLERANCE},
                  "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32) if dev == "cuda" else None})
    return 0


# ------------------------------------------------------------------ DLPack hand-off torch -> JAX
def step_dlpack(ctx: StepContext) -> int:
    import jax
    import jax.numpy as jnp
    import torch

    from engines.backends import rel_err
    from engines.zero_copy import CopyCounter, nbytes, to_jax

    if not ctx.dry_run:
        if not torch.cuda.is_available():
            return ctx.skip("CUDA is not available to torch")
        if jax.default_backend() != "gpu":
            return ctx.skip(f"JAX runs on {jax.default_backend()}, not the GPU (install JAX with its CUDA plugin)")
    dev = "cpu" if ctx.dry_run else "cuda"
    shape = (2, 32, 32, 3) if ctx.dry_run else (64, 256, 256, 3)  # a batch of third-person camera frames
    reps = 10 if ctx.dry_run else 100
    g = torch.Generator(device=dev).manual_seed(0)
    frames = torch.randint(0, 256, shape, dtype=torch.uint8, device=dev, generator=g)
    frames_sum = int(frames.to(torch.int64).sum())

    counter = CopyCounter()
    arr = to_jax(frames, counter)  # the hand-off the policies use (eval.policies.octo)
    arr.block_until_ready()
    counter.end_step()
    same_memory = arr.unsafe_buffer_pointer() == frames.data_ptr()
    jax_sum = int(jax.jit(lambda a: a.astype(jnp.int32).sum())(arr))  # wraps modulo 2**32, compared so
    # byte identity, checked on the host: these two copies are the check's own, not the hand-off's
    identical = np.asarray(arr).tobytes() == frames.cpu().numpy().tobytes()
    verify_bytes = 2 * nbytes(frames)
    handoff_ms = []
    for _ in range(reps):
        t0 = time.monotonic()
        a = to_jax(frames, counter)
        a.block_until_ready()
        handoff_ms.append((time.monotonic() - t0) * 1e3)
        counter.end_step()
    # the handed-off frames feed a jitted JAX function as they would feed the model
    means_jax = np.asarray(jax.jit(lambda a: a.astype(jnp.float32).mean(axis=(1, 2, 3)))(arr))
    means_torch = frames.float().mean(dim=(1, 2, 3)).cpu().numpy()
    back = torch.from_dlpack(arr)  # and back to torch without a copy
    checksum_equal = (jax_sum - frames_sum) % 2 ** 32 == 0
    zero_copy = same_memory and counter.h2d_bytes == 0 and counter.d2h_bytes == 0
    ok = identical and checksum_equal and (ctx.dry_run or zero_copy)  # on the CPU, JAX may copy an unaligned frame
    ctx.emit({"kind": "torch->jax (DLPack)", "status": "ok" if ok else "failed", "shape": list(shape),
              "dtype": "uint8", "bytes": nbytes(frames), "torch_device": str(frames.device),
              "jax_device": str(next(iter(arr.devices()))), "same_memory": same_memory,
              "byte_identical": identical, "checksum_equal": checksum_equal,
              "copy_counter": counter.report(), "verification_copy_bytes": verify_bytes,
              "handoff_ms": _stats(handoff_ms), "jit_mean_rel_err_vs_torch": rel_err(means_jax, means_torch),
              "jax->torch same_memory": back.data_ptr() == frames.data_ptr()})

    control = CopyCounter()  # the route without DLPack: a host frame into JAX (copied to the GPU, counted)
    host = frames.cpu().numpy()
    ms = []
    for _ in range(reps):
        t0 = time.monotonic()
        to_jax(host, control).block_until_ready()
        ms.append((time.monotonic() - t0) * 1e3)
        control.end_step()
    ctx.emit({"kind": "numpy->jax (control)", "status": "ok", "bytes": int(host.nbytes),
              "copy_counter": control.report(), "ms": _stats(ms)})
    return 0


# ------------------------------------------------------------------ ONNX Runtime and TensorRT
def step_onnx_trt(ctx: StepContext) -> int:
    reason = _trt_reason(ctx)
    if reason and not ctx.dry_run:
        return ctx.skip(reason)
    graphs = _graphs(ctx, ("backbone", "sampler"))
    for name, p, f in _progress(graphs, "graphs"):
        for row in check_graph(name, p, f, ctx, reason):
            ctx.emit(row)
    return 0


def _trt_reason(ctx: StepContext) -> str | None:
    """Why TensorRT rows are skipped: TensorRT's own reason, or "dry run" (its rows skipped on the CPU)."""
    from engines import trt

    reason = trt.unavailable_reason()
    return "dry run" if ctx.dry_run and reason is None else reason


def _graphs(ctx: StepContext, octo_parts: tuple[str, ...]) -> list[tuple[str, Path, dict]]:
    """(name, ONNX path, feeds) of bc-state and of octo-small's ``octo_parts``, exported into the step's folder."""
    path, feeds, source = _bc_state_onnx(ctx.work)
    ctx.emit({"kind": "export", "model": "bc-state", "onnx": str(path), "weights": source})
    return [("bc-state", path, feeds)] + [(f"octo-small {part}", p, f) for part, p, f in _octo_onnx(ctx)
                                          if part in octo_parts]


def _bc_state_onnx(work: Path) -> tuple[Path, dict, str]:
    from engines import bc_mlp

    try:
        model, config, _ = bc_mlp.load(bc_mlp.DEFAULT_WEIGHTS)
        source = bc_mlp.DEFAULT_WEIGHTS.name
    except bc_mlp.BadCheckpointError:
        config = bc_mlp.BCConfig()
        model = bc_mlp.build(config).eval()
        source = "untrained weights (latency only)"
    path = bc_mlp.export_onnx(model, config, work / "bc_state.onnx", source=source)
    feeds = {"state": np.random.default_rng(0).normal(size=(1, config.state_dim)).astype(np.float32)}
    return path, feeds, source


def _octo_onnx(ctx: StepContext) -> list[tuple[str, Path, dict]]:
    """(part, ONNX path, feeds) of the backbone and the sampler; the sampler is fed the backbone's ORT output,
    so both backends see the same readout."""
    from engines.octo.export import backbone_feeds, export_octo, sampler_feeds
    from engines.octo.params import init_params
    from engines.runners import OnnxRuntimeRunner

    if ctx.dry_run:
        from engines.octo.testing import tiny_config

        ocfg, source = tiny_config(), "tiny random (dry run)"
    else:
        from engines.octo.config import octo_small_config

        ocfg, source = octo_small_config(), "random weights (latency only)"
    params = init_params(ocfg, 0, with_t5=False)
    graphs = export_octo(ocfg, params, ctx.work, "octo_small", source=source, random_weights=True,
                         progress=sys.stderr.isatty())
    ctx.emit({"kind": "export", "model": "octo-small", "onnx": [str(graphs.backbone), str(graphs.sampler)],
              "weights": source})
    rs = np.random.default_rng(1)
    images = [rs.integers(0, 256, (1, ocfg.window, *c.image_size, 3), dtype=np.uint8) for c in ocfg.cameras]
    masks = np.ones((1, ocfg.window, 1 + len(ocfg.cameras)), np.float32)
    lang = rs.normal(size=(1, ocfg.lang_tokens, ocfg.t5.d_model)).astype(np.float32)
    noise = (rs.normal(size=(1, ocfg.flat_action_dim)).astype(np.float32),
             rs.normal(size=(ocfg.diffusion_steps, 1, ocfg.flat_action_dim)).astype(np.float32))
    bfeeds = backbone_feeds(ocfg, images, masks, lang)
    with OnnxRuntimeRunner(graphs.backbone, "cpu", intra_op_threads=0) as r:
        readout = r.infer(bfeeds)["readout"]
    return [("backbone", graphs.backbone, bfeeds), ("sampler", graphs.sampler, sampler_feeds(readout, *noise))]


def check_graph(name: str, path: Path, feeds: dict, ctx: StepContext, reason: str | None) -> list[dict]:
    """ONNX Runtime (CPU, fp32) reference and latency; a TensorRT row per precision (skipped with ``reason``)."""
    from engines import trt
    from engines.backends import rel_err
    from engines.runners import OnnxRuntimeRunner, TensorRtRunner

    warmup, queries = (2, 5) if ctx.dry_run else (10, 50)
    with OnnxRuntimeRunner(path, "cpu", intra_op_threads=0) as r:
        ref = r.infer(feeds)
        for _ in range(3):
            r.infer(feeds)
        r.latencies_ms.clear()
        for _ in range(min(queries, 10)):
            r.infer(feeds)
        rows = [{"model": name, "backend": "ort-cpu fp32", "status": "ok", "ms": _stats(r.latencies_ms)}]
    for precision in TRT_TOLERANCE:
        row = {"model": name, "backend": f"tensorrt {precision}"}
        if reason:
            rows.append({**row, "status": "skipped", "reason": reason})
            continue
        try:
            t0 = time.monotonic()
            engine = trt.build_engine(path, ctx.work / "engines", path.stem, precision, 1,
                                      timing_cache=ctx.work / "engines" / "timing.cache")
            build_s = time.monotonic() - t0
            with TensorRtRunner(engine, expected_key=trt.system_key(path, precision, 1)) as runner:
                out = runner.infer(feeds)
                for _ in range(warmup):
                    runner.infer(feeds)
                gpu, wall = [], []
                for _ in range(queries):
                    t0 = time.monotonic()
                    runner.infer(feeds)
                    wall.append((time.monotonic() - t0) * 1e3)
                    gpu.append(runner.last_gpu_ms)
            errs = {k: rel_err(out[k], ref[k]) for k in ref}
            within = max(errs.values()) <= TRT_TOLERANCE[precision]
            rows.append({**row, "status": "ok" if within else "parity-failed", "rel_err_vs_ort": errs,
                         "tolerance": TRT_TOLERANCE[precision], "engine": str(engine), "build_s": round(build_s, 1),
                         "cuda_events_ms": _stats(gpu), "wall_with_copies_ms": _stats(wall)})
        except Exception as e:  # noqa: BLE001 - recorded, the other precisions go on
            rows.append({**row, "status": "failed", "reason": one_line(e)})
    return rows


def _int8_calibration(name: str, path: Path, feeds: dict, ctx: StepContext):
    """The recorded dev-split calibration where it was carried (build/octo_queries; octo: its first 16 queries),
    else 8 synthetic feeds around ``feeds`` (named and hashed as such)."""
    from engines import quantize

    recorded = quantize.BC_CALIB if name == "bc-state" else quantize.OCTO_CALIB
    if recorded.is_file() and not ctx.dry_run:
        if name == "bc-state":
            return quantize.bc_calibration(recorded)
        from engines.octo.config import octo_small_config

        return quantize.octo_calibration(octo_small_config(), recorded, limit=16)
    rs = np.random.default_rng(2)
    rows = []
    for _ in range(8):
        rows.append({k: (rs.integers(0, 256, v.shape, dtype=np.uint8) if v.dtype == np.uint8 else
                         (v + 0.1 * rs.standard_normal(v.shape) * (np.abs(v).max() or 1)).astype(v.dtype))
                     for k, v in feeds.items()})
    digest = quantize.arrays_sha256({f"{i}/{k}": v for i, r in enumerate(rows) for k, v in r.items()})
    return quantize.Calibration(f"synthetic: 8 feeds around the step's own (seed 2), {name}", digest, lambda: rows, 8)


def step_trt_int8_qdq(ctx: StepContext) -> int:
    """INT8 from one Q/DQ graph on both runtimes: ONNX Runtime on the CPU and a TensorRT engine."""
    from engines import quantize, trt
    from engines.backends import rel_err
    from engines.runners import OnnxRuntimeRunner, TensorRtRunner

    reason = _trt_reason(ctx)
    if reason and not ctx.dry_run:
        return ctx.skip(reason)
    graphs = _graphs(ctx, ("backbone",))
    warmup, queries = (2, 5) if ctx.dry_run else (10, 50)
    for name, fp32, f in graphs:
        cal = _int8_calibration(name.split()[0], fp32, f, ctx)
        t0 = time.monotonic()
        q = quantize.quantize_int8(fp32, fp32.with_name(f"{fp32.stem}.int8.onnx"), cal, weights_digest="device-check")
        ctx.emit({"kind": "int8-graph", "model": name, "onnx": str(q), "calibration": cal.name,
                  "calibration_sha256": cal.sha256, "quantize_s": round(time.monotonic() - t0, 1)})
        with OnnxRuntimeRunner(fp32, "cpu", intra_op_threads=0) as r:
            ref = r.infer(f)
        with OnnxRuntimeRunner(q, "cpu", intra_op_threads=0) as r:
            ort8 = r.infer(f)
            for _ in range(min(queries, 10)):
                r.infer(f)
            ctx.emit({"model": name, "backend": "ort-cpu int8 (Q/DQ)", "status": "ok",
                      "rel_err_vs_ort_fp32": {k: rel_err(ort8[k], ref[k]) for k in ref}, "ms": _stats(r.latencies_ms[1:])})
        row = {"model": name, "backend": "tensorrt int8 (Q/DQ)"}
        if reason:
            ctx.emit({**row, "status": "skipped", "reason": reason})
            continue
        try:
            t0 = time.monotonic()
            engine = trt.build_engine(q, ctx.work / "engines", q.stem.replace(".", "_"), "int8", 1,
                                      timing_cache=ctx.work / "engines" / "timing.cache")
            build_s = time.monotonic() - t0
            with TensorRtRunner(engine, expected_key=trt.system_key(q, "int8", 1)) as runner:
                out = runner.infer(f)
                for _ in range(warmup):
                    runner.infer(f)
                gpu = []
                for _ in range(queries):
                    runner.infer(f)
                    gpu.append(runner.last_gpu_ms)
            errs = {k: rel_err(out[k], ort8[k]) for k in ort8}
            within = max(errs.values()) <= TRT_INT8_TOLERANCE
            ctx.emit({**row, "status": "ok" if within else "parity-failed", "rel_err_vs_ort_int8": errs,
                      "rel_err_vs_ort_fp32": {k: rel_err(out[k], ref[k]) for k in ref},
                      "tolerance": TRT_INT8_TOLERANCE, "engine": str(engine), "build_s": round(build_s, 1),
                      "cuda_events_ms": _stats(gpu)})
        except Exception as e:  # noqa: BLE001 - recorded, the next graph goes on
            ctx.emit({**row, "status": "failed", "reason": one_line(e)})
    return 0


INTERNAL: dict[str, Callable[[StepContext], int]] = {
    "system": step_system,
    "jax-octo-small": lambda ctx: step_jax_octo(ctx, "octo-small"),
    "jax-octo-base": lambda ctx: step_jax_octo(ctx, "octo-base"),
    "bc-state-torch": step_bc_state,
    "dlpack": step_dlpack,
    "onnx-trt": step_onnx_trt,
    "trt-int8-qdq": step_trt_int8_qdq,
}


def run_step_process(name: str, dry_run: bool, work: Path, rows: Path) -> int:
    """The body of ``--step NAME`` (a child of the orchestrator)."""
    ctx = StepContext(name, dry_run, work, rows)
    try:
        return INTERNAL[name](ctx)
    except Exception as e:  # noqa: BLE001 - the traceback goes to the log, the last line is the step's reason
        traceback.print_exc()
        print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
        return 1


# ================================================================== the orchestrator
def step_command(step: Step, dry_run: bool, work: Path, rows: Path) -> list[str]:
    py = [sys.executable, "-m"]
    if step.internal:
        return py + ["benchmarks.device_check", "--step", step.name, "--work", str(work), "--rows", str(rows)] + (
            ["--dry-run"] if dry_run else [])
    if step.name == "gpu-physics":
        size = ["--sim", "cpu", "--quick"] if dry_run else ["--sim", "gpu", "--tries", "8", "--num-envs", "8"]
        return py + ["benchmarks.gpu_physics_check", *size, "--out-dir", str(work), "--no-progress"]
    if step.name == "octo-camera-batch":
        size = ["--quick", "--num-envs", "1,2"] if dry_run else ["--sim", "gpu", "--num-envs", "1,8,32,64"]
        return py + ["benchmarks.octo_rollout", *size, "--backends", "jax", "--out-dir", str(work), "--no-progress"]
    if step.name == "bc-state-gpu-scenes":
        size = ["--tries", "2", "--num-envs", "2", "--sim", "cpu"] if dry_run else [
            "--tries", "32", "--num-envs", "32", "--sim", "gpu"]
        return py + ["eval.orin", "--model", "bc-state", "--split", "dev", "--setups", "A01", *size,
                     "--out", str(work / "orin_bc_state"), "--fresh"]
    raise ValueError(f"no command for step {step.name}")


def child_env(dry_run: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               # torch and JAX share the GPU in one process (dlpack): JAX must not take 75% of it up front
               XLA_PYTHON_CLIENT_PREALLOCATE="false")
    if dry_run:  # the CPU, even on a GPU machine
        env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


class Interrupted(Exception):
    pass


class SignalGate:
    """SIGTERM/SIGINT while a step's process is waited on interrupt the wait (the step is killed and recorded as
    "killed"); at any other moment (a record being written, between steps) the signal is held until the loop
    looks, so a finished step is never lost and the step that was next is recorded as killed before it started."""

    def __init__(self) -> None:
        self.pending: str | None = None
        self.waiting = False

    def __call__(self, signum, frame) -> None:  # noqa: ARG002
        name = signal.Signals(signum).name
        if self.waiting:
            self.waiting = False  # a second signal during the kill is held, not raised inside the cleanup
            raise Interrupted(name)
        self.pending = self.pending or name

    @contextlib.contextmanager
    def interruptible(self):
        self.waiting = True
        try:
            if self.pending:
                raise Interrupted(self.pending)
            yield
        finally:
            self.waiting = False


SIGNALS = SignalGate()


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            # the group may outlive its leader: one more SIGKILL for what is left of it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue


def _die_with_parent() -> None:
    """In the child before exec: a new session (its own process group), and SIGKILL if the orchestrator dies."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def external_rows(work: Path) -> list[dict]:
    """The results of an external step: each small JSON it wrote at the top of its folder (a benchmark's result
    file; larger ones travel in the tar file), and what a step killed before its end had finished: a benchmark's
    rows (RowLog, ``*.rows.jsonl``), one entry each, and eval's tries (``tries.jsonl`` without ``summary.json``),
    counted."""
    rows = []
    for p in sorted(work.rglob("*.json")):
        if p.stat().st_size <= 256 << 10 and len(p.relative_to(work).parts) <= 2:
            try:
                doc = json.loads(p.read_text())
            except (json.JSONDecodeError, OSError):
                continue
            rows.append({"file": str(p.relative_to(work)), "results": doc.get("results", doc)})
    for p in sorted(work.rglob(f"*{ROWS_SUFFIX}")):
        if not p.with_name(p.name.removesuffix(ROWS_SUFFIX) + ".json").exists():  # else the JSON has them all
            rows += [{"file": str(p.relative_to(work)), "partial": True, "row": r} for r in read_json_lines(p)]
    for p in sorted(work.rglob("tries.jsonl")):
        if not (p.parent / "summary.json").exists():
            tries = read_json_lines(p)
            rows.append({"file": str(p.relative_to(work)), "partial": True, "tries_finished": len(tries),
                         "successes": sum(bool(t.get("success")) for t in tries)})
    return rows


def tail_reason(log: Path, offset: int) -> str | None:
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    return lines[-1].removeprefix("error: ") if lines else None


def write_tar(out: Path, steps_dir: Path) -> list[str]:
    """The steps' own small files (JSON, reports) as one tar.gz in OUT; written aside, then moved in place."""
    names, total = [], 0
    tmp = out / "device_check_files.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for p in sorted(steps_dir.rglob("*")):
            if not p.is_file() or p.suffix not in TAR_SUFFIXES or p.name == "rows.jsonl":
                continue
            size = p.stat().st_size
            if size > TAR_FILE_MAX or total + size > TAR_TOTAL_MAX:
                continue
            arc = str(Path("steps") / p.relative_to(steps_dir))
            tar.add(p, arcname=arc)
            names.append(arc)
            total += size
    os.replace(tmp, out / "device_check_files.tar.gz")
    return names


def run_check(steps: list[Step], dry_run: bool, out: Path, work: Path, budget_s: float, timeout_scale: float,
              no_progress: bool, argv: list[str]) -> int:
    from benchmarks.common import machine

    t_start = time.monotonic()
    deadline = t_start + budget_s
    out.mkdir(parents=True, exist_ok=True)
    for name in OUT_FILES:
        with contextlib.suppress(FileNotFoundError):
            (out / name).unlink()
    steps_dir = work / "steps"
    if steps_dir.exists():
        import shutil

        shutil.rmtree(steps_dir)
    steps_dir.mkdir(parents=True)
    log_path = out / "device_check.log"
    log_path.touch()
    jl = JsonLines(out / "device_check.jsonl", "w")
    command = shlex.join(["python", "-m", "benchmarks.device_check", *argv])
    header = {"kind": "start", "schema": SCHEMA, "dry_run": dry_run, "command": command,
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "budget_s": budget_s,
              "steps": [s.name for s in steps], "timeouts_s": {s.name: s.timeout_s * timeout_scale for s in steps},
              "machine": machine()}
    jl.write(header)
    print(f"device check{' (dry run, CPU)' if dry_run else ''}: {len(steps)} steps, budget {budget_s:.0f} s; "
          f"writing {out}", flush=True)
    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread: children are started with a pre-exec function
    records: list[dict] = []
    interrupted = None
    bar = tqdm(steps, desc="device check", unit="step", disable=no_progress or not sys.stderr.isatty())
    try:
        for i, step in enumerate(bar, 1):
            bar.set_postfix_str(step.name)
            if SIGNALS.pending:  # arrived between steps: this one never started
                rec = {"step": step.name, "index": i, "timeout_s": round(step.timeout_s * timeout_scale, 3),
                       "wall_s": 0.0, "status": "killed", "interrupted": SIGNALS.pending,
                       "reason": f"the check was interrupted ({SIGNALS.pending}) before this step started"}
            else:
                rec = run_one(step, i, len(steps), dry_run, steps_dir, log_path, deadline, timeout_scale,
                              budget_s)
            if rec.get("interrupted"):
                interrupted = rec.pop("interrupted")
            records.append(rec)
            jl.write({"kind": "step", **rec})
            if any(steps_dir.rglob("*")):
                write_tar(out, steps_dir)
            tqdm.write(f"[{i}/{len(steps)}] {step.name:<20} {rec['status']:<13} {rec['wall_s']:>6.1f} s "
                       f"(timeout {rec['timeout_s']:.0f} s){'  ' + rec['reason'] if rec.get('reason') else ''}")
            if interrupted:
                break
    finally:
        bar.close()
    if interrupted:
        print(f"error: interrupted ({interrupted}); {out / 'device_check.jsonl'} holds the finished steps",
              file=sys.stderr)
        return 143 if interrupted == "SIGTERM" else 130
    bad = [r for r in records if r["status"] not in ("ok", "skipped")]
    files = write_tar(out, steps_dir)
    summary = {"schema": SCHEMA, "dry_run": dry_run, "command": command, "date_utc": header["date_utc"],
               "machine": header["machine"], "budget_s": budget_s, "wall_s": round(time.monotonic() - t_start, 1),
               "ok": not bad, "steps": records, "tarred_files": files}
    jl.write({"kind": "end", "ok": not bad, "wall_s": summary["wall_s"]})
    tmp = out / "device_check.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=json_default) + "\n")
    os.replace(tmp, out / "device_check.json")
    print(table(records))
    print(f"wrote {out} ({len(list(out.iterdir()))} files) in {summary['wall_s']:.0f} s")
    return 1 if bad else 0


def run_one(step: Step, i: int, n: int, dry_run: bool, steps_dir: Path, log_path: Path, deadline: float,
            timeout_scale: float, budget_s: float) -> dict:
    """One step as a child process group under its timeout; its record (status, reason, rows, times)."""
    timeout = step.timeout_s * timeout_scale
    rec: dict[str, Any] = {"step": step.name, "index": i, "timeout_s": round(timeout, 3), "wall_s": 0.0}
    missing = step.missing(dry_run)
    if missing:
        return {**rec, "status": "skipped", "reason": missing_reason(missing)}
    if not dry_run and step.name != "system" and (why := gpu_device_reason()):
        return {**rec, "status": "skipped", "reason": why}
    left = deadline - time.monotonic()
    if left < min(MIN_STEP_S, timeout):
        return {**rec, "status": "skipped", "reason": f"the check's budget of {budget_s:.0f} s is spent "
                                                      f"({max(left, 0):.0f} s left)"}
    if left < timeout:
        timeout = left
        rec["timeout_s"] = round(timeout, 3)
        rec["timeout_clipped_by_budget"] = True
    work = steps_dir / step.name
    work.mkdir(parents=True, exist_ok=True)
    rows_path = work / "rows.jsonl"
    cmd = step_command(step, dry_run, work, rows_path)
    rec["command"] = shlex.join(["python", *cmd[1:]])
    with open(log_path, "a") as log:
        log.write(f"\n=== [{i}/{n}] {step.name}: {rec['command']} (timeout {timeout:.0f} s)\n")
        log.flush()
        offset = log.tell()
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(dry_run), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        status = None
        try:
            with SIGNALS.interruptible():
                rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc, status = proc.returncode, "timeout"
        except Interrupted as e:
            _kill_group(proc)
            rc, status, rec["interrupted"] = proc.returncode, "killed", str(e)
        rec["wall_s"] = round(time.monotonic() - t0, 1)
        rec["rc"] = rc
        log.write(f"=== {step.name}: rc {rc}, {rec['wall_s']} s\n")
    rows = read_json_lines(rows_path) if step.internal else external_rows(work)
    rec["rows"] = [r for r in rows if "skipped" not in r]
    skipped = next((r["skipped"] for r in rows if "skipped" in r), None)
    if status == "timeout":
        rec.update(status="timeout", reason=f"killed after {timeout:.0f} s, its timeout "
                                            f"({len(rec['rows'])} rows finished before)")
    elif status == "killed":
        rec.update(status="killed", reason=f"the check was interrupted ({rec['interrupted']})")
    elif skipped is not None:
        rec.update(status="skipped", reason=skipped)
    elif rc != 0:
        rec.update(status="failed", reason=tail_reason(log_path, offset) or f"exit status {rc}")
    elif any(r.get("status") == "failed" for r in rows):
        rec.update(status="failed", reason="; ".join(f"{r.get('model', r.get('kind'))} {r.get('backend', '')}: "
                                                     f"{r.get('reason', 'failed')}".replace(" :", ":")
                                                     for r in rows if r.get("status") == "failed"))
    elif any(r.get("status") == "parity-failed" for r in rows):
        rec.update(status="parity-failed", reason="outside tolerance: " + ", ".join(
            f"{r.get('model')} batch {r.get('batch', '-')} {r.get('backend', '')}".strip()
            for r in rows if r.get("status") == "parity-failed"))
    else:
        rec["status"] = "ok"
    return rec


def table(records: list[dict]) -> str:
    lines = [f"{'step':<20} {'status':<13} {'wall s':>7} {'timeout s':>9}  reason"]
    for r in records:
        lines.append(f"{r['step']:<20} {r['status']:<13} {r['wall_s']:>7.1f} {r['timeout_s']:>9.0f}  "
                     f"{r.get('reason', '')}")
    return "\n".join(lines)


def list_steps() -> str:
    lines = [f"{'step':<20} {'timeout s':>9}  {'needs':<44} what"]
    for s in STEPS:
        needs = ", ".join(s.needs + tuple(f"{m} (device)" for m in s.needs_device)) or "-"
        lines.append(f"{s.name:<20} {s.timeout_s:>9.0f}  {needs:<44} {s.what}")
    lines.append(f"budget of the whole run: {BUDGET_S:.0f} s (a step gets at most what is left)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m benchmarks.device_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="every step on the CPU at small sizes (tiny Octo, no "
                   "TensorRT, CPU scenes), under the same limits")
    p.add_argument("--out", default=None, help="the folder of the four result files (default $OUT, else "
                   "results/benchmarks/device_check, or runs/benchmarks/device_check_dry_run for --dry-run)")
    p.add_argument("--work", default=None, help="the steps' own files: ONNX, engines, benchmark JSONs (default "
                   "build/device_check, or build/device_check_dry_run)")
    p.add_argument("--steps", default=None, help=f"comma-separated, in the order of: {', '.join(BY_NAME)} "
                   "(default all)")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help=f"wall-clock budget of the run (default "
                   f"{BUDGET_S:.0f}); a step gets at most what is left")
    p.add_argument("--timeout-scale", type=float, default=1.0, help="multiplies every step's timeout (tests)")
    p.add_argument("--list", action="store_true", help="print the steps, their timeouts and needs, and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--step", choices=sorted(INTERNAL), help=argparse.SUPPRESS)  # a child: run one step
    p.add_argument("--rows", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.step:
        if not a.rows or not a.work:
            p.error("--step needs --rows and --work")
        return run_step_process(a.step, a.dry_run, Path(a.work), Path(a.rows))
    if a.list:
        print(list_steps())
        return 0
    names = [x for x in (a.steps or ",".join(BY_NAME)).split(",") if x]
    unknown = [x for x in names if x not in BY_NAME]
    if unknown or not names:
        print(f"error: unknown step {', '.join(unknown) or '(none given)'}; valid: {', '.join(BY_NAME)}",
              file=sys.stderr)
        return 2
    if not a.budget_s > 0 or not a.timeout_scale > 0:
        print("error: --budget-s and --timeout-scale must be positive", file=sys.stderr)
        return 2
    steps = [s for s in STEPS if s.name in names]  # always in the check's order
    suffix = "_dry_run" if a.dry_run else ""
    out = Path(a.out or os.environ.get("OUT") or ROOT / ("runs/benchmarks/device_check_dry_run" if a.dry_run
                                                         else "results/benchmarks/device_check")).resolve()
    work = Path(a.work or ROOT / f"build/device_check{suffix}").resolve()
    for sig in (signal.SIGTERM, signal.SIGINT):  # held until the loop can record them (SignalGate)
        signal.signal(sig, SIGNALS)
    return run_check(steps, a.dry_run, out, work, a.budget_s, a.timeout_scale, a.no_progress, argv)


if __name__ == "__main__":
    sys.exit(main())
