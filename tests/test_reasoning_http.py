"""A fake OpenAI-compatible multimodal server on loopback answers the reasoning probe end to end
through the HTTP adapter and the CLI."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eval.reasoning import answerers as A
from eval.reasoning import build as B
from eval.reasoning.report import run_items
from tests.conftest import REPO_ROOT


class FakeServer:
    """Answers like a chatty model: the oracle's answer wrapped in free text. Items listed in
    ``fail`` get HTTP 500, items in ``garble`` an unparseable reply."""

    def __init__(self, items, fail=(), garble=()):
        self.by_prompt = {it["prompt"]: it for it in items}
        self.fail, self.garble = set(fail), set(garble)
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body, dict(self.headers)))
                parts = body["messages"][-1]["content"]
                prompt = parts[0]["text"]
                item = outer.by_prompt[prompt]
                n_images = sum(p["type"] == "image_url" for p in parts)
                for p in parts:
                    if p["type"] == "image_url":
                        from PIL import Image

                        url = p["image_url"]["url"]
                        assert url.startswith("data:image/png;base64,")
                        Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).verify()
                if item["id"] in outer.fail:
                    self.send_response(500)
                    self.end_headers()
                    return
                if item["id"] in outer.garble:
                    text = "I cannot tell from these pictures."
                else:
                    ans = A.Oracle().answer(item).split(":", 1)[1].strip()
                    text = (f"I looked at the {n_images} images carefully. Image A is a tricky one...\n\n"
                            f"**Final answer:** {ans}")
                out = json.dumps({"id": "x", "object": "chat.completion", "model": body["model"],
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                               "finish_reason": "stop"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("reasoning")
    B.build(out, seed=4, per_type=1, lite=1, types=("height", "next_step", "ordering", "rotation_status"),
            plan_ks=(2,), plan_per_k=1, progress=False)
    return out


def test_http_adapter_in_process(data):
    items, _ = B.load(data)
    with FakeServer(items, fail=[items[1]["id"]], garble=[items[2]["id"]]) as srv:
        ans = A.HttpAnswerer(srv.url, model="fake-vlm", api_key="k123")
        recs = run_items(items, ans, data, progress=False)
        path, body, headers = srv.requests[0]
    assert path == "/v1/chat/completions" and body["model"] == "fake-vlm"
    assert headers.get("Authorization") == "Bearer k123"
    content = body["messages"][-1]["content"]
    assert sum(p["type"] == "image_url" for p in content) == len(items[0]["images"])
    by_id = {r["id"]: r for r in recs}
    assert by_id[items[1]["id"]]["error"] and not by_id[items[1]["id"]]["correct"]
    assert not by_id[items[2]["id"]]["parsed_ok"] and not by_id[items[2]["id"]]["correct"]
    others = [r for r in recs if r["id"] not in (items[1]["id"], items[2]["id"])]
    assert others and all(r["correct"] for r in others)


def test_http_cli_end_to_end(data, tmp_path):
    items, _ = B.load(data)
    with FakeServer(items) as srv:
        r = subprocess.run([sys.executable, "-m", "eval.reasoning", "run", "--answerer", "http", "--endpoint", srv.url,
                            "--model", "fake", "--data", str(data), "--out", str(tmp_path / "rep"), "--quiet"],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert all(row["accuracy"] == 1.0 for row in s["elementary"].values())
    assert s["planning"]["k2"]["exact"]["rate"] == 1.0
    assert (tmp_path / "rep" / "REPORT.md").is_file() and (tmp_path / "rep" / "planning_curve.png").is_file()
    assert s["latency_ms"]["mean"] > 0


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
