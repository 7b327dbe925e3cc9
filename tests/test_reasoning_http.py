"""A fake OpenAI-compatible multimodal server on loopback answers the reasoning probe end to end
through the HTTP adapter and the CLI, and misbehaves the ways real servers do: 429 then success,
5xx, a slow server, a 1-image limit (vLLM's default), a dropped connection."""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from assembly_probe import answerers as A
from assembly_probe import build as B
from assembly_probe import prompts
from assembly_probe.report import RunStopped, run_items, summarize
from tests.conftest import REPO_ROOT

NO_WAIT = dict(sleep=lambda s: None)  # retries without real waits: the waits asked for are still recorded


class Loopback:
    """A test's HTTP server on 127.0.0.1 (a free port), served from a thread while the ``with`` block runs."""

    def _serve(self, handler):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeServer(Loopback):
    """Answers like a chatty model: the oracle's answer wrapped in free text, with ``usage`` and
    ``finish_reason``. Items listed in ``fail`` get HTTP 500, items in ``garble`` an unparseable reply.
    ``fault(item, n_images, attempt)`` may return ``("status", code, headers, json_body)``,
    ``("drop",)`` (close the connection unanswered) or ``("sleep", seconds)`` (then answer) for a
    request; ``attempt`` counts the requests for that item from 1. A request whose model is
    ``extractor`` is a text-only extraction request: it is answered with the oracle's answer."""

    def __init__(self, items, fail=(), garble=(), fault=None, cut_off=()):
        self.by_prompt = {it["prompt"]: it for it in items}
        # the official style's text with its images taken out: what the request's text parts add up to (both the
        # direct and the chain-of-thought instruction)
        self.by_official = {re.sub(r"<image \d+>", "", prompts.official_text(it, cot)): it for it in items
                            for cot in (False, True)}
        self.fail, self.garble, self.fault, self.cut_off = set(fail), set(garble), fault, set(cut_off)
        self.requests, self.attempts = [], {}
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _json(self, code, obj, headers=()):
                out = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                for k, v in headers:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(out)

            def _reply(self, model, text, finish="stop"):
                self._json(200, {"id": "x", "object": "chat.completion", "model": f"served/{model}",
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                              "finish_reason": finish}],
                                 "usage": {"prompt_tokens": 900, "completion_tokens": 40, "total_tokens": 940}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append((self.path, body, dict(self.headers)))
                content = body["messages"][-1]["content"]
                if body["model"] == "extractor":
                    item = next(it for p, it in outer.by_prompt.items() if p in content)
                    return self._reply(body["model"], A.Oracle().answer(item))
                text = "".join(p["text"] for p in content if p["type"] == "text")
                item = outer.by_prompt.get(content[0]["text"]) or outer.by_official.get(text) or next(
                    it for t, it in outer.by_official.items() if prompts.official_text(it) in text)  # tiled
                with outer.lock:
                    attempt = outer.attempts[item["id"]] = outer.attempts.get(item["id"], 0) + 1
                n_images = 0
                for p in content:
                    if p["type"] == "image_url":
                        from PIL import Image

                        url = p["image_url"]["url"]
                        assert url.startswith("data:image/png;base64,")
                        Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).verify()
                        n_images += 1
                act = outer.fault(item, n_images, attempt) if outer.fault else None
                if act and act[0] == "status":
                    return self._json(act[1], act[3], act[2])
                if act and act[0] == "drop":
                    self.close_connection = True
                    return
                if act and act[0] == "sleep":
                    time.sleep(act[1])
                if item["id"] in outer.fail:
                    self.send_response(500)
                    self.end_headers()
                    return
                if item["id"] in outer.cut_off:  # the token limit reached mid-reasoning: no answer yet
                    return self._reply(body["model"], "Let me think step by step. First, image A shows", "length")
                if item["id"] in outer.garble:
                    text = "I cannot tell from these pictures. Maybe A, maybe B."
                else:
                    ans = A.Oracle().answer(item).split(":", 1)[1].strip()
                    text = (f"I looked at the {n_images} images carefully. Image A is a tricky one...\n\n"
                            f"**Final answer:** {ans}")
                self._reply(body["model"], text)

        self._serve(Handler)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("reasoning")
    B.build(out, seed=4, per_type=1, lite=1, types=("height", "next_step", "ordering", "rotation_status"),
            plan_ks=(2,), plan_per_k=1, progress=False)
    return out


@pytest.fixture(scope="module")
def items(data):
    return B.load(data)[0]


def _by_id(recs):
    return {r["id"]: r for r in recs}


def test_http_adapter_in_process(data, items):
    with FakeServer(items, fail=[items[1]["id"]], garble=[items[2]["id"]]) as srv:
        ans = A.HttpAnswerer(srv.url, model="fake-vlm", api_key="k123", **NO_WAIT)
        recs = run_items(items, ans, data, progress=False, max_fail_share=0.5)
        path, body, headers = srv.requests[0]
    assert path == "/v1/chat/completions" and body["model"] == "fake-vlm"
    assert headers.get("Authorization") == "Bearer k123"
    content = body["messages"][-1]["content"]
    assert sum(p["type"] == "image_url" for p in content) == len(items[0]["images"])
    by_id = _by_id(recs)
    failed = by_id[items[1]["id"]]
    assert failed["error"].startswith("HTTP 500") and not failed["correct"]
    assert failed["attempts"] == 5 and failed["status"] == 500  # 4 retries, then given up
    assert "gave up after 5 attempts" in failed["error"]
    assert not by_id[items[2]["id"]]["parsed_ok"] and not by_id[items[2]["id"]]["correct"]
    others = [r for r in recs if r["id"] not in (items[1]["id"], items[2]["id"])]
    assert others and all(r["correct"] for r in others)
    ok = others[0]
    assert ok["finish_reason"] == "stop" and ok["prompt_tokens"] == 900 and ok["completion_tokens"] == 40
    assert ok["server_model"] == "served/fake-vlm" and ok["attempts"] == 1


def test_prompt_styles_on_the_wire(data, items):
    """The default request is the official LEGO-Puzzles one (no system message, each image where its
    <image N> stands); --prompt-style legacy sends the system prompt and the labelled images after the text."""
    with FakeServer(items) as srv:
        recs = run_items(items, A.HttpAnswerer(srv.url, **NO_WAIT), data, progress=False)
        legacy = run_items(items, A.HttpAnswerer(srv.url, prompt_style="legacy", **NO_WAIT), data, progress=False)
        bodies = [b for _, b, _ in srv.requests]
    assert all(r["correct"] for r in recs + legacy)
    official, old = bodies[:len(items)], bodies[len(items):]
    for it, body in zip(items, official):
        assert [m["role"] for m in body["messages"]] == ["user"]
        content = body["messages"][0]["content"]
        assert content[0] == {"type": "text", "text": "Question: "} or content[0]["text"].startswith("Question: ")
        assert sum(p["type"] == "image_url" for p in content) == len(it["images"])
        assert "Options:\n" in "".join(p["text"] for p in content if p["type"] == "text")
    for body in old:
        assert body["messages"][0]["role"] == "system" and "Answer:" in body["messages"][0]["content"]
    with pytest.raises(A.AnswererError, match="--prompt-style"):
        A.HttpAnswerer(srv.url, prompt_style="fancy")


def test_latency_leaves_out_the_waits_between_retries(data, items):
    def fault(item, n, attempt):
        return ("status", 429, [("Retry-After", "0.2")], {"error": {"message": "slow down"}}) if attempt == 1 else None

    with FakeServer(items[:1], fault=fault) as srv:
        rec, = run_items(items[:1], A.HttpAnswerer(srv.url, backoff_s=0.2), data, progress=False)
    assert rec["attempts"] == 2 and rec["retry_wait_s"] == pytest.approx(0.2)
    assert rec["wall_ms"] >= 200 and rec["latency_ms"] == pytest.approx(rec["wall_ms"] - 200, abs=1e-6)


def test_429_then_success_is_retried_with_backoff(data, items):
    waits = []

    def fault(item, n, attempt):
        if attempt == 1:
            return ("status", 429, [("Retry-After", "2")], {"error": {"message": "rate limited, slow down"}})
        return None

    with FakeServer(items, fault=fault) as srv:
        ans = A.HttpAnswerer(srv.url, backoff_s=0.5, sleep=waits.append)
        recs = run_items(items, ans, data, progress=False)
    assert all(r["correct"] and r["attempts"] == 2 and r["error"] is None for r in recs)
    assert waits == [2.0] * len(items)  # the server's Retry-After, within the cap
    s = summarize(recs, "http", {})
    assert s["queries"]["retried"] == len(items) and s["queries"]["finish_reasons"] == {"stop": len(items)}


def test_retries_are_bounded_by_count_and_wait_budget(data, items):
    always = lambda item, n, attempt: ("status", 503, [], {"detail": "model is loading"})  # noqa: E731
    with FakeServer(items[:1], fault=always) as srv:
        waits = []
        ans = A.HttpAnswerer(srv.url, retries=3, backoff_s=1.0, sleep=waits.append)
        with pytest.raises(A.QueryError) as e:
            ans.answer(items[0], data)
        assert waits == [1.0, 2.0, 4.0] and e.value.info["attempts"] == 4
        assert "HTTP 503" in str(e.value) and "model is loading" in str(e.value)
        waits.clear()
        ans = A.HttpAnswerer(srv.url, retries=10, backoff_s=1.0, retry_budget_s=5.0, sleep=waits.append)
        with pytest.raises(A.QueryError):
            ans.answer(items[0], data)
        assert waits == [1.0, 2.0]  # the next wait (4 s) would pass the 5 s budget


def test_slow_server_times_out_then_succeeds(data, items):
    slow_once = lambda item, n, attempt: ("sleep", 2.0) if attempt == 1 else None  # noqa: E731
    with FakeServer(items[:2], fault=slow_once) as srv:
        ans = A.HttpAnswerer(srv.url, timeout_s=0.25, **NO_WAIT)
        recs = run_items(items[:2], ans, data, progress=False)
    assert all(r["correct"] and r["attempts"] == 2 for r in recs)
    always_slow = lambda item, n, attempt: ("sleep", 2.0)  # noqa: E731
    with FakeServer(items[:1], fault=always_slow) as srv:
        ans = A.HttpAnswerer(srv.url, timeout_s=0.25, retries=1, **NO_WAIT)
        with pytest.raises(A.QueryError, match="timed out after 0.25 s"):
            ans.answer(items[0], data)


def test_dropped_connection_is_retried(data, items):
    drop_once = lambda item, n, attempt: ("drop",) if attempt == 1 else None  # noqa: E731
    with FakeServer(items, fault=drop_once) as srv:
        recs = run_items(items, A.HttpAnswerer(srv.url, **NO_WAIT), data, progress=False)
    assert all(r["correct"] and r["attempts"] == 2 for r in recs)
    with FakeServer(items[:1], fault=lambda item, n, attempt: ("drop",)) as srv:
        with pytest.raises(A.QueryError, match="connection dropped"):
            A.HttpAnswerer(srv.url, retries=2, **NO_WAIT).answer(items[0], data)


def _one_image_limit(item, n, attempt):  # vLLM with its default --limit-mm-per-prompt
    if n > 1:
        return ("status", 400, [], {"object": "error", "type": "BadRequestError", "code": 400,
                                    "message": f"At most 1 image(s) may be provided in one request. Got {n}."})
    return None


def test_one_image_limit_server_text_and_stop(data, items):
    multi = [it for it in items if len(it["images"]) > 1]
    single = [it for it in items if len(it["images"]) == 1]
    assert multi and single
    with FakeServer(items, fault=_one_image_limit) as srv:
        ans = A.HttpAnswerer(srv.url, **NO_WAIT)
        with pytest.raises(A.QueryError) as e:
            ans.answer(multi[0], data)
        assert "HTTP 400" in str(e.value) and "At most 1 image(s)" in str(e.value)
        assert e.value.info["attempts"] == 1  # a 400 is not retried
        with pytest.raises(RunStopped) as stop:  # most queries fail: the run stops and says why
            run_items(multi + single, ans, data, progress=False, max_fail_share=0.1)
        assert "At most 1 image(s)" in str(stop.value) and "--max-fail-share" in str(stop.value)
        assert len(stop.value.records) == 3
        # refuse: multi-image items are not sent, not counted as failures, and are marked refused
        ans = A.HttpAnswerer(srv.url, max_images=1, **NO_WAIT)
        n_req = len(srv.requests)
        recs = run_items(items, ans, data, progress=False)
        assert len(srv.requests) - n_req == len(single)
        by_id = _by_id(recs)
        assert all(by_id[it["id"]]["refused"] and not by_id[it["id"]]["correct"] for it in multi)
        assert "more than --max-images 1" in by_id[multi[0]["id"]]["error"]
        assert all(by_id[it["id"]]["correct"] for it in single)
        assert summarize(recs, "http", {})["queries"]["refused"] == len(multi)
        # tile: every item goes out as one labelled grid image and is answered
        ans = A.HttpAnswerer(srv.url, max_images=1, over_limit="tile", **NO_WAIT)
        n_req = len(srv.requests)
        recs = run_items(items, ans, data, progress=False)
        sent = srv.requests[n_req:]
    assert all(r["correct"] and r["error"] is None for r in recs)
    assert all(sum(p["type"] == "image_url" for p in body["messages"][-1]["content"]) == 1 for _, body, _ in sent)


def test_tile_images_keeps_every_label():
    from PIL import Image

    pngs = []
    for c in range(7):
        buf = io.BytesIO()
        Image.new("RGB", (32, 32), (30 * c, 0, 0)).save(buf, format="PNG")
        pngs.append(buf.getvalue())
    grids = A.tile_images(pngs, [f"I{c}" for c in range(7)], groups=3, tile=32)
    assert len(grids) <= 3 and [lab for _, labs in grids for lab in labs] == [f"I{c}" for c in range(7)]
    for data, _ in grids:
        Image.open(io.BytesIO(data)).verify()


def test_model_assisted_extraction_is_reported_separately(data, items):
    garbled = [items[0]["id"], items[2]["id"]]
    with FakeServer(items, garble=garbled) as srv:
        ans = A.HttpAnswerer(srv.url, model="vlm", **NO_WAIT)
        recs = run_items(items, ans, data, progress=False, extract_with="extractor")
        ext_reqs = [b for _, b, _ in srv.requests if b["model"] == "extractor"]
    assert len(ext_reqs) == 2 and all(isinstance(b["messages"][-1]["content"], str) for b in ext_reqs)
    by_id = _by_id(recs)
    for i in garbled:
        assert by_id[i]["parsed_by"] == "model" and by_id[i]["correct"] and by_id[i]["extracted_raw"]
    assert all(r["parsed_by"] == "rules" for r in recs if r["id"] not in garbled)
    s = summarize(recs, "http", {})
    assert s["queries"]["extraction"] == {"asked": 2, "parsed": 2, "correct": 2, "failed": 0}
    rows = s["elementary"]
    assert sum(r["parsed_by_model"] for r in rows.values()) + sum(
        r["parsed_by"] == "model" for r in recs if r["type"] == "plan") == 2
    assert any(r["correct_rules_only"] < r["correct"] for r in rows.values())
    with pytest.raises(ValueError, match="http answerer"):
        run_items(items, A.Oracle(), data, progress=False, extract_with="extractor")


def test_http_cli_end_to_end(data, tmp_path, items):
    with FakeServer(items) as srv:
        r = subprocess.run([sys.executable, "-m", "assembly_probe", "run", "--answerer", "http", "--endpoint", srv.url,
                            "--model", "fake", "--data", str(data), "--out", str(tmp_path / "rep"), "--quiet"],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Overall" in r.stdout and "Lite Overall" in r.stdout
    assert "critical n/a" in r.stdout and "critical 0.0%" not in r.stdout  # 1 item a type: no count is enough
    s = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert all(row["accuracy"] == 1.0 for row in s["elementary"].values())
    assert s["answerer_info"]["prompt_style"] == "official" and s["overall"]["elementary"]["types"] == 4
    assert s["planning"]["k2"]["exact"]["rate"] == 1.0
    for f in ("REPORT.md", "planning_curve.png", "accuracy_by_type.png"):
        assert (tmp_path / "rep" / f).is_file(), f
    assert s["latency_ms"]["mean"] > 0
    assert s["answerer_info"]["model"] == "fake" and s["answerer_info"]["endpoint"] == srv.url
    assert s["queries"]["server_models"] == ["served/fake"] and s["queries"]["completion_tokens"]["sum"] == 40 * len(items)
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert "Model `fake` at" in md and "Finish reasons: stop" in md


def test_http_cli_stops_with_the_servers_reason(data, tmp_path, items):
    with FakeServer(items, fault=_one_image_limit) as srv:
        r = subprocess.run([sys.executable, "-m", "assembly_probe", "run", "--answerer", "http", "--endpoint", srv.url,
                            "--data", str(data), "--out", str(tmp_path / "rep"), "--quiet"],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0
    assert "At most 1 image(s)" in r.stderr and "stopped after" in r.stderr
    assert (tmp_path / "rep" / "records.partial.jsonl").is_file()


def test_http_endpoint_down_is_one_line_error(data, tmp_path):
    import socket

    with socket.socket() as sock:  # a port with nobody listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "assembly_probe", "run", "--answerer", "http", "--endpoint",
                        f"http://127.0.0.1:{port}/v1", "--data", str(data), "--out", str(tmp_path / "rep"), "--quiet"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert r.stderr.strip().count("\n") == 0 and "failed" in r.stderr and "Traceback" not in r.stderr
    assert "cannot reach" in r.stderr
    # fewer queries than the stop rule needs: still no report of errors alone, a non-zero exit
    r = subprocess.run([sys.executable, "-m", "assembly_probe", "run", "--answerer", "http", "--endpoint",
                        f"http://127.0.0.1:{port}/v1", "--data", str(data), "--out", str(tmp_path / "rep1"), "--quiet",
                        "--limit", "1"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "every query failed (1 of 1)" in r.stderr and r.stderr.strip().count("\n") == 0
    assert not (tmp_path / "rep1" / "summary.json").exists()


@pytest.mark.parametrize("args,msg", [
    (["--max-images", "0"], "--max-images"), (["--over-limit", "split"], "--over-limit"),
    (["--max-fail-share", "1.5"], "--max-fail-share"),
])
def test_http_cli_bad_options_are_one_line(data, tmp_path, args, msg):
    r = subprocess.run([sys.executable, "-m", "assembly_probe", "run", "--answerer", "http", "--endpoint",
                        "http://127.0.0.1:9/v1", "--data", str(data), "--out", str(tmp_path / "rep"), "--quiet", *args],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0


def test_chain_of_thought_max_tokens_and_cut_off_replies(data, items, tmp_path):
    """--prompt-style official-cot asks to think step by step and answer last; --max-tokens goes into every
    request; a reply the server ends at the token limit (finish_reason length) counts wrong and is counted, per
    type and in all, in the summary, the report and the CLI's output."""
    cut = items[0]
    with FakeServer(items, cut_off=[cut["id"]]) as srv:
        r = subprocess.run([sys.executable, "-m", "assembly_probe", "run", "--answerer", "http", "--endpoint", srv.url,
                            "--prompt-style", "official-cot", "--max-tokens", "2048", "--data", str(data), "--out",
                            str(tmp_path / "rep"), "--quiet"], cwd=REPO_ROOT, capture_output=True, text=True,
                           timeout=300)
        bodies = [b for _, b, _ in srv.requests]
    assert r.returncode == 0, r.stderr
    assert "cut off at the token limit: 1 replies" in r.stdout
    assert all(b["max_tokens"] == 2048 for b in bodies)
    assert all("Think step by step" in "".join(p["text"] for p in b["messages"][0]["content"] if p["type"] == "text")
               for b in bodies)
    s = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert s["cut_off"] == 1 and s["answerer_info"]["max_tokens"] == 2048
    assert s["answerer_info"]["prompt_style"] == "official-cot"
    row = s["elementary"][cut["type"]] if cut["type"] != "plan" else s["planning"][f"k{cut['k']}"]
    assert row["cut_off"] == 1
    recs = [json.loads(x) for x in (tmp_path / "rep" / "records.jsonl").read_text().splitlines()]
    assert [r["correct"] for r in recs if r["id"] == cut["id"]] == [False]
    assert all(r["correct"] for r in recs if r["id"] != cut["id"])
    assert "| cut off |" in (tmp_path / "rep" / "REPORT.md").read_text()
    bad = subprocess.run([sys.executable, "-m", "assembly_probe", "run", "--answerer", "http", "--endpoint",
                          "http://127.0.0.1:9/v1", "--max-tokens", "0", "--data", str(data), "--out",
                          str(tmp_path / "r2"), "--quiet"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--max-tokens" in bad.stderr and bad.stderr.strip().count("\n") == 0


def test_a_set_whose_files_differ_is_refused_before_the_model_is_asked(data, tmp_path, items):
    """Bad input (issue 47): an image of the set edited after the build; the run names that file, exits 2, and the
    model's server receives no request at all."""
    import shutil

    d = tmp_path / "set"
    shutil.copytree(data, d)
    img = sorted((d / "img").glob("*.png"))[-1]
    img.write_bytes(img.read_bytes()[:-8] + b"12345678")
    with FakeServer(items) as srv:
        r = subprocess.run([sys.executable, "-m", "assembly_probe", "run", "--answerer", "http", "--endpoint", srv.url,
                            "--data", str(d), "--out", str(tmp_path / "rep"), "--quiet"], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=300)
        asked = len(srv.requests)
    assert r.returncode == 2 and str(img) in r.stderr and "differs from its sha256" in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert asked == 0 and not (tmp_path / "rep").exists()


def _letter(item):
    """What a person writes for an item: the right option's letter, or the letters in order."""
    ans = item["answer"]
    if isinstance(ans, list):
        return "".join(ans)
    if item["answer_format"] == "yesno":
        return next(lab for lab, txt in item["options"].items() if txt.lower() == ans)
    return ans


def test_human_answer_sheet_is_scored_by_the_same_code(data, tmp_path, items):
    """The human baseline protocol: human-sheet writes a page of the Lite questions (no answers on it) and a blank
    sheet; a filled sheet is scored by run --answerer sheet (one row left empty counts wrong); a sheet of another
    set, an unknown or repeated id are refused in one line naming the file."""
    out = tmp_path / "human"
    r = subprocess.run([sys.executable, "-m", "assembly_probe", "human-sheet", "--data", str(data), "--out", str(out)],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lite = [it for it in items if it["lite"]]
    page = (out / "README.md").read_text()
    assert all(f"(img/{it['id']}.png)" in page for it in lite) and "not comparable" in page
    assert len(list((out / "img").glob("*.png"))) == len(lite)
    sheet = (out / "answers.csv").read_text().splitlines()
    assert sheet[1] == "id,type,format,answer" and len(sheet) == 2 + len(lite)
    filled = sheet[:2] + [line + (_letter(it) if i else "") for i, (line, it) in enumerate(zip(sheet[2:], lite))]
    (out / "answers.csv").write_text("\n".join(filled) + "\n")

    def score(sheet_file, rep):
        return subprocess.run([sys.executable, "-m", "assembly_probe", "run", "--answerer", "sheet", "--sheet",
                               str(sheet_file), "--data", str(data), "--lite", "--out", str(rep), "--quiet"],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)

    r = score(out / "answers.csv", tmp_path / "rep")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert s["answerer"] == "human (answer sheet)" and s["answerer_info"]["unanswered"] == 1
    recs = {x["id"]: x for x in map(json.loads, (tmp_path / "rep" / "records.jsonl").read_text().splitlines())}
    assert not recs[lite[0]["id"]]["correct"] and all(recs[it["id"]]["correct"] for it in lite[1:])
    for name, text, needle in (
            ("other_set.csv", filled[0][:-6] + "abcdef\n" + "\n".join(filled[1:]), "not of this set"),
            ("unknown.csv", "\n".join(filled + ["height-999,height,one letter,A"]), "no item 'height-999'"),
            ("twice.csv", "\n".join(filled + [filled[2]]), "appears twice"),
            ("no_header.csv", "\n".join(filled[1:]), "line 1")):
        (tmp_path / name).write_text(text)
        r = score(tmp_path / name, tmp_path / "r")
        assert r.returncode == 2 and needle in r.stderr and str(tmp_path / name) in r.stderr, (name, r.stderr)
        assert r.stderr.strip().count("\n") == 0
