"""The client: a :class:`~eval.policies.base.Policy` whose model runs behind a server.

``python -m eval.run --model remote --server ws://HOST:PORT --protocol openpi|vla-eval --profile NAME``;
``--server http://HOST:8777 --protocol openvla-http --profile openvla-oft-http`` for openvla-oft's own server.

- **Native profiles** (a server of this project, ``python -m eval.serve``) are batchable: ``encode`` packs the
  scene's observation (with its scene slot, episode number, seed and instruction), ``infer`` sends the rows of
  every scene that queries this step as one message (``{"batch": [...]}``), which the server answers with one
  engine call, and ``decode`` takes the scene's row of the returned actions (n, 7). The server keeps one
  in-process policy per scene slot and resets it when a new episode number arrives, so history windows, chunk
  queues and noise keys live where the in-process policy keeps them.
- **Foreign profiles** (a model's own server) are queried scene by scene, each scene on its own connection
  (those servers keep per-connection episode state); the reply's ``actions`` must have the profile's
  ``reply_shape``, its first ``execute`` actions are converted by the profile and applied before the next
  query. At the handshake the server's own description is checked against the profile where it gives one
  (vla-eval's HELLO: the gripper format of its ``action_spec``, the inputs of its ``observation_spec``; a
  server of this project names its model) and a mismatch is refused in one line.

Latency: every query keeps the round trip at the client (``rtt_ms``), the server's own compute time from the
reply (``server_timing.infer_ms``, when the server sends it) and their difference (``transport_ms``) in
:attr:`RemotePolicy.remote_ms`; the query's latency in ``infer_ms`` is the round trip plus packing. The first
``warmup_queries`` of a policy object are warm-up (as :class:`~eval.policies.base.Policy` counts them): the
try's record keeps their times apart (``remote_warmup_ms``).

Faults: a server that cannot be reached or does not match the profile raises :class:`ServerUnreachable` (one
line naming the URL); a dropped connection :class:`ServerDropped`; an error the server answers with
:class:`ServerError` carrying the server's exception (type and message, in one line); a reply without
``actions``, of another shape than the profile's or not finite :class:`MalformedReply` naming the key and the
expected shape. The last three are :class:`~eval.policies.base.BadActionError`, which the runner reports in one
line naming the try (its finished tries are kept; rerunning continues). What a server sends is bounded and
checked: a reply over :data:`MAX_REPLY_BYTES`, an array that is not plain numbers
(:func:`eval.remote.wire.peer_array`), metadata fields of the wrong type (:func:`check_metadata_fields`) or a
malformed ``server_timing`` / ``queued`` are :class:`MalformedReply` or :class:`ServerUnreachable`, one line naming
the server; a server that closes the connection with a reason has it in the line (:class:`ServerRefused` when it
refused our request: not retried). A reply later than ``timeout_s`` raises
:class:`ServerError`; the runner's ``--step-timeout`` watchdog flags a try whose query hangs longer than its own
limit as ``policy_hang``.
"""

from __future__ import annotations

import copy
import itertools
import math
import time
import urllib.parse
from http import HTTPStatus
from typing import Any, Mapping

import numpy as np

from eval.policies.base import ACTION_DIM, BadActionError, ConnectionLost, Policy
from eval.remote import wire
from eval.remote.profiles import Profile, foreign_inputs, get_profile, to_scene

DEFAULT_TIMEOUT_S = 600.0  # a reply later than this is a dead server; --step-timeout flags hangs before it
CONNECT_TIMEOUT_S = 10.0
# What a reply may be: actions (a chunk of at most a few hundred numbers per scene: (50, 7) for pi0, (n, 7) and
# the queued chunks for eval.serve) and the server's metadata, kilobytes; 4 MiB leaves room for servers that send
# more keys and bounds what a lying server can make a worker hold (websockets refuses a longer message from its
# frame header, close code 1009; the HTTP link reads no more than this).
MAX_REPLY_BYTES = 4 * 2**20
META_TEXT_LIMIT = 400  # the metadata strings a try's record keeps (backend, weights sha256, note)


class ServerUnreachable(ConnectionError):
    """The server cannot be reached or refused the handshake (one line naming the URL)."""


class ServerError(BadActionError):
    """The connection dropped or the server answered with an error mid-run."""


class ServerDropped(ServerError, ConnectionLost):
    """The connection to the server dropped mid-run (the try is run once more on a new connection)."""


class MalformedReply(BadActionError):
    """A reply without a key the profile needs, of the wrong shape, or not finite."""


class ServerRefused(ServerError):
    """The server closed the connection because of what was sent (close code 1003, 1007, 1008, 1009): the same
    request would be refused again, so it is not retried."""


class ServerClosed(ServerDropped):
    """The server closed the connection with a close frame (going away, full, idle): a new connection may do."""


REFUSING_CODES = {1003: "unsupported data", 1007: "invalid data", 1008: "policy violation", 1009: "message too big"}


def _numpy(x):
    if hasattr(x, "detach"):  # torch tensors of GPU scenes
        x = x.detach().cpu().numpy()
    return np.asarray(x) if isinstance(x, (np.ndarray, np.generic)) else x


class Link:
    """One WebSocket connection speaking ``protocol`` (openpi, vla-eval); ``call`` sends one request and returns
    the reply map and the round trip (ms)."""

    def __init__(self, url: str, protocol: str, token: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
        wire.check_protocol(protocol)
        self.url, self.protocol, self.token, self.timeout_s = url, protocol, token, timeout_s
        self.seq = 0
        self.metadata: dict = {}
        self.ws = None
        self.connect()

    def connect(self) -> None:
        from engines.optional import require

        require("websockets", "remote")
        import websockets.sync.client as wsc

        url, headers = self.url, None
        if self.token:
            headers = {"Authorization": f"Api-Key {self.token}"}
            if self.protocol == "vla-eval":  # vla-eval's clients send no headers: the token rides in the query
                parts = urllib.parse.urlsplit(url)
                query = urllib.parse.urlencode({"token": self.token})
                url = urllib.parse.urlunsplit(parts._replace(path=parts.path or "/", query=query))
        try:
            # entered as a context (websockets >= 17.1 deprecates a bare connect(); older ones return the connection)
            # websockets 17.4 (websockets/sync/client.py connect): max_size bounds each reply from its frame header
            self.ws = wsc.connect(url, compression=None, max_size=MAX_REPLY_BYTES, additional_headers=headers,
                                  open_timeout=CONNECT_TIMEOUT_S, ping_interval=None).__enter__()
        except Exception as e:  # noqa: BLE001 - refused, unresolvable, rejected handshake (401): one line
            raise ServerUnreachable(_unreachable(self.url, e)) from None
        try:
            if self.protocol == "openpi":
                self.metadata = self._openpi(self._recv(CONNECT_TIMEOUT_S))
            else:
                self._send_vla("hello", wire.hello_payload())
                reply = self._recv_vla(CONNECT_TIMEOUT_S)
                if reply["type"] != "hello":
                    raise wire.ProtocolError(f"expected a hello reply, got {reply['type']}")
                self.metadata = reply["payload"] if isinstance(reply["payload"], dict) else {}
            check_metadata_fields(self.metadata, self.url)
        except (ServerClosed, ServerRefused) as e:  # the server said why (full, going away): its words
            self.close()
            raise ServerUnreachable(str(e)) from None
        except ServerUnreachable:
            self.close()
            raise
        except (BadActionError, wire.ProtocolError) as e:  # a dropped, silent or garbled handshake
            self.close()
            raise ServerUnreachable(f"the model server at {self.url} does not speak {self.protocol} ({e}); check "
                                    "--protocol") from None

    def _recv(self, timeout: float, limit_s: float | None = None):
        """The next message; ``limit_s``: the whole wait this one ends, named in the timeout's line."""
        try:
            return self.ws.recv(timeout=timeout)
        except TimeoutError:
            raise ServerError(f"no reply from the model server at {self.url} within {limit_s or timeout:g} s"
                              ) from None
        except Exception as e:  # noqa: BLE001 - ConnectionClosed and the like
            raise self._closed(e) from None

    def _closed(self, e: Exception) -> ServerError:
        """What a closed connection means: a reply over MAX_REPLY_BYTES (we closed with 1009), our request refused
        (the server closed with 1003/1007/1008/1009: not retried), the server going away with its reason, or a drop."""
        sent, rcvd = getattr(e, "sent", None), getattr(e, "rcvd", None)
        ours = sent is not None and not getattr(e, "rcvd_then_sent", False)  # we closed first (rcvd: the echo)
        if ours and sent.code == 1009:
            return MalformedReply(f"a reply from the model server at {self.url} is over {MAX_REPLY_BYTES} bytes "
                                  "(a reply holds actions: kilobytes); refused")
        if not ours and rcvd is not None and rcvd.code in REFUSING_CODES:
            return ServerRefused(f"the model server at {self.url} refused the request and closed the connection "
                                 f"({rcvd.code} {REFUSING_CODES[rcvd.code]}: {wire.one_line(rcvd.reason, 200) or '-'})")
        if not ours and rcvd is not None and rcvd.reason:
            return ServerClosed(f"the model server at {self.url} closed the connection ({rcvd.code}: "
                                f"{wire.one_line(rcvd.reason, 200)})")
        return ServerDropped(f"the connection to the model server at {self.url} dropped ({type(e).__name__}: "
                             f"{wire.one_line(str(e), 200)})")

    def _send(self, data: bytes) -> None:
        limit = self.metadata.get("max_message_bytes")
        if type(limit) is int and len(data) > limit:  # eval.serve says its limit: refused here, in words
            raise ServerRefused(f"a request of {len(data)} bytes is over the limit of the model server at {self.url} "
                                f"({limit} bytes): restart it with --max-message-bytes {2 * len(data)}, or use fewer "
                                "--num-envs")
        try:
            self.ws.send(data)
        except Exception as e:  # noqa: BLE001
            raise self._closed(e) from None

    def _openpi(self, data) -> dict:
        if isinstance(data, str):  # openpi's server sends its traceback as text (eval.serve the exception)
            raise ServerError(f"the model server at {self.url} answered with an error: {wire.exception_line(data)}")
        try:
            reply = wire.openpi_unpack(data)
        except wire.ProtocolError as e:
            raise MalformedReply(f"a malformed reply from {self.url}: {wire.one_line(str(e))}") from None
        if not isinstance(reply, dict):
            raise MalformedReply(f"a reply from {self.url} is a {type(reply).__name__}, not a map")
        return reply

    def _send_vla(self, msg_type: str, payload: dict) -> int:
        self.seq += 1
        self._send(wire.vla_pack(msg_type, payload, self.seq))
        return self.seq

    def _recv_vla(self, timeout: float, limit_s: float | None = None) -> dict:
        data = self._recv(timeout, limit_s)
        try:
            return wire.vla_unpack(data)
        except wire.ProtocolError as e:
            raise MalformedReply(f"a malformed reply from {self.url}: {e}") from None

    def call(self, payload: dict) -> tuple[dict, float]:
        t0 = time.perf_counter()
        if self.protocol == "openpi":
            self._send(wire.openpi_pack(payload))
            reply = self._openpi(self._recv(self.timeout_s))
        else:
            seq = self._send_vla("observation", payload)
            deadline = time.monotonic() + self.timeout_s  # for the action: other messages do not extend it
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ServerError(f"no reply from the model server at {self.url} within {self.timeout_s:g} s")
                msg = self._recv_vla(left, self.timeout_s)
                if msg["type"] == "error":
                    error = msg["payload"].get("error", msg["payload"]) if isinstance(msg["payload"], dict) \
                        else msg["payload"]
                    raise ServerError(f"the model server at {self.url} answered with an error: "
                                      f"{wire.one_line(str(error))}")
                if msg["type"] == "action" and msg["seq"] in (seq, 0):
                    break
            reply = msg["payload"] if isinstance(msg["payload"], dict) else {}
        return reply, (time.perf_counter() - t0) * 1e3

    def episode_start(self, payload: dict) -> None:
        if self.protocol == "vla-eval":
            self._send_vla("episode_start", payload)

    def close(self) -> None:
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:  # noqa: BLE001
                pass
            self.ws = None


class HttpLink:
    """openvla-oft's deploy.py server: one kept-alive HTTP connection, ``POST /act`` of JSON with json_numpy
    arrays (:mod:`eval.remote.wire`); ``call`` returns ``{"actions": the reply's list}`` and the round trip."""

    protocol = "openvla-http"

    def __init__(self, url: str, token: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
        parts = urllib.parse.urlsplit(url)
        self.url, self.token, self.timeout_s = url, token, timeout_s
        self.path = parts.path if parts.path not in ("", "/") else "/act"
        self.https, self.host, self.port = parts.scheme == "https", parts.hostname, parts.port
        self.metadata: dict = {}
        self.conn = None
        self.connect()

    def connect(self) -> None:
        import http.client

        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        self.conn = cls(self.host, self.port, timeout=CONNECT_TIMEOUT_S)
        try:
            status, body = self._request("GET", "/openapi.json", None)  # FastAPI's route list
        except (ServerError, MalformedReply) as e:  # refused, unresolvable, silent, a body over the limit
            raise ServerUnreachable(_unreachable(self.url, e)) from None
        try:
            paths = wire.json_numpy_loads(body).get("paths", {}) if status == HTTPStatus.OK else {}
        except (wire.ProtocolError, AttributeError):
            paths = {}
        if "post" not in (paths.get(self.path) or {}):
            self.close()
            raise ServerUnreachable(f"the model server at {self.url} does not speak openvla-http (its /openapi.json "
                                    f"lists no POST {self.path}: HTTP {status}); check --protocol and --server")
        self.metadata = {"paths": sorted(paths)}
        self.conn.timeout = self.timeout_s
        if self.conn.sock is not None:
            self.conn.sock.settimeout(self.timeout_s)

    def _request(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        import http.client

        if self.conn is None:  # closed after a reply over the limit
            raise ServerDropped(f"the connection to the model server at {self.url} is closed")
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if self.token:
            headers["Authorization"] = f"Api-Key {self.token}"
        try:
            self.conn.request(method, path, body=body, headers=headers)
            response = self.conn.getresponse()
            data = response.read(MAX_REPLY_BYTES + 1)  # no more than a reply may be: a lying server's body unread
            if len(data) > MAX_REPLY_BYTES:
                self.close()  # the rest of the body is still on the socket: this connection cannot carry another
                raise MalformedReply(f"a reply from the model server at {self.url} is over {MAX_REPLY_BYTES} bytes "
                                     "(a reply holds actions: kilobytes); refused")
            return response.status, data
        except TimeoutError:
            raise ServerError(f"no reply from the model server at {self.url} within {self.timeout_s:g} s") from None
        except (OSError, http.client.HTTPException) as e:
            raise ServerDropped(f"the connection to the model server at {self.url} dropped ({type(e).__name__}: "
                                f"{wire.one_line(str(e), 200)})") from None

    def call(self, payload: dict) -> tuple[dict, float]:
        t0 = time.perf_counter()
        status, body = self._request("POST", self.path, wire.json_numpy_dumps(payload))
        ms = (time.perf_counter() - t0) * 1e3
        if status != HTTPStatus.OK:
            raise ServerError(f"the model server at {self.url} answered HTTP {status}: "
                              f"{wire.one_line(body.decode(errors='replace'), 300)}")
        try:
            reply = wire.json_numpy_loads(body)
        except wire.ProtocolError as e:
            raise MalformedReply(f"a malformed reply from {self.url}: {e}") from None
        if reply == "error":  # deploy.py's answer when get_vla_action raised (the traceback is in its log)
            raise ServerError(f"the model server at {self.url} answered \"error\" (deploy.py's reply when "
                              "get_vla_action raised; its log has the traceback): check the server's flags")
        return (reply if isinstance(reply, dict) else {"actions": reply}), ms

    def episode_start(self, payload: dict) -> None:
        """deploy.py keeps no episode state."""

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _unreachable(url: str, e: Exception) -> str:
    reason = wire.one_line(str(e), 200) if str(e) else type(e).__name__
    if "401" in reason:
        reason = "the server refused the token (HTTP 401): pass the server's --token"
    return f"cannot reach the model server at {url} ({reason}); start it (python -m eval.serve ...) or fix --server"


def connect(url: str, protocol: str, token: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
    """A link to the server at ``url`` speaking ``protocol`` (its handshake done)."""
    if wire.check_protocol(protocol) == "openvla-http":
        return HttpLink(url, token, timeout_s)
    return Link(url, protocol, token, timeout_s)


def check_metadata_fields(meta: Mapping[str, Any], url: str) -> None:
    """The fields of a server's metadata this client reads, each of its type (a try's record keeps the strings, the
    rollout divides by the window and horizon), or one-line :class:`ServerUnreachable`."""
    def bad(key: str, what: str) -> ServerUnreachable:
        return ServerUnreachable(f"the model server at {url} sent metadata whose {key!r} is not {what} (got "
                                 f"{wire.one_line(repr(meta[key]), 80)}): not a server this client can trust")

    for key in ("server", "model_server", "model", "backend", "weights_sha256", "note"):
        if meta.get(key) is not None and not (isinstance(meta[key], str) and len(meta[key]) <= META_TEXT_LIMIT):
            raise bad(key, f"a string of at most {META_TEXT_LIMIT} characters")
    if meta.get("max_message_bytes") is not None and not (type(meta["max_message_bytes"]) is int
                                                           and meta["max_message_bytes"] > 0):
        raise bad("max_message_bytes", "a positive int")
    reads = meta.get("reads")
    if reads is not None:
        ok = isinstance(reads, dict) and all(type(reads.get(k)) is int and 1 <= reads[k] <= 10_000
                                             for k in ("window", "exec_horizon")) \
            and type(reads.get("temporal_ensembling", False)) is bool
        if not ok:
            raise bad("reads", "{window: 1.., exec_horizon: 1.., temporal_ensembling: bool}")


def check_metadata(profile: Profile, meta: Mapping[str, Any], url: str) -> None:
    """What the server says of itself against the profile: one-line :class:`ServerUnreachable` on a mismatch."""
    ours = meta.get("server") == "eval.serve" or meta.get("model_server") == "eval.serve"
    if profile.native and not ours:
        raise ServerUnreachable(f"the model server at {url} is not a server of this project (python -m "
                                f"eval.serve), which profile {profile.name} needs: pick its model's own profile")
    if profile.native and meta.get("model") != profile.name:
        raise ServerUnreachable(f"the model server at {url} serves {meta.get('model')!r}, not {profile.name}: "
                                f"use --profile {meta.get('model')}")
    if not profile.native and ours:
        raise ServerUnreachable(f"the model server at {url} is eval.serve serving {meta.get('model')!r}: use "
                                f"--profile {meta.get('model')}")
    spec = meta.get("action_spec") if isinstance(meta.get("action_spec"), dict) else {}
    declared = (spec.get("gripper") or {}).get("format") if isinstance(spec.get("gripper"), dict) else None
    if profile.hello_gripper and declared and declared != profile.hello_gripper:
        raise ServerUnreachable(f"the model server at {url} declares its gripper {declared!r}; profile "
                                f"{profile.name} is written for {profile.hello_gripper!r}: check --profile")
    takes = meta.get("observation_spec")
    missing = [k for k in profile.hello_needs if isinstance(takes, dict) and k not in takes]
    if missing:
        raise ServerUnreachable(f"the model server at {url} takes no {', '.join(missing)} (its observation_spec), "
                                f"which {profile.name} sends: restart it with {profile.hello_fix}")


TOKEN_ENV = "SAB_REMOTE_TOKEN"  # the token, when --token is not given (neither is ever written to a file)


def resolve_token(token: str | None) -> str | None:
    import os

    return token or os.environ.get(TOKEN_ENV) or None


def check_server(server: str | None, protocol: str, profile: str | None, token: str | None = None) -> None:
    """One line (ValueError / ServerUnreachable) when the options are wrong, the server is not there or does not
    match the profile: run before any scene is built."""
    wire.check_url(server, protocol)
    p = get_profile(profile or "", protocol)
    link = connect(server, protocol, resolve_token(token), timeout_s=CONNECT_TIMEOUT_S)
    try:
        check_metadata(p, link.metadata, server)
    finally:
        link.close()


_slots = itertools.count()


class RemotePolicy(Policy):
    """A model behind a server (see the module docstring)."""

    warmup_queries = 3

    def __init__(self, server: str, protocol: str = "openpi", profile: str = "octo-small", token: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__()
        self.profile: Profile = get_profile(profile, protocol)
        self.protocol = protocol
        token = resolve_token(token)
        self.url, self.token, self.timeout_s = wire.check_url(server, protocol), token, timeout_s
        self.name = f"remote:{self.profile.name}"
        self.observes, self.track = self.profile.observes, self.profile.track
        self.batchable = self.profile.native
        self.link = connect(server, protocol, token, timeout_s)
        meta = self.link.metadata
        try:
            check_metadata(self.profile, meta, server)
        except ServerUnreachable:
            self.link.close()
            raise
        # the runtime the server runs the model on, as it says (None where it does not); the protocol is its own field
        self.backend = meta.get("backend")
        self.weights_sha256 = meta.get("weights_sha256")
        self.note = meta.get("note")
        self.reads = meta.get("reads") or {}
        self.slot = next(_slots)
        self.episode = 0
        self.seed = 0
        self.prompt = ""
        self._queue: list[np.ndarray] = []
        self._earlier: list[dict] = []  # observations of steps served from the queue, sent with the next query
        # per query of this try: (round trip, server compute or None, warm-up: one of the object's first queries)
        self.remote_ms: list[tuple[float, float | None, bool]] = []

    # ------------------------------------------------------------ Policy interface
    def reset(self, instruction: str, seed: int | None = None) -> None:
        self.episode += 1
        self.prompt, self.seed = instruction, int(seed or 0)
        self._queue, self._earlier = [], []
        self.remote_ms = []
        if not self.profile.native:
            self.link.episode_start({"task_description": instruction, "seed": self.seed})

    def reads_observation(self, step: int) -> bool:
        """As the served policy reads (its window and horizon come in the server's metadata); a foreign model
        the steps that query it (every ``execute``-th: the others are served from its chunk)."""
        if not self.profile.native:
            return step % self.profile.execute == 0
        if self.profile.observes == "state" or not self.reads:
            return True
        if self.reads.get("temporal_ensembling"):
            return True
        return (-step) % int(self.reads["exec_horizon"]) < int(self.reads["window"])

    def _wire_observation(self, observation: Mapping[str, Any]) -> dict[str, Any]:
        if self.profile.observes == "state":
            return {"state": {k: _numpy(v) for k, v in observation["state"].items()}}
        images = observation.get("images")
        out = {"images": None if images is None else {k: _numpy(v) for k, v in images.items() if v is not None}}
        if observation.get("proprio") is not None:
            out["proprio"] = _numpy(observation["proprio"])
        return out

    def encode(self, observation: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
        """None while the server's last reply queued actions for this scene (no round trip: the observation
        travels with the next query, so the server's policy sees every step as in-process); else the row."""
        if self._queue:
            self._earlier.append(self._wire_observation(observation))
            return None
        row: dict[str, Any] = {"scene": self.slot, "episode": self.episode, "seed": self.seed, "prompt": self.prompt,
                               **self._wire_observation(observation)}
        if self._earlier:
            row["earlier"], self._earlier = self._earlier, []
        cell = np.empty(1, dtype=object)
        cell[0] = row
        return {"rows": cell}

    def infer(self, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        rows = list(feeds["rows"])
        reply = self._call({"batch": rows})
        queued = reply.get("queued")
        if not isinstance(queued, (list, tuple)) or len(queued) != len(rows):
            raise MalformedReply(f"the reply from {self.url} (seed {self.seed}): key 'queued' must list the "
                                 f"{len(rows)} scenes' queued actions")
        return {"actions": self._actions(reply, (len(rows), ACTION_DIM)), "queued": list(queued)}

    def decode(self, outputs: Mapping[str, np.ndarray] | None, row: int) -> np.ndarray:
        if outputs is None:
            return self._queue.pop(0)
        try:
            queued = np.asarray(outputs["queued"][row], np.float32).reshape(-1, ACTION_DIM)
        except (TypeError, ValueError):
            raise MalformedReply(f"the reply from {self.url} (seed {self.seed}): key 'queued' must hold each scene's "
                                 f"queued actions as (k, {ACTION_DIM}) numbers") from None
        if not np.all(np.isfinite(queued)):
            raise MalformedReply(f"the reply from {self.url} (seed {self.seed}): key 'queued' holds non-finite values")
        self._queue = list(queued)
        return np.array(outputs["actions"][row], dtype=np.float32)

    def act(self, observation: Mapping[str, Any]) -> np.ndarray:
        if self.profile.native:
            return super().act(observation)
        if not self._queue:
            reply = self._call(foreign_inputs(self.profile, observation, self.protocol))
            chunk = self._actions(reply, self.profile.reply_shape).reshape(-1, self.profile.reply_shape[-1])
            self._queue = [to_scene(self.profile, a) for a in chunk[: self.profile.execute]]
        return self._queue.pop(0)

    def spawn(self) -> "RemotePolicy":
        """A policy for another scene of the batch: the same connection, its own slot on the server."""
        other = copy.copy(self)
        other.slot = next(_slots)
        other._queue, other._earlier, other.remote_ms = [], [], []
        other.latencies_ms, other.warmup_ms, other.stage_ms, other.queries = [], [], {}, 0
        return other

    def prepare_batch(self, n: int) -> None:
        if self.profile.native:
            self.link.call({"prepare": int(n)})  # untimed, as in-process

    def close(self) -> None:
        self.link.close()

    # ------------------------------------------------------------ internals
    def _call(self, payload: dict) -> dict:
        warm = self.queries < self.warmup_queries  # this query's place among the object's (Policy.record_latency)
        reply, rtt = self.link.call(payload)
        timing = reply.get("server_timing") if isinstance(reply.get("server_timing"), dict) else {}
        server = timing.get("infer_ms")
        if server is not None and not (type(server) in (int, float) and math.isfinite(server) and server >= 0):
            raise MalformedReply(f"the reply from {self.url} (seed {self.seed}): 'server_timing.infer_ms' must be a "
                                 f"finite number of ms >= 0, got {wire.one_line(repr(server), 60)}")
        self.remote_ms.append((rtt, None if server is None else float(server), warm))
        return reply

    def _actions(self, reply: dict, shape: tuple[int, ...]) -> np.ndarray:
        where = f"the reply from {self.url} (seed {self.seed})"
        expected = f"expected 'actions' of shape {shape} ({self.profile.name})"
        if "actions" not in reply:
            raise MalformedReply(f"{where} has no key 'actions' (keys: {', '.join(map(str, reply)) or 'none'}); "
                                 f"{expected}")
        try:
            actions = np.asarray(reply["actions"], dtype=np.float32)
        except (TypeError, ValueError):
            raise MalformedReply(f"{where}: key 'actions' is not a numeric array; {expected}") from None
        if actions.shape != shape:
            raise MalformedReply(f"{where}: key 'actions' has shape {actions.shape}; {expected}")
        if not np.all(np.isfinite(actions)):
            raise MalformedReply(f"{where}: key 'actions' holds non-finite values; {expected}, finite")
        return actions

    def remote_latency(self, warmup: bool = False) -> dict[str, list[float]]:
        """Per query of this try (the timed ones, or with ``warmup`` the warm-up ones): round trip at the
        client, the server's compute time and their difference (ms)."""
        kept = [(r, s) for r, s, w in self.remote_ms if w == warmup]
        return {"rtt_ms": [r for r, _ in kept], "server_ms": [s for _, s in kept if s is not None],
                "transport_ms": [r - s for r, s in kept if s is not None]}

    def record_fields(self) -> dict[str, Any]:
        """The try's record keeps every timed query's round trip, server compute and transport, and the warm-up
        queries' apart (ms, 3 digits; with one scene: a batch's calls are timed in its batch record)."""
        def rounded(times):
            return {k: [float(f"{x:.3g}") for x in v] for k, v in times.items()}

        out = {"remote_ms": rounded(self.remote_latency()), "protocol": self.protocol}
        if any(w for _, _, w in self.remote_ms):
            out["remote_warmup_ms"] = rounded(self.remote_latency(warmup=True))
        return out


class LiveLatencyPolicy(Policy):
    """``--live-latency``: the measured round trip of each model query acts in the loop, as ``--replay-latency``
    does with a recorded profile (:mod:`eval.latency_replay`). A query made at step k whose round trip took
    ``rtt`` ms arrives at the first control step (50 ms each) after it, k + ceil(rtt / 50) - 1; the actions of its
    chunk (those the policy serves on the following steps without a round trip) are applied in order from then.
    Until a chunk arrives the arm continues the previous chunk, or holds still with its last gripper command
    when none is left; a chunk that arrives replaces what is left of the previous one (and any older chunk
    still on its way). ``stale_steps`` counts the steps that held; :meth:`stale_ratio` is their share. Scenes
    are queried one by one (each has its own clock)."""

    def __init__(self, inner: RemotePolicy) -> None:
        super().__init__()
        from eval.latency_replay import CONTROL_PERIOD_MS

        self.inner, self.period_ms = inner, CONTROL_PERIOD_MS
        self.name, self.track, self.observes = inner.name, inner.track, inner.observes
        self.backend, self.note = inner.backend, inner.note
        self.weights_sha256 = inner.weights_sha256
        self.step, self.stale_steps = 0, 0
        self.in_flight: list[tuple[int, list[np.ndarray]]] = []  # (arrival step, the chunk's actions so far)
        self.executing: list[np.ndarray] = []  # the arrived chunk's actions not yet applied
        self.current: np.ndarray | None = None

    def reset(self, instruction: str, seed: int | None = None) -> None:
        self.inner.reset(instruction, seed=seed)
        self.step, self.stale_steps, self.in_flight, self.executing, self.current = 0, 0, [], [], None

    def reads_observation(self, step: int) -> bool:
        return self.inner.reads_observation(step)

    def act(self, observation: Mapping[str, Any]) -> np.ndarray:
        import math

        before = len(self.inner.remote_ms)
        action = np.asarray(self.inner.query(observation), dtype=np.float32)
        if len(self.inner.remote_ms) > before:  # a model query: a new chunk on its way
            delay = max(0, math.ceil(self.inner.remote_ms[-1][0] / self.period_ms) - 1)
            self.in_flight.append((self.step + delay, [action]))
        elif self.in_flight:  # served from the chunk still on its way
            self.in_flight[-1][1].append(action)
        else:
            self.executing.append(action)
        arrived = [i for i, (t, _) in enumerate(self.in_flight) if t <= self.step]
        if arrived:
            self.executing = list(self.in_flight[arrived[-1]][1])
            self.in_flight = self.in_flight[arrived[-1] + 1:]
        self.step += 1
        if self.executing:
            self.current = self.executing.pop(0)
            return self.current
        self.stale_steps += 1
        return np.array([0, 0, 0, 0, 0, 0, 1 if self.current is None else self.current[6]], dtype=np.float32)

    def stale_ratio(self) -> float:
        return self.stale_steps / self.step if self.step else 0.0

    def remote_latency(self, warmup: bool = False) -> dict[str, list[float]]:
        return self.inner.remote_latency(warmup)

    def close(self) -> None:
        self.inner.close()

    def record_fields(self) -> dict[str, Any]:
        """The inner policy's round trips, and the steps the arm held waiting for a chunk."""
        return {**self.inner.record_fields(), "stale_steps": self.stale_steps,
                "stale_ratio": round(self.stale_ratio(), 4)}
