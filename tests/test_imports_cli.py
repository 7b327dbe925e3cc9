"""Every module of the project imports, and every CLI answers `--help`.

Modules are collected dynamically from the file system (pkgutil.iter_modules,
walking the package directories like pkgutil.walk_packages does), so the test
works with whatever exists and collection never imports project code: a broken
package shows up as a failing test of its own, not as a collection error that
silently hides its submodules.
"""
import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["binomial_stats", "env", "eval", "engines", "jetson", "benchmarks", "assembly_probe"]
MAIN_GUARD = re.compile(r"""^\s*if\s+__name__\s*==\s*["']__main__["']\s*:""", re.M)
HELP_TIMEOUT_S = 120


def _walk(pkg_dir: Path, prefix: str):
    """Yield (module name, source file) for a package and everything under it."""
    yield prefix, pkg_dir / "__init__.py"
    for info in pkgutil.iter_modules([str(pkg_dir)]):
        name = f"{prefix}.{info.name}"
        if info.ispkg:
            yield from _walk(pkg_dir / info.name, name)
        else:
            yield name, pkg_dir / f"{info.name}.py"


def _discover():
    modules = {}
    for pkg in PACKAGES:
        pkg_dir = REPO_ROOT / pkg
        if (pkg_dir / "__init__.py").is_file():
            for name, path in _walk(pkg_dir, pkg):
                if path.is_file():  # iter_modules also reports .so / .pyc modules
                    modules[name] = path
    return dict(sorted(modules.items()))


MODULES = _discover()
CLI_MODULES = [
    name for name, path in MODULES.items()
    if MAIN_GUARD.search(path.read_text(encoding="utf-8", errors="replace"))
]


@pytest.mark.parametrize("pkg", PACKAGES)
def test_top_level_package_present(pkg):
    if not (REPO_ROOT / pkg / "__init__.py").is_file():
        pytest.skip(f"package {pkg}/ has no __init__.py yet")
    assert pkg in MODULES


@pytest.mark.parametrize("module", list(MODULES))
def test_module_imports(module):
    importlib.import_module(module)


SIMULATOR_MODULES = ("torch", "sapien", "mani_skill", "jax", "onnxruntime", "ray", "tensorrt", "tensorflow")
# `python -m MODULE --help` as -m runs it (runpy, as __main__, sys.argv[0] the module's file), once per module for
# both tests below: its exit status and stdout, and which heavy modules it imported (on the last line)
HELP_RUN = """
import contextlib, io, json, runpy, sys
sys.argv = [sys.argv[1], "--help"]
out, code = io.StringIO(), 0
with contextlib.redirect_stdout(out):
    try:
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) or e.code is None else 1
sys.stdout.write(out.getvalue())
print()
print(json.dumps({"exit": code or 0, "heavy": sorted(m for m in %r if m in sys.modules)}))
""" % (SIMULATOR_MODULES,)
_HELP: dict[str, tuple[subprocess.CompletedProcess, dict]] = {}


def _help(module: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``python -m module --help``: the process (stdout less the last line) and ``{"exit", "heavy"}``."""
    if module not in _HELP:
        try:
            proc = subprocess.run([sys.executable, "-c", HELP_RUN, module], cwd=REPO_ROOT, capture_output=True,
                                  text=True, timeout=HELP_TIMEOUT_S, env=dict(os.environ, MPLBACKEND="Agg"))
        except subprocess.TimeoutExpired:
            pytest.fail(f"python -m {module} --help took more than {HELP_TIMEOUT_S} s")
        assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
        stdout, last = proc.stdout.rstrip("\n").rsplit("\n", 1)
        _HELP[module] = (subprocess.CompletedProcess(proc.args, proc.returncode, stdout, proc.stderr), json.loads(last))
    return _HELP[module]


@pytest.mark.parametrize("module", CLI_MODULES)
def test_cli_help(module):
    proc, ran = _help(module)
    assert ran["exit"] == 0, (
        f"python -m {module} --help exited {ran['exit']}\n"
        f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    )
    assert proc.stdout.strip(), f"python -m {module} --help printed nothing on stdout"


@pytest.mark.parametrize("module", CLI_MODULES)
def test_cli_help_loads_no_simulator_or_framework(module):
    """--help answers at once: it imports none of the heavy modules (their import alone takes seconds;
    benchmarks/cli_startup.py measures the wall time)."""
    _, ran = _help(module)
    assert ran["heavy"] == [], f"python -m {module} --help imports {ran['heavy']}"
