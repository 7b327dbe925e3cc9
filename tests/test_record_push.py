"""python -m eval.record --push-to-hub: a recording uploaded through the real command line to a local Hub
(tests/hub_upload_stub.py) that answers huggingface_hub's own requests, with no network: the dataset repo created
(public, or private with --private), exactly the dataset's files committed byte for byte (data/, videos/, meta/,
README.md; nothing of recording/), the tag v3.0 on that commit, the token sent as a Bearer header on every Hub
request and written nowhere; a bad token is one line and exit 1, the dataset kept.

One scripted try of A01 is recorded (about 10 s) and pushed as it is written; the other cases push copies of that
finished folder, as the same command rerun after a failed upload does (eval.record uploads its own finished dataset
without recording it again). The first uploads as huggingface_hub does with hf_xet installed
(requirements/lock.txt), the Hub answering every file "regular"; the --private one without hf_xet
(HF_HUB_DISABLE_XET=1), the Hub storing the parquet files and the videos with LFS as its default .gitattributes
says, so their bytes go through the LFS batch API to the storage."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.hub_upload_stub import UploadHub

pytestmark = pytest.mark.sim  # records a try (renders camera scenes)

pytest.importorskip("huggingface_hub", reason="--push-to-hub uploads through huggingface_hub")
pytest.importorskip("pyarrow", reason="the dataset is written with pyarrow")

TOKEN = "hf_test_token_not_secret"
BAD_TOKEN = "hf_wrong_token_not_secret"
REPO = "user/shape-assembly-demo"
UPLOADED_DIRS = ("data", "videos", "meta")
REGISTRY = "/api/agent-harnesses"  # huggingface_hub's public registry of agent harnesses, asked without a token


def _record(hub: UploadHub, out: Path, hf_home: Path, *extra: str, token: str = TOKEN,
            xet: bool = True) -> subprocess.CompletedProcess:
    """The command as a user runs it, against the stub: HF_ENDPOINT there, online (conftest.py sets the test
    process offline and its endpoint to a closed port), the token from HF_TOKEN, huggingface_hub's cache in
    ``hf_home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_ENDPOINT=hub.url, HF_TOKEN=token, HF_HOME=str(hf_home))
    if not xet:
        env["HF_HUB_DISABLE_XET"] = "1"
    # a smoke recording (one try cut at 20 steps): what is pushed is the folder's files, whatever the tries were
    return subprocess.run([sys.executable, "-m", "eval.record", "--setups", "A01", "--tries", "1", "--max-steps", "20",
                           "--out", str(out), "--push-to-hub", REPO, *extra], cwd=REPO_ROOT, capture_output=True, text=True, env=env,
                          timeout=600)


def _dataset_files(out: Path) -> dict[str, bytes]:
    """What the push must upload: every file under data/, videos/, meta/ and README.md."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
            and (p.relative_to(out).as_posix() == "README.md" or p.relative_to(out).parts[0] in UPLOADED_DIRS)}


def _check_pushed(hub: UploadHub, out: Path, proc: subprocess.CompletedProcess, private: bool) -> dict[str, bytes]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == f"pushed to {hub.url}/datasets/{REPO}", proc.stdout
    assert hub.unknown == [] and hub.errors == [], (hub.unknown, hub.errors)

    # one dataset repo, created once, public or private as asked
    assert list(hub.repos) == [("dataset", REPO)]
    assert [r.path for r in hub.requests if r.path == "/api/repos/create"] == ["/api/repos/create"]
    repo = hub.repo(REPO)
    assert repo.private is private

    # one commit over the Hub's initial one: exactly the dataset's files, byte for byte, none of recording/
    files = _dataset_files(out)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "data", "meta", "recording", "videos"]
    assert any(p.startswith("videos/") and p.endswith(".mp4") for p in files)
    assert any(p.startswith("data/") and p.endswith(".parquet") for p in files)
    assert "meta/info.json" in files and any((out / "recording").rglob("*"))
    head = repo.head
    initial = repo.commits[head.parent]
    assert initial.parent is None and set(initial.tree) == {".gitattributes"}
    assert sorted(head.added) == sorted(files)
    assert all(head.added[p] == data for p, data in files.items())
    assert set(head.tree) == set(files) | {".gitattributes"}
    assert not [p for p in head.tree if p.startswith("recording")]
    assert (out / "README.md").read_text() in hub.validated_cards  # the card's metadata checked as the Hub does

    # the tag LeRobot's reader asks for, on that commit
    assert repo.tags == {"v3.0": head.oid} and repo.branches == {"main": head.oid}
    paths = [(r.method, r.path.split("?")[0]) for r in hub.requests if r.origin == "hub"]
    order = [paths.index(("POST", "/api/repos/create")), paths.index(("POST", f"/api/datasets/{REPO}/commit/main")),
             paths.index(("DELETE", f"/api/datasets/{REPO}/tag/v3.0")),
             paths.index(("POST", f"/api/datasets/{REPO}/tag/main"))]
    assert order == sorted(order)

    # the token: a Bearer header on every Hub request (but the public registry's), never to the storage, never
    # written in the folder or printed
    for r in hub.requests:
        if r.origin == "hub" and r.path != REGISTRY:
            assert r.authorization == f"Bearer {TOKEN}", r
        else:
            assert r.authorization is None, r
    _check_token_nowhere(out, proc, TOKEN)
    return files


def _check_token_nowhere(out: Path, proc: subprocess.CompletedProcess, token: str) -> None:
    assert (out / "recording").is_dir()
    written = [p for p in out.rglob("*") if p.is_file()]
    assert written and not [p for p in written if token.encode() in p.read_bytes()]
    assert token not in proc.stdout and token not in proc.stderr


# ------------------------------------------------------------------ a push as with hf_xet installed
@pytest.fixture(scope="module")
def pushed(tmp_path_factory):
    root = tmp_path_factory.mktemp("push")
    with UploadHub(tokens=(TOKEN,)) as hub:
        out = root / "demos"
        yield hub, out, _record(hub, out, root / "hf-home")


def test_the_dataset_is_pushed_to_a_dataset_repo_tagged_v3(pushed):
    hub, out, proc = pushed
    _check_pushed(hub, out, proc, private=False)
    # every file "regular" (the stub's answer): its bytes in the commit, no LFS or xet transfer
    assert hub.repo(REPO).head.lfs == frozenset() and hub.storage == {}
    assert not [r for r in hub.requests if r.origin == "storage" or "/info/lfs/" in r.path]


# ------------------------------------------------------------------ --private, LFS, without hf_xet
def _copy(pushed, dest: Path) -> Path:
    """A copy of the pushed recording's finished folder."""
    _, out, _ = pushed
    shutil.copytree(out, dest)
    return dest


def test_private_creates_a_private_repo_and_lfs_files_go_to_the_storage(pushed, tmp_path):
    with UploadHub(tokens=(TOKEN,), lfs=True) as hub:
        out = _copy(pushed, tmp_path / "demos")
        proc = _record(hub, out, tmp_path / "hf-home", "--private", xet=False)
        files = _check_pushed(hub, out, proc, private=True)
    assert proc.stdout.startswith(f"{out} holds this command's finished dataset: uploading it")
    head = hub.repo(REPO).head
    stored = {p for p in files if p.endswith((".parquet", ".mp4"))}  # the Hub's .gitattributes for a dataset
    assert stored and head.lfs == stored
    assert sorted(hub.storage.values()) == sorted(files[p] for p in stored)
    puts = [r for r in hub.requests if r.origin == "storage"]
    assert len(puts) == len(stored) and all(r.method == "PUT" and r.authorization is None for r in puts)


# ------------------------------------------------------------------ a bad token
@pytest.fixture(scope="module")
def refused(pushed, tmp_path_factory):
    root = tmp_path_factory.mktemp("refused")
    with UploadHub(tokens=(TOKEN,)) as hub:
        out = _copy(pushed, root / "demos")
        yield hub, out, _record(hub, out, root / "hf-home", token=BAD_TOKEN), root


def test_a_bad_token_is_one_line_and_the_dataset_is_kept(refused):
    hub, out, proc, _ = refused
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith(f"error: the dataset is written in {out} but the upload to {REPO} failed: ")
    assert "401" in errors[0] and errors[0].endswith("rerun the same command to upload it")
    assert "pushed to" not in proc.stdout
    assert (out / "meta/info.json").is_file() and _dataset_files(out)
    # the Hub refused the token: create_repo (exist_ok) asked whether the repo exists, refused too; nothing made
    assert hub.repos == {} and hub.unknown == [] and hub.errors == []
    assert [(r.method, r.path) for r in hub.requests if r.path != REGISTRY] == [
        ("POST", "/api/repos/create"), ("GET", f"/api/datasets/{REPO}")]
    _check_token_nowhere(out, proc, BAD_TOKEN)


def test_the_rerun_the_error_asks_for_uploads_the_dataset(refused):
    hub, out, _, root = refused
    before = _dataset_files(out)
    hub.requests.clear()  # the refused ones
    proc = _record(hub, out, root / "hf-home")
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = _check_pushed(hub, out, proc, private=False)
    assert files == before  # uploaded as it was written, not recorded again


def test_a_finished_dataset_of_another_command_is_not_uploaded(refused):
    """The rerun uploads only the dataset its own command recorded: another --tries is refused in one line."""
    hub, out, _, root = refused
    hub.requests.clear()
    proc = _record(hub, out, root / "hf-home", "--tries", "2")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: {out} holds a finished dataset of another recording (tries_per_setup differ); use --fresh to "
        f"record this one, or another --out"]
    assert [r for r in hub.requests if r.path != REGISTRY] == []
