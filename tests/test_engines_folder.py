"""The engines folder (engines.folder): `make engines` writes everything a run needs into one folder, and a run on
ONNX Runtime or TensorRT reads it alone: no JAX, no checkpoint, no export, no engine build; a missing, stale or
foreign file is one line naming it and the command that rebuilds it.

One folder is built for the module (octo-small with seeded random weights, and bc-state), by the real
`python -m engines.build` argv; tests that change a file work on a copy whose unchanged files are links to it.
bc-camera's tests build folders of their own, from a seeded random weights file (not the trained one).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("jax")

from engines import folder as engines_folder  # noqa: E402
from engines.folder import EnginesFolderError  # noqa: E402
from env.instructions import all_instructions  # noqa: E402
from tests.conftest import REPO_ROOT  # noqa: E402

pytestmark = pytest.mark.slow

# imports a run on ort/trt must not make: the Jetson image has none of them (Dockerfile.l4t)
BLOCKER = '''
import sys
class _NoJax:
    BLOCKED = ("jax", "jaxlib", "flax", "jax2onnx", "orbax")
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.BLOCKED:
            raise ImportError(f"No module named {name!r} (the Jetson image has no JAX)")
        return None
sys.meta_path.insert(0, _NoJax())
'''


def _no_jax_env(tmp_path: Path) -> dict:
    site = tmp_path / "nojax"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO_ROOT}"}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("engines")
    proc = subprocess.run([sys.executable, "-m", "engines.build", "--models", "octo-small,bc-state", "--random-weights",
                           "--ort-precisions", "fp32", "--out", str(out)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def _copy(src: Path, dst: Path, real: tuple[str, ...] = ()) -> Path:
    """The folder ``src`` at ``dst``: links to its files, but real copies of ``real`` (to be changed)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file():
            (shutil.copy2 if f.name in real or f.name == engines_folder.MANIFEST else os.link)(f, dst / f.name)
    return dst


def _entry(folder: Path, model: str = "octo-small") -> dict:
    return json.loads((folder / engines_folder.MANIFEST).read_text())["models"][model]


def test_make_engines_writes_one_self_contained_folder(built):
    manifest = json.loads((built / engines_folder.MANIFEST).read_text())
    assert manifest["format"] == engines_folder.FORMAT and set(manifest["models"]) == {"octo-small", "bc-state"}
    octo = manifest["models"]["octo-small"]
    for name, sha in octo["files"].items():
        assert engines_folder.sha256_file(built / name) == sha, name
    assert set(octo["graphs"]) == {"backbone", "sampler", "backbone_ort", "sampler_ort"}
    assert set(octo["graphs"].values()) | {octo["statistics"], octo["embeddings"]} == set(octo["files"])
    assert octo["random_weights"] is True and octo["weights"] is None and octo["source"].startswith("random-weights")
    from engines.octo.deployed import DeployedOcto

    model = DeployedOcto.load(built, "octo-small")
    assert set(model.instructions) == set(all_instructions())  # every instruction of every task list
    assert model.cfg.name == "octo-small" and model.note and model.statistics()["mean"]
    assert manifest["models"]["bc-state"]["graphs"] == {"model": "bc_state.onnx"}


def test_a_run_from_the_folder_imports_no_jax(built, tmp_path):
    """The run path on ort: the policy built as eval.run's workers build it, from the folder, queried; JAX,
    jaxlib, flax, jax2onnx and orbax cannot be imported in that process (the Jetson image's situation)."""
    code = f"""
import sys
import numpy as np
from eval.request import resolve_model
m = resolve_model("octo-small", {{"backend": "ort", "engines": {str(built)!r}, "random_weights": True}})
policy = m.policy()
policy.reset("put the square block into the square hole", seed=3)
rng = np.random.default_rng(0)
for _ in range(5):
    obs = {{"images": {{"third_person": rng.integers(0, 255, (256, 256, 3), dtype=np.uint8),
                      "wrist": rng.integers(0, 255, (128, 128, 3), dtype=np.uint8)}}}}
    action = policy.query(obs)
assert np.isfinite(action).all() and action.shape == (7,)
print("weights", m.config.weights(), "backend", m.backend, "queries", policy.model_queries)
print("imported", sorted(n for n in sys.modules if n.split(".")[0] in ("jax", "jaxlib", "flax")))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=_no_jax_env(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "backend ort" in proc.stdout and "queries 2" in proc.stdout and "imported []" in proc.stdout


def test_the_folder_policy_feeds_what_the_checkpoint_policy_feeds(built):
    """Equal seeds, equal queries: the folder's policy (NumPy draws, make engines' embeddings) and the policy of the
    loaded model (JAX draws, T5 in JAX) feed the same images, masks and embedding bit for bit and noise within
    engines.octo.prng's bound (tests/test_prng.py); on the same feeds the folder's graphs answer as the loaded
    model's graphs would: they hold the same weights."""
    from engines.octo.octo_model import OctoModel
    from eval.request import make_policy

    folder_policy = make_policy("octo-small", backend="ort", engines=str(built), random_weights=True)
    loaded = OctoModel.load("octo-small", random_weights=True, seed=0)
    loaded_policy = make_policy("octo-small", backend="ort", engine=loaded)
    rng = np.random.default_rng(5)
    instruction = all_instructions()[1]
    for p in (folder_policy, loaded_policy):
        p.reset(instruction, seed=11)
    for step in range(5):
        obs = {"images": {"third_person": rng.integers(0, 255, (256, 256, 3), dtype=np.uint8),
                          "wrist": rng.integers(0, 255, (128, 128, 3), dtype=np.uint8)}}
        a, b = folder_policy.encode(obs), loaded_policy.encode(obs)
        assert (a is None) == (b is None)
        if a is None:
            folder_policy.decode(None, 0), loaded_policy.decode(None, 0)
            continue
        assert set(a) == set(b)
        for k in a:
            if k.endswith("noise"):
                np.testing.assert_allclose(a[k], b[k], rtol=0, atol=64 * np.finfo(np.float32).eps * 4)
            else:
                assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k
        out = folder_policy.runner.infer(a)
        folder_policy.decode(out, 0), loaded_policy.decode(out, 0)
    from engines.octo.export import params_digest
    from engines.onnx_utils import metadata

    for part in ("backbone", "sampler"):  # the graphs hold the loaded model's weights
        assert metadata(folder_policy.engine.graph(part))["params_sha256"] == params_digest(loaded.params)


@pytest.mark.parametrize("case", ["no manifest", "other weights", "truncated graph", "embeddings of another t5",
                                  "unknown instruction"])
def test_a_bad_folder_is_one_line_naming_the_file_and_the_command(built, tmp_path, case):
    from engines.octo.deployed import DeployedOcto, read_embeddings, text_key, write_embeddings
    from engines.octo.errors import OctoError
    from eval.request import resolve_model

    entry = _entry(built)
    options = {"backend": "ort", "random_weights": True}
    folder = _copy(built, tmp_path / "engines", real=(entry["graphs"]["backbone_ort"], entry["embeddings"]))
    want: tuple[str, ...] = ()
    if case == "no manifest":
        (folder / engines_folder.MANIFEST).unlink()
        want = ("manifest.json does not exist", f"--out {folder}")
    elif case == "other weights":
        options = {"backend": "ort"}
        want = ("holds octo-small with random weights", "asks for trained weights", "python -m engines.build")
    elif case == "truncated graph":
        graph = folder / entry["graphs"]["backbone_ort"]
        with open(graph, "r+b") as f:
            f.truncate(graph.stat().st_size // 2)
        want = (str(graph), "truncated or replaced", "python -m engines.build --models octo-small")
    elif case == "embeddings of another t5":
        emb = folder / entry["embeddings"]
        meta, arrays = read_embeddings(emb)
        write_embeddings(emb, {t: arrays[text_key(t)] for t in meta["texts"]}, "0" * 64)
        manifest = json.loads((folder / engines_folder.MANIFEST).read_text())  # listed as it is now: only the T5 differs
        manifest["models"]["octo-small"]["files"][emb.name] = engines_folder.sha256_file(emb)
        (folder / engines_folder.MANIFEST).write_text(json.dumps(manifest))
        want = (str(emb), "embeddings of another T5", "python -m engines.build")
    if case == "unknown instruction":
        model = DeployedOcto.load(folder, "octo-small")
        with pytest.raises(OctoError) as e:
            model.embed("stack the triangle on the circle")
        want = ("'stack the triangle on the circle'", "--instruction", f"--out {folder}")
    else:
        with pytest.raises((EnginesFolderError, OctoError, ValueError)) as e:
            m = resolve_model("octo-small", {**options, "engines": str(folder)})
            m.policy()
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in want), msg


def test_onnx_from_takes_a_folder_made_elsewhere_without_jax(built, tmp_path):
    """A Jetson (JetPack 6: no JAX): `engines.build --onnx-from DIR` takes the folder exported on another machine,
    checks every file, copies it into --out and would build TensorRT engines there (skipped here with the
    reason); the copy runs as the original does."""
    out = tmp_path / "jetson"
    proc = subprocess.run([sys.executable, "-m", "engines.build", "--models", "octo-small", "--onnx-from", str(built),
                           "--ort-precisions", "fp32", "--out", str(out)], cwd=REPO_ROOT, env=_no_jax_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "exported elsewhere" in proc.stdout and "random weights" in proc.stdout
    assert _entry(out)["files"] == _entry(built)["files"]
    from engines.octo.deployed import DeployedOcto

    assert DeployedOcto.load(out, "octo-small").instructions == DeployedOcto.load(built, "octo-small").instructions
    bad = _copy(built, tmp_path / "bad", real=(_entry(built)["graphs"]["sampler"],))
    (bad / _entry(built)["graphs"]["sampler"]).write_bytes(b"not a graph")
    proc = subprocess.run([sys.executable, "-m", "engines.build", "--models", "octo-small", "--onnx-from", str(bad),
                           "--ort-precisions", "fp32", "--out", str(tmp_path / "out2")], cwd=REPO_ROOT,
                          env=_no_jax_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "octo_small_sampler.onnx" in proc.stdout and "truncated or replaced" in proc.stdout


def test_fake_tensorrt_make_engines_then_the_run_builds_nothing(built, tmp_path, monkeypatch):
    """TensorRT (faked): make engines builds each graph's engine once, for the batch profile a run uses, and lists
    it in the manifest; the run finds those engines by their key and builds none; an engine of another GPU or
    TensorRT version is one line naming the command that rebuilds it."""
    from engines import build, trt
    from engines.backends import MODEL_RUNTIMES
    from eval.request import resolve_model
    from tests import fake_trt

    fakes = fake_trt.install(monkeypatch, major=10)
    out = tmp_path / "engines"
    rc = build.main(["--models", "octo-small", "--onnx-from", str(built), "--precisions", "fp16", "--ort-precisions",
                     "fp32", "--out", str(out)])
    assert rc == 0 and fakes.trt.state.builds == 2  # backbone and sampler
    engines = _entry(out)["tensorrt"]
    assert len(engines) == 2 and all(k["batch_max"] == MODEL_RUNTIMES["octo"].trt_batch_max for k in engines.values())

    def no_build(*a, **k):
        raise AssertionError("a run built a TensorRT engine")

    monkeypatch.setattr(trt, "build_engine", no_build)
    options = {"backend": "trt", "engines": str(out), "random_weights": True}
    policy = resolve_model("octo-small", options, device_default=True).policy()
    assert policy.backend == "trt" and policy.runner.backbone.engine_path.parent == out
    assert fakes.trt.state.builds == 2
    monkeypatch.setattr(trt, "gpu_identity", lambda: ("Another GPU", "8.9"))
    with pytest.raises(trt.EngineMismatchError) as e:
        resolve_model("octo-small", options).policy()
    msg = str(e.value)
    assert "\n" not in msg and "Another GPU" in msg and f"python -m engines.build --models octo-small --out {out}" in msg


def test_an_instruction_is_added_by_the_build_and_nothing_else_is_redone(built, tmp_path):
    folder = _copy(built, tmp_path / "engines")
    before = _entry(folder)
    proc = subprocess.run([sys.executable, "-m", "engines.build", "--models", "octo-small", "--random-weights",
                           "--ort-precisions", "fp32", "--out", str(folder), "--instruction", "stack the blocks"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "(unchanged)" in proc.stdout
    after = _entry(folder)
    changed = {n for n in after["files"] if after["files"][n] != before["files"].get(n)}
    assert changed == {after["embeddings"]}
    from engines.octo.deployed import DeployedOcto

    model = DeployedOcto.load(folder, "octo-small")
    assert "stack the blocks" in model.instructions and model.embed("stack the blocks").shape == (16, 768)


def test_a_build_with_nothing_changed_loads_no_model(built, tmp_path):
    """make engines again on the same weights takes Octo's entry as it stands (every file untouched since it was
    hashed): no JAX, no model loaded, no graph read; what a build would remake differently is built as usual."""
    from types import SimpleNamespace

    from engines.build import _unchanged_octo_entry

    folder = _copy(built, tmp_path / "engines")
    before = _entry(folder)
    proc = subprocess.run([sys.executable, "-m", "engines.build", "--models", "octo-small", "--random-weights",
                           "--ort-precisions", "fp32", "--out", str(folder)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300, env=_no_jax_env(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("(unchanged)") == 2 and _entry(folder)["files"] == before["files"]

    def args(**kw):
        return SimpleNamespace(**{"octo_weights": {}, "seed": 0, "instruction": None, **kw})

    assert _unchanged_octo_entry("octo-small", folder, args()) is not None
    assert _unchanged_octo_entry("octo-small", folder, args(seed=1)) is None  # other random weights
    assert _unchanged_octo_entry("octo-small", folder, args(instruction=["stack the blocks"])) is None  # to embed
    checkpoint = SimpleNamespace(checkpoint=SimpleNamespace(digest="0" * 64, to_json=lambda: {}))
    assert _unchanged_octo_entry("octo-small", folder, args(octo_weights={"octo-small": checkpoint})) is None
    touched = _copy(built, tmp_path / "touched", real=(before["statistics"],))
    st = (touched / before["statistics"]).stat()
    os.utime(touched / before["statistics"], ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # changed since hashed
    assert _unchanged_octo_entry("octo-small", touched, args()) is None


def test_eval_serve_runs_octo_from_the_folder_without_jax(built, tmp_path):
    """The real `eval.serve` argv in a process where JAX cannot be imported, serving from the folder; a client of
    this project's remote policy resets it with a task's instruction and gets actions."""
    import re
    import time

    from eval.remote.client import RemotePolicy

    proc = subprocess.Popen([sys.executable, "-m", "eval.serve", "--model", "octo-small", "--backend", "ort",
                             "--engines", str(built), "--random-weights", "--protocol", "openpi", "--port", "0"],
                            cwd=REPO_ROOT, env=_no_jax_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        url, seen, t0 = None, [], time.monotonic()
        while url is None and time.monotonic() - t0 < 240:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            m = re.search(r"on (ws://127\.0\.0\.1:\d+)", line)
            url = m.group(1) if m else None
        assert url, "".join(seen)[-3000:]
        client = RemotePolicy(url, "openpi", "octo-small")
        client.reset(all_instructions()[0], seed=2)
        rng = np.random.default_rng(1)
        for _ in range(2):
            action = client.query({"images": {"third_person": rng.integers(0, 255, (256, 256, 3), dtype=np.uint8),
                                              "wrist": rng.integers(0, 255, (128, 128, 3), dtype=np.uint8)},
                                   "proprio": np.zeros(9, np.float32)})
            assert np.isfinite(action).all() and action.shape == (7,)
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_build_hashes_each_file_once_and_a_run_every_time(tmp_path):
    """Inside env.cache.hashes_remembered (a build), a file untouched since it was hashed is not read again; a file
    changed since, or modified within the last second (racily clean, as git says), is; outside (a run), every
    call reads the file."""
    from env import cache

    path = tmp_path / "graph.onnx"
    path.write_bytes(b"a" * 1000)
    old = time.time_ns() - 5_000_000_000
    os.utime(path, ns=(old, old))
    first = cache.sha256_file(path)
    with cache.hashes_remembered():
        assert cache.sha256_file(path) == first
        with open(path, "r+b") as f:  # the same size and timestamp, other bytes: only a remembered hash misses it
            f.write(b"b")
        os.utime(path, ns=(old, old))
        assert cache.sha256_file(path) == first
        os.utime(path, ns=(old + 1, old + 1))  # changed since: read again
        assert cache.sha256_file(path) != first
        fresh, now = tmp_path / "fresh.onnx", time.time_ns()
        fresh.write_bytes(b"c")
        os.utime(fresh, ns=(now, now))
        h = cache.sha256_file(fresh)
        fresh.write_bytes(b"d")  # the same size and timestamp, within the second: not trusted
        os.utime(fresh, ns=(now, now))
        assert cache.sha256_file(fresh) != h
    os.utime(path, ns=(old, old))
    assert cache.sha256_file(path) != first  # outside: the file as it is


# ------------------------------------------------------------------ bc-camera: a weights-file model in the folder
def _bc_camera_build(out: Path, *args: str) -> tuple[int, Path]:
    """make engines' export of bc-camera into ``out`` from a seeded random weights file (the trained file ships
    later), through the real ``engines.build.main``; (exit status, the weights file)."""
    torch = pytest.importorskip("torch")
    from engines import bc_camera, build

    weights = out.parent / "weights" / "bc_camera.safetensors"
    if not weights.is_file():
        torch.manual_seed(0)
        config = bc_camera.BCCameraNetConfig()
        bc_camera.save(bc_camera.build(config), config, weights)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bc_camera, "DEFAULT_WEIGHTS", weights)
        return build.main(["--models", "bc-camera", "--ort-precisions", "fp32", "--out", str(out), *args]), weights


def _bc_camera_observation(rng) -> dict:
    return {"images": {"third_person": rng.integers(0, 255, (256, 256, 3), dtype=np.uint8),
                       "wrist": rng.integers(0, 255, (128, 128, 3), dtype=np.uint8)},
            "proprio": rng.normal(size=9).astype(np.float32)}


def test_bc_camera_runs_the_folders_graph_on_ort(tmp_path, monkeypatch):
    """eval.run's policy of bc-camera with --engines DIR (built as its workers build it) runs the graph make engines
    put in the folder: the graph its runner was given (its export of the weights file, before ONNX Runtime's
    load-time rewrite) is the folder's, byte for byte, and answers as the network does."""
    from engines.bc_camera import load, numpy_forward
    from eval.request import resolve_model

    monkeypatch.setenv("SAB_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "engines"
    rc, weights = _bc_camera_build(out)
    assert rc == 0
    entry = _entry(out, "bc-camera")
    policy = resolve_model("bc-camera", {"backend": "ort", "engines": str(out), "checkpoint": str(weights)}).policy()
    assert policy.backend == "ort" and policy.weights_sha256 == entry["weights"]["sha256"]
    assert engines_folder.sha256_file(policy.runner.onnx_path) == entry["files"][entry["graphs"]["model"]]
    net, _, _ = load(weights)
    policy.reset(all_instructions()[0], seed=0)
    rng = np.random.default_rng(4)
    for _ in range(3):
        obs = _bc_camera_observation(rng)
        feeds = policy.encode(obs)
        action = policy.decode(policy.runner.infer(feeds), 0)
        assert action.shape == (7,) and np.isfinite(action).all()
        np.testing.assert_allclose(action, numpy_forward(net, feeds)[0, 0], rtol=0, atol=1e-4)
    assert np.isfinite(policy.query(_bc_camera_observation(rng))).all()


def test_fake_tensorrt_bc_camera_engines_are_the_runs_and_a_missing_one_is_one_line(tmp_path, monkeypatch):
    """TensorRT (faked): make engines builds bc-camera's fp16 and fp32 engines for the profile a run uses (batch
    1..64) and lists them; a run with --engines DIR finds its engine there by the graph's sha256 and builds none; a
    folder without one is one line naming the command that builds it."""
    from engines import trt
    from engines.backends import MODEL_RUNTIMES
    from eval.request import resolve_model
    from tests import fake_trt

    monkeypatch.setenv("SAB_CACHE_DIR", str(tmp_path / "cache"))
    fakes = fake_trt.install(monkeypatch, major=10)
    out = tmp_path / "engines"
    rc, weights = _bc_camera_build(out, "--precisions", "fp16,fp32,int8")
    assert rc == 0 and fakes.trt.state.builds == 2  # int8: refused (measured), no engine
    engines = _entry(out, "bc-camera")["tensorrt"]
    assert sorted(k["precision"] for k in engines.values()) == ["fp16", "fp32"]
    assert all(k["batch_max"] == MODEL_RUNTIMES["bc-camera"].trt_batch_max == 64 for k in engines.values())
    assert all(k["onnx_sha256"] == _entry(out, "bc-camera")["files"]["bc_camera.onnx"] for k in engines.values())

    def no_build(*a, **k):
        raise AssertionError("a run built a TensorRT engine")

    monkeypatch.setattr(trt, "build_engine", no_build)
    options = {"backend": "trt", "engines": str(out), "checkpoint": str(weights)}
    policy = resolve_model("bc-camera", options).policy()
    assert policy.backend == "trt" and policy.runner.engine_path.parent == out
    assert policy.runner.engine_path.name in engines and "_fp16_" in policy.runner.engine_path.name
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(trt.EngineMismatchError) as e:
        resolve_model("bc-camera", {**options, "engines": str(empty)}).policy()
    msg = str(e.value)
    assert "\n" not in msg and "no TensorRT engine of bc_camera_" in msg
    assert f"build it with: python -m engines.build --models bc-camera --out {empty}" in msg
