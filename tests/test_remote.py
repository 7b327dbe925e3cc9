"""Remote policies (eval.remote, eval.serve), on loopback only, with the real openpi-client and vla-eval
packages: a served engine gives the records of the in-process one; each protocol's reference client talks to
eval.serve and our client talks to servers built from each protocol's reference code; faults are one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from env.setups import get_setup
from eval.rollout import Scenes, make_members, rollout
from tests.conftest import REPO_ROOT

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
    lat = members[0].remote_latency()  # one server call per step for both scenes, timed at both ends
    assert len(lat["rtt_ms"]) == len(lat["server_ms"]) == max(r.steps for r in remote)
    assert all(t >= 0 for t in lat["transport_ms"]) and remote[0].weights_sha256 == local[0].weights_sha256


def test_served_octo_gives_the_in_process_actions_over_vla_eval_batched():
    """Octo (the tiny test engine) on synthetic frames, two scenes of different seeds queried as a batch: the
    same actions step by step, one server call per model query, frames of chunk steps sent with the next."""
    pytest.importorskip("jax")
    from engines.octo.testing import tiny_engine
    from eval.request import make_policy
    from eval.policies.base import query_members
    from eval.remote.client import RemotePolicy

    policy = make_policy("octo-small", engine=tiny_engine(seed=1))  # one runner, compiled once, for both sides
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
    assert len(lead.remote_latency()["rtt_ms"]) == 3 and lead.note == policy.note


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
    """A server written from openpi's protocol with openpi-client's own msgpack_numpy: metadata first, then
    observation -> {"actions": chunk}. ``mode``: "ok", "sleep" (never answers), "garbage", "missing", "nan"."""

    def __init__(self, mode="ok", chunk=10):
        from openpi_client import msgpack_numpy
        from websockets.sync.server import serve

        self.seen, self.mode, self.stop = [], mode, threading.Event()

        def handler(conn):
            if mode == "garbage-hello":
                conn.send(b"\xc1\xc1 not msgpack")
                return
            conn.send(msgpack_numpy.packb({"policy": "stand-in"}))
            for message in conn:
                obs = msgpack_numpy.unpackb(message)
                self.seen.append(obs)
                if mode == "sleep":
                    self.stop.wait(60)
                    return
                if mode == "slow":  # every reply after 120 ms: 2 control steps late
                    time.sleep(0.12)
                k = len(self.seen)
                actions = np.tile(np.array([0.2, -0.2, 0.1, 0, 0, 0, -1], np.float32), (chunk, 1)) * k
                reply = {"missing": {"act": actions}, "nan": {"actions": actions * np.nan},
                         "garbage": None}.get(mode, {"actions": actions, "server_timing": {"infer_ms": 1.0}})
                conn.send(b"\xc1 garbage" if reply is None else msgpack_numpy.packb(reply))

        self.ws = serve(handler, "127.0.0.1", 0, compression=None, max_size=None)
        self.url = f"ws://127.0.0.1:{self.ws.socket.getsockname()[1]}"
        threading.Thread(target=self.ws.serve_forever, daemon=True).start()

    def close(self):
        self.stop.set()
        self.ws.shutdown()


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
        actions = [policy.query(_camera_obs()) for _ in range(6)]  # 5 of each chunk of 10 are executed
    finally:
        server.close()
    assert len(server.seen) == 2
    obs = server.seen[0]
    assert obs["observation/image"].shape == (224, 224, 3) and obs["observation/wrist_image"].shape == (224, 224, 3)
    assert obs["prompt"] == "put the circle in its hole" and obs["observation/state"].shape == (8,)
    np.testing.assert_allclose(actions[0][:3], [0.1, -0.1, 0.05], atol=1e-6)  # LIBERO 0.05 m/unit -> 0.1 m/unit
    assert actions[0][6] == 1.0  # LIBERO -1 = open -> the scene's +1 open
    np.testing.assert_allclose(actions[5][:3], [0.2, -0.2, 0.1], atol=1e-6)  # the second chunk


def test_our_client_talks_to_a_vla_eval_model_server_base_class():
    pytest.importorskip("vla_eval")
    import anyio
    from vla_eval.model_servers.predict import PredictModelServer
    from vla_eval.model_servers.serve import serve_async

    from eval.remote.client import RemotePolicy

    class StandIn(PredictModelServer):
        def __init__(self):
            super().__init__(chunk_size=8)
            self.obs, self.episodes = [], []

        async def on_episode_start(self, config, ctx):
            self.episodes.append(config)
            await super().on_episode_start(config, ctx)

        def predict(self, obs, ctx):
            self.obs.append(obs)
            return {"actions": np.tile(np.array([0.4, 0, -0.2, 0, 0, 0, 1], np.float32), (8, 1))}

    model = StandIn()
    port = []
    started = threading.Event()

    async def main():
        async with anyio.create_task_group() as tg:
            port.append(await tg.start(serve_async, model, "127.0.0.1", 0))
            started.set()

    threading.Thread(target=anyio.run, args=(main,), daemon=True).start()
    assert started.wait(20)
    policy = RemotePolicy(f"ws://127.0.0.1:{port[0]}", "vla-eval", "openvla-oft")
    policy.reset("put the square in its hole", seed=3)
    actions = [policy.query(_camera_obs()) for _ in range(3)]
    policy.close()
    assert model.episodes[0]["task_description"] == "put the square in its hole"
    assert len(model.obs) == 1 and set(model.obs[0]["images"]) == {"agentview", "wrist"}  # served from its chunk
    assert model.obs[0]["state"].shape == (8,)
    np.testing.assert_allclose(actions[2], [0.2, 0, -0.1, 0, 0, 0, -1], atol=1e-6)  # +1 = close in LIBERO


def test_live_latency_applies_each_chunk_after_its_own_round_trip():
    pytest.importorskip("openpi_client")
    from eval.remote.client import LiveLatencyPolicy, RemotePolicy

    server = _OpenpiTestServer("slow")
    try:
        policy = LiveLatencyPolicy(RemotePolicy(server.url, "openpi", "pi0-libero"))
        policy.reset("x", seed=0)
        actions = [policy.query(_camera_obs()) for _ in range(9)]
    finally:
        server.close()
    # queries at steps 0 and 5 (5 of each chunk of 10), each ~120 ms: chunk 1 applies from step 2, chunk 2 from
    # step 7; steps 0-1 hold, steps 5-6 continue chunk 1
    hold = np.array([0, 0, 0, 0, 0, 0, 1], np.float32)
    first, second = np.array([0.1, -0.1, 0.05]), np.array([0.2, -0.2, 0.1])
    for step in (0, 1):
        np.testing.assert_array_equal(actions[step], hold)
    for step in (2, 3, 4, 5, 6):
        np.testing.assert_allclose(actions[step][:3], first, atol=1e-6)
    for step in (7, 8):
        np.testing.assert_allclose(actions[step][:3], second, atol=1e-6)
    assert policy.stale_steps == 2 and policy.stale_ratio() == pytest.approx(2 / 9)
    fields = policy.record_fields()  # what the try's record keeps: per query round trip, server, transport
    assert fields["stale_steps"] == 2 and fields["stale_ratio"] == round(2 / 9, 4)
    rtt, server_ms, transport = (fields["remote_ms"][k] for k in ("rtt_ms", "server_ms", "transport_ms"))
    assert len(rtt) == len(server_ms) == len(transport) == 2 and min(rtt) >= 100  # the server sleeps 120 ms
    assert all(abs(r - s - t) <= 0.01 * r for r, s, t in zip(rtt, server_ms, transport))


# ------------------------------------------------------------------ faults
def test_unreachable_server_and_bad_options_are_one_line_before_any_scene(tmp_path, capsys):
    from eval.run import main

    out = tmp_path / "run"
    for argv, needle in [
        (["--server", "ws://127.0.0.1:9", "--profile", "bc-state"], "cannot reach the model server at ws://127.0.0.1:9"),
        (["--server", "ws://127.0.0.1:9", "--profile", "nope"], "valid: octo-small, octo-base, bc-state"),
        (["--server", "ws://127.0.0.1:9", "--profile", "bc-state", "--protocol", "grpc"], "valid: openpi, vla-eval"),
        (["--server", "ws://127.0.0.1:9", "--profile", "pi05-droid"], "joint velocities"),
    ]:
        assert main(["--model", "remote", *argv, "--out", str(out)]) == 2
        # (only the run's own lines: other tests' server threads may still log while they stop)
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(err) == 1 and needle in err[0]
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
    garbage = _OpenpiTestServer("garbage-hello")
    try:
        with pytest.raises(ServerUnreachable, match="does not speak openpi"):
            check_server(garbage.url, "openpi", "pi0-libero")
    finally:
        garbage.close()
    for mode, needle in [("missing", "no key 'actions'"), ("nan", "'actions' holds non-finite"),
                         ("garbage", "malformed reply")]:
        bad = _OpenpiTestServer(mode)
        try:
            policy = RemotePolicy(bad.url, "openpi", "pi0-libero")
            policy.reset("x", seed=7)
            with pytest.raises(MalformedReply, match=needle) as e:
                policy.query(_camera_obs())
            assert bad.url in str(e.value) and "\n" not in str(e.value)
        finally:
            bad.close()


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
    pytest.importorskip("openpi_client")
    server = _OpenpiTestServer("sleep")
    out = tmp_path / "run"
    try:
        r = subprocess.run([sys.executable, "-m", "eval.run", "--model", "remote", "--server", server.url,
                            "--profile", "pi0-libero", "--setups", "A01", "--tries", "1", "--step-timeout", "2",
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
    scenes = Scenes(get_setup("A01"), 1, max_steps=4)
    try:
        policy = RemotePolicy(server.url, "openpi", "bc-state")
        (record,), _ = rollout(scenes, [policy], "dev", [0])
    finally:
        scenes.close()
        server.close()
    times = record.to_json()["remote_ms"]
    assert len(times["rtt_ms"]) == len(times["server_ms"]) == len(times["transport_ms"]) == record.steps == 4
    assert all(r >= s > 0 for r, s in zip(times["rtt_ms"], times["server_ms"]))
    from eval.report.summary import build_summary

    served = build_summary([record.to_json()], model="remote")["served"]  # what summary.json and REPORT.md show
    assert served["queries"] == 4 and served["rtt_ms"]["p50"] >= served["server_ms"]["p50"] > 0
    assert served["stale_ratio"] is None  # no --live-latency


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
                  "--tries", "1"]
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
