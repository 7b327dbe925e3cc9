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
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("ms per query (dotted: mean, solid: p50, dashed: p99)")
    ax.set_ylabel("share of queries")
    ax.set_title("Policy query latency, cumulative", fontsize=10)
    ax.grid(color="0.92")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(str(path))


def _new_figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=120)
    FigureCanvasAgg(fig)
    return fig


def _label(name: str, summary: Mapping) -> str:
    """A model's name in a picture, marked when its weights are random (its success means nothing)."""
    from eval.report.summary import is_random_weights

    return f"{name} (random weights: latency only)" if is_random_weights(summary) else name


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


# success % bands: four between 90 and 100, where the models that matter differ
HEATMAP_BOUNDS = (0, 25, 50, 70, 80, 90, 94, 97, 99.99, 100.01)


def plot_heatmap(summaries: Mapping[str, dict], path: str | Path) -> None:
    """Setup x model success rates (%) with k/n in every cell, on a colour scale whose bands separate 90-100;
    only the setups some model has tries of; grey = no tries."""
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
    import matplotlib
    from matplotlib.colors import BoundaryNorm

    base = matplotlib.colormaps["RdYlGn"]
    cmap = base.resampled(len(HEATMAP_BOUNDS) - 1).with_extremes(bad="0.85")
    norm = BoundaryNorm(HEATMAP_BOUNDS, cmap.N)
    fig = _new_figure(3.4 + 1.2 * len(names), 1.9 + 0.3 * max(1, len(rows)))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    for i in range(len(rows)):
        for j in range(len(names)):
            v = data[i, j]
            txt = "no tries" if np.isnan(v) else (f"{v:.0f}" if abs(v - round(v)) < 0.05 else f"{v:.1f}")
            if (i, j) in counts:
                txt += f" ({counts[i, j]})"
            ax.text(j, i, txt, ha="center", va="center", fontsize=6.5,
                    color="0.3" if np.isnan(v) else ("white" if v < 25 else "black"))
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
    cb = fig.colorbar(im, ax=ax, fraction=0.05, pad=0.03, ticks=HEATMAP_BOUNDS[:-2] + (100,))
    cb.ax.tick_params(labelsize=7)
    cb.set_label("success %", fontsize=8)
    fig.tight_layout()
    fig.savefig(str(path))
