#!/usr/bin/env bash
# Idempotent setup for shape-assembly-bench, called by `make setup`.
#
#   PYTHON unset/empty  -> create (if missing) and use <repo>/.venv
#   PYTHON=/path/python -> install into that interpreter (e.g. in a container)
#
# Steps (each prints one line saying what it did or skipped):
#   1. CPU Vulkan (Mesa lavapipe >= 24.3) via apt, when root
#   2. torch, only when `import torch` fails (never replaces an existing torch)
#   3. pip install -e ".[sim,export,jax,ray,dev,remote,dataset]" (and openpi-client without its numpy<2 pin) with requirements/lock.txt as constraints (the versions
#      CI tested), skipped when already done; UNLOCKED=1 installs without the lock (upgrading, or a
#      platform the lock was not made on)
#      On aarch64 (a Jetson) the lock (x86, Python 3.11) is never applied. JetPack 6 (L4T R36, Python 3.10, and
#      any aarch64 machine that is not JetPack 7): Dockerfile.l4t's extras (jetson,trt,dev: no sim, whose mplib
#      has no aarch64 build; no export or jax, which need numpy >= 2) under the constraints numpy<2 (JetPack's
#      torch), cuda-python<13 (CUDA 12.6) and the installed torch. JetPack 7 (L4T R38 and later, Python >= 3.12,
#      CUDA 13): the whole chain, jetson,trt,dev,export,jax (JAX's aarch64 CPU wheels; see Dockerfile.l4t), with
#      the installed torch held. One line says which.
# Set SKIP_APT=1 to skip step 1.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO/scripts/pip_compile.sh"
cd "$REPO"

MESA_MIN="${MESA_MIN:-24.3}"   # overridable only to exercise the apt path
NV_TEGRA_RELEASE="${NV_TEGRA_RELEASE:-/etc/nv_tegra_release}"   # overridable only to exercise the Jetson path
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
EXTRAS="sim,export,jax,ray,dev,remote,dataset"
PACKAGES=(env eval engines jetson benchmarks)

say() { echo "[setup] $*"; }
die() { echo "[setup] ERROR: $*" >&2; exit 1; }

# ---------------------------------------------------------------- interpreter
if [[ -z "${PYTHON:-}" ]]; then
    PY="$REPO/.venv/bin/python"
    STAMP="$REPO/.venv/.installed"
    if [[ -x "$PY" ]]; then
        say "venv: using existing $REPO/.venv"
    else
        BASE_PY="$(command -v python3 || true)"
        [[ -n "$BASE_PY" ]] || die "python3 not found on PATH (need Python >= 3.10)"
        /usr/bin/env python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
            || die "python3 at $BASE_PY is older than 3.10"
        /usr/bin/env python3 -m venv "$REPO/.venv" \
            || die "python3 -m venv failed (on Debian/Ubuntu: apt-get install python3-venv)"
        "$PY" -m pip install -q "${PIP_COMPILE[@]}" --upgrade pip
        say "venv: created $REPO/.venv with $BASE_PY ($("$PY" -V 2>&1))"
    fi
else
    PY="$PYTHON"
    command -v "$PY" >/dev/null 2>&1 || die "PYTHON=$PY is not an executable"
    "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "PYTHON=$PY is older than Python 3.10"
    key="$("$PY" -c 'import sys; print(sys.executable)' | md5sum | cut -c1-12)"
    mkdir -p "$REPO/build"
    STAMP="$REPO/build/.installed-$key"
    say "interpreter: using PYTHON=$PY ($("$PY" -V 2>&1)), no venv"
fi

# ------------------------------------------------------- 1. Vulkan (lavapipe)
# apt-get waits up to 10 minutes for the dpkg lock another apt holds (a second `make setup`, unattended-upgrades)
# instead of failing with Error 100; every apt-get call goes through apt_get
APT_LOCK_TIMEOUT="${APT_LOCK_TIMEOUT:-600}"
apt_get() { apt-get -o DPkg::Lock::Timeout="$APT_LOCK_TIMEOUT" "$@"; }
# DPkg::Lock::Timeout does not cover apt-get update's lists lock, so setups on one machine take turns here
APT_TURN_LOCK="${APT_TURN_LOCK:-/var/lock/shape-assembly-bench-setup-apt.lock}"

mesa_ok() {  # the installed lavapipe is new enough (prints its version)
    local icd ver
    icd="$(ls /usr/share/vulkan/icd.d/lvp_icd*.json 2>/dev/null | head -n1 || true)"
    ver="$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)"
    echo "$ver"
    [[ -n "$icd" && -n "$ver" ]] && dpkg --compare-versions "$ver" ge "$MESA_MIN"
}

mesa_step() {
    if [[ "${SKIP_APT:-0}" == "1" ]]; then
        say "vulkan: skipped (SKIP_APT=1)"; return
    fi
    if [[ "$(uname -s)" != "Linux" ]] || ! command -v apt-get >/dev/null 2>&1 \
        || ! command -v dpkg-query >/dev/null 2>&1; then
        say "vulkan: skipped (not a Debian/Ubuntu system; CPU rendering needs Mesa lavapipe >= $MESA_MIN)"
        return
    fi
    local ver
    if ver="$(mesa_ok)"; then
        say "vulkan: skipped (mesa-vulkan-drivers $ver, lavapipe ICD present)"
        return
    fi
    local codename=""
    if [[ -r /etc/os-release ]]; then
        codename="$(. /etc/os-release; echo "${VERSION_CODENAME:-}")"
    fi
    local cmd
    if [[ "$codename" == "bookworm" ]]; then
        cmd="echo 'deb http://deb.debian.org/debian bookworm-backports main' > /etc/apt/sources.list.d/bookworm-backports.list && apt-get -o DPkg::Lock::Timeout=600 update && apt-get -o DPkg::Lock::Timeout=600 install -y -t bookworm-backports mesa-vulkan-drivers libvulkan1"
    else
        cmd="apt-get -o DPkg::Lock::Timeout=600 update && apt-get -o DPkg::Lock::Timeout=600 install -y mesa-vulkan-drivers libvulkan1"
    fi
    if [[ "$(id -u)" != "0" ]]; then
        say "vulkan: skipped, not root (mesa-vulkan-drivers '${ver:-missing}' < $MESA_MIN); run as root: $cmd"
        return
    fi
    export DEBIAN_FRONTEND=noninteractive
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$APT_TURN_LOCK"
        if ! flock -n 9; then
            say "vulkan: waiting for another setup's apt step ($APT_TURN_LOCK)"
            flock -w "$APT_LOCK_TIMEOUT" 9 || die "another setup held $APT_TURN_LOCK for ${APT_LOCK_TIMEOUT} s; rerun make setup once it is done"
        fi
        if ver="$(mesa_ok)"; then  # the other setup installed it meanwhile
            say "vulkan: skipped (mesa-vulkan-drivers $ver, installed by another setup meanwhile)"
            exec 9>&-
            return
        fi
    fi
    if [[ "$codename" == "bookworm" ]]; then
        if ! grep -rqsE '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
            echo 'deb http://deb.debian.org/debian bookworm-backports main' \
                > /etc/apt/sources.list.d/bookworm-backports.list
        fi
        apt_get update -qq >/dev/null
        apt_get install -y -qq -t bookworm-backports mesa-vulkan-drivers libvulkan1 >/dev/null
    else
        # Older releases whose newest Mesa is still too old: don't re-run apt every time.
        local cand
        cand="$(apt-cache policy mesa-vulkan-drivers 2>/dev/null | awk '/Candidate:/ {print $2}')"
        if [[ -n "$ver" && -n "$cand" && "$cand" != "(none)" ]] \
            && dpkg --compare-versions "$cand" le "$ver"; then
            say "vulkan: WARNING mesa-vulkan-drivers $ver is the newest available but < $MESA_MIN; CPU rendering may fail (use a GPU or a newer distro)"
            exec 9>&-
            return
        fi
        apt_get update -qq >/dev/null
        apt_get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
    fi
    exec 9>&-  # the next setup's turn
    ver="$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)"
    if [[ -n "$ver" ]] && dpkg --compare-versions "$ver" ge "$MESA_MIN"; then
        say "vulkan: installed mesa-vulkan-drivers $ver and libvulkan1 (${codename:-unknown release})"
    else
        say "vulkan: WARNING installed mesa-vulkan-drivers '${ver:-none}' < $MESA_MIN; CPU rendering may fail"
    fi
}
mesa_step

# ------------------------------------------------------------------ 2. torch
if "$PY" -c 'import torch' >/dev/null 2>&1; then
    say "torch: skipped (found torch $("$PY" -c 'import torch; print(torch.__version__)'))"
elif [[ "$(uname -s)" == "Linux" && "$(uname -m)" == "x86_64" ]]; then
    "$PY" -m pip install -q "${PIP_COMPILE[@]}" "$TORCH_SPEC"
    say "torch: installed $TORCH_SPEC (CPU wheel) into $PY"
else
    die "torch is missing for $PY on $(uname -s)/$(uname -m): install the torch build for your platform first (on Jetson: NVIDIA's JetPack wheel), then re-run make setup"
fi

# ------------------------------------------------------- 3. editable install
present=()
for p in "${PACKAGES[@]}"; do
    [[ -f "$REPO/$p/__init__.py" ]] && present+=("$p")
done
LOCK="$REPO/requirements/lock.txt"
if [[ "$(uname -m)" == "aarch64" ]]; then
    # a Jetson: never the x86 lock; JetPack 6 or 7 by the L4T release (see the header)
    l4t_major="$({ sed -n 's/^# R\([0-9][0-9]*\) (release).*/\1/p' "$NV_TEGRA_RELEASE" 2>/dev/null || true; } | head -n1)"
    py_minor="$("$PY" -c 'import sys; print(sys.version_info[1] if sys.version_info[0] == 3 else 0)')"
    torch_pin="torch==$("$PY" -c 'from importlib.metadata import version; print(version("torch"))')"
    mkdir -p "$REPO/build"
    aarch64_constraints="$REPO/build/aarch64-constraints.txt"
    if [[ -n "$l4t_major" && "$l4t_major" -ge 38 && "$py_minor" -ge 12 ]]; then
        EXTRAS="jetson,trt,dev,export,jax"
        printf '%s\n' "$torch_pin" > "$aarch64_constraints"
        way="the JetPack 7 way"
        left_out="the whole chain, export and jax included; no sim: mplib"
    else
        EXTRAS="jetson,trt,dev"
        printf '%s\n' "numpy<2" "cuda-python<13" "$torch_pin" > "$aarch64_constraints"
        way="the JetPack 6 way"
        left_out="no sim: mplib; no export, jax: numpy>=2"
    fi
    constraints=(-c "$aarch64_constraints")
    lock_text="aarch64 constraints=$(tr '\n' ' ' < "$aarch64_constraints")"
    say "aarch64 (L4T R${l4t_major:-none}, Python 3.$py_minor), $way: requirements/lock.txt (x86, Python 3.11) not applied; extras $EXTRAS ($left_out); constraints $(tr '\n' ' ' < "$aarch64_constraints" | sed 's/ $//')"
elif [[ "${UNLOCKED:-0}" == "1" ]]; then
    constraints=()
    lock_text="unlocked"
else
    [[ -f "$LOCK" ]] || die "$LOCK is missing (restore it from git, or set UNLOCKED=1 to install without it)"
    constraints=(-c "$LOCK")
    lock_text="lock=$(sha256sum "$LOCK" | cut -c1-16)"
fi
stamp_text="python=$("$PY" -c 'import sys; print(sys.executable)') extras=$EXTRAS packages=${present[*]:-} $lock_text"

installed_here=0
show="$("$PY" -m pip show shape-assembly-bench 2>/dev/null || true)"
if grep -qxF "Editable project location: $REPO" <<<"$show"; then
    installed_here=1
fi
if [[ "$installed_here" == "1" && -f "$STAMP" && ! "$REPO/setup.py" -nt "$STAMP" ]] \
    && [[ "$(cat "$STAMP")" == "$stamp_text" ]]; then
    say "install: skipped (editable install of $REPO is current)"
else
    "$PY" -m pip install -q "${PIP_COMPILE[@]}" -e "$REPO[$EXTRAS]" "${constraints[@]}"
    # openpi's client (the remote tests talk to eval.serve with it) declares numpy<2, which JAX here cannot
    # have; the modules it uses need only websockets and msgpack (the remote extra), so it goes in without deps
    if [[ ",$EXTRAS," == *",remote,"* ]]; then
        "$PY" -m pip install -q "${PIP_COMPILE[@]}" --no-deps openpi-client "${constraints[@]}"
    fi
    printf '%s' "$stamp_text" > "$STAMP"
    say "install: pip install -e \".[$EXTRAS]\" ${constraints[*]:-(unlocked)} done"
fi
