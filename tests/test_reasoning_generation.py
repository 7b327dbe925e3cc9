"""Plan-k-Step-Generation set (assembly_probe/genset.py): every valid state of every legal order as a
reference; the headline score by what the pictures show (alignment with a similarity warp, the part-level reading, a
legal path), calibrated on correct and wrong-state renders under a generator's changes (sub-pixel offsets, zoom,
rotation, blur, JPEG, other light); the MSE matcher as a diagnostic; the CLI and the image-generation driver against
a fake server."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import shutil
import subprocess
import sys
from http.server import BaseHTTPRequestHandler

import numpy as np
import pytest

from assembly_probe import genset as GS
from assembly_probe import matching as M
from assembly_probe import planning as P
from tests.conftest import REPO_ROOT
from tests.test_reasoning_http import Loopback


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


def test_calibration_reads_every_change_and_records_the_margin(gen_set):
    """The manifest's calibration: every correct render, clean and under every change, read as its own state;
    every wrong-state render (clean and changed) rejected; every reference case accepted under every change and every
    case with one wrong turn rejected; the separation margin recorded and positive (at least 0.05: every deciding share that
    far on the right side of its region's threshold; the full set's is 0.070, under blur radius 2)."""
    _, m = gen_set
    cal = m["calibration"]
    rd = cal["reading"]
    assert cal["perturbations"] == list(M.PERTURBATIONS)
    assert set(rd["correct"]) == {GS.CLEAN, *M.PERTURBATIONS}
    assert rd["correct_read_right"] == rd["correct_images"] > 0
    assert rd["wrong_rejected"] == rd["wrong_images"] > 0
    for kind, r in rd["correct"].items():
        assert r["read_right"] == r["images"] and r["min_margin"] >= rd["separation_margin"], kind
        assert rd["cases"][kind]["accepted"] == rd["cases"][kind]["cases"] == 4, kind
    assert rd["cases"]["wrong_turn"]["accepted"] == 0
    assert rd["separation_margin"] >= 0.05 and rd["separation_margin_at"]["kind"] in rd["correct"]
    assert "tolerance_mse" in cal["mse"] and cal["agreement"]["images"] == cal["images"]


@pytest.mark.slow
def test_every_change_on_every_render_of_a_case(gen_set):
    """Brute force on one case, beyond the calibration's sample: every valid render under every change is read
    as its own state, every invalid render under every change is not read as a valid state of its step."""
    out, m = gen_set
    cases, _ = GS.load(out)
    size = m["image_size"]
    case = next(c for c in cases if c["k"] == 2)
    refs = GS.CaseRefs.from_files(case, out, size)
    for step, valid in case["valid"].items():
        sets = [v["inserted"] for v in valid]
        for v in valid:
            raw = GS._load_uint8(out / v["path"])
            for kind in M.PERTURBATIONS:
                _, _, reg = refs.match(M.to_size(M.perturb(raw, kind), size), int(step))
                assert refs.reader.inserted(reg) == v["inserted"], (kind, step)
        for u in case["invalid"][step]:
            raw = GS._load_uint8(out / u["path"])
            for kind in M.PERTURBATIONS:
                _, _, reg = refs.match(M.to_size(M.perturb(raw, kind), size), int(step))
                assert refs.reader.inserted(reg) not in sets, (kind, u["kind"])


def _blob(n=96, cy=40.0, cx=52.0):
    yy, xx = np.mgrid[0:n, 0:n]
    g = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * 4.0 ** 2))
    return np.repeat((g * 255).round().astype(np.uint8)[..., None], 3, axis=2)


def _centroid(img):
    w = img[..., 0].astype(float)
    yy, xx = np.mgrid[0:img.shape[0], 0:img.shape[1]]
    return (w * yy).sum() / w.sum(), (w * xx).sum() / w.sum()


def test_perturbations_are_what_they_say():
    """Each change does what its name says, measured on a blob: half a pixel, 2 px right and 1 up, the zooms and
    rotations about the centre, blur, JPEG, twice the size, the tone changes; an unknown name is refused."""
    img = _blob()
    c = (img.shape[0] - 1) / 2
    y0, x0 = _centroid(img)
    y, x = _centroid(M.perturb(img, "subpx"))
    assert (y - y0, x - x0) == (pytest.approx(0.5, abs=0.05), pytest.approx(0.5, abs=0.05))
    y, x = _centroid(M.perturb(img, "shift2"))
    assert (y - y0, x - x0) == (pytest.approx(-1, abs=0.05), pytest.approx(2, abs=0.05))
    for kind, scale in (("zoom+1", 1.01), ("zoom+3", 1.03), ("zoom-3", 0.97)):
        y, x = _centroid(M.perturb(img, kind))
        assert (y - c, x - c) == (pytest.approx((y0 - c) * scale, abs=0.05), pytest.approx((x0 - c) * scale, abs=0.05))
    far = _blob(cy=14.0, cx=80.0)  # 47 px from the centre: 1 degree moves it 0.8 px
    y0, x0 = _centroid(far)
    for kind, deg in (("rot+1", 1.0), ("rot-2", -2.0)):
        y, x = _centroid(M.perturb(far, kind))
        a = np.radians(deg)  # image axes: y down, so a positive angle turns clockwise on screen
        want_x = c + np.cos(a) * (x0 - c) - np.sin(a) * (y0 - c)
        want_y = c + np.sin(a) * (x0 - c) + np.cos(a) * (y0 - c)
        assert (y, x) == (pytest.approx(want_y, abs=0.1), pytest.approx(want_x, abs=0.1)), kind
    assert M.perturb(img, "blur2")[..., 0].max() < img[..., 0].max() - 20  # spread out
    assert M.perturb(img, "resample2x").shape == (192, 192, 3)
    base = np.full((8, 8, 3), 100, np.uint8)
    assert M.perturb(base, "bright+10")[0, 0, 0] == 110
    assert M.perturb(np.full((8, 8, 3), 200, np.uint8), "contrast-15")[0, 0, 0] < 200
    assert M.perturb(base, "gamma0.8")[0, 0, 0] > 100
    from scipy.ndimage import gaussian_filter

    smooth = gaussian_filter(np.random.default_rng(0).random((64, 64, 3)) * 255, (3, 3, 0)).round().astype(np.uint8)
    assert 0 < np.abs(M.perturb(smooth, "jpeg75").astype(float) - smooth).mean() < 3
    assert M.perturb(img, "combined").shape == img.shape
    with pytest.raises(ValueError, match="unknown perturbation"):
        M.perturb(img, "jpeg85")


def test_similarity_registration_recovers_zoom_rotation_and_offset(gen_set):
    """The alignment's similarity warp, on a real render of the set against its case's initial render: the zoom,
    rotation and offset a change applied come back within 0.3%, 0.15 degrees and 0.35 px."""
    out, _ = gen_set
    cases, _ = GS.load(out)
    case = cases[-1]
    anchor = GS._load_img(out / case["images"][0]["path"], 384)
    raw = GS._load_uint8(out / case["valid"]["2"][0]["path"])
    stats = M.photometry(anchor)
    for zoom, deg, dx, dy in ((0.03, 0.0, 0.0, 0.0), (-0.03, 0.0, 0.0, 0.0), (0.0, -2.0, 0.0, 0.0),
                              (0.0, 0.0, 2.0, -1.0), (0.02, 1.0, 0.5, 0.5)):
        a = M.normalise(M.to_size(M.similarity(raw, zoom, deg, dx, dy), 384), stats)
        _, shift = M.register(a, anchor)
        p = M.register_similarity(a, anchor, shift)
        assert p[0] == pytest.approx(zoom, abs=0.003) and np.degrees(p[1]) == pytest.approx(deg, abs=0.15)
        # the warp reads the changed picture at (1 + s) R (x - c) + c + t: t is the offset of the anchor's centre
        assert (p[2], p[3]) == (pytest.approx(dx, abs=0.35), pytest.approx(dy, abs=0.35)), (zoom, deg, dx, dy, p)


def test_registration_finds_the_shift():
    from scipy.ndimage import gaussian_filter

    a = gaussian_filter(np.random.default_rng(1).random((96, 96, 3)), (2, 2, 0)).astype(np.float32)
    for dy, dx in ((1, -3), (-4, 4), (0, 2), (3, 0)):
        moved = M._shifted(a, dy, dx)
        back, shift = M.register(moved, a)
        assert shift == (-dy, -dx)
        assert np.abs(back - a)[6:-6, 6:-6].max() == 0


def test_oracle_scores_all_and_wrong_state_scores_zero(gen_set, tmp_path):
    out, m = gen_set
    GS.write_answers(out, tmp_path / "oracle", "oracle")
    recs, _ = GS.score_answers(out, tmp_path / "oracle")
    assert all(r["score"] == 1 and r["mse_accepted"] for r in recs), [r["reason"] for r in recs if not r["score"]]
    GS.write_answers(out, tmp_path / "wrong", "wrong")
    recs, _ = GS.score_answers(out, tmp_path / "wrong")
    assert all(r["score"] == 0 and not r["mse_accepted"] and r["agree"] for r in recs)
    s = GS.summarize(recs, m, "wrong")
    assert s["success"] == 0 and set(s["per_k"]) == {"k2", "k3"} and s["protocol"] == "files"
    # the issue 47 cases (half a pixel, 1% zoom, 1 degree, blur radius 2: each 0/30 under the MSE score) and the
    # hardest changes, through the CLI's writer and the scorer: the oracle scores every case, the wrong answerer none
    for kind in ("subpx", "zoom+1", "rot+1", "blur2", "zoom+3", "rot-2", "combined"):
        GS.write_answers(out, tmp_path / kind, "oracle", perturb=kind)
        recs, _ = GS.score_answers(out, tmp_path / kind)
        assert all(r["score"] == 1 for r in recs), (kind, [r["reason"] for r in recs if not r["score"]])
    GS.write_answers(out, tmp_path / "wrong_combined", "wrong", perturb="combined")
    recs, _ = GS.score_answers(out, tmp_path / "wrong_combined")
    assert all(r["score"] == 0 for r in recs)


def test_other_legal_orders_are_accepted_skips_are_not(gen_set, tmp_path):
    out, m = gen_set
    cases, _ = GS.load(out)
    tol = m["calibration"]["mse"]["tolerance_mse"]
    size = m["image_size"]
    case = next(c for c in cases if c["k"] == 3)
    refs = GS.CaseRefs.from_files(case, out, size)
    dom, target = case["meta"]["domain"], set(case["meta"]["target"])
    edges_t = [e for e in P.edges(dom) if e[0] in target and e[1] in target]
    by_set = {i: {tuple(v["inserted"]): v["path"] for v in case["valid"][str(i)]} for i in range(1, 4)}
    for order in P.all_topological_orders(sorted(target), edges_t):
        imgs = [GS._load_img(out / by_set[i][tuple(sorted(order[:i]))], size) for i in range(1, 4)]
        res = GS.score_images(refs, imgs, tol)
        assert res["accepted"] and res["mse_accepted"], (res["reason"], res["mse_reason"])
    ref = case["meta"]["reference_order"]
    first = GS._load_img(out / by_set[1][tuple(sorted(ref[:1]))], size)
    last = GS._load_img(out / by_set[3][tuple(sorted(ref[:3]))], size)
    r = GS.score_images(refs, [first, first, last], tol)  # step 2 repeats step 1: no valid 2-block state
    assert not r["accepted"] and not r["mse_accepted"] and r["mse_reason"].startswith("step 2")
    assert not GS.score_images(refs, [first, last], tol)["accepted"]


def test_legal_path_is_the_order_checker():
    """planning.legal_path (both scorers' last step) accepts exactly the prefixes of topological orders."""
    item = P.make_plan_item(np.random.default_rng([9, 4, 0]), 4)
    dom, target = item["meta"]["domain"], set(item["meta"]["target"])
    edges_t = [e for e in P.edges(dom) if e[0] in target and e[1] in target]
    for perm in itertools.permutations(sorted(target)):
        sets = [sorted(perm[:i]) for i in range(1, 5)]
        assert P.legal_path(dom, target, sets)[0] == P.is_topological_order(perm, target, edges_t)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "assembly_probe", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)


def test_generate_cli_and_bad_answers(gen_set, tmp_path):
    out, _ = gen_set
    r = _cli("generate-answers", "--answerer", "oracle", "--data", str(out), "--out", str(tmp_path / "ans"))
    assert r.returncode == 0, r.stderr
    r = _cli("generate-score", "--answers", str(tmp_path / "ans"), "--data", str(out), "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "rep" / "summary.json").read_text())
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert s["success"] == s["n_cases"] == 4 and "separation margin" in md and "not comparable" in md
    assert s["set_sha256_states"] == GS.load(out)[1]["sha256_states"]
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


def test_committed_generation_reports_and_the_issue_47_bounds():
    """results/reasoning/generation on the committed set: the part-level reading reads every calibration render
    right (correct ones as their state under every change, wrong ones rejected) with a separation margin of at least
    0.05 (0.070 here), every reference case accepted under every change and every case with one wrong turn rejected; the oracle
    80/80 clean and changed, the wrong answerer 0/80 clean and changed; the single-item scorer's MSE tolerance is
    the set's; the set's identity in every report is its states hash."""
    from assembly_probe import generation as G

    root = REPO_ROOT / "results" / "reasoning" / "generation"
    m = json.loads((root / "manifest.json").read_text())
    assert m["counts"] == {"k2": 20, "k3": 20, "k4": 20, "k5": 20}
    assert m["sha256_states"] == GS.states_sha256()
    cal = m["calibration"]
    rd = cal["reading"]
    assert cal["perturbations"] == list(M.PERTURBATIONS)
    assert rd["correct_read_right"] == rd["correct_images"] and rd["wrong_rejected"] == rd["wrong_images"]
    assert all(r["images"] > 0 for r in rd["wrong"].values()) and set(rd["wrong"]) == {GS.CLEAN, *M.PERTURBATIONS}
    assert rd["separation_margin"] >= 0.05
    for kind in [GS.CLEAN, *M.PERTURBATIONS]:
        assert rd["cases"][kind]["accepted"] == rd["cases"][kind]["cases"] == 80, kind
    assert rd["cases"]["wrong_turn"]["accepted"] == 0
    assert G.MSE_TOLERANCE == cal["mse"]["tolerance_mse"]
    reports = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert {"oracle", "wrong", "oracle_combined", "wrong_combined"} <= set(reports)
    for name in reports:
        s = json.loads((root / name / "summary.json").read_text())
        want = 80 if name.startswith("oracle") else 0
        assert s["set_sha256_states"] == m["sha256_states"] and s["n_cases"] == 80 and s["success"] == want, name
        assert "mse_success" in s and "agree" in s
        md = (root / name / "REPORT.md").read_text()
        assert "separation margin" in md and "not comparable" in md, name


# ----------------------------------------------------------------- the image-generation driver
class FakeImageServer(Loopback):
    """An image-generating chat model on loopback that draws the reference order's renders: the state after
    move t on turn t (turn = assistant messages so far + 1), or all k at once when asked for them. It checks
    that a later turn carries its own previous picture back, and can fail the first request (HTTP 500) or
    answer in text only."""

    def __init__(self, data, fail_first=False, text_only=False):
        self.cases = {}
        cases, _ = GS.load(data)
        for c in cases:
            png = (data / c["images"][0]["path"]).read_bytes()
            self.cases[hashlib.sha256(png).hexdigest()] = c
        self.data, self.fail_first, self.text_only = data, fail_first, text_only
        self.requests, self.sent = [], {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _json(self, code, obj):
                out = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                if outer.fail_first and len(outer.requests) == 1:
                    return self._json(500, {"error": {"message": "warming up"}})
                msgs = body["messages"]
                first = msgs[0]["content"]
                urls = [p["image_url"]["url"] for p in first if p["type"] == "image_url"]
                initial = base64.b64decode(urls[0].split(",", 1)[1])
                case = outer.cases[hashlib.sha256(initial).hexdigest()]
                order = case["meta"]["reference_order"]

                def png(step):
                    path = next(v["path"] for v in case["valid"][str(step)] if v["inserted"] == sorted(order[:step]))
                    return "data:image/png;base64," + base64.b64encode((outer.data / path).read_bytes()).decode()

                message = {"role": "assistant", "content": "Here it is."}
                if outer.text_only:
                    pass
                elif "Reply with" in first[0]["text"]:  # single-shot: the k pictures as content parts
                    message["content"] = [{"type": "text", "text": "Here they are."}] + [
                        {"type": "image_url", "image_url": {"url": png(i)}} for i in range(1, case["k"] + 1)]
                else:
                    turn = sum(m["role"] == "assistant" for m in msgs) + 1
                    if turn > 1:  # the conversation carries the model's own previous picture
                        mine = [m for m in msgs if m["role"] == "assistant"][-1]["content"][0]["image_url"]["url"]
                        assert mine == outer.sent[(case["id"], turn - 1)]
                    outer.sent[(case["id"], turn)] = png(turn)
                    message["images"] = [{"type": "image_url", "image_url": {"url": png(turn)}}]
                self._json(200, {"model": f"served/{body['model']}", "choices": [
                    {"index": 0, "message": message, "finish_reason": "stop"}], "usage": {"prompt_tokens": 10}})

        self._serve(Handler)


def test_multi_turn_driver_feeds_back_the_models_own_images(gen_set, tmp_path):
    from assembly_probe.answerers import HttpAnswerer
    from assembly_probe.gendriver import generate

    out, m = gen_set
    with FakeImageServer(out, fail_first=True) as srv:
        run = generate(out, tmp_path / "ans", HttpAnswerer(srv.url, model="painter", sleep=lambda s: None),
                       "multi-turn", progress=False)
        bodies = srv.requests
    cases, _ = GS.load(out)
    assert len(bodies) == 1 + sum(c["k"] for c in cases)  # one retried 500, then one request per turn
    assert all(b["modalities"] == ["image", "text"] for b in bodies)
    assert run["protocol"] == "multi-turn" and run["failed"] == 0 and run["model"] == "painter"
    assert run["cases"][cases[0]["id"]]["turns"][0]["attempts"] == 2
    recs, _ = GS.score_answers(out, tmp_path / "ans")
    assert all(r["score"] == 1 for r in recs)
    s = GS.write_report(recs, m, "painter", tmp_path / "rep", GS.read_run(tmp_path / "ans"))
    assert s["protocol"] == "multi-turn" and "multi-turn (the paper's protocol)" in (tmp_path / "rep" / "REPORT.md").read_text()


def test_single_shot_driver_and_its_failures_through_the_cli(gen_set, tmp_path):
    out, _ = gen_set
    with FakeImageServer(out) as srv:
        r = _cli("generate-answers", "--answerer", "http", "--endpoint", srv.url, "--model", "painter", "--protocol",
                 "single-shot", "--data", str(out), "--out", str(tmp_path / "ans"), "--quiet")
        assert r.returncode == 0, r.stderr
    r = _cli("generate-score", "--answers", str(tmp_path / "ans"), "--data", str(out), "--out", str(tmp_path / "rep"),
             "--quiet")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert s["success"] == s["n_cases"] and s["protocol"] == "single-shot"
    with FakeImageServer(out, text_only=True) as srv:  # a model that only talks: every case fails, one line
        r = _cli("generate-answers", "--answerer", "http", "--endpoint", srv.url, "--data", str(out), "--out",
                 str(tmp_path / "ans2"), "--quiet")
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0
    assert "no image" in r.stderr and "failed" in r.stderr
    r = _cli("generate-answers", "--answerer", "http", "--endpoint", "http://127.0.0.1:9/v1", "--protocol", "both",
             "--data", str(out), "--out", str(tmp_path / "ans3"))
    assert r.returncode == 2 and "--protocol" in r.stderr
