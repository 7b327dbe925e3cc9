"""Arms: the table of specs, the asset check, and the scripted reference on every arm whose assets are here."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch

from env import arms
from env.arms import ARMS, MissingAssetsError, UnknownArmError, check_assets, get_arm

pytestmark = pytest.mark.sim  # builds ManiSkill scenes

ARM_NAMES = ("panda", "xarm6_robotiq", "widowx250s")
DOWNLOADED = [a.name for a in ARMS.values() if a.urdf_file is not None]


def _assets_or_skip(name: str) -> None:
    try:
        check_assets(name)
    except MissingAssetsError as e:
        pytest.skip(str(e))


@contextmanager
def _a01(name, obs_mode):
    """Setup A01 on the arm ``name`` (skipped when its assets are missing), closed afterwards."""
    _assets_or_skip(name)
    from env import make_env

    env = make_env("A01", arm=name, obs_mode=obs_mode)
    try:
        yield env
    finally:
        env.close()


def test_the_three_arms_are_listed():
    assert tuple(ARMS) == ARM_NAMES


def test_unknown_arm_error_lists_valid_names():
    with pytest.raises(UnknownArmError) as e:
        get_arm("ur5e")
    msg = str(e.value)
    assert "'ur5e'" in msg and "valid: panda, xarm6_robotiq, widowx250s" in msg


@pytest.mark.parametrize("name,asset_id", [("xarm6_robotiq", "xarm6"), ("widowx250s", "widowx250s")])
def test_missing_assets_name_the_download_command(tmp_path, name, asset_id):
    with pytest.raises(MissingAssetsError) as e:
        check_assets(name, asset_root=tmp_path)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"assets for {name} are missing at {tmp_path}")
    assert msg.endswith(f"download them with: python -m mani_skill.utils.download_asset {asset_id}")


def test_download_commands_name_real_data_sources_and_paths():
    from mani_skill.utils.assets.data import DATA_SOURCES

    for name in DOWNLOADED:
        arm = get_arm(name)
        asset_id = arm.download_command.split()[-1]
        assert arm.download_command == f"python -m mani_skill.utils.download_asset {asset_id}"
        assert asset_id in DATA_SOURCES, asset_id
        assert arm.urdf_file.startswith(DATA_SOURCES[asset_id].target_path + "/"), (arm.urdf_file, asset_id)


def test_panda_ships_with_mani_skill(tmp_path):
    check_assets("panda", asset_root=tmp_path)  # nothing to download: never raises


def test_asset_dir_is_mani_skills():
    import mani_skill

    assert arms.asset_dir() == mani_skill.ASSET_DIR


def test_env_refuses_missing_assets_in_one_line(tmp_path, monkeypatch):
    from env import make_env

    monkeypatch.setattr(arms, "asset_dir", lambda: tmp_path)
    with pytest.raises(MissingAssetsError, match="download_asset widowx250s$"):
        make_env("A01", arm="widowx250s")


@pytest.mark.parametrize("name", ARM_NAMES)
def test_gripper_opening_and_command(name):
    arm = get_arm(name)
    n = len(arm.rest_qpos)
    for value, frac in ((arm.gripper_open_qpos, 1.0), (arm.gripper_closed_qpos, 0.0)):
        q = np.zeros((2, n))
        q[:, list(arm.gripper_qpos_idx)] = value
        np.testing.assert_allclose(arm.opening_from_qpos(q), frac)
        torch.testing.assert_close(arm.opening_from_qpos(torch.tensor(q, dtype=torch.float32)),
                                   torch.full((2,), frac, dtype=torch.float32))
    np.testing.assert_allclose(arm.opening_from_qpos(np.asarray(arm.rest_qpos)), 1.0)  # rests open
    closed, opened = arm.gripper_action
    cmd = torch.tensor([-1.0, 1.0])
    torch.testing.assert_close(arm.gripper_command_to_action(cmd), torch.tensor([closed, opened]))


@pytest.mark.parametrize("name", ARM_NAMES)
def test_rest_pose_points_down_above_the_table(name):
    from scipy.spatial.transform import Rotation

    with _a01(name, "state") as env:
        env.reset(seed=0)
        s = env.unwrapped.task_state()
        assert env.action_space.shape == (7,)
        np.testing.assert_array_equal(env.action_space.low, -1.0)
        np.testing.assert_array_equal(env.action_space.high, 1.0)
        assert s["tcp_p"][0, 2] > 0.12
        w, x, y, z = s["tcp_q"][0]
        r = Rotation.from_quat([x, y, z, w]).as_matrix()
        assert r[2, 2] < -0.99  # the reported TCP's z axis (approach) points down
        assert abs(r[2, 1]) < 0.01  # its y axis (closing direction) is level
        assert s["gripper_opening"][0] > 0.95
        if get_arm(name).grasp_frame == arms._IDENTITY:  # the Panda reports its TCP link as it is
            np.testing.assert_array_equal(s["tcp_q"], env.unwrapped.agent.tcp_pose.q.cpu().numpy())


@pytest.mark.parametrize("name", ARM_NAMES)
def test_wrist_camera(name):
    with _a01(name, "rgb") as env:
        obs, _ = env.reset(seed=0)
        img = obs["sensor_data"][get_arm(name).wrist_camera_uid]["rgb"]
        assert tuple(img.shape) == (1, 128, 128, 3)
        assert float(img.float().std()) > 1.0  # rendered something, not a blank frame


@pytest.mark.parametrize("name", ARM_NAMES)
def test_scripted_reference_inserts_on_every_arm(name):
    from env.setups import get_setup
    from eval.policies.scripted import ScriptedPolicy
    from eval.rollout import Scenes, run_try

    _assets_or_skip(name)  # a fresh machine has the Panda only (the others' assets are fetched by hand)
    scenes = Scenes(get_setup("A01"), arm=name)
    try:
        rec = run_try(scenes, ScriptedPolicy(clearance=scenes.setup.clearance_m), "dev", 0)
        assert rec.success and rec.flags == (), rec
    finally:
        scenes.close()
