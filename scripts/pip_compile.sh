# Sourced by the scripts that pip-install (scripts/setup.sh, scripts/jetson_standin.sh, scripts/lerobot_venv.sh,
# .ci/run): PIP_COMPILE is pip's flag for byte-compiling at install. Where Python writes bytecode itself
# (PYTHONDONTWRITEBYTECODE unset, Python's default), nothing is compiled at install: the first process that imports a
# module compiles it and writes its .pyc, and a module nothing imports is never compiled (torch's tests, JAX's
# unused backends; make setup took 50 s instead of 176 on the 2-core machine). Where PYTHONDONTWRITEBYTECODE is
# set, a module left uncompiled would be compiled again by every process that imports it (CI took 24 min instead
# of 20): pip compiles everything at install, as it does by default.
if [[ -n "${PYTHONDONTWRITEBYTECODE:-}" ]]; then
    PIP_COMPILE=()
else
    PIP_COMPILE=(--no-compile)
fi
