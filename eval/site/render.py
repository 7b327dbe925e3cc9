"""The results page's HTML: one self-contained file (inline CSS, JS and SVG; nothing fetched).

Three kinds of number, each marked for what it is:

- a run's, from its summary.json (or :func:`eval.report.summary.paired_summary`), formatted here only;
- a published one, quoted as docs/BENCHMARK.md section 8 prints it (``<span class="pv">``), never re-drawn;
- one computed here from published numbers (``<span class="cv">``, its text labelled "computed" and its
  title saying from what): a setup's k/n and Wilson range, S and M where the spec publishes none.

Names with digits in them (octo-base-1.5, xArm6) are ``<span class="nm">``, so that a published cell's
numbers are all in one of the two marks (tests/test_site.py checks it).
"""
from __future__ import annotations

import math
from html import escape
from itertools import combinations
from typing import Any, Sequence

from env.setups import DIFFICULTIES, GROUPS, SCORED_IDS, SETUPS
from eval.report.markdown import _machine_str, _val
from eval.report.plots import NO_TRIES_COLOUR, SUCCESS_BINS, success_bin
from eval.report.summary import paired_summary
from eval.site.published import COMPUTED, Entry, Published, computed_scores, setup_counts
from eval.site.runs import DEFAULT_ARM, LATENCY_ONLY, SECTION_SHORT, SECTIONS, Run, command_line, device_name, \
    leaderboard, package_version, quantile_points
from eval.stats import finite
from eval.site.spec import Spec, inline_html, markdown_html, setups_table
from eval.stats import wilson

FEW_TRIES = 20
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
           "#bcbd22", "#393b79", "#637939"]
PUB_COLOUR = "#a08040"
# where the page shows the runs of each section that is not the leaderboard's (anchors of render_page's h2)
ELSEWHERE = {"variant": "variants", "other_arm": "arms", "incomplete": "runs", "latency_replay": "latency",
             "example": "latency",
             "latency_only": "latency", "full_board": "fullboard"}
SPEC_SECTIONS = ("1", "2", "3", "4", "5", "6", "7", "9")  # shown as written (8 is the published numbers)

CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header,main{max-width:1400px;margin:0 auto;padding:0 12px}
header{padding-top:12px}
h1{font-size:22px;margin:8px 0}
h2{font-size:18px;margin:30px 0 6px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
h4{font-size:14px;margin:12px 0 4px}
nav{display:flex;flex-wrap:wrap;gap:2px 12px}
p,li{max-width:1000px;overflow-wrap:anywhere}
.note{color:#555;font-size:13px}
table{border-collapse:collapse;margin:6px 0 10px;background:#fff}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:right;vertical-align:middle;white-space:nowrap}
th{background:#f0f0f0;font-weight:600}
td.l,th.l{text-align:left}
td.w,th.w{white-space:normal;min-width:150px;max-width:420px}
td.w2,th.w2{white-space:normal;min-width:260px;max-width:420px}
td.run{white-space:normal;min-width:100px;max-width:240px;text-align:left}
table.spec td{white-space:normal;min-width:70px;max-width:520px}
.scroll{overflow-x:auto;max-width:100%}
pre{background:#f3f3f3;padding:6px 8px;overflow-x:auto;font-size:12px;max-width:100%}
code{font-family:ui-monospace,monospace;font-size:12px;overflow-wrap:anywhere}
.badge{display:inline-block;font-size:11px;padding:0 5px;border-radius:8px;margin-left:4px;font-weight:600;white-space:nowrap}
.b-lat{background:#6a3d9a;color:#fff}.b-inc{background:#b35806;color:#fff}.b-var{background:#2166ac;color:#fff}
.b-dev{background:#555;color:#fff}
.pub{background:#f6f2e8;color:#333}
th.pub{background:#efe6d0}
.pv{font-style:italic}
.cv{color:#6b4f00}
.clab{font-size:10px;font-style:normal;font-weight:600;color:#6b4f00;border:1px solid #c9b27a;border-radius:3px;padding:0 2px;margin-left:2px}
.mark{display:inline-block;padding:0 4px;border-radius:3px}
td.c{font-variant-numeric:tabular-nums;min-width:44px;text-align:center;cursor:help}
td.c.few{opacity:.55;outline:1px dashed #333;outline-offset:-3px}
td.c.none{background:#eee;color:#999}
.sub{font-weight:400;color:#666;font-size:11px;display:block;white-space:normal}
.key{display:flex;max-width:600px;height:16px;border:1px solid #999;margin:4px 0 2px}
.key span{display:block;height:100%}
.keylab{position:relative;max-width:600px;height:14px;font-size:10px;color:#333}
.keylab span{position:absolute;transform:translateX(-50%)}
.legend span{display:inline-block;padding:1px 6px;margin:1px;border:1px solid #ccc;font-size:12px}
svg text{font:11px system-ui,sans-serif}
svg.fig{width:100%;max-width:760px;height:auto}
.rng{color:#555;font-size:12px}
.box{background:#fff;border:1px solid #ddd;border-left:4px solid #1a7837;padding:6px 10px;margin:6px 0 10px;max-width:1000px}
#tip{position:fixed;left:12px;bottom:12px;background:#222;color:#fff;padding:6px 10px;border-radius:4px;
 font-size:13px;display:none;z-index:9;max-width:90vw}
dl.run{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:2px 12px;margin:4px 0 14px;background:#fff;
 padding:8px;border:1px solid #ddd}
dl.run dt{font-weight:600}dl.run dd{margin:0;font-family:ui-monospace,monospace;font-size:12px;overflow-wrap:anywhere}
"""

# tap or click a cell to read its hover text (touch screens show no title tooltips)
JS = """
(function(){
  var tip=document.getElementById('tip');
  document.addEventListener('click',function(ev){
    var t=ev.target.closest('[title]');
    if(!t||!t.closest('table')){tip.style.display='none';return;}
    tip.textContent=(t.getAttribute('data-what')||'')+t.getAttribute('title');
    tip.style.display='block';
  });
  document.body.setAttribute('data-ready','1');
})();
"""


# --------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------
def pct(x: Any, nd: int = 1) -> str:
    x = finite(x)
    return "n/a" if x is None else f"{100 * x:.{nd}f}"


def rng(ci: Any) -> str:
    if not ci or finite(ci[0]) is None or finite(ci[1]) is None:
        return ""
    return f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def pct_rng(x: Any, ci: Any) -> str:
    return f"{pct(x)} {rng(ci) if finite(x) is not None else ''}".strip()


def num(x: Any, fmt: str = ".2f") -> str:
    x = finite(x)
    return "n/a" if x is None else format(x, fmt)


def ms(x: Any) -> str:
    x = finite(x)
    if x is None:
        return "n/a"
    return f"{x:.3g}" if x < 100 else f"{x:.1f}"


def cell_title(k: int, n: int, ci: Sequence[float]) -> str:
    """A setup cell's hover text: "k/n [lo, hi]" (Wilson 95%, in %)."""
    return f"{k}/{n} {rng(ci)}"


def colour(rate: float) -> tuple[str, str]:
    """Background and text colour of a success rate (0..1), from the report's key (SUCCESS_BINS)."""
    _, bg, fg, _ = success_bin(100 * rate)
    return bg, fg


def e(x: Any) -> str:
    return escape(str(x), quote=True)


def pv(text: str) -> str:
    """A published number, as section 8 prints it."""
    return f'<span class="pv">{e(text)}</span>'


def cv(text: str, why: str) -> str:
    """A number computed here from published ones: labelled, and its title says from what."""
    return f'<span class="cv" title="{e(COMPUTED)}: {e(why)}">{e(text)}<span class="clab">{COMPUTED}</span></span>'


def nm(name: str) -> str:
    """A name that may hold digits (octo-base-1.5, xArm6), so that it is not taken for a number."""
    return f'<span class="nm">{e(name)}</span>'


def pub_head(p: Entry) -> str:
    return f'<th class=pub>{nm(p.label)}<span class="sub">published (Orin)</span></th>'


def badges(run: Run) -> str:
    st = run.status
    out = []
    if st.get("latency_only"):
        out.append(f'<span class="badge b-lat" title="{e(LATENCY_ONLY)}">latency only</span>')
    if st.get("incomplete"):
        out.append(f'<span class="badge b-inc" title="{e(st["incomplete"])}">incomplete</span>')
    if st.get("variant"):
        out.append('<span class="badge b-var" title="other weights than the model\'s own">variant</span>')
    if st.get("section") == "example":
        out.append(f'<span class="badge b-dev" title="{e(st["text"])}">{e(run.summary.get("split"))} split</span>')
    return "".join(out)


def run_head(run: Run) -> str:
    arm = run.summary.get("arm")
    arm_txt = f" on {arm}" if arm and arm != DEFAULT_ARM else ""
    return (f'{nm(run.model)}{nm(arm_txt)}{badges(run)}'
            f'<span class="sub">{e(run.label)}</span>')


def bar_svg(rate: Any, ci: Any, w: int = 90, h: int = 10, col: str = "#4c78a8") -> str:
    """A small bar (rate) with its 95% range as a whisker."""
    rate = finite(rate)
    if rate is None:
        return ""
    parts = [f'<svg width="{w}" height="{h}" role="img" aria-hidden="true">',
             f'<rect x="0" y="2" width="{w}" height="{h - 4}" fill="#eee"/>',
             f'<rect x="0" y="2" width="{w * rate:.1f}" height="{h - 4}" fill="{col}"/>']
    if ci and finite(ci[0]) is not None and finite(ci[1]) is not None:
        x0, x1 = w * ci[0], w * ci[1]
        parts.append(f'<line x1="{x0:.1f}" x2="{x1:.1f}" y1="{h / 2}" y2="{h / 2}" stroke="#000" stroke-width="1.2"/>'
                     f'<line x1="{x0:.1f}" x2="{x0:.1f}" y1="1" y2="{h - 1}" stroke="#000"/>'
                     f'<line x1="{x1:.1f}" x2="{x1:.1f}" y1="1" y2="{h - 1}" stroke="#000"/>')
    parts.append("</svg>")
    return "".join(parts)


def _quoted_rate(text: str) -> tuple[float, list[float] | None]:
    """The rate and range (0..1) of a published "rate [lo, hi]", for drawing its bar only."""
    head, _, tail = text.partition(" [")
    ci = [float(x) / 100 for x in tail.rstrip("]").split(", ")] if tail else None
    return float(head) / 100, ci


def rate_cell(rate: Any, ci: Any, col: str = "#4c78a8") -> str:
    if finite(rate) is None:
        return "<td>n/a</td>"
    return f'<td>{pct(rate)} <span class="rng">{rng(ci)}</span><br>{bar_svg(rate, ci, col=col)}</td>'


def pub_rate_cell(text: str | None) -> str:
    if not text:
        return '<td class=pub>not published</td>'
    rate, ci = _quoted_rate(text)
    return f'<td class=pub>{pv(text)}<br>{bar_svg(rate, ci, col=PUB_COLOUR)}</td>'


def setup_cell(k: int, n: int, ci: Any, *, what: str = "") -> str:
    if not n:
        return '<td class="c none" title="no tries">–</td>'
    bg, fg = colour(k / n)
    cls = "c" + (" few" if n < FEW_TRIES else "")
    return (f'<td class="{cls}" style="background:{bg};color:{fg}" title="{e(cell_title(k, n, ci))}" '
            f'data-what="{e(what)}: ">{k}/{n}</td>')


def pub_setup_cell(pub: Published, p: Entry, sid: str) -> str:
    """A published setup: its % as printed; k/n and the Wilson range in its title, labelled computed."""
    if sid not in p.setups:
        return '<td class="c none pub" title="not published">–</td>'
    k, n = setup_counts(pub, p)[sid]
    iv = wilson(k, n)
    bg, fg = colour(k / n)
    title = (f"{COMPUTED}: {cell_title(k, n, [iv.low, iv.high])} (the published {p.setups[sid]}% of {n} tries; "
             f"Wilson 95%)")
    return (f'<td class="c pub" style="background:{bg};color:{fg}" title="{e(title)}" '
            f'data-what="{e(p.label)} published {sid}: ">{pv(p.setups[sid])}</td>')


def published_for(run: Run, pub: Published) -> Entry | None:
    """The published run a run stands beside: the same model on the same arm, for a test-split run made with
    the model's own weights (a variant, an example or an incomplete run has none)."""
    if run.status.get("section") not in ("ranked", "comparison", "other_arm"):
        return None
    return pub.entry(run.model, run.summary.get("arm") or DEFAULT_ARM)


def _s_not_published(pub: Published, p: Entry | None) -> str:
    """The S cell of a published run whose S the spec does not print: the computed S, labelled."""
    if p is None:
        return "–"
    if p.S:
        return pv(p.S)
    s = computed_scores(pub, p)["S"]
    if s is None:
        return "not published"
    return ("not published; " + cv(pct(s), f"S of the published per-setup % ({p.label}), with the spec's "
                                    "formula (mean of the 7 group means); the spec publishes no S for it"))


# --------------------------------------------------------------------------
# The leaderboard and the frozen track
# --------------------------------------------------------------------------
LB_HEAD = ("<tr><th title=\"rank\">#</th><th class=l>Run</th><th>S here<br>% [95%]</th><th class=pub>S published<br>"
           "(Orin)</th><th>M here<br>%</th><th class=l>Track</th><th class=l>Split</th><th class=l>Arm</th>"
           "<th>Tries</th>"
           "<th class=l>Machine</th><th class='l w2'>Status</th></tr>")


def _lb_row(rank: int | None, r: Run, pub: Published) -> str:
    s, st = r.summary, r.status
    s_txt = f'{pct(s.get("S"))}<br><span class="rng">{rng(s.get("S_ci"))}</span>'
    if st.get("latency_only"):
        s_txt += " (meaningless)"
    return (f'<tr id="lb-{r.rid}" data-run="{e(r.label)}"><td>{rank if rank is not None else ""}</td>'
            f'<td class=run>{run_head(r)}</td><td class="S-here" data-s="{e(s.get("S"))}">{s_txt}</td>'
            f'<td class=pub>{_s_not_published(pub, published_for(r, pub))}</td><td>{e(pct(s.get("M")))}</td>'
            f'<td class=l>{e(_val(s.get("track")))}</td><td class=l>{e(_val(s.get("split")))}</td>'
            f'<td class=l>{nm(_val(s.get("arm")))}</td><td>{s.get("n_tries")}</td>'
            f'<td class=l>{e(device_name(s))}</td><td class="l w2">{e(st["text"])}</td></tr>')


def _pub_row(p: Entry, pub: Published, status: str) -> str:
    note = f'<span class="sub">{e(p.S_note)}</span>' if p.S_note else ""
    return (f'<tr class=pub><td></td><td class=run>{nm(p.label)}<span class="sub">published (Orin)</span></td>'
            f'<td>–</td><td class=pub>{pv(p.S) if p.S else "–"}{note}</td><td>–</td>'
            f'<td class=l>{e(p.track)}</td><td class=l>{e(pub.split)}</td><td class=l>{nm(p.arm)}</td><td>–</td>'
            f'<td class=l>{e(pub.machine)}</td><td class="l w2">{e(status)}</td></tr>')


def remote_command(profile: str) -> str:
    """The eval.run options that evaluate a model behind its server with ``profile`` (its protocol's URL)."""
    from eval.remote.profiles import PROFILES
    from eval.remote.wire import URL_SCHEMES

    protocol = PROFILES[profile].protocols[0]
    return (f"--model remote --protocol {protocol} --profile {profile} "
            f"--server {URL_SCHEMES[protocol][0]}://HOST:PORT")


def ranked_needs(pub: Published) -> str:
    """What a ranked row needs, and the commands that make one."""
    from engines.octo.config import HF_REPOS
    from eval.remote.profiles import PROFILES

    frozen = [p for p in pub.entries if p.track == "frozen"]
    model = next(iter(HF_REPOS))
    cmd = (f"python -m eval.run --model {model} --split test --setups all --tries 50 --workers 2 \\\n"
           f"    --out results/{model.replace('-', '_')}_test\n"
           "python -m eval.site --runs results --out results/site")
    served = [p.model for p in frozen if p.status and p.model in PROFILES]
    return (
        '<div class="box"><b>What a ranked row needs.</b> A frozen-track model (released weights, not trained on '
        'this task) run on the test split, every setup with its 50 tries, on the Panda. No such run is here: '
        'the machine these runs were made on has no internet to fetch the released weights, so none was made. '
        f'To make one on a machine with internet (the weights, {", ".join(HF_REPOS.values())}, are fetched into '
        f'the Hugging Face cache on first use), run the benchmark and rebuild this page:<pre>{e(cmd)}</pre>'
        f'{", ".join(map(nm, HF_REPOS))}: in-process Octo 1.5 (JAX, or ONNX Runtime with <code>--backend ort</code>). '
        + (f'{", ".join(map(nm, served))}: server profiles exist (<code>{e(remote_command(served[0]))}</code>, '
           "eval/remote/profiles.py), not run here: they need the model's own server with its released weights."
           if served else "") + "</div>")


def section_leaderboard(runs: Sequence[Run], pub: Published) -> str:
    board = leaderboard(runs)
    out = ['<p class="note">The Panda, the test split, every setup with its tries, and the model as its track '
           'defines it. Variants, other arms, examples on other splits, incomplete and random-weights runs have '
           'their own sections below. S is the primary score; the range is the 95% stratified bootstrap.</p>']
    for sec in ("ranked", "comparison"):
        out.append(f"<h3>{e(SECTIONS[sec])}</h3>")
        rows = [_lb_row(rank, r, pub) for rank, r in board[sec]]
        if sec == "ranked":
            ours = {r.model for _, r in board[sec]}
            for p in pub.entries:
                if p.track == "frozen" and p.model not in ours:
                    rows.append(_pub_row(p, pub, f"published page status: “{p.status}”" if p.status else
                                         "published result; not run here (no released weights on this machine)"))
        tid = ' id="leaderboard-table"' if sec == "ranked" else ""
        out.append(f'<div class="scroll"><table{tid} class="lb">{LB_HEAD}{"".join(rows)}</table></div>')
        if sec == "ranked" and not board[sec]:
            out.append(ranked_needs(pub))
    others = [(s, board[s]) for s in SECTIONS if s not in ("ranked", "comparison") and board[s]]
    if others:
        out.append('<p class="note">Elsewhere on this page:</p><ul class="note">' + "".join(
            f'<li><a href="#{ELSEWHERE[s]}">{e(SECTIONS[s])}</a>: ' + ", ".join(e(r.label) for _, r in items) +
            "</li>" for s, items in others) + "</ul>")
    return "".join(out)


def board_runs(runs: Sequence[Run]) -> list[Run]:
    """The leaderboard's runs (ranked and shown for comparison), in its order."""
    board = leaderboard(runs)
    return [r for s in ("ranked", "comparison") for _, r in board[s]]


# --------------------------------------------------------------------------
# Groups, difficulty, every setup
# --------------------------------------------------------------------------
def _columns(runs: Sequence[Run], pub: Published, need: str,
             unmatched: bool = True) -> list[tuple[Run | None, Entry | None]]:
    """Each run with the published run that stands beside it, then (``unmatched``) the Panda's published runs
    with ``need`` (groups, difficulty, setups, recovery) that no run here stands beside."""
    used: set[str] = set()
    cols: list[tuple[Run | None, Entry | None]] = []
    for r in runs:
        p = published_for(r, pub)
        if p is not None and (p.key in used or not getattr(p, need)):
            p = None
        if p is not None:
            used.add(p.key)
        cols.append((r, p))
    for p in pub.entries if unmatched else ():
        if p.arm == pub.arm and getattr(p, need) and p.key not in used:
            cols.append((None, p))
    return cols


def section_by(runs: Sequence[Run], pub: Published, what: str) -> str:
    """Success by task group (what='groups') or by difficulty, runs side by side, bootstrap ranges."""
    keys = GROUPS if what == "groups" else DIFFICULTIES
    cols = _columns(board_runs(runs), pub, what)
    head = ["<tr><th class=l>" + ("Group" if what == "groups" else "Difficulty") + "</th><th>Setups</th>"]
    for r, p in cols:
        if r is not None:
            head.append(f"<th>{run_head(r)}</th>")
        if p is not None:
            head.append(pub_head(p))
    head.append("</tr>")
    rows = []
    for k in keys:
        n_set = sum(1 for st in SETUPS.values() if st.id in SCORED_IDS and
                    (st.group if what == "groups" else st.difficulty) == k)
        row = [f"<tr><td class=l>{e(k)}</td><td>{n_set}</td>"]
        for j, (r, p) in enumerate(cols):
            if r is not None:
                d = r.summary[what].get(k) or {}
                row.append(rate_cell(d.get("rate"), d.get("ci"), col=PALETTE[j % len(PALETTE)]))
            if p is not None:
                row.append(pub_rate_cell(getattr(p, what).get(k)))
        rows.append("".join(row) + "</tr>")
    if what == "groups":
        row = ["<tr><th class=l>S</th><td>30</td>"]
        for j, (r, p) in enumerate(cols):
            if r is not None:
                row.append(rate_cell(r.summary.get("S"), r.summary.get("S_ci"), col=PALETTE[j % len(PALETTE)]))
            if p is not None:
                row.append(pub_rate_cell(p.S) if p.S and "[" in p.S else
                           f'<td class=pub>{_s_not_published(pub, p)}</td>')
        rows.append("".join(row) + "</tr>")
    return (f'<div class="scroll"><table id="by-{what}">{"".join(head)}{"".join(rows)}</table></div>'
            '<p class="note">Published columns quote section 8 as printed (its own bootstrap); they are not '
            're-drawn here.</p>')


def legend() -> str:
    """The colour key of REPORT.md's heatmap.png: every bin at its real size on 0-100, exactly 100 apart."""
    up = SUCCESS_BINS[::-1]
    segs = "".join(f'<span style="width:{hi - lo}%;background:{bg}" title="{e(lab)}%"></span>'
                   for (lo, bg, _, lab), (hi, *_) in zip(up, up[1:]))
    ticks = "".join(f'<span style="left:{lo}%">{lo:g}</span>' for lo, *_ in up[:-1])
    sw = "".join(f'<span style="background:{bg};color:{fg}">{e(lab)}%</span>' for _, bg, fg, lab in SUCCESS_BINS)
    ticks += '<span style="left:100%">100</span>'
    return (f'<div class="key" role="img" aria-label="colour key">{segs}</div><div class="keylab">{ticks}</div>'
            f'<p class="legend">Colour: success %, each bin at its real size above; {sw} (exactly 100 has its own). '
            f'<span class="few" style="opacity:.55;outline:1px dashed #333">pale, dashed: fewer than {FEW_TRIES} '
            f'tries</span> <span style="background:{NO_TRIES_COLOUR};color:#999">– no tries</span>. Hover (or tap) '
            'a cell for k/n and its Wilson 95% range in %; a published cell shows the published %, its k/n and '
            'range are computed from it.</p>')


def heatmap(cols: Sequence[tuple[Run | None, Entry | None]], pub: Published, table_id: str,
            setups: Sequence[str] = SCORED_IDS) -> str:
    head = ["<tr><th class=l>Id</th><th class=l>Setup</th><th class=l>Group</th><th class=l>Difficulty</th>"]
    for r, p in cols:
        if r is not None:
            head.append(f'<th data-run="{e(r.label)}">{run_head(r)}</th>')
        if p is not None:
            head.append(pub_head(p))
    head.append("</tr>")
    rows = []
    for sid in setups:
        st = SETUPS[sid]
        row = [f"<tr><td class=l>{sid}</td><td class=l>{e(st.name)}</td><td class=l>{e(st.group)}</td>"
               f"<td class=l>{e(st.difficulty)}</td>"]
        for r, p in cols:
            if r is not None:
                c = r.summary["setups"].get(sid) or {"k": 0, "n": 0, "ci": None}
                row.append(setup_cell(int(c["k"]), int(c["n"]), c.get("ci"), what=f"{r.label} {sid}"))
            if p is not None:
                row.append(pub_setup_cell(pub, p, sid))
        rows.append("".join(row) + "</tr>")
    return f'<div class="scroll"><table id="{table_id}" class="heat">{"".join(head)}{"".join(rows)}</table></div>'


# --------------------------------------------------------------------------
# Secondary metrics
# --------------------------------------------------------------------------
SEC_HEAD = ("<tr><th class=l>Run</th><th>Recovery k/n</th><th>Recovery % [Wilson 95%]</th><th>Drops</th>"
            "<th>Completion s</th><th>ms/query mean</th><th>p50</th><th>p99</th><th>Queries</th>"
            "<th class=l>Machine</th></tr>")


def _sec_row(r: Run) -> str:
    sec = r.summary.get("secondary") or {}
    rec = sec.get("recovery") or {}
    lat = sec.get("latency_ms") or {}
    rtxt = f'{rec.get("k")}/{rec.get("n")}' if rec.get("n") else (
        "0/0" if sec.get("recovery_recorded") else "not recorded")
    return (f'<tr><td class=run>{run_head(r)}</td><td>{rtxt}</td><td>{e(pct_rng(rec.get("rate"), rec.get("ci")))}'
            f'</td><td>{sec.get("dropped", "n/a")}</td><td>{num(sec.get("mean_completion_s"))}</td>'
            f'<td>{ms(lat.get("mean"))}</td><td>{ms(lat.get("p50"))}</td><td>{ms(lat.get("p99"))}</td>'
            f'<td>{lat.get("count", 0)}</td><td class=l>{e(device_name(r.summary))}</td></tr>')


def _pub_sec_row(p: Entry, pub: Published) -> str:
    def q(x):
        return pv(x) if x else "not published"
    return (f'<tr class=pub><td class=run>{nm(p.label)}<span class="sub">published (Orin)</span></td>'
            f'<td>{q(p.recovery)}</td><td>{q(p.recovery_ci)}</td><td>{q(p.drops)}</td><td>{q(p.completion_s)}</td>'
            f'<td>{q(p.ms_per_query)}</td><td>–</td><td>–</td><td>–</td><td class=l>{e(pub.machine)}</td></tr>')


def section_secondary(runs: Sequence[Run], pub: Published, shown: Sequence[Run] | None = None) -> str:
    """The leaderboard's runs (or ``shown``, without the published runs none of them stands beside)."""
    cols = _columns(board_runs(runs), pub, "recovery") if shown is None else _columns(shown, pub, "recovery", False)
    rows = []
    for r, p in cols:
        if r is not None:
            rows.append(_sec_row(r))
        if p is not None:
            rows.append(_pub_sec_row(p, pub))
    return (f'<div class="scroll"><table class="secondary">{SEC_HEAD}{"".join(rows)}</table></div>'
            '<p class="note">Recovery: successes among tries whose disturbance fired. Drops: tries with a dropped '
            'block. Completion: mean simulated seconds to success. ms/query: per policy query without the warm-up '
            'queries, on the machine named. Published rows quote section 8 (Jetson AGX Orin); it publishes no '
            'percentiles.</p>')


# --------------------------------------------------------------------------
# Variants, other arms, full board
# --------------------------------------------------------------------------
def section_variants(runs: Sequence[Run], pub: Published) -> str:
    board = leaderboard(runs)
    variants = [r for _, r in board["variant"]]
    if not variants:
        return '<p class="note">No variant here.</p>'
    track_runs = [r for r in board_runs(runs) if r.model in {v.model for v in variants}]
    head = ("<tr><th class=l>Run</th><th>S here, % [95%]</th><th>M here, %</th>" +
            "".join(f"<th>{e(g)}</th>" for g in GROUPS) +
            "<th class=l>Weights sha256</th><th class=l>Options</th></tr>")
    rows = []
    for r in variants + track_runs:
        s = r.summary
        opts = " ".join(f"--{k} {v}" for k, v in ((r.run_json or {}).get("options") or {}).items()) or "none"
        what = "variant" if r in variants else "the track’s recipe"
        groups = "".join(f'<td>{e(pct_rng(d.get("rate"), d.get("ci")))}</td>'
                         for d in (s["groups"].get(g) or {} for g in GROUPS))
        rows.append(f'<tr><td class=run>{run_head(r)}<span class="sub">{what}</span></td>'
                    f'<td data-s="{e(s.get("S"))}">{e(pct_rng(s.get("S"), s.get("S_ci")))}</td>'
                    f'<td>{e(pct(s.get("M")))}</td>{groups}'
                    f'<td class=l><code>{e(str(s.get("weights_sha256") or "n/a")[:16])}…</code></td>'
                    f'<td class="l w"><code>{e(opts)}</code></td></tr>')
    return (f'<div class="scroll"><table id="variants">{head}{"".join(rows)}</table></div>'
            '<p class="note">A variant runs the model with other weights than its committed ones, so it is not '
            'the track’s recipe and never stands beside the published run; its paired difference with the '
            'track’s run is in the paired differences below.</p>')


def section_arms(runs: Sequence[Run], pub: Published) -> str:
    board = leaderboard(runs)
    order = {a: i for i, a in enumerate(pub.arm_labels)}
    arms = [r for r in board_runs(runs) + [r for _, r in board["other_arm"]] if r.model == "scripted"]
    arms.sort(key=lambda r: (order.get(str(r.summary.get("arm")), 9), r.label))
    if not arms:
        return '<p class="note">No complete scripted run here.</p>'
    cols = [(r, pub.entry(r.model, r.summary.get("arm") or DEFAULT_ARM)) for r in arms]
    head = ("<tr><th class=l>Arm</th><th class=l>Run</th><th>S here, % [95%]</th><th class=pub>S published (Orin)"
            "</th><th>M here, %</th><th class='l w'>Setups below 100% here</th><th class='l w pub'>below 100% "
            "published</th></tr>")
    rows = []
    for r, p in cols:
        s = r.summary
        arm = str(s.get("arm") or DEFAULT_ARM)
        low = [f"{sid} {c['k']}/{c['n']}" for sid, c in s["setups"].items() if c["n"] and c["k"] < c["n"]]
        plow = [f"{nm(sid)} {pv(v)}%" for sid, v in (p.setups if p else {}).items() if v != "100"]
        rows.append(f'<tr><td class=l>{nm(pub.arm_labels.get(arm, arm))}</td><td class=run>{run_head(r)}</td>'
                    f'<td data-s="{e(s.get("S"))}">{e(pct_rng(s.get("S"), s.get("S_ci")))}</td>'
                    f'<td class=pub>{_s_not_published(pub, p)}</td><td>{pct(s.get("M"))}</td>'
                    f'<td class="l w">{e(", ".join(low) or "none")}</td>'
                    f'<td class="l w pub">{", ".join(plow) or ("none" if p else "–")}</td></tr>')
    out = [f'<div class="scroll"><table id="arms-table">{head}{"".join(rows)}</table></div>']
    # by group on each arm: here and the published three-arm table
    head = ["<tr><th class=l>Group</th>"]
    for r, _ in cols:
        arm = str(r.summary.get("arm") or DEFAULT_ARM)
        head.append(f"<th>{run_head(r)}</th>")
        if arm in pub.arm_groups:
            head.append(f'<th class=pub>{nm(pub.arm_labels[arm])}<span class="sub">published (Orin)</span></th>')
    head.append("</tr>")
    body = []
    for g in GROUPS:
        row = [f"<tr><td class=l>{e(g)}</td>"]
        for j, (r, _) in enumerate(cols):
            arm = str(r.summary.get("arm") or DEFAULT_ARM)
            d = r.summary["groups"].get(g) or {}
            row.append(rate_cell(d.get("rate"), d.get("ci"), col=PALETTE[j % len(PALETTE)]))
            if arm in pub.arm_groups:
                row.append(pub_rate_cell(pub.arm_groups[arm].get(g)))
        body.append("".join(row) + "</tr>")
    out.append('<h3>By task group on each arm</h3><div class="scroll"><table id="arms-groups">' + "".join(head) +
               "".join(body) + "</table></div>")
    out.append("<h3>Secondary metrics on each arm</h3>" + section_secondary(runs, pub, shown=arms))
    out.append("<h3>Every setup on each arm</h3>" + heatmap(cols, pub, "arms-heat"))
    return "".join(out)


def section_full_board(runs: Sequence[Run], pub: Published) -> str:
    fb = [r for r in runs if r.summary.get("full_board")]
    if not fb:
        return '<p class="note">No run here holds full-board tries.</p>'
    head = ("<tr><th class=l>Run</th><th class=l>Id</th><th class=l>Setup</th><th>k/n</th><th>% [Wilson 95%]</th>"
            "<th>Blocks inserted (of 3)</th><th class=pub>published (Orin) k/n</th><th class=pub>Wilson 95%</th>"
            "<th class=pub>blocks</th></tr>")
    rows = []
    for r in fb:
        p = pub.entry(r.model, r.summary.get("arm") or DEFAULT_ARM) if r.summary.get("split") == pub.split else None
        for sid, c in r.summary["full_board"].items():
            pc = (p.full_board if p else {}).get(sid) or {}
            rows.append(f'<tr><td class=run>{run_head(r)}</td><td class=l>{sid}</td><td class=l>{e(c.get("name"))}</td>'
                        f'{setup_cell(int(c["k"]), int(c["n"]), c.get("ci"), what=f"{r.label} {sid}")}'
                        f'<td>{e(pct_rng(c.get("rate"), c.get("ci")))}</td>'
                        f'<td>{num(c.get("blocks_inserted_mean"))}</td>'
                        + "".join(f'<td class=pub>{pv(pc[k]) if pc.get(k) else "–"}</td>'
                                  for k in ("kn", "wilson", "blocks")) + "</tr>")
    return (f'<div class="scroll"><table id="full-board">{head}{"".join(rows)}</table></div>'
            '<p class="note">All three blocks in their holes at the same time, up to 900 steps; not part of S or M. '
            'The published Wilson ranges are printed as section 8 prints them (low-high, %).</p>')


# --------------------------------------------------------------------------
# Latency
# --------------------------------------------------------------------------
def _log_ticks(x0: int, x1: int) -> list[tuple[float, bool]]:
    """(value, labelled) of 1, 2 and 5 of every decade from 10^x0 to 10^x1: all labelled over up to three
    decades, else the powers of ten only (the labels would run into each other)."""
    few = x1 - x0 <= 3
    return [(m * 10.0 ** d, few or m == 1) for d in range(x0, x1 + 1) for m in (1, 2, 5) if m * 10.0 ** d <= 10.0 ** x1]


def latency_svg(runs: Sequence[Run], pub: Published, w: int = 760, h: int = 330) -> str:
    have = [r for r in runs if r.latencies]
    if not have:
        return '<p class="note">No run here records per-query latencies (infer_ms).</p>'
    pub_ms = [(p.label, p.ms_per_query) for p in pub.entries if p.ms_per_query]
    lo = min([r.latencies[0] for r in have] + [float(v) for _, v in pub_ms])
    hi = max([r.latencies[-1] for r in have] + [float(v) for _, v in pub_ms])
    x0, x1 = math.floor(math.log10(max(lo, 1e-3))), math.ceil(math.log10(max(hi, 1e-3)))
    if x1 <= x0:
        x1 = x0 + 1
    ml, mr, mt, mb = 50, 150, 12, 40
    pw, ph = w - ml - mr, h - mt - mb

    def X(v: float) -> float:
        return ml + pw * (math.log10(max(v, 10.0 ** x0)) - x0) / (x1 - x0)

    def Y(f: float) -> float:
        return mt + ph * (1 - f)

    out = [f'<svg id="latency-cdf" class="fig" viewBox="0 0 {w} {h}" role="img" '
           f'aria-label="latency CDF"><rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="#fff" stroke="#999"/>']
    for v, labelled in _log_ticks(x0, x1):
        x = X(v)
        grid = "#ddd" if labelled else "#f0f0f0"
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt}" y2="{mt + ph}" stroke="{grid}"/>'
                   + (f'<text x="{x:.1f}" y="{mt + ph + 14}" text-anchor="middle">{v:g}</text>' if labelled else ""))
    for f in (0, 0.25, 0.5, 0.75, 1.0):
        y = Y(f)
        out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{ml - 4}" y="{y + 4:.1f}" text-anchor="end">{f:g}</text>')
    out.append(f'<text x="{ml + pw / 2}" y="{h - 6}" text-anchor="middle">ms per policy query (log scale, '
               f'warm-up queries excluded)</text><text x="12" y="{mt + ph / 2}" transform="rotate(-90 12 '
               f'{mt + ph / 2})" text-anchor="middle">fraction of queries</text>')
    for i, (lab, v) in enumerate(pub_ms):
        x = X(float(v))
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt}" y2="{mt + ph}" stroke="{PUB_COLOUR}" '
                   f'stroke-dasharray="4 3"><title>{e(lab)}: the published (Orin) mean ms per query</title></line>'
                   f'<text class="pub" x="{x + 3:.1f}" y="{mt + ph - 8 - 13 * i}" fill="#806020">'
                   f'<tspan class="nm">{e(lab)}</tspan> (Orin)</text>')
    for j, r in enumerate(have):
        col = PALETTE[j % len(PALETTE)]
        pts = quantile_points(r.latencies)
        path = " ".join(f"{X(v):.1f},{Y(f):.1f}" for v, f in pts)
        dash = ' stroke-dasharray="6 3"' if r.status.get("latency_only") else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{col}" stroke-width="1.8"{dash}>'
                   f'<title>{e(r.label)} on {e(device_name(r.summary))}</title></polyline>')
    out.append("</svg>")
    return "".join(out)


def section_latency(runs: Sequence[Run], pub: Published) -> str:
    have = [r for r in runs if r.latencies]
    items = []
    for j, r in enumerate(have):
        lat = r.summary["secondary"].get("latency_ms") or {}
        warm = r.summary["secondary"].get("warmup_ms") or {}
        items.append(f'<tr><td class=run><span style="color:{PALETTE[j % len(PALETTE)]};font-weight:700">'
                     f'{"- -" if r.status.get("latency_only") else "—"}</span> {run_head(r)}</td>'
                     f'<td class=l>{e(r.summary.get("split"))}</td><td>{r.summary.get("n_tries")}</td>'
                     f'<td class=l>{e(device_name(r.summary))}</td><td>{len(r.latencies)}</td>'
                     f'<td>{ms(lat.get("mean"))}</td><td>{ms(lat.get("p50"))}</td><td>{ms(lat.get("p99"))}</td>'
                     f'<td>{warm.get("count", 0)}{" (" + ms(warm.get("mean")) + ")" if warm else ""}</td>'
                     f'<td class="l w">{e(r.status["text"])}</td></tr>')
    for p in pub.entries:
        if p.ms_per_query:
            items.append(f'<tr class=pub><td class=run>{nm(p.label)}<span class="sub">published (Orin)</span></td>'
                         f'<td class=l>{e(pub.split)}</td><td>–</td><td class=l>{e(pub.machine)}</td><td>–</td>'
                         f'<td>{pv(p.ms_per_query)}</td><td>–</td><td>–</td><td>–</td>'
                         f'<td class="l w">published mean ms per query</td></tr>')
    table = ('<div class="scroll"><table id="latency-table"><tr><th class=l>Run</th><th class=l>Split</th>'
             '<th>Tries</th><th class=l>Device</th><th>Queries</th><th>Mean ms</th><th>p50</th><th>p99</th>'
             '<th>Warm-up queries (mean ms)</th><th class="l w">What it is</th></tr>' + "".join(items) +
             "</table></div>")
    return ('<p class="note">Every run with per-query latencies, the dev-split examples of <code>eval.orin</code> '
            'included (a few tries each: latency and the device report, not results). Dashed brown lines: the '
            'published (Orin) mean ms per query. Each curve is named with the machine that ran the policy.</p>'
            + latency_svg(runs, pub) + table)


# --------------------------------------------------------------------------
# Paired differences
# --------------------------------------------------------------------------
def paired_pairs(runs: Sequence[Run]) -> list[tuple[Run, Run]]:
    """Pairs of complete runs that share a task list (same sha256 and split) and say something: two models on
    one arm, or one model on two arms. Never a random-weights or a sanity run (success meaningless, or zero
    by construction)."""
    ok = [r for r in runs if r.scored and r.tries_path and not r.status.get("latency_only")
          and not r.status.get("incomplete") and r.summary.get("track") != "sanity"
          and isinstance(r.summary.get("tasklist_sha256"), str)]
    return [(a, b) for a, b in combinations(ok, 2)
            if a.summary["tasklist_sha256"] == b.summary["tasklist_sha256"]
            and a.summary.get("split") == b.summary.get("split")
            and (a.summary.get("arm") == b.summary.get("arm") or a.model == b.model)]


def section_paired(runs: Sequence[Run], n_boot: int, seed: int) -> str:
    pairs = paired_pairs(runs)
    if not pairs:
        return '<p class="note">No two complete runs here share a task list.</p>'
    head = ("<tr><th class=l>A − B</th><th>Shared tries</th><th>S, pp [95%]</th>" +
            "".join(f"<th>{e(g)}</th>" for g in GROUPS) + "</tr>")
    rows = []
    for a, b in pairs:
        p = paired_summary(a.records(), b.records(), name_a=a.label, name_b=b.label, n_boot=n_boot, seed=seed)

        def d(x):
            if not x or finite(x.get("diff")) is None:
                return "<td>n/a</td>"
            ci = x.get("ci") or [None, None]
            sig = ci[0] is not None and ci[1] is not None and (ci[0] > 0 or ci[1] < 0)
            r = f' <span class="rng">[{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]</span>' if ci[0] is not None else ""
            return f'<td{" style=font-weight:700" if sig else ""}>{100 * x["diff"]:+.1f}{r}</td>'

        note = f'<span class="sub">{e(p["note"])}</span>' if p.get("note") else ""
        rows.append(f'<tr><td class="l w">{e(a.label)} − {e(b.label)}{note}</td><td>{p["shared_tries"]}</td>'
                    f'{d(p["S"])}' + "".join(d((p.get("groups") or {}).get(g)) for g in GROUPS) + "</tr>")
    return (f'<div class="scroll"><table id="paired-table">{head}{"".join(rows)}</table></div>'
            f'<p class="note">Percentage points, paired stratified bootstrap over the tries both runs share (same '
            f'setups and starting states), {n_boot} redraws, seed {seed}. Bold: the 95% range excludes 0.</p>')


# --------------------------------------------------------------------------
# The benchmark, as docs/BENCHMARK.md describes it
# --------------------------------------------------------------------------
def section_models(runs: Sequence[Run], pub: Published) -> str:
    """Every model of the tracks: what it is, how it runs here, its runs here and its published result."""
    from eval.remote.profiles import PROFILES
    from eval.request import MODEL_CONFIGS, RemoteConfig

    rows = []
    local = [m for m, cls in MODEL_CONFIGS.items() if cls is not RemoteConfig]
    names = local + [p.model for p in pub.entries if p.status]
    for name in names:
        spec = MODEL_CONFIGS.get(name) if name in local else None
        prof = PROFILES.get(name)
        track = spec.track if spec else (prof.track if prof else "frozen")
        what = spec.describe(name) if spec else (prof.description if prof else "")
        how = f"--model {name}" if spec else remote_command(name) if prof else "no adapter here"
        mine = [r for r in runs if r.model == name]
        here = ", ".join(f'{e(r.label)} ({e(SECTION_SHORT[r.status["section"]])})' for r in mine) or \
            ("none: needs its released weights" if track == "frozen" else "none")
        p_all = [p for p in pub.entries if p.model == name and p.arm == pub.arm]
        p_txt = "; ".join((f'S {pv(p.S)}' if p.S else f'“{pv(p.status)}”' if p.status else "–") for p in p_all)
        rows.append(f'<tr><td class=l>{e(track)}</td><td class=l>{nm(name)}</td><td class="l w">{e(what)}</td>'
                    f'<td class="l w"><code>{e(how)}</code></td><td class="l w">{here}</td>'
                    f'<td class="l w pub">{p_txt or "not published"}</td></tr>')
    return ('<div class="scroll"><table id="models"><tr><th class=l>Track</th><th class=l>Model</th>'
            '<th class="l w">What it is</th><th class="l w">How it runs here (python -m eval.run ...)</th>'
            '<th class="l w">Runs here</th><th class="l w pub">Published (Orin)</th></tr>' + "".join(rows) +
            "</table></div>")


def section_versions(runs: Sequence[Run], pub: Published) -> str:
    """ManiSkill and SAPIEN of each run, the task list of this project and how it relates to the published."""
    from env.tasklist import VERSION, read_lock
    from eval.site.spec import SPEC_FILE

    lock = read_lock()
    pinned = {}
    lock_file = SPEC_FILE.parents[1] / "requirements" / "lock.txt"
    if lock_file.is_file():
        for ln in lock_file.read_text(encoding="utf-8").splitlines():
            name, _, ver = ln.partition("==")
            if name in ("mani_skill", "mani-skill", "sapien"):
                pinned[name.replace("_", "-")] = ver.strip()
    rows = []
    for r in runs:
        ms_v, sp_v = package_version(r, "mani-skill"), package_version(r, "sapien")
        rows.append(f'<tr><td class=run>{run_head(r)}</td>'
                    f'<td class=l>{e(ms_v or "not recorded")}</td><td class=l>{e(sp_v or "not recorded")}</td>'
                    f'<td class=l><code>{e(str(r.summary.get("tasklist_sha256") or "n/a")[:12])}…</code></td></tr>')
    splits = lock.get("splits") or {}
    sha_rows = "".join(f'<tr><td class=l>{e(s)}</td><td>{v.get("per_setup")}</td><td>{v.get("tries")}</td>'
                       f'<td class=l><code>{e(v.get("sha256"))}</code></td></tr>' for s, v in splits.items())
    test_sha = (splits.get(pub.split) or {}).get("sha256", "")
    same = test_sha.startswith(pub.tasklist["sha256_prefix"])
    return (
        f'<p>Simulator pinned in requirements/lock.txt: ManiSkill {e(pinned.get("mani-skill", "not pinned"))}, '
        f'SAPIEN {e(pinned.get("sapien", "not pinned"))}, CPU PhysX. Each run\'s own versions, where its run.json '
        'records them ("not recorded": the run was started before eval.run wrote its environment there):</p>'
        '<div class="scroll"><table id="versions"><tr><th class=l>Run</th><th class=l>ManiSkill</th>'
        '<th class=l>SAPIEN</th><th class=l>Task list sha256</th></tr>' + "".join(rows) + "</table></div>"
        f'<p>This project\'s task list {e(VERSION)} (env/tasklists/{e(VERSION)}/LOCK.json):</p>'
        '<div class="scroll"><table id="tasklist"><tr><th class=l>Split</th><th>Tries per setup</th><th>Tries</th>'
        '<th class=l>sha256</th></tr>' + sha_rows + "</table></div>"
        f'<p class="pub mark">Published: task list {pv(pub.tasklist["version"])}, sha256 prefix '
        f'{pv(pub.tasklist["sha256_prefix"])} (“{pv(pub.tasklist["note"])}”).</p>'
        f'<p>Ours, on the {e(pub.split)} split: <code>{e(test_sha[:12])}…</code>: '
        + ("the published list itself." if same else
           "not the published list. The setups are the spec's (section 2, checked against env/setups.py when "
           "this page is built) and so are the tries per setup, but the starting positions are drawn from this "
           "project's own seeds, so a try here and a published try with the same number do not start alike: "
           "numbers here and published ones compare as two samples of the same setups, not try by try.")
        + "</p>")


def section_benchmark(spec: Spec, runs: Sequence[Run], pub: Published) -> str:
    setups_table(spec)  # the spec's setups are the code's, or the page is not built
    out = [f'<p class="note">As docs/BENCHMARK.md ({e(spec.title)}) writes it: this project\'s copy of the '
           'spec, its setups table checked against env/setups.py. Section 8 is the published numbers, quoted in '
           'the tables above.</p>']
    for n in SPEC_SECTIONS:
        if n in spec.sections:
            sec = spec.sections[n]
            out.append(f'<h3 id="spec-{n}">{e(n)}. {inline_html(sec.title)}</h3>' + markdown_html(sec.body, 4))
    out.append('<h3 id="models-status">Models and status</h3>' + section_models(runs, pub))
    out.append('<h3 id="versions-h">Versions and the task list</h3>' + section_versions(runs, pub))
    return "".join(out)


# --------------------------------------------------------------------------
# Runs, and the page
# --------------------------------------------------------------------------
def section_runs(runs: Sequence[Run]) -> str:
    out = []
    for r in runs:
        s = r.summary
        rows = [("Folder", str(r.folder)), ("Model", _val(s.get("model"))), ("Track", _val(s.get("track"))),
                ("Status", r.status["text"]), ("Arm", _val(s.get("arm"))), ("Split", _val(s.get("split"))),
                ("Machine", _machine_str(s.get("machine")))]
        if s.get("device"):
            rows.append(("Device", "; ".join(f"{k} {_val(v)}" for k, v in s["device"].items() if v not in (None, ""))))
        rows += [("Task-list sha256", _val(s.get("tasklist_sha256"))),
                 ("Weights sha256", _val(s.get("weights_sha256")) if s.get("weights_sha256") else
                  ("none (model without a weights file)" if not r.status.get("latency_only") else
                   "none: random weights")),
                 ("Success predicate", f'v{s.get("predicate", 1)}'),
                 ("Backend", _val(s.get("backend"))),
                 ("Command line", command_line(r) + "   (rebuilt from run.json and summary.json)")]
        if s.get("note"):
            rows.append(("Note", _val(s["note"])))
        warn = [w for w in s.get("warnings") or () if not str(w).startswith("incomplete")]
        if warn:
            rows.append(("Warnings", "; ".join(map(str, warn))))
        out.append(f'<h3 id="run-{r.rid}">{run_head(r)}</h3><dl class="run">' +
                   "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in rows) + "</dl>")
    return "".join(out)


def render_page(runs: Sequence[Run], spec: Spec, pub: Published, *, n_boot: int = 5000, seed: int = 0) -> str:
    machines = sorted({device_name(r.summary) for r in runs})
    preds = sorted({f'v{r.summary.get("predicate", 1)}' for r in runs})
    shown = board_runs(runs)
    nav = [("leaderboard", "Leaderboard"), ("groups", "By group"), ("difficulty", "By difficulty"),
           ("setups", "Every setup"), ("secondary", "Secondary metrics"), ("variants", "Variants"),
           ("arms", "Three arms"), ("fullboard", "Full board"), ("latency", "Latency"), ("paired", "Paired"),
           ("benchmark", "The benchmark"), ("runs", "Runs")]
    body = [
        '<header><h1>Shape assembly benchmark: results</h1>',
        f'<p class="note">{len(runs)} runs of this project, on {e("; ".join(machines))}; success predicate '
        f'{e(", ".join(preds))}. Success rates in %. S (primary) = mean of the 7 group rates; M = mean over the '
        '30 setups. Ranges are 95%: Wilson per setup, stratified percentile bootstrap for groups, difficulty and '
        f'S. <span class="pub mark">published (Orin)</span>: <i>quoted</i> as {e(pub.source)} '
        f'prints it ({e(pub.heading)}); <span class="clab">{COMPUTED}</span>: '
        'computed here from published numbers, its title says from what; every other number is a run\'s, on the '
        f'machine named with it. Section 8: “{pv(pub.physics_note)}”</p>',
        "<nav>" + "".join(f'<a href="#{a}">{e(t)}</a>' for a, t in nav) + "</nav></header><main>",
        '<h2 id="leaderboard">Leaderboard</h2>', section_leaderboard(runs, pub),
        '<h2 id="groups">Success by task group</h2>', section_by(runs, pub, "groups"),
        '<h2 id="difficulty">Success by difficulty</h2>', section_by(runs, pub, "difficulty"),
        '<h2 id="setups">Every setup</h2>', legend(), heatmap(_columns(shown, pub, "setups"), pub, "heatmap"),
        '<h2 id="secondary">Secondary metrics (not in the score)</h2>', section_secondary(runs, pub),
        f'<h2 id="variants">{e(SECTIONS["variant"])}</h2>', section_variants(runs, pub),
        '<h2 id="arms">Three arms: the scripted reference</h2>', section_arms(runs, pub),
        '<h2 id="fullboard">Full board (not in the score)</h2>', section_full_board(runs, pub),
        '<h2 id="latency">Latency per policy query</h2>', section_latency(runs, pub),
        '<h2 id="paired">Paired differences</h2>', section_paired(runs, n_boot, seed),
        '<h2 id="benchmark">The benchmark</h2>', section_benchmark(spec, runs, pub),
        '<h2 id="runs">Runs: machine, task list, weights, predicate, command</h2>', section_runs(runs),
        '</main><div id="tip" role="status"></div>',
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<title>Shape assembly benchmark: results</title>"
            f"<style>{CSS}</style></head><body>" + "\n".join(body) + f"<script>{JS}</script></body></html>\n")
