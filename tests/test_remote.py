"""Remote policies (eval.remote, eval.serve), on loopback only, with the real openpi-client, vla-eval and
json-numpy packages: a served engine gives the records of the in-process one; each protocol's reference client
talks to eval.serve and our client talks to servers built from each protocol's reference code (vla-eval's own
model servers with a stub model in place of the weights, a server behaving as openpi's websocket_policy_server,
a stub of openvla-oft's deploy.py); every profile's gripper convention is checked on the scene's own gripper;
faults are one line; a server does not open itself to other machines by accident."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import types
import urllib.request

import numpy as np
import pytest

from env.setups import get_setup
from eval.rollout import Scenes, make_members, rollout
from tests.conftest import REPO_ROOT, one_remote_try_fails_in_one_line

pytest.importorskip("websockets")

TIMING = {"wall_s", "infer_ms", "infer_ms_mean", "infer_ms_p99", "warmup_ms", "step_ms", "machine", "backend",
          "remote_ms"}

pytestmark = pytest.mark.sim  # builds ManiSkill scenes


def _outcomes(records):
    return [{k: v for k, v in r.to_json().items() if k not in TIMING} for r in records]


def _serve(policy, model, protocol, token=None):
    from eval.serve import Server, ServedModel

    return Server(ServedModel(policy, model), protocol, token=token)


def _local_and_remote(setup_id, tries, local_factory, remote_factory, cameras, max_steps):
    """The same tries in-process and through the server, on one set of scenes (each try builds its physics
    scene afresh, so sharing them changes nothing but the time)."""
    n = len(tries)
    scenes = Scenes(get_setup(setup_id), n, cameras=cameras, max_steps=max_steps)
    try:
        local, _ = rollout(scenes, make_members(local_factory(), n, local_factory), "dev", tries)
        members = make_members(remote_factory(), n, remote_factory)
        remote, batch = rollout(scenes, members, "dev", tries)
    finally:
        scenes.close()
    return local, remote, batch, members


@functools.lru_cache(maxsize=None)  # a scene built once for the module's tests that only read its start
def _bc_obs(seed=0):
    from env import make_env

    env = make_env("A01", obs_mode="state")
    try:
        env.reset(seed=seed)
        return {k: v[0] for k, v in env.unwrapped.task_state().items()}
    finally:
        env.close()


# ------------------------------------------------------------------ served == in-process
def test_served_bc_state_gives_the_in_process_records_batched_in_one_call():
    from eval.request import make_policy
    from eval.remote.client import RemotePolicy

    server = _serve(make_policy("bc-state"), "bc-state", "openpi")
    try:
        local, remote, batch, members = _local_and_remote(
            "A02", [0, 1], lambda: make_policy("bc-state"), lambda: RemotePolicy(server.url, "openpi", "bc-state"), False, 25)
    finally:
        server.close()
    assert _outcomes(remote) == _outcomes(local)
    assert batch["batched_queries"] and all(b == 2 for b in batch["query_batch"])
    lat, warm = members[0].remote_latency(), members[0].remote_latency(warmup=True)  # timed at both ends
    assert len(warm["rtt_ms"]) == len(warm["server_ms"]) == members[0].warmup_queries  # its first 3, apart
    # one server call per step for both scenes
    assert len(lat["rtt_ms"]) + len(warm["rtt_ms"]) == len(lat["server_ms"]) + 3 == max(r.steps for r in remote)
    assert all(t >= 0 for t in lat["transport_ms"]) and remote[0].weights_sha256 == local[0].weights_sha256


def test_served_octo_gives_the_in_process_actions_over_vla_eval_batched():
    """Octo (the tiny test engine) on synthetic frames, two scenes of different seeds queried as a batch: the
    same actions step by step, one server call per model query, frames of chunk steps sent with the next."""
    pytest.importorskip("jax")
    from engines.octo.testing import tiny_octo
    from eval.request import make_policy
    from eval.policies.base import query_members
    from eval.remote.client import RemotePolicy

    policy = make_policy("octo-small", engine=tiny_octo(seed=1))  # one runner, compiled once, for both sides
    server = _serve(policy.spawn(), "octo-small", "vla-eval")
    try:
        local = make_members(policy, 2, None)
        lead = RemotePolicy(server.url, "vla-eval", "octo-small")
        remote = make_members(lead, 2, None)
        rng = np.random.default_rng(0)
        for group in (local, remote):
            for m, seed in zip(group, (11, 12)):
                m.reset("put the circle in its hole", seed=seed)
        calls = 0
        for step in range(9):
            obs = [{"images": ({"third_person": rng.integers(0, 255, (40, 40, 3), dtype=np.uint8),
                                "wrist": rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)}
                               if policy.reads_observation(step) else None), "proprio": np.zeros(9, np.float32)}
                   for _ in range(2)]
            assert lead.reads_observation(step) == policy.reads_observation(step)
            a_local, _, ran_local = query_members(local, obs)
            a_remote, _, ran_remote = query_members(remote, obs)
            np.testing.assert_array_equal(a_remote, a_local)
            assert ran_remote == ran_local
            calls += any(ran_remote)
    finally:
        server.close()
    assert calls == 3 and lead.reads == {"window": 2, "exec_horizon": 4, "temporal_ensembling": False}
    assert len(lead.remote_latency(warmup=True)["rtt_ms"]) == 3 and lead.note == policy.note  # 3 calls: warm-up


# ------------------------------------------------------------------ the reference clients talk to eval.serve
def test_openpi_client_package_talks_to_eval_serve_and_a_wrong_token_is_refused():
    openpi = pytest.importorskip("openpi_client.websocket_client_policy")
    from eval.request import make_policy

    server = _serve(make_policy("bc-state"), "bc-state", "openpi", token="s3cret")
    try:
        client = openpi.WebsocketClientPolicy(server.url, api_key="s3cret")
        meta = client.get_server_metadata()
        assert meta["model"] == "bc-state" and meta["protocol"] == "openpi"
        state = _bc_obs()
        ref = make_policy("bc-state")
        ref.reset("x", seed=5)
        for step in range(3):  # the server keeps the scene's action history, as the in-process policy does
            reply = client.infer({"episode": 1, "seed": 5, "prompt": "x", "state": state})
            np.testing.assert_array_equal(reply["actions"], ref.act({"state": state}))
            assert reply["server_timing"]["infer_ms"] > 0
        with pytest.raises(Exception, match="401"):
            openpi.WebsocketClientPolicy(server.url, api_key="wrong")
    finally:
        server.close()


def test_vla_eval_connection_talks_to_eval_serve():
    pytest.importorskip("vla_eval")
    import anyio
    from vla_eval.connection import Connection

    from eval.request import make_policy

    server = _serve(make_policy("bc-state"), "bc-state", "vla-eval")
    state = _bc_obs()
    ref = make_policy("bc-state")
    ref.reset("insert the square", seed=2)

    async def talk():
        conn = Connection(server.url, timeout=10, max_retries=1)
        await conn.connect()
        assert conn.server_info["model"] == "bc-state"
        await conn.start_episode({"task_description": "insert the square", "seed": 2})
        out = [await conn.act({"state": state}) for _ in range(2)]
        await conn.close()
        return out

    try:
        replies = anyio.run(talk)
    finally:
        server.close()
    for reply in replies:
        np.testing.assert_array_equal(reply["actions"], ref.act({"state": state}))


# ------------------------------------------------------------------ our client talks to the protocols' servers
class _OpenpiTestServer:
    """A server behaving as openpi's ``src/openpi/serving/websocket_policy_server.py`` (openpi@15a9616), with
    openpi-client's own msgpack_numpy: metadata first, then observation -> the policy's output map plus
    ``server_timing``; a policy that raises gets the traceback as a text frame and the connection closed;
    ``GET /healthz`` answers OK. ``policy(obs) -> dict`` stands in for openpi's policy (its output transforms
    applied). ``mode`` for the faults: "sleep" (never answers), "slow" (120 ms a reply), "garbage-hello",
    "garbage". ``meta``: the metadata it sends first (openpi's server sends its policy's)."""

    def __init__(self, policy=None, mode="ok", chunk=50, meta=None):
        from openpi_client import msgpack_numpy
        from websockets.sync.server import serve

        self.seen, self.mode, self.stop = [], mode, threading.Event()
        policy = policy or _libero_stand_in(chunk)
        meta = meta or {"policy": "stand-in"}

        def handler(conn):
            if mode == "garbage-hello":
                conn.send(b"\xc1\xc1 not msgpack")
                return
            conn.send(msgpack_numpy.Packer().pack(meta))
            for message in conn:
                obs = msgpack_numpy.unpackb(message)
                self.seen.append(obs)
                if mode == "sleep":
                    self.stop.wait(60)
                    return
                if mode == "slow":  # every reply after 120 ms: 2 control steps late
                    time.sleep(0.12)
                if mode == "garbage":
                    conn.send(b"\xc1 garbage")
                    continue
                try:
                    action = policy(obs)
                except Exception:  # noqa: BLE001 - as openpi's server: the traceback, then close
                    conn.send(traceback.format_exc())
                    conn.close(code=1011, reason="Internal server error. Traceback included in previous frame.")
                    return
                action["server_timing"] = {"infer_ms": 1.0}
                conn.send(msgpack_numpy.Packer().pack(action))

        def health(conn, request):
            return conn.respond(200, "OK\n") if request.path == "/healthz" else None

        self.ws = serve(handler, "127.0.0.1", 0, compression=None, max_size=None, process_request=health)
        self.url = f"ws://127.0.0.1:{self.ws.socket.getsockname()[1]}"
        threading.Thread(target=self.ws.serve_forever, daemon=True).start()

    def close(self):
        self.stop.set()
        self.ws.shutdown()


def _libero_outputs(model_actions) -> dict:
    """openpi's LiberoOutputs (src/openpi/policies/libero_policy.py@15a9616): the first 7 of the model's 32."""
    return {"actions": np.asarray(model_actions[..., :7])}


def _libero_stand_in(chunk=50, actions=None):
    """A pi0 LIBERO policy's output: (chunk, 32) model actions (the k-th query's: k times a LIBERO delta with
    the gripper -1 = open), through LiberoOutputs; ``actions(obs)`` replaces the whole output map."""
    calls = []

    def policy(obs):
        if actions is not None:
            return actions(obs)
        calls.append(obs)
        model = np.zeros((chunk, 32), np.float32)
        model[:, :7] = np.array([0.2, -0.2, 0.1, 0, 0, 0, -1], np.float32) * len(calls)
        return _libero_outputs(model)
    return policy


def _camera_obs():
    rng = np.random.default_rng(0)
    return {"images": {"third_person": rng.integers(0, 255, (256, 256, 3), dtype=np.uint8),
                       "wrist": rng.integers(0, 255, (128, 128, 3), dtype=np.uint8)},
            "proprio": np.arange(9, dtype=np.float32), "instruction": "put the circle in its hole"}


def test_our_client_talks_to_a_server_of_openpis_protocol():
    pytest.importorskip("openpi_client")
    from eval.remote.client import RemotePolicy

    server = _OpenpiTestServer()
    try:
        policy = RemotePolicy(server.url, "openpi", "pi0-libero")
        policy.reset("put the circle in its hole", seed=0)
        actions = [policy.query(_camera_obs()) for _ in range(6)]  # 5 of each chunk of 50 are executed
        with urllib.request.urlopen(server.url.replace("ws://", "http://") + "/healthz", timeout=10) as r:
            assert r.read() == b"OK\n"
    finally:
        server.close()
    assert len(server.seen) == 2
    obs = server.seen[0]
    assert obs["observation/image"].shape == (224, 224, 3) and obs["observation/wrist_image"].shape == (224, 224, 3)
    assert obs["prompt"] == "put the circle in its hole" and obs["observation/state"].shape == (8,)
    np.testing.assert_array_equal(obs["observation/state"], [0, 0, 0, 0, 0, 0, 7, 8])  # pose unobserved, fingers
    np.testing.assert_allclose(actions[0][:3], [0.1, -0.1, 0.05], atol=1e-6)  # LIBERO 0.05 m/unit -> 0.1 m/unit
    assert actions[0][6] == 1.0  # LIBERO -1 = open -> the scene's +1 open
    np.testing.assert_allclose(actions[5][:3], [0.2, -0.2, 0.1], atol=1e-6)  # the second chunk


def test_images_are_resized_as_openpi_clients_resize_with_pad():
    image_tools = pytest.importorskip("openpi_client.image_tools")
    from eval.remote.profiles import resize_with_pad

    rng = np.random.default_rng(3)
    for shape in ((256, 256, 3), (128, 128, 3), (200, 300, 3), (224, 224, 3)):
        img = rng.integers(0, 255, shape, dtype=np.uint8)
        np.testing.assert_array_equal(resize_with_pad(img, (224, 224)), image_tools.resize_with_pad(img, 224, 224))


def test_json_numpy_arrays_are_json_numpys():
    """openvla-http's codec against the json-numpy package deploy.py patches json with."""
    json_numpy = pytest.importorskip("json_numpy", reason="json-numpy (openvla-oft's deploy.py codec) is not "
                                                          "installed: pip install -e '.[remote]'")
    from eval.remote import wire

    rng = np.random.default_rng(0)
    values = {"full_image": rng.integers(0, 255, (256, 256, 3), dtype=np.uint8),
              "state": rng.normal(size=8), "f4": rng.normal(size=(8, 7)).astype(np.float32),
              "strided": np.arange(12.0).reshape(3, 4)[:, ::2], "scalar": np.float32(0.5), "instruction": "x"}
    for a, b in ((json_numpy.loads(wire.json_numpy_dumps(values)), values),
                 (wire.json_numpy_loads(json_numpy.dumps(values).encode()), values)):
        assert set(a) == set(b) and a["instruction"] == "x"
        for k in set(values) - {"instruction"}:
            np.testing.assert_array_equal(a[k], b[k])
            assert np.asarray(a[k]).dtype == np.asarray(b[k]).dtype and np.shape(a[k]) == np.shape(b[k])


# ------------------------------------------------------------------ the servers' own code, with stub models
@contextlib.contextmanager
def _vla_eval_serving(model_server):
    """vla-eval's own serve_async (model_servers/serve.py) on loopback; yields its ws:// URL."""
    import anyio.from_thread
    from vla_eval.model_servers.serve import serve_async

    with anyio.from_thread.start_blocking_portal() as portal:
        future, port = portal.start_task(serve_async, model_server, "127.0.0.1", 0)
        try:
            yield f"ws://127.0.0.1:{port}"
        finally:
            future.cancel()


class _Command:
    """What the stub models output: the model's own "open" or "close" (set by the test before a query)."""

    def __init__(self):
        self.value = "open"
        self.seen = []


def _stub_openvla(command: _Command):
    """vla-eval's OpenVLAModelServer (model_servers/openvla.py) with its weights replaced: its predict() runs as
    it is; predict_action returns a Bridge action (bridge_orig: gripper 1 = open, 0 = close)."""
    from vla_eval.model_servers.openvla import OpenVLAModelServer
    from vla_eval.model_servers.predict import PredictModelServer

    class Inputs(dict):
        def to(self, *args, **kwargs):
            return self

    class Stub(OpenVLAModelServer):
        def __init__(self):  # no weights: the attributes OpenVLAModelServer.__init__ sets, the model a stub
            PredictModelServer.__init__(self, chunk_size=1)
            self.model_path, self.unnorm_key, self.jpeg_roundtrip, self.center_crop = "stub", "bridge_orig", False, False
            self._device = "cpu"
            self._processor = lambda prompt, image: Inputs(prompt=prompt, image=image)
            self._model = types.SimpleNamespace(predict_action=self.predict_action)

        def predict_action(self, prompt, image, **kwargs):
            command.seen.append({"prompt": prompt, "size": image.size, **kwargs})
            return np.array([0, 0, 0, 0, 0, 0, 1.0 if command.value == "open" else 0.0])

    return Stub()


def _stub_oft(command: _Command, monkeypatch, num_images_in_input=2):
    """vla-eval's OFTModelServer (model_servers/oft.py) with openvla-oft's get_vla_action replaced by a stub
    returning what it returns (experiments/robot/openvla_utils.py@213c5ff: a list of NUM_ACTIONS_CHUNK 8 raw
    actions, gripper 1 = open as the RLDS transform makes it)."""
    from vla_eval.model_servers.oft import OFTModelServer
    from vla_eval.model_servers.predict import PredictModelServer

    def get_vla_action(cfg, vla, processor, obs, task_label, action_head=None, proprio_projector=None, **kw):
        command.seen.append({"obs": obs, "task": task_label})
        return [np.array([0, 0, 0, 0, 0, 0, 1.0 if command.value == "open" else 0.0]) for _ in range(8)]

    modules = {"experiments": types.ModuleType("experiments"), "experiments.robot": types.ModuleType("robot"),
               "experiments.robot.openvla_utils": types.SimpleNamespace(get_vla_action=get_vla_action),
               "prismatic": types.ModuleType("prismatic"), "prismatic.vla": types.ModuleType("vla"),
               "prismatic.vla.constants": types.SimpleNamespace(PROPRIO_DIM=8, NUM_ACTIONS_CHUNK=8)}
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)

    class Stub(OFTModelServer):
        def __init__(self):  # OFTModelServer.__init__'s attributes, without loading a checkpoint
            PredictModelServer.__init__(self, chunk_size=10)
            self.pretrained_checkpoint, self.unnorm_key = "stub", "libero_spatial_no_noops"
            self.num_images_in_input, self.use_proprio, self.center_crop = num_images_in_input, True, True
            self._cfg = types.SimpleNamespace(num_images_in_input=num_images_in_input, use_proprio=True)
            self._vla = self._processor = self._action_head = self._proprio_projector = None

    return Stub()


class _DeployStub:
    """A server following openvla-oft's vla-scripts/deploy.py@213c5ff: JSON (json_numpy.patch()) POST /act of
    an observation map with 'instruction'; get_vla_action's checks (check_image_format: uint8 HxWx3; wrist
    images are the keys with 'wrist'; state of PROPRIO_DIM 8) and its reply, a list of NUM_ACTIONS_CHUNK 8
    actions (gripper 1 = open); any exception -> the JSON string "error". FastAPI's /openapi.json lists /act.
    ``reply(obs)`` replaces the action list."""

    def __init__(self, command: _Command | None = None, reply=None):
        import json_numpy

        self.seen = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn

            def log_message(self, *args):
                pass

            def _send(self, body: str, status=200):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/openapi.json":
                    self._send(json.dumps({"openapi": "3.1.0", "paths": {"/act": {"post": {}}}}))
                else:
                    self._send(json.dumps({"detail": "Not Found"}), 404)

            def do_POST(self):
                payload = json_numpy.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/act":
                    return self._send(json.dumps({"detail": "Not Found"}), 404)
                try:
                    instruction = payload["instruction"]
                    images = [payload["full_image"]] + [payload[k] for k in payload if "wrist" in k]
                    for img in images:
                        assert isinstance(img, np.ndarray) and img.ndim == 3 and img.shape[-1] == 3
                        assert img.dtype == np.uint8
                    assert np.asarray(payload["state"]).shape == (8,)
                    stub.seen.append({**payload, "instruction": instruction})
                    if reply is not None:
                        action = reply(payload)
                    else:
                        g = 1.0 if command is None or command.value == "open" else 0.0
                        action = [np.array([0, 0, 0, 0, 0, 0, g]) for _ in range(8)]
                    self._send(json_numpy.dumps(action))
                except Exception:  # noqa: BLE001 - deploy.py logs the traceback and answers "error"
                    self._send(json.dumps("error"))

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _octo_served(command: _Command, name: str):
    """octo (the tiny test engine) served by eval.serve, its runner a stub of Octo's output: normalised
    actions whose unnormalised gripper is Bridge's 1 = open, 0 = close (the mask leaves it as output)."""
    from engines.octo.testing import tiny_octo
    from eval.policies.octo import OctoPolicy

    engine = tiny_octo(seed=1)
    horizon, dim = engine.cfg.action_horizon, engine.cfg.action_dim

    class Runner:
        name = "stub"

        def batch_sizes(self, n):
            return list(range(1, n + 1))

        def infer(self, feeds):
            out = np.zeros((feeds["masks"].shape[0], horizon, dim), np.float32)
            out[..., 6] = 1.0 if command.value == "open" else 0.0
            return {"actions": out}

    return _serve(OctoPolicy(engine, Runner(), name=name), name, "openpi")


def _bc_state_served(command: _Command):
    """bc-state served by eval.serve, its runner a stub of the MLP (trained on the scene's actions: +1 open)."""
    from eval.policies.bc_state import BCStatePolicy

    class Runner:
        name = "stub"

        def infer(self, feeds):
            out = np.zeros((len(feeds["state"]), 7), np.float32)
            out[:, 6] = 1.0 if command.value == "open" else -1.0
            return {"action": out}

    return _serve(BCStatePolicy(Runner()), "bc-state", "vla-eval")


@contextlib.contextmanager
def _profile_server(profile: str, command: _Command, monkeypatch):
    """(url, protocol) of a server for ``profile`` running the real server code where it is installable."""
    if profile in ("octo-small", "octo-base", "bc-state"):
        if profile != "bc-state":
            pytest.importorskip("jax")
        server = _octo_served(command, profile) if profile != "bc-state" else _bc_state_served(command)
        try:
            yield server.url, server.protocol
        finally:
            server.close()
    elif profile in ("openvla-7b", "openvla-oft"):
        pytest.importorskip("vla_eval")
        stub = _stub_openvla(command) if profile == "openvla-7b" else _stub_oft(command, monkeypatch)
        with _vla_eval_serving(stub) as url:
            yield url, "vla-eval"
    elif profile == "openvla-oft-http":
        pytest.importorskip("json_numpy", reason="json-numpy (openvla-oft's deploy.py codec) is not installed: "
                                                 "pip install -e '.[remote]'")
        server = _DeployStub(command)
        try:
            yield server.url, "openvla-http"
        finally:
            server.close()
    else:  # pi0-libero, pi05-libero: openpi's wire; the model's LIBERO gripper -1 = open, +1 = close
        pytest.importorskip("openpi_client")
        chunk = {"pi0-libero": 50, "pi05-libero": 10}[profile]

        def policy(obs):
            model = np.zeros((chunk, 32), np.float32)
            model[:, 6] = -1.0 if command.value == "open" else 1.0
            return _libero_outputs(model)

        server = _OpenpiTestServer(policy)
        try:
            yield server.url, "openpi"
        finally:
            server.close()


EVALUABLE = [n for n, p in __import__("eval.remote.profiles", fromlist=["PROFILES"]).PROFILES.items()
             if p.action != "joint_velocity"]


@pytest.fixture(scope="module")
def scene_gripper():
    """``apply(action, steps) -> opening`` on one real scene (A01, state observations): the gripper's opening
    fraction after ``steps`` control steps of ``action``."""
    from env import make_env

    env = make_env("A01", obs_mode="state")
    env.reset(seed=0)

    def apply(action, steps=10):
        for _ in range(steps):
            env.step(np.asarray(action, np.float32))
        return float(env.unwrapped.task_state()["gripper_opening"][0])

    yield apply
    env.close()


@pytest.mark.parametrize("profile", EVALUABLE)
def test_the_models_open_opens_the_scenes_gripper_and_its_close_closes_it(profile, scene_gripper, monkeypatch):
    """Through the server's own code (a stub model in place of the weights) and our client: the scene's
    gripper closes when the model outputs its "close" and opens again when it outputs its "open"."""
    from eval.remote.client import RemotePolicy

    command = _Command()
    scene_actions = {}
    with _profile_server(profile, command, monkeypatch) as (url, protocol):
        for value in ("close", "open"):
            command.value = value
            policy = RemotePolicy(url, protocol, profile)
            policy.reset("put the circle in its hole", seed=0)
            obs = {"state": _bc_obs()} if profile == "bc-state" else _camera_obs()
            scene_actions[value] = policy.query(obs)
            policy.close()
    for value, action in scene_actions.items():  # the gripper only: no motion
        np.testing.assert_allclose(action[:6], 0, atol=1e-6, err_msg=f"{profile} {value}")
    closed = scene_gripper(scene_actions["close"])
    opened = scene_gripper(scene_actions["open"])
    assert closed < 0.6 and opened > 0.9, (profile, closed, opened, scene_actions)


def test_the_servers_saw_the_inputs_their_code_reads(monkeypatch):
    """What each server's own code received: vla-eval's OpenVLA server the first image and the instruction in
    its prompt; its OFT server two images and the 8-number state; deploy.py's stub its keys."""
    pytest.importorskip("vla_eval")
    from eval.remote.client import RemotePolicy

    seen = {}
    for profile in ("openvla-7b", "openvla-oft"):
        command = _Command()
        with _profile_server(profile, command, monkeypatch) as (url, protocol):
            policy = RemotePolicy(url, protocol, profile)
            policy.reset("put the circle in its hole", seed=0)
            for _ in range(3):
                policy.query(_camera_obs())
            policy.close()
        seen[profile] = command.seen
    assert len(seen["openvla-7b"]) == 3  # no chunk: a query per step
    assert seen["openvla-7b"][0]["prompt"] == "In: What action should the robot take to put the circle in its hole?\nOut:"
    assert seen["openvla-7b"][0]["size"] == (224, 224) and seen["openvla-7b"][0]["unnorm_key"] == "bridge_orig"
    (oft,) = seen["openvla-oft"]  # one model call: the server serves its chunk of 8
    assert set(oft["obs"]) == {"full_image", "wrist_image", "state"} and oft["task"] == "put the circle in its hole"
    assert oft["obs"]["full_image"].shape == (256, 256, 3) and oft["obs"]["wrist_image"].shape == (128, 128, 3)
    np.testing.assert_array_equal(oft["obs"]["state"], [0, 0, 0, 0, 0, 0, 7, 8])


def test_a_vla_eval_server_that_does_not_match_the_profile_is_refused_at_the_handshake(monkeypatch):
    """HELLO is checked: vla-eval's OFT server started with num_images_in_input=1 (its default: the wrist camera
    dropped); eval.serve's vla-eval HELLO against a foreign profile and against another model's profile."""
    pytest.importorskip("vla_eval")
    from eval.request import make_policy
    from eval.remote.client import ServerUnreachable, check_server

    with _vla_eval_serving(_stub_oft(_Command(), monkeypatch, num_images_in_input=1)) as url:
        with pytest.raises(ServerUnreachable, match="takes no wrist_image.*--args.num_images_in_input 2"):
            check_server(url, "vla-eval", "openvla-oft")
    server = _serve(make_policy("bc-state"), "bc-state", "vla-eval")
    try:
        with pytest.raises(ServerUnreachable, match="eval.serve serving 'bc-state': use --profile bc-state"):
            check_server(server.url, "vla-eval", "openvla-7b")
        with pytest.raises(ServerUnreachable, match="serves 'bc-state', not octo-small"):
            check_server(server.url, "vla-eval", "octo-small")
    finally:
        server.close()


def test_eval_serve_answers_health_probes_and_declares_its_action_spec_as_vla_eval():
    pytest.importorskip("vla_eval")
    import anyio
    from vla_eval.connection import Connection
    from vla_eval.specs import GRIPPER_CLOSE_NEG, GRIPPER_CLOSE_POS, POSITION_DELTA, DimSpec, check_specs

    from eval.request import make_policy

    server = _serve(make_policy("bc-state"), "bc-state", "vla-eval", token="tok")
    base = server.url.replace("ws://", "http://")
    try:
        with urllib.request.urlopen(base + "/healthz", timeout=10) as r:  # openpi's probe, no token needed
            assert r.status == 200 and r.read() == b"OK\n"
        with urllib.request.urlopen(base + "/health", timeout=10) as r:  # vla-eval's
            assert r.headers["Content-Type"] == "application/json" and json.loads(r.read()) == {"status": "ok"}

        async def hello():
            conn = Connection(server.url + "/?token=tok", timeout=10, max_retries=1)
            await conn.connect()
            info = conn.server_info
            await conn.close()
            return info

        info = anyio.run(hello)
    finally:
        server.close()
    spec = {k: DimSpec.from_dict(v) for k, v in info["action_spec"].items()}
    assert spec["gripper"].is_compatible(GRIPPER_CLOSE_NEG)[0] and spec["position"].is_compatible(POSITION_DELTA)[0]
    # what vla-eval's orchestrator would say to a benchmark that closes on +1 (LIBERO): the gripper differs
    warnings = check_specs(spec, {"gripper": GRIPPER_CLOSE_POS}, {}, {})
    assert warnings == ["action [gripper]: gripper: binary_close_negative vs binary_close_positive"]
    assert set(info["observation_spec"]) == {"state"}


def test_live_latency_applies_each_chunk_after_its_own_round_trip():
    pytest.importorskip("openpi_client")
    from eval.remote.client import LiveLatencyPolicy, RemotePolicy

    server = _OpenpiTestServer(mode="slow")
    try:
        policy = LiveLatencyPolicy(RemotePolicy(server.url, "openpi", "pi0-libero"))
        policy.reset("x", seed=0)
        actions = [policy.query(_camera_obs()) for _ in range(9)]
    finally:
        server.close()
    # queries at steps 0 and 5 (5 of each chunk of 50 executed); a query's chunk applies from the first control
    # step (50 ms each) after its own round trip, k + ceil(rtt / 50) - 1 (step 2 for 100-150 ms: the server
    # sleeps 120 ms; later on a loaded machine); until then the arm continues the last chunk, or holds
    rtts = [r for r, _, _ in policy.inner.remote_ms]
    assert len(rtts) == 2 and min(rtts) >= 100
    first_at, second_at = (k + math.ceil(r / 50) - 1 for k, r in zip((0, 5), rtts))
    assert 1 <= first_at < 5 <= second_at, rtts  # else this test's schedule says nothing
    hold = np.array([0, 0, 0, 0, 0, 0, 1], np.float32)
    first, second = np.array([0.1, -0.1, 0.05]), np.array([0.2, -0.2, 0.1])
    held = 0
    for step, action in enumerate(actions):
        if step >= second_at:
            np.testing.assert_allclose(action[:3], second, atol=1e-6, err_msg=f"step {step}")
        elif first_at <= step < first_at + 5:
            np.testing.assert_allclose(action[:3], first, atol=1e-6, err_msg=f"step {step}")
        else:  # before the first chunk, or the first spent before the second arrives: held, gripper open
            np.testing.assert_array_equal(action, hold, err_msg=f"step {step}")
            held += 1
    assert policy.stale_steps == held >= 1 and policy.stale_ratio() == pytest.approx(held / 9)
    fields = policy.record_fields()  # what the try's record keeps: per query round trip, server, transport
    assert fields["stale_steps"] == held and fields["stale_ratio"] == round(held / 9, 4)
    # the first query is one of the policy object's warm-up queries (its first 3 steps): kept apart
    for key, n in (("remote_warmup_ms", 1), ("remote_ms", 1)):
        rtt, server_ms, transport = (fields[key][k] for k in ("rtt_ms", "server_ms", "transport_ms"))
        assert len(rtt) == len(server_ms) == len(transport) == n and min(rtt) >= 100  # the server sleeps 120 ms
        assert all(abs(r - s - t) <= 0.01 * r for r, s, t in zip(rtt, server_ms, transport))


# ------------------------------------------------------------------ faults
def test_unreachable_server_and_bad_options_are_one_line_before_any_scene(tmp_path, capsys):
    from eval.run import main

    out = tmp_path / "run"
    for argv, needle in [
        (["--server", "ws://127.0.0.1:9", "--profile", "bc-state"], "cannot reach the model server at ws://127.0.0.1:9"),
        (["--server", "ws://127.0.0.1:9", "--profile", "nope"], "valid: octo-small, octo-base, bc-state"),
        (["--server", "ws://127.0.0.1:9", "--profile", "bc-state", "--protocol", "grpc"],
         "valid: openpi, vla-eval, openvla-http"),
        (["--server", "ws://127.0.0.1:9", "--profile", "pi05-droid"], "joint velocities"),
        (["--server", "ws://127.0.0.1:9", "--profile", "openvla-7b"], "written for vla-eval servers"),
        (["--server", "ws://127.0.0.1:9", "--profile", "openvla-oft-http", "--protocol", "openvla-http"],
         "must be a http:// or https:// URL"),
        (["--server", "http://127.0.0.1:9", "--profile", "openvla-oft-http", "--protocol", "openvla-http"],
         "cannot reach the model server at http://127.0.0.1:9"),
    ]:
        assert main(["--model", "remote", *argv, "--out", str(out)]) == 2
        # (only the run's own lines: other tests' server threads may still log while they stop)
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(err) == 1 and needle in err[0], (argv, err)
    assert not out.exists()


def test_wrong_token_garbage_and_malformed_replies_are_one_line():
    pytest.importorskip("openpi_client")
    from eval.request import make_policy
    from eval.remote.client import MalformedReply, RemotePolicy, ServerUnreachable, check_server

    server = _serve(make_policy("bc-state"), "bc-state", "vla-eval", token="tok")
    try:
        with pytest.raises(ServerUnreachable, match="refused the token"):
            check_server(server.url, "vla-eval", "bc-state", token="bad")
        check_server(server.url, "vla-eval", "bc-state", token="tok")
    finally:
        server.close()
    garbage = _OpenpiTestServer(mode="garbage-hello")
    try:
        with pytest.raises(ServerUnreachable, match="does not speak openpi"):
            check_server(garbage.url, "openpi", "pi0-libero")
    finally:
        garbage.close()
    bad = _OpenpiTestServer(mode="garbage")
    try:
        policy = RemotePolicy(bad.url, "openpi", "pi0-libero")
        policy.reset("x", seed=7)
        with pytest.raises(MalformedReply, match="malformed reply") as e:
            policy.query(_camera_obs())
        assert bad.url in str(e.value) and "\n" not in str(e.value)
    finally:
        bad.close()


BAD_REPLIES = {  # what a pi0-libero server answers, and what the one line says
    "(7, 10)": ({"actions": np.zeros((7, 10), np.float32)}, "'actions' has shape (7, 10); expected 'actions' of "
                                                             "shape (50, 7) (pi0-libero)"),
    "NaN": ({"actions": np.full((50, 7), np.nan, np.float32)}, "'actions' holds non-finite values; expected "
                                                               "'actions' of shape (50, 7) (pi0-libero), finite"),
    "no actions": ({"act": np.zeros((50, 7), np.float32)}, "has no key 'actions' (keys: act, server_timing); "
                                                           "expected 'actions' of shape (50, 7) (pi0-libero)"),
}


def test_a_reply_of_another_shape_nan_or_without_actions_stops_the_try_in_one_line(tmp_path):
    """A server of openpi's protocol answering each bad reply: the client refuses it in one line naming the server,
    the key and the shape pi0-libero's server returns; and the real command line, against one of them, stops the
    run in that line naming the try (every bad reply reaches the command line by the same MalformedReply, so one
    run checks that seam: each costs a rendered scene)."""
    pytest.importorskip("openpi_client")
    from eval.remote.client import MalformedReply, RemotePolicy

    for k, (reply, needle) in BAD_REPLIES.items():
        server = _OpenpiTestServer(_libero_stand_in(actions=lambda obs, r=reply: dict(r)))
        try:
            policy = RemotePolicy(server.url, "openpi", "pi0-libero")
            policy.reset("put the circle block into the circle hole", seed=7)
            with pytest.raises(MalformedReply) as e:
                policy.query(_camera_obs())
        finally:
            server.close()
        message = str(e.value)
        assert message.startswith(f"the reply from {server.url} (seed ") and needle in message, (k, message)
        assert "\n" not in message
    reply, needle = BAD_REPLIES["NaN"]
    server = _OpenpiTestServer(_libero_stand_in(actions=lambda obs: dict(reply)))
    try:
        error = one_remote_try_fails_in_one_line(server.url, "pi0-libero", tmp_path / "nan")
    finally:
        server.close()
    assert error.startswith(f"error: A01 try 0: the reply from {server.url} (seed ") and needle in error, error


def test_the_servers_exception_type_and_message_reach_the_error_line(monkeypatch):
    """openpi's server sends the traceback (its last line is the exception), vla-eval's an ERROR message,
    eval.serve the exception: each reaches the client's one line with its type and message."""
    pytest.importorskip("openpi_client")
    pytest.importorskip("vla_eval")
    from vla_eval.model_servers.predict import PredictModelServer

    from eval.request import make_policy
    from eval.remote.client import RemotePolicy, ServerError

    def raises(obs):
        return {"actions": obs["observation/missing"]}

    server = _OpenpiTestServer(_libero_stand_in(actions=raises))
    try:
        policy = RemotePolicy(server.url, "openpi", "pi0-libero")
        policy.reset("x", seed=1)
        with pytest.raises(ServerError, match="answered with an error: KeyError: 'observation/missing'$") as e:
            policy.query(_camera_obs())
        assert "\n" not in str(e.value)
    finally:
        server.close()

    class Failing(PredictModelServer):
        def predict(self, obs, ctx):
            raise ValueError("the image is 256x256, this model takes 224x224\nsecond line")

    with _vla_eval_serving(Failing()) as url:
        policy = RemotePolicy(url, "vla-eval", "openvla-7b")
        policy.reset("x", seed=1)
        with pytest.raises(ServerError, match="observation_failed: ValueError: the image is 256x256, this model "
                                              "takes 224x224 second line$"):
            policy.query(_camera_obs())
        policy.close()
    served = _serve(make_policy("bc-state"), "bc-state", "openpi")
    try:
        policy = RemotePolicy(served.url, "openpi", "bc-state")
        policy.reset("x", seed=1)
        with pytest.raises(ServerError, match=r"answered with an error: KeyError: '\w+'$"):  # its state misses keys
            policy.query({"state": {"bogus": np.zeros(3)}})
    finally:
        served.close()


def test_eval_run_completes_a_dev_try_against_a_stub_of_openvla_ofts_deploy_server(tmp_path):
    """``--protocol openvla-http``: the real command line against a server following deploy.py (json_numpy
    POST /act); every query carries deploy.py's keys and the try runs to its end (cut at 20 steps by
    --max-steps: three queries, the last one's actions cut short) with 8 actions a query."""
    pytest.importorskip("json_numpy", reason="json-numpy (openvla-oft's deploy.py codec) is not installed: "
                                             "pip install -e '.[remote]'")
    from eval.remote.client import ServerUnreachable, check_server

    server = _DeployStub()
    out = tmp_path / "run"
    try:
        r = subprocess.run([sys.executable, "-m", "eval.run", "--model", "remote", "--server", server.url,
                            "--protocol", "openvla-http", "--profile", "openvla-oft-http", "--split", "dev",
                            "--setups", "A01", "--tries", "1", "--max-steps", "20", "--out", str(out)], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=600)
    finally:
        server.close()
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = [json.loads(line) for line in (out / "tries.jsonl").read_text().splitlines()]
    assert rec["profile"] == "openvla-oft-http" and rec["track"] == "frozen" and rec["steps"] == 20
    assert len(server.seen) == -(-rec["steps"] // 8)  # one query per 8 steps
    first = server.seen[0]
    assert set(first) == {"full_image", "wrist_image", "state", "instruction"} and first["instruction"]
    assert first["full_image"].shape == (256, 256, 3) and first["state"].shape == (8,)
    assert len(rec["remote_ms"]["rtt_ms"]) + len(rec["remote_warmup_ms"]["rtt_ms"]) == len(server.seen)
    ws = _OpenpiTestServer()  # not an openvla-http server
    try:
        with pytest.raises(ServerUnreachable, match="does not speak openvla-http"):
            check_server(ws.url.replace("ws://", "http://"), "openvla-http", "openvla-oft-http")
    finally:
        ws.close()


def test_a_deploy_server_reply_of_another_shape_or_its_error_is_one_line():
    pytest.importorskip("json_numpy", reason="json-numpy (openvla-oft's deploy.py codec) is not installed: "
                                             "pip install -e '.[remote]'")
    from eval.remote.client import MalformedReply, RemotePolicy, ServerError

    for reply, error, needle in [
        (lambda obs: [np.zeros(7)] * 10, MalformedReply, r"shape \(10, 7\); expected 'actions' of shape \(8, 7\)"),
        (lambda obs: obs["no such key"], ServerError, 'answered "error"')]:
        server = _DeployStub(reply=reply)
        try:
            policy = RemotePolicy(server.url, "openvla-http", "openvla-oft-http")
            policy.reset("x", seed=1)
            with pytest.raises(error, match=needle) as e:
                policy.query(_camera_obs())
            assert "\n" not in str(e.value) and server.url in str(e.value)
            policy.close()
        finally:
            server.close()


def test_eval_serve_on_another_address_without_a_token_exits_in_one_line():
    """Refused before anything is loaded or bound (the test binds nothing but loopback)."""
    from eval.serve import check_exposure, is_loopback

    env = {k: v for k, v in os.environ.items() if k != "SAB_REMOTE_TOKEN"}
    r = subprocess.run([sys.executable, "-m", "eval.serve", "--model", "bc-state", "--host", "0.0.0.0", "--port", "0"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and r.stdout == "", r.stderr
    assert lines[0].startswith("error: --host 0.0.0.0 is reachable from other machines and no --token")
    assert "--insecure" in lines[0]
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert is_loopback(host), host
        check_exposure(host, None, insecure=False)
    for host in ("0.0.0.0", "", "::", "192.0.2.7"):
        assert not is_loopback(host), host
        with pytest.raises(ValueError, match="reachable from other machines"):
            check_exposure(host, None, insecure=False)
        check_exposure(host, "a token", insecure=False)
        check_exposure(host, None, insecure=True)


def test_server_killed_mid_run_is_one_line_naming_the_url():
    from eval.remote.client import RemotePolicy, ServerError

    proc = subprocess.Popen([sys.executable, "-m", "eval.serve", "--model", "bc-state", "--port", "0"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving bc-state" in line, proc.stderr.read()
        url = line.split(" on ")[1].split()[0]
        assert url.startswith("ws://127.0.0.1:")  # loopback unless --host
        policy = RemotePolicy(url, "openpi", "bc-state")
        policy.reset("x", seed=1)
        state = _bc_obs()
        policy.query({"state": state})
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        with pytest.raises(ServerError, match=f"the connection to the model server at {url} dropped"):
            policy.query({"state": state})
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_server_that_sleeps_is_flagged_policy_hang(tmp_path):
    """The real command line against a server that never answers a query: the watchdog flags the try. The
    server says it is eval.serve serving bc-state, so that the run builds a state scene (a camera scene's
    renderer costs several CPU seconds and this test checks nothing about images)."""
    pytest.importorskip("openpi_client")
    meta = {"server": "eval.serve", "model": "bc-state", "protocol": "openpi", "backend": "ort", "observes": "state",
            "track": "adapted"}  # eval.serve's metadata (eval.serve.ServedModel.metadata)
    server = _OpenpiTestServer(mode="sleep", meta=meta)
    out = tmp_path / "run"
    try:
        r = subprocess.run([sys.executable, "-m", "eval.run", "--model", "remote", "--server", server.url,
                            "--profile", "bc-state", "--setups", "A01", "--tries", "1", "--step-timeout", "2",
                            "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    finally:
        server.close()
    assert r.returncode == 3, r.stderr[-2000:]  # the runner's exit code for tries that did not finish
    assert "policy_hang 1" in r.stdout
    records = [json.loads(line) for line in (out / "tries.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["flags"] == ["policy_hang"] and not records[0]["success"]


def test_eval_serve_refuses_scripted_in_one_line():
    from eval.serve import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert main(["--model", "scripted", "--port", "0"]) == 2


def test_a_served_try_keeps_its_round_trips_in_its_record():
    from eval.request import make_policy
    from eval.remote.client import RemotePolicy

    server = _serve(make_policy("bc-state"), "bc-state", "openpi")
    scenes = Scenes(get_setup("A01"), 1, max_steps=6)
    try:
        policy = RemotePolicy(server.url, "openpi", "bc-state")
        (record,), _ = rollout(scenes, [policy], "dev", [0])
    finally:
        scenes.close()
        server.close()
    times, warm = record.to_json()["remote_ms"], record.to_json()["remote_warmup_ms"]
    assert record.steps == 6 and len(warm["rtt_ms"]) == policy.warmup_queries == 3  # the object's first queries
    for t, n in ((times, 3), (warm, 3)):
        assert len(t["rtt_ms"]) == len(t["server_ms"]) == len(t["transport_ms"]) == n
        assert all(r >= s > 0 for r, s in zip(t["rtt_ms"], t["server_ms"]))
    from eval.report.markdown import render_markdown
    from eval.report.summary import build_summary

    summary = build_summary([record.to_json()], model="remote")
    served = summary["served"]  # what summary.json and REPORT.md show
    assert served["queries"] == 3 and served["warmup_queries"] == 3
    assert served["rtt_ms"]["p50"] >= served["server_ms"]["p50"] > 0
    share = sum(times["transport_ms"]) / (sum(times["transport_ms"]) + sum(times["server_ms"]))
    assert served["transport_share_of_rtt"] == pytest.approx(share) and 0 < share < 1
    assert served["stale_ratio"] is None  # no --live-latency
    report = render_markdown({"remote": summary})
    assert (f"served model, 3 queries (3 warm-up queries apart): round trip p50 {served['rtt_ms']['p50']:.1f} ms"
            in report) and f"{100 * share:.1f}% of the round-trip time" in report


def test_a_served_runs_token_is_written_to_no_file_of_the_run_or_the_site(tmp_path):
    """The real command lines: eval.serve with a token, eval.run given it by flag and by $SAB_REMOTE_TOKEN, then
    eval.site over both folders; the token's bytes are in none of the files written. The served bc-state is
    recorded on its profile's track (adapted) and the run renders no camera for it."""
    token = "tok-3f9c1d7e-never-written"
    proc = subprocess.Popen([sys.executable, "-m", "eval.serve", "--model", "bc-state", "--port", "0",
                             "--token", token], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = {"flag": tmp_path / "by_flag", "env": tmp_path / "by_env"}
    try:
        line = proc.stdout.readline()
        assert "serving bc-state" in line, proc.stderr.read()
        url = line.split(" on ")[1].split()[0]
        common = ["--model", "remote", "--server", url, "--profile", "bc-state", "--split", "dev", "--setups", "A01",
                  "--tries", "1", "--max-steps", "10"]
        for how, out in runs.items():
            env = dict(os.environ, SAB_REMOTE_TOKEN=token) if how == "env" else dict(os.environ)
            if how == "flag":
                env.pop("SAB_REMOTE_TOKEN", None)
            args = common + (["--token", token] if how == "flag" else []) + ["--out", str(out)]
            r = subprocess.run([sys.executable, "-m", "eval.run", *args], cwd=REPO_ROOT, capture_output=True,
                               text=True, timeout=600, env=env)
            assert r.returncode == 0, r.stderr[-2000:]
            assert token not in r.stdout + r.stderr
    finally:
        proc.kill()
        proc.wait(10)
    for out in runs.values():  # the profile's track, and no camera rendered for a state model (eval.request)
        (rec,) = [json.loads(line) for line in (out / "tries.jsonl").read_text().splitlines()]
        assert rec["track"] == "adapted" and rec["profile"] == "bc-state" and rec["step_ms"]["render"] == 0
    assert json.loads((runs["flag"] / "run.json").read_text())["credentials"] == {"token": "set (from --token)"}
    assert json.loads((runs["env"] / "run.json").read_text())["credentials"] == {"token": "set (from $SAB_REMOTE_TOKEN)"}
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "eval.site", "--runs", *map(str, runs.values()), "--out", str(site),
                        "--n-boot", "50"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    written = [p for root in (*runs.values(), site) for p in root.rglob("*") if p.is_file()]
    assert len(written) > 10 and any(p.name == "index.html" for p in written)
    leaked = [str(p) for p in written if token.encode() in p.read_bytes()]
    assert not leaked, leaked


def test_readme_quotes_the_profile_table_and_every_convention_names_its_source():
    from eval.remote.profiles import CONVENTIONS, PROFILES, markdown_table

    assert markdown_table() in (REPO_ROOT / "docs" / "servers.md").read_text()  # python -m eval.remote.profiles prints it
    for p in PROFILES.values():
        if not p.native:
            assert [c for c in CONVENTIONS if not p.sources.get(c)] == [], p.name
            assert all("@" in src or src.startswith("vla-eval 0.8.0") for src in p.sources.values()), p.name


def test_readmes_remote_latency_numbers_are_the_committed_benchmarks():
    """Every number of docs/servers.md's remote latency paragraph, from results/benchmarks/remote_latency.json, with its
    machine and whether it was loaded."""
    doc = json.loads((REPO_ROOT / "results" / "benchmarks" / "remote_latency.json").read_text())
    text = " ".join((REPO_ROOT / "docs" / "servers.md").read_text().split())
    start = text.index("Measured on loopback by `python -m benchmarks.remote_latency")
    para = text[start:text.index("The transport includes packing", start)]
    rows = {(r["model"], r["protocol"], r["batch"]): r for r in doc["results"]["rows"]}
    o1, o8 = rows[("octo-small", "openpi", 1)], rows[("octo-small", "openpi", 8)]
    b1, b2 = rows[("bc-state", "openpi", 1)], rows[("bc-state", "vla-eval", 1)]
    m = doc["machine"]
    cpu = "AMD EPYC" if "EPYC" in m["cpu"] else "Intel Xeon" if "Xeon" in m["cpu"] else m["cpu"]
    state = doc["results"]["conditions"].split()[0]
    expected = [
        f"`{doc['command'].replace(' --no-progress', '')}`",
        f"{cpu}, {m['cores']} cores, **{state}** at the start by its 1-minute load average "
        f"({m['load_average_start'][0]:g}; {m['load_average_end'][0]:g} at the end",
        f"round trip p50 {o1['rtt_ms']['p50']:,.0f} ms, server compute {o1['server_ms']['p50']:,.0f} ms",
        f"transport p50 {o1['transport_ms']['p50']:.1f} ms / p99 {o1['transport_ms']['p99']:.1f} ms "
        f"({100 * o1['transport_share_of_compute_p50']:.2f}% of the compute; target <= 5%)",
        f"compute {o8['server_ms']['p50']:,.0f} ms, transport p50 {o8['transport_ms']['p50']:.1f} ms "
        f"({100 * o8['transport_share_of_compute_p50']:.2f}%)",
        f"computes in {b1['server_ms']['p50']:.2f} ms (openpi) / {b2['server_ms']['p50']:.2f} ms (vla-eval) p50",
        f"its transport is {b1['transport_ms']['p50']:.2f} / {b2['transport_ms']['p50']:.2f} ms p50: "
        f"{100 * b1['transport_share_of_rtt']:.0f}% / {100 * b2['transport_share_of_rtt']:.0f}% of the round-trip time",
    ]
    assert [e for e in expected if e not in para] == []
    assert not doc["quick"] and state in ("quiet", "loaded")
