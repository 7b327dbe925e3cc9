"""Reports of benchmark runs (spec BENCHMARK.md sections 2, 4, 5, 6 and 8).

From one or several ``tries.jsonl`` files (one file = one model) this module
writes, into an output folder:

* ``summary.json``  -- one model: its summary (:func:`build_summary`);
  several: ``{"models": {name: summary}, "paired": {"A - B": ...}}``.
  All rates are fractions in 0..1 (fields named ``rate``, ``diff``, ``ci``);
  n/a is ``null``.  Percentages only appear in the presentation files.
* ``per_config.csv`` -- one row per model and setup: model, setup, name, group,
  difficulty, k, n, rate, wilson_low, wilson_high, scored (the 30 scored
  setups always, empty fields where a setup has no tries; full-board setups
  only where they were run, with ``scored`` false).
* ``REPORT.md``     -- leaderboard, by-group, by-difficulty and every-setup
  tables, weakest setups, secondary metrics, full-board task, and for several
  models the paired differences.
* ``groups.png``    -- success per group (and S) with 95 % bootstrap bars.
* ``heatmap.png``   -- setup x model success rates, annotated.

Scoring is :mod:`eval.stats` (stratified bootstrap for groups, difficulty, S
and M; Wilson per setup); the full-board setups (FB*) are reported on their
own and never enter S or M.  A record needs only ``setup``, ``try`` and
``success``; every other field is optional.

CLI::

    python -m eval.report --tries A/tries.jsonl [--tries B/tries.jsonl ...] --out DIR [--name NAME ...]
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from env.predicate import VETO_FLAGS
from env.setups import DIFFICULTIES, FULL_BOARD_IDS, GROUPS, SCORED_IDS, SETUPS, difficulty_of, group_of
from eval.stats import (
    outcomes_from_records,
    paired_difference,
    paired_outcomes_from_records,
    score,
    score_to_dict,
    secondary,
    wilson,
)

__all__ = [
    "ReportError",
    "FLAG_NAMES",
    "load_tries",
    "build_summary",
    "paired_summary",
    "write_report",
    "render_markdown",
    "main",
]

FLAG_NAMES = ("wrong_hole", "rim", "penetration", "glitch", "dropped", "policy_hang", "sim_hang", "actor_died")
REQUIRED_FIELDS = ("setup", "try", "success")
N_WEAKEST = 3
RANKED_TRACKS = {"frozen": "yes", "reference": "no", "sanity": "no", "adapted": "no"}


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` beside ``path`` and rename it into place: readers never see half a file. An OSError
    (disk full, read-only) becomes a one-line ReportError."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ReportError(f"{path}: cannot write ({e.strerror or e}): free space or fix permissions, then rerun "
                          f"the same command (the tries are kept)") from None


class ReportError(ValueError):
    """Bad input to the report (message is one line)."""


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------
def load_tries(path: str | Path) -> list[dict]:
    """Records of a ``tries.jsonl``, one JSON object per line.

    Blank lines are skipped.  A last line that is not valid JSON (torn by a
    kill mid-write) is ignored; bad JSON on any other line, or a line that
    is not a JSON object, raises :class:`ReportError` naming file and line.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except OSError as e:
        raise ReportError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ReportError(f"{path}: not UTF-8 text") from None
    lines = text.split("\n")
    numbered = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    out: list[dict] = []
    for j, (lineno, line) in enumerate(numbered):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if j == len(numbered) - 1:
                break  # torn last line
            raise ReportError(f"{path}: line {lineno} is not JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise ReportError(f"{path}: line {lineno} is not a JSON object")
        out.append(rec)
    return out


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------
def _finite(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _ci(iv) -> list[float | None] | None:
    if iv is None:
        return None
    return [_finite(iv.low), _finite(iv.high)]


def _json_key(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _common(records: Sequence[Mapping], key: str, warnings: list[str]) -> Any:
    """The records' single value of ``key`` (``None`` if absent); several
    distinct values give a list of them (first-seen order) and a warning."""
    seen: dict[str, Any] = {}
    for r in records:
        v = r.get(key)
        if v is None:
            continue
        seen.setdefault(_json_key(v), v)
    if not seen:
        return None
    if len(seen) == 1:
        return next(iter(seen.values()))
    vals = list(seen.values())
    shown = ", ".join(_json_key(v) if isinstance(v, (dict, list)) else str(v) for v in vals[:5])
    warnings.append(f"records carry {len(vals)} different values of '{key}': {shown}")
    return vals


def predicate_of(records: Sequence[Mapping]) -> int:
    """The success predicate version of a model's records (records without the field are v1)."""
    versions = sorted({int(r.get("predicate", 1)) for r in records})
    if len(versions) > 1:
        raise ReportError("records were scored with several success predicates (" +
                          ", ".join(f"v{v}" for v in versions) + "); rerun the older tries")
    return versions[0]


def _truthy_field(rec: Mapping, key: str) -> bool:
    return rec.get(key) is True


def _flags_of(rec: Mapping) -> set[str]:
    flags = rec.get("flags") or ()
    if isinstance(flags, str):
        flags = (flags,)
    out = {str(f) for f in flags}
    if rec.get("dropped") is True:
        out.add("dropped")
    return out


def _flag_counts(records: Sequence[Mapping]) -> dict[str, int]:
    counts = {f: 0 for f in FLAG_NAMES}
    for r in records:
        for f in sorted(_flags_of(r)):
            counts[f] = counts.get(f, 0) + 1
    return counts


def _validate(records: Sequence[Any]) -> None:
    for i, r in enumerate(records):
        if not isinstance(r, Mapping):
            raise ReportError(f"record {i + 1} is not an object")
        for f in REQUIRED_FIELDS:
            if f not in r:
                raise ReportError(f"record {i + 1} lacks field '{f}' (setup={r.get('setup')!r}, try={r.get('try')!r})")
        if str(r["setup"]) not in SETUPS:
            raise ReportError(f"record {i + 1}: unknown setup {r['setup']!r}; valid: {', '.join(SETUPS)}")
    seen: set[tuple[str, str]] = set()
    for r in records:
        key = (str(r["setup"]), _json_key(r["try"]))
        if key in seen:
            raise ReportError(f"duplicate record for setup {r['setup']}, try {r['try']}")
        seen.add(key)


def _split_records(records: Iterable[Mapping]) -> tuple[list[Mapping], list[Mapping]]:
    scored, full = [], []
    for r in records:
        (full if str(r["setup"]) in FULL_BOARD_IDS else scored).append(r)
    return scored, full


def _setup_entry(sid: str, recs: Sequence[Mapping]) -> dict:
    s = SETUPS[sid]
    k = sum(1 for r in recs if bool(r["success"]))
    n = len(recs)
    ci = wilson(k, n) if n else None
    return {
        "name": s.name,
        "group": s.group,
        "difficulty": s.difficulty,
        "k": k,
        "n": n,
        "rate": (k / n) if n else None,
        "ci": _ci(ci),
        "flags": _flag_counts(recs),
        "no_flag_failures": sum(1 for r in recs if not bool(r["success"]) and not _flags_of(r)),
    }


def _weakest(setups: Mapping[str, dict], n: int = N_WEAKEST) -> list[dict]:
    ranked = [(e["rate"], i, sid) for i, (sid, e) in enumerate(setups.items())
              if e["rate"] is not None and e["k"] < e["n"]]
    ranked.sort()
    out = []
    for rate, _, sid in ranked[:n]:
        e = setups[sid]
        flags = sorted(((f, c) for f, c in e["flags"].items() if c), key=lambda fc: (-fc[1], fc[0]))
        out.append({"setup": sid, "name": e["name"], "group": e["group"], "difficulty": e["difficulty"],
                    "k": e["k"], "n": e["n"], "rate": rate,
                    "flags": [[f, c] for f, c in flags], "no_flag_failures": e["no_flag_failures"]})
    return out


# --------------------------------------------------------------------------
# Summary of one model
# --------------------------------------------------------------------------
def build_summary(records: Iterable[Mapping], *, model: str | None = None,
                  n_boot: int = 5000, seed: int = 0) -> dict:
    """JSON-safe summary of one model's tries (fractions, not percent).

    Keys: model, track, split, arm, machine, tasklist_sha256, backend, weights_sha256 (from the
    records; null when absent, a list when they disagree -- with a warning),
    n_tries, complete, missing, S, S_ci, M, M_ci, groups {g: {rate, ci,
    setups}} in GROUPS order, difficulty {d: {rate, ci, setups}}, setups {id:
    {name, group, difficulty, k, n, rate, ci (Wilson), flags,
    no_flag_failures}} for all 30 scored setups (n = 0 and rate null when a
    setup has no tries), weakest (the 3 lowest setups with their flags),
    secondary (:func:`eval.stats.secondary` over the scored tries),
    full_board {id: {..., k, n, rate, ci, blocks_inserted_mean}} (only setups
    that were run; never part of S or M), bootstrap, warnings.
    """
    records = list(records)
    _validate(records)
    if not records:
        raise ReportError("no tries to report")
    warnings: list[str] = []
    scored, full = _split_records(records)

    meta = {key: _common(records, key, warnings) for key in ("model", "track", "split", "arm", "machine",
                                                             "tasklist_sha256", "backend", "weights_sha256", "note")}
    name = model if model is not None else meta["model"]
    if isinstance(name, list):
        raise ReportError(f"records hold several models ({', '.join(map(str, name))}); one tries file = one model")
    if model is not None and meta["model"] is not None and meta["model"] != model:
        warnings.append(f"reported as '{model}'; the records name the model '{meta['model']}'")

    g_of, d_of = group_of(), difficulty_of()
    sc = score(outcomes_from_records(scored), g_of, d_of, n_boot=n_boot, seed=seed)
    sd = score_to_dict(sc)

    by_setup: dict[str, list[Mapping]] = {}
    for r in records:
        by_setup.setdefault(str(r["setup"]), []).append(r)
    setups = {sid: _setup_entry(sid, by_setup.get(sid, ())) for sid in SCORED_IDS}
    full_board = {}
    for sid in FULL_BOARD_IDS:
        recs = by_setup.get(sid)
        if not recs:
            continue
        e = _setup_entry(sid, recs)
        blocks = [float(r["blocks_inserted"]) for r in recs if r.get("blocks_inserted") is not None]
        e["blocks_inserted_mean"] = float(np.mean(blocks)) if blocks else None
        e["blocks_total"] = 3
        full_board[sid] = e

    ns = [e["n"] for e in setups.values() if e["n"]]
    if ns and min(ns) != max(ns):
        lo = min(setups, key=lambda s: setups[s]["n"] or 10**9)
        warnings.append(f"setups have unequal numbers of tries: {min(ns)} ({lo}) to {max(ns)}")
    if sc.missing:
        warnings.append(f"incomplete: missing setups {', '.join(sc.missing)}")

    groups = {}
    for g in GROUPS:
        d = sd["groups"].get(g, {"rate": None, "ci": None})
        groups[g] = {"rate": d["rate"], "ci": d["ci"], "setups": [c for c in SCORED_IDS if g_of[c] == g]}
    difficulty = {}
    for lvl in DIFFICULTIES:
        d = sd["difficulty"].get(lvl, {"rate": None, "ci": None})
        difficulty[lvl] = {"rate": d["rate"], "ci": d["ci"], "setups": [c for c in SCORED_IDS if d_of[c] == lvl]}

    sec = secondary(scored)
    sec["recovery_recorded"] = any("disturbance_fired" in r for r in scored)
    predicate = predicate_of(records)
    vetoed = [r for r in scored if _truthy_field(r, "success_raw") and not bool(r["success"])]
    vetoes = {f: sum(f in _flags_of(r) for r in vetoed) for f in VETO_FLAGS}

    summary = {
        "model": name,
        "track": meta["track"],
        "split": meta["split"],
        "arm": meta["arm"],
        "machine": meta["machine"],
        "tasklist_sha256": meta["tasklist_sha256"],
        "backend": meta["backend"],
        "weights_sha256": meta["weights_sha256"],
        "note": meta["note"],
        "predicate": predicate,
        # tries where the predicate held but a flag vetoed the success (v2 records say so; v1 did not veto)
        "vetoed": {"n": len(vetoed), "flags": {f: c for f, c in vetoes.items() if c}} if predicate >= 2 else None,
        # actions outside the controller's [-1, 1] (it clips them): tries with any, and the actions in all
        "actions_clipped": {"tries": sum(bool(r.get("actions_clipped")) for r in scored),
                            "actions": sum(int(r.get("actions_clipped") or 0) for r in scored)}
        if any("actions_clipped" in r for r in scored) else None,
        "n_tries": len(scored),
        "complete": sd["complete"],
        "missing": sd["missing"],
        "S": sd["S"],
        "S_ci": sd["S_ci"],
        "M": sd["M"],
        "M_ci": sd["M_ci"],
        "groups": groups,
        "difficulty": difficulty,
        "setups": setups,
        "weakest": _weakest({c: e for c, e in setups.items() if e["n"]}),
        "secondary": sec,
        "full_board": full_board,
        "bootstrap": {"n_boot": int(n_boot), "seed": seed, "level": 0.95,
                      "method": "stratified percentile bootstrap (tries within each setup)",
                      "setup_interval": "Wilson 95%"},
        "warnings": warnings,
    }
    json.dumps(summary, allow_nan=False)  # JSON-safe by construction; fail loudly if not
    return summary


# --------------------------------------------------------------------------
# Paired comparison of two models
# --------------------------------------------------------------------------
def paired_summary(records_a: Iterable[Mapping], records_b: Iterable[Mapping], *, name_a: str = "A",
                   name_b: str = "B", n_boot: int = 5000, seed: int = 0) -> dict:
    """Paired bootstrap of A - B over the scored tries both models share.

    Tries are matched on (setup, try); a pair whose records both carry a
    ``seed`` (or ``split``) that differs is not shared.  Models whose records
    name different task lists (``tasklist_sha256``) share nothing.  Returns
    ``{a, b, shared_tries, only_a, only_b, complete, missing, S: {diff, ci},
    groups: {g: {diff, ci}}, note}``; ``S``/``groups`` are null when nothing
    is shared (``note`` says why).  Never raises for unshared tries.
    """
    sa, _ = _split_records(records_a)
    sb, _ = _split_records(records_b)
    out: dict[str, Any] = {"a": name_a, "b": name_b, "shared_tries": 0, "only_a": len(sa), "only_b": len(sb),
                           "complete": False, "missing": list(SCORED_IDS), "S": None, "groups": None, "note": None}
    sha_a = {r.get("tasklist_sha256") for r in sa} - {None}
    sha_b = {r.get("tasklist_sha256") for r in sb} - {None}
    if sha_a and sha_b and sha_a != sha_b:
        out["note"] = (f"not compared: {name_a} and {name_b} ran different task lists "
                       f"({', '.join(sorted(map(str, sha_a)))[:16]}... vs {', '.join(sorted(map(str, sha_b)))[:16]}...)")
        return out
    ka = {(str(r["setup"]), _json_key(r["try"])): r for r in sa}
    kb = {(str(r["setup"]), _json_key(r["try"])): r for r in sb}
    shared, mismatched = [], 0
    for key in ka:
        if key not in kb:
            continue
        ra, rb = ka[key], kb[key]
        if any(ra.get(f) is not None and rb.get(f) is not None and ra.get(f) != rb.get(f)
               for f in ("seed", "split")):
            mismatched += 1
            continue
        shared.append(key)
    out["shared_tries"] = len(shared)
    out["only_a"] = len(ka) - len(shared)
    out["only_b"] = len(kb) - len(shared)
    notes = []
    if mismatched:
        notes.append(f"{mismatched} tries with the same (setup, try) but another seed or split were left out")
    if not shared:
        notes.insert(0, f"not compared: {name_a} and {name_b} share no tries")
        out["note"] = "; ".join(notes)
        return out
    if out["only_a"] or out["only_b"]:
        notes.append(f"on the {len(shared)} shared tries only ({out['only_a']} only in {name_a}, "
                     f"{out['only_b']} only in {name_b})")
    shared_set = set(shared)
    fa = [r for key, r in ka.items() if key in shared_set]
    fb = [r for key, r in kb.items() if key in shared_set]
    oa, ob = paired_outcomes_from_records(fa, fb)
    res = paired_difference(oa, ob, group_of(), n_boot=n_boot, seed=seed)
    d, ci = res["S"]
    out["S"] = {"diff": _finite(d), "ci": _ci(ci)}
    out["groups"] = {g: {"diff": _finite(res["groups"].get(g, (None, None))[0]),
                         "ci": _ci(res["groups"].get(g, (None, None))[1])} for g in GROUPS}
    out["complete"] = bool(res["complete"])
    out["missing"] = list(res["missing"])
    if not res["complete"]:
        notes.append(f"S n/a: no shared tries in {', '.join(res['missing'])}")
    out["note"] = "; ".join(notes) or None
    return out


# --------------------------------------------------------------------------
# Presentation helpers (percent only here)
# --------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _rng(ci: Sequence[float | None] | None) -> str:
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    return f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def _pct_rng(x: float | None, ci) -> str:
    r = _rng(ci) if x is not None else ""
    return f"{_pct(x)} {r}".strip()


def _pp(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}"


def _pp_rng(d: Mapping | None) -> str:
    if not d or d.get("diff") is None:
        return "n/a"
    ci = d.get("ci")
    s = _pp(d["diff"])
    if ci and ci[0] is not None:
        s += f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"
    return s


def _excludes_zero(d: Mapping | None) -> str:
    ci = (d or {}).get("ci")
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    return "yes" if (ci[0] > 0 or ci[1] < 0) else "no"


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _machine_str(m: Any) -> str:
    if m is None:
        return "not recorded"
    if isinstance(m, list):
        return " | ".join(_machine_str(x) for x in m)
    if isinstance(m, Mapping):
        return ", ".join(f"{k} {v}" for k, v in m.items() if v not in (None, ""))
    return str(m)


def _machine_short(m: Any) -> str:
    if isinstance(m, Mapping):
        for k in ("device", "name", "gpu", "cpu"):
            if m.get(k):
                return str(m[k])
    if m is None:
        return "n/a"
    if isinstance(m, list):
        return "several"
    return str(m)


def _val(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, list):
        return ", ".join(map(str, x))
    return str(x)


def _flags_str(flags: Mapping[str, int]) -> str:
    parts = [f"{f} {c}" for f, c in sorted(flags.items(), key=lambda fc: (-fc[1], fc[0])) if c]
    return ", ".join(parts) if parts else "-"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], align: Sequence[str] | None = None) -> list[str]:
    align = align or ["l"] * len(header)
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(sep) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows]
    return out


def _s_key(item):
    s = item[1]["S"]
    return (s is None, -(s or 0.0))


# --------------------------------------------------------------------------
# REPORT.md
# --------------------------------------------------------------------------
def render_markdown(summaries: Mapping[str, dict], paired: Mapping[str, dict] | None = None,
                    sources: Mapping[str, str] | None = None) -> str:
    """REPORT.md text for one or several model summaries (name -> summary)."""
    names = list(summaries)
    several = len(names) > 1
    first = summaries[names[0]]
    L: list[str] = []
    title = "Shape assembly benchmark report" + ("" if several else f": {names[0]}")
    L += [f"# {title}", ""]

    shas = {_json_key(s["tasklist_sha256"]): s["tasklist_sha256"] for s in summaries.values()}
    if len(shas) == 1:
        sha = next(iter(shas.values()))
        L.append(f"Task list sha256: `{sha}`" if isinstance(sha, str) else
                 f"Task list sha256: {'not recorded' if sha is None else _val(sha)}")
    else:
        L.append("Task list sha256: differs between models: " +
                 "; ".join(f"{n} `{_val(s['tasklist_sha256'])}`" for n, s in summaries.items()))
    L.append("")
    preds = {n: s.get("predicate", 1) for n, s in summaries.items()}
    if len(set(preds.values())) == 1:
        v = next(iter(preds.values()))
        line = f"Success predicate: v{v} (docs/BENCHMARK.md section 1)"
        if v >= 2:
            line += "; a try that raised wrong_hole, penetration or glitch is never a success"
        L.append(line + ".")
    else:
        L.append("**Success predicates differ between models, the numbers are not comparable:** " +
                 "; ".join(f"{n} v{v}" for n, v in preds.items()))
    for n, s in summaries.items():
        if s.get("vetoed") and s["vetoed"]["n"]:
            fl = ", ".join(f"{f} {c}" for f, c in s["vetoed"]["flags"].items())
            L.append(f"{n + ': ' if several else ''}{s['vetoed']['n']} tries met the predicate and were vetoed "
                     f"by a flag ({fl}); they count as failures.")
    for n, s in summaries.items():
        if s.get("actions_clipped") and s["actions_clipped"]["tries"]:
            c = s["actions_clipped"]
            L.append(f"{n + ': ' if several else ''}{c['tries']} tries sent actions outside the controller's "
                     f"[-1, 1] range ({c['actions']} actions in all), which it clipped.")
    L.append("")
    for n, s in summaries.items():
        if s.get("note"):  # e.g. random weights: latency only, success meaningless
            L += [f"**{n}: {_val(s['note'])}**", ""]
    for n, s in summaries.items():
        if not s["complete"]:
            who = f"{n}: " if several else ""
            L.append(f"**{who}incomplete: missing setups {', '.join(s['missing'])}** (S and M are n/a)")
            L.append("")
    bs = first["bootstrap"]
    L += [
        "Success rates in %. S (primary) = mean of the 7 group rates, each group weighs the same; "
        "M = mean over the 30 setups. Ranges are 95%: Wilson per setup; stratified percentile bootstrap "
        f"({bs['n_boot']} redraws of the tries within each setup, seed {bs['seed']}) for groups, difficulty, S and M. "
        "The full-board task is reported separately and is not part of S or M.",
        "",
    ]
    if sources:
        L += ["Tries: " + "; ".join(f"{n} `{p}`" for n, p in sources.items()), ""]

    # Leaderboard
    L += ["## Leaderboard", ""]
    rows = []
    for n, s in sorted(summaries.items(), key=_s_key):
        rows.append([n, _val(s["track"]), RANKED_TRACKS.get(s["track"], "?") if isinstance(s["track"], str) else "?",
                     _val(s["split"]), _val(s["arm"]), _machine_short(s["machine"]), str(s["n_tries"]),
                     _pct_rng(s["S"], s["S_ci"]), _pct_rng(s["M"], s["M_ci"])])
    L += _table(["Model", "Track", "Ranked", "Split", "Arm", "Machine", "Tries", "S % [95% range]",
                 "M % [95% range]"], rows, ["l"] * 6 + ["r"] * 3)
    L.append("")
    for n, s in summaries.items():
        L.append(f"- Machine ({n}): {_machine_str(s['machine'])}")
    for n, s in summaries.items():
        if s.get("weights_sha256") is not None:  # learned policies: which weights file ran
            L.append(f"- Weights ({n}): sha256 {_val(s['weights_sha256'])}")
    L.append("")

    # By group / difficulty
    L += ["## By group", ""]
    rows = []
    for g in GROUPS:
        setups = first["groups"][g]["setups"]
        rows.append([g, str(len(setups))] +
                    [_pct_rng(s["groups"][g]["rate"], s["groups"][g]["ci"]) for s in summaries.values()])
    rows.append(["**S**", "", *[f"**{_pct_rng(s['S'], s['S_ci'])}**" for s in summaries.values()]])
    L += _table(["Group", "Setups", *[f"{n} % [95%]" for n in names]], rows, ["l", "r"] + ["r"] * len(names))
    L += ["", "## By difficulty", ""]
    rows = []
    for d in DIFFICULTIES:
        setups = first["difficulty"][d]["setups"]
        rows.append([d, str(len(setups))] +
                    [_pct_rng(s["difficulty"][d]["rate"], s["difficulty"][d]["ci"]) for s in summaries.values()])
    L += _table(["Difficulty", "Setups", *[f"{n} % [95%]" for n in names]], rows, ["l", "r"] + ["r"] * len(names))

    # Every setup
    L += ["", "## Every setup", ""]
    if not several:
        rows = []
        for sid, e in first["setups"].items():
            rows.append([sid, e["name"], e["group"], e["difficulty"], f"{e['k']}/{e['n']}" if e["n"] else "0/0",
                         _pct(e["rate"]), _rng(e["ci"]), _flags_str(e["flags"]) if e["n"] else "no tries"])
        L += _table(["Id", "Name", "Group", "Difficulty", "k/n", "%", "Wilson 95%", "Flags"], rows,
                    ["l"] * 4 + ["r"] * 3 + ["l"])
    else:
        rows = []
        for sid, e in first["setups"].items():
            row = [sid, e["name"], e["group"], e["difficulty"]]
            for s in summaries.values():
                x = s["setups"][sid]
                row += [f"{x['k']}/{x['n']}", f"{_pct(x['rate'])} {_rng(x['ci'])}".strip(),
                        _flags_str(x["flags"]) if x["n"] else "no tries"]
            rows.append(row)
        head = ["Id", "Name", "Group", "Difficulty"]
        for n in names:
            head += [f"{n} k/n", f"{n} % [Wilson 95%]", f"{n} flags"]
        L += _table(head, rows, ["l"] * 4 + ["r", "r", "l"] * len(names))

    # Weakest setups
    L += ["", "## Weakest setups", "",
          f"The {N_WEAKEST} lowest setups per model, with the flags of their tries "
          "(\"no flag\" = failed without a flag, i.e. ran out of steps).", ""]
    for n, s in summaries.items():
        if several:
            L.append(f"**{n}**")
            L.append("")
        if not s["weakest"]:
            L.append("- no failed tries" if s["n_tries"] else "- no tries")
        elif len(s["weakest"]) < N_WEAKEST:
            L.append(f"- (only {len(s['weakest'])} setup(s) with failed tries)")
        for w in s["weakest"]:
            fl = [f"{f} {c}" for f, c in w["flags"]]
            if w["no_flag_failures"]:
                fl.append(f"no flag {w['no_flag_failures']}")
            L.append(f"- {w['setup']} {w['name']} ({w['group']}, {w['difficulty']}): {_pct(w['rate'])}% "
                     f"({w['k']}/{w['n']}); flags: {', '.join(fl) if fl else 'none'}")
        L.append("")

    # Secondary metrics
    L += ["## Secondary metrics (not in the score)", "",
          "Recovery: successes among tries whose disturbance fired (Wilson 95%). Drops: tries with a dropped "
          "block. Completion: mean simulated seconds to success. Inference: ms per policy query, on the machine "
          "named above.", ""]
    rows = []
    for n, s in summaries.items():
        sec = s["secondary"]
        rec = sec["recovery"]
        if rec["n"]:
            rtxt = f"{rec['k']}/{rec['n']}"
            rpct = _pct_rng(rec["rate"], rec["ci"])
        else:
            rtxt = "0/0" if sec.get("recovery_recorded") else "not recorded"
            rpct = "n/a"
        lat = sec["latency_ms"] or {}
        rows.append([n, rtxt, rpct, str(sec["dropped"]), _num(sec["mean_completion_s"]),
                     _num(lat.get("mean"), ".1f" if (lat.get("mean") or 0) >= 10 else ".2f"),
                     _num(lat.get("p50")), _num(lat.get("p90")), _num(lat.get("p99")),
                     str(lat.get("count", 0)), _machine_short(s["machine"])])
    L += _table(["Model", "Recovery k/n", "Recovery % [Wilson]", "Drops", "Completion s", "Infer ms mean",
                 "p50", "p90", "p99", "Queries", "Machine"], rows, ["l"] + ["r"] * 9 + ["l"])
    L.append("")
    if any((s["secondary"]["latency_ms"] or {}).get("count") and
           (s["secondary"]["latency_ms"] or {}).get("p50") is None for s in summaries.values()):
        L += ["Inference percentiles are n/a where the records hold only per-try means (no `infer_ms` lists).", ""]

    L += _latency_section(summaries)

    # Full board
    if any(s["full_board"] for s in summaries.values()):
        L += ["## Full-board task (separate, not in S or M)", "",
              "All three blocks in their holes at the same time, up to 900 steps.", ""]
        rows = []
        for n, s in summaries.items():
            for sid, e in s["full_board"].items():
                rows.append([n, sid, e["name"], f"{e['k']}/{e['n']}", _pct(e["rate"]), _rng(e["ci"]),
                             _num(e["blocks_inserted_mean"]), _flags_str(e["flags"])])
        L += _table(["Model", "Id", "Name", "k/n", "%", "Wilson 95%", "Mean blocks inserted (of 3)", "Flags"],
                    rows, ["l"] * 3 + ["r"] * 4 + ["l"])
        L.append("")

    # Paired
    if several:
        L += ["## Paired differences", "",
              "A - B in percentage points, paired stratified bootstrap on the tries both models share "
              f"(same setups and starting positions, {bs['n_boot']} redraws, seed {bs['seed']}). "
              "A 95% range that excludes 0 marks a difference beyond bootstrap noise.", ""]
        for key, p in (paired or {}).items():
            L += [f"### {p['a']} - {p['b']}", ""]
            if p.get("note"):
                L += [f"Note: {p['note']}.", ""]
            if p["S"] is None:
                continue
            rows = [["**S**", f"**{_pp_rng(p['S'])}**", _excludes_zero(p["S"])]]
            rows += [[g, _pp_rng(p["groups"][g]), _excludes_zero(p["groups"][g])] for g in GROUPS]
            L += _table(["", f"{p['a']} - {p['b']}, pp [95%]", "Excludes 0"], rows, ["l", "r", "l"])
            L += ["", f"Shared tries: {p['shared_tries']}.", ""]

    warn = [(n, w) for n, s in summaries.items() for w in s["warnings"] if not w.startswith("incomplete")]
    if warn:
        L += ["## Warnings", ""]
        L += [f"- {n}: {w}" if several else f"- {w}" for n, w in warn]
        L.append("")
    return "\n".join(L).rstrip() + "\n"


def _latency_section(summaries: Mapping[str, dict]) -> list[str]:
    """Latency profile: query percentiles without warm-up, warm-up apart, time per control step by stage,
    and the device and telemetry where a run recorded them (eval.orin)."""
    have = {n: s for n, s in summaries.items()
            if (s["secondary"].get("step_ms") or (s["secondary"]["latency_ms"] or {}).get("p50") is not None
                or s.get("batch"))}
    if not have:
        return []
    L = ["## Latency profile", "",
         "Per policy query, warm-up queries (the first queries of each fresh policy object: compilation, "
         "caches) excluded and shown apart. Histogram: latency.png.", ""]
    rows = []
    for n, s in have.items():
        lat = s["secondary"]["latency_ms"] or {}
        warm = s["secondary"].get("warmup_ms") or {}
        if s.get("batch") and not lat.get("count"):
            continue  # a --num-envs run times its batched queries once per batch: the table below
        rows.append([n, str(lat.get("count", 0)), _num(lat.get("mean"), ".3g"), _num(lat.get("p50"), ".3g"),
                     _num(lat.get("p90"), ".3g"), _num(lat.get("p99"), ".3g"), _num(lat.get("max"), ".3g"),
                     f"{warm.get('count', 0)} ({_num(warm.get('mean'), '.3g')} mean)" if warm else "0",
                     _machine_short(s["machine"])])
    if rows:
        L += _table(["Model", "Queries", "Mean ms", "p50", "p90", "p99", "Max", "Warm-up queries", "Machine"], rows,
                    ["l"] + ["r"] * 7 + ["l"])
        L.append("")
    steps = {n: s["secondary"]["step_ms"] for n, s in have.items() if s["secondary"].get("step_ms")}
    if steps:
        from eval.rollout import STAGES

        L += ["Time per control step by stage, ms (share of the step). observe: observation taken from the "
              "scene; preprocess / inference / postprocess: the policy query; physics: action and simulation "
              "substeps; render: sensors and observation; other: success evaluation and bookkeeping. "
              "Scenes stepped together: each scene's share of its batch's steps.", ""]
        rows = []
        for n, st in steps.items():
            total = st["total"] or 1.0
            rows.append([n] + [f"{_num(st.get(k, 0.0), '.3g')} ({100 * st.get(k, 0.0) / total:.0f}%)"
                               for k in STAGES] + [_num(st["total"], ".3g"), str(st["steps"])])
        L += _table(["Model", *STAGES, "Total", "Steps"], rows, ["l"] + ["r"] * (len(STAGES) + 2))
        L.append("")
    for n, s in have.items():
        b = s.get("batch")
        if not b:
            continue
        q = b.get("query_ms") or {}
        L += [f"Scenes stepped together ({n}): {', '.join(map(str, b['num_envs']))} per batch on "
              f"{'/'.join(s.upper() for s in b['sim'])} physics, {b['batches']} batches, {b['tries']} tries. "
              + ("Queries batched: one runner call per step for all live scenes." if b["batched_queries"] else
                 "Queries not batched: this policy is queried scene by scene.")
              + " These are the batch's queries; the latency of one scene's query is a --num-envs 1 run's.", ""]
        L += _table(["Batch query ms: mean", "p50", "p90", "p99", "max", "mean live batch", "ms per scene",
                     "tries/s", "scene steps/s", "host-device bytes/step", "image bytes/step"],
                    [[_num(q.get("mean"), ".3g"), _num(q.get("p50"), ".3g"), _num(q.get("p90"), ".3g"),
                      _num(q.get("p99"), ".3g"), _num(q.get("max"), ".3g"), _num(q.get("mean_batch"), ".3g"),
                      _num(q.get("ms_per_scene"), ".3g"), _num(b.get("tries_per_s"), ".3g"),
                      _num(b.get("scene_steps_per_s"), ".4g"), _num(b.get("host_device_bytes_per_step"), ".4g"),
                      str(b.get("image_bytes_per_step"))]], ["r"] * 11)
        L.append("")
    for n, s in have.items():
        dev = s.get("device")
        if dev:
            L += [f"Device ({n}): " + "; ".join(f"{k} {_val(v)}" for k, v in dev.items() if v not in (None, "")), ""]
        prof = s.get("profile")
        if prof:
            L += [f"Backend ({n}): {prof.get('backend')} ({prof.get('backend_reason')})", ""]
        tel = s.get("telemetry")
        if tel is not None:
            lines = tel.get("lines") or [tel.get("reason") or "telemetry unavailable"]
            L += [f"Telemetry ({n}):", ""] + [f"    {line}" for line in lines] + [""]
    return L


# --------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------
def plot_latency(queries_ms: Mapping[str, Sequence[float]], path: str | Path) -> None:
    """Histogram of per-query latency (log-spaced bins) per model, p50 and p99 marked."""
    fig = _new_figure(7.0, 3.8)
    ax = fig.add_subplot(1, 1, 1)
    allv = np.concatenate([np.asarray(v, float) for v in queries_ms.values() if len(v)])
    lo, hi = max(allv.min(), 1e-4), max(allv.max(), 1e-3)
    bins = np.geomspace(lo * 0.95, hi * 1.05, 60)
    for i, (n, v) in enumerate(queries_ms.items()):
        if not len(v):
            continue
        v = np.asarray(v, float)
        ax.hist(v, bins=bins, histtype="step", color=f"C{i % 10}", label=f"{n} ({len(v)} queries)")
        for q, ls in ((50, "-"), (99, "--")):
            ax.axvline(np.percentile(v, q), color=f"C{i % 10}", ls=ls, lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("ms per query (solid: p50, dashed: p99)")
    ax.set_ylabel("queries")
    ax.set_title("Policy query latency, warm-up excluded", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(str(path))



def _new_figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=120)
    FigureCanvasAgg(fig)
    return fig


def plot_groups(summaries: Mapping[str, dict], path: str | Path) -> None:
    """Grouped bars: success per group (and S) per model, 95 % bootstrap bars."""
    names = list(summaries)
    cats = list(GROUPS) + ["S"]
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
        ax.bar(pos, vals, width=width * 0.92, color=colors[i], label=n, yerr=[lo, hi], capsize=2,
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


def plot_heatmap(summaries: Mapping[str, dict], path: str | Path) -> None:
    """Setup x model success rates (%), annotated; grey = no tries."""
    names = list(summaries)
    fb = [sid for sid in FULL_BOARD_IDS if any(sid in s["full_board"] for s in summaries.values())]
    rows = list(SCORED_IDS) + fb
    data = np.full((len(rows), len(names)), np.nan)
    for j, n in enumerate(names):
        s = summaries[n]
        for i, sid in enumerate(rows):
            e = s["setups"].get(sid) or s["full_board"].get(sid)
            if e and e["rate"] is not None:
                data[i, j] = 100 * e["rate"]
    import matplotlib

    cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="0.85")
    fig = _new_figure(3.2 + 1.1 * len(names), 1.4 + 0.26 * len(rows))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=0, vmax=100, aspect="auto", interpolation="nearest")
    for i in range(len(rows)):
        for j in range(len(names)):
            v = data[i, j]
            txt = "n/a" if np.isnan(v) else (f"{v:.0f}" if abs(v - round(v)) < 0.05 else f"{v:.1f}")
            ax.text(j, i, txt, ha="center", va="center", fontsize=7,
                    color="0.3" if np.isnan(v) else ("white" if v < 25 else "black"))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{sid} {SETUPS[sid].name}" for sid in rows], fontsize=7)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([textwrap.fill(n, 14) for n in names], fontsize=8)
    ax.xaxis.tick_top()
    prev = None
    for i, sid in enumerate(rows):
        g = SETUPS[sid].group
        if prev is not None and g != prev:
            ax.axhline(i - 0.5, color="black" if g == "Full board" else "white", lw=1.5 if g == "Full board" else 1)
        prev = g
    ax.set_title("Success % per setup" + (" (below the black line: full board, not in S)" if fb else ""),
                 fontsize=9, pad=22 if len(names) else 6)
    cb = fig.colorbar(im, ax=ax, fraction=0.05, pad=0.03)
    cb.ax.tick_params(labelsize=7)
    cb.set_label("success %", fontsize=8)
    fig.tight_layout()
    fig.savefig(str(path))


# --------------------------------------------------------------------------
# Writing the report
# --------------------------------------------------------------------------
def _unique_names(names: list[str], paths: list[Path]) -> list[str]:
    out: list[str] = []
    for i, (n, p) in enumerate(zip(names, paths)):
        cand = n
        if names.count(n) > 1:
            cand = f"{n} ({p.resolve().parent.name})"
        base, k = cand, 2
        while cand in out:
            cand = f"{base} #{k}"
            k += 1
        out.append(cand)
    return out


def _csv_rows(name: str, s: dict) -> list[list[Any]]:
    rows = []
    for sid, e in list(s["setups"].items()) + list(s["full_board"].items()):
        ci = e["ci"] or [None, None]
        rows.append([name, sid, e["name"], e["group"], e["difficulty"], e["k"], e["n"],
                     "" if e["rate"] is None else repr(float(e["rate"])),
                     "" if ci[0] is None else repr(float(ci[0])), "" if ci[1] is None else repr(float(ci[1])),
                     "true" if sid in SCORED_IDS else "false"])
    return rows


def write_report(tries_paths: Sequence[str | Path], out_dir: str | Path, *, names: Sequence[str] | None = None,
                 n_boot: int = 5000, seed: int = 0, extra: Mapping[str, Any] | None = None,
                 allow_mixed_predicates: bool = False) -> dict:
    """Write summary.json, per_config.csv, REPORT.md, groups.png and heatmap.png
    into ``out_dir`` for one model per tries file.  Returns what summary.json
    holds.  ``names`` (one per file) override the model names, which else come
    from the records' ``model`` field or the file's parent folder. ``extra`` (device, telemetry, profile:
    what eval.orin measured beside the records) is added to every model's summary."""
    paths = [Path(p) for p in tries_paths]
    if not paths:
        raise ReportError("no tries file given")
    if names is not None and len(names) != len(paths):
        raise ReportError(f"{len(names)} names for {len(paths)} tries files; give one --name per --tries")
    records: list[list[dict]] = []
    raw_names: list[str] = []
    for i, p in enumerate(paths):
        recs = load_tries(p)
        if not recs:
            raise ReportError(f"{p}: no tries")
        try:
            _validate(recs)
        except ReportError as e:
            raise ReportError(f"{p}: {e}") from None
        records.append(recs)
        if names is not None:
            raw_names.append(str(names[i]))
        else:
            models = list(dict.fromkeys(str(r["model"]) for r in recs if r.get("model") is not None))
            if len(models) > 1:
                raise ReportError(f"{p}: records hold several models ({', '.join(models)}); one tries file = one model")
            raw_names.append(models[0] if models else (p.resolve().parent.name or p.stem))
    model_names = _unique_names(raw_names, paths)
    versions = {}
    for p, recs in zip(paths, records):
        try:
            versions[p] = predicate_of(recs)
        except ReportError as e:
            raise ReportError(f"{p}: {e}") from None
    if len(set(versions.values())) > 1 and not allow_mixed_predicates:
        raise ReportError("the runs were scored with different success predicates (" +
                          ", ".join(f"{p}: v{v}" for p, v in versions.items()) +
                          "); their numbers are not comparable: rerun the older one, or pass "
                          "--allow-mixed-predicates to put them side by side anyway")

    summaries: dict[str, dict] = {}
    sources: dict[str, str] = {}
    for n, p, recs in zip(model_names, paths, records):
        try:
            summaries[n] = build_summary(recs, model=n, n_boot=n_boot, seed=seed)
        except ReportError as e:
            raise ReportError(f"{p}: {e}") from None
        summaries[n]["source"] = str(p)
        summaries[n].update(extra or {})
        batches_file = p.parent / "batches.jsonl"
        if batches_file.exists():  # a --num-envs run: latency at batch N and throughput (eval.rollout)
            from eval.rollout import batch_summary
            from eval.runner import read_records

            summaries[n]["batch"] = batch_summary(read_records(batches_file))
        sources[n] = str(p)

    paired: dict[str, dict] = {}
    for i in range(len(model_names)):
        for j in range(i + 1, len(model_names)):
            a, b = model_names[i], model_names[j]
            paired[f"{a} - {b}"] = paired_summary(records[i], records[j], name_a=a, name_b=b,
                                                  n_boot=n_boot, seed=seed)

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"{out}: cannot create folder ({e.strerror or e})") from None
    result = summaries[model_names[0]] if len(model_names) == 1 else {"models": summaries, "paired": paired}
    queries = {n: [float(v) for r in _split_records(recs)[0] if isinstance(r.get("infer_ms"), list)
                   for v in r["infer_ms"]] for n, recs in zip(model_names, records)}
    # every file is written beside its final name first and renamed once all are written: a crash or a
    # full disk leaves the previous report whole, never a truncated picture or a mix of two reports
    staged: dict[str, Path] = {}

    def stage(name: str) -> Path:
        staged[name] = out / f".{Path(name).stem}.partial{Path(name).suffix}"
        return staged[name]

    try:
        stage("summary.json").write_text(json.dumps(result, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        with open(stage("per_config.csv"), "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["model", "setup", "name", "group", "difficulty", "k", "n", "rate", "wilson_low",
                        "wilson_high", "scored"])
            for n, s in summaries.items():
                w.writerows(_csv_rows(n, s))
        stage("REPORT.md").write_text(render_markdown(summaries, paired, sources), encoding="utf-8")
        plot_groups(summaries, stage("groups.png"))
        plot_heatmap(summaries, stage("heatmap.png"))
        if any(queries.values()):
            plot_latency(queries, stage("latency.png"))
        for name, tmp in staged.items():
            os.replace(tmp, out / name)
        if "latency.png" not in staged:  # an earlier report's picture would describe other tries
            (out / "latency.png").unlink(missing_ok=True)
    except OSError as e:
        raise ReportError(f"{out}: cannot write the report ({e.strerror or e}): free space or fix permissions, "
                          f"then rerun the same command (the tries are kept)") from None
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
    return result


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line on stderr, exit 2
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = _Parser(
        prog="python -m eval.report",
        description="Write a benchmark report (summary.json, per_config.csv, REPORT.md, groups.png, heatmap.png) "
                    "from one tries.jsonl per model; several models are compared side by side and paired.",
    )
    ap.add_argument("--tries", action="append", required=True, metavar="PATH",
                    help="a model's tries.jsonl (repeat for several models)")
    ap.add_argument("--out", required=True, metavar="DIR", help="output folder (created if needed)")
    ap.add_argument("--name", action="append", metavar="NAME",
                    help="model name, one per --tries in the same order (default: the records' model field, "
                         "else the file's folder name)")
    ap.add_argument("--n-boot", type=int, default=5000, help="bootstrap redraws (default 5000)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    ap.add_argument("--allow-mixed-predicates", action="store_true",
                    help="report runs scored with different success predicate versions side by side "
                         "(refused by default: their numbers are not comparable)")
    args = ap.parse_args(argv)
    if args.n_boot < 1:
        ap.error("--n-boot must be >= 1")
    try:
        res = write_report(args.tries, args.out, names=args.name, n_boot=args.n_boot, seed=args.seed,
                           allow_mixed_predicates=args.allow_mixed_predicates)
    except (ReportError, ValueError, OSError) as e:
        msg = " ".join(str(e).split())
        print(f"{ap.prog}: error: {msg}", file=sys.stderr)
        return 2
    models = res["models"] if "models" in res else {res["model"]: res}
    for n, s in models.items():
        print(f"{n}: S {_pct_rng(s['S'], s['S_ci'])}, M {_pct(s['M'])}"
              + ("" if s["complete"] else f" (incomplete: missing {', '.join(s['missing'])})"))
    print(f"report written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
