"""Bad input and faults, injected for real: each gives one line naming the file or the try and what to do,
a non-zero exit, and loses nothing (records stay valid, a rerun continues)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.sim  # builds ManiSkill scenes

ROOT = Path(__file__).resolve().parents[1]
ONE_TRY = ("--model", "scripted", "--split", "dev", "--setups", "A01", "--tries", "1")


def _run(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "eval.run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _error_line(proc) -> str:
    """The run's one error line; nothing else on stderr looks like a failure."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "tries.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def one_try_run(tmp_path_factory) -> Path:
    """A finished one-try run folder, copied by the tests that damage one."""
    out = tmp_path_factory.mktemp("done") / "run"
    proc = _run(*ONE_TRY, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture
def mount_tmpfs(tmp_path):
    """mount_tmpfs(options) -> a fresh tmpfs folder (unmounted after the test); skips where mounting is not
    allowed (not root, or no CAP_SYS_ADMIN in this container)."""
    mounts = []

    def mount(options: str) -> Path:
        where = tmp_path / f"mnt{len(mounts)}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or 'mount failed'}): the fault needs one")
        mounts.append(where)
        return where

    yield mount
    for where in reversed(mounts):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_out_that_is_a_file_is_refused_in_one_line(tmp_path):
    target = tmp_path / "afile"
    target.write_text("not a folder")
    proc = _run(*ONE_TRY, "--out", str(target))
    assert proc.returncode == 2
    line = _error_line(proc)
    assert str(target) in line and "is a file" in line


def test_out_on_a_read_only_filesystem_is_refused_in_one_line(mount_tmpfs):
    ro = mount_tmpfs("size=1m,ro")
    proc = _run(*ONE_TRY, "--out", str(ro / "run"))
    assert proc.returncode == 2
    line = _error_line(proc)
    assert str(ro / "run") in line and "Read-only file system" in line and "writable" in line


@pytest.mark.parametrize("value", ["-1", "0"])
def test_step_timeout_must_be_positive(tmp_path, value):
    proc = _run(*ONE_TRY, "--step-timeout", value, "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and "--step-timeout must be a positive" in _error_line(proc)
    assert not (tmp_path / "run").exists()


def _fill(disk: Path, leave: int = 0) -> Path:
    """Take the tmpfs's free space, all but ``leave`` bytes, with one file."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                free = shutil.disk_usage(disk).free - leave
                if free <= 0:
                    break
                f.write(b"\0" * min(free, 1 << 20))
                f.flush()
        except OSError:
            pass
    return filler


def test_disk_full_while_appending_loses_nothing_and_a_rerun_completes(mount_tmpfs, one_try_run):
    disk = mount_tmpfs("size=4m")
    out = disk / "run"
    shutil.copytree(one_try_run, out)
    report_before = (out / "REPORT.md").read_bytes()
    tries = out / "tries.jsonl"
    with open(tries, "a") as f:  # blank lines (skipped by readers) up to a page end: the next record needs a page
        f.write("\n" * (-tries.stat().st_size % 4096))
    filler = _fill(disk)
    two = ("--model", "scripted", "--split", "dev", "--setups", "A01", "--tries", "2", "--out", str(out))
    full = _run(*two)
    assert full.returncode == 1
    line = _error_line(full)
    assert str(tries) in line and "No space left on device" in line and "rerun the same command" in line
    assert (out / "REPORT.md").read_bytes() == report_before  # the earlier report is whole
    assert [r["try"] for r in _records(out)] == [0]
    filler.unlink()
    again = _run(*two)
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(r["try"] for r in _records(out)) == [0, 1]
    assert json.loads((out / "summary.json").read_text())["setups"]["A01"]["n"] == 2


def test_disk_full_while_the_report_is_written_leaves_no_truncated_picture(mount_tmpfs, one_try_run):
    disk = mount_tmpfs("size=4m")
    out = disk / "run"
    shutil.copytree(one_try_run, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.suffix in (".png", ".md", ".json")}
    _fill(disk, leave=64 * 1024)  # a little space: the summary fits, the pictures do not
    proc = subprocess.run([sys.executable, "-m", "eval.report", "--tries", str(out / "tries.jsonl"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "No space left on device" in proc.stderr, proc.stderr[-2000:]
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.suffix in (".png", ".md", ".json")}
    assert after == before  # the previous report, every file whole
    assert not list(out.glob(".*partial*"))


def test_a_damaged_record_in_the_middle_is_named_and_nothing_is_lost(tmp_path, one_try_run):
    out = tmp_path / "run"
    shutil.copytree(one_try_run, out)
    good = (out / "tries.jsonl").read_text()
    rec = json.loads(good)
    rec["try"] = 1
    (out / "tries.jsonl").write_text(good + '{"setup": "A01", "tr\n' + json.dumps(rec) + "\n")
    proc = _run("--model", "scripted", "--split", "dev", "--setups", "A01", "--tries", "3", "--out", str(out))
    assert proc.returncode == 2
    line = _error_line(proc)
    assert str(out / "tries.jsonl") in line and "line 2" in line and "delete that line" in line
    lines = (out / "tries.jsonl").read_text().splitlines()
    del lines[1]
    (out / "tries.jsonl").write_text("\n".join(lines) + "\n")
    proc = _run("--model", "scripted", "--split", "dev", "--setups", "A01", "--tries", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(r["try"] for r in _records(out)) == [0, 1, 2]


def test_two_runs_into_one_folder_at_once_one_is_refused(tmp_path, one_try_run):
    out = tmp_path / "run"
    # the first run continues a copy of the shared one-try run (try 0 kept, try 1 run): it holds the lock while a
    # scene runs, as a fresh run does, one try fewer; the copy leaves out the fixture's lock file, so that the wait
    # below sees this run's
    shutil.copytree(one_try_run, out, ignore=shutil.ignore_patterns(".writer.lock"))
    args = [sys.executable, "-m", "eval.run", "--model", "scripted", "--split", "dev", "--setups", "A01",
            "--tries", "2", "--out", str(out)]
    first = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / ".writer.lock").exists() or not (out / ".writer.lock").read_text().strip():
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.1)
    second = _run(*args[3:])
    assert second.returncode == 2
    line = _error_line(second)
    assert str(out) in line and f"another run (pid {first.pid})" in line
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-2000:]
    recs = _records(out)
    assert sorted(r["try"] for r in recs) == [0, 1]
    again = _run(*args[3:])  # the lock of a finished run is taken over; nothing is run twice
    assert again.returncode == 0 and len(_records(out)) == 2


def test_a_killed_runs_lock_is_taken_over(tmp_path):
    out = tmp_path / "run"
    args = ("--model", "scripted", "--split", "dev", "--setups", "A01", "--tries", "1", "--out", str(out))
    proc = subprocess.Popen([sys.executable, "-m", "eval.run", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (out / ".writer.lock").exists() or not (out / ".writer.lock").read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (out / ".writer.lock").read_text().strip() == str(proc.pid)  # a stale lock file stays behind
    again = _run(*args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(r["try"] for r in _records(out)) == [0]


def _wait_for_records(proc, out: Path, n: int) -> None:
    """Until the running ``proc`` has appended ``n`` records to out/tries.jsonl."""
    deadline = time.monotonic() + 300
    while not (out / "tries.jsonl").exists() or len((out / "tries.jsonl").read_text().splitlines()) < n:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)


def test_ctrl_c_gives_one_line_and_no_worker_tracebacks(tmp_path):
    out = tmp_path / "run"
    # 3 tries on 2 workers, Ctrl-C at the second record: the third try is still running when it lands, and the
    # rerun has one try left (one worker, one scene)
    proc = subprocess.Popen([sys.executable, "-m", "eval.run", "--model", "scripted", "--split", "dev", "--setups",
                             "A01", "--tries", "3", "--workers", "2", "--out", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for_records(proc, out, 2)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert "interrupted" in _error_line(subprocess.CompletedProcess([], 130, "", err))
    n = len(_records(out))
    again = _run("--model", "scripted", "--split", "dev", "--setups", "A01", "--tries", "3", "--workers", "2",
                 "--out", str(out))
    assert again.returncode == 0 and n >= 1 and len(_records(out)) == 3


def test_a_policy_far_outside_the_controllers_range_is_clipped_and_counted(tmp_path):
    out = tmp_path / "run"
    proc = _run("--model", "tests.fault_policies:HugeActionPolicy", "--split", "dev", "--setups", "A01",
                "--tries", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (rec,) = _records(out)
    assert not rec["success"] and rec["actions_clipped"] == rec["steps"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["actions_clipped"] == {"tries": 1, "actions": rec["steps"]}
    assert f"1 tries sent actions outside the controller's [-1, 1] range ({rec['steps']} actions" in \
        (out / "REPORT.md").read_text()


def test_the_reference_never_needs_clipping(one_try_run):
    (rec,) = _records(one_try_run)
    assert rec["success"] and rec["actions_clipped"] == 0


def test_a_policy_that_raises_names_the_try(tmp_path):
    proc = _run("--model", "tests.fault_policies:RaisePolicy", "--split", "dev", "--setups", "A01", "--tries", "1",
                "--out", str(tmp_path / "run"))
    assert proc.returncode == 1
    line = _error_line(proc)
    assert "A01 try 0" in line and "RuntimeError: the policy's server went away" in line


def _bc_weights_without(tmp_path, drop_meta: str | None = None, empty: bool = False) -> Path:
    from engines.bc_mlp import DEFAULT_WEIGHTS

    path = tmp_path / "weights.safetensors"
    if empty:
        path.write_bytes(b"")
        return path
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(DEFAULT_WEIGHTS), framework="pt") as f:
        meta = {k: v for k, v in (f.metadata() or {}).items() if k != drop_meta}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(path), metadata=meta)
    return path


@pytest.mark.parametrize("kind", ["empty", "no_config"])
def test_bad_bc_state_weights_fail_before_any_scene_and_are_not_recorded(tmp_path, kind):
    weights = _bc_weights_without(tmp_path, drop_meta="config", empty=kind == "empty")
    out = tmp_path / "run"
    proc = _run("--model", "bc-state", "--checkpoint", str(weights), "--split", "dev", "--setups", "A01",
                "--tries", "1", "--out", str(out))
    assert proc.returncode == 2
    line = _error_line(proc)
    assert str(weights) in line and ("config" in line if kind == "no_config" else "corrupt" in line)
    assert not (out / "run.json").exists()  # the fixed file is not refused later as "other weights"
    assert "mani_skill" not in proc.stderr  # no scene was built (ManiSkill logs when it builds one)


def test_a_corrupt_cached_onnx_export_is_rebuilt(tmp_path, monkeypatch):
    from engines.backends import WEIGHTS_FILE_MODELS
    from engines.bc_mlp import DEFAULT_WEIGHTS
    from eval.policies.bc_state import weights_sha256

    monkeypatch.setenv("SAB_CACHE_DIR", str(tmp_path))
    sha = weights_sha256()
    onnx_for = WEIGHTS_FILE_MODELS["bc-state"].onnx_for_weights
    path = onnx_for(DEFAULT_WEIGHTS, sha)
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 3])  # truncated, as a killed copy leaves it
    assert onnx_for(DEFAULT_WEIGHTS, sha) == path
    from engines.onnx_utils import check_onnx_file

    check_onnx_file(path)
    assert path.stat().st_size == len(good)


def test_octo_without_weights_says_how_to_get_them_before_any_scene(tmp_path):
    """JAX loads the checkpoint: without the weights, one line naming the repo, the cache and the flags; ONNX
    Runtime (eval.orin's default on a CPU) runs from the engines folder: without one, the command that builds it."""
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"))  # an empty Hugging Face cache, whatever this machine has
    argv = [sys.executable, "-m", "eval.orin", "--model", "octo-small", "--split", "dev", "--setups", "A01", "--tries",
            "1", "--out", str(tmp_path / "run")]
    proc = subprocess.run(argv + ["--backend", "jax"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2
    line = _error_line(proc)
    assert "--random-weights" in line and "--checkpoint DIR" in line and "rail-berkeley/octo-small-1.5" in line
    assert str(tmp_path / "hf" / "hub") in line  # the cache folder it looked in
    assert "mani_skill" not in proc.stderr and not (tmp_path / "run" / "run.json").exists()
    proc = subprocess.run(argv + ["--engines", str(tmp_path / "engines")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 2
    line = _error_line(proc)
    assert f"{tmp_path / 'engines'} holds no engines" in line
    assert f"python -m engines.build --models octo-small --out {tmp_path / 'engines'}" in line
    assert "mani_skill" not in proc.stderr and not (tmp_path / "run" / "run.json").exists()


def test_run_json_lists_the_machine_and_every_package_version(one_try_run):
    from importlib import metadata

    env = json.loads((one_try_run / "run.json").read_text())["environment"]
    assert env["machine"]["cpu"] and env["packages"]["numpy"] == metadata.version("numpy")
    assert env["packages"]["mani-skill"] == "3.0.1" and "torch" in env["packages"]


def test_a_dropped_model_connection_runs_the_try_again_once_and_flags_it(tmp_path):
    out = tmp_path / "run"
    proc = _run("--model", "tests.fault_policies:LosesConnectionOnce", "--split", "dev", "--setups", "A01",
                "--tries", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "A01 try 0: the connection to the model server at ws://127.0.0.1:9 dropped" in proc.stderr
    (rec,) = _records(out)
    assert rec["flags"] == ["server_error"] and rec["steps"] == 300 and rec["wall_s"] > 0  # a finished try


def test_a_connection_lost_twice_stops_the_run_in_one_line(tmp_path):
    out = tmp_path / "run"
    proc = _run("--model", "tests.fault_policies:AlwaysLosesConnection", "--split", "dev", "--setups", "A01",
                "--tries", "1", "--out", str(out))
    assert proc.returncode == 1
    line = _error_line(proc)
    assert "A01 try 0" in line and "dropped" in line
    assert not (out / "tries.jsonl").exists() or not (out / "tries.jsonl").read_text().strip()


def test_disk_full_when_the_lock_is_written_is_one_line_and_leaves_no_lock(mount_tmpfs):
    disk = mount_tmpfs("size=1m")
    out = disk / "run"
    out.mkdir()
    filler = _fill(disk)
    proc = _run(*ONE_TRY, "--out", str(out))
    assert proc.returncode == 2
    line = _error_line(proc)
    assert str(out / ".writer.lock") in line and "No space left on device" in line and "free space" in line
    assert not (out / ".writer.lock").exists() and not (out / "run.json").exists()
    filler.unlink()
    again = _run(*ONE_TRY, "--out", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    assert [r["try"] for r in _records(out)] == [0]


def test_a_damaged_last_record_is_told_apart_from_a_torn_one_and_nothing_is_lost(tmp_path, one_try_run):
    """A torn line has no newline (a kill mid-write); a last line that ends in one but is not a record is
    damaged: named, with the advice a damaged middle line gets, and neither the run nor the report goes on."""
    out = tmp_path / "run"
    shutil.copytree(one_try_run, out)
    damaged = (out / "tries.jsonl").read_text() + '{"setup": "A01", "tr\n'
    (out / "tries.jsonl").write_text(damaged)
    two = ("--model", "scripted", "--split", "dev", "--setups", "A01", "--tries", "2", "--out", str(out))
    proc = _run(*two)
    assert proc.returncode == 2
    line = _error_line(proc)
    assert str(out / "tries.jsonl") in line and "line 2" in line and "delete that line" in line
    assert (out / "tries.jsonl").read_text() == damaged  # nothing run, nothing appended after the bad line
    report = subprocess.run([sys.executable, "-m", "eval.report", "--tries", str(out / "tries.jsonl"), "--out",
                             str(tmp_path / "report")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert report.returncode != 0 and "Traceback" not in report.stderr
    assert "line 2" in report.stderr and "delete that line" in report.stderr
    (out / "tries.jsonl").write_text(damaged.rsplit("\n", 2)[0] + "\n")
    proc = _run(*two)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(r["try"] for r in _records(out)) == [0, 1]


@pytest.mark.parametrize("args,needle", [
    (("--model", "octo-small", "--random-weights", "--exec-horizon", "0"), "--exec-horizon must be 1..4"),
    (("--model", "octo-small", "--random-weights", "--exec-horizon", "99"), "--exec-horizon must be 1..4"),
    (("--model", "octo-small", "--random-weights", "--backend", "torch"), "octo-small has no backend 'torch'"),
    (("--model", "scripted", "--step-timeout", "inf"), "--step-timeout must be a positive, finite number"),
])
def test_every_option_is_checked_before_the_run_folder_is_written(tmp_path, args, needle):
    out = tmp_path / "run"
    proc = _run(*args, "--split", "dev", "--setups", "A01", "--tries", "1", "--out", str(out))
    assert proc.returncode == 2
    assert needle in _error_line(proc)
    assert not (out / "run.json").exists()  # a corrected command needs no --fresh


def test_repeated_ctrl_c_stays_one_line_and_loses_nothing(tmp_path):
    out = tmp_path / "run"
    args = ("--model", "scripted", "--split", "dev", "--setups", "A01", "--tries", "3", "--workers", "2",
            "--out", str(out))  # as in the test above: Ctrl-C at the second record, the third try still running
    proc = subprocess.Popen([sys.executable, "-m", "eval.run", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for_records(proc, out, 2)
    for _ in range(3):  # three Ctrl-C within 0.4 s: the second and third land while the run closes its workers
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.13)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert "interrupted" in _error_line(subprocess.CompletedProcess([], 130, "", err))
    kept = _records(out)
    again = _run(*args)
    assert again.returncode == 0, again.stderr[-2000:]
    recs = _records(out)
    assert recs[:len(kept)] == kept and sorted(r["try"] for r in recs) == list(range(3))
