"""Run an answerer over a built set and write the report.

Per elementary type: accuracy with a Wilson 95% interval, the chance level and the critical
accuracy (smallest accuracy whose one-sided binomial p-value against chance is <= 0.05),
unparseable answers and latency. Overall and Lite Overall (the paper's headline numbers): the mean of
the 11 types' accuracies, with its chance (the mean of theirs: 27.5% with the paper's option counts),
a Wilson interval on the pooled count and the critical accuracy of the pooled count under chance
(a sum of binomials, exact). Planning: exact / set match (Wilson) and mean overlap
(percentile bootstrap) against k, with their chance levels, and a PNG curve.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from assembly_probe import planning as P
from assembly_probe import questions as Q
from assembly_probe.answerers import QueryError
from assembly_probe.parsing import has_answer_marker, parse_answer
from binomial_stats import wilson

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


def _p_some_row_above(rows) -> float:
    """Probability that an answerer exactly at chance reaches the per-row critical count on at least one row."""
    from scipy.stats import binom

    p_none = 1.0
    for r in rows:
        if r["critical_count"] is not None:
            p_none *= 1 - float(binom.sf(r["critical_count"] - 1, r["n"], r["chance"]))
    return 1 - p_none


def _add_family_bands(summary) -> None:
    """Family-wise (Bonferroni) intervals per table, and whether every row's covers chance."""
    check = {table: _family_check([(r, r["correct"], r["n"]) for r in summary[table].values()])
             for table in ("elementary", "elementary_lite")}
    for table in ("elementary", "elementary_lite"):  # the paper's one-sided test, at alpha / rows
        rows = summary[table]
        alpha_f = ALPHA / max(len(rows), 1)
        for r in rows.values():
            c = critical_count(r["n"], r["chance"], alpha_f)
            r["critical_count_family"] = c
            r["above_chance_family"] = c is not None and r["correct"] >= c
        check[table]["alpha_family"] = alpha_f
        check[table]["none_above_family"] = not any(r["above_chance_family"] for r in rows.values())
        check[table]["above_per_row"] = [t for t, r in rows.items() if r["above_chance"]]
        check[table]["p_some_row_above_at_chance"] = _p_some_row_above(rows.values())
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


class RunStopped(RuntimeError):
    """Too many queries failed; ``records`` holds what was answered before the stop."""

    def __init__(self, message: str, records: list[dict]):
        super().__init__(message)
        self.records = records


INFO_KEYS = ("attempts", "retry_wait_s", "status", "server_model", "finish_reason", "prompt_tokens",
             "completion_tokens", "refused")


def run_items(items, answerer, data_dir, progress=True, max_fail_share=0.1, min_failures=3,
              extract_with: str | None = None) -> list[dict]:
    """One record per item: raw text, parsed answer, correctness, latency (monotonic clock).

    A failed query is a wrong, reported answer (its error text in the record). The run stops
    (:class:`RunStopped`) once at least ``min_failures`` queries failed and they are more than
    ``max_fail_share`` of those asked so far; items refused for their image count are not failures.
    ``extract_with``: a model on the answerer's endpoint asked for the final answer of replies the
    rules cannot parse; such answers are marked ``parsed_by: model`` and reported separately.
    """
    from tqdm import tqdm

    if extract_with and not hasattr(answerer, "extract"):
        raise ValueError(f"--extract-with needs the http answerer (it asks a model on the same endpoint), "
                         f"not {answerer.name!r}")
    records, failed, asked = [], 0, 0
    for item in tqdm(items, desc=f"answering ({answerer.name})", unit="q", disable=not progress):
        t0 = time.monotonic()
        if hasattr(answerer, "last_info"):
            answerer.last_info = {}
        error, info = None, {}
        try:
            raw = answerer.answer(item, data_dir)
            info = dict(getattr(answerer, "last_info", None) or {})
        except Exception as e:  # a failed query is a wrong, reported answer, not a crash
            raw, error = None, str(e) if isinstance(e, QueryError) else f"{type(e).__name__}: {e}"
            info = dict(getattr(e, "info", None) or {})
        wall_ms = (time.monotonic() - t0) * 1000
        ms = wall_ms - 1000 * float(info.get("retry_wait_s") or 0.0)  # latency: the queries, not the waits between
        refused = bool(info.get("refused"))
        if not refused:
            asked += 1
            failed += error is not None
        parsed = parse_answer(item, raw) if raw is not None else None
        cut = info.get("finish_reason") == "length"
        if cut and parsed is not None and not has_answer_marker(raw):
            parsed = None  # ended at the token limit before its answer: a letter named mid-reasoning is no answer
        rec = {"id": item["id"], "type": item["type"], "set": item["set"], "lite": item["lite"], "raw": raw,
               "parsed": parsed, "parsed_ok": parsed is not None, "parsed_by": "rules" if parsed is not None else None,
               "error": error, "latency_ms": ms, "wall_ms": wall_ms}
        rec.update({k: info[k] for k in INFO_KEYS if k in info})
        if extract_with and raw is not None and parsed is None and not cut:  # a cut-off reply has no answer to find
            try:
                ext = answerer.extract(item, raw, extract_with)
                rec["extracted_raw"] = ext
                parsed = parse_answer(item, ext)
                if parsed is not None:
                    rec.update(parsed=parsed, parsed_ok=True, parsed_by="model")
            except Exception as e:  # noqa: BLE001 - the extraction is a fallback; its failure is recorded
                rec["extract_error"] = str(e)
        if item["type"] == "plan":
            rec["k"] = item["k"]
            rec.update(P.score_plan(item, parsed))
            rec["correct"] = rec["exact"]
        else:
            rec["correct"] = parsed == item["answer"]
        records.append(rec)
        if error and not refused and failed >= min_failures and failed > max_fail_share * asked:
            raise RunStopped(f"stopped after {asked} queries: {failed} failed ({100 * failed / asked:.0f}%, more "
                             f"than --max-fail-share {max_fail_share:g}); last: {item['id']}: {error}", records)
    if asked and failed == asked:  # too few to trip the share rule: a report of errors alone is no result
        last = next(r for r in reversed(records) if r["error"])
        raise RunStopped(f"every query failed ({failed} of {asked}); last: {last['id']}: {last['error']}", records)
    return records


def cut_off(recs) -> int:
    """Replies the server ended at the token limit (finish_reason ``length``): an answer cut off mid-way counts
    wrong, so a run says how many there were (raise --max-tokens)."""
    return sum(r.get("finish_reason") == "length" for r in recs)


def _type_row(recs, chance):
    n = len(recs)
    k = sum(r["correct"] for r in recs)
    crit = critical_count(n, chance)
    ci = _ci(k, n)
    return {"n": n, "correct": k, "accuracy": k / n if n else None, "ci": ci, "chance": chance,
            "critical_count": crit, "critical_accuracy": crit / n if crit is not None else None,
            "above_chance": crit is not None and k >= crit, "ci_covers_chance": ci[0] <= chance <= ci[1],
            "unparseable": sum(not r["parsed_ok"] for r in recs), "errors": sum(r["error"] is not None for r in recs),
            "cut_off": cut_off(recs), "refused": sum(bool(r.get("refused")) for r in recs),
            "parsed_by_model": sum(r.get("parsed_by") == "model" for r in recs),
            "correct_rules_only": sum(r["correct"] and r.get("parsed_by") != "model" for r in recs),
            "latency_ms": _latency([r["latency_ms"] for r in recs])}


def pooled_critical_count(rows, alpha: float = ALPHA) -> int | None:
    """Smallest c with P(sum of Binomial(n_t, chance_t) over the rows >= c) <= alpha (exact convolution)."""
    from scipy.stats import binom

    pmf = np.array([1.0])
    for r in rows:
        pmf = np.convolve(pmf, binom.pmf(np.arange(r["n"] + 1), r["n"], r["chance"]))
    tail = np.cumsum(pmf[::-1])[::-1]  # tail[c] = P(total >= c)
    hits = np.nonzero(tail <= alpha)[0]
    return int(hits[0]) if len(hits) else None


def overall_row(rows: dict) -> dict | None:
    """The paper's Overall: the mean of the types' accuracies, with the mean chance; the interval and the
    critical accuracy are those of the pooled count (the same as the mean when every type has the same n)."""
    if not rows:
        return None
    vals = list(rows.values())
    n, k = sum(r["n"] for r in vals), sum(r["correct"] for r in vals)
    acc = float(np.mean([r["accuracy"] for r in vals]))
    chance = float(np.mean([r["chance"] for r in vals]))
    crit = pooled_critical_count(vals)
    ci = _ci(k, n)
    return {"types": len(vals), "n": n, "correct": k, "accuracy": acc, "ci": ci, "chance": chance,
            "critical_count": crit, "critical_accuracy": crit / n if crit is not None else None,
            "above_chance": crit is not None and k >= crit, "ci_covers_chance": ci[0] <= chance <= ci[1],
            "equal_n": len({r["n"] for r in vals}) == 1}


def _bootstrap_mean(x, n_boot=5000, seed=0):
    x = np.asarray(x, float)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(1)
    lo, hi = np.percentile(means, (2.5, 97.5))
    return [float(lo), float(hi)]


def summarize(records, answerer_name, manifest, answerer_info: dict | None = None) -> dict:
    out = {"answerer": answerer_name, "set_sha256_states": manifest.get("sha256_states"), "n_items": len(records),
           "elementary": {}, "elementary_lite": {}, "planning": {}}
    if answerer_info:
        out["answerer_info"] = answerer_info
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
               "unparseable": sum(not r["parsed_ok"] for r in recs), "cut_off": cut_off(recs),
               "latency_ms": _latency([r["latency_ms"] for r in recs])}
        for key in ("exact", "set"):
            row[key]["ci_covers_chance"] = row[key]["ci"][0] <= row[key]["chance"] <= row[key]["ci"][1]
        row["overlap"]["ci_covers_chance"] = row["overlap"]["ci"][0] <= ch["overlap"] <= row["overlap"]["ci"][1]
        out["planning"][f"k{k}"] = row
    out["overall"] = {table: overall_row(out[table]) for table in ("elementary", "elementary_lite")}
    # the paper's three levels: the mean of their types' accuracies, as Overall is of all 11
    out["levels"] = {table: {level: overall_row({t: out[table][t] for t in types if t in out[table]})
                             for level, types in Q.LEVELS.items() if any(t in out[table] for t in types)}
                     for table in ("elementary", "elementary_lite")}
    all_ms = [r["latency_ms"] for r in records]
    out["latency_ms"] = _latency(all_ms)
    out["queries"] = query_stats(records)
    out["unparseable"] = sum(not r["parsed_ok"] for r in records)
    out["cut_off"] = cut_off(records)
    out["errors"] = sum(r["error"] is not None for r in records)
    _add_family_bands(out)
    return out


def query_stats(records) -> dict:
    """What the server said: finish reasons, token counts, retries, refusals, model-assisted extraction."""
    reasons: dict[str, int] = {}
    for r in records:
        if "finish_reason" in r:
            reasons[str(r["finish_reason"])] = reasons.get(str(r["finish_reason"]), 0) + 1
    tok = lambda key: [r[key] for r in records if isinstance(r.get(key), int)]  # noqa: E731
    pt, ct = tok("prompt_tokens"), tok("completion_tokens")
    models = sorted({str(r["server_model"]) for r in records if r.get("server_model")})
    ext = [r for r in records if "extracted_raw" in r or "extract_error" in r]
    by_model = [r for r in records if r.get("parsed_by") == "model"]
    return {"finish_reasons": reasons, "server_models": models,
            "prompt_tokens": {"sum": sum(pt), "mean": sum(pt) / len(pt)} if pt else None,
            "completion_tokens": {"sum": sum(ct), "mean": sum(ct) / len(ct), "max": max(ct)} if ct else None,
            "retried": sum((r.get("attempts") or 1) > 1 for r in records),
            "retry_wait_s": round(sum(r.get("retry_wait_s") or 0.0 for r in records), 3),
            "refused": sum(bool(r.get("refused")) for r in records),
            "extraction": {"asked": len(ext), "parsed": len(by_model), "correct": sum(r["correct"] for r in by_model),
                           "failed": sum("extract_error" in r for r in ext)}}


def seed_sweep(items, data_dir, manifest, seeds) -> dict:
    """The random answerer over many seeds: how often each type's Wilson interval covers chance
    (about 95% expected) and the mean accuracy. One run can miss on a type by chance alone: with
    11 types a perfectly random answerer covers chance on all of them in only ~57% of runs."""
    from assembly_probe.answerers import RandomAnswerer

    cover: dict[str, list[bool]] = {}
    acc: dict[str, list[float]] = {}
    family: dict[str, list[bool]] = {}
    none_above: dict[str, list[bool]] = {}
    some_above_per_row: dict[str, list[bool]] = {}
    for seed in seeds:
        s = summarize(run_items(items, RandomAnswerer(seed=seed), data_dir, progress=False), "random", manifest)
        for table, chk in s["chance_check"]["tables"].items():
            family.setdefault(table, []).append(chk["all_covered"])
            if "none_above_family" in chk:
                none_above.setdefault(table, []).append(chk["none_above_family"])
                some_above_per_row.setdefault(table, []).append(bool(chk["above_per_row"]))
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
            "family_none_above": {t: sum(v) / len(v) for t, v in none_above.items()},
            "per_row_some_above": {t: sum(v) / len(v) for t, v in some_above_per_row.items()},
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


def plot_elementary(summary, path) -> None:
    """Accuracy per type (Wilson 95% bars) against chance and the critical accuracy (p < 0.05), both tables."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = [(key, title) for key, title in (("elementary", "all"), ("elementary_lite", "Lite"))
              if summary[key]]
    if not tables:
        return
    fig, axes = plt.subplots(1, len(tables), figsize=(5.6 * len(tables), 3.8), dpi=110, squeeze=False)
    for ax, (key, title) in zip(axes[0], tables):
        rows = summary[key]
        names = list(rows)
        x = np.arange(len(names))
        acc = np.array([rows[t]["accuracy"] for t in names])
        lo = acc - np.array([rows[t]["ci"][0] for t in names])
        hi = np.array([rows[t]["ci"][1] for t in names]) - acc
        colors = ["C2" if rows[t]["above_chance"] else "C7" for t in names]
        ax.bar(x, acc, color=colors, alpha=0.8, width=0.7)
        ax.errorbar(x, acc, yerr=[lo, hi], fmt="none", ecolor="k", elinewidth=1, capsize=2)
        for i, t in enumerate(names):
            ax.hlines(rows[t]["chance"], i - 0.4, i + 0.4, colors="C3", lw=1.6,
                      label="chance" if i == 0 else None)
            if rows[t]["critical_accuracy"] is not None:
                ax.hlines(rows[t]["critical_accuracy"], i - 0.4, i + 0.4, colors="C0", lw=1.2, linestyles="--",
                          label="critical (p<0.05)" if i == 0 else None)
            if rows[t].get("critical_count_family") is not None:
                ax.hlines(rows[t]["critical_count_family"] / rows[t]["n"], i - 0.4, i + 0.4, colors="C4", lw=1.0,
                          linestyles=":", label="critical, family-wise" if i == 0 else None)
        n = rows[names[0]]["n"]
        ax.set_xticks(x, [t.replace("_", " ") for t in names], rotation=55, ha="right", fontsize=7)
        ax.set_ylim(0, 1.03)
        ax.set_ylabel("accuracy")
        ax.set_title(f"{summary['answerer']}: {title} (n = {n} per type; green: above critical p<0.05)", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _pct(x):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def write_markdown(summary, path) -> None:
    s = summary
    from assembly_probe import caveats

    lines = [f"# Assembly reasoning probe: `{s['answerer']}`", "",
             f"Set sha256_states `{s['set_sha256_states']}`; {s['n_items']} items; unparseable answers "
             f"{s['unparseable']}; query errors {s['errors']}; replies cut off at the token limit {s.get('cut_off', 0)}.",
             "", "Not comparable with the LEGO-Puzzles paper's table: this is a stand-in built on this benchmark's "
             "parts (see About this set, below). Lite and single-k planning rows rest on 20 and 20 items: read their "
             "Wilson ranges, and do not rank models where the ranges overlap.", ""]
    info = s.get("answerer_info")
    if info and info.get("name") == "http":
        lines += [f"Model `{info.get('model')}` at `{info.get('endpoint')}`"
                  + (f" (the server names it {', '.join(f'`{m}`' for m in s['queries']['server_models'])})"
                     if s["queries"]["server_models"] else "")
                  + f"; prompt style {info.get('prompt_style')}; max tokens {info.get('max_tokens')}"
                  + f"; max images per request {info.get('max_images') or 'unlimited'}"
                  + (f" ({info.get('over_limit')} above it)" if info.get("max_images") else "")
                  + f"; retries {info.get('retries')}.", ""]
    q = s.get("queries") or {}
    if q.get("finish_reasons") or q.get("refused") or q.get("retried"):
        tok = q.get("completion_tokens")
        lines += ["Finish reasons: " + (", ".join(f"{k} {v}" for k, v in sorted(q["finish_reasons"].items())) or "none")
                  + (f"; completion tokens mean {tok['mean']:.0f}, max {tok['max']}" if tok else "")
                  + (f"; prompt tokens mean {q['prompt_tokens']['mean']:.0f}" if q.get("prompt_tokens") else "")
                  + f"; retried queries {q['retried']} ({q['retry_wait_s']:.1f} s waiting); "
                  f"refused for their image count {q['refused']}.", ""]
    if q.get("extraction", {}).get("asked"):
        e = q["extraction"]
        lines += [f"Model-assisted extraction (`{info.get('extract_with') if info else ''}`): asked for {e['asked']} "
                  f"replies the rules could not parse; {e['parsed']} parsed, {e['correct']} of them correct, "
                  f"{e['failed']} failed. The accuracy columns count them; 'rules only' does not.", ""]
    lat = s["latency_ms"]
    if lat:
        lines += [f"Latency per question (ms; the waits between retries not counted): mean {lat['mean']:.2f}, "
                  f"p50 {lat['p50']:.2f}, p90 {lat['p90']:.2f}, max {lat['max']:.2f}.", ""]
    ov = s.get("overall") or {}
    if any(ov.values()):
        lines += ["## Overall", "",
                  "The mean of the types' accuracies (the paper's Overall and Lite Overall); the interval and the "
                  "critical accuracy are those of the pooled count under each type's chance.", "",
                  "| table | types | n | overall | 95% Wilson CI | chance | critical acc. (p<0.05) | above chance |",
                  "|---|---|---|---|---|---|---|---|"]
        for key, name in (("elementary", "Overall"), ("elementary_lite", "Lite Overall")):
            o = ov.get(key)
            if o:
                lines.append(f"| {name} | {o['types']} | {o['n']} | {_pct(o['accuracy'])} | {_pct(o['ci'][0])} - "
                             f"{_pct(o['ci'][1])} | {_pct(o['chance'])} | {_pct(o['critical_accuracy'])} | "
                             f"{'yes' if o['above_chance'] else 'no'} |")
        lines.append("")
    lv = s.get("levels") or {}
    if any(lv.values()):
        lines += ["## The paper's three levels", "",
                  "The mean of the level's types' accuracies (Spatial Understanding: height, adjacency, rotation, "
                  "multiview; Single-Step Reasoning: rotation status, position, next step, dependency; Multi-Step "
                  "Reasoning: backwards, ordering, outlier); interval and critical accuracy of the pooled count.", "",
                  "| table | level | types | n | accuracy | 95% Wilson CI | chance | critical acc. (p<0.05) |",
                  "|---|---|---|---|---|---|---|---|"]
        for key, name in (("elementary", "Overall"), ("elementary_lite", "Lite")):
            for level, o in (lv.get(key) or {}).items():
                if o:
                    lines.append(f"| {name} | {Q.LEVEL_NAMES[level]} | {o['types']} | {o['n']} | {_pct(o['accuracy'])} "
                                 f"| {_pct(o['ci'][0])} - {_pct(o['ci'][1])} | {_pct(o['chance'])} | "
                                 f"{_pct(o['critical_accuracy'])} |")
        lines.append("")
    for title, key in (("Elementary questions", "elementary"), ("Lite subset", "elementary_lite")):
        rows = s[key]
        if not rows:
            continue
        sizes = sorted({r["n"] for r in rows.values()})
        title += f" ({sizes[0]} per type)" if len(sizes) == 1 else f" ({sizes[0]}-{sizes[-1]} per type)"
        lines += [f"## {title}", "",
                  "| type | n | accuracy | 95% Wilson CI | chance | critical acc. (p<0.05) | above chance "
                  "| critical acc. (family-wise) | above chance (family-wise) | CI covers chance "
                  "| family-wise CI | covers chance (family-wise) | unparseable | errors | cut off | latency mean (ms) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for t, r in rows.items():
            cf = r["critical_count_family"]
            lines.append(f"| {t} | {r['n']} | {_pct(r['accuracy'])} | {_pct(r['ci'][0])} - {_pct(r['ci'][1])} | "
                         f"{_pct(r['chance'])} | {_pct(r['critical_accuracy'])} | {'yes' if r['above_chance'] else 'no'} | "
                         f"{_pct(cf / r['n'] if cf is not None else None)} | "
                         f"{'yes' if r['above_chance_family'] else 'no'} | "
                         f"{'yes' if r['ci_covers_chance'] else 'no'} | "
                         f"{_pct(r['ci_family'][0])} - {_pct(r['ci_family'][1])} | "
                         f"{'yes' if r['ci_family_covers_chance'] else 'no'} | {r['unparseable']} | {r['errors']} | "
                         f"{r.get('cut_off', 0)} | {r['latency_ms']['mean']:.2f} |")
        chk = s["chance_check"]["tables"][key]
        per_row = chk["above_per_row"]
        lines += ["", f"Above chance on some row by the family-wise one-sided test (p < 0.05 for all {chk['rows']} rows "
                  f"together, each row at p < {chk['alpha_family']:.4f}): "
                  f"{'no' if chk['none_above_family'] else 'yes'}. Row by row at p < 0.05 (the paper's critical "
                  f"accuracy): {', '.join(per_row) if per_row else 'none'}"
                  + (f" (an answerer exactly at chance reaches it on some row of this table with probability "
                     f"{_pct(chk['p_some_row_above_at_chance'])})" if per_row and chk["none_above_family"] else "") + ".",
                  f"Every row's interval covers chance: {'yes' if chk['all_covered'] else 'no'} with the family-wise "
                  f"band (95% for all {chk['rows']} rows together: Bonferroni, z = {chk['z']:.2f}); "
                  f"{'yes' if chk['all_covered_per_row_95'] else 'no'} with each row's own 95% interval. "
                  "Chance-level answers are expected to leave the per-row band on some row of a table this size.", ""]
        if any(r["parsed_by_model"] for r in rows.values()):
            lines += ["Rules only (answers the model-assisted extraction recovered count wrong): "
                      + ", ".join(f"{t} {_pct(r['correct_rules_only'] / r['n'])}" for t, r in rows.items()) + ".", ""]
        if key == "elementary":
            lines += ["![accuracy per type](accuracy_by_type.png)", ""]
    if s["planning"]:
        sizes = sorted({r["n"] for r in s["planning"].values()})
        per_k = f"{sizes[0]} per k" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]} per k"
        lines += [f"## Plan-k-step ({per_k})", "",
                  "exact: the chosen list is a legal complete path (any order the constraints allow); set: exactly "
                  "the valid candidates, order ignored; overlap: share of the k chosen that are valid.", "",
                  "| k | n | exact | exact CI | exact chance | set | set CI | set chance | overlap | overlap CI | unparseable "
                  "| cut off |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for k, r in s["planning"].items():
            e, st, o = r["exact"], r["set"], r["overlap"]
            lines.append(f"| {k[1:]} | {r['n']} | {_pct(e['rate'])} | {_pct(e['ci'][0])} - {_pct(e['ci'][1])} | "
                         f"{e['chance']:.2g} | {_pct(st['rate'])} | {_pct(st['ci'][0])} - {_pct(st['ci'][1])} | "
                         f"{st['chance']:.2g} | {_pct(o['mean'])} | {_pct(o['ci'][0])} - {_pct(o['ci'][1])} | "
                         f"{r['unparseable']} | {r.get('cut_off', 0)} |")
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
                  "95%): " + ", ".join(f"{t} {_pct(v)}" for t, v in sw.get("family_all_covered", {}).items()) + ".",
                  "Share of runs with no row above chance by the family-wise one-sided test (expected at least 95%): "
                  + ", ".join(f"{t} {_pct(v)}" for t, v in sw.get("family_none_above", {}).items())
                  + "; with some row at the per-row critical accuracy (p < 0.05): "
                  + ", ".join(f"{t} {_pct(v)}" for t, v in sw.get("per_row_some_above", {}).items()) + ".", "",
                  "| row | coverage | mean accuracy |", "|---|---|---|"]
        lines += [f"| {t} | {_pct(r['coverage'])} | {_pct(r['mean_accuracy'])} |" for t, r in sw["rows"].items()]
        lines.append("")
    lines += caveats.lines()
    Path(path).write_text("\n".join(lines))


def write_report(records, answerer_name, manifest, out, sweep=None, answerer_info: dict | None = None) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(records, answerer_name, manifest, answerer_info)
    if sweep:
        summary["seed_sweep"] = sweep
    (out / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_planning(summary, out / "planning_curve.png")
    plot_elementary(summary, out / "accuracy_by_type.png")
    write_markdown(summary, out / "REPORT.md")
    return summary
