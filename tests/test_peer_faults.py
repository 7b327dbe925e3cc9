"""Peers that lie (#45): eval.serve and the remote client against hostile bytes, on real sockets on loopback.

A peer's bytes become only numbers of the kinds the protocols carry (an object-dtype array used to crash the
server process, and through the client an eval.run worker, with a segfault); a bad message is answered and logged
in one line and drops only its client; the server bounds a message's size, a connection's silence and the number
of connections (the CLI's flags); the client bounds a reply's size and checks what it reads of a server's
metadata and replies. Each fault is one line, never a traceback."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import pytest

from tests.conftest import REPO_ROOT, one_remote_try_fails_in_one_line

pytest.importorskip("websockets")
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect as ws_connect  # noqa: E402
from websockets.sync.server import serve as ws_serve  # noqa: E402

IDLE_S = 2.0
MAX_BYTES = 100_000  # the served CLI's --max-message-bytes: a bc-state request is about 1 KB


def _nd(dtype, shape, data: bytes) -> dict:
    """An openpi (msgpack-numpy) array as a peer may write it, whatever it claims."""
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}


def _state() -> dict:
    """A bc-state scene's task_state (the shapes and dtypes of env.task's; values do not matter here)."""
    f = np.float32
    return {"tcp_p": np.zeros(3, f), "tcp_q": np.array([1, 0, 0, 0], f), "gripper_opening": np.float32(0.04),
            "block_p": np.zeros((3, 3), f), "block_q": np.tile(np.array([1, 0, 0, 0], f), (3, 1)),
            "hole_xy": np.zeros((3, 2)), "hole_yaw": np.zeros(3, f), "board_top_z": np.float32(0.0),
            "active": np.array([True, False, False]), "target": np.array([True, False, False]),
            "is_grasped": np.bool_(False)}


# ------------------------------------------------------------------ the served CLI (one process for the module)
class _Served:
    """``python -m eval.serve --model bc-state`` with small limits; its stderr (the server's log) in a file."""

    def __init__(self, tmp, protocol="openpi"):
        self.log_path = tmp / f"serve-{protocol}.err"
        self.err = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eval.serve", "--model", "bc-state", "--protocol", protocol, "--port", "0",
             "--max-message-bytes", str(MAX_BYTES), "--idle-timeout", str(IDLE_S), "--max-connections", "2"],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=self.err, text=True)
        line = self.proc.stdout.readline()
        assert "serving bc-state" in line, self.log()
        self.url = line.split(" on ")[1].split()[0]

    def log(self) -> str:
        self.err.flush()
        return self.log_path.read_text()

    def wait_log(self, needle: str, timeout: float = 5.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = [ln for ln in self.log().splitlines() if needle in ln]
            if lines:
                return lines
            time.sleep(0.05)
        raise AssertionError(f"no {needle!r} in the server's log:\n{self.log()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self):
        self.proc.kill()
        self.proc.wait(10)
        self.err.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = _Served(tmp_path_factory.mktemp("serve"))
    yield s
    s.close()


def _raw(url: str):
    """A bare websocket to the server (its metadata read), bounded as our client bounds it. The previous test's
    connection may not have left the server's count yet (its handler ends just after the close): a refusal
    (1013) is tried again for a few seconds."""
    deadline = time.monotonic() + 5
    while True:
        ws = ws_connect(url, compression=None, max_size=2**20, open_timeout=10).__enter__()
        try:
            return ws, msgpack.unpackb(ws.recv(timeout=10))
        except ConnectionClosed as e:
            if not (e.rcvd and e.rcvd.code == 1013 and time.monotonic() < deadline):
                raise
            time.sleep(0.1)


def _answer_and_close(ws) -> tuple[str, int | None, str]:
    """(the server's text answer, the close code, the close reason) after a bad message."""
    answer = ws.recv(timeout=10)
    with pytest.raises(ConnectionClosed) as e:
        ws.recv(timeout=10)
    return answer, e.value.rcvd.code if e.value.rcvd else None, e.value.rcvd.reason if e.value.rcvd else ""


def _still_serves(url: str) -> None:
    """A well-behaved client gets its action (the server process and its other clients are untouched)."""
    from eval.remote.client import RemotePolicy, ServerUnreachable

    deadline = time.monotonic() + 5
    while True:
        try:
            policy = RemotePolicy(url, "openpi", "bc-state")
            break
        except ServerUnreachable as e:  # as _raw: a connection just closed may still count
            if "server full" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    try:
        policy.reset("insert the square", seed=3)
        action = policy.query({"state": _state()})
        assert action.shape == (7,) and np.all(np.isfinite(action))
    finally:
        policy.close()


BAD_ARRAYS = {  # an array a peer may claim -> what the one line names
    "object dtype": (_nd("|O", [8], b"\x01" * 64), "dtype '|O' is not a number type"),
    "object scalar": ({b"__npgeneric__": True, b"data": 1, b"dtype": "|O"}, "dtype '|O' is not a number type"),
    "void": (_nd("V8", [1], b"\0" * 8), "dtype '|V8' is not a number type"),
    "str": (_nd("<U2", [1], b"\0" * 8), "dtype '<U2' is not a number type"),
    "structured": (_nd("f4,f4", [1], b"\0" * 8), "is not a number type"),
    "sub-array": (_nd("(2,)f4", [1], b"\0" * 8), "is not a number type"),
    "datetime": (_nd("<M8[s]", [1], b"\0" * 8), "dtype '<M8[s]' is not a number type"),
    "complex": (_nd("<c8", [1], b"\0" * 8), "dtype '<c8' is not a number type"),
    "not a dtype": (_nd("pickle", [1], b"\0" * 8), "'pickle' is not a numpy dtype"),
    "huge shape, few bytes": (_nd("<f4", [2**40, 2**40], b"\0" * 16), "needs 4835703278458516698824704 bytes, the "
                                                                      "message holds 16"),
    "bytes short": (_nd("<f4", [3], b"\0" * 11), "needs 12 bytes, the message holds 11"),
    "negative dim": (_nd("<f4", [-1], b""), "non-negative ints"),
    "bool dim": (_nd("<f4", [True], b"\0" * 4), "non-negative ints"),
    "too many dims": (_nd("|u1", [1] * 9, b"\0"), "at most 8"),
    "data a string": (_nd("|u1", [3], "abc"), "array data must be bytes, got str"),
    "no shape": ({b"__ndarray__": True, b"data": b"", b"dtype": "<f4"}, "an __ndarray__ without shape"),
    "scalar string": ({b"__npgeneric__": True, b"data": "1e5", b"dtype": "<f4"}, "must be a number, got str"),
    "scalar overflow": ({b"__npgeneric__": True, b"data": 300, b"dtype": "|u1"}, "does not fit |u1"),
}


# ------------------------------------------------------------------ 1. a peer's arrays: numbers only
def test_a_bad_array_is_one_line_and_drops_only_its_client_the_served_process_lives(served):
    """Each array a lying client may claim (an object dtype used to segfault the process, dropping every client):
    answered in one line (a text frame, as openpi's servers answer errors), the client closed with 1008 and the
    reason, one line of the server's log each; a client connected all along, and a new one, are still served."""
    bystander, _ = _raw(served.url)
    for name, (array, needle) in BAD_ARRAYS.items():
        ws, _ = _raw(served.url)
        ws.send(msgpack.packb({"scene": 0, "episode": 1, "seed": 0, "state": {"tcp_p": array}}))
        answer, code, reason = _answer_and_close(ws)
        assert answer.startswith("ProtocolError: a malformed openpi message") and needle in answer, (name, answer)
        assert "\n" not in answer and code == 1008 and reason.startswith("bad message: ProtocolError"), (name, reason)
        assert served.alive(), name
    bystander.send(msgpack.packb({"prepare": 1}))
    assert msgpack.unpackb(bystander.recv(timeout=10))["prepared"] == 1
    bystander.close()
    _still_serves(served.url)
    log = served.log()
    assert len([ln for ln in log.splitlines() if "dropped: bad message" in ln]) >= len(BAD_ARRAYS)
    assert "Traceback" not in log and all(ln.startswith("eval.serve: client 127.0.0.1:") for ln in log.splitlines())


def test_the_vla_eval_server_refuses_a_bad_array_in_one_error_message_and_drops_only_that_client():
    from eval.request import make_policy
    from eval.remote import wire
    from eval.serve import Server, ServedModel

    lines = []
    server = Server(ServedModel(make_policy("bc-state"), "bc-state"), "vla-eval", log=lines.append)
    try:
        with ws_connect(server.url, compression=None, max_size=2**20) as ws:
            ws.send(wire.vla_pack("hello", wire.hello_payload(), 1))
            assert wire.vla_unpack(ws.recv(timeout=10))["type"] == "hello"
            ws.send(msgpack.packb({"type": "observation", "seq": 2, "timestamp": 0.0, "payload": {"state": {
                "tcp_p": {"__ndarray__": True, "data": b"\x01" * 8, "dtype": "|O", "shape": [1]}}}}))
            error = wire.vla_unpack(ws.recv(timeout=10))
            assert error["type"] == "error" and error["seq"] == 0  # the message did not decode: no seq
            assert error["payload"]["error"].startswith("observation_failed: ProtocolError: a malformed vla-eval "
                                                        "message") and "dtype '|O'" in error["payload"]["error"]
            with pytest.raises(ConnectionClosed) as e:
                ws.recv(timeout=10)
            assert e.value.rcvd.code == 1008
        from eval.remote.client import RemotePolicy

        policy = RemotePolicy(server.url, "vla-eval", "bc-state")
        policy.reset("x", seed=1)
        assert policy.query({"state": _state()}).shape == (7,)
        policy.close()
    finally:
        server.close()
    assert len(lines) == 1 and "dropped: bad message: ProtocolError" in lines[0] and "'|O'" in lines[0], lines


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares width x height RGB pixels and holds a few bytes (a decompression bomb's header)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def test_the_vla_eval_servers_encoded_images_are_checked_before_they_are_decoded():
    """vla-eval's image codec decodes a raw image with np.frombuffer of any dtype (an object one crashes) and a
    PNG of any declared size: both are checked first, one line each, and drop only their client."""
    pytest.importorskip("PIL")
    from eval.request import make_policy
    from eval.remote import wire
    from eval.serve import Server, ServedModel

    lines = []
    server = Server(ServedModel(make_policy("bc-state"), "bc-state"), "vla-eval", log=lines.append)
    bad = {
        "raw object": ({"__image__": True, "format": "raw", "data": b"\x01" * 8, "dtype": "|O", "shape": [1, 1, 1]},
                       "dtype '|O' is not a number type"),
        "PNG 5000x5000": ({"__image__": True, "format": "png", "data": _png_header(5000, 5000), "shape": [1, 1, 3]},
                          "an encoded image of 5000x5000 pixels (at most 4096 a side)"),
        "PNG bomb": ({"__image__": True, "format": "png", "data": _png_header(100000, 100000), "shape": [1, 1, 3]},
                     "does not decode: Image size (10000000000 pixels) exceeds limit"),
        "not a PNG": ({"__image__": True, "format": "png", "data": b"GIF89a", "shape": [1, 1, 3]}, "does not decode"),
        "format bmp": ({"__image__": True, "format": "bmp", "data": b"", "shape": [1, 1, 3]}, "raw, png or jpeg"),
    }
    try:
        for name, (image, needle) in bad.items():
            with ws_connect(server.url, compression=None, max_size=2**20) as ws:
                ws.send(msgpack.packb({"type": "observation", "seq": 1, "timestamp": 0.0,
                                       "payload": {"images": {"third_person": image}}}))
                error = wire.vla_unpack(ws.recv(timeout=10))["payload"]["error"]
                assert needle in error and "\n" not in error, (name, error)
                with pytest.raises(ConnectionClosed):
                    ws.recv(timeout=10)
    finally:
        server.close()
    assert len(lines) == len(bad) and all("dropped: bad message" in ln for ln in lines), lines


# ------------------------------------------------------------------ the client against a lying server
class _WsServer:
    """A websocket server on loopback running ``handler(conn)``: a peer that lies."""

    def __init__(self, handler):
        self.ws = ws_serve(handler, "127.0.0.1", 0, compression=None, max_size=None, ping_interval=None)
        self.url = f"ws://127.0.0.1:{self.ws.socket.getsockname()[1]}"
        threading.Thread(target=self.ws.serve_forever, daemon=True).start()

    def close(self):
        self.ws.shutdown()


class _LyingServer(_WsServer):
    """openpi's shape of talk: ``meta`` (bytes) first, then every message answered with ``reply(message)``."""

    def __init__(self, meta: bytes | None, reply=lambda m: None):
        def handler(conn):
            if meta is not None:
                conn.send(meta)
            for message in conn:
                out = reply(message)
                if out is not None:
                    conn.send(out)

        super().__init__(handler)


NATIVE_META = {"server": "eval.serve", "model": "bc-state", "protocol": "openpi", "backend": "ort",
               "observes": "state", "track": "adapted"}
OBJECT_ACTIONS = msgpack.packb({"actions": _nd("|O", [7], b"\x01" * 56), "queued": []})


@pytest.mark.sim  # builds the try's scene (A01, state only)
def test_eval_run_against_a_server_answering_object_arrays_stops_in_one_line_not_a_segfault(tmp_path):
    """The real command line: the worker used to die with -11 reading the reply; now the try fails in one line
    naming the server and the dtype (exit 1, the runner's code for a try that raised)."""
    server = _LyingServer(msgpack.packb(NATIVE_META), lambda m: OBJECT_ACTIONS)
    try:
        error = one_remote_try_fails_in_one_line(server.url, "bc-state", tmp_path / "r")
    finally:
        server.close()
    assert f"a malformed reply from {server.url}" in error and "dtype '|O' is not a number type" in error


def test_the_client_refuses_lying_metadata_replies_and_timings_in_one_line():
    from eval.remote.client import MalformedReply, RemotePolicy, ServerUnreachable

    for meta, needle in [
        ({**NATIVE_META, "backend": _nd("|O", [1], b"\x01" * 8)}, "dtype '|O'"),  # in the handshake
        ({**NATIVE_META, "reads": {"window": 2, "exec_horizon": 0}}, "whose 'reads' is not"),  # divides by it
        ({**NATIVE_META, "backend": b"ort"}, "whose 'backend' is not a string"),  # bytes: a record's JSON fails
        ({**NATIVE_META, "note": "x" * 5000}, "whose 'note' is not a string of at most 400"),
        ({**NATIVE_META, "max_message_bytes": -1}, "whose 'max_message_bytes' is not a positive int"),
    ]:
        server = _LyingServer(msgpack.packb(meta))
        try:
            with pytest.raises(ServerUnreachable, match=f"the model server at {server.url} ") as e:
                RemotePolicy(server.url, "openpi", "bc-state")
            assert needle in str(e.value) and "\n" not in str(e.value)
        finally:
            server.close()
    state = {"state": _state()}
    for reply, needle in [
        (OBJECT_ACTIONS, "dtype '|O' is not a number type"),  # what crashed a worker (eval.run's test: sim)
        ({"actions": np.zeros((1, 7), np.float32), "queued": [np.zeros((2, 7), np.float32)],
          "server_timing": {"infer_ms": float("nan")}}, "'server_timing.infer_ms' must be a finite number"),
        ({"actions": np.zeros((1, 7), np.float32), "queued": [np.zeros(5, np.float32)]}, "key 'queued' must hold"),
        ({"actions": np.zeros((1, 7), np.float32), "queued": ["abc"]}, "key 'queued' must hold"),
        ({"actions": np.zeros((1, 7), np.float32), "queued": [np.full((1, 7), np.inf, np.float32)]}, "non-finite"),
    ]:
        from eval.remote import wire

        packed = reply if isinstance(reply, bytes) else wire.openpi_pack(reply)
        server = _LyingServer(msgpack.packb(NATIVE_META), lambda m, r=packed: r)
        try:
            policy = RemotePolicy(server.url, "openpi", "bc-state")
            policy.reset("x", seed=4)
            with pytest.raises(MalformedReply, match=f"(the|a malformed) reply from {server.url}") as e:
                policy.query(state)
            assert needle in str(e.value) and "\n" not in str(e.value)
            policy.close()
        finally:
            server.close()


def test_a_reply_over_the_clients_limit_is_refused_in_one_line():
    """websockets' max_size on the client: a 5 MiB reply is refused from its header (close 1009), a failed try
    (MalformedReply, not retried as a dropped connection would be); the HTTP link reads no more than the limit."""
    from eval.remote.client import MAX_REPLY_BYTES, MalformedReply, RemotePolicy, ServerUnreachable, connect

    huge = msgpack.packb({"actions": _nd("|u1", [MAX_REPLY_BYTES + 1], b"\0" * (MAX_REPLY_BYTES + 1))})
    server = _LyingServer(msgpack.packb(NATIVE_META), lambda m: huge)
    try:
        policy = RemotePolicy(server.url, "openpi", "bc-state")
        policy.reset("x", seed=1)
        with pytest.raises(MalformedReply, match=f"a reply from the model server at {server.url} is over "
                                                 f"{MAX_REPLY_BYTES} bytes"):
            policy.query({"state": _state()})
    finally:
        server.close()

    class Big(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Length", str(64 * 2**20))
            self.end_headers()
            with contextlib.suppress(OSError):
                for _ in range(64):
                    self.wfile.write(b" " * 2**20)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Big)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ServerUnreachable, match=f"over {MAX_REPLY_BYTES} bytes"):
            connect(f"http://127.0.0.1:{httpd.server_address[1]}", "openvla-http")
    finally:
        httpd.shutdown()


def test_a_vla_eval_server_that_never_sends_the_action_times_out_in_one_line():
    """Messages other than the action (here: hello after hello) do not extend the reply's time limit."""
    from eval.remote import wire
    from eval.remote.client import Link, ServerError

    def handler(conn):
        for message in conn:
            msg = wire.vla_unpack(message)
            if msg["type"] == "hello":
                conn.send(wire.vla_pack("hello", wire.hello_payload(), msg["seq"]))
                continue
            for _ in range(40):  # a message every 50 ms, never the action
                time.sleep(0.05)
                try:
                    conn.send(wire.vla_pack("hello", {}, 0))
                except ConnectionClosed:
                    return

    chatty = _WsServer(handler)
    try:
        link = Link(chatty.url, "vla-eval", timeout_s=0.5)
        t0 = time.monotonic()
        with pytest.raises(ServerError, match=f"no reply from the model server at {chatty.url} within 0.5 s$"):
            link.call({"state": {}})
        assert time.monotonic() - t0 < 1.5
        link.close()
    finally:
        chatty.close()


# ------------------------------------------------------------------ 2. the server's limits (the CLI's flags)
def test_a_message_over_max_message_bytes_is_refused_and_the_client_says_which_flag(served):
    from eval.remote.client import Link, ServerRefused

    ws, meta = _raw(served.url)
    assert meta["max_message_bytes"] == MAX_BYTES  # the client checks against it before sending
    ws.send(msgpack.packb({"pad": b"\0" * (MAX_BYTES + 1)}))
    with pytest.raises(ConnectionClosed) as e:
        ws.recv(timeout=10)
    assert e.value.rcvd.code == 1009
    (line,) = served.wait_log(f"over {MAX_BYTES} bytes")
    assert line.endswith(f"dropped: a message over {MAX_BYTES} bytes (--max-message-bytes)")
    link = Link(served.url, "openpi")
    try:
        with pytest.raises(ServerRefused, match=f"over the limit of the model server at {served.url} "
                                                f"\\({MAX_BYTES} bytes\\): restart it with --max-message-bytes"):
            link.call({"pad": b"\0" * MAX_BYTES})
    finally:
        link.close()
    assert served.alive()


def test_a_silent_connection_is_closed_after_the_idle_timeout(served):
    ws, _ = _raw(served.url)
    t0 = time.monotonic()
    with pytest.raises(ConnectionClosed) as e:
        ws.recv(timeout=IDLE_S + 5)
    assert IDLE_S - 0.2 <= time.monotonic() - t0 <= IDLE_S + 3
    assert e.value.rcvd.code == 1001 and e.value.rcvd.reason == f"idle for {IDLE_S:g} s (--idle-timeout)"
    served.wait_log(f"sent nothing for {IDLE_S:g} s (--idle-timeout)")
    # a message trickled in slower than that is idle too (recv's timeout covers the whole message)
    sock = socket.create_connection(("127.0.0.1", int(served.url.rsplit(":", 1)[1])))
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    sock.settimeout(IDLE_S + 5)
    assert sock.recv(4096).startswith(b"HTTP/1.1 101")
    sock.sendall(b"\x82\xfe\x01\x00" + b"\0\0\0\0" + b"\0" * 10)  # a masked 256-byte frame, 10 bytes of it
    t0 = time.monotonic()
    data = b""
    while b"(--idle-timeout)" not in data:  # the close frame (the server then waits for an echo that never comes)
        chunk = sock.recv(4096)
        assert chunk, data
        data += chunk
    assert IDLE_S - 0.2 <= time.monotonic() - t0 <= IDLE_S + 3
    sock.close()


def test_a_client_closed_for_idling_is_told_why_and_may_connect_again(served):
    """Our client after the server closed it for idling: the reason in its line, a ServerClosed (a dropped
    connection: the runner runs the try once more on a new one)."""
    from eval.remote.client import RemotePolicy, ServerClosed

    policy = RemotePolicy(served.url, "openpi", "bc-state")
    policy.reset("x", seed=2)
    time.sleep(IDLE_S + 0.5)
    with pytest.raises(ServerClosed, match=f"the model server at {served.url} closed the connection \\(1001: idle "
                                           f"for {IDLE_S:g} s \\(--idle-timeout\\)\\)$"):
        policy.query({"state": _state()})
    policy.close()
    _still_serves(served.url)


def test_one_client_over_max_connections_is_refused_with_the_reason(served):
    from eval.remote.client import ServerUnreachable

    first, _ = _raw(served.url)
    second, _ = _raw(served.url)
    try:
        with pytest.raises(ServerUnreachable) as e:
            from eval.remote.client import check_server

            check_server(served.url, "openpi", "bc-state")
        assert str(e.value) == (f"the model server at {served.url} closed the connection (1013: server full: 2 "
                                "connections (--max-connections); try again later)")
        served.wait_log("refused: 2 connections already (--max-connections)")
    finally:
        first.close()
        second.close()
    time.sleep(0.2)  # the server's handler threads see the closes
    _still_serves(served.url)


def test_a_client_gone_without_a_close_frame_is_one_log_line(served):
    ws, _ = _raw(served.url)
    before = served.log().count("without a close frame")
    ws.socket.shutdown(socket.SHUT_RDWR)  # the TCP connection ends, no close frame
    ws.socket.close()
    deadline = time.monotonic() + 5
    while served.log().count("without a close frame") == before and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    log = served.log()
    assert log.count("without a close frame") == before + 1 and "Traceback" not in log, log


@pytest.mark.parametrize("argv, needle", [
    (["--max-message-bytes", "10"], "--max-message-bytes must be an int of at least 65536"),
    (["--idle-timeout", "nan"], "--idle-timeout must be a positive number of seconds, got nan"),
    (["--idle-timeout", "0"], "--idle-timeout must be a positive number of seconds, got 0.0"),
    (["--max-connections", "0"], "--max-connections must be at least 1, got 0"),
])
def test_eval_serve_refuses_a_limit_that_is_not_one_in_one_line(argv, needle):
    r = subprocess.run([sys.executable, "-m", "eval.serve", "--model", "bc-state", "--port", "0", *argv],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: {needle}"), r.stderr


# ------------------------------------------------------------------ 3. the sweep: more lies, each one line
SWEEP = {  # what a client sends the served bc-state -> what the answer names
    "truncated msgpack": (msgpack.packb({"state": {"tcp_p": [1.0, 2.0]}})[:-3], "not an openpi msgpack message"),
    "trailing bytes": (msgpack.packb({"prepare": 1}) + b"\x00", "not an openpi msgpack message"),
    "nested too deeply": (b"\x91" * 5_000 + b"\xc0", "nested too deeply"),
    "an extension type": (msgpack.packb({"x": msgpack.ExtType(5, b"\0")}), "extension type (5)"),
    "not a map": (msgpack.packb([1, 2, 3]), "a request must be a map, got list"),
    "prepare a huge batch": (msgpack.packb({"prepare": 10**9}), "'prepare' must be an int in 1..1024"),
    "prepare a string": (msgpack.packb({"prepare": "4"}), "'prepare' must be an int in 1..1024"),
    "scene a string": (msgpack.packb({"scene": "0", "state": {}}), "'scene' must be an int"),
    "seed a float": (msgpack.packb({"episode": 1, "seed": 1.5, "state": {}}), "'seed' must be an int"),
    "prompt a list": (msgpack.packb({"episode": 1, "prompt": [1], "state": {}}), "must be a string, got list"),
    "state a list": (msgpack.packb({"episode": 1, "state": [1, 2]}), "needs 'state', a map of arrays"),
    "state NaN": (msgpack.packb({"episode": 1, "state": {"tcp_p": [float("nan"), 0.0, 0.0]}}), "holds NaN or inf"),
    "state inf": (msgpack.packb({"episode": 1, "state": {"tcp_p": [float("inf"), 0.0, 0.0]}}), "holds NaN or inf"),
    "state strings": (msgpack.packb({"episode": 1, "state": {"tcp_p": ["a", "b"]}}), "must be at most 4096 numbers"),
    "batch empty": (msgpack.packb({"batch": []}), "'batch' must be a list of 1..1024"),
    "a vla-eval hello": (msgpack.packb({"type": "hello", "payload": {}, "seq": 1, "timestamp": 0.0}),
                         "needs 'state'"),
}


def test_sweep_of_lying_requests_each_one_line_and_the_server_lives(served):
    for name, (message, needle) in SWEEP.items():
        ws, _ = _raw(served.url)
        ws.send(message)
        answer, code, _ = _answer_and_close(ws)
        assert needle in answer and "\n" not in answer and code == 1008, (name, answer)
    ws, _ = _raw(served.url)
    ws.send("a text frame")
    answer, code, _ = _answer_and_close(ws)
    assert "a text frame where an openpi msgpack message was expected" in answer and code == 1008
    assert served.alive() and "Traceback" not in served.log()
    _still_serves(served.url)


def test_many_new_scenes_on_one_connection_are_bounded():
    """Each new scene id holds a policy copy: a connection's scenes are capped (MAX_SCENES), in one line."""
    from eval.request import make_policy
    from eval.serve import MAX_SCENES, Server, ServedModel

    lines = []
    server = Server(ServedModel(make_policy("bc-state"), "bc-state"), "openpi", log=lines.append)
    try:
        with ws_connect(server.url, compression=None, max_size=2**20) as ws:
            ws.recv(timeout=10)
            for scene in range(MAX_SCENES + 1):
                ws.send(msgpack.packb({"scene": scene, "episode": 1, "state": {}}))  # KeyError: answered, kept
                answer = ws.recv(timeout=10)
            assert answer.startswith(f"ProtocolError: a connection serves at most {MAX_SCENES} scenes")
    finally:
        server.close()
    assert len(lines) == 1 and "dropped: bad message" in lines[0]


def test_json_nested_too_deeply_is_one_line():
    from eval.remote import wire

    with pytest.raises(wire.ProtocolError, match="nested too deeply"):
        wire.json_numpy_loads(b"[" * 200_000)
    with pytest.raises(wire.ProtocolError, match="is not a number type"):
        wire.json_numpy_loads(json.dumps({"__numpy__": "AAAAAAAAAAA=", "dtype": "|O", "shape": [1]}).encode())
    with pytest.raises(wire.ProtocolError, match="needs 4 bytes, the message holds 8"):
        wire.json_numpy_loads(json.dumps({"__numpy__": "AAAAAAAAAAA=", "dtype": "<f4", "shape": [1]}).encode())


def test_checked_decoders_read_what_the_reference_codecs_write():
    """The checks change nothing for an honest peer: vla-eval's images (raw, PNG, JPEG) decode as its own codec
    decodes them, openpi-client's arrays and scalars as its msgpack_numpy does."""
    from eval.remote import wire

    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (64, 48, 3), dtype=np.uint8)
    codec = pytest.importorskip("vla_eval.protocol.image_codec")
    for fmt in ("raw", "png", "jpeg"):
        encoded = codec.encode_image(img, fmt)
        np.testing.assert_array_equal(wire._decode_image(encoded), codec.decode_image(encoded))
    msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")
    obs = {"image": img, "state": rng.normal(size=8).astype(np.float32), "mask": np.array([True, False]),
           "big_endian": np.arange(3, dtype=">i8"), "scalar": np.float32(1.5), "flag": np.bool_(True), "empty":
           np.zeros((0, 7), np.float32)}
    ours, theirs = wire.openpi_unpack(msgpack_numpy.packb(obs)), msgpack_numpy.unpackb(msgpack_numpy.packb(obs))
    assert set(ours) == set(theirs)
    for k in obs:
        np.testing.assert_array_equal(ours[k], theirs[k])
        assert np.asarray(ours[k]).dtype == np.asarray(theirs[k]).dtype, k
