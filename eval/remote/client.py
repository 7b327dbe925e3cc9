"""The client: a :class:`~eval.policies.base.Policy` whose model runs behind a WebSocket.

``python -m eval.run --model remote --server ws://HOST:PORT --protocol openpi|vla-eval --profile NAME``.

- **Native profiles** (a server of this project, ``python -m eval.serve``) are batchable: ``encode`` packs the
  scene's observation (with its scene slot, episode number, seed and instruction), ``infer`` sends the rows of
  every scene that queries this step as one message (``{"batch": [...]}``), which the server answers with one
  engine call, and ``decode`` takes the scene's row of the returned actions (n, 7). The server keeps one
  in-process policy per scene slot and resets it when a new episode number arrives, so history windows, chunk
  queues and noise keys live where the in-process policy keeps them.
- **Foreign profiles** (a model's own server) are queried scene by scene, each scene on its own connection
  (those servers keep per-connection episode state); the reply's chunk is converted by the profile and its
  first ``execute`` actions are applied before the next query.

Latency: every query keeps the round trip at the client (``rtt_ms``), the server's own compute time from the
reply (``server_timing.infer_ms``, when the server sends it) and their difference (``transport_ms``) in
:attr:`RemotePolicy.remote_ms`; the query's latency in ``infer_ms`` is the round trip plus packing.

Faults: a server that cannot be reached raises :class:`ServerUnreachable` (one line naming the URL); a dropped
connection :class:`ServerError`; a reply without ``actions``, of the wrong shape or not finite
:class:`MalformedReply` naming the key. The last two are :class:`~eval.policies.base.BadActionError`, which the
runner reports in one line naming the try (its finished tries are kept; rerunning continues). A reply later
than ``timeout_s`` raises :class:`ServerError`; the runner's ``--step-timeout`` watchdog flags a try whose
query hangs longer than its own limit as ``policy_hang``.
"""

from __future__ import annotations

import copy
import itertools
import time
import urllib.parse
from typing import Any, Mapping

import numpy as np

from eval.policies.base import ACTION_DIM, BadActionError, ConnectionLost, Policy
from eval.remote import wire
from eval.remote.profiles import Profile, foreign_inputs, get_profile, to_scene

DEFAULT_TIMEOUT_S = 600.0  # a reply later than this is a dead server; --step-timeout flags hangs before it
CONNECT_TIMEOUT_S = 10.0


class ServerUnreachable(ConnectionError):
    """The server cannot be reached or refused the handshake (one line naming the URL)."""


class ServerError(BadActionError):
    """The connection dropped or the server answered with an error mid-run."""


class ServerDropped(ServerError, ConnectionLost):
    """The connection to the server dropped mid-run (the try is run once more on a new connection)."""


class MalformedReply(BadActionError):
    """A reply without a key the profile needs, of the wrong shape, or not finite."""


def _numpy(x):
    if hasattr(x, "detach"):  # torch tensors of GPU scenes
        x = x.detach().cpu().numpy()
    return np.asarray(x) if isinstance(x, (np.ndarray, np.generic)) else x


class Link:
    """One WebSocket connection speaking ``protocol``; ``call`` sends one request and returns the reply map and
    the round trip (ms)."""

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
            self.ws = wsc.connect(url, compression=None, max_size=None, additional_headers=headers,
                                  open_timeout=CONNECT_TIMEOUT_S, ping_interval=None).__enter__()
        except Exception as e:  # noqa: BLE001 - refused, unresolvable, rejected handshake (401): one line
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            if "401" in reason:
                reason = "the server refused the token (HTTP 401): pass the server's --token"
            raise ServerUnreachable(f"cannot reach the model server at {self.url} ({reason}); start it "
                                    "(python -m eval.serve ...) or fix --server") from None
        try:
            if self.protocol == "openpi":
                self.metadata = self._openpi(self._recv(CONNECT_TIMEOUT_S))
            else:
                self._send_vla("hello", wire.hello_payload())
                reply = self._recv_vla(CONNECT_TIMEOUT_S)
                if reply["type"] != "hello":
                    raise wire.ProtocolError(f"expected a hello reply, got {reply['type']}")
                self.metadata = reply["payload"] if isinstance(reply["payload"], dict) else {}
        except (BadActionError, wire.ProtocolError) as e:  # a dropped, silent or garbled handshake
            self.close()
            raise ServerUnreachable(f"the model server at {self.url} does not speak {self.protocol} ({e}); check "
                                    "--protocol") from None

    def _recv(self, timeout: float):
        try:
            return self.ws.recv(timeout=timeout)
        except TimeoutError:
            raise ServerError(f"no reply from the model server at {self.url} within {timeout:g} s") from None
        except Exception as e:  # noqa: BLE001 - ConnectionClosed and the like
            raise ServerDropped(f"the connection to the model server at {self.url} dropped ({type(e).__name__}: "
                                f"{str(e).splitlines()[0] if str(e) else ''})") from None

    def _send(self, data: bytes) -> None:
        try:
            self.ws.send(data)
        except Exception as e:  # noqa: BLE001
            raise ServerDropped(f"the connection to the model server at {self.url} dropped ({type(e).__name__})"
                                ) from None

    def _openpi(self, data) -> dict:
        if isinstance(data, str):
            raise ServerError(f"the model server at {self.url} answered with an error: {data.strip()[:200]}")
        try:
            reply = wire.openpi_unpack(data)
        except wire.ProtocolError as e:
            raise MalformedReply(f"a malformed reply from {self.url}: {str(e).splitlines()[0]}") from None
        if not isinstance(reply, dict):
            raise MalformedReply(f"a reply from {self.url} is a {type(reply).__name__}, not a map")
        return reply

    def _send_vla(self, msg_type: str, payload: dict) -> int:
        self.seq += 1
        self._send(wire.vla_pack(msg_type, payload, self.seq))
        return self.seq

    def _recv_vla(self, timeout: float) -> dict:
        data = self._recv(timeout)
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
            while True:
                msg = self._recv_vla(self.timeout_s)
                if msg["type"] == "error":
                    raise ServerError(f"the model server at {self.url} answered with an error: {msg['payload']}")
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


TOKEN_ENV = "SAB_REMOTE_TOKEN"  # the token, when --token is not given (neither is ever written to a file)


def resolve_token(token: str | None) -> str | None:
    import os

    return token or os.environ.get(TOKEN_ENV) or None


def check_server(server: str | None, protocol: str | None, profile: str | None, token: str | None = None) -> None:
    """One line (ValueError / ServerUnreachable) when the options are wrong or the server is not there: run
    before any scene is built."""
    if not server:
        raise ValueError("--model remote needs --server ws://HOST:PORT")
    if not server.startswith(("ws://", "wss://")):
        raise ValueError(f"--server must be a ws:// or wss:// URL, got {server!r}")
    wire.check_protocol(protocol or "openpi")
    get_profile(profile or "")
    Link(server, protocol or "openpi", resolve_token(token), timeout_s=CONNECT_TIMEOUT_S).close()


_slots = itertools.count()


class RemotePolicy(Policy):
    """A model behind a server (see the module docstring)."""

    warmup_queries = 3

    def __init__(self, server: str, protocol: str = "openpi", profile: str = "octo-small", token: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__()
        self.profile: Profile = get_profile(profile)
        self.protocol = wire.check_protocol(protocol)
        token = resolve_token(token)
        self.url, self.token, self.timeout_s = server, token, timeout_s
        self.name = f"remote:{self.profile.name}"
        self.observes, self.track = self.profile.observes, self.profile.track
        self.batchable = self.profile.native
        self.link = Link(server, protocol, token, timeout_s)
        meta = self.link.metadata
        self.backend = f"remote {protocol}" + (f" {meta['backend']}" if meta.get("backend") else "")
        self.weights_sha256 = meta.get("weights_sha256")
        self.note = meta.get("note")
        self.reads = meta.get("reads") or {}
        self.slot = next(_slots)
        self.episode = 0
        self.seed = 0
        self.prompt = ""
        self._queue: list[np.ndarray] = []
        self._earlier: list[dict] = []  # observations of steps served from the queue, sent with the next query
        self.remote_ms: list[tuple[float, float | None]] = []  # (round trip, server compute) per query

    # ------------------------------------------------------------ Policy interface
    def reset(self, instruction: str, seed: int | None = None) -> None:
        self.episode += 1
        self.prompt, self.seed = instruction, int(seed or 0)
        self._queue, self._earlier = [], []
        self.remote_ms = []
        if not self.profile.native:
            self.link.episode_start({"task_description": instruction, "seed": self.seed})

    def reads_observation(self, step: int) -> bool:
        """As the served policy reads (its window and horizon come in the server's metadata)."""
        if not self.profile.native or self.profile.observes == "state" or not self.reads:
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
        queued = np.asarray(outputs["queued"][row], np.float32).reshape(-1, ACTION_DIM)
        if not np.all(np.isfinite(queued)):
            raise MalformedReply(f"the reply from {self.url} (seed {self.seed}): key 'queued' holds non-finite values")
        self._queue = list(queued)
        return np.array(outputs["actions"][row], dtype=np.float32)

    def act(self, observation: Mapping[str, Any]) -> np.ndarray:
        if self.profile.native:
            return super().act(observation)
        if not self._queue:
            reply = self._call(foreign_inputs(self.profile, observation, self.protocol))
            actions = self._actions(reply, None)
            chunk = actions[None] if actions.ndim == 1 else actions
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
            self._call({"prepare": int(n)})

    def close(self) -> None:
        self.link.close()

    # ------------------------------------------------------------ internals
    def _call(self, payload: dict) -> dict:
        reply, rtt = self.link.call(payload)
        timing = reply.get("server_timing") if isinstance(reply.get("server_timing"), dict) else {}
        server = timing.get("infer_ms")
        self.remote_ms.append((rtt, None if server is None else float(server)))
        return reply

    def _actions(self, reply: dict, shape: tuple[int, ...] | None) -> np.ndarray:
        where = f"the reply from {self.url} (seed {self.seed})"
        if "actions" not in reply:
            raise MalformedReply(f"{where} has no key 'actions' (keys: {', '.join(map(str, reply)) or 'none'})")
        try:
            actions = np.asarray(reply["actions"], dtype=np.float32)
        except (TypeError, ValueError):
            raise MalformedReply(f"{where}: key 'actions' is not a numeric array") from None
        if shape is not None and actions.shape != shape:
            raise MalformedReply(f"{where}: key 'actions' has shape {actions.shape}, expected {shape}")
        if actions.ndim not in (1, 2) or actions.shape[-1] < ACTION_DIM:
            raise MalformedReply(f"{where}: key 'actions' has shape {actions.shape}, expected (..., >= 7)")
        if not np.all(np.isfinite(actions)):
            raise MalformedReply(f"{where}: key 'actions' holds non-finite values")
        return actions

    def remote_latency(self) -> dict[str, list[float]]:
        """Per query: round trip at the client, the server's compute time and their difference (ms)."""
        rtt = [r for r, _ in self.remote_ms]
        server = [s for _, s in self.remote_ms if s is not None]
        transport = [r - s for r, s in self.remote_ms if s is not None]
        return {"rtt_ms": rtt, "server_ms": server, "transport_ms": transport}

    def record_fields(self) -> dict[str, Any]:
        """The try's record keeps every query's round trip, server compute and transport (ms, 3 digits; with
        one scene: a batch's calls are timed in its batch record)."""
        return {"remote_ms": {k: [float(f"{x:.3g}") for x in v] for k, v in self.remote_latency().items()}}


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

    def remote_latency(self) -> dict[str, list[float]]:
        return self.inner.remote_latency()

    def close(self) -> None:
        self.inner.close()

    def record_fields(self) -> dict[str, Any]:
        """The inner policy's round trips, and the steps the arm held waiting for a chunk."""
        return {**self.inner.record_fields(), "stale_steps": self.stale_steps,
                "stale_ratio": round(self.stale_ratio(), 4)}
