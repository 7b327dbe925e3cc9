"""The results page (eval/site/): ranking rules, bad input, the page's content, and the page in headless Chromium.

The Chromium test loads the page built from every committed run under results/ (Debian package
`chromium`; `.ci/run` installs it where apt is available) and skips with its reason where it is absent.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

from env.setups import SCORED_IDS
from eval.report.summary import build_summary
from eval.site import build_site, leaderboard, load_published, load_runs, main, run_status
from eval.site.render import cell_title, colour
from eval.site.runs import find_runs
from eval.stats import wilson

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
SHA = "cd" * 32
TITLE_RE = re.compile(r"^(\d+)/(\d+) \[(\d+\.\d), (\d+\.\d)\]$")


# --------------------------------------------------------------------------
# Synthetic run folders
# --------------------------------------------------------------------------
def _records(model, track, *, tries=4, k_of=None, skip=(), note=None, split="test"):
    recs = []
    for i, sid in enumerate(SCORED_IDS):
        if sid in skip:
            continue
        k = (k_of or {}).get(sid, tries)
        for t in range(tries):
            recs.append({"setup": sid, "try": t, "success": t < k, "model": model, "track": track,
                         "split": split, "arm": "panda", "tasklist_sha256": SHA, "predicate": 2, "seed": 1000 * i + t,
                         "machine": {"cpu": "Test CPU", "cores": "2"}, "note": note, "infer_ms": [1.0 + t, 2.0],
                         "disturbance_fired": sid == "F03", "time_s": 5.0})
    return recs


def make_run(folder, model, track, *, run_options=None, **kw):
    recs = _records(model, track, **kw)
    folder.mkdir(parents=True)
    (folder / "tries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    summary = build_summary(recs, model=model, n_boot=50, seed=0)
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "run.json").write_text(json.dumps({"model": model, "split": "test", "arm": "panda",
                                                 "options": run_options or {}, "predicate": 2}))
    return summary


def _summary(track="frozen", *, n=50, missing=(), short=None, note=None, split="test"):
    setups = {sid: {"k": 0, "n": 0 if sid in missing else (short[1] if short and sid == short[0] else n)}
              for sid in SCORED_IDS}
    return {"model": "m", "track": track, "split": split, "note": note, "n_tries": sum(e["n"] for e in setups.values()),
            "complete": not missing, "S": None if missing else 0.5, "setups": setups, "full_board": {}}


# --------------------------------------------------------------------------
# Ranking rules
# --------------------------------------------------------------------------
def test_frozen_complete_test_run_with_real_weights_is_ranked():
    st = run_status(_summary("frozen"), {"options": {}})
    assert st["ranked"] and st["section"] == "ranked" and st["incomplete"] is None


@pytest.mark.parametrize("how", ["note", "run_json"])
def test_random_weights_never_ranked_and_labelled_latency_only(how):
    note = "random weights: latency only, success meaningless" if how == "note" else None
    rj = {"options": {"random_weights": True}} if how == "run_json" else {"options": {}}
    st = run_status(_summary("frozen", note=note), rj)  # complete, test split, frozen: would be ranked
    assert not st["ranked"] and st["latency_only"] and st["section"] == "latency_only"
    assert "latency only" in st["text"]


def test_incomplete_runs_marked_k_of_n_tries_per_setup():
    st = run_status(_summary("frozen", missing=("B05", "C01")))
    assert not st["ranked"] and st["section"] == "incomplete"
    assert st["incomplete"].startswith("Incomplete: 0 of 50 tries per setup")
    assert "2 of 30 setups without tries" in st["incomplete"]
    st = run_status(_summary("frozen", short=("A03", 12)))  # every setup has tries, one has fewer
    assert st["incomplete"] == "Incomplete: 12 of 50 tries per setup" and not st["ranked"]


def test_other_tracks_and_splits_are_shown_not_ranked():
    for track in ("reference", "adapted", "sanity"):
        st = run_status(_summary(track))
        assert not st["ranked"] and st["section"] == "comparison" and f"{track} track" in st["text"]
    st = run_status(_summary("frozen", split="dev"))
    assert not st["ranked"] and "dev split" in st["text"]


def test_leaderboard_order_and_ties(tmp_path):
    make_run(tmp_path / "a", "octo-small", "frozen", k_of={"A01": 2})
    make_run(tmp_path / "b", "octo-base", "frozen", k_of={"A01": 2})
    make_run(tmp_path / "c", "openvla", "frozen")
    make_run(tmp_path / "d", "scripted", "reference")
    make_run(tmp_path / "e", "octo-small", "frozen", note="random weights: latency only, success meaningless")
    runs, _ = load_runs([tmp_path])
    board = leaderboard(runs)
    ranked = [(rank, r.label) for rank, r in board["ranked"]]
    assert ranked == [(1, "c"), (2, "a"), (2, "b")]  # equal S, equal rank
    assert [r.label for _, r in board["comparison"]] == ["d"]
    assert [r.label for _, r in board["latency_only"]] == ["e"]
    assert [r.label for r in runs] == ["c", "a", "b", "d", "e"]  # the page's order everywhere


# --------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------
def test_cell_title_and_colour_scale_separates_90_to_100():
    iv = wilson(47, 50)
    assert cell_title(47, 50, [iv.low, iv.high]) == f"47/50 [{100 * iv.low:.1f}, {100 * iv.high:.1f}]"
    assert len({colour(x)[0] for x in (0.90, 0.94, 0.97, 1.0)}) == 4
    assert colour(0.5) != colour(0.9)


def test_published_numbers_match_spec_section_8():
    pub = load_published()
    by_id = {e["id"]: e for e in pub["entries"]}
    scripted = by_id["scripted"]
    assert scripted["S"] == 0.992 and round(100 * scripted["derived"]["S"], 1) == 99.2  # per-setup % agree with S
    assert round(100 * by_id["bc-state"]["derived"]["S"], 1) == 92.1
    assert scripted["setups"]["A04"]["k"] == 43 and by_id["bc-state"]["setups"]["F02"]["k"] == 0
    assert by_id["scripted-widowx"]["setups"]["B05"]["k"] == 0
    assert scripted["full_board"]["FB02"] == {**scripted["full_board"]["FB02"], "k": 39, "n": 50}
    assert by_id["octo-small-1.5"]["ms_per_query"] == 327.8


def test_page_from_synthetic_runs(tmp_path):
    make_run(tmp_path / "runs" / "scripted", "scripted", "reference", k_of={"A04": 3})
    make_run(tmp_path / "runs" / "octo_rand", "octo-small", "frozen", tries=2,
             note="random weights: latency only, success meaningless", run_options={"random_weights": True})
    make_run(tmp_path / "runs" / "bc_part", "bc-state", "adapted", skip=("G02",))
    path, notes = build_site([tmp_path / "runs"], tmp_path / "site", n_boot=50)
    html = path.read_text()
    assert "http://" not in html and "https://" not in html  # self-contained: nothing fetched
    assert "published (Orin)" in html and "here" in html
    assert "Incomplete: 0 of 4 tries per setup (1 of 30 setups without tries)" in html
    # the random-weights run is labelled latency only in every section that shows it
    sections = re.split(r"<h2 ", html)[1:]
    shown = [s for s in sections if "octo_rand" in s]
    assert len(shown) >= 5 and all("latency only" in s for s in shown)
    lb = html[html.index('id="leaderboard-table"'):html.index("</table>", html.index('id="leaderboard-table"'))]
    assert "Never ranked" in lb and "No frozen-track run here yet" in lb
    # a heatmap cell: k/n with its Wilson range on hover
    m = re.search(r'<td class="c[^"]*" style="[^"]*" title="(3/4 [^"]*)"', html)
    k, n, lo, hi = TITLE_RE.match(unescape(m.group(1))).groups()
    iv = wilson(3, 4)
    assert (lo, hi) == (f"{100 * iv.low:.1f}", f"{100 * iv.high:.1f}")
    assert 'id="paired-table"' not in html  # only one complete run with tries beside the random-weights one
    for text in ("Task-list sha256", SHA, "Success predicate", "v2", "Command line",
                 "python -m eval.run --model scripted --split test --setups all --tries 4"):
        assert text in html
    assert 'id="latency-cdf"' in html and "Test CPU, 2 cores" in html


def test_paired_differences_when_runs_share_a_task_list(tmp_path):
    make_run(tmp_path / "a", "scripted", "reference")
    make_run(tmp_path / "b", "bc-state", "adapted", k_of={"B05": 0})
    html = build_site([tmp_path / "a", tmp_path / "b"], tmp_path / "site", n_boot=50)[0].read_text()
    assert 'id="paired-table"' in html and "a − b" in html


@pytest.mark.parametrize("case", ["missing", "no_summary", "bad_json", "comparison", "empty_tree"])
def test_bad_input_one_line_and_nonzero_exit(tmp_path, case, capsys):
    d = tmp_path / "run"
    if case != "missing":
        d.mkdir()
    if case == "bad_json":
        (d / "summary.json").write_text("{not json")
    if case == "comparison":
        (d / "summary.json").write_text(json.dumps({"models": {"a": {}}, "paired": {}}))
    if case == "empty_tree":
        (d / "sub").mkdir()
    rc = main(["--runs", str(d), "--out", str(tmp_path / "site")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert str(d) in err


def test_cli_help_runs_as_module():
    r = subprocess.run([sys.executable, "-m", "eval.site", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "--runs" in r.stdout


def test_committed_page_shows_every_committed_run():
    page = RESULTS / "site" / "index.html"
    assert page.is_file(), "results/site/index.html is missing: python -m eval.site --runs results --out results/site"
    assert page.stat().st_size < 3_000_000
    html = page.read_text()
    found, _ = find_runs(RESULTS)
    assert found
    for f in found:
        label = str(f.relative_to(RESULTS))
        s = json.loads((f / "summary.json").read_text())
        assert f'data-run="{label}"' in html or f'>{label}<' in html, label
        if s.get("S") is not None:
            assert f'data-s="{s["S"]}"' in html, label


# --------------------------------------------------------------------------
# Headless Chromium
# --------------------------------------------------------------------------
def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def test_page_in_headless_chromium(tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium not installed (Debian package `chromium`; .ci/run installs it where apt is available)")
    site, _ = build_site([RESULTS], tmp_path / "site", n_boot=200)
    url = site.resolve().as_uri()
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    env = {**os.environ, "DBUS_SESSION_BUS_ADDRESS": "disabled:"}
    r = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    console = [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]
    assert not console, console  # the page logs nothing: no errors, no warnings
    dom = r.stdout
    assert 'data-ready="1"' in dom  # the page's script ran to its end
    # every run's S, with the value of its summary.json
    found, _ = find_runs(RESULTS)
    for f in found:
        s = json.loads((f / "summary.json").read_text())
        if s.get("S") is None:
            continue
        m = re.search(r'data-s="%s">([^<]*)<' % re.escape(str(s["S"])), dom)
        assert m, f
        assert m.group(1).startswith(f'{100 * s["S"]:.1f} ['), (f, m.group(1))
    # one heatmap cell's hover text reads "k/n [lo, hi]" (Wilson 95%, in %)
    heat = dom[dom.index('id="heatmap"'):]
    m = re.search(r'<td class="c[^"]*"[^>]* title="([^"]+)"[^>]*>(\d+)/(\d+)</td>', heat)
    k, n, lo, hi = TITLE_RE.match(unescape(m.group(1))).groups()
    assert (k, n) == (m.group(2), m.group(3))
    iv = wilson(int(k), int(n))
    assert (lo, hi) == (f"{100 * iv.low:.1f}", f"{100 * iv.high:.1f}")
    shot = tmp_path / "page.png"
    r = subprocess.run(base + ["--window-size=1400,1800", f"--screenshot={shot}", url], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0 and shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", r.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank one
