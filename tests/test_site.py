"""The results page (eval/site/): ranking rules, bad input, the published numbers as the spec prints them,
the page's content, and the page in headless Chromium at 1400 and 500 px.

The Chromium tests load the page built from every committed run under results/ (Debian package
`chromium`; `.ci/run` installs it where apt is available) and skip with their reason where it is absent.
"""
import json
import re
import struct
import subprocess
import sys
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from env.setups import GROUPS, SCORED_IDS, group_of
from eval.report.plots import SUCCESS_BINS
from eval.report.summary import build_summary
from eval.site import build_site, leaderboard, load_runs, main, read_published, run_status
from eval.site.browser import chromium, measure
from eval.site.cli import SCREENSHOTS
from eval.site.render import cell_title, colour
from eval.site.runs import find_runs
from eval.site.spec import SPEC_FILE, SpecError, read_spec, setups_table
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


@pytest.mark.parametrize("how", ["summary", "run_json"])
def test_a_smoke_run_cut_by_max_steps_is_never_ranked_and_says_so(how):
    summary = {**_summary("frozen"), "max_steps": 12} if how == "summary" else _summary("frozen")
    rj = {"options": {"max_steps": 12}} if how == "run_json" else {"options": {}}
    st = run_status(summary, rj)  # complete, test split, frozen: would be ranked
    assert not st["ranked"] and st["latency_only"] and st["section"] == "latency_only"
    assert st["text"] == "never ranked: tries cut at 12 control steps (--max-steps): a smoke run, success meaningless"


@pytest.mark.parametrize("profile,shown", [("published:octo-small-1.5", "published:octo-small-1.5"),
                                           ("/runs/orin/tries.jsonl", "tries.jsonl")])
def test_a_run_with_a_replayed_latency_is_never_ranked_and_says_so(profile, shown):
    st = run_status(_summary("frozen"), {"options": {"replay_latency": profile}})  # would be ranked without it
    assert not st["ranked"] and st["section"] == "latency_replay"
    assert st["text"] == (f"not a result: every action delayed by the latency profile {shown} (--replay-latency): "
                          f"what a device's delay does")


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
    assert not st["ranked"] and st["section"] == "example" and "dev split" in st["text"]


def test_variants_and_other_arms_have_their_own_sections():
    mine, other = "aa" * 32, "bb" * 32
    st = run_status({**_summary("adapted"), "weights_sha256": other}, {"options": {"checkpoint": "x"}}, mine)
    assert st["section"] == "variant" and st["variant"] and "not the track's recipe" in st["text"]
    assert run_status({**_summary("adapted"), "weights_sha256": mine}, None, mine)["section"] == "comparison"
    st = run_status({**_summary("reference"), "arm": "xarm6_robotiq"})
    assert st["section"] == "other_arm" and "xarm6_robotiq" in st["text"]


def test_committed_runs_each_in_the_section_of_what_it_is():
    runs, _ = load_runs([RESULTS])
    where = {r.label: r.status["section"] for r in runs}
    assert {k for k, v in where.items() if v == "comparison"} == {"scripted_test", "bc_state_test", "hold_test",
                                                                   "random_test", "bc_camera_test"}
    assert where["bc_state_dagger/test"] == "variant"  # DAgger weights: not the track's recipe
    assert where["scripted_xarm6_test"] == where["scripted_widowx_test"] == "other_arm"
    assert where["orin_cpu/bc_state"] == where["orin_cpu/bc_state_scenes4"] == "example"  # dev split, a few tries
    assert where["orin_cpu/octo_small_random"] == "latency_only"
    assert where["scripted_fullboard_test"] == "full_board"
    assert where["bc_camera_replay/octo-small-1.5"] == where["bc_camera_replay/octo-base-1.5"] == "latency_replay"


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
# The spec and its published numbers
# --------------------------------------------------------------------------
def _section8() -> str:
    return " ".join(read_spec().section("8").body.split())


def test_published_numbers_are_the_spec_text():
    pub = read_published()
    by = {e.label: e for e in pub.entries}
    assert (pub.split, pub.machine, pub.arm, pub.tries_per_setup) == ("test", "Jetson AGX Orin", "panda", 50)
    assert by["scripted"].S == "99.2 [98.7, 99.7]" and by["bc-state"].S == "92.1 [91.1, 92.9]"
    # the bounds a re-drawn bootstrap moved (issue 33): as published
    assert by["bc-state"].groups["Pose and layout"] == "72.8 [68.8, 76.8]"
    assert by["bc-state"].difficulty["hard"] == "81.8 [80.5, 83.1]"
    assert by["bc-state"].difficulty["medium"] == "95.7 [94.3, 97.1]"
    assert by["scripted"].difficulty["hard"] == "98.2 [97.1, 99.1]"
    assert pub.arm_groups["xarm6_robotiq"]["Clearance"] == "94.0 [91.0, 97.0]"
    assert pub.arm_groups["xarm6_robotiq"]["Pose and layout"] == "98.8 [97.2, 100.0]"
    xarm, widowx = by["scripted on xArm6"], by["scripted on WidowX 250s"]
    assert xarm.S is None and widowx.S is None and (xarm.arm, widowx.arm) == ("xarm6_robotiq", "widowx250s")
    assert xarm.setups["F02"] == "12" and widowx.setups["B05"] == "0" and widowx.setups["C01"] == "100"  # "all 100"
    assert (by["octo-base-1.5"].model, by["octo-base-1.5"].ms_per_query, by["octo-base-1.5"].recovery) == (
        "octo-base", "398.6", "0/100")
    assert by["scripted"].full_board["FB02"] == {"kn": "39/50", "blocks": "2.56", "wilson": "64.8-87.2"}
    assert by["openvla-7b"].status == "set up, not tested on this task yet"
    assert by["openvla-oft (LIBERO)"].status == "code written, not tested yet"
    assert pub.tasklist["sha256_prefix"] == "c7ac7a273f63"
    text = _section8()
    quoted = [v for e in pub.entries for v in (e.S, e.recovery, e.recovery_ci, e.drops, e.completion_s,
                                               e.ms_per_query, e.status, *e.groups.values(), *e.difficulty.values(),
                                               *(x for fb in e.full_board.values() for x in fb.values())) if v]
    assert len(quoted) > 90 and all(v in text for v in quoted)


def test_published_per_setup_percentages_in_spec_order():
    """Each setup's published % against the spec's own line, read here group by group ('all 100' included)."""
    pub = read_published()
    raw = read_spec().section("8").body
    sizes = [list(group_of().values()).count(g) for g in GROUPS]
    for e in (x for x in pub.entries if x.setups):
        line = re.search(r"^- %s: (.*(?:\n  .*)*)" % re.escape(e.label), raw, re.M).group(1)
        vals = []
        for part, size in zip(" ".join(line.split()).split(" | "), sizes):
            vals += [part.split()[1]] * size if part.startswith("all") else part.split()
        assert [e.setups[s] for s in SCORED_IDS] == vals, e.label


def test_computed_from_published_numbers():
    from eval.site.published import computed_scores, setup_counts

    pub = read_published()
    by = {e.label: e for e in pub.entries}
    assert setup_counts(pub, by["scripted"])["A04"] == (43, 50)
    assert round(100 * computed_scores(pub, by["scripted"])["S"], 1) == 99.2  # the published S, from its setups
    assert round(100 * computed_scores(pub, by["bc-state"])["S"], 1) == 92.1
    assert round(100 * computed_scores(pub, by["scripted on xArm6"])["S"], 1) == 95.0


@pytest.mark.parametrize("change", ["sentence", "setup_name"])
def test_a_spec_that_says_otherwise_is_a_one_line_error(tmp_path, change, capsys):
    text = SPEC_FILE.read_text()
    if change == "sentence":
        bad = re.sub(r"Recovery ranges are\s+Wilson:", "Recovery ranges:", text)
    else:
        bad = text.replace("| A02 | clearance loose |", "| A02 | clearance wide |")
    assert bad != text
    spec = tmp_path / "BENCHMARK.md"
    spec.write_text(bad)
    with pytest.raises(SpecError) as e:
        read_published(spec) if change == "sentence" else setups_table(read_spec(spec))
    assert str(spec) in str(e.value) and "\n" not in str(e.value)
    make_run(tmp_path / "run", "scripted", "reference")
    rc = main(["--runs", str(tmp_path / "run"), "--out", str(tmp_path / "site"), "--spec", str(spec)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and str(spec) in err and "Traceback" not in err


def test_spec_sections_shown_as_written():
    from eval.site.spec import markdown_html

    html = markdown_html("Intro:\n- one `code`\n  more\n- two\n\n| a | b |\n|---|---|\n| **x** | y |\n\n1. first\n")
    assert html == ('<p>Intro:</p><ul><li>one <code>code</code> more</li><li>two</li></ul><div class="scroll">'
                    '<table class="spec"><tr><th class=l>a</th><th class=l>b</th></tr><tr><td class=l><b>x</b></td>'
                    '<td class=l>y</td></tr></table></div><ol><li>first</li></ol>')
    rows = setups_table(read_spec())
    assert len(rows) == 30 and rows[3]["Change from A01"] == "clearance 0.5 mm"


# --------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------
def test_cell_title_and_colour_scale_separates_90_to_100():
    iv = wilson(47, 50)
    assert cell_title(47, 50, [iv.low, iv.high]) == f"47/50 [{100 * iv.low:.1f}, {100 * iv.high:.1f}]"
    assert len({colour(x)[0] for x in (0.90, 0.94, 0.97, 1.0)}) == 4
    assert colour(0.5) != colour(0.9)
    assert colour(0.999)[0] == SUCCESS_BINS[1][1] != colour(1.0)[0]  # exactly 100 has its own colour


class PageMarks(HTMLParser):
    """The page's text by mark: published numbers (class pv), computed ones (cv), names (nm), and text in a
    published data cell (a td of class pub, or in a row of class pub) outside the three."""
    VOID = {"br", "meta", "img", "hr", "input", "link", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, set, int | None]] = []
        self.marked: list[dict] = []  # {kind, title, text}
        self.bare: list[str] = []
        self.pub_cell_titles: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = set((a.get("class") or "").split())
        if tag == "td" and {"c", "pub"} <= cls and a.get("title"):
            self.pub_cell_titles.append(a["title"])
        if tag in self.VOID:
            return
        idx = None
        if cls & {"pv", "cv"}:
            idx = len(self.marked)
            self.marked.append({"kind": "pv" if "pv" in cls else "cv", "title": a.get("title") or "", "text": ""})
        self.stack.append((tag, cls, idx))

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        for _, cls, idx in reversed(self.stack):
            if idx is not None:
                self.marked[idx]["text"] += data
                return
            if "nm" in cls:
                return
        cells = [(tag, cls) for tag, cls, _ in self.stack if tag in ("td", "tr")]
        if any("pub" in cls for _, cls in cells) and any(tag == "td" for tag, _ in cells):
            self.bare.append(data)  # a published data cell (headers are labels)


def page_marks(html: str) -> PageMarks:
    p = PageMarks()
    p.feed(html)
    return p


def test_every_published_number_on_the_page_is_quoted_verbatim():
    """Done when (issue 33): every published number on the page is found, verbatim, in docs/BENCHMARK.md
    section 8; a number computed from published ones carries its label."""
    html = (RESULTS / "site" / "index.html").read_text()
    marks = page_marks(html)
    text = _section8()
    quoted = [m for m in marks.marked if m["kind"] == "pv"]
    assert len(quoted) > 250
    for m in quoted:
        assert " ".join(m["text"].split()) in text, m["text"]
    computed = [m for m in marks.marked if m["kind"] == "cv"]
    assert computed  # the xArm6 and WidowX S: none is published
    for m in computed:
        assert m["text"].rstrip().endswith("computed") and m["title"].startswith("computed: "), m
    assert marks.pub_cell_titles and all(t.startswith("computed: ") for t in marks.pub_cell_titles)
    loose = [s for s in marks.bare if re.search(r"\d", s)]
    assert not loose, loose[:5]  # every number in a published cell is quoted or labelled computed
    for moved in ("[68.8, 76.4]", "[80.7, 82.9]", "[94.2, 97.1]", "[96.9, 99.1]", "[91.0, 96.5]", "[97.6, 100.0]"):
        assert moved not in html  # the re-drawn bounds the old page showed


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
    assert len(shown) >= 3 and all("latency only" in s for s in shown)
    lb = html[html.index('id="leaderboard"'):html.index('id="groups"')]
    assert "What a ranked row needs" in lb and "--model octo-small --split test" in lb and "openvla-7b" in lb
    assert 'data-run="octo_rand"' not in lb and 'data-run="bc_part"' not in lb  # own sections, not the board
    # a heatmap cell: k/n with its Wilson range on hover
    m = re.search(r'<td class="c[^"]*" style="[^"]*" title="(3/4 [^"]*)"', html)
    k, n, lo, hi = TITLE_RE.match(unescape(m.group(1))).groups()
    iv = wilson(3, 4)
    assert (lo, hi) == (f"{100 * iv.low:.1f}", f"{100 * iv.high:.1f}")
    assert 'id="paired-table"' not in html  # only one complete run with tries beside the random-weights one
    for text in ("Task-list sha256", SHA, "Success predicate", "v2", "Command line",
                 "python -m eval.run --model scripted --split test --setups all --tries 50"[:60],
                 "Change from A01", "Known limits", "Models and status"):
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
    assert r.returncode == 0 and "--runs" in r.stdout and "--spec" in r.stdout


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


def test_committed_page_is_the_page_its_command_builds(tmp_path):
    """results/site/index.html is what `python -m eval.site --runs results --out results/site` writes now."""
    r = subprocess.run([sys.executable, "-m", "eval.site", "--runs", "results", "--out", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "site" / "index.html").read_bytes() == (RESULTS / "site" / "index.html").read_bytes(), (
        "rebuild it: python -m eval.site --runs results --out results/site --screenshots docs")


# --------------------------------------------------------------------------
# Headless Chromium
# --------------------------------------------------------------------------
def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", data[16:24])


def test_committed_screenshots_of_the_page():
    """docs/ holds the page at 1400 and 500 px (python -m eval.site ... --screenshots docs)."""
    for name, width, height in SCREENSHOTS:
        path = ROOT / "docs" / name
        assert path.is_file(), f"{path} is missing: python -m eval.site --runs results --out results/site " \
                               "--screenshots docs"
        assert _png_size(path) == (width, height) and path.stat().st_size > 20_000  # a drawn page


@pytest.fixture(scope="module")
def built_page(tmp_path_factory):
    if chromium() is None:
        pytest.skip("chromium not installed (Debian package `chromium`; .ci/run installs it where apt is available)")
    site, _ = build_site([RESULTS], tmp_path_factory.mktemp("site"), n_boot=200)
    return site


@pytest.mark.browser
@pytest.mark.parametrize("width", [1400, 500])
def test_page_in_headless_chromium(built_page, width):
    """Done when (issue 33): at 1400 and 500 px no page-wide sideways scroll, the leaderboard's score on screen
    without scrolling its table, no console line."""
    r = measure(built_page, width)
    assert not r.console, r.console  # the page logs nothing: no errors, no warnings
    assert r.probe["ready"] == "1"  # the page's script ran to its end
    assert r.probe["innerWidth"] == width and r.probe["scrollWidth"] <= r.probe["innerWidth"], r.probe
    for key, pattern in (("score", r"\d+\.\d\[\d+\.\d, \d+\.\d\]"), ("published_score", r"\d+\.\d.*")):
        sc = r.probe[key]
        assert 0 <= sc["left"] and sc["right"] <= min(width, sc["boxRight"]) and sc["left"] >= sc["boxLeft"], sc
        assert re.fullmatch(pattern, sc["text"]), sc  # a score, not an empty cell
    dom = r.dom
    # every run's S, with the value of its summary.json
    found, _ = find_runs(RESULTS)
    for f in found:
        s = json.loads((f / "summary.json").read_text())
        if s.get("S") is None:
            continue
        m = re.search(r'data-s="%s">([^<]*)<' % re.escape(str(s["S"])), dom)
        assert m, f
        assert m.group(1).startswith(f'{100 * s["S"]:.1f}'), (f, m.group(1))
    # one heatmap cell's hover text reads "k/n [lo, hi]" (Wilson 95%, in %)
    heat = dom[dom.index('id="heatmap"'):]
    m = re.search(r'<td class="c[^"]*"[^>]* title="([^"]+)"[^>]*>(\d+)/(\d+)</td>', heat)
    k, n, lo, hi = TITLE_RE.match(unescape(m.group(1))).groups()
    assert (k, n) == (m.group(2), m.group(3))
    iv = wilson(int(k), int(n))
    assert (lo, hi) == (f"{100 * iv.low:.1f}", f"{100 * iv.high:.1f}")
