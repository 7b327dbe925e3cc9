"""Tests of eval/stats.py (spec BENCHMARK.md sections 2, 5, 6, 8)."""
import json
import math

import numpy as np
import pytest

from eval.stats import (
    Interval,
    outcomes_from_records,
    paired_difference,
    paired_outcomes_from_records,
    score,
    score_to_dict,
    secondary,
    wilson,
)

# ---------------------------------------------------------------------------
# Setup table, copied from spec section 2 (id: (group, difficulty)).
# The project's real table lives in env/setups.py; this literal keeps the
# statistics tests independent of it.
# ---------------------------------------------------------------------------
SETUPS = {
    "A01": ("Clearance", "easy"),
    "A02": ("Clearance", "easy"),
    "A03": ("Clearance", "medium"),
    "A04": ("Clearance", "hard"),
    "B01": ("Pose and layout", "medium"),
    "B02": ("Pose and layout", "medium"),
    "B03": ("Pose and layout", "medium"),
    "B04": ("Pose and layout", "medium"),
    "B05": ("Pose and layout", "hard"),
    "C01": ("Clutter", "easy"),
    "C02": ("Clutter", "medium"),
    "C03": ("Clutter", "medium"),
    "C04": ("Clutter", "hard"),
    "C05": ("Clutter", "hard"),
    "D01": ("Appearance", "easy"),
    "D02": ("Appearance", "medium"),
    "D03": ("Appearance", "medium"),
    "D04": ("Appearance", "medium"),
    "D05": ("Appearance", "hard"),
    "E01": ("Viewpoint", "easy"),
    "E02": ("Viewpoint", "hard"),
    "E03": ("Viewpoint", "medium"),
    "E04": ("Viewpoint", "hard"),
    "F01": ("Latency and disturbance", "easy"),
    "F02": ("Latency and disturbance", "hard"),
    "F03": ("Latency and disturbance", "medium"),
    "F04": ("Latency and disturbance", "hard"),
    "F05": ("Latency and disturbance", "medium"),
    "G01": ("Combined stress", "hard"),
    "G02": ("Combined stress", "hard"),
}
IDS = list(SETUPS)
GROUP_OF = {c: g for c, (g, _) in SETUPS.items()}
DIFF_OF = {c: d for c, (_, d) in SETUPS.items()}

# Spec section 8: per-setup success in %, 50 tries each, order A01..G02.
PUBLISHED = {
    "scripted": [100, 100, 100, 86,
                 100, 100, 100, 100, 98,
                 100, 100, 100, 98, 100,
                 100, 100, 100, 100, 100,
                 100, 100, 100, 100,
                 100, 100, 100, 100, 100,
                 100, 98],
    "bc-state": [100, 100, 100, 98,
                 84, 96, 88, 84, 12,
                 96, 98, 100, 100, 100,
                 100, 100, 100, 100, 100,
                 98, 100, 100, 100,
                 100, 0, 96, 100, 98,
                 96, 94],
}
# Published score S, % [95% range]
PUBLISHED_S = {"scripted": (99.2, 98.7, 99.7), "bc-state": (92.1, 91.1, 92.9)}

N_TRIES = 50


def outcome_list(k, n=N_TRIES):
    return [True] * k + [False] * (n - k)


def published_outcomes(name):
    pcts = PUBLISHED[name]
    assert len(pcts) == 30
    out = {}
    for c, pct in zip(IDS, pcts):
        k = pct * N_TRIES // 100
        assert k * 100 == pct * N_TRIES  # every published % is a whole count of 50
        out[c] = outcome_list(k)
    return out


def const_outcomes(k_of, n=N_TRIES):
    return {c: outcome_list(k_of(c), n) for c in IDS}


# ---------------------------------------------------------------------------
# Setup table sanity (spec section 2 counts)
# ---------------------------------------------------------------------------
def test_setup_table_counts():
    assert len(SETUPS) == 30
    diffs = [d for _, d in SETUPS.values()]
    assert (diffs.count("easy"), diffs.count("medium"), diffs.count("hard")) == (6, 13, 11)
    groups = list(dict.fromkeys(GROUP_OF.values()))
    sizes = [sum(1 for g in GROUP_OF.values() if g == grp) for grp in groups]
    assert sizes == [4, 5, 5, 5, 4, 5, 2]


# ---------------------------------------------------------------------------
# Wilson
# ---------------------------------------------------------------------------
# z = 1.959963984540054, z^2 = 3.841458820694124, n = 50, z^2/n = 0.0768291764
# centre = (p + z^2/(2n)) / (1 + z^2/n)
# half   = z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/(4 n^2))
#
# k=0:  centre = 0.0384145882 / 1.0768291764 = 0.0356738 ; half = same value
#       (sqrt(z^2/(4n^2)) = z/(2n)), so [0, 2 * 0.0356738] = [0, 0.0713477]
# k=50: mirror image: [1 - 0.0713477, 1] = [0.9286523, 1]
# k=25: centre = 0.5 ; half = 1.959964 / 1.0768292 * sqrt(0.005 + 0.00038415)
#       = 1.8201241 * 0.0733768 = 0.1335556  ->  [0.3664444, 0.6335556]
def test_wilson_hand_values():
    ci = wilson(0, 50)
    assert ci.low == 0.0
    assert ci.high == pytest.approx(0.0713477, abs=1e-6)

    ci = wilson(50, 50)
    assert ci.low == pytest.approx(0.9286523, abs=1e-6)
    assert ci.high == 1.0

    ci = wilson(25, 50)
    assert ci.low == pytest.approx(0.3664444, abs=1e-6)
    assert ci.high == pytest.approx(0.6335556, abs=1e-6)


def test_wilson_edge_cases():
    ci = wilson(0, 0)
    assert math.isnan(ci.low) and math.isnan(ci.high)
    a, b = wilson(7, 50), wilson(43, 50)
    assert a.low == pytest.approx(1 - b.high) and a.high == pytest.approx(1 - b.low)
    with pytest.raises(ValueError):
        wilson(51, 50)


# ---------------------------------------------------------------------------
# Scoring and bootstrap
# ---------------------------------------------------------------------------
def test_all_success_is_a_point():
    s = score(const_outcomes(lambda c: N_TRIES), GROUP_OF, DIFF_OF)
    assert s.complete and s.missing == ()
    assert s.S == 1.0 and s.M == 1.0
    assert s.S_ci == Interval(1.0, 1.0) and s.M_ci == Interval(1.0, 1.0)
    for g, (r, ci) in s.groups.items():
        assert r == 1.0 and ci == Interval(1.0, 1.0)
    assert list(s.difficulty) == ["easy", "medium", "hard"]
    for d, (r, ci) in s.difficulty.items():
        assert r == 1.0 and ci == Interval(1.0, 1.0)
    assert s.setups["A01"].k == 50 and s.setups["A01"].ci == wilson(50, 50)


def test_single_group():
    group_of = {"X1": "X", "X2": "X", "X3": "X"}
    diff_of = {"X1": "easy", "X2": "easy", "X3": "hard"}
    out = {"X1": outcome_list(40), "X2": outcome_list(30), "X3": outcome_list(20)}
    s = score(out, group_of, diff_of)
    assert s.S == pytest.approx(0.6) and s.M == pytest.approx(0.6)
    r, ci = s.groups["X"]
    assert r == pytest.approx(0.6)
    # one group: S is r_g, redraw for redraw, so the intervals are identical
    assert ci == s.S_ci == s.M_ci
    assert ci.low < 0.6 < ci.high
    assert s.difficulty["easy"][0] == pytest.approx(0.7)
    assert s.difficulty["hard"][0] == pytest.approx(0.4)
    # rough size: sd of mean of 3 binomial rates ~ 0.04 -> 95% range ~ +-0.08
    assert 0.05 < 0.6 - ci.low < 0.11 and 0.05 < ci.high - 0.6 < 0.11


def test_bootstrap_seeded_determinism():
    out = published_outcomes("bc-state")
    s1 = score(out, GROUP_OF, DIFF_OF, seed=0)
    s2 = score(dict(reversed(list(out.items()))), GROUP_OF, DIFF_OF, seed=0)
    assert s1 == s2  # same seed, input order irrelevant
    s3 = score(out, GROUP_OF, DIFF_OF, seed=1)
    assert s3.S == s1.S and s3.S_ci != s1.S_ci


def test_binomial_draws_match_index_resampling():
    """The documented equivalence: Binomial(n, k/n) draws == resampling tries."""
    group_of = {"X1": "X", "X2": "X"}
    diff_of = {"X1": "easy", "X2": "easy"}
    out = {"X1": outcome_list(42), "X2": outcome_list(17)}
    s = score(out, group_of, diff_of, n_boot=20000, seed=3)
    rng = np.random.default_rng(123)
    reps = []
    for c in ("X1", "X2"):
        x = np.asarray(out[c], dtype=float)
        reps.append(x[rng.integers(0, 50, size=(20000, 50))].mean(axis=1))
    lo, hi = np.percentile((reps[0] + reps[1]) / 2, [2.5, 97.5])
    assert s.S_ci.low == pytest.approx(lo, abs=0.011)
    assert s.S_ci.high == pytest.approx(hi, abs=0.011)


def test_missing_setup_makes_score_na():
    out = const_outcomes(lambda c: 40)
    del out["C03"]
    out["E02"] = []  # no tries counts as missing too
    s = score(out, GROUP_OF, DIFF_OF)
    assert not s.complete
    assert s.S is None and s.S_ci is None and s.M is None and s.M_ci is None
    assert s.missing == ("C03", "E02")
    assert s.groups["Clutter"] == (None, None)
    assert s.groups["Viewpoint"] == (None, None)
    assert s.groups["Clearance"][0] == pytest.approx(0.8)
    assert s.difficulty["medium"] == (None, None) and s.difficulty["hard"] == (None, None)
    assert s.difficulty["easy"][0] == pytest.approx(0.8)
    assert "C03" not in s.setups and "E02" not in s.setups
    d = score_to_dict(s)
    json.dumps(d, allow_nan=False)
    assert d["S"] is None and d["complete"] is False and d["missing"] == ["C03", "E02"]


def test_unknown_setup_raises():
    out = const_outcomes(lambda c: 50)
    out["Z99"] = outcome_list(10)
    with pytest.raises(ValueError, match="Z99"):
        score(out, GROUP_OF, DIFF_OF)


def test_group_weighting():
    # Group G (2 setups) fails everything, the other 28 setups always succeed.
    #   M = 28/30 = 0.9333...   (per setup: G is 2 of 30 setups)
    #   S = (6 * 1 + 0) / 7 = 0.857142...  (per group: G is 1 of 7 groups)
    out = const_outcomes(lambda c: 0 if c.startswith("G") else 50)
    s = score(out, GROUP_OF, DIFF_OF)
    assert s.M == pytest.approx(28 / 30)
    assert s.S == pytest.approx(6 / 7)
    # The same 2 failed setups inside a 5-setup group weigh less in S:
    #   B's r_g = 3/5, S = (6 + 0.6) / 7 = 0.942857..., M unchanged
    out = const_outcomes(lambda c: 0 if c in ("B01", "B02") else 50)
    s = score(out, GROUP_OF, DIFF_OF)
    assert s.M == pytest.approx(28 / 30)
    assert s.S == pytest.approx(6.6 / 7)
    assert s.groups["Pose and layout"][0] == pytest.approx(0.6)
    # every fail is a point: Binomial(n, 0) and Binomial(n, 1) never vary
    assert s.S_ci == Interval(pytest.approx(6.6 / 7), pytest.approx(6.6 / 7))


@pytest.mark.parametrize("name", ["scripted", "bc-state"])
def test_published_reference_results(name):
    """Spec section 8: S and its 95% range, from the per-setup table."""
    s = score(published_outcomes(name), GROUP_OF, DIFF_OF, n_boot=5000, seed=0)
    S_pub, lo_pub, hi_pub = PUBLISHED_S[name]
    assert s.complete
    assert abs(100 * s.S - S_pub) <= 0.1 and round(100 * s.S, 1) == S_pub
    assert abs(100 * s.S_ci.low - lo_pub) <= 0.1 and round(100 * s.S_ci.low, 1) == lo_pub
    assert abs(100 * s.S_ci.high - hi_pub) <= 0.1 and round(100 * s.S_ci.high, 1) == hi_pub


def test_published_point_values_by_hand():
    # bc-state groups: A 99.5, B 72.8, C 98.8, D 100, E 99.5, F 78.8, G 95
    # S = 644.4 / 7 = 92.0571...; M = 2738 / 30 = 91.2666...
    s = score(published_outcomes("bc-state"), GROUP_OF, DIFF_OF, n_boot=10)
    assert 100 * s.S == pytest.approx(644.4 / 7)
    assert 100 * s.M == pytest.approx(2738 / 30)
    assert 100 * s.groups["Pose and layout"][0] == pytest.approx(72.8)
    assert 100 * s.groups["Combined stress"][0] == pytest.approx(95.0)


# ---------------------------------------------------------------------------
# Paired comparison
# ---------------------------------------------------------------------------
def test_paired_self_is_zero():
    out = published_outcomes("bc-state")
    res = paired_difference(out, out, GROUP_OF)
    assert res["S"] == (0.0, Interval(0.0, 0.0))
    for g, (d, ci) in res["groups"].items():
        assert d == 0.0 and ci == Interval(0.0, 0.0)


def test_paired_difference_values():
    a = published_outcomes("scripted")
    b = published_outcomes("bc-state")
    res = paired_difference(a, b, GROUP_OF, seed=0)
    d, ci = res["S"]
    sa = score(a, GROUP_OF, DIFF_OF, n_boot=10).S
    sb = score(b, GROUP_OF, DIFF_OF, n_boot=10).S
    assert d == pytest.approx(sa - sb)
    assert ci.low < d < ci.high
    assert res["groups"]["Pose and layout"][0] == pytest.approx(0.996 - 0.728)
    assert res == paired_difference(a, b, GROUP_OF, seed=0)
    # all vs nothing: a point difference of 1
    res = paired_difference(const_outcomes(lambda c: 50), const_outcomes(lambda c: 0), GROUP_OF)
    assert res["S"] == (1.0, Interval(1.0, 1.0))


def test_paired_requires_same_tries():
    a = published_outcomes("scripted")
    b = dict(a)
    b["A01"] = outcome_list(49, n=49)
    with pytest.raises(ValueError):
        paired_difference(a, b, GROUP_OF)
    b = dict(a)
    del b["G02"]
    with pytest.raises(ValueError):
        paired_difference(a, b, GROUP_OF)

    ra = [{"setup": "A01", "try": t, "success": True} for t in range(3)]
    rb = [{"setup": "A01", "try": t, "success": False} for t in range(1, 4)]
    with pytest.raises(ValueError):
        paired_outcomes_from_records(ra, rb)
    oa, ob = paired_outcomes_from_records(ra, ra[::-1])
    assert oa == ob == {"A01": [True, True, True]}


# ---------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------
def test_outcomes_from_records_sorted_and_duplicates():
    recs = [
        {"setup": "A01", "try": 2, "success": False},
        {"setup": "A01", "try": 0, "success": True},
        {"setup": "B01", "try": 0, "success": 1},
        {"setup": "A01", "try": 1, "success": True},
    ]
    assert outcomes_from_records(recs) == {"A01": [True, True, False], "B01": [True]}
    with pytest.raises(ValueError, match="duplicate"):
        outcomes_from_records(recs + [{"setup": "A01", "try": 1, "success": False}])


def test_secondary_metrics():
    recs = [
        {"setup": "F03", "try": 0, "success": True, "disturbance_fired": True, "time_s": 7.0,
         "infer_ms": [1.0, 2.0, 3.0]},
        {"setup": "F03", "try": 1, "success": False, "disturbance_fired": True,
         "flags": ["dropped"], "time_s": 15.0, "infer_ms": [4.0]},
        {"setup": "F03", "try": 2, "success": True, "disturbance_fired": False, "time_s": 9.0,
         "infer_ms": [5.0, 6.0]},
        {"setup": "A01", "try": 0, "success": False, "dropped": True, "flags": []},
        {"setup": "A01", "try": 1, "success": True, "time_s": 8.0, "flags": ["rim"]},
    ]
    sec = secondary(recs)
    json.dumps(sec, allow_nan=False)
    rec = sec["recovery"]
    assert (rec["k"], rec["n"]) == (1, 2) and rec["rate"] == 0.5
    w = wilson(1, 2)
    assert rec["ci"] == [w.low, w.high]
    assert sec["dropped"] == 2
    assert sec["mean_completion_s"] == pytest.approx(8.0)  # (7 + 9 + 8) / 3
    lat = sec["latency_ms"]
    q = [1, 2, 3, 4, 5, 6]
    assert lat["count"] == 6 and lat["mean"] == pytest.approx(3.5) and lat["max"] == 6.0
    assert lat["p50"] == pytest.approx(np.percentile(q, 50))
    assert lat["p90"] == pytest.approx(np.percentile(q, 90))
    assert lat["p99"] == pytest.approx(np.percentile(q, 99))

    # only per-try means: query-weighted mean, no percentiles
    lat = secondary([{"infer_ms_mean": 2.0, "infer_queries": 10},
                     {"infer_ms_mean": 5.0, "infer_queries": 30}])["latency_ms"]
    assert lat["mean"] == pytest.approx(4.25) and lat["count"] == 40 and lat["p50"] is None

    empty = secondary([{"setup": "A01", "try": 0, "success": False}])
    assert empty["recovery"] == {"k": 0, "n": 0, "rate": None, "ci": None}
    assert empty["dropped"] == 0 and empty["mean_completion_s"] is None
    assert empty["latency_ms"] is None


def test_score_to_dict_json_safe():
    s = score(published_outcomes("scripted"), GROUP_OF, DIFF_OF, n_boot=200)
    d = score_to_dict(s)
    text = json.dumps(d, allow_nan=False)
    back = json.loads(text)
    assert back["S"] == pytest.approx(s.S) and 0 <= back["S"] <= 1
    assert back["S_ci"] == [s.S_ci.low, s.S_ci.high]
    assert back["setups"]["A04"] == {"k": 43, "n": 50, "rate": 0.86,
                                     "ci": [s.setups["A04"].ci.low, s.setups["A04"].ci.high]}
    assert set(back["groups"]) == set(GROUP_OF.values())
    assert list(back["difficulty"]) == ["easy", "medium", "hard"]
