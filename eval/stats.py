"""Benchmark statistics (spec BENCHMARK.md sections 5 and 6).

Scoring (section 5)
-------------------
* ``p_c = k_c / n_c``: success rate of setup ``c``.
* ``r_g``: mean of ``p_c`` over the setups of group ``g``.
* ``S``: mean of ``r_g`` over the groups -- the PRIMARY score.  Every group
  weighs the same, whatever its number of setups (the 2-setup group G counts
  as much as a 5-setup group).
* ``M``: mean of ``p_c`` over all setups (secondary; every setup weighs the
  same).
* If any expected setup has no tries, ``S`` and ``M`` are ``None`` ("n/a") and
  the score is marked incomplete.
* Per setup: Wilson score interval, 95 %.
* Groups, ``S``, ``M`` and difficulty levels: stratified percentile bootstrap,
  ``n_boot`` (5,000) redraws of the tries *within* each setup, with
  replacement, keeping ``n_c``; the interval is the middle 95 % (2.5th and
  97.5th percentiles, numpy's default linear interpolation).

Bootstrap implementation note: resampling ``n_c`` Bernoulli tries with
replacement from a setup with ``k_c`` successes gives a number of successes
that is exactly ``Binomial(n_c, k_c / n_c)`` distributed (each redrawn try is
an independent draw that succeeds with probability ``k_c / n_c``).  So the
unpaired bootstrap draws ``rng.binomial(n_c, p_c, size=n_boot)`` per setup,
which is the same distribution as index resampling and much faster.  The
paired comparison of two models cannot use that shortcut (both models must be
redrawn on the *same* tries), so it resamples try indices explicitly.

Determinism: a ``numpy.random.Generator`` seeded with ``seed`` (default 0);
setups are visited in sorted id order, so results do not depend on the order
of the input mappings.

All rates are fractions in 0..1; turning them into percentages is left to the
reporting code.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from binomial_stats import Z95, Interval, wilson

CI_PERCENTILES = (2.5, 97.5)
DIFFICULTY_ORDER = ("easy", "medium", "hard")

__all__ = [
    "Z95",
    "Interval",
    "wilson",
    "SetupResult",
    "Score",
    "score",
    "outcomes_from_records",
    "paired_outcomes_from_records",
    "paired_difference",
    "secondary",
    "score_to_dict",
]


# --------------------------------------------------------------------------
# Basic types: Z95, Interval and wilson live in binomial_stats (the probe shares them); imported above
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class SetupResult:
    setup: str
    k: int
    n: int
    rate: float
    ci: Interval


@dataclass(frozen=True)
class Score:
    complete: bool
    S: float | None
    S_ci: Interval | None
    M: float | None
    M_ci: Interval | None
    # group -> (r_g, bootstrap interval); (None, None) if a setup is missing
    groups: dict[str, tuple[float | None, Interval | None]]
    # difficulty -> (mean p_c, bootstrap interval); (None, None) if missing
    difficulty: dict[str, tuple[float | None, Interval | None]]
    # only setups that have tries
    setups: dict[str, SetupResult]
    # expected setups without any try, sorted
    missing: tuple[str, ...]


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------
def _ordered_unique(values: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for v in values:
        seen.setdefault(v, None)
    return list(seen)


def _difficulty_levels(difficulty_of: Mapping[str, str]) -> list[str]:
    levels = _ordered_unique(difficulty_of.values())
    known = [d for d in DIFFICULTY_ORDER if d in levels]
    return known + [d for d in levels if d not in DIFFICULTY_ORDER]


def _percentile_interval(samples: np.ndarray) -> Interval:
    lo, hi = np.percentile(samples, CI_PERCENTILES)
    return Interval(float(lo), float(hi))


def _check_setups(outcomes: Mapping[str, Any], group_of: Mapping[str, str], what: str = "outcomes") -> None:
    unknown = sorted(set(outcomes) - set(group_of))
    if unknown:
        raise ValueError(f"{what} contain setups not in the setup table: {unknown}")


def _as_bools(seq: Sequence[Any], setup: str) -> np.ndarray:
    arr = np.asarray(list(seq))
    if arr.size == 0:
        return np.zeros(0, dtype=bool)
    if arr.ndim != 1:
        raise ValueError(f"setup {setup}: outcomes must be a flat sequence of booleans")
    return arr.astype(bool)


def _aggregate(rates: dict[str, Any], group_of: Mapping[str, str],
               difficulty_of: Mapping[str, str], expected: Sequence[str]):
    """Point estimates (floats) or bootstrap arrays, depending on ``rates``.

    Returns (groups, difficulty, S, M) with ``None`` where a needed setup has
    no rate.
    """
    groups = _ordered_unique(group_of[c] for c in expected)
    complete = all(c in rates for c in expected)

    def mean_over(members: list[str]):
        if not members or any(c not in rates for c in members):
            return None
        return sum(rates[c] for c in members) / len(members)

    g_vals = {g: mean_over([c for c in expected if group_of[c] == g]) for g in groups}
    d_vals = {d: mean_over([c for c in expected if difficulty_of[c] == d])
              for d in _difficulty_levels({c: difficulty_of[c] for c in expected})}
    if complete:
        S = sum(g_vals[g] for g in groups) / len(groups)
        M = sum(rates[c] for c in expected) / len(expected)
    else:
        S = M = None
    return g_vals, d_vals, S, M


# --------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------
def score(outcomes: Mapping[str, Sequence[bool]], group_of: Mapping[str, str],
          difficulty_of: Mapping[str, str], n_boot: int = 5000, seed: int | None = 0) -> Score:
    """Score one model run.

    ``outcomes``: setup id -> per-try success booleans (try order).
    ``group_of`` / ``difficulty_of``: the expected setups (all 30 in the
    benchmark) and their group / difficulty label.
    """
    if not group_of:
        raise ValueError("group_of is empty: no expected setups")
    if set(group_of) != set(difficulty_of):
        raise ValueError(
            "group_of and difficulty_of must list the same setups; differ in "
            f"{sorted(set(group_of) ^ set(difficulty_of))}")
    if n_boot < 1:
        raise ValueError("n_boot must be >= 1")
    _check_setups(outcomes, group_of)

    expected = list(group_of)  # table order for reporting
    setups: dict[str, SetupResult] = {}
    for c in expected:
        arr = _as_bools(outcomes.get(c, ()), c)
        if arr.size == 0:
            continue
        k, n = int(arr.sum()), int(arr.size)
        setups[c] = SetupResult(c, k, n, k / n, wilson(k, n))
    missing = tuple(sorted(c for c in expected if c not in setups))
    complete = not missing

    point_rates = {c: r.rate for c, r in setups.items()}
    g_pt, d_pt, S_pt, M_pt = _aggregate(point_rates, group_of, difficulty_of, expected)

    # Stratified bootstrap: Binomial(n_c, p_c) successes == resampling the
    # n_c tries of setup c with replacement (see module docstring).
    rng = np.random.default_rng(seed)
    boot_rates: dict[str, np.ndarray] = {}
    for c in sorted(setups):
        r = setups[c]
        boot_rates[c] = rng.binomial(r.n, r.rate, size=n_boot) / r.n
    g_bs, d_bs, S_bs, M_bs = _aggregate(boot_rates, group_of, difficulty_of, expected)

    def pair(pt, bs):
        if pt is None:
            return (None, None)
        return (float(pt), _percentile_interval(bs))

    groups = {g: pair(g_pt[g], g_bs[g]) for g in g_pt}
    difficulty = {d: pair(d_pt[d], d_bs[d]) for d in d_pt}
    S, S_ci = pair(S_pt, S_bs)
    M, M_ci = pair(M_pt, M_bs)
    return Score(complete=complete, S=S, S_ci=S_ci, M=M, M_ci=M_ci,
                 groups=groups, difficulty=difficulty, setups=setups, missing=missing)


def outcomes_from_records(records: Iterable[Mapping]) -> dict[str, list[bool]]:
    """Per-try records (need ``setup``, ``try``, ``success``) -> outcomes.

    Tries are sorted by their ``try`` key within each setup; a duplicate
    ``(setup, try)`` raises ``ValueError``.
    """
    by_setup: dict[str, dict[Any, bool]] = {}
    for rec in records:
        try:
            c, t, ok = rec["setup"], rec["try"], rec["success"]
        except KeyError as e:
            raise ValueError(f"record lacks field {e.args[0]!r}: {dict(rec)!r}") from None
        tries = by_setup.setdefault(str(c), {})
        if t in tries:
            raise ValueError(f"duplicate record for setup {c!r}, try {t!r}")
        tries[t] = bool(ok)
    return {c: [tries[t] for t in sorted(tries)] for c, tries in by_setup.items()}


def paired_outcomes_from_records(records_a: Iterable[Mapping], records_b: Iterable[Mapping]
                                 ) -> tuple[dict[str, list[bool]], dict[str, list[bool]]]:
    """Outcomes of two models for :func:`paired_difference`, after checking
    that both ran exactly the same ``(setup, try)`` keys (``ValueError`` if
    not).  Both lists of a setup are then in the same try order."""
    records_a, records_b = list(records_a), list(records_b)
    keys_a = {(str(r["setup"]), r["try"]) for r in records_a}
    keys_b = {(str(r["setup"]), r["try"]) for r in records_b}
    if keys_a != keys_b:
        only_a = sorted(keys_a - keys_b, key=repr)[:10]
        only_b = sorted(keys_b - keys_a, key=repr)[:10]
        raise ValueError(f"models do not share the same (setup, try) keys; "
                         f"only in A (first 10): {only_a}; only in B (first 10): {only_b}")
    return outcomes_from_records(records_a), outcomes_from_records(records_b)


def paired_difference(a: Mapping[str, Sequence[bool]], b: Mapping[str, Sequence[bool]],
                      group_of: Mapping[str, str], n_boot: int = 5000, seed: int | None = 0) -> dict:
    """Paired stratified bootstrap of model A minus model B.

    Both models must have been run on the same tries: same setups and, per
    setup, the same number of tries in the same (try) order -- the position
    in the list is the try key.  Otherwise ``ValueError``.  For each redraw
    and setup the SAME try indices are drawn (with replacement, keeping n_c)
    for both models.

    Returns ``{"S": (diff, Interval), "groups": {g: (diff, Interval)},
    "complete": bool, "missing": (...)}``; differences are A - B as
    fractions.  If an expected setup has no tries, ``S`` (and the groups
    containing it) are ``(None, None)``.
    """
    if n_boot < 1:
        raise ValueError("n_boot must be >= 1")
    _check_setups(a, group_of, "outcomes of model A")
    _check_setups(b, group_of, "outcomes of model B")
    arr_a = {c: _as_bools(v, c) for c, v in a.items()}
    arr_b = {c: _as_bools(v, c) for c, v in b.items()}
    arr_a = {c: v for c, v in arr_a.items() if v.size}
    arr_b = {c: v for c, v in arr_b.items() if v.size}
    keys_a = {(c, i) for c, v in arr_a.items() for i in range(v.size)}
    keys_b = {(c, i) for c, v in arr_b.items() for i in range(v.size)}
    if keys_a != keys_b:
        diff = sorted(keys_a ^ keys_b)[:10]
        raise ValueError(f"models A and B do not share the same (setup, try) keys; e.g. {diff}")

    expected = list(group_of)
    groups = _ordered_unique(group_of[c] for c in expected)
    missing = tuple(sorted(c for c in expected if c not in arr_a))

    rng = np.random.default_rng(seed)
    pt: dict[str, float] = {}
    bs: dict[str, np.ndarray] = {}
    for c in sorted(arr_a):
        xa = arr_a[c].astype(np.float64)
        xb = arr_b[c].astype(np.float64)
        n = xa.size
        pt[c] = float(xa.mean() - xb.mean())
        idx = rng.integers(0, n, size=(n_boot, n))
        bs[c] = xa[idx].mean(axis=1) - xb[idx].mean(axis=1)

    # Differences are linear, so mean of per-setup differences == difference of means.
    diff_of = {c: group_of[c] for c in expected}
    g_pt, _, S_pt, _ = _aggregate(pt, group_of, diff_of, expected)
    g_bs, _, S_bs, _ = _aggregate(bs, group_of, diff_of, expected)

    def pair(p, s):
        if p is None:
            return (None, None)
        return (float(p), _percentile_interval(s))

    return {
        "S": pair(S_pt, S_bs),
        "groups": {g: pair(g_pt[g], g_bs[g]) for g in groups},
        "complete": not missing,
        "missing": missing,
    }


# --------------------------------------------------------------------------
# Secondary metrics (section 6)
# --------------------------------------------------------------------------
def _truthy(x: Any) -> bool:
    return bool(x)


def _is_dropped(rec: Mapping) -> bool:
    flags = rec.get("flags") or ()
    if isinstance(flags, str):
        flags = (flags,)
    return "dropped" in flags or rec.get("dropped") is True


def finite(x: Any) -> float | None:
    """``x`` as a float when it is a finite number, else None (what JSON and the pages show as n/a)."""
    if x is None:
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def secondary(records: Iterable[Mapping]) -> dict:
    """Secondary metrics from per-try records (JSON-safe result).

    * ``recovery``: tries with ``disturbance_fired`` true; ``k`` = successes
      among them; ``{"k", "n", "rate", "ci": [low, high]}`` (Wilson 95 %);
      ``rate``/``ci`` are ``None`` when ``n == 0``.
    * ``dropped``: number of tries whose ``flags`` contain ``"dropped"`` or
      whose ``dropped`` field is true.
    * ``mean_completion_s``: mean ``time_s`` over successful tries (``None``
      if there is none with a time).
    * ``latency_ms``: per policy query.  From ``infer_ms`` (list of per-query
      ms) when every record carrying latency has it: mean, p50, p90, p99,
      max and count over all queries.  Records with only ``infer_ms_mean`` +
      ``infer_queries`` still enter the (query-weighted) mean and the count,
      but then the percentiles and max are ``None`` (they cannot be
      recovered from means).  ``None`` when no record carries latency.
      Warm-up queries (``warmup_ms``: a fresh policy's first queries) are
      not in it; ``warmup_ms`` summarises them (count, mean, max).
    * ``step_ms``: mean ms per control step by stage (``step_ms`` totals of
      the records over their ``steps``), plus ``total``; ``None`` when no
      record carries it.
    """
    records = list(records)

    fired = [r for r in records if _truthy(r.get("disturbance_fired"))]
    rk = sum(1 for r in fired if _truthy(r.get("success")))
    rn = len(fired)
    if rn:
        ci = wilson(rk, rn)
        recovery = {"k": rk, "n": rn, "rate": rk / rn, "ci": [ci.low, ci.high]}
    else:
        recovery = {"k": 0, "n": 0, "rate": None, "ci": None}

    dropped = sum(1 for r in records if _is_dropped(r))

    times = [float(r["time_s"]) for r in records
             if _truthy(r.get("success")) and r.get("time_s") is not None]
    mean_completion_s = float(np.mean(times)) if times else None

    per_query: list[float] = []
    total_ms = 0.0
    total_q = 0
    only_means = False
    for r in records:
        lst = r.get("infer_ms")
        if lst is not None and not isinstance(lst, (int, float)):
            vals = [float(v) for v in lst]
            per_query.extend(vals)
            total_ms += sum(vals)
            total_q += len(vals)
        elif r.get("infer_ms_mean") is not None and r.get("infer_queries"):
            q = int(r["infer_queries"])
            total_ms += float(r["infer_ms_mean"]) * q
            total_q += q
            only_means = True
    if total_q:
        if only_means or not per_query:
            latency = {"mean": total_ms / total_q, "p50": None, "p90": None,
                       "p99": None, "max": None, "count": total_q}
        else:
            q = np.asarray(per_query)
            p50, p90, p99 = np.percentile(q, (50, 90, 99))
            latency = {"mean": float(q.mean()), "p50": float(p50), "p90": float(p90),
                       "p99": float(p99), "max": float(q.max()), "count": int(q.size)}
        latency = {k: (finite(v) if k != "count" else v) for k, v in latency.items()}
    else:
        latency = None

    warm = [float(v) for r in records for v in (r.get("warmup_ms") or ())]
    warmup = {"count": len(warm), "mean": float(np.mean(warm)), "max": float(np.max(warm))} if warm else None

    stage_sum: dict[str, float] = {}
    stage_steps = 0
    for r in records:
        st = r.get("step_ms")
        if isinstance(st, Mapping) and r.get("steps"):
            stage_steps += int(r["steps"])
            for k, v in st.items():
                stage_sum[k] = stage_sum.get(k, 0.0) + float(v)
    step_ms = None
    if stage_steps:
        step_ms = {k: v / stage_steps for k, v in stage_sum.items()}
        step_ms["total"] = sum(stage_sum.values()) / stage_steps
        step_ms["steps"] = stage_steps

    return {
        "recovery": recovery,
        "dropped": dropped,
        "mean_completion_s": mean_completion_s,
        "latency_ms": latency,
        "warmup_ms": warmup,
        "step_ms": step_ms,
    }


# --------------------------------------------------------------------------
# Serialisation
# --------------------------------------------------------------------------
def ci_list(ci: Interval | None) -> list[float | None] | None:
    """An interval as JSON's [low, high] (None where a bound is not finite)."""
    if ci is None:
        return None
    return [finite(ci.low), finite(ci.high)]


def score_to_dict(score: Score) -> dict:
    """JSON-safe dict of a :class:`Score`.  Rates stay fractions (0..1);
    intervals are ``[low, high]`` lists; n/a is ``None``."""
    return {
        "complete": score.complete,
        "S": finite(score.S),
        "S_ci": ci_list(score.S_ci),
        "M": finite(score.M),
        "M_ci": ci_list(score.M_ci),
        "groups": {g: {"rate": finite(v), "ci": ci_list(ci)}
                   for g, (v, ci) in score.groups.items()},
        "difficulty": {d: {"rate": finite(v), "ci": ci_list(ci)}
                       for d, (v, ci) in score.difficulty.items()},
        "setups": {c: {"k": r.k, "n": r.n, "rate": r.rate, "ci": ci_list(r.ci)}
                   for c, r in score.setups.items()},
        "missing": list(score.missing),
    }
