#!/usr/bin/env bash
# The Jetson stand-in (issue #44, item 7), run by .ci/run after `make test`: Octo on the Orin's software stack
# without JAX, checked on this x86 machine.
#
#   1. build/venv-py310-jetson: Python 3.10 (JetPack 6's), installed as Dockerfile.l4t installs: every pip install
#      under the constraint numpy<2, torch first, SAPIEN 3.0.3, the Dockerfile's own pinned package list,
#      mani-skill --no-deps, then the project; no jax, jaxlib, flax or jax2onnx. x86 wheels of the same versions
#      stand in for the Jetson's: torch is PyPI's torch of the project's version (TORCH_SPEC below; PyPI has no
#      CPU-only Linux torch, so its CUDA libraries come along: they load without a GPU, and triton, which nothing
#      here uses, is removed again) where the image has JetPack's CUDA build, and PyPI's x86 sapien 3.0.3 where
#      the image has SAPIEN's aarch64 wheel. Reused while its stamp (interpreter, install list, setup.py) matches.
#   2. with the project's main venv (.venv, with JAX): a random-weights octo-small checkpoint in the released layout
#      (and a tiny t5 tokenizer beside it) in build/standin/checkpoint, and its graphs exported by
#      `engines.build --models octo-small` into build/standin/engines; both reused while built for the same
#      checkpoint and the same engines/ source.
#   3. with the 3.10 venv: `python -m eval.orin --model octo-small --backend ort --engines build/standin/engines`
#      for one dev try of A01 cut at MAX_STEPS control steps (--max-steps: ten queries check the chain end to end;
#      the whole try's 75 queries of random weights would cost a minute more and check nothing more). JAX is not
#      there to import.
#
# `--venv-only` does step 1 alone (it needs no main venv: CI builds this venv beside make setup). Without a Python
# 3.10 (python3.10 on PATH, else pyenv's 3.10.x) it prints why it skipped and exits 0. On failure it exits non-zero
# with one line saying which step failed (the step's own output is above it).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

MAIN_PY="${MAIN_PY:-$REPO/.venv/bin/python}"
VENV="$REPO/build/venv-py310-jetson"
WORK="$REPO/build/standin"
CKPT="$WORK/checkpoint"
ENGINES="$WORK/engines"
RUN_OUT="$WORK/run"
# the project's torch (scripts/setup.sh's TORCH_SPEC); JetPack 6's is a CUDA build of its own (Dockerfile.l4t)
TORCH_SPEC="${STANDIN_TORCH_SPEC:-torch==2.13.0}"
SEED=0
VENV_ONLY=0
case "${1:-}" in
    "") ;;
    --venv-only) VENV_ONLY=1 ;;
    *) echo "jetson stand-in: unknown argument ${1}; usage: bash scripts/jetson_standin.sh [--venv-only]" >&2; exit 2 ;;
esac
MAX_STEPS=40  # ten of Octo's 4-step chunks

say() { echo "jetson stand-in: $*"; }
fail() { echo "jetson stand-in: FAILED: $*" >&2; exit 1; }

# ------------------------------------------------------------------ Python 3.10
source "$REPO/scripts/find_python.sh"
source "$REPO/scripts/pip_compile.sh"
py310="$(find_python 3.10)"
if [[ -z "$py310" ]]; then
    say "skipped: no Python 3.10 here"
    exit 0
fi

# -------------------------------------------------- 1. the Jetson image's venv
# The Dockerfile's pinned list: the words of its `pip install` that installs trimesh==..., up to the first &&
# (read by the 3.10 interpreter itself: this step needs no main venv).
install_list="$("$py310" - "$REPO/Dockerfile.l4t" <<'EOF'
import re, shlex, sys
text = re.sub(r"\\\n", " ", open(sys.argv[1]).read())
for line in text.splitlines():
    if not line.lstrip().startswith("#") and "pip install" in line and "trimesh==" in line:
        words = shlex.split(line.split("pip install", 1)[1].split("&&", 1)[0])
        print(" ".join(w for w in words if not w.startswith("-")))
        break
EOF
)" || fail "could not read Dockerfile.l4t's install list"
[[ "$install_list" == *"trimesh=="* ]] || fail "Dockerfile.l4t has no pip install line with trimesh== (the list this stand-in installs)"
sapien_version="$(sed -n 's/^ARG SAPIEN_VERSION=//p' Dockerfile.l4t | head -n1)"
maniskill_version="$(sed -n 's/^ARG MANISKILL_VERSION=//p' Dockerfile.l4t | head -n1)"
[[ -n "$sapien_version" && -n "$maniskill_version" ]] || fail "Dockerfile.l4t has no SAPIEN_VERSION / MANISKILL_VERSION ARG"

recipe="$(sed -n '/^# venv recipe: begin/,/^# venv recipe: end/p' "$REPO/scripts/jetson_standin.sh" | sha256sum | cut -c1-16)"
stamp_text="recipe=$recipe python=$("$py310" -V 2>&1) torch=$TORCH_SPEC sapien=$sapien_version mani-skill=$maniskill_version list=$install_list setup=$(sha256sum setup.py | cut -c1-16)"
if [[ -x "$VENV/bin/python" && -f "$VENV/.standin-stamp" && "$(cat "$VENV/.standin-stamp")" == "$stamp_text" ]]; then
    say "venv: reusing $VENV"
else
# venv recipe: begin
    t0=$SECONDS
    rm -rf "$VENV"
    mkdir -p "$REPO/build"
    "$py310" -m venv "$VENV" || fail "$py310 -m venv $VENV failed"
    constraints="$VENV/pip-constraints.txt"
    printf 'numpy<2\n' > "$constraints"
    # (a machine whose pip config names local indexes warns of each package they lack: those lines are dropped)
    vpip() {
        PIP_CONSTRAINT="$constraints" "$VENV/bin/python" -m pip install -q --progress-bar off "${PIP_COMPILE[@]}" "$@" \
            2> >(grep -v "^WARNING: Location 'file:" >&2)
    }
    vpip --upgrade pip setuptools wheel || fail "venv: pip upgrade failed"
    # torch first, then pinned in the constraints so that nothing below replaces it (as the image does)
    vpip "$TORCH_SPEC" || fail "venv: pip install $TORCH_SPEC failed"
    "$VENV/bin/python" -c "from importlib.metadata import version; print('torch==' + version('torch'))" \
        >> "$constraints" || fail "venv: torch is not installed"
    vpip "sapien==$sapien_version" || fail "venv: pip install sapien==$sapien_version failed"
    # shellcheck disable=SC2086  # the list is words
    vpip $install_list || fail "venv: pip install of Dockerfile.l4t's list failed"
    vpip --no-deps "mani-skill==$maniskill_version" || fail "venv: pip install --no-deps mani-skill failed"
    # the project as the image installs it, less the extras this check has no use for (trt: no GPU here; dev:
    # pytest and transformers); jetson's jetson-stats and nvidia-ml-py are what the Orin's telemetry imports
    vpip -e ".[jetson]" || fail "venv: pip install -e .[jetson] failed"
    "$VENV/bin/python" - <<'EOF' || fail "venv: not the Jetson image's installation (see above)"
from importlib.metadata import PackageNotFoundError, version

import numpy

assert numpy.__version__ < "2", f"numpy {numpy.__version__}: the image has numpy<2"
for name in ("jax", "jaxlib", "flax", "jax2onnx"):
    try:
        raise AssertionError(f"{name} {version(name)} is installed: the image has no JAX")
    except PackageNotFoundError:
        pass
EOF
    # triton (torch.compile's compiler, 0.7 GB) is not used here, and JetPack's torch comes without it
    "$VENV/bin/python" -m pip uninstall -q -y triton >/dev/null 2>&1 || true
# venv recipe: end
    printf '%s' "$stamp_text" > "$VENV/.standin-stamp"
    say "venv: built $VENV in $((SECONDS - t0)) s ($(du -sh "$VENV" | cut -f1))"
fi
if [[ "$VENV_ONLY" == "1" ]]; then
    exit 0
fi
[[ -x "$MAIN_PY" ]] || fail "no main venv at $MAIN_PY (run make setup first)"

# ------------------------------------- 2. checkpoint and export (main venv, JAX)
ckpt_key="octo-small seed=$SEED writer=$(sed -n '/^# checkpoint writer: begin/,/^# checkpoint writer: end/p' "$REPO/scripts/jetson_standin.sh" | sha256sum | cut -c1-16) src=$(cat engines/octo/config.py engines/octo/params.py engines/octo/checkpoint.py | sha256sum | cut -c1-16)"
if [[ -f "$CKPT/.standin-stamp" && "$(cat "$CKPT/.standin-stamp")" == "$ckpt_key" ]]; then
    say "checkpoint: reusing $CKPT"
else
    rm -rf "$CKPT" "$ENGINES"
    t0=$SECONDS
# checkpoint writer: begin
    "$MAIN_PY" - "$CKPT" "$SEED" <<'EOF' || fail "checkpoint: writing the random-weights octo-small checkpoint failed"
import sys
from pathlib import Path

from engines.octo.checkpoint import save
from engines.octo.config import octo_small_config
from engines.octo.octo_model import synthetic_statistics
from engines.octo.params import init_params
from engines.octo.testing import train_spiece

path, seed = Path(sys.argv[1]), int(sys.argv[2])
cfg = octo_small_config()
save(path, cfg, init_params(cfg, seed=seed), synthetic_statistics(cfg))
train_spiece(path / "t5-base")  # a tiny tokenizer with t5's special ids, where resolve_spiece looks beside a checkpoint
EOF
# checkpoint writer: end
    printf '%s' "$ckpt_key" > "$CKPT/.standin-stamp"
    say "checkpoint: wrote $CKPT in $((SECONDS - t0)) s"
fi

engines_key="$ckpt_key engines=$(find engines -name '*.py' -print0 | sort -z | xargs -0 cat | sha256sum | cut -c1-16)"
if [[ -f "$ENGINES/.standin-stamp" && "$(cat "$ENGINES/.standin-stamp")" == "$engines_key" ]]; then
    say "engines: reusing $ENGINES"
else
    rm -rf "$ENGINES"
    t0=$SECONDS
    "$MAIN_PY" -m engines.build --models octo-small --checkpoint-octo-small "$CKPT" \
        --ort-precisions fp32 --precisions fp32 --out "$ENGINES" \
        || fail "engines: .venv/bin/python -m engines.build --models octo-small --out $ENGINES failed"
    printf '%s' "$engines_key" > "$ENGINES/.standin-stamp"
    say "engines: exported into $ENGINES in $((SECONDS - t0)) s"
fi

# ------------------------------------------------ 3. eval.orin on Python 3.10
say "$("$VENV/bin/python" --version 2>&1) at $VENV/bin/python"
t0=$SECONDS
"$VENV/bin/python" -m eval.orin --model octo-small --backend ort --engines "$ENGINES" --checkpoint "$CKPT" \
    --split dev --setups A01 --tries 1 --max-steps "$MAX_STEPS" --out "$RUN_OUT" --fresh \
    || fail "eval.orin --model octo-small --backend ort --engines $ENGINES on $("$VENV/bin/python" --version 2>&1) failed"
say "passed: eval.orin --model octo-small --backend ort --max-steps $MAX_STEPS on $("$VENV/bin/python" --version 2>&1), no JAX installed, in $((SECONDS - t0)) s"
