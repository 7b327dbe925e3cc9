"""Dockerfile.l4t: its pinned versions agree with setup.py, and it keeps JetPack's TensorRT."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile.l4t"


def dockerfile_args(text: str) -> dict[str, str]:
    """ARG NAME=VALUE lines (quotes removed); the last definition wins, as in a build."""
    args = {}
    for line in text.splitlines():
        m = re.match(r"\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
        if m:
            args[m.group(1)] = m.group(2).strip().strip('"').strip("'")
    return args


def setup_extras() -> dict[str, list[str]]:
    """extras_require of setup.py, read with ast (setup.py is not executed)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup":
            for kw in node.keywords:
                if kw.arg == "extras_require":
                    return ast.literal_eval(kw.value)
    raise AssertionError("setup.py has no setup(extras_require=...) literal")


def pin(extras: dict[str, list[str]], package: str) -> str:
    for reqs in extras.values():
        for req in reqs:
            m = re.match(rf"^{re.escape(package)}==([\w.]+)$", req.strip())
            if m:
                return m.group(1)
    raise AssertionError(f"setup.py pins no version of {package}")


def run_instructions(text: str) -> str:
    """Instruction text without comments, continuation lines joined."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    return re.sub(r"\\\n", " ", "\n".join(lines))


@pytest.fixture(scope="module")
def text():
    assert DOCKERFILE.is_file(), "Dockerfile.l4t is missing at the repo root"
    return DOCKERFILE.read_text()


def test_pins_match_setup_py(text):
    args, extras = dockerfile_args(text), setup_extras()
    assert args["SAPIEN_VERSION"] == pin(extras, "sapien")
    assert args["MANISKILL_VERSION"] == pin(extras, "mani-skill")


def test_pins_are_used_not_restated(text):
    body = run_instructions(text)
    assert "mani-skill==${MANISKILL_VERSION}" in body
    assert "${SAPIEN_VERSION}" in dockerfile_args(text)["SAPIEN_WHEEL"]
    # no second, literal version of the pinned packages anywhere in the instructions
    assert not re.search(r"(sapien|mani-skill)==\d", body)


def test_base_image_is_jetpack_r36(text):
    args = dockerfile_args(text)
    m = re.search(r"^FROM\s+(\S+)", text, re.MULTILINE)
    assert m, "no FROM line"
    image = m.group(1).replace("${L4T_JETPACK_TAG}", args.get("L4T_JETPACK_TAG", ""))
    assert re.fullmatch(r"nvcr\.io/nvidia/l4t-jetpack:r36(\.\d+)*", image), image


def test_tensorrt_not_pip_installed(text):
    for line in run_instructions(text).splitlines():
        if "pip install" in line:
            assert not re.search(r"\btensorrt\b", line.split("pip install", 1)[1]), line


def test_project_extras_exist_in_setup_py(text):
    extras = dockerfile_args(text)["PROJECT_EXTRAS"].split(",")
    known = setup_extras()
    assert "sim" in extras
    assert not set(extras) - set(known), f"unknown extras {set(extras) - set(known)}"
    assert '-e ".[${PROJECT_EXTRAS}]"' in run_instructions(text)


def test_header_documents_build_and_run(text):
    header = "\n".join(ln for ln in text.splitlines()[:40] if ln.startswith("#"))
    assert "docker build -f Dockerfile.l4t" in header
    assert "docker run" in header and "--runtime nvidia" in header
