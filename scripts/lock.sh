#!/usr/bin/env bash
# Write requirements/lock.txt from the environment make setup made (run after make test passes):
# every installed distribution pinned, except torch and its CUDA companions, which are never replaced.
#   PY=/path/python scripts/lock.sh   (default: .venv/bin/python)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-$REPO/.venv/bin/python}"
out="$REPO/requirements/lock.txt"
{
    echo "# The dependency set CI tested: make setup installs with these as pip constraints (-c), so a fresh"
    echo "# machine gets exactly these versions. torch is never pinned here (a GPU or Jetson torch is kept)."
    echo "# Made on $(uname -m) Linux, Python $("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])'), with: make lock   (after make test passed). To upgrade, see docs/development.md."
    "$PY" -m pip freeze --exclude-editable | grep -v -E '^(torch|torchvision|torchaudio|triton|nvidia-[a-z0-9-]+)==' \
        | grep -v -E '^(-e |# Editable)'
} > "$out.tmp"
mv "$out.tmp" "$out"
echo "[lock] wrote $out ($(grep -c '==' "$out") pins)"
