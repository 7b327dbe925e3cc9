"""The GPU PhysX paths of the task (env/task.py, "GPU scenes").

On a machine without CUDA they run against a fake GPU scene: a PhysX state and the buffers ManiSkill reads
and writes, apart, with ManiSkill's own ``BaseEnv._step_action`` ordering the calls (substeps, the task's
hooks, ManiSkill's fetch), and the task's own methods for the rest. Where CUDA is available the same checks
run on ``physx_cuda`` with 4 scenes; elsewhere those tests are skipped with the reason.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from env import geometry
from env.predicate import STICKY_FLAGS
from env.setups import get_setup
from env.starts import BlockStart, StartState, sample_start
from env.task import (ShapeAssemblyEnv, check_shared_appearance, episode_seeds, reset_rows, third_person_pose,
                      write_rows, write_tensor_rows)
from eval.rollout import gpu_sim_unavailable_reason
from mani_skill.envs.sapien_env import BaseEnv
from mani_skill.utils.structs.pose import Pose

pytestmark = pytest.mark.sim  # builds ManiSkill scenes

N = 4
SUBSTEPS = 25
DT = 1 / 500


# ------------------------------------------------------------------ a fake GPU scene
class FakePx:
    timestep = DT

    def __init__(self, scene):
        self.scene = scene

    def gpu_apply_rigid_dynamic_data(self):
        self.scene.log.append("apply")
        self.scene.physx.copy_(self.scene.buffer)


class FakeScene:
    """Bodies (scene, body, 13: p, wxyz, v, w) in PhysX and in the buffer the actors read and write; bodies
    0-2 are the blocks, 3 the board. A substep moves every body by its velocity."""

    gpu_sim_enabled = True
    parallel_in_single_scene = False

    def __init__(self, n: int, render: bool = False):
        self.physx = torch.zeros((n, 4, 13))
        self.physx[..., 3] = 1.0
        self.buffer = self.physx.clone()
        self.px = FakePx(self)
        self.log: list = []
        self.render = render

    def can_render(self):
        return self.render

    def step(self):
        self.log.append("step")
        self.physx[..., :3] += self.physx[..., 7:10] * DT

    def _gpu_fetch_all(self):
        self.log.append("fetch")
        self.buffer.copy_(self.physx)


class FakeActor:
    """An actor of the fake scene: reads and writes its body's rows of the buffer, or records the writes of a
    reset (ManiSkill writes the reset scenes' rows through its reset mask)."""

    def __init__(self, scene, body=None):
        self.scene, self.body, self.writes, self._objs = scene, body, [], []

    @property
    def pose(self):
        if self.body is None:
            return Pose.create(torch.tensor([[0, 0, 0, 1, 0, 0, 0]], dtype=torch.float32).repeat(len(self.scene.buffer), 1))
        return Pose.create(self.scene.buffer[:, self.body, :7].clone())

    @property
    def linear_velocity(self):
        return self.scene.buffer[:, self.body, 7:10]

    @property
    def angular_velocity(self):
        return self.scene.buffer[:, self.body, 10:13]

    def set_pose(self, pose):
        self.writes.append(pose.raw_pose.clone())
        if self.body is not None and len(pose.raw_pose) == len(self.scene.buffer):
            self.scene.buffer[:, self.body, :7] = pose.raw_pose

    def set_linear_velocity(self, v):
        if self.body is not None and len(v) == len(self.scene.buffer):
            self.scene.buffer[:, self.body, 7:10] = torch.as_tensor(v)

    def set_angular_velocity(self, w):
        pass


class _Anything:
    """Stands for ManiSkill parts the tested code only calls (table, agent): every call does nothing."""

    def __getattr__(self, name):
        return _Anything()

    def __call__(self, *args, **kwargs):
        return _Anything()


class FakeRobot(_Anything):
    def __init__(self, n):
        self.n = n

    def get_qpos(self):
        q = torch.zeros((self.n, 9))
        q[:, -2:] = 0.04  # fully open
        return q


class FakeGpuEnv(ShapeAssemblyEnv):
    """The task's methods on the fake scene; the predicate records the block positions it reads."""

    def close(self):
        pass

    def _gpu_contacts(self):
        return torch.zeros((self.num_envs, 3, 2)), torch.zeros((self.num_envs, 3), dtype=torch.bool)

    def _before_control_step(self):
        self._new_substep_window()

    def _compute_conditions(self):
        self.scene.log.append("evaluate")
        self.seen = self._block_raw_poses()[..., :3].clone()
        z = torch.zeros(self.num_envs, dtype=torch.bool)
        return dict(success_now=z, **{k: z.clone() for k in STICKY_FLAGS})


def fake_env(setup_id: str = "F03", n: int = N, render: bool = False) -> FakeGpuEnv:
    from env.arms import get_arm

    env = object.__new__(FakeGpuEnv)
    env.scene = FakeScene(n, render)
    env.num_envs, env.device, env._sim_steps_per_control = n, torch.device("cpu"), SUBSTEPS
    env.task_setup, env.arm = get_setup(setup_id), get_arm("panda")
    env.blocks = {s: FakeActor(env.scene, k) for k, s in enumerate(geometry.SHAPES)}
    env.board = FakeActor(env.scene, 3)
    env.distractors = {kind: FakeActor(env.scene) for kind in geometry.DISTRACTOR_HEIGHT}
    env.agent = _Anything()
    env.agent.robot = FakeRobot(n)
    env.table_scene = _Anything()
    env._block_points = torch.zeros((3, 1, 3))
    env._block_cmass = torch.tensor([[0, 0, 0, 1.0, 0, 0, 0]] * 3)
    env._prism_vertices = torch.zeros((3, 1, 3))
    env._lights, env._sensors = [], {}
    env._episode_seed = np.array([11, 22, 33, 44])
    return env


def _reset_all(env, starts=None):
    options = {} if starts is None else {"starts": starts}
    env._initialize_episode(torch.arange(env.num_envs), options)


# -------------------------------------------------------------- fetch before evaluate
def test_predicate_reads_the_steps_own_state_on_gpu():
    env = fake_env("A01")
    _reset_all(env)
    env.scene.physx[:, :3, 7] = 0.1  # every block moves along x at 0.1 m/s
    before = env.scene.physx[:, :3, :3].clone()
    BaseEnv._step_action(env, None)  # ManiSkill's own order of substeps, hooks and fetch
    log = env.scene.log
    assert log.count("step") == SUBSTEPS
    last_step, evaluate = len(log) - 1 - log[::-1].index("step"), log.index("evaluate")
    assert "fetch" in log[last_step:evaluate]  # fetched after the last substep, before the predicate
    moved = before + torch.tensor([0.1 * SUBSTEPS * DT, 0, 0])
    torch.testing.assert_close(env.seen, moved)  # the step's own positions, not the step before's
    torch.testing.assert_close(env.seen, env.scene.physx[:, :3, :3])


# ------------------------------------------------------------------ disturbances on GPU
def test_shove_reaches_physx_and_moves_the_block_on_the_next_step():
    env = fake_env("F03")
    setup = env.task_setup
    _reset_all(env)
    i = 2  # only this scene reaches the shove step now
    env._steps_done[:] = torch.tensor([0, 3, setup.shove_step - 1, 5], dtype=torch.int32)
    k = geometry.SHAPES.index(env.starts[i].target)
    BaseEnv._step_action(env, None)
    log = env.scene.log
    assert log.index("apply") > len(log) - 1 - log[::-1].index("step")  # after the last substep
    assert log[-1] == "fetch" and log.index("apply") < len(log) - 1  # before ManiSkill's fetch
    shove = torch.tensor([*env.starts[i].shove_velocity, 0.0])
    # in PhysX, not only in the buffer that ManiSkill's fetch overwrote
    torch.testing.assert_close(env.scene.physx[i, k, 7:10], shove)
    assert bool(env._dist_fired[i]) and int(env._dist_step[i]) == setup.shove_step
    assert not env._dist_fired[[0, 1, 3]].any()
    others = [j for j in range(N) if j != i]
    assert env.scene.physx[others, :3, 7:10].abs().max() == 0  # the other scenes untouched
    p0 = env.scene.physx[i, k, :3].clone()
    BaseEnv._step_action(env, None)
    torch.testing.assert_close(env.scene.physx[i, k, :3] - p0, shove * SUBSTEPS * DT)


def test_without_a_disturbance_nothing_is_applied():
    env = fake_env("F03")
    _reset_all(env)
    BaseEnv._step_action(env, None)  # step 1: no scene is at the shove step
    assert "apply" not in env.scene.log


# ------------------------------------------------------------------ partial resets
def test_row_writes_keep_the_other_scenes():
    assert reset_rows(torch.tensor([3, 1]), 4) == [3, 1]
    with pytest.raises(ValueError, match="distinct scenes of 0..3"):
        reset_rows([1, 1], 4)
    with pytest.raises(ValueError, match="distinct scenes of 0..3"):
        reset_rows([4], 4)
    assert write_rows(["a", "b", "c", "d"], [1, 3], ["B", "D"], 4) == ["a", "B", "c", "D"]
    assert write_rows(None, [0, 1, 2, 3], list("wxyz"), 4) == list("wxyz")
    with pytest.raises(ValueError, match="needs a reset of all 4 scenes first"):
        write_rows(None, [1], ["x"], 4)
    full = torch.zeros((4, 3), dtype=torch.bool)
    out = write_tensor_rows(full, [2, 0], torch.tensor([[True, False, True], [False, True, False]]), 4)
    assert out.tolist() == [[False, True, False], [False] * 3, [True, False, True], [False] * 3]
    assert episode_seeds(np.array([10, 20, 30, 40]), [3, 1], 4) == [40, 20]  # by scene index
    with pytest.raises(ValueError, match="one seed per scene"):
        episode_seeds(np.array([10, 20]), [3, 1], 4)  # ManiSkill kept a list of the reset scenes' seeds only


def _start(target: str, x: float, colors=None, light=None, camera=(0.0,) * 5) -> StartState:
    return StartState(target=target, blocks=(BlockStart(target, x, 0.05, 0.0),), board_x=0.03, board_y=0.0,
                      board_yaw=0.0, colors=colors, light_color=light, camera_offset=camera)


def test_partial_reset_writes_only_its_scenes():
    env = fake_env("A01")
    _reset_all(env)
    setup = env.task_setup
    assert env.starts == [sample_start(setup, np.random.default_rng(s)) for s in (11, 22, 33, 44)]
    kept = list(env.starts)
    active, target = env._active.clone(), env._target_mask.clone()
    env._streak[:] = 5
    env._flags["dropped"][:] = True
    env._conditions = {"matched": torch.ones(N, dtype=torch.bool), "plate_overlap": torch.full((N,), 0.5)}
    a, b = _start("square", -0.20), _start("triangle", -0.10)
    env.blocks["square"].writes.clear()
    env.blocks["triangle"].writes.clear()
    env._initialize_episode(torch.tensor([3, 1]), {"starts": [a, b]})  # starts in env_idx's order
    assert env.starts == [kept[0], b, kept[2], a]
    assert env.instructions[1] == "put the triangle block into the triangle hole"
    assert env.instructions[3] == "put the square block into the square hole"
    assert env._active[1].tolist() == [False, False, True] and env._active[3].tolist() == [False, True, False]
    assert env._target_mask[3].tolist() == [False, True, False]
    assert torch.equal(env._active[[0, 2]], active[[0, 2]]) and torch.equal(env._target_mask[[0, 2]], target[[0, 2]])
    assert env._streak.tolist() == [5, 0, 5, 0] and env._flags["dropped"].tolist() == [True, False, True, False]
    assert env._conditions["matched"].tolist() == [True, False, True, False]
    assert env._conditions["plate_overlap"].tolist() == [0.5, 0.0, 0.5, 0.0]
    # ManiSkill writes the reset rows in ascending order: scene 1 (the triangle's start) first, then scene 3;
    # a block a start does not use is parked on the floor (x = -1.2)
    assert env.blocks["triangle"].writes[-1][:, 0].tolist() == pytest.approx([-0.10, -1.2])
    assert env.blocks["square"].writes[-1][:, 0].tolist() == pytest.approx([-1.2, -0.20])


def test_partial_reset_draws_from_the_scenes_own_seed():
    env = fake_env("B02")
    _reset_all(env)
    env._episode_seed = np.array([11, 22, 99, 44])  # ManiSkill redrew scene 2's seed
    env._initialize_episode(torch.tensor([2]), {})
    assert env.starts[2] == sample_start(env.task_setup, np.random.default_rng(99))
    env._episode_seed = np.array([5])  # a seed list of the reset scene only
    with pytest.raises(ValueError, match="one seed per scene"):
        env._initialize_episode(torch.tensor([2]), {})


# ------------------------------------------------------------------ appearance per sub-scene
class FakeLight:
    color = None


class FakeCamera:
    def __init__(self):
        self.pose = None

    def set_local_pose(self, pose):
        self.pose = pose


def _rendering_env():
    env = fake_env("A01", render=True)
    env._lights = [[FakeLight(), FakeLight()] for _ in range(N)]
    cams = [FakeCamera() for _ in range(N)]
    camera = _Anything()
    camera._render_cameras = cams
    sensor = _Anything()
    sensor.camera = camera
    env._sensors = {"third_person": sensor}
    env.table_scene.table = _Anything()
    env.table_scene.table._objs = []
    return env, cams


def test_key_light_and_camera_are_set_per_scene():
    env, cams = _rendering_env()
    starts = [_start("circle", -0.2, light=(0.1 * i, 0.2, 0.3), camera=(0.01 * i, 0, 0, 0, 0)) for i in range(N)]
    _reset_all(env, starts)
    for i in range(N):
        assert env._lights[i][0].color == [0.1 * i, 0.2, 0.3] and env._lights[i][1].color is None
        assert _same_pose(cams[i].pose, third_person_pose(starts[i].camera_offset).sp)
    new = _start("square", -0.1, light=(1.0, 0.0, 0.0), camera=(0, 0.05, 0, 0, 0))
    env._initialize_episode(torch.tensor([2]), {"starts": [new]})
    assert env._lights[2][0].color == [1.0, 0.0, 0.0] and env._lights[1][0].color == [0.1, 0.2, 0.3]
    assert _same_pose(cams[2].pose, third_person_pose(new.camera_offset).sp)
    assert _same_pose(cams[1].pose, third_person_pose(starts[1].camera_offset).sp)
    assert not _same_pose(cams[1].pose, cams[2].pose)


def _same_pose(a, b) -> bool:
    return np.allclose(a.p, b.p) and np.allclose(a.q, b.q)


def test_a_batch_mixing_colours_is_refused_and_left_unchanged():
    env, _ = _rendering_env()
    red = {"circle": (1.0, 0.0, 0.0)}
    starts = [_start("circle", -0.2, colors=red) for _ in range(N)]
    _reset_all(env, starts)
    with pytest.raises(ValueError, match="split the batch by colors") as err:
        env._initialize_episode(torch.tensor([1]), {"starts": [_start("circle", -0.2, colors={"circle": (0, 1.0, 0)})]})
    assert "\n" not in str(err.value)
    assert env.starts == starts
    with pytest.raises(ValueError, match="share colors"):
        _reset_all(env, [_start("circle", -0.2, colors=red)] * 3 + [_start("circle", -0.2)])
    # the key light and the camera are each sub-scene's own: they may differ
    check_shared_appearance([_start("circle", -0.2, light=(1, 0, 0)), _start("circle", -0.2)], ("colors",))


def test_nothing_rendered_nothing_checked():
    env = fake_env("A01", render=False)  # render_backend="none": no lights, sensors or render bodies
    _reset_all(env, [_start("circle", -0.2, colors={"circle": (float(i) / N, 0, 0)}) for i in range(N)])
    assert env._lights == []


# ------------------------------------------------------------------ a real scene, nothing rendered
def test_render_backend_none_defines_lights_and_steps():
    from env import make_env

    env = make_env("D02", render_backend="none")
    try:
        env.reset(seed=3)
        u = env.unwrapped
        assert u._lights == []
        for _ in range(2):
            env.step(np.array([0, 0, 0, 0, 0, 0, 1], dtype=np.float32))
        assert int(u._steps_done[0]) == 2
    finally:
        env.close()


# ------------------------------------------------------------------ on a GPU
GPU_REASON = gpu_sim_unavailable_reason()
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"GPU simulation unavailable: {GPU_REASON}")


def _gpu_env(setup_id: str):
    from env import make_env

    return make_env(setup_id, num_envs=N, sim_backend="physx_cuda", render_backend="none")


@pytest.mark.gpu
@needs_gpu
def test_gpu_shove_moves_the_block_and_the_predicate_reads_the_step():
    env = _gpu_env("F03")
    try:
        u = env.unwrapped
        env.reset(seed=[1, 2, 3, 4])
        seen = []
        evaluate = u._compute_conditions

        def recording():
            seen.append(u._block_raw_poses().clone())
            return evaluate()

        u._compute_conditions = recording
        hold = torch.tensor([[0, 0, 0, 0, 0, 0, 1.0]] * N, device=u.device)
        shove_step = u.task_setup.shove_step
        for step in range(1, shove_step + 2):
            before = u._block_raw_poses().clone()
            _, _, _, _, info = env.step(hold)
            # the predicate read the state ManiSkill returns for this step, not the step before's
            torch.testing.assert_close(seen[-1], u._block_raw_poses())
            if step == shove_step:
                assert info["disturbance_fired"].all() and (info["disturbance_step"] == shove_step).all()
                for i, st in enumerate(u.starts):
                    k = geometry.SHAPES.index(st.target)
                    v = u.blocks[st.target].linear_velocity[i, :2].cpu()
                    # the shove reached PhysX: ManiSkill's fetch after the step read it back
                    assert torch.linalg.norm(v) > 0.5 * float(np.hypot(*st.shove_velocity)), (i, k, v)
            if step == shove_step + 1:
                for i, st in enumerate(u.starts):
                    k = geometry.SHAPES.index(st.target)
                    moved = torch.linalg.norm(u._block_raw_poses()[i, k, :2] - before[i, k, :2])
                    assert moved > 0.01  # 0.8-1.1 m/s for 50 ms, less friction
    finally:
        env.close()


@pytest.mark.gpu
@needs_gpu
def test_gpu_partial_reset_moves_only_its_scene():
    env = _gpu_env("A01")
    try:
        u = env.unwrapped
        env.reset(seed=[1, 2, 3, 4])
        kept = list(u.starts)
        poses = u._block_raw_poses().clone()
        start = _start("square", -0.15)
        env.reset(options={"env_idx": torch.tensor([2], device=u.device), "starts": [start]})
        assert u.starts == [kept[0], kept[1], start, kept[3]]
        now = u._block_raw_poses()
        torch.testing.assert_close(now[[0, 1, 3]], poses[[0, 1, 3]])
        sq = geometry.SHAPES.index("square")
        assert abs(float(now[2, sq, 0]) + 0.15) < 1e-4
        assert u._active[2].tolist() == [False, True, False]
    finally:
        env.close()


# ------------------------------------------------------------------ benchmarks.gpu_physics_check's rows
def test_gpu_physics_check_keeps_each_finished_setup_of_a_run_that_dies(tmp_path, monkeypatch):
    """Each setup's row is on disk as it finishes (benchmarks.common.RowLog): a run that dies in its second setup
    (the device check's step timeout) leaves the first one's row; a run that ends has them all in its JSON and no
    rows file. compare_setup stands in for the rollouts, which tests/test_batch.py runs."""
    import json

    from benchmarks import gpu_physics_check as gpc
    from benchmarks.common import read_json_lines

    def row(setup_id, tries):
        return {"setup": setup_id, "tries": len(tries), "cpu_success": 1, "batch_success": 1, "difference_pp": 0.0,
                "difference_pp_95": [0.0, 0.0], "tries_differing": [], "cpu_mean_steps": 9.0,
                "batch_mean_steps": 9.0, "cpu_tries_per_s": 1.0, "batch_tries_per_s": 2.0}

    def dies_in_the_second(setup_id, tries, num_envs, sim, split="dev"):
        if setup_id == "A02":
            raise KeyboardInterrupt  # killed here
        return row(setup_id, tries)

    argv = ["--sim", "cpu", "--setups", "A01,A02", "--tries", "1", "--num-envs", "1", "--out-dir", str(tmp_path)]
    monkeypatch.setattr(gpc, "compare_setup", dies_in_the_second)
    with pytest.raises(KeyboardInterrupt):
        gpc.main(argv)
    rows_file = tmp_path / "gpu_physics_check_cpu.rows.jsonl"
    assert read_json_lines(rows_file) == [row("A01", [0])]
    assert not (tmp_path / "gpu_physics_check_cpu.json").exists()

    monkeypatch.setattr(gpc, "compare_setup", lambda setup_id, tries, num_envs, sim: row(setup_id, tries))
    assert gpc.main(argv) == 0
    doc = json.loads((tmp_path / "gpu_physics_check_cpu.json").read_text())
    assert doc["results"]["setups"] == [row("A01", [0]), row("A02", [0])] and not rows_file.exists()
