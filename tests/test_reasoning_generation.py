"""Plan-k-Step-Generation set (eval/reasoning/genset.py): every valid state of every legal order as a
reference, a matching threshold calibrated on the set, per-turn matching and a path check; the CLI."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from eval.reasoning import genset as GS
from eval.reasoning import planning as P
from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def gen_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen")
    m = GS.build(out, seed=1, ks=(2, 3), per_k=2, progress=False)
    return out, m


def test_cases_hold_every_legal_path_and_only_invalid_distractors():
    for k in (2, 3, 4, 5):
        case = GS.make_case(np.random.default_rng([7, k, 0]), k)
        dom, target = case["meta"]["domain"], set(case["meta"]["target"])
        assert len(target) == k + 1
        edges_t = [e for e in P.edges(dom) if e[0] in target and e[1] in target]
        assert edges_t  # a real ordering constraint inside the target
        orders = P.all_topological_orders(sorted(target), edges_t)
        for i in range(1, k + 1):
            want = sorted({tuple(sorted(o[:i])) for o in orders})
            assert sorted(tuple(v["inserted"]) for v in case["valid"][str(i)]) == want
            assert case["invalid"][str(i)]
            for u in case["invalid"][str(i)]:
                assert not P.valid_toward(dom, u["state"], target)
        # the i-subsets of the target that no legal order passes through are all among the invalid states
        for i in range(1, k + 1):
            subsets = {tuple(c) for c in itertools.combinations(sorted(target), i)}
            bad = subsets - {tuple(v["inserted"]) for v in case["valid"][str(i)]}
            assert bad == {tuple(u["inserted"]) for u in case["invalid"][str(i)] if u["inserted"] is not None}


def test_calibration_is_half_the_nearest_wrong_state(gen_set):
    out, m = gen_set
    cal = m["calibration"]
    assert 0 < cal["threshold_rms"] == pytest.approx(min(cal["d_valid_invalid_min"], cal["d_valid_valid_min"]) / 2)
    cases, _ = GS.load(out)
    size = m["image_size"]
    # brute force on one case: every invalid render and every other valid state lies beyond 2 x threshold
    case = cases[-1]
    for step, valid in case["valid"].items():
        for v in valid:
            a = GS._load_img(out / v["path"], size)
            for u in case["invalid"][step]:
                assert GS.rms(a, GS._load_img(out / u["path"], size)) >= 2 * cal["threshold_rms"] - 1e-12


def test_oracle_scores_all_and_wrong_state_scores_zero(gen_set, tmp_path):
    out, m = gen_set
    GS.write_answers(out, tmp_path / "oracle", "oracle")
    recs, _ = GS.score_answers(out, tmp_path / "oracle")
    assert all(r["score"] == 1 for r in recs), [r["reason"] for r in recs if not r["score"]]
    GS.write_answers(out, tmp_path / "wrong", "wrong")
    recs, _ = GS.score_answers(out, tmp_path / "wrong")
    assert all(r["score"] == 0 for r in recs)
    s = GS.summarize(recs, m, "wrong")
    assert s["success"] == 0 and set(s["per_k"]) == {"k2", "k3"}


def test_other_legal_orders_and_mild_noise_are_accepted_skips_are_not(gen_set, tmp_path):
    out, m = gen_set
    cases, _ = GS.load(out)
    thr = m["calibration"]["threshold_rms"]
    size = m["image_size"]
    case = next(c for c in cases if c["k"] == 3)
    dom, target = case["meta"]["domain"], set(case["meta"]["target"])
    edges_t = [e for e in P.edges(dom) if e[0] in target and e[1] in target]
    by_set = {i: {tuple(v["inserted"]): v["path"] for v in case["valid"][str(i)]} for i in range(1, 4)}
    rng = np.random.default_rng(0)
    for order in P.all_topological_orders(sorted(target), edges_t):
        imgs = [GS._load_img(out / by_set[i][tuple(sorted(order[:i]))], size) for i in range(1, 4)]
        assert GS.score_case(case, imgs, out, thr)["accepted"]
        noisy = [np.clip(im + rng.integers(-2, 3, im.shape) / 255.0, 0, 1) for im in imgs]  # RMS ~1.4/255
        assert GS.score_case(case, noisy, out, thr)["accepted"]
    ref = case["meta"]["reference_order"]
    first = GS._load_img(out / by_set[1][tuple(sorted(ref[:1]))], size)
    last = GS._load_img(out / by_set[3][tuple(sorted(ref[:3]))], size)
    r = GS.score_case(case, [first, first, last], out, thr)  # step 2 repeats step 1: no valid 2-block state
    assert not r["accepted"] and r["reason"].startswith("step 2")
    assert not GS.score_case(case, [first, last], out, thr)["accepted"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "eval.reasoning", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)


def test_generate_cli_and_bad_answers(gen_set, tmp_path):
    out, _ = gen_set
    r = _cli("generate-answers", "--answerer", "oracle", "--data", str(out), "--out", str(tmp_path / "ans"))
    assert r.returncode == 0, r.stderr
    r = _cli("generate-score", "--answers", str(tmp_path / "ans"), "--data", str(out), "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert s["success"] == s["n_cases"] == 4 and "threshold" in (tmp_path / "rep" / "REPORT.md").read_text()
    # a missing step and an unreadable image fail that case only, with the reason
    cases, _ = GS.load(out)
    (tmp_path / "ans" / cases[0]["id"] / "step2.png").unlink()
    (tmp_path / "ans" / cases[1]["id"] / "step1.png").write_bytes(b"not a png")
    recs, _ = GS.score_answers(out, tmp_path / "ans")
    assert recs[0]["reason"] == "missing step2.png" and "cannot read image" in recs[1]["reason"]
    assert [r["score"] for r in recs[2:]] == [1, 1]
    shutil.rmtree(tmp_path / "ans" / cases[2]["id"])
    assert GS.score_answers(out, tmp_path / "ans")[0][2]["reason"] == "no folder for this case"
    for args, msg in ((("--answers", str(tmp_path / "nope")), "is not a folder"),
                      (("--answers", str(tmp_path)), "no folder in"),
                      (("--answers", str(tmp_path / "ans"), "--data", str(tmp_path / "nodata")), "cases.jsonl")):
        full = ("generate-score", "--data", str(out), "--out", str(tmp_path / "r2"), *args)
        r = _cli(*full)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().count("\n") == 0
    r = _cli("generate-answers", "--answerer", "nope", "--data", str(out), "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "unknown generation answerer" in r.stderr
    r = _cli("generate-build", "--out", str(tmp_path / "g"), "--ks", "0-9")
    assert r.returncode == 2 and "--ks" in r.stderr


def test_committed_generation_reports_and_threshold_agree():
    """results/reasoning/generation: the oracle scores 80/80, the wrong-state answerer 0/80, on the committed
    set; the single-item scorer's MSE threshold lies within the set's calibrated one."""
    import math

    from eval.reasoning import generation as G

    root = REPO_ROOT / "results" / "reasoning" / "generation"
    m = json.loads((root / "manifest.json").read_text())
    assert m["counts"] == {"k2": 20, "k3": 20, "k4": 20, "k5": 20}
    cal = m["calibration"]
    assert cal["threshold_rms"] == pytest.approx(min(cal["d_valid_invalid_min"], cal["d_valid_valid_min"]) / 2)
    assert math.sqrt(G.MSE_THRESHOLD) <= cal["threshold_rms"]
    for name, want in (("oracle", 1.0), ("wrong", 0.0)):
        s = json.loads((root / name / "summary.json").read_text())
        assert s["set_sha256"] == m["sha256"] and s["n_cases"] == 80
        assert all(r["rate"] == want and r["n"] == 20 for r in s["per_k"].values()), name
