"""benchmarks/device_check: every step runs under a timeout, the JSON lines keep every finished step of a killed
run, and the output folder gets at most 8 files (the device tool returns no more). Dry runs on the CPU, a few
steps each; the full dry run is `bash benchmarks/device_check.sh --dry-run`."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import device_check as dc

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device_check.sh"
# the device README's line that installs carried wheels; the documented command must begin with it
INSTALL_LINE = ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "
                "/tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit;")


def lines(out: Path) -> list[dict]:
    p = out / "device_check.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines()] if p.exists() else []


def steps_in(out: Path) -> list[dict]:
    return [x for x in lines(out) if x["kind"] == "step"]


def alive(marker: str) -> list[int]:
    """Processes whose command line holds ``marker`` (a test's tmp folder)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if marker in (d / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def wait_gone(marker: str, within_s: float = 20.0) -> list[int]:
    t0 = time.monotonic()
    while (left := alive(marker)) and time.monotonic() - t0 < within_s:
        time.sleep(0.2)
    return left


def check_cmd(tmp_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.device_check", "--dry-run", "--no-progress", "--out",
            str(tmp_path / "out"), "--work", str(tmp_path / "work"), *args]


def test_every_step_has_a_timeout_and_the_run_fits_the_device():
    assert [s.name for s in dc.STEPS[:5]] == ["system", "jax-octo-small", "jax-octo-base", "bc-state-torch",
                                             "dlpack"], "the steps that need nothing carried come first"
    assert all(s.timeout_s > 0 for s in dc.STEPS)
    assert dc.BUDGET_S < 8 * 60 and sum(s.timeout_s for s in dc.STEPS[:5]) <= dc.BUDGET_S
    assert len(dc.OUT_FILES) <= 8
    for s in dc.STEPS:  # every step has a command, on the device and in a dry run
        for dry in (False, True):
            cmd = dc.step_command(s, dry, Path("w"), Path("w/rows.jsonl"))
            assert cmd[:2] == [sys.executable, "-m"] and ("--dry-run" in cmd) == (dry and s.internal)
    # the octo camera batch step asks octo_rollout for GPU scenes on the device, CPU scenes in a dry run
    cam = dc.step_command(dc.BY_NAME["octo-camera-batch"], False, Path("w"), Path("r"))
    assert cam[cam.index("--num-envs") + 1] == "1,8,32,64" and cam[cam.index("--sim") + 1] == "gpu"
    assert "--sim" not in dc.step_command(dc.BY_NAME["octo-camera-batch"], True, Path("w"), Path("r"))


def test_script_installs_nothing_and_runs_under_timeout():
    text = SCRIPT.read_text()
    code = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in code if re.search(r"pip\s+(install|download)", ln)], "no installs at run time"
    m = re.search(r'^exec timeout -k \d+ "\$\{DEVICE_CHECK_WALL_S:-(\d+)\}" "\$PY" -m benchmarks\.device_check',
                  text, re.M)
    assert m and dc.BUDGET_S < int(m.group(1)) < 8 * 60
    header = "\n".join(ln.lstrip("# ") for ln in text.splitlines() if ln.startswith("#"))
    assert f"{INSTALL_LINE} bash benchmarks/device_check.sh" in header
    assert "pip download --no-deps --only-binary=:all: --python-version 3.12" in header and "-d .whl" in header
    gitignore = (ROOT / ".gitignore").read_text().split()
    assert "/.whl/" in gitignore or ".whl/" in gitignore


@pytest.mark.slow
def test_dry_run_writes_a_line_per_step_and_few_files(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--no-progress", "--steps", "system,bc-state-torch,dlpack",
                           "--out", str(out), "--work", str(tmp_path / "work")], cwd=ROOT, capture_output=True,
                          text=True, timeout=240, env=dict(os.environ, PYTHON=sys.executable))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and set(files) <= set(dc.OUT_FILES), files
    doc = lines(out)
    assert doc[0]["kind"] == "start" and doc[-1] == {"kind": "end", "ok": True, "wall_s": doc[-1]["wall_s"]}
    steps = steps_in(out)
    assert [s["step"] for s in steps] == ["system", "bc-state-torch", "dlpack"]
    assert all(s["status"] == "ok" and 0 < s["timeout_s"] <= dc.BY_NAME[s["step"]].timeout_s for s in steps)
    bc = steps[1]["rows"]
    assert [r["batch"] for r in bc] == [1, 2, 4, 8]
    assert all(r["parity"]["rel"] <= dc.BC_TOLERANCE for r in bc)
    handoff = steps[2]["rows"][0]
    assert handoff["byte_identical"] and handoff["checksum_equal"]
    assert handoff["copy_counter"]["h2d_bytes"] == handoff["copy_counter"]["d2h_bytes"] == 0
    summary = json.loads((out / "device_check.json").read_text())
    assert summary["ok"] and [s["step"] for s in summary["steps"]] == ["system", "bc-state-torch", "dlpack"]


def test_a_killed_run_keeps_the_finished_steps(tmp_path):
    pytest.importorskip("jax")
    out = tmp_path / "out"
    proc = subprocess.Popen(check_cmd(tmp_path, "--steps", "system,jax-octo-small"), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        t0 = time.monotonic()
        while not steps_in(out) and proc.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.1)
        assert steps_in(out), "the first step never finished"
        os.killpg(proc.pid, signal.SIGKILL)  # the orchestrator, hard: no chance to write anything more
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    doc = lines(out)
    assert doc[0]["kind"] == "start" and doc[1]["kind"] == "step" and doc[1]["step"] == "system"
    assert doc[1]["status"] == "ok" and doc[1]["rows"][0]["kind"] == "system"
    if len(doc) == 2:  # killed while jax-octo-small ran: its process died with the orchestrator
        assert not (out / "device_check.json").exists()
        assert not wait_gone(str(tmp_path)), "a step's process outlived the killed orchestrator"


def test_a_step_past_its_timeout_is_killed_and_recorded(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "out"
    proc = subprocess.run(check_cmd(tmp_path, "--steps", "bc-state-torch", "--timeout-scale", "0.005"), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (step,) = steps_in(out)
    assert step["status"] == "timeout" and step["timeout_s"] == pytest.approx(0.3)
    assert "its timeout" in step["reason"]
    assert lines(out)[-1]["kind"] == "end" and lines(out)[-1]["ok"] is False
    assert not wait_gone(str(tmp_path)), "the timed-out step's process is still running"


def test_the_wall_timeout_ends_the_run_and_records_the_step_in_flight(tmp_path):
    """The script's own `timeout` sends SIGTERM: the orchestrator kills the running step and records it."""
    pytest.importorskip("jax")
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--no-progress", "--steps", "system,jax-octo-small",
                           "--out", str(out), "--work", str(tmp_path / "work")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHON=sys.executable, DEVICE_CHECK_WALL_S="6"))
    assert proc.returncode == 124, proc.stdout + proc.stderr  # timeout's status: the time ran out
    steps = steps_in(out)
    assert steps and steps[-1]["status"] == "killed" and "SIGTERM" in steps[-1]["reason"]
    assert all(s["status"] == "ok" for s in steps[:-1])
    assert lines(out)[-1]["kind"] == "step" and not (out / "device_check.json").exists()
    assert not wait_gone(str(tmp_path))


def test_a_signal_between_steps_keeps_the_finished_step_and_records_the_next_as_killed(tmp_path, monkeypatch):
    """A signal that lands while a record is written (not while a step's process is waited on) is held: the
    finished step is written as it ended and the step that was next is recorded as killed before it started."""
    gate = dc.SignalGate()
    monkeypatch.setattr(dc, "SIGNALS", gate)
    real_run_one = dc.run_one

    def run_one_then_signal(*args, **kwargs):
        rec = real_run_one(*args, **kwargs)
        gate(signal.SIGTERM, None)  # as if `timeout` fired just after the step's process ended
        return rec

    monkeypatch.setattr(dc, "run_one", run_one_then_signal)
    out = tmp_path / "out"
    rc = dc.run_check([dc.BY_NAME["system"], dc.BY_NAME["jax-octo-small"]], True, out, tmp_path / "work", 300.0,
                      1.0, True, [])
    assert rc == 143
    first, second = steps_in(out)
    assert first["step"] == "system" and first["status"] == "ok"
    assert second["step"] == "jax-octo-small" and second["status"] == "killed" and second["wall_s"] == 0
    assert "SIGTERM" in second["reason"] and "before this step started" in second["reason"]
    assert not (out / "device_check.json").exists()


def test_the_signal_gate_raises_only_while_a_step_is_waited_on():
    gate = dc.SignalGate()
    gate(signal.SIGINT, None)  # not waiting: held
    assert gate.pending == "SIGINT"
    with pytest.raises(dc.Interrupted, match="SIGINT"), gate.interruptible():  # held one surfaces at the wait
        pass
    gate = dc.SignalGate()
    with pytest.raises(dc.Interrupted, match="SIGTERM"), gate.interruptible():
        gate(signal.SIGTERM, None)
    assert not gate.waiting
    gate(signal.SIGTERM, None)  # during the kill that follows: held, not raised
    assert gate.pending == "SIGTERM"


@pytest.mark.parametrize("args,needle", [(["--steps", "nope"], "unknown step nope"),
                                         (["--budget-s", "0"], "must be positive")])
def test_bad_input_is_one_line(tmp_path, args, needle):
    proc = subprocess.run(check_cmd(tmp_path, *args), cwd=ROOT, capture_output=True, text=True, timeout=60)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and needle in err[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_list_names_every_step_with_its_timeout():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.device_check", "--list"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0
    for s in dc.STEPS:
        assert re.search(rf"^{re.escape(s.name)}\s+{s.timeout_s:.0f}\s", proc.stdout, re.M), s.name


def test_missing_modules_skip_a_step_with_the_reason():
    step = dc.Step("x", 10, "x", needs=("sapien", "no_such_module_here"))
    assert dc.missing_reason(step.missing(False)).startswith("sapien is not installed" if not dc._importable(
        "sapien") else "not installed: no_such_module_here")
    assert "no_such_module_here" in dc.missing_reason(step.missing(True))


def jax_cache_env(cache: Path) -> dict[str, str]:
    """JAX's persistent compilation cache in ``cache``, for every executable however quick to compile: a process
    that compiles what another has compiled reads the executable instead (the tiny Octo's compiles are most of a
    jax-octo-small step's time). The jit cache the step counts compiles by still gets one entry per executable."""
    return {"JAX_COMPILATION_CACHE_DIR": str(cache), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


@contextlib.contextmanager
def jax_compilation_cache(cache: Path):
    """jax_cache_env in this process, for the duration (the cache is set up once per process: reset around)."""
    jax = pytest.importorskip("jax")
    from jax.experimental.compilation_cache import compilation_cache

    names = {"JAX_COMPILATION_CACHE_DIR": "jax_compilation_cache_dir",
             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "jax_persistent_cache_min_compile_time_secs"}
    before = {name: getattr(jax.config, name) for name in names.values()}
    try:
        for var, value in jax_cache_env(cache).items():
            jax.config.update(names[var], value if var == "JAX_COMPILATION_CACHE_DIR" else float(value))
        compilation_cache.reset_cache()
        yield
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


def run_octo_step(tmp_path: Path, python: str = sys.executable, env: dict | None = None) -> None:
    """The dry run's jax-octo-small step under ``python``, by the real command line, into ``tmp_path``/out."""
    proc = subprocess.run([python, *check_cmd(tmp_path, "--steps", "jax-octo-small")[1:]], cwd=ROOT,
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def assert_octo_step_compiles_once_and_checks_parity_at_highest(tmp_path: Path):
    """The jax-octo-small step run into ``tmp_path`` (run_octo_step): batches 1, 8 and 64 each compiled once per
    matmul precision, and within tolerance of CPU JAX at "highest"."""
    (step,) = steps_in(tmp_path / "out")
    ref, *rows = step["rows"]
    assert ref["kind"] == "reference" and ref["matmul_precision"] == dc.PARITY_PRECISION == "highest"
    assert [r["batch"] for r in rows] == [1, 8, 64]
    for r in rows:
        assert r["status"] == "ok" and r["compiles"] == {"default": 1, "highest": 1}, r
        assert r["parity"]["matmul_precision"] == "highest" and r["parity"]["rel"] <= dc.OCTO_TOLERANCE
        assert r["parity"]["rows_compared"] == min(r["batch"], ref["batch"]) and "at_default" in r["parity"]
        assert r["timed_at"].startswith("default matmul precision")


@pytest.fixture(scope="module")
def octo_step(tmp_path_factory) -> tuple[Path, Path]:
    """The dry run's jax-octo-small step, run once for the module with JAX's compilation cache in a folder of its
    own: its folder (test_octo_compiles... reads the record) and the cache (the in-process step of
    test_a_second_compile... compiles the same executables and reads them from there)."""
    pytest.importorskip("jax")
    tmp = tmp_path_factory.mktemp("octo_step")
    cache = tmp / "jax-cache"
    run_octo_step(tmp, env={**os.environ, **jax_cache_env(cache)})
    return tmp, cache


@pytest.mark.slow
def test_octo_compiles_each_shape_once_and_checks_parity_at_highest_for_every_batch(octo_step):
    assert_octo_step_compiles_once_and_checks_parity_at_highest(octo_step[0])


@pytest.mark.slow
def test_engines_and_the_octo_step_under_the_newest_jax_for_python_312(tmp_path):
    """The GPU machine runs Python 3.12 with a newer JAX than the lock's (3.11): .ci/run makes a venv of the newest
    JAX the registry offers for Python 3.12 and names its interpreter in SAB_NEWEST_JAX_PYTHON."""
    python = os.environ.get("SAB_NEWEST_JAX_PYTHON")
    if not python:
        pytest.skip("SAB_NEWEST_JAX_PYTHON is not set: .ci/run sets it where Python 3.12 and a registry are available")
    code = ("import importlib, pkgutil, sys, engines, jax; "
            "[importlib.import_module(m.name) for m in pkgutil.walk_packages(engines.__path__, 'engines.')]; "
            "print(sys.version_info[0], sys.version_info[1], jax.__version__)")
    proc = subprocess.run([python, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    major, minor, jax_version = proc.stdout.split()
    assert (major, minor) == ("3", "12"), f"{python} is Python {major}.{minor} (JAX {jax_version}), not 3.12"
    run_octo_step(tmp_path, python)
    assert_octo_step_compiles_once_and_checks_parity_at_highest(tmp_path)


@pytest.mark.slow
def test_a_second_compile_of_a_shape_fails_the_octo_row(tmp_path, monkeypatch, octo_step):
    """Inputs put on the device committed (jax.device_put(x, device)) compile every batch size again: the step's
    count of the jit cache sees it."""
    jax = pytest.importorskip("jax")
    cpu = jax.devices("cpu")[0]
    uncommitted = jax.device_put
    monkeypatch.setattr(jax, "device_put", lambda x, device=None, **kw: uncommitted(x, device or cpu, **kw))
    rows_path = tmp_path / "rows.jsonl"
    with jax_compilation_cache(octo_step[1]):  # the executables octo_step compiled: read, not compiled again
        assert dc.run_step_process("jax-octo-small", True, tmp_path, rows_path) == 0
    rows = [r for r in dc.read_json_lines(rows_path) if "batch" in r and r.get("kind") != "reference"]
    assert [r["batch"] for r in rows] == [1, 8, 64]
    for r in rows:
        assert r["status"] == "failed" and r["compiles"]["default"] == 2 and "jit cache missed" in r["reason"], r


def test_partial_rows_of_a_benchmark_and_of_eval_go_into_the_record(tmp_path):
    from benchmarks.common import RowLog, write_result

    log = RowLog("octo_rollout", tmp_path, quick=True)
    log.append({"backend": "jax", "num_envs": 1})
    log.append({"backend": "jax", "num_envs": 2})
    (tmp_path / "orin").mkdir()
    (tmp_path / "orin" / "tries.jsonl").write_text('{"try": 0, "success": true}\n{"try": 1, "success": false}\n'
                                                   '{"try": 2, "succ')  # the last line cut by the kill
    got = dc.external_rows(tmp_path)
    assert got == [{"file": "octo_rollout.quick.rows.jsonl", "partial": True, "row": {"backend": "jax", "num_envs": 1}},
                   {"file": "octo_rollout.quick.rows.jsonl", "partial": True, "row": {"backend": "jax", "num_envs": 2}},
                   {"file": "orin/tries.jsonl", "partial": True, "tries_finished": 2, "successes": 1}]
    write_result("octo_rollout", tmp_path, "benchmarks.octo_rollout", [], True, {"rows": log.rows}, {}, log)
    assert not log.path.exists()  # the JSON holds every row
    (tmp_path / "orin" / "summary.json").write_text("{}")
    assert dc.external_rows(tmp_path) == [{"file": "octo_rollout.quick.json", "results": {"rows": log.rows}},
                                          {"file": "orin/summary.json", "results": {}}]


@pytest.mark.sim
@pytest.mark.slow
def test_a_killed_child_benchmark_leaves_its_finished_rows_in_the_step_record(tmp_path):
    """octo-camera-batch runs benchmarks.octo_rollout (3 rollouts in a dry run); the benchmark is killed hard once
    its first row is written, and the step's record holds that row."""
    for module in ("jax", "sapien", "mani_skill"):
        pytest.importorskip(module)
    out = tmp_path / "out"
    rows_file = tmp_path / "work" / "steps" / "octo-camera-batch" / "octo_rollout.quick.rows.jsonl"
    proc = subprocess.Popen(check_cmd(tmp_path, "--steps", "octo-camera-batch"), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        t0 = time.monotonic()
        while not dc.read_json_lines(rows_file) and proc.poll() is None and time.monotonic() - t0 < 240:
            time.sleep(0.1)
        assert dc.read_json_lines(rows_file), "the benchmark wrote no row"
        (child,) = [p for p in alive(str(tmp_path))
                    if b"benchmarks.octo_rollout" in Path(f"/proc/{p}/cmdline").read_bytes()]
        os.kill(child, signal.SIGKILL)
        assert proc.wait(timeout=60) == 1  # a failed step
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    (step,) = steps_in(out)
    assert step["status"] == "failed" and step["rc"] == -signal.SIGKILL
    assert step["rows"] and len(step["rows"]) < 3, step["rows"]
    first = step["rows"][0]
    assert first["partial"] and first["file"] == rows_file.name
    assert first["row"]["backend"] == "jax" and first["row"]["num_envs"] == 1 and first["row"]["tries"] == 1
    assert not (rows_file.parent / "octo_rollout.quick.json").exists()
