#!/usr/bin/env bash
# The device check: one prepared run for a lent GPU machine, at most 8 minutes, that keeps every finished step.
# The steps, their timeouts and what each needs: benchmarks/device_check.py (python -m benchmarks.device_check --list).
#
# On this workplace's device machine (nvidia-h200: x86-64, Python 3.12 with torch 2.11+cu130, JAX 0.11.2 with its
# CUDA 13 plugin, CuPy, onnx, CPU onnxruntime; no TensorRT; no package registry), the device tool's run with
# timeout_s 540 and the command:
#
#   bash benchmarks/device_check.sh
#
# Nothing is installed at run time. The first five steps (system, jax-octo-small, jax-octo-base, bc-state-torch,
# dlpack) need nothing beyond that machine's image. Anything else travels as wheels in .whl/ (ignored by git; the
# tree and the wheels together are at most 64 MiB a call). Make it here, in the repo root, e.g. for the ONNX export
# of the onnx-trt step (only useful on a machine that also has TensorRT):
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl jax2onnx==0.17.1 dm-pix==0.4.5
#
# and when .whl/ exists, carry it (carry: [".whl"]) and begin the command with the device README's install line:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; bash benchmarks/device_check.sh
#
# What cannot travel: tensorrt (NVIDIA's wheels are over 1 GB), mani-skill 3.0.1 (101 MB) and with it sapien
# 3.0.3 (51 MB). Their steps (onnx-trt, trt-int8-qdq, gpu-physics, octo-camera-batch, bc-state-gpu-scenes) are skipped
# there, each with its reason in the JSON. trt-int8-qdq builds the INT8 Q/DQ graphs (engines.quantize) and, with
# TensorRT, an INT8 engine from the same Q/DQ graph; carry build/octo_queries (the recorded dev calibration sets,
# python -m benchmarks.record_queries) to calibrate on them, else it calibrates on named synthetic feeds.
#
#   bash benchmarks/device_check.sh --dry-run                       # anywhere, on the CPU: every step's code
#   bash benchmarks/device_check.sh --steps jax-octo-small,dlpack   # a subset, in the check's order
#
# Outputs: $OUT (else results/benchmarks/device_check/; --dry-run: runs/benchmarks/device_check_dry_run/), four
# files at most: device_check.jsonl (one line per step, appended and flushed as each ends), device_check.log (the
# steps' output), device_check.json (the summary, at the end) and device_check_files.tar.gz (the steps' own JSON
# and reports). Time limits: every step's own timeout, the check's budget (450 s, --budget-s), and this script's
# `timeout` around the whole run (DEVICE_CHECK_WALL_S, default 475 s).
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"
elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
else PY=python3
fi

dry=0
for a in "$@"; do [[ "$a" == "--dry-run" ]] && dry=1; done

# wheels carried but not installed would make their steps skip for a reason that is not the real one
if [[ $dry -eq 0 ]] && compgen -G ".whl/*.whl" >/dev/null && [[ ":${PYTHONPATH:-}:" != *":/tmp/site:"* ]]; then
    echo "error: .whl/ holds wheels but PYTHONPATH has no /tmp/site: begin the command with the install line in the header of $0" >&2
    exit 2
fi

exec timeout -k 10 "${DEVICE_CHECK_WALL_S:-475}" "$PY" -m benchmarks.device_check "$@"
