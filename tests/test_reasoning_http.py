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

from eval.reasoning import answerers as A
from eval.reasoning import build as B
from eval.reasoning import prompts
from eval.reasoning.report import RunStopped, run_items, summarize
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

    def __init__(self, items, fail=(), garble=(), fault=None):
        self.by_prompt = {it["prompt"]: it for it in items}
        # the official style's text with its images taken out: what the request's text parts add up to
        self.by_official = {re.sub(r"<image \d+>", "", prompts.official_text(it)): it for it in items}
        self.fail, self.garble, self.fault = set(fail), set(garble), fault
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

            def _reply(self, model, text):
                self._json(200, {"id": "x", "object": "chat.completion", "model": f"served/{model}",
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                              "finish_reason": "stop"}],
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
        r = subprocess.run([sys.executable, "-m", "eval.reasoning", "run", "--answerer", "http", "--endpoint", srv.url,
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
        r = subprocess.run([sys.executable, "-m", "eval.reasoning", "run", "--answerer", "http", "--endpoint", srv.url,
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
    r = subprocess.run([sys.executable, "-m", "eval.reasoning", "run", "--answerer", "http", "--endpoint",
                        f"http://127.0.0.1:{port}/v1", "--data", str(data), "--out", str(tmp_path / "rep"), "--quiet"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert r.stderr.strip().count("\n") == 0 and "failed" in r.stderr and "Traceback" not in r.stderr
    assert "cannot reach" in r.stderr
    # fewer queries than the stop rule needs: still no report of errors alone, a non-zero exit
    r = subprocess.run([sys.executable, "-m", "eval.reasoning", "run", "--answerer", "http", "--endpoint",
                        f"http://127.0.0.1:{port}/v1", "--data", str(data), "--out", str(tmp_path / "rep1"), "--quiet",
                        "--limit", "1"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "every query failed (1 of 1)" in r.stderr and r.stderr.strip().count("\n") == 0
    assert not (tmp_path / "rep1" / "summary.json").exists()


@pytest.mark.parametrize("args,msg", [
    (["--max-images", "0"], "--max-images"), (["--over-limit", "split"], "--over-limit"),
    (["--max-fail-share", "1.5"], "--max-fail-share"),
])
def test_http_cli_bad_options_are_one_line(data, tmp_path, args, msg):
    r = subprocess.run([sys.executable, "-m", "eval.reasoning", "run", "--answerer", "http", "--endpoint",
                        "http://127.0.0.1:9/v1", "--data", str(data), "--out", str(tmp_path / "rep"), "--quiet", *args],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0
