"""Tries files and their summaries (the numbers of the report; spec BENCHMARK.md sections 2, 4, 5, 6 and 8).

:func:`load_tries` reads a ``tries.jsonl`` (one file = one model), :func:`build_summary` gives one
model's JSON-safe summary and :func:`paired_summary` the paired differences of two models.  All rates
are fractions in 0..1 (fields named ``rate``, ``diff``, ``ci``); n/a is ``None``.

Scoring is :mod:`eval.stats` (stratified bootstrap for groups, difficulty, S
and M; Wilson per setup); the full-board setups (FB*) are reported on their
own and never enter S or M.  A record needs only ``setup``, ``try`` and
``success``; every other field is optional, and every field it has is of the
type :data:`eval.records.TRY_FIELDS` gives (checked by :func:`build_summary`).
:data:`SUMMARY_CHECK` is what a ``summary.json`` holds, checked where one is
read back (``eval.report --rebuild``, ``eval.site``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from env.predicate import VETO_FLAGS
from eval.records import FLAG_NAMES  # noqa: F401 - the report lists every flag a record can hold
from eval.records import (BOOL, INT0, INT1, NUM, NUM0, OBJ, SCALAR, STR, HOST_TRAFFIC_FIELDS, TRY_REQUIRED, leaf,
                          list_of, map_of, nullable, obj, problem_text, record_label, record_problem)
from env.setups import DIFFICULTIES, FULL_BOARD_IDS, GROUPS, SCORED_IDS, SETUPS, difficulty_of, group_of
from eval.stats import (
    ci_list,
    finite,
    outcomes_from_records,
    paired_difference,
    paired_outcomes_from_records,
    score,
    score_to_dict,
    secondary,
    wilson,
)

REQUIRED_FIELDS = TRY_REQUIRED
N_WEAKEST = 3
class ReportError(ValueError):
    """Bad input to the report (message is one line)."""


# --------------------------------------------------------------------------
# What summary.json holds (the one definition its readers check it against: eval.report --rebuild, eval.site)
# --------------------------------------------------------------------------
RATE = leaf(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1,
            "a fraction 0..1")
CI = nullable(leaf(lambda v: isinstance(v, list) and len(v) == 2 and all(x is None or RATE(x) is None for x in v),
                   "[low, high] fractions 0..1 (or nulls)"))
_META = leaf(lambda v: v is None or isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
             "a string, a list of strings (records that disagree) or null")
_STEP_CAP = leaf(lambda v: v is None or (type(v) is int and v >= 1)
                 or (isinstance(v, list) and all(type(x) is int and x >= 1 for x in v)),
                 "a step count >= 1, a list of them (records that disagree) or null")
_PCT = nullable(obj({"p50": NUM0, "p99": NUM0}))
_ENTRY = obj({"name": STR, "group": STR, "difficulty": STR, "k": INT0, "n": INT0, "rate": nullable(RATE), "ci": CI,
              "flags": map_of(INT0), "no_flag_failures": INT0, "blocks_inserted_mean": nullable(NUM0),
              "blocks_total": INT0}, ("name", "k", "n", "rate", "ci", "flags"))
_AGG = obj({"rate": nullable(RATE), "ci": CI, "setups": list_of(STR)}, ("rate", "ci"))
SUMMARY_CHECK = obj({
    "model": STR, **{k: _META for k in ("track", "split", "arm", "tasklist_sha256", "backend", "weights_sha256")},
    "note": _META, "max_steps": _STEP_CAP, "machine": leaf(lambda v: v is None or isinstance(v, (str, dict, list)), "an object or null"),
    "predicate": INT1, "vetoed": nullable(obj({"n": INT0, "flags": map_of(INT0)})),
    "actions_clipped": nullable(obj({"tries": INT0, "actions": INT0})), "n_tries": INT0, "complete": BOOL,
    "missing": list_of(STR), "S": nullable(RATE), "S_ci": CI, "M": nullable(RATE), "M_ci": CI,
    "groups": map_of(_AGG), "difficulty": map_of(_AGG), "setups": map_of(_ENTRY), "full_board": map_of(_ENTRY),
    "weakest": list_of(obj({"setup": STR, "name": STR, "k": INT0, "n": INT0, "rate": nullable(RATE),
                            "flags": list_of(list_of(leaf(lambda v: isinstance(v, (str, int)), "a flag or count"))),
                            "no_flag_failures": INT0})),
    "secondary": obj({
        "recovery": obj({"k": INT0, "n": INT0, "rate": nullable(RATE), "ci": CI}), "dropped": INT0,
        "mean_completion_s": nullable(NUM0), "recovery_recorded": BOOL,
        "latency_ms": nullable(map_of(nullable(NUM0))), "warmup_ms": nullable(map_of(NUM0)),
        "step_ms": nullable(map_of(NUM))}, ("recovery", "latency_ms")),
    "bootstrap": OBJ, "warnings": list_of(STR), "source": STR, "appearance": INT1,
    "served": nullable(obj({"queries": INT0, "warmup_queries": INT0, "rtt_ms": _PCT, "server_ms": _PCT,
                            "transport_ms": _PCT, "transport_share_of_rtt": nullable(RATE),
                            "stale_ratio": nullable(RATE)}, ("queries", "rtt_ms", "server_ms", "transport_ms",
                                                             "stale_ratio"))),
    "host_traffic": obj({"tries": INT0, "bytes_per_query": NUM0, "ms_p50": nullable(NUM0)},
                        ("tries", "bytes_per_query", "ms_p50")),
    "device": nullable(map_of(SCALAR)),
    "telemetry": nullable(obj({"available": BOOL, "source": nullable(STR), "reason": nullable(STR),
                               "lines": list_of(STR), "detail": nullable(OBJ)})),
    "profile": nullable(map_of(SCALAR)),
    "run": nullable(obj({"planned": INT0, "wall_s_this_session": NUM0, "workers": INT1, "executor": STR,
                         "num_envs": INT1, "sim": STR})),
    "batch": nullable(obj({"num_envs": list_of(INT1), "sim": list_of(STR), "batched_queries": BOOL,
                           "batches": INT0, "tries": INT0, "wall_s": NUM0, "tries_per_s": nullable(NUM0),
                           "scene_steps_per_s": nullable(NUM0), "host_device_bytes_per_step": NUM0,
                           "image_bytes_per_step": NUM0, "query_ms": nullable(map_of(NUM0))})),
}, ("model", "n_tries", "complete", "S", "S_ci", "M", "groups", "difficulty", "setups", "secondary",
    "full_board"))


_DIFF = obj({"diff": nullable(leaf(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                                     and -1 <= v <= 1, "a difference -1..1")),
              "ci": nullable(leaf(lambda v: isinstance(v, list) and len(v) == 2 and all(
                  x is None or (isinstance(x, (int, float)) and not isinstance(x, bool) and -1 <= x <= 1) for x in v),
                  "[low, high] differences -1..1 (or nulls)"))}, ("diff", "ci"))
# the paired differences of a summary.json of several models ({"A - B": paired_summary(...)})
PAIRED_CHECK = map_of(obj({"a": STR, "b": STR, "shared_tries": INT0, "only_a": INT0, "only_b": INT0,
                           "complete": BOOL, "missing": list_of(STR), "S": nullable(_DIFF),
                           "groups": nullable(map_of(_DIFF)), "note": nullable(STR)},
                          ("a", "b", "shared_tries", "only_a", "only_b", "S", "groups", "note")))


def summary_problem(summary: Any, top: str = "") -> str | None:
    """What is wrong with a run's summary (as summary.json holds it), naming the field; None when every field
    holds what the report and the results page read from it (:data:`SUMMARY_CHECK`)."""
    bad = SUMMARY_CHECK(summary)
    if bad is None:
        for where, e in [(f"setups.{k}", e) for k, e in summary["setups"].items()] + \
                        [(f"full_board.{k}", e) for k, e in summary["full_board"].items()]:
            if e["k"] > e["n"]:
                return problem_text((f".{where}.k", e["k"], f"at most n ({e['n']})"), top)
        return None
    return problem_text(bad, top)


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------
def load_tries(path: str | Path) -> list[dict]:
    """Records of a ``tries.jsonl`` (:func:`eval.records.read_tries`: a torn last line is ignored, a damaged
    line named); :class:`ReportError` (one line) for a file that cannot be read as records."""
    from eval.records import RecordsError, read_tries

    try:
        return read_tries(path)
    except RecordsError as e:
        raise ReportError(str(e)) from None


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------
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
    """Every record's fields typed as :func:`eval.records.record_problem` defines them (the one definition; records
    read from a file were checked by its reader already, records handed in by a caller are checked here), and
    one record per (setup, try)."""
    for i, r in enumerate(records):
        problem = record_problem(r)
        if problem is not None:
            raise ReportError(f"record {i + 1} ({record_label(r)}): {problem}")
    seen: set[tuple[str, int]] = set()
    for r in records:
        key = (r["setup"], r["try"])
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
        "ci": ci_list(ci),
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
                                                             "tasklist_sha256", "backend", "weights_sha256", "note",
                                                             "appearance", "max_steps")}
    for key in ("split", "arm", "tasklist_sha256", "run_identity"):  # one run folder's records share these
        if len({_json_key(r[key]) for r in records if r.get(key) is not None}) > 1:
            raise ReportError(f"records of several runs (different '{key}': {_common(records, key, [])}); one tries "
                              f"file = one run: move the other run's lines to their own file")
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
        "max_steps": meta["max_steps"],  # a smoke run's cap on each try (--max-steps); null: the setups' own
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
    served = served_latency(scored)
    if served is not None:  # only runs of a model behind a server (eval.remote) have it
        summary["served"] = served
    traffic = host_traffic(scored)
    if traffic is not None:  # only records whose runner reported its host-to-device copies have it
        summary["host_traffic"] = traffic
    if meta["appearance"] is not None:  # camera models' records name what their frames looked like
        summary["appearance"] = meta["appearance"]
    json.dumps(summary, allow_nan=False)  # JSON-safe by construction; fail loudly if not
    return summary


def host_traffic(records: Sequence[Mapping]) -> dict | None:
    """Host-to-device traffic per model query over the tries that record it (``h2d_bytes_per_query``,
    ``h2d_ms_p50``: :data:`eval.records.HOST_TRAFFIC_FIELDS`): ``bytes_per_query`` (mean over the queries,
    each try weighted by its timed queries, ``infer_ms``), ``ms_p50`` (median of the tries' medians; None where
    no try timed its copies: ONNX Runtime on the CPU) and ``tries``; None when no record has it. The records'
    values are finite numbers >= 0 (:func:`eval.records.record_problem`, checked by :func:`build_summary`)."""
    rows = []
    for r in records:
        values = {key: None if r.get(key) is None else float(r[key]) for key in HOST_TRAFFIC_FIELDS}
        if values["h2d_bytes_per_query"] is not None:
            n = len(r["infer_ms"]) if isinstance(r.get("infer_ms"), list) and r["infer_ms"] else 1
            rows.append((values["h2d_bytes_per_query"], values["h2d_ms_p50"], n))
    if not rows:
        return None
    weights = np.array([n for _, _, n in rows], float)
    ms = [m for _, m, _ in rows if m is not None]
    return {"tries": len(rows), "bytes_per_query": float(np.average([b for b, _, _ in rows], weights=weights)),
            "ms_p50": float(np.median(ms)) if ms else None}


def served_latency(records: Sequence[Mapping]) -> dict | None:
    """Round trip, server compute and transport per timed query (p50, p99), the transport's share of the
    round-trip time, the warm-up queries counted apart (each policy object's first queries: compilation,
    caches; a record keeps their times in ``remote_warmup_ms``), and the share of steps the arm held waiting
    for a chunk (``--live-latency``); None for other runs."""
    times = [r["remote_ms"] for r in records if r.get("remote_ms")]
    if not times:
        return None

    def values(key):
        return np.array([x for t in times for x in t.get(key, [])], dtype=float)

    def pct(key):
        xs = values(key)
        return {"p50": float(np.percentile(xs, 50)), "p99": float(np.percentile(xs, 99))} if len(xs) else None

    # of the queries the server timed, round trip = transport + compute
    transport, compute = values("transport_ms"), values("server_ms")
    total = float(transport.sum() + compute.sum())
    stale = [r for r in records if "stale_steps" in r]
    return {"queries": sum(len(t.get("rtt_ms", [])) for t in times),
            "warmup_queries": sum(len((r.get("remote_warmup_ms") or {}).get("rtt_ms", [])) for r in records),
            "rtt_ms": pct("rtt_ms"), "server_ms": pct("server_ms"), "transport_ms": pct("transport_ms"),
            "transport_share_of_rtt": float(transport.sum()) / total if len(transport) and total > 0 else None,
            "stale_ratio": (sum(r["stale_steps"] for r in stale) / max(1, sum(int(r.get("steps") or 0) for r in stale)))
            if stale else None}


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
    out["S"] = {"diff": finite(d), "ci": ci_list(ci)}
    out["groups"] = {g: {"diff": finite(res["groups"].get(g, (None, None))[0]),
                         "ci": ci_list(res["groups"].get(g, (None, None))[1])} for g in GROUPS}
    out["complete"] = bool(res["complete"])
    out["missing"] = list(res["missing"])
    if not res["complete"]:
        notes.append(f"S n/a: no shared tries in {', '.join(res['missing'])}")
    out["note"] = "; ".join(notes) or None
    return out


def batch_summary(batches: Sequence[dict]) -> dict[str, Any] | None:
    """Latency at batch N and throughput over a run's batch records (``batches.jsonl``, written by
    :func:`eval.rollout.rollout`; None when the run had none)."""
    if not batches:
        return None
    q = np.array([x for b in batches for x in b["query_ms"]], dtype=float)
    sizes = np.array([x for b in batches for x in b["query_batch"]], dtype=float)
    wall = sum(b["wall_s"] for b in batches)
    tries = sum(len(b["tries"]) for b in batches)
    scene_steps = sum(b["scene_steps"] for b in batches)
    out = {
        "num_envs": sorted({b["num_envs"] for b in batches}), "sim": sorted({b["sim"] for b in batches}),
        "batched_queries": all(b["batched_queries"] for b in batches), "batches": len(batches), "tries": tries,
        "wall_s": round(wall, 3), "tries_per_s": tries / wall if wall else None,
        "scene_steps_per_s": scene_steps / wall if wall else None,
        "host_device_bytes_per_step": float(np.mean([b["host_device_bytes_per_step"] for b in batches])),
        "image_bytes_per_step": max(b["image_bytes_per_step"] for b in batches),
        "query_ms": None,
    }
    if len(q):
        out["query_ms"] = {"count": int(len(q)), "mean": float(q.mean()), "p50": float(np.percentile(q, 50)),
                           "p90": float(np.percentile(q, 90)), "p99": float(np.percentile(q, 99)),
                           "max": float(q.max()), "mean_batch": float(sizes.mean()),
                           "ms_per_scene": float((q / sizes).mean())}
    return out
