"""The results page's HTML: one self-contained file (inline CSS, JS and SVG; nothing fetched).

Percentages are formatted here only; every number comes from a run's summary.json, the published
data file (:func:`eval.site.runs.load_published`) or :func:`eval.report.summary.paired_summary`.
"""
from __future__ import annotations

import math
from html import escape
from itertools import combinations
from typing import Any, Mapping, Sequence

from env.setups import DIFFICULTIES, FULL_BOARD_IDS, GROUPS, SCORED_IDS, SETUPS
from eval.report.markdown import _machine_str, _val
from eval.report.summary import paired_summary
from eval.stats import wilson
from eval.site.runs import LATENCY_ONLY, Run, command_line, device_name, finite, leaderboard, published_for, \
    quantile_points

# colour bins of a success rate: four of them inside 90-100 so that 94 and 100 look different
BINS = [  # (lower bound in %, colour, text colour, legend)
    (100.0, "#1a7837", "#fff", "100"),
    (97.0, "#5aae61", "#fff", "97-99.9"),
    (94.0, "#a6dba0", "#000", "94-96.9"),
    (90.0, "#d9f0d3", "#000", "90-93.9"),
    (80.0, "#fee08b", "#000", "80-89.9"),
    (60.0, "#fdae61", "#000", "60-79.9"),
    (30.0, "#f46d43", "#000", "30-59.9"),
    (0.0, "#c2252b", "#fff", "0-29.9"),
]
FEW_TRIES = 20
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
           "#bcbd22", "#393b79", "#637939"]

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header,main{max-width:1400px;margin:0 auto;padding:0 16px}
header{padding-top:12px}
h1{font-size:22px;margin:8px 0}
h2{font-size:18px;margin:28px 0 6px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:16px 0 6px}
nav a{margin-right:12px}
p.note,.note{color:#555;font-size:13px;max-width:1000px}
table{border-collapse:collapse;margin:6px 0 10px;background:#fff}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:right;vertical-align:middle;white-space:nowrap}
th{background:#f0f0f0;font-weight:600}
td.l,th.l{text-align:left}
tbody.sec th{background:#e8eef6;text-align:left}
.scroll{overflow-x:auto}
.badge{display:inline-block;font-size:11px;padding:0 5px;border-radius:8px;margin-left:4px;font-weight:600;white-space:nowrap}
.b-lat{background:#6a3d9a;color:#fff}.b-inc{background:#b35806;color:#fff}.b-rank{background:#1a7837;color:#fff}
.b-cmp{background:#ccc;color:#222}.b-fb{background:#2166ac;color:#fff}
.pub{background:#f6f2e8;color:#333;font-style:italic}
th.pub{background:#efe6d0}
td.c{font-variant-numeric:tabular-nums;min-width:44px;text-align:center;cursor:help}
td.c.few{opacity:.55;outline:1px dashed #333;outline-offset:-3px}
td.c.none{background:#eee;color:#999}
.sub{font-weight:400;color:#666;font-size:11px;display:block}
.legend span{display:inline-block;padding:1px 6px;margin:1px;border:1px solid #ccc;font-size:12px}
svg text{font:11px system-ui,sans-serif}
.rng{color:#555;font-size:12px}
#tip{position:fixed;left:12px;bottom:12px;background:#222;color:#fff;padding:6px 10px;border-radius:4px;
 font-size:13px;display:none;z-index:9}
dl.run{display:grid;grid-template-columns:max-content auto;gap:2px 12px;margin:4px 0 14px;background:#fff;
 padding:8px;border:1px solid #ddd}
dl.run dt{font-weight:600}dl.run dd{margin:0;font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
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
    p = 100 * rate
    for lo, bg, fg, _ in BINS:
        if p >= lo - 1e-9:
            return bg, fg
    return BINS[-1][1], BINS[-1][2]


def e(x: Any) -> str:
    return escape(str(x), quote=True)


def badges(run: Run) -> str:
    st = run.status
    out = []
    if st.get("latency_only"):
        out.append(f'<span class="badge b-lat" title="{e(LATENCY_ONLY)}">latency only</span>')
    if st.get("incomplete"):
        out.append(f'<span class="badge b-inc" title="{e(st["incomplete"])}">incomplete</span>')
    return "".join(out)


def run_head(run: Run, with_badges: bool = True) -> str:
    arm = run.summary.get("arm")
    arm_txt = f" · {arm}" if arm and arm != "panda" else ""
    return (f'{e(run.model)}{e(arm_txt)}{badges(run) if with_badges else ""}'
            f'<span class="sub">{e(run.label)}</span>')


def bar_svg(rate: Any, ci: Any, w: int = 90, h: int = 10, col: str = "#4c78a8") -> str:
    """A small bar (rate) with its 95% range as a whisker."""
    rate = finite(rate)
    if rate is None:
        return ""
    parts = [f'<svg width="{w}" height="{h}" role="img" aria-label="{pct(rate)}%">',
             f'<rect x="0" y="2" width="{w}" height="{h - 4}" fill="#eee"/>',
             f'<rect x="0" y="2" width="{w * rate:.1f}" height="{h - 4}" fill="{col}"/>']
    if ci and finite(ci[0]) is not None and finite(ci[1]) is not None:
        x0, x1 = w * ci[0], w * ci[1]
        parts.append(f'<line x1="{x0:.1f}" x2="{x1:.1f}" y1="{h / 2}" y2="{h / 2}" stroke="#000" stroke-width="1.2"/>'
                     f'<line x1="{x0:.1f}" x2="{x0:.1f}" y1="1" y2="{h - 1}" stroke="#000"/>'
                     f'<line x1="{x1:.1f}" x2="{x1:.1f}" y1="1" y2="{h - 1}" stroke="#000"/>')
    parts.append("</svg>")
    return "".join(parts)


def rate_cell(rate: Any, ci: Any, cls: str = "", col: str = "#4c78a8") -> str:
    if finite(rate) is None:
        return f'<td class="{cls}">n/a</td>'
    return (f'<td class="{cls}">{pct(rate)} <span class="rng">{rng(ci)}</span><br>'
            f'{bar_svg(rate, ci, col=col)}</td>')


def setup_cell(k: int, n: int, ci: Any, *, pub: bool = False, what: str = "") -> str:
    if not n:
        return '<td class="c none" title="no tries">–</td>'
    bg, fg = colour(k / n)
    cls = "c" + (" few" if n < FEW_TRIES else "") + (" pubc" if pub else "")
    return (f'<td class="{cls}" style="background:{bg};color:{fg}" title="{e(cell_title(k, n, ci))}" '
            f'data-what="{e(what)}: ">{k}/{n}</td>')


# --------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------
def _pub_s(p: Mapping | None) -> str:
    if not p:
        return "–"
    if p.get("S") is not None:
        return pct_rng(p["S"], p.get("S_ci"))
    d = p.get("derived")
    if d and d.get("S") is not None:
        return f'{pct(d["S"])} <span class="note">(from its per-setup %)</span>'
    return "–"


def section_leaderboard(runs: Sequence[Run], pub: Mapping) -> str:
    board = leaderboard(runs)
    head = ("<tr><th>Rank</th><th class=l>Run</th><th class=l>Track</th><th class=l>Split</th><th>Tries</th>"
            "<th>S here, % [95%]</th><th class=pub>S published (Orin)</th><th>M here, %</th>"
            "<th class=l>Machine</th><th class=l>Status</th></tr>")
    titles = {"ranked": "Ranked: frozen track (released models, real weights, complete test-split runs)",
              "comparison": "Not ranked, shown for comparison: reference, adapted and sanity tracks",
              "incomplete": "Not ranked: incomplete runs",
              "latency_only": "Never ranked: random weights (latency only, success meaningless)"}
    rows = [f'<div class="scroll"><table id="leaderboard-table">{head}']
    for sec, title in titles.items():
        items = board[sec]
        rows.append(f'<tbody class="sec"><tr><th colspan="10">{e(title)}</th></tr></tbody><tbody>')
        if not items and sec == "ranked":
            frozen = [x for x in pub.get("entries", ()) if x.get("track") == "frozen"]
            txt = "; ".join(f'{x["label"]} S {pct(x.get("S"))}' for x in frozen)
            rows.append(f'<tr><td></td><td class=l colspan="9">No frozen-track run here yet (no released '
                        f'weights were available). Published (Orin): {e(txt)}.</td></tr>')
        for rank, r in items:
            s = r.summary
            st = r.status
            scls = "S-here"
            s_txt = pct_rng(s.get("S"), s.get("S_ci"))
            if st.get("latency_only"):
                s_txt = f"{s_txt} (meaningless)"
            rows.append(
                f'<tr id="lb-{r.rid}" data-run="{e(r.label)}"><td>{rank if rank is not None else ""}</td>'
                f'<td class=l>{run_head(r)}</td><td class=l>{e(_val(s.get("track")))}</td>'
                f'<td class=l>{e(_val(s.get("split")))}</td><td>{s.get("n_tries")}</td>'
                f'<td class="{scls}" data-s="{e(s.get("S"))}">{e(s_txt)}</td>'
                f'<td class=pub>{_pub_s(published_for(r, pub))}</td><td>{e(pct(s.get("M")))}</td>'
                f'<td class=l>{e(device_name(s))}</td><td class=l style="white-space:normal;min-width:220px">'
                f'{e(st["text"])}</td></tr>')
        rows.append("</tbody>")
    rows.append("</table></div>")
    fb = board["full_board"]
    if fb:
        rows.append('<p class="note">Full-board runs (not in the score, their own section below): ' +
                    ", ".join(e(r.label) for _, r in fb) + ".</p>")
    return "".join(rows)


def _scored(runs: Sequence[Run]) -> list[Run]:
    return [r for r in runs if r.scored]


def _pub_columns(runs: Sequence[Run], pub: Mapping) -> list[tuple[Run, Mapping | None]]:
    """Each scored run with the published entry whose column follows it (each published entry once)."""
    used: set[str] = set()
    out = []
    for r in runs:
        p = published_for(r, pub)
        if p is not None and (p["id"] in used or not p.get("setups")):
            p = None
        if p is not None:
            used.add(p["id"])
        out.append((r, p))
    return out


def section_by(runs: Sequence[Run], pub: Mapping, what: str) -> str:
    """Success by task group (what='groups') or by difficulty, runs side by side, bootstrap ranges."""
    keys = GROUPS if what == "groups" else DIFFICULTIES
    cols = _pub_columns(_scored(runs), pub)
    head = ["<tr><th class=l>" + ("Group" if what == "groups" else "Difficulty") + "</th><th>Setups</th>"]
    for r, p in cols:
        head.append(f"<th>{run_head(r)}</th>")
        if p:
            head.append(f'<th class=pub>{e(p["label"])}<span class="sub">published (Orin)</span></th>')
    head.append("</tr>")
    rows = []
    first = cols[0][0].summary if cols else None
    for i, k in enumerate(keys):
        n_set = len((first or {}).get(what, {}).get(k, {}).get("setups", ())) if first else ""
        row = [f"<tr><td class=l>{e(k)}</td><td>{n_set}</td>"]
        for j, (r, p) in enumerate(cols):
            d = r.summary[what].get(k) or {}
            row.append(rate_cell(d.get("rate"), d.get("ci"), col=PALETTE[j % len(PALETTE)]))
            if p:
                pd = p["derived"][what].get(k) or {}
                row.append(rate_cell(pd.get("rate"), pd.get("ci"), cls="pub", col="#a08040"))
        rows.append("".join(row) + "</tr>")
    if what == "groups":
        row = ["<tr><th class=l>S</th><td>30</td>"]
        for j, (r, p) in enumerate(cols):
            row.append(rate_cell(r.summary.get("S"), r.summary.get("S_ci"), col=PALETTE[j % len(PALETTE)]))
            if p:
                row.append(rate_cell(p.get("S") if p.get("S") is not None else p["derived"]["S"],
                                     p.get("S_ci") if p.get("S") is not None else p["derived"]["S_ci"],
                                     cls="pub", col="#a08040"))
        rows.append("".join(row) + "</tr>")
    return f'<div class="scroll"><table id="by-{what}">{"".join(head)}{"".join(rows)}</table></div>'


def legend() -> str:
    sp = "".join(f'<span style="background:{bg};color:{fg}">{e(lab)}%</span>' for _, bg, fg, lab in BINS)
    return (f'<p class="legend">Colour: success %, {sp} <span class="few" style="opacity:.55;outline:1px dashed #333">'
            f'pale, dashed: fewer than {FEW_TRIES} tries (wide range)</span> '
            '<span style="background:#eee;color:#999">– no tries</span>. Hover (or tap) a cell for k/n and its '
            'Wilson 95% range in %.</p>')


def heatmap(cols: Sequence[tuple[Run, Mapping | None]], table_id: str, setups: Sequence[str] = SCORED_IDS,
            full_board: bool = False) -> str:
    head = ["<tr><th class=l>Id</th><th class=l>Setup</th><th class=l>Group</th><th class=l>Difficulty</th>"]
    for r, p in cols:
        head.append(f'<th data-run="{e(r.label)}">{run_head(r)}</th>')
        if p:
            head.append(f'<th class=pub>{e(p["label"])}<span class="sub">published (Orin)</span></th>')
    head.append("</tr>")
    rows = []
    for sid in setups:
        st = SETUPS[sid]
        row = [f"<tr><td class=l>{sid}</td><td class=l>{e(st.name)}</td><td class=l>{e(st.group)}</td>"
               f"<td class=l>{e(st.difficulty)}</td>"]
        for r, p in cols:
            src = r.summary["full_board"] if full_board else r.summary["setups"]
            c = src.get(sid) or {"k": 0, "n": 0, "ci": None}
            row.append(setup_cell(int(c["k"]), int(c["n"]), c.get("ci"), what=f"{r.label} {sid}"))
            if p:
                pc = (p.get("full_board") if full_board else p.get("setups") or {}).get(sid)
                row.append(setup_cell(int(pc["k"]), int(pc["n"]), pc["ci"], pub=True,
                                      what=f'{p["label"]} published {sid}') if pc else
                           '<td class="c none" title="not published">–</td>')
        rows.append("".join(row) + "</tr>")
    return f'<div class="scroll"><table id="{table_id}" class="heat">{"".join(head)}{"".join(rows)}</table></div>'


def section_secondary(runs: Sequence[Run], pub: Mapping) -> str:
    head = ("<tr><th class=l>Run</th><th>Recovery k/n</th><th>Recovery % [Wilson 95%]</th><th>Drops</th>"
            "<th>Completion s</th><th>ms/query mean</th><th>p50</th><th>p99</th><th>Queries</th>"
            "<th>Warm-up queries (mean ms)</th><th class=l>Machine</th></tr>")
    rows = []
    used: set[str] = set()
    for r in _scored(runs):
        sec = r.summary.get("secondary") or {}
        rec = sec.get("recovery") or {}
        lat = sec.get("latency_ms") or {}
        warm = sec.get("warmup_ms") or {}
        rtxt = f'{rec.get("k")}/{rec.get("n")}' if rec.get("n") else (
            "0/0" if sec.get("recovery_recorded") else "not recorded")
        rows.append(f'<tr><td class=l>{run_head(r)}</td><td>{rtxt}</td><td>{e(pct_rng(rec.get("rate"), rec.get("ci")))}'
                    f'</td><td>{sec.get("dropped", "n/a")}</td><td>{num(sec.get("mean_completion_s"))}</td>'
                    f'<td>{ms(lat.get("mean"))}</td><td>{ms(lat.get("p50"))}</td><td>{ms(lat.get("p99"))}</td>'
                    f'<td>{lat.get("count", 0)}</td>'
                    f'<td>{warm.get("count", 0)}{" (" + ms(warm.get("mean")) + ")" if warm else ""}</td>'
                    f'<td class=l>{e(device_name(r.summary))}</td></tr>')
        p = published_for(r, pub)
        if p and p["id"] not in used and any(k in p for k in ("recovery", "dropped", "ms_per_query")):
            used.add(p["id"])
            pr = p.get("recovery")
            prate = pr["k"] / pr["n"] if pr and pr.get("n") else None
            pci = None
            if prate is not None:
                iv = wilson(pr["k"], pr["n"])
                pci = [iv.low, iv.high]
            prtxt = f"{pr['k']}/{pr['n']}" if pr else "–"
            rows.append(f'<tr class=pub><td class=l>{e(p["label"])} <span class="sub">published (Orin)</span></td>'
                        f'<td>{prtxt}</td><td>{e(pct_rng(prate, pci))}</td>'
                        f'<td>{p.get("dropped", "–")}</td><td>{num(p.get("mean_completion_s"))}</td>'
                        f'<td>{ms(p.get("ms_per_query"))}</td><td>–</td><td>–</td><td>–</td><td>–</td>'
                        f'<td class=l>Jetson AGX Orin</td></tr>')
    return (f'<div class="scroll"><table id="secondary-table">{head}{"".join(rows)}</table></div>'
            '<p class="note">Recovery: successes among tries whose disturbance fired. Drops: tries with a dropped '
            'block. Completion: mean simulated seconds to success. ms/query: per policy query without the warm-up '
            'queries, measured on the machine named. Published rows are the spec\'s Orin numbers.</p>')


def section_arms(runs: Sequence[Run], pub: Mapping) -> str:
    arms = [r for r in _scored(runs) if r.model == "scripted" and not r.status.get("incomplete")]
    order = {"panda": 0, "xarm6_robotiq": 1, "widowx250s": 2}
    arms.sort(key=lambda r: (order.get(str(r.summary.get("arm")), 9), r.label))
    if not arms:
        return '<p class="note">No complete scripted run here.</p>'
    cols = _pub_columns(arms, pub)
    head = ("<tr><th class=l>Arm</th><th class=l>Run</th><th>S here, % [95%]</th><th class=pub>S published "
            "(Orin)</th><th>M here, %</th><th class=l>Setups below 100% here</th><th class='l pub'>below 100% published</th></tr>")
    rows = []
    for r, p in cols:
        p = p or published_for(r, pub)
        low = [f"{sid} {c['k']}/{c['n']}" for sid, c in r.summary["setups"].items() if c["n"] and c["k"] < c["n"]]
        plow = [f"{sid} {c['k']}/{c['n']}" for sid, c in ((p or {}).get("setups") or {}).items() if c["k"] < c["n"]]
        rows.append(f'<tr><td class=l>{e(r.summary.get("arm"))}</td><td class=l>{run_head(r)}</td>'
                    f'<td>{e(pct_rng(r.summary.get("S"), r.summary.get("S_ci")))}</td><td class=pub>{_pub_s(p)}</td>'
                    f'<td>{pct(r.summary.get("M"))}</td><td class=l style="white-space:normal">{e(", ".join(low) or "none")}'
                    f'</td><td class="l pub" style="white-space:normal">{e(", ".join(plow) or ("none" if p else "–"))}'
                    f'</td></tr>')
    return (f'<div class="scroll"><table id="arms-table">{head}{"".join(rows)}</table></div>' +
            heatmap(cols, "arms-heat"))


def section_full_board(runs: Sequence[Run], pub: Mapping) -> str:
    fb = [r for r in runs if r.summary.get("full_board")]
    if not fb:
        return '<p class="note">No run here holds full-board tries.</p>'
    head = ("<tr><th class=l>Run</th><th class=l>Id</th><th class=l>Setup</th><th>k/n</th><th>% [Wilson 95%]</th>"
            "<th>Blocks inserted (of 3)</th><th class=pub>published (Orin) k/n</th><th class=pub>% [Wilson 95%]</th>"
            "<th class=pub>blocks</th></tr>")
    rows = []
    for r in fb:
        p = published_for(r, pub) or {}
        for sid, c in r.summary["full_board"].items():
            pc = (p.get("full_board") or {}).get(sid)
            bg, fg = colour(c["k"] / c["n"]) if c.get("n") else ("#eee", "#999")
            rows.append(f'<tr><td class=l>{run_head(r)}</td><td class=l>{sid}</td><td class=l>{e(c.get("name"))}</td>'
                        f'{setup_cell(int(c["k"]), int(c["n"]), c.get("ci"), what=f"{r.label} {sid}")}'
                        f'<td>{e(pct_rng(c.get("rate"), c.get("ci")))}</td><td>{num(c.get("blocks_inserted_mean"))}</td>'
                        + (f'{setup_cell(pc["k"], pc["n"], pc["ci"], pub=True, what=f"published {sid}")}'
                           f'<td class=pub>{e(pct_rng(pc["rate"], pc["ci"]))}</td>'
                           f'<td class=pub>{num(pc.get("blocks_inserted_mean"))}</td>' if pc else
                           '<td class=pub>–</td><td class=pub>–</td><td class=pub>–</td>') + "</tr>")
    return (f'<div class="scroll"><table id="full-board">{head}{"".join(rows)}</table></div>'
            '<p class="note">All three blocks in their holes at the same time, up to 900 steps; not part of S or M.'
            '</p>')


def latency_svg(runs: Sequence[Run], pub: Mapping, w: int = 760, h: int = 330) -> str:
    have = [r for r in runs if r.latencies]
    if not have:
        return '<p class="note">No run here records per-query latencies (infer_ms).</p>'
    pub_ms = [(p["label"], float(p["ms_per_query"])) for p in pub.get("entries", ()) if p.get("ms_per_query")]
    lo = min([r.latencies[0] for r in have] + [v for _, v in pub_ms])
    hi = max([r.latencies[-1] for r in have] + [v for _, v in pub_ms])
    x0, x1 = math.floor(math.log10(max(lo, 1e-3))), math.ceil(math.log10(max(hi, 1e-3)))
    if x1 <= x0:
        x1 = x0 + 1
    ml, mr, mt, mb = 50, 150, 12, 40
    pw, ph = w - ml - mr, h - mt - mb

    def X(v: float) -> float:
        return ml + pw * (math.log10(max(v, 10.0 ** x0)) - x0) / (x1 - x0)

    def Y(f: float) -> float:
        return mt + ph * (1 - f)

    out = [f'<svg id="latency-cdf" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
           f'aria-label="latency CDF"><rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="#fff" stroke="#999"/>']
    for d in range(x0, x1 + 1):
        x = X(10.0 ** d)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt}" y2="{mt + ph}" stroke="#ddd"/>'
                   f'<text x="{x:.1f}" y="{mt + ph + 14}" text-anchor="middle">{10.0 ** d:g}</text>')
    for f in (0, 0.25, 0.5, 0.75, 1.0):
        y = Y(f)
        out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{ml - 4}" y="{y + 4:.1f}" text-anchor="end">{f:g}</text>')
    out.append(f'<text x="{ml + pw / 2}" y="{h - 6}" text-anchor="middle">ms per policy query (log scale, '
               f'warm-up queries excluded)</text><text x="12" y="{mt + ph / 2}" transform="rotate(-90 12 '
               f'{mt + ph / 2})" text-anchor="middle">fraction of queries</text>')
    for i, (lab, v) in enumerate(pub_ms):
        x = X(v)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt}" y2="{mt + ph}" stroke="#a08040" '
                   f'stroke-dasharray="4 3"><title>{e(lab)}: published (Orin) mean {v:g} ms</title></line>'
                   f'<text x="{x + 3:.1f}" y="{mt + ph - 8 - 13 * i}" fill="#806020">{e(lab)} (Orin)</text>')
    for j, r in enumerate(have):
        col = PALETTE[j % len(PALETTE)]
        pts = quantile_points(r.latencies)
        path = " ".join(f"{X(v):.1f},{Y(f):.1f}" for v, f in pts)
        dash = ' stroke-dasharray="6 3"' if r.status.get("latency_only") else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{col}" stroke-width="1.8"{dash}>'
                   f'<title>{e(r.label)} on {e(device_name(r.summary))}</title></polyline>')
    out.append("</svg>")
    items = []
    for j, r in enumerate(have):
        lat = r.summary["secondary"].get("latency_ms") or {}
        warm = r.summary["secondary"].get("warmup_ms") or {}
        items.append(f'<tr><td class=l><span style="color:{PALETTE[j % len(PALETTE)]};font-weight:700">'
                     f'{"- -" if r.status.get("latency_only") else "—"}</span> {run_head(r)}</td>'
                     f'<td class=l>{e(device_name(r.summary))}</td><td>{len(r.latencies)}</td>'
                     f'<td>{ms(lat.get("mean"))}</td><td>{ms(lat.get("p50"))}</td><td>{ms(lat.get("p99"))}</td>'
                     f'<td>{warm.get("count", 0)}{" (" + ms(warm.get("mean")) + ")" if warm else ""}</td></tr>')
    table = ('<table id="latency-table"><tr><th class=l>Run</th><th class=l>Device</th><th>Queries</th><th>Mean ms</th>'
             '<th>p50</th><th>p99</th><th>Warm-up queries (mean ms)</th></tr>' + "".join(items) + "</table>")
    return ('<div class="scroll">' + "".join(out) + "</div>" + table +
            '<p class="note">Dashed brown lines: the published (Orin) mean ms per query (spec section 8). '
            'Every curve is named with the machine that ran the policy.</p>')


def paired_pairs(runs: Sequence[Run]) -> list[tuple[Run, Run]]:
    """Pairs of complete runs that share a task list (same sha256 and split); never a random-weights run
    (its success is meaningless)."""
    ok = [r for r in runs if r.scored and r.tries_path and not r.status.get("latency_only")
          and not r.status.get("incomplete") and isinstance(r.summary.get("tasklist_sha256"), str)]
    return [(a, b) for a, b in combinations(ok, 2)
            if a.summary["tasklist_sha256"] == b.summary["tasklist_sha256"]
            and a.summary.get("split") == b.summary.get("split")]


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
        rows.append(f'<tr><td class=l style="white-space:normal;max-width:420px">{e(a.label)} − {e(b.label)}{note}</td><td>{p["shared_tries"]}</td>{d(p["S"])}' +
                    "".join(d((p.get("groups") or {}).get(g)) for g in GROUPS) + "</tr>")
    return (f'<div class="scroll"><table id="paired-table">{head}{"".join(rows)}</table></div>'
            f'<p class="note">Percentage points, paired stratified bootstrap over the tries both runs share (same '
            f'setups and starting states), {n_boot} redraws, seed {seed}. Bold: the 95% range excludes 0.</p>')


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


def render_page(runs: Sequence[Run], pub: Mapping, *, n_boot: int = 5000, seed: int = 0) -> str:
    scored = _scored(runs)
    cols = _pub_columns(scored, pub)
    machines = sorted({device_name(r.summary) for r in runs})
    preds = sorted({f'v{r.summary.get("predicate", 1)}' for r in runs})
    nav = [("leaderboard", "Leaderboard"), ("groups", "By group"), ("difficulty", "By difficulty"),
           ("setups", "Every setup"), ("secondary", "Secondary metrics"), ("arms", "Three arms"),
           ("fullboard", "Full board"), ("latency", "Latency"), ("paired", "Paired differences"), ("runs", "Runs")]
    body = [
        '<header><h1>Shape assembly benchmark: results</h1>',
        f'<p class="note">{len(runs)} runs, on {e("; ".join(machines))}; success predicate {e(", ".join(preds))}. '
        'Success rates in %. S (primary) = mean of the 7 group rates; M = mean over the 30 setups. Ranges are 95%: '
        'Wilson per setup, stratified percentile bootstrap for groups, difficulty and S. Columns marked '
        f'<span class="pub">&nbsp;published (Orin)&nbsp;</span> are the spec\'s published numbers '
        f'({e(pub.get("source", ""))}, {e(pub.get("machine", ""))}); "here" is the machine named with each run. '
        f'{e(pub.get("note", ""))}</p>',
        "<nav>" + "".join(f'<a href="#{a}">{e(t)}</a>' for a, t in nav) + "</nav></header><main>",
        '<h2 id="leaderboard">Leaderboard</h2>', section_leaderboard(runs, pub),
        '<h2 id="groups">Success by task group</h2>', section_by(runs, pub, "groups"),
        '<h2 id="difficulty">Success by difficulty</h2>', section_by(runs, pub, "difficulty"),
        '<h2 id="setups">Every setup</h2>', legend(), heatmap(cols, "heatmap"),
        '<h2 id="secondary">Secondary metrics (not in the score)</h2>', section_secondary(runs, pub),
        '<h2 id="arms">Three arms: the scripted reference</h2>', section_arms(runs, pub),
        '<h2 id="fullboard">Full board (not in the score)</h2>', section_full_board(runs, pub),
        '<h2 id="latency">Latency per policy query</h2>', latency_svg(runs, pub),
        '<h2 id="paired">Paired differences</h2>', section_paired(runs, n_boot, seed),
        '<h2 id="runs">Runs: machine, task list, weights, predicate, command</h2>', section_runs(runs),
        '</main><div id="tip" role="status"></div>',
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<title>Shape assembly benchmark: results</title>"
            f"<style>{CSS}</style></head><body>" + "\n".join(body) + f"<script>{JS}</script></body></html>\n")
