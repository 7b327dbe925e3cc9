#!/usr/bin/env bash
# Device check for a GPU machine (see benchmarks/device_check.py): installs TensorRT and cuda-python when
# missing, then builds octo-small and bc-state engines in FP32 and FP16, checks parity against ONNX Runtime,
# times them with CUDA events and writes device_check.json to $OUT (or results/benchmarks/). Then the
# GPU-parallel scenes (eval.rollout): GPU against CPU physics on the scripted reference (A01..A04), and
# bc-state on its TensorRT engine at 1 and 32 scenes (latency, tries/s, bytes copied per step).
#
#   bash benchmarks/device_check.sh              # on the GPU machine
#   bash benchmarks/device_check.sh --dry-run    # anywhere: tiny Octo, TensorRT skipped with the reason
#   NO_INSTALL=1 bash benchmarks/device_check.sh # use what is installed
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"
elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
else PY=python3
fi

dry=0
for a in "$@"; do [[ "$a" == "--dry-run" ]] && dry=1; done

have() { "$PY" -c "import $1" >/dev/null 2>&1; }

if [[ $dry -eq 0 && -z "${NO_INSTALL:-}" ]]; then
    # the project itself (onnx, onnxruntime, jax2onnx, jax), then the GPU pieces; a failed install is reported
    # and the check goes on: its JSON then says why TensorRT was skipped
    have jax2onnx || "$PY" -m pip install -q -e '.[export,jax]' || echo "warning: pip install -e .[export,jax] failed"
    have mani_skill || "$PY" -m pip install -q -e '.[sim]' || echo "warning: pip install -e .[sim] failed"
    have tensorrt || "$PY" -m pip install -q tensorrt || echo "warning: pip install tensorrt failed"
    have cuda || "$PY" -m pip install -q cuda-python || echo "warning: pip install cuda-python failed"
fi

status=0
"$PY" -m benchmarks.device_check "$@" || status=$?
if [[ $dry -eq 0 ]]; then
    out="${OUT:-results/benchmarks}"
    "$PY" -m benchmarks.gpu_physics_check --sim gpu --tries 16 --num-envs 16 --out-dir "$out" || status=$?
    for n in 1 32; do
        "$PY" -m eval.orin --model bc-state --split dev --setups A01,B01,C01,D01 --tries 32 --num-envs $n \
            --out "$out/orin_bc_state_scenes$n" --fresh || status=$?
    done
fi
exit $status
