"""Every module of the project imports, and every CLI answers `--help`.

Modules are collected dynamically from the file system (pkgutil.iter_modules,
walking the package directories like pkgutil.walk_packages does), so the test
works with whatever exists and collection never imports project code: a broken
package shows up as a failing test of its own, not as a collection error that
silently hides its submodules.
"""
import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["env", "eval", "engines", "jetson", "benchmarks"]
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


@pytest.mark.parametrize("module", CLI_MODULES)
def test_cli_help(module):
    env = dict(os.environ, MPLBACKEND="Agg")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True,
            timeout=HELP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"python -m {module} --help took more than {HELP_TIMEOUT_S} s")
    assert proc.returncode == 0, (
        f"python -m {module} --help exited {proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    )
    assert proc.stdout.strip(), f"python -m {module} --help printed nothing on stdout"


SIMULATOR_MODULES = ("torch", "sapien", "mani_skill", "jax", "onnxruntime", "ray", "tensorrt", "tensorflow")
HELP_IMPORTS = """
import contextlib, io, json, runpy, sys
sys.argv = [sys.argv[1], "--help"]
with contextlib.redirect_stdout(io.StringIO()):
    try:
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
print(json.dumps(sorted(m for m in %r if m in sys.modules)))
""" % (SIMULATOR_MODULES,)


@pytest.mark.parametrize("module", CLI_MODULES)
def test_cli_help_loads_no_simulator_or_framework(module):
    """--help answers at once: it imports none of the heavy modules (their import alone takes seconds;
    benchmarks/cli_startup.py measures the wall time)."""
    proc = subprocess.run([sys.executable, "-c", HELP_IMPORTS, module], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=HELP_TIMEOUT_S, env=dict(os.environ, MPLBACKEND="Agg"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", f"python -m {module} --help imports {proc.stdout.strip()}"
