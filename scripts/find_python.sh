# Sourced by the scripts that build venvs of another Python (scripts/jetson_standin.sh, scripts/lerobot_venv.sh,
# .ci/run): find_python X.Y prints the path of a Python X.Y interpreter (pythonX.Y on PATH, else pyenv's X.Y.z),
# or nothing where there is none.
find_python() {
    local want="$1" cand
    for cand in "python$want" "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/"$want".*/bin/"python$want"; do
        if "$cand" -c "import sys; assert '%d.%d' % sys.version_info[:2] == '$want'" >/dev/null 2>&1; then
            command -v "$cand"
            return 0
        fi
    done
}
