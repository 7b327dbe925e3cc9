"""Serve a model of this project over the openpi or the vla-eval protocol (``python -m eval.serve``).

    python -m eval.serve --model octo-small --backend jax --protocol openpi --port 8000
    python -m eval.serve --model bc-state --backend ort --protocol vla-eval --port 8001 --token SECRET

The server builds the in-process policy (the model resolved as a run resolves it, :func:`eval.request.resolve_model`,
its runner from the one backend factory) and keeps one copy per scene of each connection (spawned: the engine
is shared), so each scene's history window, chunk queue and noise key per try live here, exactly as in an
in-process run: a client that sends the same observations with the same seeds gets the same actions. Requests:

- a scene observation ``{"scene", "episode", "seed", "prompt", "images" | "state", "proprio"}`` (the scene's
  policy is reset with the prompt and seed whenever its ``episode`` changes; without ``episode``, the
  connection's episode, which a vla-eval ``episode_start`` advances) -> ``{"actions": (7,)}``;
- ``{"batch": [scene observation, ...]}`` (a ``--num-envs N`` client) -> ``{"actions": (n, 7)}`` from one
  engine call for every scene that queries the model this step;
- ``{"prepare": n}``: compile or warm the engine for batch n (untimed at the client, as in-process).

Every reply carries ``server_timing: {"infer_ms": ..., "batch": n}``: the server's own compute time for the
query (preprocessing, engine, postprocessing; not the transport). openpi: the server sends its metadata first
(model, backend, weights sha256, how its policy reads frames); an error is a text frame with the exception's
type and message (openpi's own server sends the traceback). vla-eval: HELLO (with the metadata and, as
vla-eval's servers, ``action_spec`` and ``observation_spec``), EPISODE_START, OBSERVATION -> ACTION (echoing
``seq``), EPISODE_END, ERROR ``{"error": "observation_failed: Type: message"}``. On both: ``GET /healthz``
answers 200 ``OK`` (as openpi's server) and ``GET /health`` 200 ``{"status": "ok"}`` as JSON (as vla-eval's),
without a token.

It binds 127.0.0.1 unless ``--host`` is given; with ``--token`` (or ``$SAB_REMOTE_TOKEN``) a client must present
it (header ``Authorization: Api-Key TOKEN``, or ``?token=TOKEN`` in the URL; compared in constant time), else the
handshake is refused with HTTP 401. An address other than loopback without a token is refused (exit 2, one
line) unless ``--insecure`` says the server is meant to be open. ``scripted`` is not servable: it reads the
simulator.

A client's bytes become only numbers of the kinds the protocols carry (:func:`eval.remote.wire.peer_array`: bool,
int, uint, float; checked shapes and byte counts) and its fields are checked for their types and bounds; a message
that breaks the protocol is answered with the error (a text frame, or vla-eval's ERROR), logged in one line, and
its client is closed (1008): the other clients go on. ``--max-message-bytes`` (a longer message is refused from
its header, 1009), ``--idle-timeout`` (a connection silent that long is closed, 1001) and ``--max-connections``
(one more is closed at once, 1013 with the reason) bound what clients can make the server hold; every client
dropped is one line of the log, never a traceback.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import math
import socket
import sys
import threading
import time
import urllib.parse
from http import HTTPStatus
from typing import Any

import numpy as np

from eval.remote import wire


# what eval.serve's models produce, as vla-eval's DimSpec.to_dict writes it (vla_eval.specs: the tests compare)
SCENE_ACTION_SPEC = {
    "position": {"name": "position", "dims": 3, "format": "delta_xyz", "range": [-1, 1],
                 "description": "x 0.1 m, robot-base frame"},
    "rotation": {"name": "rotation", "dims": 3, "format": "euler_xyz", "range": [-1, 1],
                 "description": "x 0.1 rad, composed Rx(a) Ry(b) Rz(c)"},
    "gripper": {"name": "gripper", "dims": 1, "format": "binary_close_negative", "range": [-1, 1]},
}
IMAGE_SPEC = {"name": "image", "dims": 0, "format": "rgb_hwc_uint8"}
OBSERVATION_SPECS = {
    "cameras": {"third_person": IMAGE_SPEC, "wrist": IMAGE_SPEC,
                "language": {"name": "language", "dims": 0, "format": "language"}},
    "state": {"state": {"name": "state", "dims": 0, "format": "raw", "description": "the scene's task_state()"}},
}


# What a real request holds (eval/remote/client.py RemotePolicy.encode): per camera scene the frames of every step
# of Octo's history window (2) that the query carries, each 256x256x3 + 128x128x3 uint8 (env/task.py
# THIRD_PERSON_SIZE, env/arms.py's wrist camera), so about 480 KiB, plus proprioception and the instruction;
# bc-state's scene is about 40 numbers. The default message limit holds a --num-envs 16 camera batch (7.5 MiB)
# with room to spare; a larger batch needs --max-message-bytes (the client says so before sending).
FRAME_BYTES = 256 * 256 * 3 + 128 * 128 * 3
SCENE_REQUEST_BYTES = 2 * FRAME_BYTES
DEFAULT_MAX_MESSAGE_BYTES = 8 * 2**20
MIN_MESSAGE_BYTES = 64 * 2**10  # below this not even a bc-state batch fits: a typo, not a limit
DEFAULT_IDLE_TIMEOUT_S = 600.0  # as the client's reply timeout: an eval.run worker is silent while it builds scenes
DEFAULT_MAX_CONNECTIONS = 32  # an eval.run worker holds one (--num-envs scenes share it)
MAX_SCENES = 1024  # scenes of one connection (each holds a policy copy) and rows of one batch
MAX_EARLIER = 64  # observations of chunk steps sent with a query (Octo's chunk is 4)
MAX_STATE_NUMBERS = 4096  # numbers of one state entry or proprioception (the largest real one has 12)


def servable() -> list[str]:
    """The models with a runtime of their own (a policy that reads the simulator, scripted, cannot be served)."""
    from eval.request import MODEL_CONFIGS

    return [name for name, cls in MODEL_CONFIGS.items() if cls.family is not None]


class ServedModel:
    """A policy prototype, one engine, and the per-scene copies of every connection."""

    def __init__(self, policy, model: str):
        self.prototype = policy
        self.model = model
        self.lock = threading.Lock()  # one engine call at a time, whatever the connections
        self.limits: dict = {}  # the server's limits a client should know (Server sets them)
        policy.prepare_batch(1)
        if getattr(policy, "observes", "state") == "cameras":
            from env.instructions import all_instructions

            # compiles the query of one scene (Octo), untimed; an instruction every engines folder has embedded
            policy.reset(all_instructions()[0], seed=0)

    def metadata(self, protocol: str) -> dict:
        p = self.prototype
        meta = {"server": "eval.serve", "model": self.model, "protocol": protocol, "backend": p.backend,
                "observes": p.observes, "track": p.track, "weights_sha256": getattr(p, "weights_sha256", None),
                "note": getattr(p, "note", None)}
        if hasattr(p, "exec_horizon"):
            meta["reads"] = {"window": int(p.cfg.window), "exec_horizon": int(p.exec_horizon),
                             "temporal_ensembling": bool(p.temporal_ensembling)}
        return {**{k: v for k, v in meta.items() if v is not None}, **self.limits}


class Session:
    """The scenes of one connection: scene id -> (policy, episode)."""

    def __init__(self, served: ServedModel):
        self.served = served
        self.scenes: dict[int, list] = {}
        self.episode = 0  # the connection's episode (vla-eval episode_start), for requests without one
        self.prompt = ""
        self.seed = 0

    def start_episode(self, payload: dict) -> None:
        task = payload.get("task") if isinstance(payload.get("task"), dict) else {}
        self.episode += 1
        self.prompt = str(payload.get("task_description") or payload.get("instruction") or payload.get("prompt")
                          or task.get("description") or task.get("instruction") or "")
        self.seed = _count(payload.get("seed", task.get("seed", 0)) or 0, "episode 'seed'", 0, 2**63 - 1)

    def handle(self, request: Any) -> dict:
        if not isinstance(request, dict):
            raise wire.ProtocolError(f"a request must be a map, got {type(request).__name__}")
        if "prepare" in request:
            n = _count(request["prepare"], "'prepare'", 1, MAX_SCENES)  # a huge batch would allocate the engine's
            t0 = time.perf_counter()                                    # buffers for it: the server's memory
            with self.served.lock:
                self.served.prototype.prepare_batch(n)
            return {"prepared": n, "server_timing": {"infer_ms": (time.perf_counter() - t0) * 1e3}}
        batched = "batch" in request
        rows = request["batch"] if batched else [request]
        if not isinstance(rows, (list, tuple)) or not 1 <= len(rows) <= MAX_SCENES:
            raise wire.ProtocolError(f"'batch' must be a list of 1..{MAX_SCENES} scene observations")
        from eval.policies.base import query_members

        with self.served.lock:  # compute time from here: another connection's query is not this one's
            t0 = time.perf_counter()
            members, observations = [], []
            for row in rows:
                policy, obs = self._scene(row)
                members.append(policy)
                observations.append(obs)
            actions, _, ran = query_members(members, observations)
            # the actions each scene's policy has queued from its chunk: the client applies them on the next
            # steps without a round trip, and sends those steps' observations with its next query
            chunks = [np.asarray(getattr(m, "_queue", None) or np.zeros((0, actions.shape[1])), np.float32)
                      for m in members]
            ms = (time.perf_counter() - t0) * 1e3
        return {"actions": actions if batched else actions[0], "queued": chunks if batched else chunks[0],
                "server_timing": {"infer_ms": ms, "batch": len(rows), "model_rows": int(sum(ran))}}

    def _scene(self, row: Any):
        if not isinstance(row, dict):
            raise wire.ProtocolError(f"a scene observation must be a map, got {type(row).__name__}")
        scene = _count(row.get("scene", 0), "'scene'", 0, 2**63 - 1)
        episode = row.get("episode")
        if episode is not None and (type(episode) not in (int, str)):
            raise wire.ProtocolError(f"'episode' must be an int or a string, got {type(episode).__name__}")
        prompt = row.get("prompt", row.get("task_description", row.get("instruction")))
        if prompt is not None and not isinstance(prompt, str):
            raise wire.ProtocolError(f"the instruction ('prompt') must be a string, got {type(prompt).__name__}")
        if episode is None:  # a plain client: the connection's episode
            episode, prompt, seed = ("c", self.episode), (prompt if prompt is not None else self.prompt), self.seed
        else:
            seed = _count(row.get("seed", 0), "'seed'", 0, 2**63 - 1)
        entry = self.scenes.get(scene)
        if entry is None:
            if len(self.scenes) >= MAX_SCENES:  # each scene holds a policy copy: a bound on a client's memory
                raise wire.ProtocolError(f"a connection serves at most {MAX_SCENES} scenes; scene {scene} is one more")
            p = self.served.prototype
            entry = self.scenes[scene] = [p.spawn() if p.batchable else p, None]
        if entry[1] != episode:
            entry[0].reset(str(prompt or ""), seed=int(seed))
            entry[1] = episode
        policy = entry[0]
        earlier = row.get("earlier") or []  # observations of the steps the client served from the queued chunk
        if not isinstance(earlier, list) or len(earlier) > MAX_EARLIER:
            raise wire.ProtocolError(f"'earlier' must be a list of at most {MAX_EARLIER} observations")
        for o in earlier:  # as in-process: each such step takes its frames into the history, the action its queue
            if policy.encode(self._observation(policy, o, prompt)) is not None:
                raise wire.ProtocolError(f"scene {scene}: an earlier observation would have queried the model "
                                         "(the client and the server disagree on the chunk)")
            policy.decode(None, -1)
        return policy, self._observation(policy, row, prompt)

    @staticmethod
    def _observation(policy, row: Any, prompt) -> dict:
        if not isinstance(row, dict):
            raise wire.ProtocolError(f"a scene observation must be a map, got {type(row).__name__}")
        if policy.observes == "state":
            if not isinstance(row.get("state"), dict):
                raise wire.ProtocolError("a bc-state observation needs 'state', a map of arrays")
            obs = {"state": {k: _numbers(v, f"state[{k!r}]") for k, v in row["state"].items()}}
        else:
            images = row.get("images")
            if images is not None and not isinstance(images, dict):
                raise wire.ProtocolError(f"'images' must be a map of camera -> frame, got {type(images).__name__}")
            proprio = row.get("proprio")
            obs = {"images": None if images is None else {k: _frame(v, k) for k, v in images.items()},
                   "proprio": None if proprio is None else _numbers(proprio, "'proprio'")}
        obs["instruction"] = prompt
        return obs


def _count(value: Any, what: str, low: int, high: int) -> int:
    """An int field of a peer's request within [low, high] (not a float, a bool, a string), or ProtocolError."""
    if type(value) is not int or not low <= value <= high:
        span = f"in {low}..{high}" if high < 2**32 else "of at least 0 (63 bits)" if low == 0 else f">= {low}"
        raise wire.ProtocolError(f"{what} must be an int {span}, got {wire.one_line(repr(value), 60)}")
    return value


def _numbers(value: Any, what: str) -> np.ndarray:
    """A numeric array of a peer (a state entry, proprioception): numbers only, finite (NaN or inf would reach the
    model and come back as the scene's action), at most MAX_STATE_NUMBERS of them."""
    try:
        array = np.asarray(value)
    except Exception:  # noqa: BLE001 - ragged lists and the like
        raise wire.ProtocolError(f"{what} is not an array of numbers") from None
    if array.dtype.kind not in wire.ALLOWED_KINDS or array.size > MAX_STATE_NUMBERS:
        raise wire.ProtocolError(f"{what} must be at most {MAX_STATE_NUMBERS} numbers, got {array.dtype} of shape "
                                 f"{array.shape}")
    if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
        raise wire.ProtocolError(f"{what} holds NaN or inf")
    return array


def _frame(value: Any, camera: Any) -> np.ndarray | None:
    """A camera frame of a peer: None (not rendered this step) or what the spec declares, rgb_hwc_uint8, of a sane
    size."""
    if value is None:
        return None
    if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.ndim != 3 or value.shape[2] != 3 \
            or not (1 <= value.shape[0] <= wire.MAX_IMAGE_SIDE and 1 <= value.shape[1] <= wire.MAX_IMAGE_SIDE):
        got = f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
        raise wire.ProtocolError(f"image {wire.one_line(repr(camera), 40)} must be uint8 (H, W, 3) with H and W in "
                                 f"1..{wire.MAX_IMAGE_SIDE}, got {got}")
    return value


# ------------------------------------------------------------------ protocol handlers
def _exception(e: Exception) -> str:
    """The exception's type and message, one line (what the client's error line shows)."""
    return wire.one_line(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)


class _Drop(Exception):
    """A client to disconnect: its message broke the protocol (one line: the log's and the close reason's)."""


def _openpi_handler(served: ServedModel, recv):
    def handler(conn) -> None:
        session = Session(served)
        conn.send(wire.openpi_pack(served.metadata("openpi")))
        while True:
            message = recv(conn)
            try:
                reply = session.handle(wire.openpi_unpack(message))
            except wire.ProtocolError as e:  # a message that breaks the protocol: answered, then the client dropped
                conn.send(_exception(e))
                raise _Drop(_exception(e)) from None
            except Exception as e:  # noqa: BLE001 - the model's error, sent as openpi's servers do: a text frame
                conn.send(_exception(e))
                continue
            conn.send(wire.openpi_pack(reply))
    return handler


def _vla_handler(served: ServedModel, recv):
    def handler(conn) -> None:
        session = Session(served)
        while True:
            message = recv(conn)
            seq = 0
            try:
                msg = wire.vla_unpack(message)
                seq = msg["seq"] if type(msg["seq"]) is int else 0  # echoed: a number, whatever the peer sent
                kind, payload = msg["type"], msg["payload"]
                if kind == "hello":
                    conn.send(wire.vla_pack("hello", wire.hello_payload(
                        model_server="eval.serve", capabilities={}, action_spec=SCENE_ACTION_SPEC,
                        observation_spec=OBSERVATION_SPECS[served.prototype.observes],
                        **served.metadata("vla-eval")), seq))
                elif kind == "episode_start":
                    session.start_episode(payload if isinstance(payload, dict) else {})
                elif kind == "observation":
                    conn.send(wire.vla_pack("action", session.handle(payload), seq))
            except wire.ProtocolError as e:  # answered, then the client dropped
                conn.send(wire.vla_pack("error", {"error": f"observation_failed: {_exception(e)}"}, seq))
                raise _Drop(_exception(e)) from None
            except Exception as e:  # noqa: BLE001 - an error message, as vla-eval's servers send
                conn.send(wire.vla_pack("error", {"error": f"observation_failed: {_exception(e)}"}, seq))
    return handler


def _peer(conn) -> str:
    try:
        host, port = conn.remote_address[:2]
        return f"{host}:{port}"
    except Exception:  # noqa: BLE001 - a socket already gone
        return "a client"


def _close_reason(text: str) -> str:
    return wire.one_line(text).encode()[:123].decode(errors="ignore")  # RFC 6455: at most 123 bytes


def _log(line: str) -> None:
    print(f"eval.serve: {line}", file=sys.stderr, flush=True)


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())  # constant time: no timing oracle on the token


def _process_request(token: str | None):
    def process(conn, request):
        parts = urllib.parse.urlsplit(request.path)
        if parts.path == "/healthz":  # openpi's readiness probe
            return conn.respond(HTTPStatus.OK, "OK\n")
        if parts.path == "/health":  # vla-eval's, as JSON
            response = conn.respond(HTTPStatus.OK, '{"status": "ok"}\n')
            del response.headers["Content-Type"]
            response.headers["Content-Type"] = "application/json"
            return response
        if token:
            given = request.headers.get("Authorization", "")
            query = urllib.parse.parse_qs(parts.query).get("token", [""])[-1]
            if not (_same(given, f"Api-Key {token}") | _same(query, token)):  # both compared, whichever is set
                return conn.respond(HTTPStatus.UNAUTHORIZED, "wrong or missing token\n")
        return None
    return process


def check_served_protocol(protocol: str) -> str:
    if protocol not in wire.SERVED_PROTOCOLS:
        raise ValueError(f"eval.serve speaks {' and '.join(wire.SERVED_PROTOCOLS)}, not --protocol {protocol!r}"
                         + (" (openvla-http is openvla-oft's own server, for --model remote)"
                            if protocol == "openvla-http" else ""))
    return protocol


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` binds is this machine's loopback ("" and 0.0.0.0 bind all interfaces)."""
    if not host:
        return False
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def check_exposure(host: str, token: str | None, insecure: bool) -> None:
    """One line when the server would be open to other machines by accident: an address other than loopback
    and no token, unless ``--insecure`` says so on purpose."""
    if token or insecure or is_loopback(host):
        return
    raise ValueError(f"--host {host or repr(host)} is reachable from other machines and no --token (nor "
                     "$SAB_REMOTE_TOKEN) is set: anyone who reaches it could drive the model; pass --token T, "
                     "or --insecure to serve it open on purpose")


class Server:
    """A running server (a thread of its own); ``port`` is the bound port, ``close()`` stops it.

    Limits on what a client may make it hold: a message of at most ``max_message_bytes`` (websockets' ``max_size``:
    a longer one is refused from its frame header, before it is read, with close code 1009); a connection that
    sends nothing for ``idle_timeout_s`` is closed (1001); at most ``max_connections`` at once, one more is closed at
    once with 1013 (try again later) and the flag in its reason. Every client dropped (a bad message, idle, over
    the cap, gone without a close frame) is one line of ``log``."""

    def __init__(self, served: ServedModel, protocol: str, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, insecure: bool = False, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 log=_log):
        from engines.optional import require

        check_exposure(host, token, insecure)  # where the socket is bound: no server open by accident
        check_limits(max_message_bytes, idle_timeout_s, max_connections)
        require("websockets", "remote")
        from websockets.sync.server import serve

        self.max_message_bytes, self.idle_timeout_s, self.max_connections = max_message_bytes, idle_timeout_s, \
            max_connections
        self.log = log
        self._active, self._active_lock = 0, threading.Lock()
        served.limits = {"max_message_bytes": max_message_bytes}  # in the metadata: a client checks before sending
        inner = (_openpi_handler if check_served_protocol(protocol) == "openpi" else _vla_handler)(served, self._recv)
        self.served, self.protocol, self.host = served, protocol, host
        # websockets 17.4 (websockets/sync/server.py serve): max_size is checked on each frame's declared length
        # (protocol.py: PayloadTooBig -> close 1009), so an oversized message is never buffered; max_queue=4 frames
        # (a client has at most a request and an episode_start in flight) bounds what one connection buffers to
        # about 4 messages; open_timeout (10 s) bounds a handshake. The idle timeout and the cap live in the
        # handler: serve() has neither (ping_interval stays None: a client's long engine call is not a dead peer).
        self.ws = serve(lambda conn: self._handle(conn, inner), host, port, process_request=_process_request(token),
                        compression=None, max_size=max_message_bytes, max_queue=4, ping_interval=None)
        self.port = self.ws.socket.getsockname()[1]
        self.url = f"ws://{host}:{self.port}"
        self.thread = threading.Thread(target=self.ws.serve_forever, daemon=True)
        self.thread.start()

    def _recv(self, conn):
        """The client's next message; TimeoutError after ``idle_timeout_s`` of silence (recv's timeout covers the
        whole message: a client trickling a message in is idle too)."""
        return conn.recv(timeout=self.idle_timeout_s)

    def _handle(self, conn, inner) -> None:
        from websockets.exceptions import ConnectionClosed, ConnectionClosedOK

        peer = _peer(conn)
        with self._active_lock:
            full = self._active >= self.max_connections
            if not full:
                self._active += 1
        if full:  # refused after the handshake: a close reason the client shows (an HTTP 503 body it would not)
            self.log(f"client {peer} refused: {self.max_connections} connections already (--max-connections)")
            conn.close(1013, f"server full: {self.max_connections} connections (--max-connections); try again later")
            return
        try:
            inner(conn)
        except ConnectionClosedOK:
            pass  # the client closed: not a drop
        except ConnectionClosed as e:
            sent = e.sent.code if e.sent is not None else None
            if sent == 1009:  # websockets refused a message over max_size
                self.log(f"client {peer} dropped: a message over {self.max_message_bytes} bytes "
                         "(--max-message-bytes)")
            else:
                self.log(f"client {peer} dropped: the connection closed without a close frame"
                         if e.rcvd is None else f"client {peer} dropped: closed with {e.rcvd.code} {e.rcvd.reason}")
        except TimeoutError:
            self.log(f"client {peer} dropped: sent nothing for {self.idle_timeout_s:g} s (--idle-timeout)")
            conn.close(1001, f"idle for {self.idle_timeout_s:g} s (--idle-timeout)")
        except _Drop as e:
            self.log(f"client {peer} dropped: bad message: {e}")
            conn.close(1008, _close_reason(f"bad message: {e}"))
        except Exception as e:  # noqa: BLE001 - anything else of one client: one line, never the server
            self.log(f"client {peer} dropped: {_exception(e)}")
            conn.close(1011, "internal error")
        finally:
            with self._active_lock:
                self._active -= 1

    def close(self) -> None:
        self.ws.shutdown()
        self.thread.join(timeout=5)


def check_limits(max_message_bytes: Any, idle_timeout_s: Any, max_connections: Any) -> None:
    """One line for a limit that is not one: each must be a positive, finite number."""
    if type(max_message_bytes) is not int or max_message_bytes < MIN_MESSAGE_BYTES:
        raise ValueError(f"--max-message-bytes must be an int of at least {MIN_MESSAGE_BYTES} (a camera scene's "
                         f"request is about {SCENE_REQUEST_BYTES}), got {max_message_bytes!r}")
    if not isinstance(idle_timeout_s, (int, float)) or not math.isfinite(idle_timeout_s) or idle_timeout_s <= 0:
        raise ValueError(f"--idle-timeout must be a positive number of seconds, got {idle_timeout_s!r}")
    if type(max_connections) is not int or max_connections < 1:
        raise ValueError(f"--max-connections must be at least 1, got {max_connections!r}")


def build_parser() -> argparse.ArgumentParser:
    from eval.request import add_model_arguments

    p = argparse.ArgumentParser(prog="python -m eval.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help=f"one of: {', '.join(servable())}")
    p.add_argument("--protocol", default="openpi", help=f"one of: {', '.join(wire.SERVED_PROTOCOLS)} (default openpi)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only; "
                                                        "another needs --token or --insecure)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port, printed)")
    p.add_argument("--token", help="refuse clients that do not present this token (default: $SAB_REMOTE_TOKEN)")
    p.add_argument("--insecure", action="store_true", help="serve on an address other than loopback without a "
                                                           "token: anyone who reaches it may use the model")
    p.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES, metavar="B",
                   help=f"largest request accepted (default {DEFAULT_MAX_MESSAGE_BYTES}: a --num-envs 16 camera "
                        "batch; a larger one is refused with close code 1009)")
    p.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S, metavar="S",
                   help=f"close a connection that sends nothing for S seconds (default {DEFAULT_IDLE_TIMEOUT_S:g})")
    p.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                   help=f"clients served at once; one more is closed with code 1013, try again later (default "
                        f"{DEFAULT_MAX_CONNECTIONS})")
    add_model_arguments(p, models=servable(), title="model options (as eval.run takes them)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from eval.remote.client import resolve_token
        from eval.request import options_from_args, resolve_model

        check_served_protocol(args.protocol)
        if not 0 <= args.port <= 65535:
            raise ValueError(f"--port must be 0..65535, got {args.port}")
        args.token = resolve_token(args.token)
        check_exposure(args.host, args.token, args.insecure)  # before loading anything: refused in a second
        check_limits(args.max_message_bytes, args.idle_timeout, args.max_connections)
        if args.model not in servable():
            raise ValueError(f"cannot serve {args.model!r}" + (" (it reads the simulator)" if args.model == "scripted"
                                                               else "") + f"; servable: {', '.join(servable())}")
        model = resolve_model(args.model, options_from_args(args, servable()))
        policy = model.policy()
        served = ServedModel(policy, args.model)
        server = Server(served, args.protocol, args.host, args.port, args.token, args.insecure,
                        args.max_message_bytes, args.idle_timeout, args.max_connections)
    except Exception as e:  # noqa: BLE001 - bad option, missing weights or module, port taken: one line
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    print(f"serving {args.model} ({policy.backend}) on {server.url} protocol {args.protocol}"
          + (" (token required)" if args.token else "") + (" (open: no token, --insecure)" if
                                                             args.insecure and not args.token else ""), flush=True)
    try:
        server.thread.join()
    except KeyboardInterrupt:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
