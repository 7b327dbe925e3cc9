"""Camera frames straight into the engine: torch frames (what GPU scenes render into) are preprocessed on
their device and handed to the runner without a copy; policies receive runners from the one backend factory.

On this CPU the torch path runs on CPU tensors, the same code a GPU runs on CUDA tensors; the GPU scenes
themselves are tested where CUDA and SAPIEN's GPU simulation exist (skipped here with the reason)."""

from __future__ import annotations

import ast
import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

from eval.rollout import gpu_sim_unavailable_reason  # noqa: E402

pytestmark = pytest.mark.sim  # builds ManiSkill scenes

INSTRUCTION = "put the circle block into the circle hole"


def _frames(seed, sizes=((256, 256), (128, 128))):
    """Random (third-person, wrist) frames; ``sizes``: the model's image sizes (the device path does not resize)."""
    rs = np.random.default_rng(seed)
    return {"third_person": rs.integers(0, 256, (*sizes[0], 3), dtype=np.uint8),
            "wrist": rs.integers(0, 256, (*sizes[1], 3), dtype=np.uint8)}


def _sizes(policy):
    return tuple(c.image_size for c in policy.cfg.cameras)


def test_device_preprocessing_is_byte_identical_to_the_host_one():
    from eval.policies.octo import preprocess, preprocess_torch

    for seed in range(3):
        img = _frames(seed)["third_person"]
        for crop in (False, True):
            host = preprocess(img, (256, 256), average_crop=crop)
            dev = preprocess_torch(torch.from_numpy(img), (256, 256), average_crop=crop)
            assert dev.dtype == torch.uint8
            np.testing.assert_array_equal(dev.numpy(), host)


def test_device_preprocessing_refuses_a_resize_in_one_line():
    from engines.octo.errors import OctoError
    from eval.policies.octo import preprocess_torch

    with pytest.raises(OctoError, match="model's image size") as e:
        preprocess_torch(torch.zeros((240, 320, 3), dtype=torch.uint8), (256, 256), average_crop=True)
    assert "\n" not in str(e.value)


def test_dlpack_hand_off_shares_memory_and_counts_only_real_copies():
    from engines.zero_copy import CopyCounter, to_jax

    counter = CopyCounter()
    t = torch.arange(2 * 8 * 8 * 3, dtype=torch.uint8).reshape(2, 8, 8, 3)
    a = to_jax(t, counter)
    assert a.unsafe_buffer_pointer() == t.data_ptr()  # the same memory, no copy
    np.testing.assert_array_equal(np.asarray(a), t.numpy())
    assert counter.h2d_bytes == counter.d2h_bytes == 0
    if jax.default_backend() == "cpu" and torch.cuda.is_available():  # a CUDA frame into JAX on the CPU
        to_jax(t.cuda(), counter)
        assert counter.d2h_bytes == t.numel()


def _policies(backend="jax"):
    from engines.octo.testing import tiny_octo
    from eval.request import make_policy

    engine = tiny_octo(seed=5)
    return make_policy("octo-small", engine=engine, backend=backend), make_policy("octo-small", engine=engine, backend=backend)


def test_torch_frames_give_the_actions_of_numpy_frames_with_no_copy():
    host, device = _policies()
    for p in (host, device):
        p.reset(INSTRUCTION, seed=11)
    for step in range(6):
        frames = _frames(100 + step, _sizes(host))
        obs_np = {"images": frames, "proprio": np.zeros(9, np.float32), "instruction": INSTRUCTION}
        obs_t = {**obs_np, "images": {k: torch.from_numpy(v) for k, v in frames.items()}}
        np.testing.assert_array_equal(device.query(obs_t), host.query(obs_np))
    assert device.model_queries == host.model_queries == 2
    assert device.moved_image_bytes() == 0  # CPU tensors into JAX on the CPU: DLPack, nothing moved


def test_batched_torch_frames_make_one_model_call():
    from eval.policies.base import query_members

    lead, _ = _policies()
    members = [lead, lead.spawn(), lead.spawn()]
    for i, m in enumerate(members):
        m.reset(INSTRUCTION, seed=i)
    obs = [{"images": {k: torch.from_numpy(v) for k, v in _frames(i, _sizes(lead)).items()}, "proprio": np.zeros(9, np.float32),
            "instruction": INSTRUCTION} for i in range(3)]
    calls = len(lead.runner.latencies_ms)
    actions, _, ran = query_members(members, obs)
    assert actions.shape == (3, 7) and ran == [True] * 3
    assert len(lead.runner.latencies_ms) == calls + 1  # one call for the three scenes


def test_policies_receive_runners_from_the_one_factory():
    """No policy module builds a runner: they are assembled in eval.policies from engines.backends."""
    import eval.policies.bc_state as bc
    import eval.policies.octo as octo

    builders = {"make_runner", "model_runner", "BackendSpec", "OnnxRuntimeRunner", "TensorRtRunner", "JaxOcto",
                "OnnxOcto", "CallableRunner"}
    for module in (bc, octo):
        tree = ast.parse(inspect.getsource(module))  # names the code uses; docstrings may mention them
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not used & builders, f"{module.__name__} builds a runner ({', '.join(sorted(used & builders))})"
    from eval.request import make_policy

    p = make_policy("bc-state", backend="torch")
    assert p.backend == p.runner.name == "torch" and p.runner.active


def test_the_factory_names_each_models_backends_in_one_line():
    from engines.backends import model_backend, resolve_runtime

    assert model_backend("octo-base") == "jax" and model_backend("bc-state") == "ort"
    with pytest.raises(ValueError, match="valid: ort, trt, torch") as e:
        model_backend("bc-state", "jax")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="no runner for model 'scripted'"):
        resolve_runtime("scripted", "ort")


def test_bc_camera_device_frames_reach_its_engine_with_no_image_copy(tmp_path, monkeypatch):
    """bc-camera on TensorRT (faked: tests/fake_trt.py) from the engines folder make engines built: a GPU scene's
    frames (uint8 CUDA tensors, as eval.rollout's Scenes hands them over with host=False) are bound at their own
    addresses, so a query copies only its low-dimensional input host to device (0 image bytes), where host frames
    copy the images too; both give the network's actions."""
    import functools

    from engines import bc_camera, build
    from engines.backends import MODEL_RUNTIMES
    from eval.request import resolve_model
    from tests import fake_trt

    monkeypatch.setenv("SAB_CACHE_DIR", str(tmp_path / "cache"))
    f = fake_trt.install(monkeypatch, major=10)
    config = bc_camera.BCCameraNetConfig()
    torch.manual_seed(0)
    weights = tmp_path / "bc_camera.safetensors"
    bc_camera.save(bc_camera.build(config), config, weights)
    net, _, _ = bc_camera.load(weights)
    monkeypatch.setattr(bc_camera, "DEFAULT_WEIGHTS", weights)
    out = tmp_path / "engines"
    assert build.main(["--models", "bc-camera", "--precisions", "fp16", "--ort-precisions", "fp32", "--out",
                       str(out)]) == 0 and f.trt.state.builds == 1
    # the engine it built deserialises as bc-camera's tensors, computing the network on what is bound
    inputs = {name: ((-1, side, side, 3), np.uint8) for name, side in config.cameras}
    inputs["low_dim"] = ((-1, config.low_dim), np.float32)
    outputs = {"actions": ((-1, config.chunk, config.action_dim), np.float32)}
    f.trt.engines[fake_trt.ENGINE_BYTES] = functools.partial(
        fake_trt.SpecEngine, f.trt, f.cudart, inputs, outputs,
        lambda **feeds: {"actions": bc_camera.numpy_forward(net, feeds)}, MODEL_RUNTIMES["bc-camera"].trt_batch_max)
    options = {"backend": "trt", "engines": str(out), "checkpoint": str(weights)}
    host, device = (resolve_model("bc-camera", options).policy() for _ in range(2))
    for p in (host, device):
        p.reset(INSTRUCTION, seed=0)
    low_dim_bytes = config.low_dim * 4  # float32 (1, LOW_DIM): new every query
    image_bytes = sum(side * side * 3 for _, side in config.cameras)
    for step in range(3):
        frames = _frames(step)
        proprio = np.random.default_rng(step).normal(size=9).astype(np.float32)
        expected = bc_camera.numpy_forward(net, host.encode({"images": frames, "proprio": proprio}))[0, 0]
        a_host = host.query({"images": frames, "proprio": proprio})
        assert host.runner.last_h2d_bytes == image_bytes + low_dim_bytes
        copied = f.cudart.h2d_bytes
        tensors = {k: fake_trt.fake_cuda(v) for k, v in frames.items()}
        a_device = device.query({"images": tensors, "proprio": proprio})
        assert device.runner.last_h2d_bytes == low_dim_bytes == f.cudart.h2d_bytes - copied  # not one image byte
        read = device.runner.context.read[-1]  # the addresses the engine read: the frames' own, or for the
        # cameras read as the try's first step rendered them (the third person), the copy the policy keeps on the
        # device: a device-to-device clone, never through the host, never a runner buffer
        kept = device._first_frames
        assert set(kept) == set(config.first_frame_cameras) == {"third_person"}
        assert all(type(t) is type(tensors[k]) for k, t in kept.items())  # still a (fake) CUDA tensor
        bound = {k: kept.get(k, t) for k, t in tensors.items()}
        assert all(read[k] == t.data_ptr() and k not in device.runner.buffers for k, t in bound.items())
        # the same network on the same bytes (its float sums may round differently with the buffers' alignment)
        np.testing.assert_allclose(a_host, expected, rtol=0, atol=1e-6)
        np.testing.assert_allclose(a_device, a_host, rtol=0, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(gpu_sim_unavailable_reason() is not None,
                    reason=f"GPU simulation unavailable: {gpu_sim_unavailable_reason()}")
def test_gpu_scenes_hand_frames_to_the_engine_on_the_device():
    from env.setups import get_setup
    from eval.request import make_policy
    from eval.rollout import Scenes, make_members, rollout

    lead = make_policy("octo-small", random_weights=True)  # the scene's camera sizes: nothing to resize
    factory = lead.spawn
    scenes = Scenes(get_setup("A01"), 4, sim="gpu", cameras=True, max_steps=10)
    try:
        records, batch = rollout(scenes, make_members(lead, 4, factory), "dev", [0, 1, 2, 3])
    finally:
        scenes.close()
    assert [r.steps for r in records] == [10] * 4 and all(r.infer_queries == 3 for r in records)
    assert all(b == 4 for b in batch["query_batch"])
    if jax.default_backend() == "gpu":
        assert batch["image_bytes_per_step"] == 0  # no frame crossed between host and device
