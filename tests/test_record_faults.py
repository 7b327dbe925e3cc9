"""Records that lie (#45): every file the project reads is typed where it is read, through the real entry points.

A record field of the wrong type (a NaN success, which bool() calls True), a run folder that lost its run.json,
a damaged summary.json or run.json, a binary latency profile, a locale that cannot print a name: each gives one
line naming the file (and the line or field) and what to do, a non-zero exit, never a traceback or a wrong number.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from env.setups import SCORED_IDS
from eval.policies.scripted import ScriptedPolicy
from eval.records import TryRecord

ROOT = Path(__file__).resolve().parents[1]
ONE_TRY = ("--setups", "A01", "--tries", "1", "--split", "dev")
LOCALES = {"ascii": {"PYTHONIOENCODING": "ascii"},
           "C": {"LANG": "C", "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}}


def _py(module: str, *args, env=None, timeout=300):
    full = {**os.environ, **(env or {})}
    if env and "PYTHONIOENCODING" not in env:
        full.pop("PYTHONIOENCODING", None)
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, encoding="utf-8", errors="replace", timeout=timeout, env=full)


def _one_error(proc, prefix: str = "") -> str:
    """The command's one error line (rc != 0, no traceback)."""
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


def _record(setup="A01", try_index=0, success=False, **extra) -> dict:
    """A record as a run writes it (TryRecord.to_json), without running a scene."""
    rec = TryRecord(setup=setup, try_index=try_index, seed=1000 + try_index, split="dev", disturbance=None,
                    tasklist_sha256="ab" * 32, success=success, success_raw=success, steps=300, infer_ms=(0.2, 0.3),
                    infer_queries=2, model="random", track="sanity", arm="panda", backend="python").to_json()
    rec.update(extra)
    return rec


def _write(path: Path, records, raw_lines=()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # json.dumps writes NaN and Infinity as json.loads reads them: what a damaged or hand-edited file holds
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "".join(raw_lines), encoding="utf-8")
    return path


NAME_PATH = "r\u00e9sum\u00e9\u2013run"  # a run folder's name that an ASCII locale cannot print


@pytest.fixture(scope="module")
def random_run_proc(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A finished one-try run of the random policy (a failed try), copied by the tests that damage it, and its
    process. One real run serves two purposes (a scene run costs ~10 s of CPU): it is made as
    test_run_prints_a_path_its_locale_cannot_encode needs its first run, in a folder named NAME_PATH with an
    ASCII stdout/stderr (PYTHONIOENCODING only: the files it writes are the same), and that test checks what it
    printed; the other tests read or copy the folder."""
    out = tmp_path_factory.mktemp("random") / NAME_PATH
    proc = _py("eval.run", "--model", "random", *ONE_TRY, "--out", out, env=LOCALES["ascii"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc


@pytest.fixture(scope="module")
def random_run(random_run_proc) -> Path:
    return random_run_proc[0]


def _copy(run: Path, tmp_path: Path, name="run") -> Path:
    out = tmp_path / name
    shutil.copytree(run, out, ignore=shutil.ignore_patterns(".writer.lock"))
    return out


# ---------------------------------------------------------------------------------------------------------------
# 1. every record field typed where it is read
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value, shown", [
    ("success", float("nan"), "NaN"),          # bool(NaN) is True: a failed try counted a success
    ("success", 1, "1"),
    ("success_raw", "false", '"false"'),
    ("try", "1", '"1"'),
    ("try", 1.5, "1.5"),
    ("seed", None, "null"),
    ("infer_ms", [0.2, float("inf")], "Infinity"),
    ("flags", "rim", '"rim"'),
    ("flags", ["bogus"], '"bogus"'),
    ("setup", "Z99", '"Z99"'),
    ("steps", -3, "-3"),
    ("model", 5, "5"),
    ("v", 99, "99"),
    ("step_ms", {"physics": "slow"}, '"slow"'),
    ("blocks_inserted", True, "true"),
])
def test_a_mistyped_record_field_is_named_by_the_report(tmp_path, field, value, shown):
    tries = _write(tmp_path / "run" / "tries.jsonl", [_record(), _record(try_index=1, **{field: value})])
    proc = _py("eval.report", "--tries", tries, "--out", tmp_path / "report", "--n-boot", 50)
    line = _one_error(proc, "python -m eval.report: error:")
    assert str(tries) in line and "line 2" in line and f"'{field}" in line and shown in line, line
    assert "delete that line" in line
    assert not (tmp_path / "report" / "summary.json").exists()


def test_nan_success_counts_no_success_anywhere(tmp_path, random_run):
    """The issue's case: random policy, a failed try with success NaN read 1/2. Now the run, the report and
    the page each refuse the file in one line naming the line and the field."""
    out = _copy(random_run, tmp_path)
    rec = json.loads((out / "tries.jsonl").read_text().splitlines()[0])
    assert rec["success"] is False
    bad = {**rec, "try": 1, "success": float("nan")}
    (out / "tries.jsonl").write_text(json.dumps(rec) + "\n" + json.dumps(bad) + "\n")
    needle = (str(out / "tries.jsonl"), "line 2", "'success' is NaN", "true or false")

    run = _py("eval.run", "--model", "random", "--setups", "A01", "--tries", "2", "--out", out)
    assert run.returncode == 2 and all(n in _one_error(run, "error:") for n in needle)
    report = _py("eval.report", "--tries", out / "tries.jsonl", "--out", tmp_path / "rep", "--n-boot", 50)
    assert all(n in _one_error(report) for n in needle)
    site = _py("eval.site", "--runs", out, "--out", tmp_path / "site", "--n-boot", 50)
    assert all(n in _one_error(site) for n in needle)
    assert not (tmp_path / "site" / "index.html").exists()


def test_a_try_recorded_twice_is_named_not_counted_twice(tmp_path, random_run):
    out = _copy(random_run, tmp_path)
    line = (out / "tries.jsonl").read_text()
    (out / "tries.jsonl").write_text(line + line)
    for proc in (_py("eval.run", "--model", "random", *ONE_TRY, "--out", out),
                 _py("eval.report", "--tries", out / "tries.jsonl", "--out", tmp_path / "rep", "--n-boot", 50)):
        msg = _one_error(proc)
        assert str(out / "tries.jsonl") in msg and "line 2" in msg and "again (first on line 1)" in msg, msg


def test_a_damaged_batch_record_is_named(tmp_path):
    tries = _write(tmp_path / "run" / "tries.jsonl", [_record()])
    batch = {"v": 1, "setup": "A01", "tries": [0], "num_envs": 2, "sim": "cpu", "batched_queries": True,
             "backend": "python", "steps": 10, "scene_steps": 10, "wall_s": 1.0, "query_ms": ["fast"],
             "query_batch": [2], "warmup_ms": [], "host_device_bytes_per_step": 0.0, "image_bytes_per_step": 0.0}
    _write(tmp_path / "run" / "batches.jsonl", [batch])
    msg = _one_error(_py("eval.report", "--tries", tries, "--out", tmp_path / "rep", "--n-boot", 50))
    assert "batches.jsonl: line 1" in msg and "'query_ms[0]' is \"fast\"" in msg, msg


def test_records_of_another_task_list_in_one_file_are_refused(tmp_path):
    tries = _write(tmp_path / "run" / "tries.jsonl", [_record(), _record(try_index=1, tasklist_sha256="cd" * 32)])
    msg = _one_error(_py("eval.report", "--tries", tries, "--out", tmp_path / "rep", "--n-boot", 50))
    assert str(tries) in msg and "several runs" in msg and "tasklist_sha256" in msg, msg


class BadFieldPolicy(ScriptedPolicy):
    """The scripted reference (its try ends at its success, ~130 steps, where one that holds still runs all 300)
    that adds a field of the wrong type to its record (``--model tests.test_record_faults:BadFieldPolicy``)."""

    name = "bad-field-test"
    track = "sanity"

    def record_fields(self):
        return {**super().record_fields(), "stale_ratio": float("nan")}


def test_a_record_its_readers_would_refuse_is_not_written(tmp_path):
    """The writer checks what the readers check: the folder never holds a record that blocks its resume."""
    out = tmp_path / "run"
    proc = _py("eval.run", "--model", "tests.test_record_faults:BadFieldPolicy", *ONE_TRY, "--out", out)
    assert proc.returncode == 1
    msg = _one_error(proc, "error:")
    assert str(out / "tries.jsonl") in msg and "'stale_ratio' is NaN" in msg and "not written" in msg, msg
    assert not (out / "tries.jsonl").read_text().strip()


# ---------------------------------------------------------------------------------------------------------------
# 2. a run folder's identity lives in its records
# ---------------------------------------------------------------------------------------------------------------
def test_every_record_names_its_run(random_run):
    run_json = json.loads((random_run / "run.json").read_text())
    recs = [json.loads(ln) for ln in (random_run / "tries.jsonl").read_text().splitlines()]
    assert run_json["run_identity"] and all(r["run_identity"] == run_json["run_identity"] for r in recs)


def test_without_run_json_another_model_is_refused_and_the_same_run_recovers_it(tmp_path, random_run):
    out = _copy(random_run, tmp_path)
    kept = (out / "run.json").read_text()
    tries_before = (out / "tries.jsonl").read_bytes()
    (out / "run.json").unlink()
    other = _py("eval.run", "--model", "hold", *ONE_TRY, "--out", out)
    assert other.returncode == 2
    msg = _one_error(other, "error:")
    assert str(out / "tries.jsonl") in msg and "another run" in msg and "'random'" in msg and "--fresh" in msg
    assert not (out / "run.json").exists() and (out / "tries.jsonl").read_bytes() == tries_before

    same = _py("eval.run", "--model", "random", *ONE_TRY, "--out", out)
    assert same.returncode == 0, same.stderr[-2000:]
    assert "run.json was missing: written again" in same.stderr
    ident = {k: v for k, v in json.loads(kept).items() if k not in ("environment", "request")}
    assert {k: v for k, v in json.loads((out / "run.json").read_text()).items()
            if k not in ("environment", "request")} == ident
    assert (out / "tries.jsonl").read_bytes() == tries_before  # nothing run again


def test_a_run_json_of_another_run_does_not_vouch_for_the_records(tmp_path, random_run):
    """run.json replaced by another run's: the records still say whose they are."""
    out = _copy(random_run, tmp_path)
    rj = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**rj, "model": "hold", "run_identity": "0" * 16}))
    msg = _one_error(_py("eval.run", "--model", "hold", *ONE_TRY, "--out", out), "error:")
    assert "line 1" in msg and "another run" in msg, msg


def test_records_from_before_run_identities_without_run_json_are_refused(tmp_path, random_run):
    out = _copy(random_run, tmp_path)
    rec = json.loads((out / "tries.jsonl").read_text())
    del rec["run_identity"]
    (out / "tries.jsonl").write_text(json.dumps(rec) + "\n")
    (out / "run.json").unlink()
    msg = _one_error(_py("eval.run", "--model", "random", *ONE_TRY, "--out", out), "error:")
    assert str(out) in msg and "no run.json" in msg and "restore run.json" in msg, msg
    assert not (out / "run.json").exists()


@pytest.mark.parametrize("change, needle", [
    (lambda rj: [rj], "expected a JSON object"),
    (lambda rj: {**rj, "predicate": "2"}, "'predicate' is \"2\""),
    (lambda rj: {**rj, "options": ["x"]}, "'options' is [\"x\"]"),
    (lambda rj: {**rj, "sampler": "v3"}, "'sampler'"),  # a run.json of another release's settings
])
def test_a_damaged_or_foreign_run_json_is_named_on_resume(tmp_path, random_run, change, needle):
    out = _copy(random_run, tmp_path)
    (out / "run.json").write_text(json.dumps(change(json.loads((out / "run.json").read_text()))))
    msg = _one_error(_py("eval.run", "--model", "random", *ONE_TRY, "--out", out), "error:")
    assert needle in msg and ("run.json" in msg or str(out) in msg) and "--fresh" in msg, msg


# ---------------------------------------------------------------------------------------------------------------
# 3. the page and the report type-check summary.json and run.json; pages are written whole or not at all
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("damage, field", [
    (lambda s: s.update(S="0.5"), "'S'"),
    (lambda s: s["setups"]["A01"].update(k=float("nan")), "'setups.A01.k' is NaN"),
    (lambda s: s["setups"]["A01"].update(n=-1), "'setups.A01.n'"),
    (lambda s: s["secondary"]["latency_ms"].update(p50="fast"), "'secondary.latency_ms.p50'"),
    (lambda s: s.update(n_tries=None), "'n_tries'"),
    (lambda s: s["groups"]["Clearance"].update(ci=[0.1]), "'groups.Clearance.ci'"),
])
def test_a_damaged_summary_field_is_named_by_the_page_and_the_rebuild(tmp_path, random_run, damage, field):
    out = _copy(random_run, tmp_path)
    s = json.loads((out / "summary.json").read_text())
    damage(s)
    (out / "summary.json").write_text(json.dumps(s))
    report_before = (out / "REPORT.md").read_bytes()
    for proc in (_py("eval.site", "--runs", out, "--out", tmp_path / "site", "--n-boot", 50),
                 _py("eval.report", "--rebuild", out)):
        msg = _one_error(proc)
        assert str(out / "summary.json") in msg and field in msg, msg
    assert not (tmp_path / "site" / "index.html").exists()
    assert (out / "REPORT.md").read_bytes() == report_before


def test_a_damaged_run_json_is_named_by_the_page(tmp_path, random_run):
    out = _copy(random_run, tmp_path)
    rj = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**rj, "options": "fast"}))
    msg = _one_error(_py("eval.site", "--runs", out, "--out", tmp_path / "site", "--n-boot", 50))
    assert str(out / "run.json") in msg and "'options'" in msg, msg


def test_a_page_that_cannot_be_written_leaves_no_partial_file(tmp_path, random_run):
    site = tmp_path / "site"
    (site / "index.html").mkdir(parents=True)  # os.replace onto a folder fails, as a full disk's write would
    proc = _py("eval.site", "--runs", random_run, "--out", site, "--n-boot", 50)
    assert "index.html" in _one_error(proc)
    assert sorted(p.name for p in site.iterdir()) == ["index.html"]


# ---------------------------------------------------------------------------------------------------------------
# 4. a locale that cannot print a name: no traceback, files in UTF-8
# ---------------------------------------------------------------------------------------------------------------
NAME = "mod\u00e8le\u2013\u03b1\u00b1"


@pytest.mark.parametrize("locale", sorted(LOCALES))
def test_report_and_page_print_under_any_locale_and_write_utf8(tmp_path, locale):
    tries = _write(tmp_path / "run" / "tries.jsonl", [_record(s, model=NAME) for s in SCORED_IDS])
    rep = _py("eval.report", "--tries", tries, "--out", tmp_path / "run", "--n-boot", 50, env=LOCALES[locale])
    assert rep.returncode == 0 and "Traceback" not in rep.stderr, rep.stderr[-2000:]
    assert "report written to" in rep.stdout and "mod?le" in rep.stdout
    assert NAME in (tmp_path / "run" / "REPORT.md").read_text(encoding="utf-8")
    site = _py("eval.site", "--runs", tmp_path / "run", "--out", tmp_path / "site", "--n-boot", 50,
               env=LOCALES[locale])
    assert site.returncode == 0 and "Traceback" not in site.stderr, site.stderr[-2000:]
    assert NAME in (tmp_path / "site" / "index.html").read_text(encoding="utf-8")


def test_run_prints_a_path_its_locale_cannot_encode(tmp_path, random_run_proc):
    run, first = random_run_proc  # the fresh run, into NAME_PATH, with an ASCII stdout/stderr (the fixture)
    assert run.name == NAME_PATH and first.args[first.args.index("--out") + 1] == str(run)
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr[-2000:]
    assert "report in" in first.stdout
    out = _copy(run, tmp_path, NAME_PATH)  # the shared folder stays as it was
    again = _py("eval.run", "--model", "random", *ONE_TRY, "--out", out, env=LOCALES["C"])  # resumes: prints again
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr[-2000:]
    assert "report in" in again.stdout and (out / "REPORT.md").is_file()


# ---------------------------------------------------------------------------------------------------------------
# 5. --replay-latency files
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, content, needle", [
    ("profile.json", b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not UTF-8"),
    ("tries.jsonl", b"\x89PNG\r\n\x1a\n\x00\xff\xfe\n", "not UTF-8"),
    ("profile.json", b'{"p50": 3.0}', "summary.json keeps percentiles only"),
    ("profile.json", b"[1.0, NaN]", "non-finite"),
    ("profile.json", b'[1.0, "2"]', "JSON list of ms"),
    ("profile.json", b"[]", "no per-query latencies"),
    ("tries.jsonl", b'{"setup": "A01", "try": 0, "success": false, "infer_ms": ["x"]}\n', "'infer_ms[0]'"),
])
def test_a_bad_latency_profile_is_named_before_any_scene(tmp_path, name, content, needle):
    prof = tmp_path / name
    prof.write_bytes(content)
    proc = _py("eval.run", "--model", "hold", *ONE_TRY, "--replay-latency", prof, "--out", tmp_path / "out")
    msg = _one_error(proc, "error:")
    assert proc.returncode == 2 and str(prof) in msg and needle in msg, msg
    assert not (tmp_path / "out" / "run.json").exists()


def test_a_published_latency_is_the_specs_orin_ms_per_query(tmp_path):
    """``published:LABEL`` replays the spec's own Orin number (section 8), read from its text: octo-small-1.5's
    327.8 ms holds each action back 6 control steps; the run names the label, not a copied number."""
    from eval.latency_replay import CONTROL_PERIOD_MS, ReplayLatencyPolicy, published_profile
    from eval.site.published import orin_ms_per_query
    from tests.conftest import REPO_ROOT

    published = orin_ms_per_query()
    spec = (REPO_ROOT / "docs" / "BENCHMARK.md").read_text()
    for label in ("octo-small-1.5", "octo-base-1.5"):
        assert f"{label} {published[label]:g} ms/query" in " ".join(spec.split())
    assert published["bc-state"] == 1.4
    profile = published_profile("published:octo-small-1.5", published)
    assert profile.tolist() == [327.8]

    class Forward:  # the same action every step
        name, track, observes = "forward", "reference", "state"

        def reset(self, instruction, seed=None):  # as bc-camera: it knows its instructions, and "" is none
            if not instruction:
                raise ValueError("no instruction")

        def query(self, observation): return np.array([1, 0, 0, 0, 0, 0, -1], dtype=np.float32)

        def reads_observation(self, step): return True

        def record_fields(self): return {}

    wrapped = ReplayLatencyPolicy(Forward(), profile)  # the loop resets it with the try's instruction
    wrapped.reset("put the circle block into the circle hole", seed=0)
    moved = [bool(wrapped.act({})[0]) for _ in range(10)]
    assert moved == [False] * 6 + [True] * 4 and 327.8 / CONTROL_PERIOD_MS > 6
    proc = _py("eval.run", "--model", "hold", *ONE_TRY, "--max-steps", "5", "--replay-latency",
               "published:octo-base-1.5", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "run.json").read_text())["options"]["replay_latency"] == \
        "published:octo-base-1.5"
    proc = _py("eval.run", "--model", "hold", *ONE_TRY, "--replay-latency", "published:gpt-9", "--out",
               tmp_path / "bad")
    msg = _one_error(proc, "error:")
    assert proc.returncode == 2 and "publishes no ms/query of 'gpt-9'; it does of: " in msg and "octo-small-1.5" in msg
    assert not (tmp_path / "bad" / "run.json").exists()
