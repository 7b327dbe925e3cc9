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
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
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
        return {k: v for k, v in meta.items() if v is not None}


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
        self.seed = int(payload.get("seed", task.get("seed", 0)) or 0)

    def handle(self, request: Any) -> dict:
        if not isinstance(request, dict):
            raise wire.ProtocolError(f"a request must be a map, got {type(request).__name__}")
        if "prepare" in request:
            t0 = time.perf_counter()
            with self.served.lock:
                self.served.prototype.prepare_batch(int(request["prepare"]))
            return {"prepared": int(request["prepare"]), "server_timing": {"infer_ms": (time.perf_counter() - t0) * 1e3}}
        batched = "batch" in request
        rows = request["batch"] if batched else [request]
        if not isinstance(rows, (list, tuple)) or not rows:
            raise wire.ProtocolError("'batch' must be a non-empty list of scene observations")
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
        scene = int(row.get("scene", 0))
        episode = row.get("episode")
        prompt = row.get("prompt", row.get("task_description", row.get("instruction")))
        if episode is None:  # a plain client: the connection's episode
            episode, prompt, seed = ("c", self.episode), (prompt if prompt is not None else self.prompt), self.seed
        else:
            seed = int(row.get("seed", 0))
        entry = self.scenes.get(scene)
        if entry is None:
            p = self.served.prototype
            entry = self.scenes[scene] = [p.spawn() if p.batchable else p, None]
        if entry[1] != episode:
            entry[0].reset(str(prompt or ""), seed=int(seed))
            entry[1] = episode
        policy = entry[0]
        earlier = row.get("earlier") or []  # observations of the steps the client served from the queued chunk
        for o in earlier:  # as in-process: each such step takes its frames into the history, the action its queue
            if policy.encode(self._observation(policy, o, prompt)) is not None:
                raise wire.ProtocolError(f"scene {scene}: an earlier observation would have queried the model "
                                         "(the client and the server disagree on the chunk)")
            policy.decode(None, -1)
        return policy, self._observation(policy, row, prompt)

    @staticmethod
    def _observation(policy, row: dict, prompt) -> dict:
        if policy.observes == "state":
            if "state" not in row:
                raise wire.ProtocolError("a bc-state observation needs 'state'")
            obs = {"state": {k: np.asarray(v) for k, v in row["state"].items()}}
        else:
            images = row.get("images")
            obs = {"images": None if images is None else dict(images), "proprio": row.get("proprio")}
        obs["instruction"] = prompt
        return obs


# ------------------------------------------------------------------ protocol handlers
def _exception(e: Exception) -> str:
    """The exception's type and message, one line (what the client's error line shows)."""
    return wire.one_line(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)


def _openpi_handler(served: ServedModel):
    def handler(conn) -> None:
        session = Session(served)
        conn.send(wire.openpi_pack(served.metadata("openpi")))
        for message in conn:
            try:
                reply = session.handle(wire.openpi_unpack(message))
            except Exception as e:  # noqa: BLE001 - sent to the client as openpi's servers do: a text frame
                conn.send(_exception(e))
                continue
            conn.send(wire.openpi_pack(reply))
    return handler


def _vla_handler(served: ServedModel):
    def handler(conn) -> None:
        session = Session(served)
        for message in conn:
            seq = 0
            try:
                msg = wire.vla_unpack(message)
                seq = msg["seq"]
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
            except Exception as e:  # noqa: BLE001 - an error message, as vla-eval's servers send
                conn.send(wire.vla_pack("error", {"error": f"observation_failed: {_exception(e)}"}, seq))
    return handler


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
    """A running server (a thread of its own); ``port`` is the bound port, ``close()`` stops it."""

    def __init__(self, served: ServedModel, protocol: str, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, insecure: bool = False):
        from engines.optional import require

        check_exposure(host, token, insecure)  # where the socket is bound: no server open by accident
        require("websockets", "remote")
        from websockets.sync.server import serve

        handler = _openpi_handler(served) if check_served_protocol(protocol) == "openpi" else _vla_handler(served)
        self.served, self.protocol, self.host = served, protocol, host
        self.ws = serve(handler, host, port, process_request=_process_request(token), compression=None,
                        max_size=None, ping_interval=None)
        self.port = self.ws.socket.getsockname()[1]
        self.url = f"ws://{host}:{self.port}"
        self.thread = threading.Thread(target=self.ws.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.ws.shutdown()
        self.thread.join(timeout=5)


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
        if args.model not in servable():
            raise ValueError(f"cannot serve {args.model!r}" + (" (it reads the simulator)" if args.model == "scripted"
                                                               else "") + f"; servable: {', '.join(servable())}")
        model = resolve_model(args.model, options_from_args(args, servable()))
        policy = model.policy()
        served = ServedModel(policy, args.model)
        server = Server(served, args.protocol, args.host, args.port, args.token, args.insecure)
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
