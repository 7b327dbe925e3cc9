"""Bad input to the command lines (issue #45): every case goes through the real argv (``python -m ...`` in a
subprocess) and must end in one ``error:`` line naming the thing and what to do, a non-zero exit, no traceback,
and nothing written. The reasoning set is built in-process with a stub renderer (no lavapipe: fast); its manifest is
the one ``build`` writes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from assembly_probe import build as B
from tests.conftest import REPO_ROOT

SIZE = 64


def _cli(module: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _one_error_line(r: subprocess.CompletedProcess, *needles: str) -> str:
    """The single ``error:`` line of a refused command, checked: non-zero exit, no traceback, every needle in it."""
    assert r.returncode != 0, (r.stdout[-1000:], r.stderr[-1000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r.stderr[-2000:]
    for n in needles:
        assert n in errors[0], (n, errors[0])
    return errors[0]


class _StubRenderer:
    """A distinct flat image per (state, camera): the set's files without lavapipe."""

    def render(self, state, camera):
        seed = abs(hash((json.dumps(state, sort_keys=True), camera))) % 2**32
        return np.random.default_rng(seed).integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("set")
    B.build(out, seed=0, per_type=1, lite=1, types=("position", "height"), plan_ks=(2,), plan_per_k=1, size=SIZE,
            progress=False, renderer=_StubRenderer())
    return out


@pytest.fixture
def data(built, tmp_path):
    d = tmp_path / "set"
    shutil.copytree(built, d)
    return d


def _run_oracle(data, out):
    return _cli("assembly_probe", "run", "--answerer", "oracle", "--data", str(data), "--out", str(out), "--quiet")


# ------------------------------------------------------------------ 1. the manifest's sha256, checked before a run
def test_an_intact_set_runs_and_its_report_quotes_the_manifest(data, tmp_path):
    m = json.loads((data / "manifest.json").read_text())
    assert set(m["files"]) == {"questions.jsonl", *(f"img/{p.name}" for p in (data / "img").glob("*.png"))}
    r = _run_oracle(data, tmp_path / "o")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["set_sha256_states"] == m["sha256_states"]


def test_an_edited_answer_key_is_refused_naming_the_file_and_the_rebuild(data, tmp_path):
    q = data / "questions.jsonl"
    lines = q.read_text().splitlines()
    item = json.loads(lines[0])
    item["answer"] = "B" if item["answer"] != "B" else "A"
    q.write_text("\n".join([json.dumps(item, sort_keys=True), *lines[1:]]) + "\n")
    r = _run_oracle(data, tmp_path / "o")
    _one_error_line(r, str(q), "differs from its sha256", "python -m assembly_probe build",
                    f"--out {data}", "--per-type 1", "--types position,height", "--plan-k 2", f"--size {SIZE}")
    assert not (tmp_path / "o").exists()  # refused before anything was answered or written


def test_an_edited_or_missing_image_is_named(data, tmp_path):
    imgs = sorted((data / "img").glob("*.png"))
    imgs[0].write_bytes(imgs[0].read_bytes() + b"x")
    _one_error_line(_run_oracle(data, tmp_path / "o"), str(imgs[0]), "differs from its sha256")
    imgs[0].unlink()
    _one_error_line(_run_oracle(data, tmp_path / "o"), str(imgs[0]), "is missing")
    # the gallery reads the same set: refused the same way
    _one_error_line(_cli("assembly_probe", "gallery", "--data", str(data), "--out", str(tmp_path / "g")),
                    str(imgs[0]))


def test_a_set_built_before_per_file_hashes_is_still_checked(data, tmp_path):
    mf = data / "manifest.json"
    m = json.loads(mf.read_text())
    del m["files"]
    mf.write_text(json.dumps(m))
    img = sorted((data / "img").glob("*.png"))[0]
    img.write_bytes(img.read_bytes() + b"x")
    _one_error_line(_run_oracle(data, tmp_path / "o"), str(data / "img"), "differ from the sha256")
    q = data / "questions.jsonl"
    q.write_text(q.read_text().replace('"answer": "A"', '"answer": "C"', 1))
    _one_error_line(_run_oracle(data, tmp_path / "o"), str(q), "sha256_states")


def test_a_missing_manifest_is_refused(data, tmp_path):
    (data / "manifest.json").unlink()
    _one_error_line(_run_oracle(data, tmp_path / "o"), "no manifest.json", "python -m assembly_probe build")


# ------------------------------------------------------------------ 2. broken JSON is named
def test_broken_json_names_its_file(data, tmp_path):
    q = data / "questions.jsonl"
    good = q.read_text()
    q.write_text(good + '{"id": "torn\n')
    _one_error_line(_run_oracle(data, tmp_path / "o"), f"{q} line {good.count(chr(10)) + 1} is not JSON")
    q.write_text(good)
    (data / "manifest.json").write_text("{not json")
    _one_error_line(_run_oracle(data, tmp_path / "o"), str(data / "manifest.json"), "is not JSON")


def test_broken_json_in_a_generation_set_names_its_file(tmp_path):
    d = tmp_path / "gen"
    d.mkdir()
    (d / "cases.jsonl").write_text('{"id": "plan-k2-00"}\n[1, 2\n')
    (d / "manifest.json").write_text("{}")
    (tmp_path / "ans").mkdir()
    r = _cli("assembly_probe", "generate-score", "--answers", str(tmp_path / "ans"), "--data", str(d),
             "--out", str(tmp_path / "r"))
    _one_error_line(r, f"{d / 'cases.jsonl'} line 2 is not JSON", "generate-build")


# ------------------------------------------------------------------ 3. every numeric option of assembly_probe
@pytest.mark.parametrize("args,needle", [
    (("build", "--per-type", "0"), "--per-type must be at least 1"),
    (("build", "--per-type", "-1"), "--per-type must be at least 1"),
    (("build", "--size", "-1"), "--size must be 32..4096"),
    (("build", "--size", "100000"), "--size must be 32..4096"),
    (("build", "--seed", "-1"), "--seed must be at least 0"),
    (("build", "--lite", "-1"), "--lite must be at least 0"),
    (("build", "--plan-per-k", "0"), "--plan-per-k must be at least 1"),
    (("build", "--plan-k", "5-2"), "--plan-k must be a range"),
    (("build", "--plan-k", "x"), "--plan-k must be a range"),
    (("build", "--out", ""), "--out is empty"),
    (("run", "--limit", "-1"), "--limit must be at least 1"),
    (("run", "--limit", "0"), "--limit must be at least 1"),
    (("run", "--timeout", "nan"), "--timeout must be a finite number"),
    (("run", "--timeout", "inf"), "--timeout must be a finite number"),
    (("run", "--timeout", "0"), "--timeout must be more than 0"),
    (("run", "--retries", "-1"), "--retries must be at least 0"),
    (("run", "--backoff", "nan"), "--backoff must be a finite number"),
    (("run", "--retry-budget", "-1"), "--retry-budget must be at least 0"),
    (("run", "--max-images", "0"), "--max-images must be at least 1"),
    (("run", "--max-fail-share", "nan"), "--max-fail-share must be a finite number"),
    (("run", "--max-fail-share", "1"), "--max-fail-share must lie in [0, 1)"),
    (("run", "--sweep-seeds", "-1"), "--sweep-seeds must be at least 0"),
    (("run", "--seed", "-3"), "--seed must be at least 0"),
    (("run", "--types", "height,heigth"), "unknown --types heigth"),
    (("gallery", "--tile", "0"), "--tile must be 16..1024"),
    (("generate-build", "--per-k", "0"), "--per-k must be at least 1"),
    (("generate-build", "--size", "0"), "--size must be 32..4096"),
    (("generate-build", "--seed", "-1"), "--seed must be at least 0"),
    (("generate-build", "--ks", "5-2"), "--ks must be a range"),
    (("generate-answers", "--timeout", "nan"), "--timeout must be a finite number"),
    (("generate-answers", "--retries", "-2"), "--retries must be at least 0"),
    (("generate-answers", "--max-fail-share", "-0.5"), "--max-fail-share must lie in [0, 1)"),
    (("generate-score", "--answers", ""), "--answers is empty"),
])
def test_reasoning_numeric_options_are_refused_in_one_line(built, tmp_path, args, needle):
    cmd, *rest = args
    required = {"build": ["--out", str(tmp_path / "b")],
                "run": ["--answerer", "oracle", "--data", str(built), "--out", str(tmp_path / "o")],
                "gallery": ["--data", str(built), "--out", str(tmp_path / "g")],
                "generate-build": ["--out", str(tmp_path / "b")],
                "generate-answers": ["--answerer", "oracle", "--data", str(built), "--out", str(tmp_path / "a")],
                "generate-score": ["--data", str(built)]}[cmd]
    _one_error_line(_cli("assembly_probe", cmd, *required, *rest), needle)
    assert not any(tmp_path.iterdir())  # nothing built, answered or written


# ------------------------------------------------------------------ 4. --num-envs beyond the tries
@pytest.mark.parametrize("module", ["eval.run", "eval.orin"])
def test_num_envs_beyond_the_tries_is_refused_with_the_largest_useful_value(tmp_path, module):
    t0 = time.monotonic()
    r = _cli(module, "--model", "scripted", "--setups", "A01", "--tries", "2", "--num-envs", "100000",
             "--sim", "cpu", "--out", str(tmp_path / "run"))
    _one_error_line(r, "--num-envs 100000", "2 tries per setup", "largest useful value is --num-envs 2")
    assert time.monotonic() - t0 < 60 and not (tmp_path / "run").exists()  # no scene built, no folder written


def test_the_request_refuses_num_envs_beyond_its_tries_wherever_it_is_made():
    from eval.request import RunRequest, resolve_model

    model = resolve_model("scripted")
    with pytest.raises(ValueError, match="largest useful value is --num-envs 3"):
        RunRequest(model, setups=(), split="dev", tries=3, num_envs=4)
    assert RunRequest(model, setups=(), split="dev", tries=3, num_envs=3).num_envs == 3


# ------------------------------------------------------------------ 5. engines.build's arguments
@pytest.mark.parametrize("args,needle", [
    (("--models", ""), "--models names no model"),
    (("--models", " , "), "--models names no model"),
    (("--models", "bc-state", "--out", ""), "--out is empty"),
    (("--models", "bc-state", "--checkpoint-octo-small", "/x"), "--checkpoint-octo-small applies to octo-small"),
    (("--models", "octo-base", "--checkpoint-octo-small", "/x"), "--checkpoint-octo-small applies to octo-small"),
    (("--models", "bc-state", "--random-weights"), "--random-weights applies to an Octo model"),
    (("--models", "bc-state", "--onnx-from", "/x"), "--onnx-from applies to an Octo model"),
])
def test_engines_build_refuses_arguments_that_build_nothing(tmp_path, args, needle):
    out = [] if "--out" in args else ["--out", str(tmp_path / "e")]
    _one_error_line(_cli("engines.build", *args, *out), needle)
    assert not (tmp_path / "e").exists()


# ------------------------------------------------------------------ 6. make setup's apt calls wait for the lock
SETUP = REPO_ROOT / "scripts" / "setup.sh"


def test_every_apt_get_call_of_setup_waits_for_the_dpkg_lock():
    text = SETUP.read_text()
    # the lines that run something: not comments, not the advice in a die message or the printed cmd (checked below)
    code = [ln for ln in text.splitlines()
            if not ln.lstrip().startswith("#") and "die " not in ln and not ln.lstrip().startswith("cmd=")]
    calls = [ln for ln in code if re.search(r"(^|[;&|(]\s*)apt-get\s", ln.strip())]
    assert calls == [], calls  # every call goes through apt_get
    assert re.search(r'^apt_get\(\) \{ apt-get -o DPkg::Lock::Timeout="\$APT_LOCK_TIMEOUT" "\$@"; \}$', text, re.M)
    assert 'APT_LOCK_TIMEOUT="${APT_LOCK_TIMEOUT:-600}"' in text
    assert len(re.findall(r"^\s+apt_get (update|install)", text, re.M)) == 4
    # the command printed for a non-root user waits too
    for printed in re.findall(r'cmd="([^"]*)"', text):
        assert printed.count("apt-get") == printed.count("apt-get -o DPkg::Lock::Timeout=600"), printed
    mk = (REPO_ROOT / "Makefile").read_text()
    assert all("DPkg::Lock::Timeout" in ln for ln in mk.splitlines() if "apt-get" in ln and "echo" not in ln)


@pytest.mark.skipif(shutil.which("flock") is None or shutil.which("bash") is None, reason="needs bash and flock")
def test_two_setups_at_once_take_turns_at_apt_and_pass_the_lock_timeout(tmp_path):
    """setup.sh's apt step (its functions, sourced) run twice at once with a fake apt-get that logs its arguments and
    takes a while: every call carries DPkg::Lock::Timeout, and the two steps' apt calls do not overlap. Faked: root,
    an old Mesa, apt-get, apt-cache, grep (so /etc is never written); no apt runs."""
    text = SETUP.read_text()
    start = text.index("# ------------------------------------------------------- 1. Vulkan (lavapipe)")
    section = text[start:text.index("\nmesa_step\n", start)]
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "apt.log"
    scripts = {
        "apt-get": f'#!/bin/bash\necho "start $PPID $*" >> {log}\nsleep 1\necho "end $PPID" >> {log}\n',
        "apt-cache": "#!/bin/bash\necho '  Candidate: 99.0'\n",
        "dpkg-query": "#!/bin/bash\necho 20.0\n",
        "dpkg": "#!/bin/bash\nexit 1\n",  # --compare-versions: never new enough, and the candidate is newer
        "id": "#!/bin/bash\necho 0\n",
        "grep": "#!/bin/bash\nexit 0\n",  # the backports source counts as present
    }
    for name, body in scripts.items():
        (fake / name).write_text(body)
        (fake / name).chmod(0o755)
    step = tmp_path / "step.sh"
    step.write_text('set -euo pipefail\nsay() { echo "[setup] $*"; }\ndie() { echo "[setup] ERROR: $*" >&2; exit 1; }\n'
                    'MESA_MIN=24.3\n' + section + "\nmesa_step\n")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "APT_TURN_LOCK": str(tmp_path / "turn.lock")}
    procs = [subprocess.Popen(["bash", str(step)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    lines = log.read_text().splitlines()
    starts = [ln for ln in lines if ln.startswith("start")]
    assert len(starts) == 4 and all("-o DPkg::Lock::Timeout=600" in ln for ln in starts), lines
    assert [ln.split()[0] for ln in lines] == ["start", "end"] * 4  # one apt call at a time
    first = lines[0].split()[1]
    assert [ln.split()[1] for ln in lines[:4]] == [first] * 4  # one setup's update and install, then the other's
    assert any("waiting for another setup" in o for o, _ in outs)


# ------------------------------------------------------------------ 7. the sweep's fixes
@pytest.mark.parametrize("module,args,needle", [
    ("eval.run", ("--model", "scripted", "--out", ""), "--out is empty"),
    ("eval.orin", ("--model", "scripted", "--out", ""), "--out is empty"),
    ("eval.run", ("--model", "scripted", "--executor", "ray", "--gpus-per-actor", "nan", "--out", "{tmp}/r"),
     "--gpus-per-actor must be a finite number"),
    ("eval.run", ("--model", "octo-small", "--revision", "", "--out", "{tmp}/r"), "--revision is empty"),
    ("eval.run", ("--model", "octo-small", "--checkpoint", "", "--out", "{tmp}/r"), "--checkpoint is empty"),
    ("eval.run", ("--model", "scripted", "--tries", "-1", "--out", "{tmp}/r"), "--tries must be at least 1"),
    ("eval.run", ("--model", "scripted", "--split", "bogus", "--out", "{tmp}/r"), "unknown split 'bogus'"),
    ("eval.run", ("--model", "scripted", "--setups", "Z99", "--out", "{tmp}/r"), "unknown setup 'Z99'"),
    ("eval.run", ("--model", "octo-small", "--checkpoint", "hf://bad", "--out", "{tmp}/r"), "hf://ORG/NAME"),
    ("eval.run", ("--model", "scripted", "--step-timeout", "nan", "--out", "{tmp}/r"), "--step-timeout"),
])
def test_sweep_bad_input_is_one_line(tmp_path, module, args, needle):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    before = set(os.listdir(REPO_ROOT))
    _one_error_line(_cli(module, *args), needle)
    assert not (tmp_path / "r").exists() and set(os.listdir(REPO_ROOT)) <= before  # nothing written anywhere
