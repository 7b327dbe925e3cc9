"""Tests of the eval/report/ package (spec BENCHMARK.md sections 2, 5, 6 and 8).

Synthetic runs are built from the spec's section-8 published per-setup
results (50 tries per setup, successes = the published % of 50).
"""
import csv
import json
import math
import re
from pathlib import Path

import pytest

from env.setups import FULL_BOARD_IDS, GROUPS, SCORED_IDS
from eval.report import ReportError, build_summary, load_tries, main, paired_summary, write_report

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"

# Spec section 8: per-setup success in %, 50 tries each, order A01..G02.
PUBLISHED = {
    "scripted": "100 100 100 86 | 100 100 100 100 98 | 100 100 100 98 100 | 100 100 100 100 100 | "
                "100 100 100 100 | 100 100 100 100 100 | 100 98",
    "bc-state": "100 100 100 98 | 84 96 88 84 12 | 96 98 100 100 100 | 100 100 100 100 100 | "
                "98 100 100 100 | 100 0 96 100 98 | 96 94",
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DISTURBED = {"F03", "F04", "F05", "G02"}


def published_records(model, full=True, tries=50):
    pcts = [int(x) for x in PUBLISHED[model].replace("|", " ").split()]
    assert len(pcts) == len(SCORED_IDS) == 30
    recs = []
    for sid, pct in zip(SCORED_IDS, pcts):
        k = pct * tries // 100
        for t in range(tries):
            ok = t < k
            rec = {"setup": sid, "try": t, "success": ok}
            if full:
                rec.update(
                    v=1, seed=1000 * SCORED_IDS.index(sid) + t, split="test", model=model,
                    track="reference" if model == "scripted" else "adapted", arm="panda", target="square",
                    flags=[] if ok else (["rim"] if t % 2 else []), dropped=False, steps=150 if ok else 300,
                    time_s=7.5 if ok else 15.0, blocks_inserted=int(ok), infer_ms=[0.2, 0.3],
                    disturbance="shove" if sid in DISTURBED else None, disturbance_fired=sid in DISTURBED,
                    machine={"device": "Jetson AGX Orin", "cpu": "ARMv8"}, tasklist_sha256="ab" * 32,
                )
            recs.append(rec)
    return recs


def full_board_records(model="scripted"):
    recs = []
    for sid, k, blocks_fail in (("FB01", 48, 2), ("FB02", 39, 1), ("FB03", 38, 2)):
        for t in range(50):
            recs.append({"setup": sid, "try": t, "success": t < k, "model": model,
                         "blocks_inserted": 3 if t < k else blocks_fail})
    return recs


def write_jsonl(path, records, torn=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        if torn:
            f.write('{"setup": "A01", "try": 9')
    return path


@pytest.fixture(scope="module")
def two_model_report(tmp_path_factory):
    base = tmp_path_factory.mktemp("report")
    a = write_jsonl(base / "scripted" / "tries.jsonl", published_records("scripted"), torn=True)
    b = write_jsonl(base / "bc" / "tries.jsonl", published_records("bc-state"))
    out = base / "out"
    res = write_report([str(a), str(b)], out, n_boot=500)
    return out, res


# ---------------------------------------------------------------------------
# Scores against the published numbers
# ---------------------------------------------------------------------------
def test_published_S_at_default_redraws():
    s = build_summary(published_records("scripted"))  # default n_boot=5000, seed=0
    assert round(100 * s["S"], 1) == 99.2
    assert [round(100 * x, 1) for x in s["S_ci"]] == [98.7, 99.7]
    assert s["complete"] and s["missing"] == []
    assert s["model"] == "scripted" and s["track"] == "reference" and s["split"] == "test"
    assert s["machine"] == {"device": "Jetson AGX Orin", "cpu": "ARMv8"}
    assert s["tasklist_sha256"] == "ab" * 32
    assert s["bootstrap"]["n_boot"] == 5000
    b = build_summary(published_records("bc-state"))
    assert round(100 * b["S"], 1) == 92.1
    assert [round(100 * x, 1) for x in b["S_ci"]] == [91.1, 92.9]


def test_summary_structure_and_fractions():
    s = build_summary(published_records("bc-state"), n_boot=500)
    json.dumps(s, allow_nan=False)
    assert list(s["groups"]) == list(GROUPS)
    assert list(s["difficulty"]) == ["easy", "medium", "hard"]
    assert list(s["setups"]) == list(SCORED_IDS)
    assert s["groups"]["Pose and layout"]["rate"] == pytest.approx(0.728)
    assert s["M"] == pytest.approx(2738 / 3000)
    b05 = s["setups"]["B05"]
    assert (b05["k"], b05["n"], b05["rate"]) == (6, 50, 0.12)
    assert b05["name"] == "far reach" and b05["group"] == "Pose and layout" and b05["difficulty"] == "hard"
    assert 0 < b05["ci"][0] < 0.12 < b05["ci"][1] < 1
    assert b05["flags"]["rim"] == 22 and b05["no_flag_failures"] == 22
    # weakest: F02 (0 %), B05 (12 %), then B01 (84 %, first in table order of the 84 % ties)
    assert [w["setup"] for w in s["weakest"]] == ["F02", "B05", "B01"]
    sec = s["secondary"]
    assert (sec["recovery"]["k"], sec["recovery"]["n"]) == (194, 200)
    assert sec["mean_completion_s"] == pytest.approx(7.5)
    assert sec["latency_ms"]["mean"] == pytest.approx(0.25)
    assert s["full_board"] == {}


# ---------------------------------------------------------------------------
# Two-model report
# ---------------------------------------------------------------------------
def test_two_model_summary_json(two_model_report):
    out, res = two_model_report
    data = json.loads((out / "summary.json").read_text())
    assert set(data) >= {"models", "paired"}
    assert list(data["models"]) == ["scripted", "bc-state"]
    assert data["models"]["scripted"]["n_tries"] == 1500  # torn last line ignored
    (key, p), = data["paired"].items()
    assert p["a"] == "scripted" and p["b"] == "bc-state" and p["shared_tries"] == 1500
    assert p["S"]["diff"] == pytest.approx(data["models"]["scripted"]["S"] - data["models"]["bc-state"]["S"])
    lo, hi = p["S"]["ci"]
    assert lo < p["S"]["diff"] < hi
    assert set(p["groups"]) == set(GROUPS)


def test_two_model_per_config_csv(two_model_report):
    out, _ = two_model_report
    with open(out / "per_config.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:10] == ["model", "setup", "name", "group", "difficulty", "k", "n", "rate",
                                  "wilson_low", "wilson_high"]
    for m in ("scripted", "bc-state"):
        mine = [r for r in rows if r["model"] == m]
        assert len(mine) == 30
        assert [r["setup"] for r in mine] == list(SCORED_IDS)
    f02 = next(r for r in rows if r["model"] == "bc-state" and r["setup"] == "F02")
    assert (f02["k"], f02["n"], float(f02["rate"]), float(f02["wilson_low"])) == ("0", "50", 0.0, 0.0)
    assert float(f02["wilson_high"]) == pytest.approx(0.0713, abs=1e-4)


def test_two_model_report_md(two_model_report):
    out, _ = two_model_report
    md = (out / "REPORT.md").read_text()
    for sid in SCORED_IDS:
        assert f"| {sid} |" in md
    for g in GROUPS:
        assert g in md
    assert "Task list sha256: `" + "ab" * 32 + "`" in md
    assert "## Paired differences" in md and "### scripted - bc-state" in md
    assert "99.2" in md and "92.1" in md
    assert "## Weakest setups" in md and "F02 latency 3" in md
    assert "194/200" in md  # bc-state recovery
    assert "incomplete" not in md
    assert "Full-board" not in md


def test_pngs_valid(two_model_report):
    out, _ = two_model_report
    import matplotlib.image as mpimg

    for name in ("groups.png", "heatmap.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC
        img = mpimg.imread(str(out / name))
        assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 200


# ---------------------------------------------------------------------------
# Minimal, incomplete and full-board inputs
# ---------------------------------------------------------------------------
def test_minimal_records(tmp_path):
    recs = published_records("scripted", full=False)
    assert set(recs[0]) == {"setup", "try", "success"}
    path = write_jsonl(tmp_path / "my-model" / "tries.jsonl", recs)
    res = write_report([str(path)], tmp_path / "out", n_boot=500)
    data = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert data["model"] == res["model"] == "my-model"  # name from the parent folder
    assert round(100 * data["S"], 1) == 99.2
    for key in ("track", "split", "arm", "machine", "tasklist_sha256"):
        assert data[key] is None
    assert data["secondary"]["latency_ms"] is None and data["secondary"]["recovery"]["n"] == 0
    md = (tmp_path / "out" / "REPORT.md").read_text()
    assert "Task list sha256: not recorded" in md
    assert "not recorded" in md  # recovery not recorded
    for name in ("per_config.csv", "groups.png", "heatmap.png"):
        assert (tmp_path / "out" / name).is_file()


def test_missing_setup_incomplete(tmp_path):
    recs = [r for r in published_records("scripted") if r["setup"] != "C03"]
    s = build_summary(recs, n_boot=500)
    assert not s["complete"] and s["missing"] == ["C03"]
    assert s["S"] is None and s["S_ci"] is None and s["M"] is None
    assert s["groups"]["Clutter"]["rate"] is None
    assert s["groups"]["Clearance"]["rate"] == pytest.approx(0.965)
    assert s["setups"]["C03"]["n"] == 0 and s["setups"]["C03"]["rate"] is None
    path = write_jsonl(tmp_path / "run" / "tries.jsonl", recs)
    write_report([str(path)], tmp_path / "out", n_boot=200)
    md = (tmp_path / "out" / "REPORT.md").read_text()
    assert "incomplete: missing setups C03" in md
    board = md.split("## Leaderboard")[1].split("##")[0]
    assert "| n/a | n/a |" in board
    with open(tmp_path / "out" / "per_config.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 30
    c03 = next(r for r in rows if r["setup"] == "C03")
    assert c03["n"] == "0" and c03["rate"] == ""
    assert (tmp_path / "out" / "heatmap.png").read_bytes()[:8] == PNG_MAGIC


def test_full_board_separate(tmp_path):
    base = build_summary(published_records("scripted"), n_boot=500)
    withfb = build_summary(published_records("scripted") + full_board_records(), n_boot=500)
    assert withfb["S"] == base["S"] and withfb["S_ci"] == base["S_ci"] and withfb["M"] == base["M"]
    assert withfb["n_tries"] == 1500
    assert withfb["secondary"] == base["secondary"]
    assert list(withfb["full_board"]) == list(FULL_BOARD_IDS)
    fb1 = withfb["full_board"]["FB01"]
    assert (fb1["k"], fb1["n"]) == (48, 50)
    assert fb1["blocks_inserted_mean"] == pytest.approx((48 * 3 + 2 * 2) / 50)  # 2.96
    assert fb1["ci"][0] < 0.96 < fb1["ci"][1]
    assert not any(sid in withfb["setups"] for sid in FULL_BOARD_IDS)

    path = write_jsonl(tmp_path / "s" / "tries.jsonl", published_records("scripted") + full_board_records())
    write_report([str(path)], tmp_path / "out", n_boot=200)
    md = (tmp_path / "out" / "REPORT.md").read_text()
    assert "## Full-board task (separate, not in S or M)" in md
    assert "| FB02 | full board tight | 39/50 | 78.0 |" in md
    with open(tmp_path / "out" / "per_config.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sum(r["scored"] == "true" for r in rows) == 30
    assert [r["setup"] for r in rows if r["scored"] == "false"] == list(FULL_BOARD_IDS)


# ---------------------------------------------------------------------------
# Paired comparison without shared tries; loading; CLI
# ---------------------------------------------------------------------------
def test_paired_without_shared_tries():
    a = published_records("scripted", full=False, tries=4)
    b = [dict(r, **{"try": r["try"] + 100}) for r in published_records("bc-state", full=False, tries=4)]
    p = paired_summary(a, b, name_a="A", name_b="B", n_boot=100)
    assert p["S"] is None and p["shared_tries"] == 0 and "share no tries" in p["note"]
    # partial overlap: compared on the shared tries, with a note
    b2 = published_records("bc-state", full=False, tries=2)
    p2 = paired_summary(a, b2, name_a="A", name_b="B", n_boot=100)
    assert p2["shared_tries"] == 60 and p2["only_a"] == 60 and p2["S"] is not None
    assert "shared tries only" in p2["note"]
    # same keys but different seeds are not the same tries
    c = [dict(r, seed=1) for r in a]
    d = [dict(r, seed=2) for r in a]
    assert paired_summary(c, d, n_boot=10)["shared_tries"] == 0
    # different task lists: not compared
    e = [dict(r, tasklist_sha256="x") for r in a]
    f = [dict(r, tasklist_sha256="y") for r in a]
    assert "different task lists" in paired_summary(e, f, n_boot=10)["note"]


def test_report_with_unshared_models(tmp_path):
    a = write_jsonl(tmp_path / "a" / "tries.jsonl", published_records("scripted", full=False, tries=2))
    b = write_jsonl(tmp_path / "b" / "tries.jsonl",
                    [dict(r, **{"try": r["try"] + 10}) for r in published_records("bc-state", full=False, tries=2)])
    res = write_report([str(a), str(b)], tmp_path / "out", names=["A", "B"], n_boot=100)
    assert res["paired"]["A - B"]["S"] is None
    md = (tmp_path / "out" / "REPORT.md").read_text()
    assert "### A - B" in md and "share no tries" in md


def test_load_tries(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"setup": "A01", "try": 0, "success": true}\n\n{"setup": "A01", "try": 1, "success": false}\n'
                 '{"setup": "A01", "tr')
    assert [r["try"] for r in load_tries(p)] == [0, 1]
    p.write_text('{"setup": "A01", "try": 0, "success": true}\nnot json\n{"setup": "A01", "try": 1, "success": 0}\n')
    with pytest.raises(ReportError, match="line 2"):
        load_tries(p)
    p.write_text('[1, 2]\n{"setup": "A01", "try": 1, "success": 0}\n')
    with pytest.raises(ReportError, match="line 1 is not a JSON record"):
        load_tries(p)
    with pytest.raises(ReportError, match="no such file"):
        load_tries(tmp_path / "missing.jsonl")


def test_bad_records():
    with pytest.raises(ReportError, match="lacks field 'success'"):
        build_summary([{"setup": "A01", "try": 0}])
    with pytest.raises(ReportError, match="unknown setup"):
        build_summary([{"setup": "Z99", "try": 0, "success": True}])
    with pytest.raises(ReportError, match="duplicate"):
        build_summary([{"setup": "A01", "try": 0, "success": True}] * 2)
    with pytest.raises(ReportError, match="no tries"):
        build_summary([])


def test_cli(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "--tries" in capsys.readouterr().out

    assert main(["--tries", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err

    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1

    path = write_jsonl(tmp_path / "m" / "tries.jsonl", published_records("scripted", full=False, tries=2))
    assert main(["--tries", str(path), "--out", str(tmp_path / "o"), "--name", "a", "--name", "b"]) == 2
    assert "one --name per --tries" in capsys.readouterr().err

    assert main(["--tries", str(path), "--out", str(tmp_path / "o"), "--name", "mine", "--n-boot", "100"]) == 0
    assert "mine: S " in capsys.readouterr().out
    data = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert data["model"] == "mine" and data["bootstrap"]["n_boot"] == 100
    expected = build_summary(published_records("scripted", full=False, tries=2), n_boot=100)["S"]
    assert math.isclose(data["S"], expected)


def test_random_weights_and_incomplete_frozen_runs_are_not_ranked_in_report():
    from eval.report import render_markdown

    note = "random weights: latency only, success meaningless"
    recs = [{"setup": sid, "try": 0, "success": False, "model": "octo-small", "track": "frozen", "note": note,
             "split": "test"} for sid in SCORED_IDS]
    md = render_markdown({"octo-small": build_summary(recs, n_boot=20)})
    row = next(ln for ln in md.splitlines() if ln.startswith("| octo-small |"))
    assert "no (random weights: latency only)" in row and "| yes |" not in row
    recs = [dict(r, note=None) for r in recs if r["setup"] != "G02"]
    md = render_markdown({"octo-small": build_summary(recs, n_boot=20)})
    row = next(ln for ln in md.splitlines() if ln.startswith("| octo-small |"))
    assert "no (incomplete)" in row
    recs.append({"setup": "G02", "try": 0, "success": False, "model": "octo-small", "track": "frozen", "split": "test"})
    md = render_markdown({"octo-small": build_summary(recs, n_boot=20)})
    assert "| frozen | yes |" in md
    # the ranking rules of the results page (eval.report.ranking): a complete run on another split is no result
    dev = [dict(r, split="dev") for r in recs]
    assert "| frozen | no |" in render_markdown({"octo-small": build_summary(dev, n_boot=20)})


# ---------------------------------------------------------------------------
# The pictures, linked and drawn in the results page's colours
# ---------------------------------------------------------------------------
def test_report_links_its_pictures_and_calls_the_latency_one_a_cdf(two_model_report):
    out, _ = two_model_report
    md = (out / "REPORT.md").read_text()
    for name in ("groups.png", "heatmap.png", "latency.png"):
        assert (out / name).is_file() and f"]({name})" in md, name
    assert "Histogram" not in md and "Cumulative distribution (CDF)" in md


def test_rebuild_writes_the_same_report_and_leaves_the_summary(two_model_report, tmp_path):
    import shutil

    from eval.report.write import rebuild_report

    out, _ = two_model_report
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "REPORT.md").write_text("stale\n")
    before = {p.name: p.read_bytes() for p in copy.iterdir() if p.suffix in (".json", ".csv")}
    rebuild_report(copy)
    assert (copy / "REPORT.md").read_text() == (out / "REPORT.md").read_text()  # what write_report wrote
    assert {p.name: p.read_bytes() for p in copy.iterdir() if p.suffix in (".json", ".csv")} == before
    assert main(["--rebuild", str(tmp_path / "nothing")]) == 2


def test_heatmap_colours_are_the_pages_key(tmp_path):
    """Every bin of the results page's key (SUCCESS_BINS) is the colour of its cells in heatmap.png."""
    import matplotlib.image as mpimg
    import numpy as np

    from eval.report.plots import SUCCESS_BINS, plot_heatmap

    pcts = {"A01": 100, "A02": 98, "A03": 96, "A04": 92, "B01": 84, "B02": 70, "B03": 40, "B04": 10}
    recs = [{"setup": sid, "try": t, "success": t < pcts.get(sid, 100) // 2, "arm": "widowx250s"}
            for sid in SCORED_IDS for t in range(50)]
    s = build_summary(recs, model="scripted", n_boot=20)
    plot_heatmap({"scripted": s}, tmp_path / "h.png")
    img = (mpimg.imread(str(tmp_path / "h.png"))[..., :3] * 255).round().astype(int)
    found = {tuple(c) for c in np.unique(img.reshape(-1, 3), axis=0)}
    for _, bg, _, label in SUCCESS_BINS:
        rgb = tuple(int(bg[i:i + 2], 16) for i in (1, 3, 5))
        assert rgb in found, (label, bg)


def test_titles_name_the_arm_where_it_is_not_the_panda():
    from eval.report import render_markdown
    from eval.report.plots import _label

    recs = [{"setup": sid, "try": 0, "success": True, "model": "scripted", "arm": "widowx250s"} for sid in SCORED_IDS]
    s = build_summary(recs, n_boot=20)
    assert render_markdown({"scripted": s}).startswith("# Shape assembly benchmark report: scripted on widowx250s\n")
    assert _label("scripted", s) == "scripted on widowx250s"


def test_latency_axis_labels_between_the_powers_of_ten(tmp_path):
    from eval.report.plots import _label_log_axis, _new_figure

    fig = _new_figure(4, 3)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([0.3, 30], [0, 1])
    ax.set_xscale("log")
    _label_log_axis(ax.xaxis)
    fig.canvas.draw()
    labels = {t.get_text() for t in ax.get_xticklabels() if t.get_text()}
    assert {"0.5", "1", "2", "5", "10", "20"} <= labels


def test_committed_reports_link_the_pictures_beside_them():
    for md in sorted(RESULTS.glob("**/REPORT.md")):
        if "reasoning" in md.parts:
            continue  # assembly_probe's reports
        text = md.read_text()
        for png in md.parent.glob("*.png"):
            assert f"]({png.name})" in text, (md, png.name)
        assert "Histogram" not in text, md


# ---------------------------------------------------------------------------
# results/README.md: every machine it names is the one of the record it cites
# ---------------------------------------------------------------------------
MACHINE_RE = re.compile(r"AMD EPYC|Intel(?:\(R\))? Xeon|\bOrin\b")
SPEC8 = "Jetson AGX Orin"


def _machine_name(cpu: str) -> str:
    return "Intel Xeon" if "Xeon" in cpu else "AMD EPYC" if "EPYC" in cpu else cpu


def _machines_of(record) -> set[str]:
    """The machines a record names: its `machine` field (a run's, a benchmark's, a training's), or each model's."""
    if isinstance(record, dict) and isinstance(record.get("models"), dict):
        return set().union(*(_machines_of(m) for m in record["models"].values()))
    m = record.get("machine") if isinstance(record, dict) else None
    if isinstance(m, dict) and m.get("cpu"):
        return {_machine_name(str(m["cpu"]))}
    return set()


def _cited(token: str) -> set[str] | None:
    """The machines of a path the README cites (None: not a record of this repository)."""
    tok = token.strip().split()[0] if token.strip() else ""
    for base in (ROOT, RESULTS):
        p = (base / tok) if tok else None
        if p is None or not p.exists() or p == base:
            continue
        if p.name == "REPORT.md":
            p = p.parent
        if p.is_dir():
            for name in ("summary.json", "training.json"):
                if (p / name).is_file():
                    return _machines_of(json.loads((p / name).read_text()))
            return None
        if p.suffix == ".json":
            return _machines_of(json.loads(p.read_text()))
        return None
    return None


def _readme_units(text: str) -> list[str]:
    """Paragraphs, list items and table rows, outside code blocks."""
    units, cur, fence = [], [], False
    for ln in text.splitlines() + [""]:
        if ln.startswith("```"):
            fence = not fence
            cur = [] if fence else cur
            continue
        if fence:
            continue
        new_unit = not ln.strip() or ln.startswith("|") or ln.startswith("- ") or ln.startswith("#")
        if new_unit and cur:
            units.append(" ".join(cur))
            cur = []
        if ln.startswith("|") and not re.fullmatch(r"[|\-: ]+", ln):
            units.append(ln)
        elif ln.strip() and not ln.startswith("#"):
            cur.append(ln.strip())
    return units


def test_results_readme_names_the_machine_of_every_record_it_cites():
    """Done when (issue 33): each machine results/README.md names is the `machine` of the JSON or run it cites,
    and a unit (paragraph, list item, table row) that cites a record with a machine names that machine."""
    checked = 0
    for unit in _readme_units((RESULTS / "README.md").read_text()):
        named = {"Intel Xeon" if "Xeon" in m else SPEC8 if m == "Orin" else m for m in MACHINE_RE.findall(unit)}
        cited: set[str] = set()
        n_records = 0
        for tok in re.findall(r"`([^`]+)`", unit) + re.findall(r"\]\(([^)]+)\)", unit):
            machines = _cited(tok)
            if machines:
                n_records += 1
                cited |= machines
                assert machines <= named, f"cites {tok} ({', '.join(sorted(machines))}) without naming it: {unit[:160]}"
        if re.search(r"spec section 8|BENCHMARK\.md section 8", unit):
            cited.add(SPEC8)
        for m in named:
            assert m in cited, f"names {m} but cites no record of it: {unit[:160]}"
        checked += bool(named)
        checked += n_records > 0
    assert checked > 40
