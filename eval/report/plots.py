"""The report's pictures: groups.png, heatmap.png and latency.png.

matplotlib is imported inside the functions, so that importing the report loads none of it.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from env.setups import FULL_BOARD_IDS, GROUPS, SCORED_IDS, SETUPS


# --------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------
def plot_latency(queries_ms: Mapping[str, Sequence[float]], path: str | Path,
                 machines: Mapping[str, str] | None = None, warmup: Mapping[str, int] | None = None) -> None:
    """Cumulative distribution of per-query latency per model (log x), with mean, p50 and p99 marked and the
    machine each ran on named; warm-up queries are left out (their count is in the legend)."""
    fig = _new_figure(7.4, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    for i, (n, v) in enumerate(queries_ms.items()):
        if not len(v):
            continue
        v = np.sort(np.asarray(v, float))
        c = f"C{i % 10}"
        label = f"{n}: {len(v)} queries, mean {v.mean():.3g} ms, p50 {np.percentile(v, 50):.3g}, p99 {np.percentile(v, 99):.3g}"
        if warmup and warmup.get(n):
            label += f" ({warmup[n]} warm-up left out)"
        if machines and machines.get(n):
            label += f"\n    on {machines[n]}"
        ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", color=c, label=label)
        ax.axvline(v.mean(), color=c, ls=":", lw=0.8)
        for q, ls in ((50, "-"), (99, "--")):
            ax.axvline(np.percentile(v, q), color=c, ls=ls, lw=0.6, alpha=0.7)
    ax.set_xscale("log")
    _label_log_axis(ax.xaxis)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("ms per query (dotted: mean, solid: p50, dashed: p99)")
    ax.set_ylabel("share of queries")
    ax.set_title("Policy query latency: cumulative distribution (CDF)", fontsize=10)
    ax.grid(color="0.92")
    ax.legend(fontsize=7, loc="lower right")  # a CDF: the lower right is empty past every curve
    fig.tight_layout()
    fig.savefig(str(path))


def _label_log_axis(axis) -> None:
    """A log axis labelled at 1, 2 and 5 of every decade in plain numbers (0.5, 1, 2, 5, 10, ...), not only at
    the powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_locator(LogLocator(base=10, subs=tuple(range(2, 10))))
    axis.set_minor_formatter(NullFormatter())


def _new_figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=120)
    FigureCanvasAgg(fig)
    return fig


def run_title(name: str, summary: Mapping) -> str:
    """A model's name with the arm it ran on where that is not the default Panda ("scripted on widowx250s")."""
    arm = summary.get("arm")
    return f"{name} on {arm}" if isinstance(arm, str) and arm != "panda" else name


def _label(name: str, summary: Mapping) -> str:
    """A model's name in a picture, with its arm (not the Panda), marked when its weights are random or its tries
    were cut short by --max-steps (its success means nothing)."""
    from eval.report.ranking import is_random_weights, step_cap

    name = run_title(name, summary)
    if is_random_weights(summary):
        return f"{name} (random weights: latency only)"
    cap = step_cap(summary)
    return f"{name} (cut at {cap} steps: a smoke run)" if cap is not None else name


def _held(summaries: Mapping[str, dict]) -> list[str]:
    """The scored setups some model has tries of (a subset run shows only those)."""
    return [sid for sid in SCORED_IDS if any(s["setups"].get(sid, {}).get("n") for s in summaries.values())]


def plot_groups(summaries: Mapping[str, dict], path: str | Path) -> bool:
    """Grouped bars: success per group (and S) per model, 95 % bootstrap bars; only the groups some model has
    tries of. False (nothing written) when no model has scored tries."""
    names = list(summaries)
    held = set(_held(summaries))
    if not held:
        return False
    cats = [g for g in GROUPS if any(SETUPS[sid].group == g for sid in held)] + ["S"]
    nm = len(names)
    fig = _new_figure(max(8.0, 4.0 + 0.45 * len(cats) * nm), 4.8)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / nm
    x = np.arange(len(cats), dtype=float)
    x[-1] += 0.4  # set S apart
    colors = [f"C{i % 10}" for i in range(nm)]
    for i, n in enumerate(names):
        s = summaries[n]
        vals, lo, hi, pos = [], [], [], []
        for j, c in enumerate(cats):
            rate, ci = (s["S"], s["S_ci"]) if c == "S" else (s["groups"][c]["rate"], s["groups"][c]["ci"])
            xp = x[j] - 0.4 + width * (i + 0.5)
            if rate is None:
                ax.text(xp, 2, "n/a", ha="center", va="bottom", fontsize=7, rotation=90, color="0.3")
                continue
            vals.append(100 * rate)
            pos.append(xp)
            lo.append(100 * (rate - ci[0]) if ci else 0.0)
            hi.append(100 * (ci[1] - rate) if ci else 0.0)
        ax.bar(pos, vals, width=width * 0.92, color=colors[i], label=_label(n, s), yerr=[lo, hi], capsize=2,
               error_kw={"elinewidth": 0.8, "ecolor": "0.15"})
        if nm <= 4:
            for xp, v in zip(pos, vals):
                ax.text(xp, min(v, 100) / 2 if v >= 12 else v + 1.5, f"{v:.1f}",
                        ha="center", va="center" if v >= 12 else "bottom", fontsize=7,
                        color="white" if v >= 12 else "0.2", rotation=90 if nm > 2 else 0)
    ax.axvline(x[-2] + 0.6, color="0.6", lw=0.8, ls="--")
    ax.set_xticks(x)
    ax.set_xticklabels([textwrap.fill(c, 12) for c in cats], fontsize=8)
    ax.set_xlim(x[0] - 0.6, x[-1] + 0.6)
    ax.set_ylim(0, 105)
    ax.set_ylabel("success %")
    title = "Success by group and S (bars: 95% bootstrap range)"
    if any(not summaries[n]["complete"] for n in names):
        title += "\nn/a: a group with a setup that has no tries (run incomplete)"
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", color="0.9")
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=min(nm, 5), frameon=False)
    fig.tight_layout()
    fig.savefig(str(path))
    return True


# The colour key of every success heatmap (REPORT.md's heatmap.png and the results page): (lower bound in %,
# background, text colour, label), highest first. Four bins inside 90-100, where the models that matter differ
# (94 and 100 look different); exactly 100 has a colour of its own.
SUCCESS_BINS = (
    (100.0, "#1a7837", "#fff", "100"),
    (97.0, "#5aae61", "#fff", "97-99.9"),
    (94.0, "#a6dba0", "#000", "94-96.9"),
    (90.0, "#d9f0d3", "#000", "90-93.9"),
    (80.0, "#fee08b", "#000", "80-89.9"),
    (60.0, "#fdae61", "#000", "60-79.9"),
    (30.0, "#f46d43", "#000", "30-59.9"),
    (0.0, "#c2252b", "#fff", "0-29.9"),
)
NO_TRIES_COLOUR = "#eeeeee"


def success_bin(pct: float) -> tuple[float, str, str, str]:
    """The bin of a success rate in % (the highest whose lower bound it reaches)."""
    for b in SUCCESS_BINS:
        if pct >= b[0] - 1e-9:
            return b
    return SUCCESS_BINS[-1]


def plot_heatmap(summaries: Mapping[str, dict], path: str | Path) -> None:
    """Setup x model success rates (%) with k/n in every cell, in the colours of :data:`SUCCESS_BINS` (the
    results page's key); only the setups some model has tries of; grey = no tries. The colour key draws each
    bin at its real size (proportional), exactly 100 as the triangle at its top."""
    names = list(summaries)
    fb = [sid for sid in FULL_BOARD_IDS if any(sid in s["full_board"] for s in summaries.values())]
    rows = _held(summaries) + fb
    data = np.full((len(rows), len(names)), np.nan)
    counts: dict[tuple[int, int], str] = {}
    for j, n in enumerate(names):
        s = summaries[n]
        for i, sid in enumerate(rows):
            e = s["setups"].get(sid) or s["full_board"].get(sid)
            if e and e["n"]:
                counts[i, j] = f"{e['k']}/{e['n']}"
                if e["rate"] is not None:
                    data[i, j] = 100 * e["rate"]
    from matplotlib.colors import BoundaryNorm, ListedColormap

    up = SUCCESS_BINS[::-1]  # lowest first
    bounds = [b[0] for b in up]  # 0 .. 100; rates of exactly 100 are "over" the last bound
    cmap = ListedColormap([b[1] for b in up]).with_extremes(over=up[-1][1], bad=NO_TRIES_COLOUR)
    norm = BoundaryNorm(bounds, len(up), extend="max")
    fig = _new_figure(3.6 + 1.2 * len(names), max(4.0, 1.9 + 0.3 * max(1, len(rows))))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    for i in range(len(rows)):
        for j in range(len(names)):
            v = data[i, j]
            txt = "no tries" if np.isnan(v) else (f"{v:.0f}" if abs(v - round(v)) < 0.05 else f"{v:.1f}")
            if (i, j) in counts:
                txt += f" ({counts[i, j]})"
            ax.text(j, i, txt, ha="center", va="center", fontsize=6.5,
                    color="0.3" if np.isnan(v) else success_bin(v)[2])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{sid} {SETUPS[sid].name}" for sid in rows], fontsize=7)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([textwrap.fill(_label(n, summaries[n]), 14) for n in names], fontsize=8)
    ax.xaxis.tick_top()
    prev = None
    for i, sid in enumerate(rows):
        g = SETUPS[sid].group
        if prev is not None and g != prev:
            ax.axhline(i - 0.5, color="black" if g == "Full board" else "white", lw=1.5 if g == "Full board" else 1)
        prev = g
    title = "Success % per setup (k/n)"
    if fb:
        title += "\nbelow the black line: full board, not in S" if rows != fb else "\nfull board, not in S"
    fig.suptitle(title, fontsize=9)  # above the model names at the top, never cut
    cb = fig.colorbar(im, ax=ax, fraction=0.05, pad=0.03, shrink=0.95, aspect=60, spacing="proportional",
                      extend="max", extendfrac=0.04, ticks=bounds)
    cb.ax.tick_params(labelsize=6.5)
    cb.set_label("success %, bins at their real size (triangle: exactly 100)", fontsize=7)
    fig.tight_layout()
    fig.savefig(str(path))
