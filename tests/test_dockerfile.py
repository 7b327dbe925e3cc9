"""Dockerfile.l4t: its pins agree with requirements/lock.txt and setup.py, it keeps JetPack's TensorRT and torch,
and none of the four problems that kept it from building on a Jetson comes back (mplib, JAX from PyPI, numpy >= 2
under JetPack's torch, SAPIEN from PyPI). Nothing here builds the image: it was never built on a Jetson."""

import ast
import itertools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile.l4t"


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of -_. as one dash."""
    return re.sub(r"[-_.]+", "-", name).lower()


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


def setup_pin(package: str) -> str:
    for reqs in setup_extras().values():
        for req in reqs:
            m = re.match(rf"^{re.escape(package)}==([\w.]+)$", req.strip())
            if m:
                return m.group(1)
    raise AssertionError(f"setup.py pins no version of {package}")


def lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line.strip())
        if m:
            pins[normalize(m.group(1))] = m.group(2)
    return pins


def run_instructions(text: str) -> str:
    """Instruction text without comments and heredoc bodies, continuation lines joined."""
    text = re.sub(r"<<'?(\w+)'?\n.*?\n\1\n", "\n", text, flags=re.S)  # heredoc bodies: Python, not shell
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    return re.sub(r"\\\n", " ", "\n".join(lines))


def pip_installs(text: str) -> list[list[str]]:
    """The words after `pip install` of every pip install command in the RUN instructions, with the ARGs'
    defaults put in (an ARG holding "jax jaxlib" is two words installed)."""
    args = dockerfile_args(text)
    out = []
    for line in run_instructions(text).splitlines():
        for cmd in re.split(r"&&|\|\||;", line):
            if "pip install" in cmd:
                cmd = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), cmd)
                out.append(shlex.split(cmd.split("pip install", 1)[1]))
    return out


def requirements(text: str) -> list[str]:
    """Requirement words of the pip install commands (options and their values left out)."""
    reqs = []
    for words in pip_installs(text):
        skip = False
        for w in words:
            if skip:
                skip = False
            elif w in ("--index-url", "--extra-index-url", "-c", "-r", "--constraint"):
                skip = True
            elif not w.startswith("-") and not w.startswith(".") and not w.startswith("${"):
                reqs.append(w)
    return reqs


def pinned(text: str) -> dict[str, str]:
    """{normalised name: version} of every name==version in the install lines, and the simulator's ARG pins."""
    args = dockerfile_args(text)
    pins = {}
    for req in requirements(text):
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(.+)$", req)
        if m:
            pins[normalize(m.group(1))] = m.group(3)
    pins["sapien"] = args["SAPIEN_VERSION"]
    return pins


@pytest.fixture(scope="module")
def text():
    assert DOCKERFILE.is_file(), "Dockerfile.l4t is missing at the repo root"
    return DOCKERFILE.read_text()


def test_pins_match_the_lock(text):
    pins, locked = pinned(text), lock()
    checked = {name: v for name, v in pins.items() if name in locked}
    assert len(checked) >= 15, f"only {sorted(checked)} are pinned and in the lock"
    wrong = {name: (v, locked[name]) for name, v in checked.items() if v != locked[name]}
    assert not wrong, f"pins that differ from requirements/lock.txt (Dockerfile, lock): {wrong}"


def test_simulator_pins_match_setup_py(text):
    args = dockerfile_args(text)
    assert args["SAPIEN_VERSION"] == setup_pin("sapien")
    assert args["MANISKILL_VERSION"] == setup_pin("mani-skill")
    body = run_instructions(text)
    assert "mani-skill==${MANISKILL_VERSION}" in body
    assert not re.search(r"(sapien|mani-skill)==\d", body)  # no second, literal version of them


def test_no_mplib_and_mani_skill_without_its_deps(text):
    reqs = {normalize(re.split(r"[=<>\[!~]", r)[0]) for r in requirements(text)}
    assert "mplib" not in reqs and "mplib" not in run_instructions(text)
    mani = [words for words in pip_installs(text) if any(w.startswith("mani-skill") for w in words)]
    assert mani and all("--no-deps" in words for words in mani), mani


def test_mani_skill_requirements_listed_but_mplib(text):
    """Every requirement of the installed mani-skill 3.0.1 (its METADATA), but mplib and SAPIEN (from its wheel),
    is in the Dockerfile's install lines."""
    from importlib import metadata

    try:
        reqs = metadata.requires("mani-skill")
    except metadata.PackageNotFoundError:
        pytest.skip("mani-skill is not installed here")
    from packaging.requirements import Requirement

    needed = set()
    for spec in reqs:
        r = Requirement(spec)
        if r.marker is None or r.marker.evaluate({"extra": "", "platform_system": "Linux"}):
            needed.add(normalize(r.name))
    listed = {normalize(re.split(r"[=<>\[!~]", r)[0]) for r in requirements(text)}
    missing = needed - listed - {"mplib", "sapien"}
    assert not missing, f"mani-skill needs {sorted(missing)}, not installed by Dockerfile.l4t"


def test_no_jax_in_the_image(text):
    """No jax, jaxlib or jax2onnx from PyPI (CPU builds, numpy >= 2) or any index: the Orin path runs without JAX."""
    for words in pip_installs(text):
        for w in words:
            assert not re.match(r"^(jax|jaxlib|jax2onnx|jax-cuda\d+-\w+)(\[|=|<|>|$)", w), f"pip install {w}"
    extras = dockerfile_args(text)["PROJECT_EXTRAS"].split(",")
    assert not {"jax", "export", "sim"} & set(extras), extras  # jax/export need numpy >= 2; sim pulls mplib


def test_numpy_below_2_everywhere(text):
    body = run_instructions(text)
    env = re.search(r"PIP_CONSTRAINT=(\S+)", body)
    assert env, "no PIP_CONSTRAINT: pip installs would not be held to numpy<2"
    first_pip = body.index("pip install")
    write = re.search(r"printf '([^']*)' > " + re.escape(env.group(1)), body)
    assert write and "numpy<2" in write.group(1).split("\\n"), "the constraints file does not say numpy<2"
    assert write.start() < first_pip, "the constraints file is written after the first pip install"
    assert not re.search(r"numpy\s*(==|>=|>|~=)\s*2", body)
    # JetPack's torch is added to the constraints right after it is installed, so nothing replaces it
    assert re.search(r"'torch==' \+ version\('torch'\)\)\" >> " + re.escape(env.group(1)), body)


def test_sapien_from_a_file_or_url(text):
    args = dockerfile_args(text)
    assert "SAPIEN_WHEEL" in args
    assert "sapien" not in {normalize(re.split(r"[=<>\[!~]", r)[0]) for r in requirements(text)}
    body = run_instructions(text)
    assert '"${SAPIEN_WHEEL}" in' in body and "/context/${SAPIEN_WHEEL}" in body
    assert "--mount=type=bind" in body
    assert re.search(r'""\) echo "error: pass SAPIEN', body), "no one-line error when SAPIEN_WHEEL is not given"
    assert "assert v == '${SAPIEN_VERSION}'" in body


def test_base_image_is_jetpack_r36(text):
    args = dockerfile_args(text)
    m = re.search(r"^FROM\s+(\S+)", text, re.MULTILINE)
    assert m, "no FROM line"
    image = m.group(1).replace("${L4T_JETPACK_TAG}", args.get("L4T_JETPACK_TAG", ""))
    assert re.fullmatch(r"nvcr\.io/nvidia/l4t-jetpack:r36(\.\d+)*", image), image


def test_tensorrt_not_pip_installed(text):
    for words in pip_installs(text):
        assert not any(re.match(r"^tensorrt\b", w) for w in words), words


def test_project_extras_exist_in_setup_py(text):
    extras = dockerfile_args(text)["PROJECT_EXTRAS"].split(",")
    known = setup_extras()
    assert not set(extras) - set(known), f"unknown extras {set(extras) - set(known)}"
    assert '-e ".[${PROJECT_EXTRAS}]"' in run_instructions(text)


def test_header_documents_build_run_and_that_it_was_never_built(text):
    header = "\n".join(itertools.takewhile(lambda ln: ln.startswith("#") or not ln.strip(), text.splitlines()))
    assert "docker build -f Dockerfile.l4t" in header and "SAPIEN_WHEEL=" in header
    assert "docker run" in header and "--runtime nvidia" in header
    assert "NEVER BUILT ON A JETSON" in header
    # Octo without JAX from an engines folder exported elsewhere, and JetPack 7.2's answer on JAX (the command)
    assert "--onnx-from DIR" in header and "python -m eval.orin --model octo-small" in header
    assert "--python-version 3.12" in header and "manylinux_2_${m}_aarch64" in header and "jaxlib-0.10.2-cp312" in header
    assert "need JAX in this release" not in header


def test_cuda_python_held_below_13_on_jetpack6(text):
    """setup.py's trt extra admits cuda-python 13 (JetPack 7's CUDA 13); JetPack 6's CUDA 12.6 needs 12.x."""
    write = re.search(r"printf '([^']*)' > /etc/pip-constraints.txt", run_instructions(text))
    assert write and "cuda-python<13" in write.group(1).split("\\n")
    assert setup_extras()["trt"] == ["cuda-python>=12.6,<14"]


def test_parser_sees_the_install_lines(text):
    """The helpers above read what they claim to (so the checks are not vacuous)."""
    reqs = requirements(text)
    assert "trimesh==5.2.0" in reqs and f"mani-skill=={dockerfile_args(text)['MANISKILL_VERSION']}" in reqs
    assert not any("packaging.requirements" in r for r in reqs)  # the heredoc's Python is not an install line


# mani-skill 3.0.1's requirements on SAPIEN (and mplib, left out), as its METADATA states them
MANI_SKILL_SAPIEN_REQUIRES = ('mplib==0.1.1; platform_system == "Linux"', 'sapien>=3.0.0; platform_system == "Linux"',
                              'sapien>=3.0.0.b1; platform_system == "Windows"',
                              'sapien>=3.0.2; platform_system == "Darwin"')


def requirement_check_script(text: str) -> str:
    """The Python of the RUN step that checks mani-skill's requirements (the Dockerfile's heredoc)."""
    bodies = [b for b in re.findall(r"<<'EOF'\n(.*?)\nEOF\n", text, flags=re.S) if 'requires("mani-skill")' in b]
    assert len(bodies) == 1, f"{len(bodies)} heredocs check mani-skill's requirements"
    return bodies[0]


def fake_dist(site: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))


def run_requirement_check(text: str, tmp_path: Path, sapien_version: str) -> subprocess.CompletedProcess:
    """The Dockerfile's check in a fresh interpreter whose first path entry holds a mani-skill 3.0.1 (with its SAPIEN
    requirements) and a SAPIEN of ``sapien_version``, as the image has them after its install steps."""
    site = tmp_path / "site"
    fake_dist(site, "mani_skill", "3.0.1", MANI_SKILL_SAPIEN_REQUIRES)
    fake_dist(site, "sapien", sapien_version)
    script = tmp_path / "check.py"
    script.write_text(requirement_check_script(text))
    code = (f"import sys; sys.path.insert(0, {str(site)!r}); "
            f"exec(compile(open({str(script)!r}).read(), 'check', 'exec'))")
    return subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("sapien_version", ["3.0.0.dev20250303+abc123", "3.0.0.dev20251217+0847062f", "3.0.3"])
def test_requirement_check_accepts_sapien_releases_and_the_nightlies_it_installs(text, tmp_path, sapien_version):
    proc = run_requirement_check(text, tmp_path, sapien_version)
    assert proc.returncode == 0, proc.stderr
    assert "mani-skill 3.0.1 requirements met (mplib left out)" in proc.stdout


@pytest.mark.parametrize("sapien_version", [
    "3.0.0.dev20250302+abc123",  # a nightly older than the one ManiSkill names
    "3.0.0rc1",  # a release candidate is not a nightly: its own version rules
    "2.2.2",
    "2.2.2.dev20250401+abc123",  # a nightly of a base version below the requirement
])
def test_requirement_check_rejects_what_does_not_meet_mani_skill(text, tmp_path, sapien_version):
    proc = run_requirement_check(text, tmp_path, sapien_version)
    assert proc.returncode != 0
    assert f"sapien>=3.0.0; platform_system == \"Linux\" (installed {sapien_version})" in proc.stderr, proc.stderr


def test_mani_skill_states_the_sapien_requirement_the_check_is_tested_with():
    from importlib import metadata

    try:
        reqs = metadata.requires("mani-skill")
    except metadata.PackageNotFoundError:
        pytest.skip("mani-skill is not installed here")
    assert metadata.version("mani-skill") == setup_pin("mani-skill")
    stated = [r for r in reqs if re.match(r"^(sapien|mplib)\b", r)]
    assert sorted(stated) == sorted(MANI_SKILL_SAPIEN_REQUIRES)


# ------------------------------------------------ scripts/setup.sh on a Jetson (aarch64), faked on this machine
# setup.sh runs from a copy of the repo's skeleton (its REPO is the folder above the script) with a fake `uname`
# first on PATH and PYTHON set to a fake interpreter that answers setup.sh's questions and logs every pip command.
FAKE_PYTHON = r'''#!/usr/bin/env bash
if [[ "$1" == "-V" ]]; then echo "Python 3.$FAKE_PY_MINOR.12"; exit 0; fi
if [[ "$1" == "-m" && "$2" == "pip" ]]; then
    echo "${*:3}" >> "$FAKE_PIP_LOG"
    exit 0
fi
if [[ "$1" == "-c" ]]; then
    case "$2" in
        *sys.executable*) echo "$0" ;;
        *"sys.version_info[1]"*) echo "$FAKE_PY_MINOR" ;;
        *"sys.version_info <"*) exit 0 ;;
        *torch.__version__*|*'version("torch")'*) echo "$FAKE_TORCH" ;;
        *"import torch"*) exit 0 ;;
        *) echo "fake python: unexpected -c $2" >&2; exit 3 ;;
    esac
    exit 0
fi
echo "fake python: unexpected $*" >&2; exit 3
'''
FAKE_UNAME = '#!/usr/bin/env bash\ncase "$1" in -m) echo "$FAKE_ARCH" ;; -s) echo Linux ;; *) echo Linux ;; esac\n'
JETPACK6_RELEASE = "# R36 (release), REVISION: 4.4, GCID: 41062509, BOARD: generic, EABI: aarch64, DATE: Mon Jun 16\n"
JETPACK72_RELEASE = "# R39 (release), REVISION: 2.0, GCID: 1, BOARD: generic, EABI: aarch64, DATE: Mon Jun 1\n"


def run_setup(tmp_path: Path, arch: str, py_minor: int = 10, release: str | None = JETPACK6_RELEASE,
              torch: str = "2.5.0a0+872d972e41.nv24.08", writes_bytecode: bool = False,
              ) -> tuple[subprocess.CompletedProcess, list[str], Path]:
    """setup.sh in a copy of the skeleton; PYTHONDONTWRITEBYTECODE set (as on this machine) unless
    ``writes_bytecode``."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for script in ("setup.sh", "pip_compile.sh"):  # setup.sh and what it sources
        (repo / "scripts" / script).write_text((ROOT / "scripts" / script).read_text())
    (repo / "requirements").mkdir()
    (repo / "requirements" / "lock.txt").write_text((ROOT / "requirements" / "lock.txt").read_text())
    (repo / "setup.py").write_text((ROOT / "setup.py").read_text())
    for pkg in ("binomial_stats", "env", "eval", "engines", "jetson", "benchmarks", "assembly_probe"):
        (repo / pkg).mkdir()
        (repo / pkg / "__init__.py").write_text("")
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    for name, body in (("uname", FAKE_UNAME), ("python-fake", FAKE_PYTHON)):
        (fakebin / name).write_text(body)
        (fakebin / name).chmod(0o755)
    log = tmp_path / "pip.log"
    log.write_text("")
    tegra = tmp_path / "nv_tegra_release"
    if release is not None:
        tegra.write_text(release)
    env = {"PATH": f"{fakebin}:/usr/bin:/bin", "HOME": str(tmp_path), "SKIP_APT": "1",
           "PYTHON": str(fakebin / "python-fake"), "FAKE_ARCH": arch, "FAKE_PY_MINOR": str(py_minor),
           "FAKE_TORCH": torch, "FAKE_PIP_LOG": str(log), "NV_TEGRA_RELEASE": str(tegra)}
    if not writes_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    return proc, [ln for ln in log.read_text().splitlines() if not ln.startswith("show ")], repo


def test_setup_on_jetpack6_skips_the_lock_and_the_extras_that_cannot_install(tmp_path):
    proc, pip, repo = run_setup(tmp_path, "aarch64")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[setup] aarch64")]
    assert lines == [
        "[setup] aarch64 (L4T R36, Python 3.10), the JetPack 6 way: requirements/lock.txt (x86, Python 3.11) not "
        "applied; extras jetson,trt,dev (no sim: mplib; no export, jax: numpy>=2); constraints numpy<2 "
        "cuda-python<13 torch==2.5.0a0+872d972e41.nv24.08"], proc.stdout
    constraints = repo / "build" / "aarch64-constraints.txt"
    assert pip == [f"install -q -e {repo}[jetson,trt,dev] -c {constraints}"]  # no openpi-client (no remote extra)
    assert "lock.txt" not in " ".join(pip)
    assert constraints.read_text().split() == ["numpy<2", "cuda-python<13", "torch==2.5.0a0+872d972e41.nv24.08"]
    # the extras are the image's: no sim (mplib), export or jax (numpy >= 2)
    assert dockerfile_args(DOCKERFILE.read_text())["PROJECT_EXTRAS"] == "jetson,trt,dev"


def test_setup_on_aarch64_without_l4t_takes_the_jetpack6_way(tmp_path):
    proc, pip, repo = run_setup(tmp_path, "aarch64", release=None)
    assert proc.returncode == 0, proc.stderr
    assert "[setup] aarch64 (L4T Rnone, Python 3.10), the JetPack 6 way:" in proc.stdout
    constraints = repo / "build" / "aarch64-constraints.txt"
    assert pip == [f"install -q -e {repo}[jetson,trt,dev] -c {constraints}"]


def test_setup_on_jetpack7_installs_the_whole_chain_without_the_lock(tmp_path):
    proc, pip, repo = run_setup(tmp_path, "aarch64", py_minor=12, release=JETPACK72_RELEASE, torch="2.12.0")
    assert proc.returncode == 0, proc.stderr
    assert ("[setup] aarch64 (L4T R39, Python 3.12), the JetPack 7 way: requirements/lock.txt (x86, Python 3.11) "
            "not applied; extras jetson,trt,dev,export,jax (the whole chain, export and jax included; no sim: "
            "mplib); constraints torch==2.12.0") in proc.stdout
    constraints = repo / "build" / "aarch64-constraints.txt"
    assert pip == [f"install -q -e {repo}[jetson,trt,dev,export,jax] -c {constraints}"]
    assert constraints.read_text().split() == ["torch==2.12.0"]  # numpy >= 2 and cuda-python 13 allowed


def test_setup_on_aarch64_is_skipped_when_done_and_redone_when_the_platform_changes(tmp_path):
    proc, pip, repo = run_setup(tmp_path, "aarch64")
    assert proc.returncode == 0 and len(pip) == 1
    env_runs = []
    for release, minor in ((JETPACK6_RELEASE, 10), (JETPACK72_RELEASE, 12)):
        proc, pip, _ = run_setup_again(tmp_path, repo, release, minor)
        env_runs.append((proc.returncode, len(pip), proc.stdout))
    assert env_runs[0][:2] == (0, 0) and "install: skipped" in env_runs[0][2]  # same constraints: nothing to do
    assert env_runs[1][:2] == (0, 1) and "[jetson,trt,dev,export,jax]" in env_runs[1][2]


def run_setup_again(tmp_path: Path, repo: Path, release: str, py_minor: int):
    """setup.sh once more in the same repo copy (stamp kept), pip showing the editable install as done."""
    fakebin = tmp_path / "bin"
    py = (fakebin / "python-fake").read_text()
    show = (f'if [[ "$1 $2 $3" == "-m pip show" ]]; then echo "Editable project location: {repo}"; exit 0; fi\n')
    (fakebin / "python-fake").write_text(py.replace("#!/usr/bin/env bash\n", "#!/usr/bin/env bash\n" + show, 1))
    log = tmp_path / "pip.log"
    log.write_text("")
    (tmp_path / "nv_tegra_release").write_text(release)
    env = {"PATH": f"{fakebin}:/usr/bin:/bin", "HOME": str(tmp_path), "SKIP_APT": "1",
           "PYTHON": str(fakebin / "python-fake"), "FAKE_ARCH": "aarch64", "FAKE_PY_MINOR": str(py_minor),
           "FAKE_TORCH": "2.5.0a0+872d972e41.nv24.08", "FAKE_PIP_LOG": str(log), "NV_TEGRA_RELEASE": str(tmp_path / "nv_tegra_release")}
    proc = subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    return proc, [ln for ln in log.read_text().splitlines() if not ln.startswith("show ")], repo


def test_setup_on_x86_still_applies_the_lock_and_every_extra(tmp_path):
    proc, pip, repo = run_setup(tmp_path, "x86_64", py_minor=11, release=None)
    assert proc.returncode == 0, proc.stderr
    lock = repo / "requirements" / "lock.txt"
    assert pip == [f"install -q -e {repo}[sim,export,jax,ray,dev,remote,dataset] -c {lock}",
                   f"install -q --no-deps openpi-client -c {lock}"]
    assert "aarch64" not in proc.stdout and not (repo / "build" / "aarch64-constraints.txt").exists()
    assert f'[setup] install: pip install -e ".[sim,export,jax,ray,dev,remote,dataset]" -c {lock} done' in proc.stdout


def test_setup_leaves_byte_compiling_to_python_where_python_writes_bytecode(tmp_path):
    """scripts/pip_compile.sh: with PYTHONDONTWRITEBYTECODE unset, pip installs without compiling (a module is
    compiled once, by the first process importing it); with it set (above), pip compiles as by default."""
    proc, pip, repo = run_setup(tmp_path, "x86_64", py_minor=11, release=None, writes_bytecode=True)
    assert proc.returncode == 0, proc.stderr
    lock = repo / "requirements" / "lock.txt"
    assert pip == [f"install -q --no-compile -e {repo}[sim,export,jax,ray,dev,remote,dataset] -c {lock}",
                   f"install -q --no-compile --no-deps openpi-client -c {lock}"]


# ------------------------------------------------------------------------ scripts/jetson_standin.sh (CI's stand-in)
STANDIN = ROOT / "scripts" / "jetson_standin.sh"


def test_ci_runs_the_jetson_standin_after_setup_beside_the_tests_and_before_the_prescott_pass():
    """.ci/run: the stand-in's venv needs nothing of the project's and is built from the start, beside make setup;
    the stand-in itself needs make setup's venv, not the tests' results: it runs in the background job that
    starts once setup is done, beside the main pass (make test), once its venv's build ended, and the Prescott
    pass follows it in that job; its failure is one CI FAILURE line and a non-zero exit."""
    ci = (ROOT / ".ci" / "run").read_text()
    venv = ci.index("bash scripts/jetson_standin.sh --venv-only")
    hook = ci.index("if ! bash scripts/jetson_standin.sh; then")
    assert venv < ci.index("\nmake setup\n") < ci.index('while [[ ! -s "$standin_venv_rc" ]]') < hook
    assert hook < ci.index("OPENBLAS_CORETYPE=Prescott")
    assert hook < ci.index("PYTEST_RC_FILE=\"$rc_file\" make test")  # the background job starts first
    assert re.search(r"if ! bash scripts/jetson_standin.sh; then\n.*\n\s+exit 1\n", ci[hook:])


def test_standin_skips_with_the_reason_where_there_is_no_python_3_10(tmp_path):
    import shutil

    path = "/usr/bin:/bin"
    if shutil.which("python3.10", path=path):
        pytest.skip("this machine has a python3.10 in /usr/bin: the stand-in would build its venv")
    proc = subprocess.run(["bash", str(STANDIN)], env={"PATH": path, "HOME": str(tmp_path)}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "jetson stand-in: skipped: no Python 3.10 here"
    bad = subprocess.run(["bash", str(STANDIN), "--venv"], env={"PATH": path, "HOME": str(tmp_path)},
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == ("jetson stand-in: unknown argument --venv; usage: bash "
                                                         "scripts/jetson_standin.sh [--venv-only]")


def test_standin_installs_as_the_image_does_without_jax():
    text = STANDIN.read_text()
    assert "printf 'numpy<2\\n' > \"$constraints\"" in text  # every pip install under numpy<2, as the image
    assert '--no-deps "mani-skill==$maniskill_version"' in text and "trimesh==" in text  # the image's own list
    installs = [ln for ln in text.splitlines() if re.search(r"\bvpip\b", ln) and not ln.lstrip().startswith("#")]
    assert not [ln for ln in installs if re.search(r"\b(jax|jaxlib|flax|jax2onnx)\b", ln)], installs
    assert "--model octo-small --backend ort --engines" in text and '--version' in text
