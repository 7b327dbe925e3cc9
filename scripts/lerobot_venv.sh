#!/usr/bin/env bash
# build/venv-py312-lerobot: LeRobot's own dataset reader, in a venv of its own (issue #46). LeRobot cannot be
# installed beside the project's lock (0.4.x pins torch<2.11 and huggingface-hub<0.36; 0.5+ needs Python 3.12), so
# tests/test_record.py runs tests/lerobot_reader.py under this venv's interpreter on a dataset eval.record wrote,
# and skips, with the reason, where the venv is missing.
#
# Installed: lerobot (LEROBOT_SPEC) with what its [dataset] extra needs to read (datasets, pandas, pyarrow) and
# PyAV, the decoder LeRobot uses where torchcodec is missing; not torchcodec, whose PyPI wheel needs the system's
# FFmpeg libraries. PyPI's torch (lerobot asks torch<2.12) is a CUDA build: its libraries load without a GPU.
# Reused while its stamp (interpreter, install list) matches. Without a Python 3.12 it says so and exits 0; on
# failure it exits 1 with one line.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
VENV="$REPO/build/venv-py312-lerobot"
LEROBOT_SPEC="${LEROBOT_SPEC:-lerobot==0.6.1}"
# lerobot 0.6.1's own ranges ([dataset] and av-dep extras, pyproject.toml)
INSTALL=("$LEROBOT_SPEC" "datasets>=4.8.0,<5.0.0" "pandas>=2.0.0,<3.0.0" "pyarrow>=21.0.0,<30.0.0" "av>=15.0.0,<16.0.0")

say() { echo "lerobot venv: $*"; }
fail() { echo "lerobot venv: FAILED: $*" >&2; exit 1; }

source "$REPO/scripts/find_python.sh"
source "$REPO/scripts/pip_compile.sh"
py312="$(find_python 3.12)"
if [[ -z "$py312" ]]; then
    say "skipped: no Python 3.12 here (LeRobot 0.5+ needs it); the LeRobot reader test will skip"
    exit 0
fi

stamp="$("$py312" -VV) ${INSTALL[*]}"
if [[ -x "$VENV/bin/python" && "$(cat "$VENV/.installed" 2>/dev/null)" == "$stamp" ]]; then
    say "reusing $VENV"
    exit 0
fi
rm -rf "$VENV"
t0=$SECONDS
"$py312" -m venv "$VENV" || fail "could not create $VENV with $py312"
"$VENV/bin/python" -m pip install -q "${PIP_COMPILE[@]}" "${INSTALL[@]}" || fail "pip install ${INSTALL[*]} failed"
"$VENV/bin/python" -m pip uninstall -q -y triton torchcodec >/dev/null 2>&1  # nothing here compiles kernels
"$VENV/bin/python" -c "from lerobot.datasets.lerobot_dataset import LeRobotDataset" \
    || fail "lerobot installed in $VENV but its LeRobotDataset does not import"
echo "$stamp" > "$VENV/.installed"
say "built $VENV in $((SECONDS - t0)) s ($(du -sh "$VENV" | cut -f1)): $("$VENV/bin/python" -c 'import lerobot; print("lerobot", lerobot.__version__)')"
