"""Shared pytest setup: make the repo root importable (also without `pip install -e .`)."""
import os
import signal
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# Tests never open windows.
os.environ.setdefault("MPLBACKEND", "Agg")

# No test reaches the real Hugging Face Hub, whatever the machine has: huggingface_hub (and engines.hub) make no
# request in offline mode, and an endpoint nobody listens on is refused at once. tests/test_hub.py runs its
# subprocesses against its own local hub (tests/hub_stub.py) with these overridden.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"

# The tests that press Ctrl-C on a run (SIGINT to its process group) need what a terminal gives: a shell that starts
# pytest in the background without job control (`cmd &` in a script, as .ci/run's background job, or nohup) hands
# it SIGINT ignored, which every subprocess would inherit (Python keeps an inherited SIG_IGN), and the run would
# never see the Ctrl-C. Python's own handler here: subprocesses start with SIGINT at its default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def one_remote_try_fails_in_one_line(server_url: str, profile: str, out: Path) -> str:
    """The real command line, ``python -m eval.run --model remote`` for one try of A01 against ``server_url``,
    where the server's reply must stop the try: asserts exit 1 (a try that raised), exactly one ``error:`` line and
    no traceback, and returns that line."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "eval.run", "--model", "remote", "--server", server_url, "--profile",
                        profile, "--setups", "A01", "--tries", "1", "--out", str(out)],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and len(errors) == 1, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    return errors[0]


# ------------------------------------------------------------------ pytest-xdist (CI: -n 2 --dist loadfile)
# Whole files go to a worker (a file's module fixtures are built once), and files that share what a session builds
# go to the same worker: the tiny Octo's ONNX export in the session's cache (<basetemp>/sab-cache, exported once
# and found there by the next file). The slowest files are handed out first, so that no long file starts last.
XDIST_GROUPS = {
    "tests/test_octo_export.py": "tiny-octo-export",
    "tests/test_octo_goal.py": "tiny-octo-export",
    "tests/test_ort_optimize.py": "tiny-octo-export",
    "tests/test_octo_policy.py": "tiny-octo-export",
    # the recorded demonstrations (the recorded_demos fixture below): recorded once, checked and trained on
    "tests/test_record.py": "recorded-demos",
    "tests/test_bc_camera.py": "recorded-demos",
}
# slowest first, by a full run's --durations on the 2-core machine (-n 2; file totals 450 s down to 50 s under load);
# a file not named here follows, in collection order
SLOW_FIRST = [
    "tests/test_benchmarks.py",
    "tests/test_bad_input.py",
    "tests/test_octo_export.py",  # with the rest of its group (XDIST_GROUPS)
    "tests/test_octo_goal.py",
    "tests/test_ort_optimize.py",
    "tests/test_octo_policy.py",
    "tests/test_rollout.py",
    "tests/test_setups.py",
    "tests/test_remote.py",
    "tests/test_reasoning.py",
    "tests/test_predicate_v2.py",
    "tests/test_run_harness.py",
    "tests/test_record_faults.py",
    "tests/test_cli_faults.py",
    "tests/test_device_check.py",
    "tests/test_ray_executor.py",
    "tests/test_hub.py",
    "tests/test_record.py",  # after most: it may wait for LeRobot's venv, which CI builds from the end of make setup
    "tests/test_bc_camera.py",  # with the rest of its group (XDIST_GROUPS)
    "tests/test_scene.py",
    "tests/test_engines_folder.py",
    "tests/test_imports_cli.py",
    "tests/test_batch.py",
    "tests/test_scripted_and_runner.py",
]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # hand files out in SLOW_FIRST's order, not by their number of tests

    class FileGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            path = nodeid.split("::", 1)[0]
            return XDIST_GROUPS.get(path, path)

    return FileGroups(config, log)


def pytest_collection_modifyitems(session, config, items):
    if not hasattr(config, "workerinput"):  # only on xdist's workers: a plain run keeps the files' order
        return
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}

    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: a file's tests keep their order


@pytest.fixture(scope="session")
def recorded_demos(tmp_path_factory):
    """A scripted try of A01 and one of F01 (latency 1: the action is applied a step after it is sent) recorded by
    ``python -m eval.record`` on two workers (about 20 s): the dataset tests/test_record.py checks and
    tests/test_bc_camera.py trains on (one xdist group, so it is recorded once); (folder, the finished process)."""
    import subprocess

    out = tmp_path_factory.mktemp("record") / "demos"
    proc = subprocess.run([sys.executable, "-m", "eval.record", "--setups", "F01,A01", "--tries", "1", "--workers",
                           "2", "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc
