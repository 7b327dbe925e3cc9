"""Run an answerer over a built set and write the report.

Per elementary type: accuracy with a Wilson 95% interval, the chance level and the critical
accuracy (smallest accuracy whose one-sided binomial p-value against chance is <= 0.05),
unparseable answers and latency. Planning: exact / set match (Wilson) and mean overlap
(percentile bootstrap) against k, with their chance levels, and a PNG curve.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from eval.reasoning import planning as P
from eval.reasoning import questions as Q
from eval.reasoning.parsing import parse_answer
from eval.stats import wilson

ALPHA = 0.05


def critical_count(n: int, p0: float, alpha: float = ALPHA) -> int | None:
    """Smallest c with P(Binomial(n, p0) >= c) <= alpha; None if even n correct is not enough."""
    from scipy.stats import binom

    for c in range(n + 1):
        if binom.sf(c - 1, n, p0) <= alpha:
            return c
    return None


def _ci(k, n, z=None):
    iv = wilson(k, n) if z is None else wilson(k, n, z)
    return [iv.low, iv.high]


def family_z(rows: int, alpha: float = ALPHA) -> float:
    """Two-sided z of a Bonferroni band: ``rows`` intervals that hold together with probability >= 1 - alpha.

    "The random answerer is at chance on every type" is one claim about all rows of a table at once; tested
    row by row at 95%, a perfectly random answerer fails it in about 43% of runs with 11 types.
    """
    from scipy.stats import norm

    return float(norm.ppf(1 - alpha / (2 * max(rows, 1))))


def _family_check(rows: list[tuple[dict, int, int]]) -> dict:
    """Family-wise band over the rows of one table, each given as (row dict, k, n): adds ``ci_family`` and
    ``ci_family_covers_chance`` to every row dict and says whether all rows cover chance, both ways."""
    z = family_z(len(rows))
    for row, k, n in rows:
        row["ci_family"] = _ci(k, n, z)
        row["ci_family_covers_chance"] = row["ci_family"][0] <= row["chance"] <= row["ci_family"][1]
    return {"rows": len(rows), "z": z, "all_covered": all(r["ci_family_covers_chance"] for r, _, _ in rows),
            "all_covered_per_row_95": all(r["ci_covers_chance"] for r, _, _ in rows)}


def _add_family_bands(summary) -> None:
    """Family-wise (Bonferroni) intervals per table, and whether every row's covers chance."""
    check = {table: _family_check([(r, r["correct"], r["n"]) for r in summary[table].values()])
             for table in ("elementary", "elementary_lite")}
    # exact and set per k: the Wilson rows of the planning table
    check["planning"] = _family_check([(r[m], r[m]["k"], r["n"]) for r in summary["planning"].values()
                                       for m in ("exact", "set")])
    summary["chance_check"] = {"level": 1 - ALPHA, "method": "Wilson intervals, Bonferroni over the rows of each table",
                               "tables": check}


def _latency(ms):
    if not ms:
        return None
    a = np.asarray(ms)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "max": float(a.max())}


def run_items(items, answerer, data_dir, progress=True, abort_after_errors=3) -> list[dict]:
    """One record per item: raw text, parsed answer, correctness, latency (monotonic clock)."""
    from tqdm import tqdm

    records, errors_in_a_row = [], 0
    for item in tqdm(items, desc=f"answering ({answerer.name})", unit="q", disable=not progress):
        t0 = time.monotonic()
        error = None
        try:
            raw = answerer.answer(item, data_dir)
        except Exception as e:  # a failed query is a wrong, reported answer, not a crash
            raw, error = None, f"{type(e).__name__}: {e}"
        ms = (time.monotonic() - t0) * 1000
        errors_in_a_row = errors_in_a_row + 1 if error else 0
        if error and errors_in_a_row >= abort_after_errors and len(records) + 1 == errors_in_a_row:
            raise RuntimeError(f"the first {errors_in_a_row} queries failed, last: {error}")
        parsed = parse_answer(item, raw) if raw is not None else None
        rec = {"id": item["id"], "type": item["type"], "set": item["set"], "lite": item["lite"], "raw": raw,
               "parsed": parsed, "parsed_ok": parsed is not None, "error": error, "latency_ms": ms}
        if item["type"] == "plan":
            rec["k"] = item["k"]
            rec.update(P.score_plan(item, parsed))
            rec["correct"] = rec["exact"]
        else:
            rec["correct"] = parsed == item["answer"]
        records.append(rec)
    return records


def _type_row(recs, chance):
    n = len(recs)
    k = sum(r["correct"] for r in recs)
    crit = critical_count(n, chance)
    ci = _ci(k, n)
    return {"n": n, "correct": k, "accuracy": k / n if n else None, "ci": ci, "chance": chance,
            "critical_count": crit, "critical_accuracy": crit / n if crit is not None else None,
            "above_chance": crit is not None and k >= crit, "ci_covers_chance": ci[0] <= chance <= ci[1],
            "unparseable": sum(not r["parsed_ok"] for r in recs), "errors": sum(r["error"] is not None for r in recs),
            "latency_ms": _latency([r["latency_ms"] for r in recs])}


def _bootstrap_mean(x, n_boot=5000, seed=0):
    x = np.asarray(x, float)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(1)
    lo, hi = np.percentile(means, (2.5, 97.5))
    return [float(lo), float(hi)]


def summarize(records, answerer_name, manifest) -> dict:
    out = {"answerer": answerer_name, "set_sha256": manifest.get("sha256"), "n_items": len(records),
           "elementary": {}, "elementary_lite": {}, "planning": {}}
    for t in Q.TYPES:
        recs = [r for r in records if r["type"] == t]
        if recs:
            out["elementary"][t] = _type_row(recs, Q.CHANCE[t])
            lite = [r for r in recs if r["lite"]]
            if lite:
                out["elementary_lite"][t] = _type_row(lite, Q.CHANCE[t])
    ks = sorted({r["k"] for r in records if r["type"] == "plan"})
    for k in ks:
        recs = [r for r in records if r["type"] == "plan" and r["k"] == k]
        n = len(recs)
        ch = P.plan_chance(k)
        ex, st = sum(r["exact"] for r in recs), sum(r["set"] for r in recs)
        ov = [r["overlap"] for r in recs]
        row = {"n": n, "exact": {"k": ex, "rate": ex / n, "ci": _ci(ex, n), "chance": ch["exact"]},
               "set": {"k": st, "rate": st / n, "ci": _ci(st, n), "chance": ch["set"]},
               "overlap": {"mean": float(np.mean(ov)), "ci": _bootstrap_mean(ov), "chance": ch["overlap"]},
               "unparseable": sum(not r["parsed_ok"] for r in recs),
               "latency_ms": _latency([r["latency_ms"] for r in recs])}
        for key in ("exact", "set"):
            row[key]["ci_covers_chance"] = row[key]["ci"][0] <= row[key]["chance"] <= row[key]["ci"][1]
        row["overlap"]["ci_covers_chance"] = row["overlap"]["ci"][0] <= ch["overlap"] <= row["overlap"]["ci"][1]
        out["planning"][f"k{k}"] = row
    all_ms = [r["latency_ms"] for r in records]
    out["latency_ms"] = _latency(all_ms)
    out["unparseable"] = sum(not r["parsed_ok"] for r in records)
    out["errors"] = sum(r["error"] is not None for r in records)
    _add_family_bands(out)
    return out


def seed_sweep(items, data_dir, manifest, seeds) -> dict:
    """The random answerer over many seeds: how often each type's Wilson interval covers chance
    (about 95% expected) and the mean accuracy. One run can miss on a type by chance alone: with
    11 types a perfectly random answerer covers chance on all of them in only ~57% of runs."""
    from eval.reasoning.answerers import RandomAnswerer

    cover: dict[str, list[bool]] = {}
    acc: dict[str, list[float]] = {}
    family: dict[str, list[bool]] = {}
    for seed in seeds:
        s = summarize(run_items(items, RandomAnswerer(seed=seed), data_dir, progress=False), "random", manifest)
        for table, chk in s["chance_check"]["tables"].items():
            family.setdefault(table, []).append(chk["all_covered"])
        for t, r in s["elementary"].items():
            cover.setdefault(t, []).append(r["ci_covers_chance"])
            acc.setdefault(t, []).append(r["accuracy"])
        for k, r in s["planning"].items():
            for m in ("exact", "set", "overlap"):
                cover.setdefault(f"plan_{k}_{m}", []).append(r[m]["ci_covers_chance"])
                acc.setdefault(f"plan_{k}_{m}", []).append(r[m]["rate" if m != "overlap" else "mean"])
    cells = [c for v in cover.values() for c in v]
    return {"seeds": list(seeds), "coverage_all": sum(cells) / len(cells),
            "family_all_covered": {t: sum(v) / len(v) for t, v in family.items()},
            "rows": {t: {"coverage": sum(v) / len(v), "mean_accuracy": float(np.mean(acc[t]))} for t, v in cover.items()}}


def plot_planning(summary, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["planning"]
    if not rows:
        return
    ks = [int(k[1:]) for k in rows]
    fig, ax = plt.subplots(figsize=(5.2, 3.4), dpi=110)
    for key, color in (("exact", "C0"), ("set", "C1"), ("overlap", "C2")):
        vals = [rows[f"k{k}"][key]["rate" if key != "overlap" else "mean"] for k in ks]
        lo = [rows[f"k{k}"][key]["ci"][0] for k in ks]
        hi = [rows[f"k{k}"][key]["ci"][1] for k in ks]
        ax.plot(ks, vals, "o-", color=color, label=key)
        ax.fill_between(ks, lo, hi, color=color, alpha=0.15)
        ax.plot(ks, [rows[f"k{k}"][key]["chance"] for k in ks], ":", color=color, lw=1)
    ax.set_xlabel("k (intermediate states to choose)")
    ax.set_ylabel("score")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(f"Plan-k-step: {summary['answerer']} (dotted: chance)", fontsize=10)
    ax.legend(fontsize=8, loc="center right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _pct(x):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def write_markdown(summary, path) -> None:
    s = summary
    lines = [f"# Assembly reasoning probe: `{s['answerer']}`", "",
             f"Set sha256 `{s['set_sha256']}`; {s['n_items']} items; unparseable answers {s['unparseable']}; "
             f"query errors {s['errors']}.", ""]
    lat = s["latency_ms"]
    if lat:
        lines += [f"Latency per question (ms): mean {lat['mean']:.2f}, p50 {lat['p50']:.2f}, p90 {lat['p90']:.2f}, "
                  f"max {lat['max']:.2f}.", ""]
    for title, key in (("Elementary questions (100 per type)", "elementary"), ("Lite subset (20 per type)", "elementary_lite")):
        rows = s[key]
        if not rows:
            continue
        lines += [f"## {title}", "",
                  "| type | n | accuracy | 95% Wilson CI | chance | critical acc. (p<0.05) | above chance | CI covers chance "
                  "| family-wise CI | covers chance (family-wise) | unparseable | latency mean (ms) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for t, r in rows.items():
            lines.append(f"| {t} | {r['n']} | {_pct(r['accuracy'])} | {_pct(r['ci'][0])} - {_pct(r['ci'][1])} | "
                         f"{_pct(r['chance'])} | {_pct(r['critical_accuracy'])} | {'yes' if r['above_chance'] else 'no'} | "
                         f"{'yes' if r['ci_covers_chance'] else 'no'} | "
                         f"{_pct(r['ci_family'][0])} - {_pct(r['ci_family'][1])} | "
                         f"{'yes' if r['ci_family_covers_chance'] else 'no'} | {r['unparseable']} | "
                         f"{r['latency_ms']['mean']:.2f} |")
        chk = s["chance_check"]["tables"][key]
        lines += ["", f"Every row's interval covers chance: {'yes' if chk['all_covered'] else 'no'} with the family-wise "
                  f"band (95% for all {chk['rows']} rows together: Bonferroni, z = {chk['z']:.2f}); "
                  f"{'yes' if chk['all_covered_per_row_95'] else 'no'} with each row's own 95% interval. "
                  "Chance-level answers are expected to leave the per-row band on some row of a table this size.", ""]
    if s["planning"]:
        lines += ["## Plan-k-step (20 per k)", "",
                  "exact: the chosen list is a legal complete path (any order the constraints allow); set: exactly "
                  "the valid candidates, order ignored; overlap: share of the k chosen that are valid.", "",
                  "| k | n | exact | exact CI | exact chance | set | set CI | set chance | overlap | overlap CI | unparseable |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for k, r in s["planning"].items():
            e, st, o = r["exact"], r["set"], r["overlap"]
            lines.append(f"| {k[1:]} | {r['n']} | {_pct(e['rate'])} | {_pct(e['ci'][0])} - {_pct(e['ci'][1])} | "
                         f"{e['chance']:.2g} | {_pct(st['rate'])} | {_pct(st['ci'][0])} - {_pct(st['ci'][1])} | "
                         f"{st['chance']:.2g} | {_pct(o['mean'])} | {_pct(o['ci'][0])} - {_pct(o['ci'][1])} | {r['unparseable']} |")
        chk = s["chance_check"]["tables"]["planning"]
        lines += ["", f"Exact and set intervals cover chance on every k: {'yes' if chk['all_covered'] else 'no'} "
                  f"family-wise ({chk['rows']} rows, z = {chk['z']:.2f}); "
                  f"{'yes' if chk['all_covered_per_row_95'] else 'no'} per row at 95%. Where 20 x chance is below 1 (set "
                  "match from k = 4 on) one lucky hit puts a Wilson interval above chance, so these rows hold "
                  "their level less well than the elementary ones.", "",
                  "![planning curve](planning_curve.png)", ""]
    sw = s.get("seed_sweep")
    if sw:
        lines += [f"## Random answerer over {len(sw['seeds'])} seeds", "",
                  f"Share of runs whose 95% Wilson interval covers chance (expected about 95%): "
                  f"{_pct(sw['coverage_all'])} over all rows. A single run can miss on a type by chance alone.",
                  "Share of runs whose family-wise band covers chance on every row of a table (expected at least "
                  "95%): " + ", ".join(f"{t} {_pct(v)}" for t, v in sw.get("family_all_covered", {}).items()) + ".", "",
                  "| row | coverage | mean accuracy |", "|---|---|---|"]
        lines += [f"| {t} | {_pct(r['coverage'])} | {_pct(r['mean_accuracy'])} |" for t, r in sw["rows"].items()]
        lines.append("")
    Path(path).write_text("\n".join(lines))


def write_report(records, answerer_name, manifest, out, sweep=None) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(records, answerer_name, manifest)
    if sweep:
        summary["seed_sweep"] = sweep
    (out / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_planning(summary, out / "planning_curve.png")
    write_markdown(summary, out / "REPORT.md")
    return summary
