"""Released weights fetched the way the ecosystem does (engines.hub), against a local Hub (tests/hub_stub.py) that
answers huggingface_hub's own requests: a tiny Octo checkpoint in the released layout and a tiny t5 tokenizer,
written here, served under test repo ids. Every command runs in a subprocess with HF_ENDPOINT at the stub and
HF_HOME in a temporary folder (huggingface_hub reads both at import); conftest.py keeps every other test offline.

Cases: the main command (eval.orin) downloads, caches, runs and records repo, commit and sha256s, then reruns
offline with no request; a load downloads only the files the loader reads, a second one online asks only for the
listing, one with HF_HUB_OFFLINE makes no request; --revision; the Hub down (cache or not); a damaged cached
file refused; engines.build (make engines) without cache or Hub: one line, no random weights."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax", reason="the tiny Octo checkpoint is written and loaded with JAX/flax")
pytest.importorskip("sentencepiece", reason="the tiny t5 tokenizer is trained with sentencepiece")

from tests.hub_stub import StubHub, StubRepo, repo_from_folders  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPO = "sab-test/octo-tiny"
COMMIT, COMMIT_V2, T5_COMMIT = "1" * 40, "2" * 40, "5" * 40
NEEDED = ["300000/default/checkpoint", "config.json", "dataset_statistics.json", "example_batch.msgpack"]

LOAD = """
import json, sys
import numpy as np
from engines.hub import HubError
from engines.octo.octo_model import OctoModel
from engines.octo.errors import OctoError
try:
    e = OctoModel.load('octo', checkpoint='hf://{repo}', revision={revision!r})
except (HubError, OctoError) as err:  # as the command lines print it
    sys.exit(f'error: {{err}}')
if {predict}:  # the loaded model answers a query: T5 on the tokenizer fetched, then the backbone and sampler
    import jax
    images, masks, _ = e.blank_inputs()
    lang = e.embed('put the square block into the square hole')[None]
    a = e.predict(images, masks, lang, rng=jax.random.PRNGKey(0))
    assert a.shape == (1, e.cfg.action_horizon, e.cfg.action_dim) and np.isfinite(a).all()
print('WEIGHTS ' + json.dumps(e.weights.to_json()))
"""


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> dict[str, StubRepo]:
    """The tiny repo (main, and a branch v2 with other weights) and google-t5/t5-base with a tiny tokenizer."""
    from engines.octo import checkpoint as ckpt
    from engines.octo.params import init_params
    from engines.octo.testing import tiny_config, tiny_statistics, train_spiece

    root = tmp_path_factory.mktemp("released")
    cfg = tiny_config()
    main = ckpt.save(root / "main", cfg, init_params(cfg, seed=2), tiny_statistics())
    (main / "README.md").write_text("a file of the repo the loader does not read\n")
    v2 = ckpt.save(root / "v2", cfg, init_params(cfg, seed=3), tiny_statistics())
    t5 = root / "t5-base"
    train_spiece(t5)
    (t5 / "corpus.txt").unlink()
    return {REPO: repo_from_folders({COMMIT: main, COMMIT_V2: v2}, {"main": COMMIT, "v2": COMMIT_V2}),
            "google-t5/t5-base": repo_from_folders({T5_COMMIT: t5}, {"main": T5_COMMIT})}


@pytest.fixture()
def hub(repos):
    with StubHub(repos) as h:
        yield h


@pytest.fixture(scope="module", autouse=True)
def jax_compilation_cache(tmp_path_factory):
    """JAX's persistent compilation cache for the module's subprocesses (they copy this environment): the tiny
    Octo and T5 that eval.orin and a load with predict compile are compiled once and read by the next process.
    Only compile time is saved: what is fetched, cached, recorded or refused is not JAX's business."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path_factory.mktemp("jax-cache")))
        mp.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # the tiny models compile in under 1 s
        yield


@pytest.fixture(scope="module")
def cached(repos, tmp_path_factory) -> tuple[Path, dict]:
    """An HF_HOME holding the tiny repo as a load from the Hub left it, and that load's weights: made once for the
    tests that start from a cache (the Hub down, a damaged file); each works on its own copy (with_cache)."""
    home = tmp_path_factory.mktemp("cached")
    with StubHub(repos) as h:
        weights = _weights(_load(home, h.url))
    return home / "hf", weights


def with_cache(cached: tuple[Path, dict], tmp_path: Path) -> dict:
    """``cached``'s HF_HOME copied to where _env puts it for ``tmp_path`` (snapshots stay relative links to their
    blobs); the weights its load reported."""
    shutil.copytree(cached[0], tmp_path / "hf", symlinks=True)
    return cached[1]


def _env(tmp_path: Path, endpoint: str, offline: bool = False) -> dict:
    env = dict(os.environ, HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1" if offline else "0",
               HF_HUB_DISABLE_TELEMETRY="1")
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "OCTO_T5_TOKENIZER", "TRANSFORMERS_OFFLINE"):
        env.pop(var, None)
    return env


def _load(tmp_path, endpoint, offline=False, revision=None, predict=False):
    code = LOAD.format(repo=REPO, revision=revision, predict=predict)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=_env(tmp_path, endpoint, offline))


def _weights(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("WEIGHTS "))[8:])


def _one_error(proc) -> str:
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def _files_fetched(requests) -> list[str]:
    return sorted(p.split(f"/resolve/{COMMIT}/", 1)[1] for m, p in requests if m == "HEAD" and f"{REPO}/resolve/" in p)


def _blob(tmp_path: Path, repo: str, commit: str, name: str) -> Path:
    return (tmp_path / "hf" / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / commit / name).resolve()


@pytest.mark.sim
@pytest.mark.slow
def test_the_main_command_downloads_caches_runs_and_records_then_reruns_offline_with_no_request(tmp_path, hub):
    """The acceptance test: eval.orin on the tiny test repo through the real command line."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "eval.orin", "--model", "octo", "--checkpoint", f"hf://{REPO}", "--backend", "jax",
           "--split", "dev", "--setups", "A01", "--tries", "1", "--max-steps", "8", "--out", str(out)]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=_env(tmp_path, hub.url))
    assert first.returncode == 0, first.stderr[-3000:]
    assert _files_fetched(hub.requests) == NEEDED  # only what the loader reads: not README.md, not the markers
    record = json.loads((out / "tries.jsonl").read_text().splitlines()[0])
    run = json.loads((out / "run.json").read_text())
    weights = record["weights"]
    assert weights == run["request"]["weights"]
    assert weights["checkpoint"]["repo"] == REPO and weights["checkpoint"]["revision"] == COMMIT
    assert weights["tokenizer"]["repo"] == "google-t5/t5-base" and weights["tokenizer"]["revision"] == T5_COMMIT
    import hashlib

    files = weights["checkpoint"]["files"]
    assert sorted(files) == NEEDED
    for name, sha in files.items():  # the sha256 of the bytes the Hub serves
        assert sha == hashlib.sha256(hub.repos[REPO].commits[COMMIT][name]).hexdigest()
    assert record["weights_sha256"] == weights["sha256"] == run["weights_sha256"]
    assert record["model"] == "octo" and record["track"] == "adapted"  # not a released model: never ranked

    hub.requests.clear()
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env=_env(tmp_path, hub.url, offline=True))
    assert again.returncode == 0, again.stderr[-3000:]  # the same identity: the same files, read from the cache
    assert hub.requests == []


@pytest.mark.slow
def test_a_load_fetches_only_what_it_reads_then_the_cache_serves_it(tmp_path, hub):
    first = _weights(_load(tmp_path, hub.url, predict=True))
    assert _files_fetched(hub.requests) == NEEDED
    lfs = [p for m, p in hub.requests if p.startswith("cdn")]
    assert len(lfs) == 3  # the msgpack files came from the CDN the Hub redirected to, as released LFS files do
    snap = tmp_path / "hf" / "hub" / f"models--{REPO.replace('/', '--')}"
    assert (snap / "refs" / "main").read_text() == COMMIT and (snap / "snapshots" / COMMIT / "config.json").is_file()

    hub.requests.clear()
    online = _weights(_load(tmp_path, hub.url))  # online again: the listing is asked for, no file again
    assert online == first
    assert [p.split("?")[0] for _, p in hub.requests if not p.startswith("/api/agent")] == [
        f"/api/models/{REPO}/revision/main", "/api/models/google-t5/t5-base/revision/main"]

    hub.requests.clear()
    offline = _weights(_load(tmp_path, hub.url, offline=True, predict=True))
    assert offline == first and hub.requests == []


@pytest.mark.slow
def test_a_revision_is_resolved_to_its_commit_and_recorded(tmp_path, hub):
    v2 = _weights(_load(tmp_path, hub.url, revision="v2"))
    assert v2["checkpoint"]["revision"] == COMMIT_V2
    main = _weights(_load(tmp_path, hub.url))
    assert main["checkpoint"]["revision"] == COMMIT and main["sha256"] != v2["sha256"]
    hub.requests.clear()
    assert _weights(_load(tmp_path, hub.url, offline=True, revision="v2")) == v2  # refs/v2 kept for offline
    assert hub.requests == []
    line = _one_error(_load(tmp_path, hub.url, revision="nope"))
    assert REPO in line and "'nope'" in line and "--revision" in line


def test_hub_down_and_no_cache_is_one_line_naming_repo_files_cache_and_flag(tmp_path):
    with StubHub({}) as h:
        down = h.url  # nobody listens there once it is closed
    for offline in (False, True):
        cmd = [sys.executable, "-m", "eval.run", "--model", "octo", "--checkpoint", f"hf://{REPO}", "--split", "dev",
               "--setups", "A01", "--tries", "1", "--out", str(tmp_path / "run")]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env=_env(tmp_path, down, offline))
        line = _one_error(proc)
        assert proc.returncode == 2
        assert REPO in line and "config.json" in line and str(tmp_path / "hf" / "hub") in line
        assert "--checkpoint DIR" in line and "--random-weights" in line
        assert ("HF_HUB_OFFLINE is set" if offline else f"the Hub at {down} cannot be reached") in line
        assert not (tmp_path / "run" / "run.json").exists()


@pytest.mark.slow
def test_hub_down_with_a_cache_runs_from_it_and_says_so(tmp_path, cached):
    first = with_cache(cached, tmp_path)  # what a load from the Hub cached and reported
    with StubHub({}) as h:
        down = h.url
    proc = _load(tmp_path, down)
    assert _weights(proc) == first
    assert f"the Hub at {down} cannot be reached" in proc.stderr and f"{REPO}@{COMMIT[:12]}" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["300000/default/checkpoint", "config.json"])  # an LFS file, a git one
def test_a_damaged_cached_file_is_refused_in_one_line(tmp_path, hub, cached, name):
    with_cache(cached, tmp_path)  # as a load from the Hub left it
    blob = _blob(tmp_path, REPO, COMMIT, name)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, as a bad disk leaves it
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    for offline in (True, False):  # the blob's own name, then the Hub's listing: both record its hash
        line = _one_error(_load(tmp_path, hub.url, offline=offline))
        assert f"the cached file {name} of {REPO}@{COMMIT[:12]} is damaged" in line and str(blob) in line


def test_make_engines_without_cache_or_hub_is_one_line_not_random_weights(tmp_path):
    """What `make engines` runs (the Makefile's engines target: python -m engines.build, no flag)."""
    import re

    assert re.search(r"^engines: setup\n\t\$\(PY\) -m engines\.build\n", (ROOT / "Makefile").read_text(), re.M)
    with StubHub({}) as h:
        down = h.url
    out = tmp_path / "engines"
    proc = subprocess.run([sys.executable, "-m", "engines.build", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=_env(tmp_path, down))
    line = _one_error(proc)
    assert proc.returncode == 2 and "rail-berkeley/octo-small-1.5" in line and str(tmp_path / "hf" / "hub") in line
    assert "config.json" in line and "--checkpoint-octo-small DIR" in line and "--random-weights" in line
    assert not out.exists() or not any(out.iterdir())  # nothing built, nothing from random weights


def test_options_naming_weights_are_checked_when_made():
    from engines.hub import HubError, parse_repo
    from eval.request import model_config

    with pytest.raises(ValueError, match="--model octo needs --checkpoint DIR or hf://ORG/NAME"):
        model_config("octo")
    with pytest.raises(ValueError, match="--random-weights excludes --checkpoint and --revision"):
        model_config("octo-small", random_weights=True, revision="v2")
    with pytest.raises(ValueError, match="random weights need octo-small or octo-base"):
        model_config("octo", checkpoint="hf://a/b", random_weights=True)
    with pytest.raises(HubError, match="not a Hub repo"):
        parse_repo("hf://nope")
    assert parse_repo("hf://org/name") == "org/name" and parse_repo("/some/folder") is None
