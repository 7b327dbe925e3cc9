"""ShapeAssembly-v1: insert a shaped block into the matching hole of a board.

**Task.** A robot arm picks up the target block (circle, square or triangle) by
its knob, turns it to match the opening, inserts it into the matching hole of a
fixed board and lets go. On the full-board setups (FB*) all three blocks must be
in their holes at the same time.

**Randomisations** (drawn per try by :func:`env.starts.sample_start`, or given
exactly through ``reset(options={"start": StartState})``):
- target shape, uniform over the three shapes;
- block xy noise and yaw noise around the nominal start, and the other blocks
  of clutter setups on their own slots; starts never overlap;
- board xy offset and yaw (setups B03/B04).

**Success** (evaluated every control step, all four for 10 steps in a row):
1. matched: the block's centre is within clearance + 3 mm of its own hole's
   centre in the board plane;
2. deep: the block's lowest point is at least 25 mm below the plate's top face;
3. released: no finger touches the block and the gripper is at least 90% open;
4. settled: the block's speed is below 2 cm/s.
``info`` carries each condition, the streak counter and the flags
``wrong_hole``, ``penetration``, ``dropped`` (sticky over the try) and ``rim``
(the block rests on the plate right now).

**Physics choices.** The board is a plate of convex prisms around each hole
(see :mod:`env.geometry`), so a block passes only through a real opening. The
simulation runs at 500 Hz (25 substeps per 20 Hz control step) with 20 position
iterations and TGS: at 100 Hz a block moving at 5 cm/s travels 0.5 mm per step,
as much as the tightest clearance, and PhysX then resolves wall contacts late and
jams or tunnels; at 500 Hz the per-step motion is 0.1 mm. Contact offset is
5 mm (contacts are generated before the walls meet, which also keeps the
solver from seeing deep first contacts), rest offset 0 so that the geometric
clearance is the physical clearance.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import sapien
import torch

from mani_skill.envs.sapien_env import BaseEnv
from mani_skill.sensors.camera import CameraConfig
from mani_skill.utils import sapien_utils
from mani_skill.utils.registration import register_env
from mani_skill.utils.scene_builder.table import TableSceneBuilder
from mani_skill.utils.structs.pose import Pose
from mani_skill.utils.structs.types import SceneConfig, SimConfig

from env import geometry
from env.arms import ArmSpec, check_assets, get_arm, register_agents
from env.setups import Setup, get_setup
from env.starts import DEFAULT_BLOCK_RGB, StartState, sample_start

ENV_ID = "ShapeAssembly-v1"
CONTROL_FREQ = 20
SIM_FREQ = 500
SUCCESS_HOLD_STEPS = 10
MATCH_MARGIN_M = 0.003
DEEP_M = 0.025
SETTLED_MPS = 0.02
RELEASED_OPENING = 0.9
CONTACT_EPS_N = 1e-3
GRASP_FORCE_N = 0.5
DROP_CONFIRM_STEPS = 3
PENETRATION_TOL_M = 0.0015
THIRD_PERSON_CAMERA = "third_person"
THIRD_PERSON_SIZE = (256, 256)
THIRD_PERSON_EYE = (0.30, 0.26, 0.40)
THIRD_PERSON_TARGET = (-0.07, -0.02, 0.0)
BLOCK_COLORS = {s: (*rgb, 1.0) for s, rgb in DEFAULT_BLOCK_RGB.items()}
BOARD_COLOR = (0.55, 0.42, 0.3, 1)
DISTRACTOR_COLORS = {"cube": (0.3, 0.6, 0.3, 1), "hexagon": (0.55, 0.3, 0.6, 1), "bar": (0.5, 0.5, 0.5, 1)}
# lighting presets: (ambient rgb, [(direction, rgb), ...]); D02's key light colour is drawn per try
LIGHTING = {
    "default": ((0.3, 0.3, 0.3), [((1, 1, -1), (1, 1, 1)), ((0, 0, -1), (1, 1, 1))]),
    "dim": ((0.05, 0.05, 0.05), [((1, 1, -1), (0.18, 0.18, 0.18)), ((0, 0, -1), (0.12, 0.12, 0.12))]),
    "colored": ((0.25, 0.25, 0.25), [((1, 1, -1), (2.5, 2.5, 2.5)), ((0, 0, -1), (0.3, 0.3, 0.3))]),
}
# occlusion panel (E03/E04): a visual-only square on the line from the camera to the board's circle cell
OCCLUSION_FRACTION = 0.3  # of the way from the nominal camera to the board's circle cell
OCCLUSION_HALF_SIZE = 0.022
FORCED_DROP_TRIGGER_M = 0.04  # the target's first lift by this much (bottom above the table) starts F04
NUDGE_RADIUS_M = 0.06  # F05 fires when the carried target's centre comes this close to its hole
_FLOOR_Z = -0.9196429  # ManiSkill's table top is z = 0, the floor is below it
_PARK_XY = (-1.2, 1.2)  # unused blocks wait on the floor out of every view

HOLD_ACTION = torch.tensor([0, 0, 0, 0, 0, 0, 1.0])  # no motion, gripper open

INSTRUCTION = "put the {shape} block into the {shape} hole"
INSTRUCTION_FULL_BOARD = "put every block into its matching hole"


def _mesh_cache_dir() -> Path:
    root = os.environ.get("SAB_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "shape_assembly_bench")
    path = Path(root) / "meshes"
    path.mkdir(parents=True, exist_ok=True)
    return path


def convex_mesh_file(vertices: np.ndarray) -> str:
    """Write a convex piece to an .obj named by its content; atomic, shared by workers."""
    vertices = np.round(np.asarray(vertices, dtype=np.float64), 9)
    key = hashlib.sha256(vertices.tobytes()).hexdigest()[:24]
    path = _mesh_cache_dir() / f"{key}.obj"
    if not path.exists():
        fd, tmp = tempfile.mkstemp(suffix=".obj", dir=path.parent)
        os.close(fd)
        geometry.write_convex_obj(vertices, tmp)
        os.replace(tmp, path)
    return str(path)


def _quat_yaw(yaw: np.ndarray) -> np.ndarray:
    yaw = np.asarray(yaw, dtype=np.float64)
    return np.stack([np.cos(yaw / 2), np.zeros_like(yaw), np.zeros_like(yaw), np.sin(yaw / 2)], axis=-1)


def yaw_from_quat(q: np.ndarray) -> np.ndarray:
    """Yaw (rad) of wxyz quaternions about world z."""
    q = np.asarray(q)
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    return np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def third_person_pose(offset=(0.0, 0.0, 0.0, 0.0, 0.0)):
    """Third-person camera pose: nominal eye moved by (dx, dy, dz) and its view turned by (dyaw, dpitch)."""
    dx, dy, dz, dyaw, dpitch = offset
    eye = np.array(THIRD_PERSON_EYE) + [dx, dy, dz]
    view = np.array(THIRD_PERSON_TARGET) - np.array(THIRD_PERSON_EYE)
    c, s = np.cos(dyaw), np.sin(dyaw)
    view = np.array([c * view[0] - s * view[1], s * view[0] + c * view[1], view[2]])
    horiz = np.hypot(view[0], view[1])
    pitch = np.arctan2(view[2], horiz) + dpitch
    heading = np.arctan2(view[1], view[0])
    n = np.linalg.norm(view)
    view = n * np.array([np.cos(pitch) * np.cos(heading), np.cos(pitch) * np.sin(heading), np.sin(pitch)])
    return sapien_utils.look_at(eye=eye, target=eye + view)


def _set_entity_color(entity, rgb) -> None:
    """Set the base colour of every visual part, dropping textures (a drawn colour replaces the wood grain)."""
    body = entity.find_component_by_type(sapien.render.RenderBodyComponent)
    if body is None:
        return
    for shape in body.render_shapes:
        parts = shape.parts if hasattr(shape, "parts") else [shape]
        for part in parts:
            part.material.base_color_texture = None
            part.material.set_base_color([*rgb[:3], 1.0])


def _set_actor_color(actor, rgb) -> None:
    for entity in actor._objs:
        _set_entity_color(entity, rgb)


def _yaw_t(q: torch.Tensor) -> torch.Tensor:
    """Yaw (rad) of wxyz quaternions about world z, as a tensor."""
    w, x, y, z = q.unbind(-1)
    return torch.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def _rotmat(q: torch.Tensor) -> torch.Tensor:
    w, x, y, z = q.unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ], dim=-1).reshape(q.shape[:-1] + (3, 3))


def success_conditions(own_dist, bottom, speed, touched, opening, clearance):
    """The spec's four success conditions per block (tensors of shape (scenes, blocks)).

    own_dist: distance (m) of each block centre from its own hole's centre in the board plane;
    bottom: lowest point of each block above the board's base (m); speed: m/s;
    touched: any finger touches the block; opening: gripper opening fraction per scene.
    """
    matched = own_dist <= clearance + MATCH_MARGIN_M
    deep = bottom <= geometry.PLATE_TOP_Z - DEEP_M
    released = (~touched) & (opening >= RELEASED_OPENING).unsqueeze(-1)
    settled = speed < SETTLED_MPS
    return matched, deep, released, settled


def next_streak(streak, success_now):
    """Consecutive steps with all conditions true; any break resets it to zero."""
    return torch.where(success_now, streak + 1, torch.zeros_like(streak))


@register_env(ENV_ID, max_episode_steps=300)
class ShapeAssemblyEnv(BaseEnv):
    __doc__ = __doc__

    SUPPORTED_REWARD_MODES = ("none", "sparse")

    def __init__(self, *args, setup: str | Setup = "A01", arm: str = "panda", **kwargs):
        self.task_setup = setup if isinstance(setup, Setup) else get_setup(setup)
        self.arm: ArmSpec = get_arm(arm)
        check_assets(self.arm)
        register_agents()
        kwargs.setdefault("control_mode", "pd_ee_delta_pose")
        kwargs.setdefault("sim_backend", "physx_cpu")
        super().__init__(*args, robot_uids=self.arm.maniskill_uid, **kwargs)

    # ------------------------------------------------------------------ config
    @property
    def _default_sim_config(self):
        return SimConfig(
            sim_freq=SIM_FREQ,
            control_freq=CONTROL_FREQ,
            scene_config=SceneConfig(
                contact_offset=0.005,
                rest_offset=0.0,
                solver_position_iterations=20,
                solver_velocity_iterations=1,
                enable_tgs=True,
            ),
        )

    @property
    def _default_sensor_configs(self):
        pose = sapien_utils.look_at(eye=THIRD_PERSON_EYE, target=THIRD_PERSON_TARGET)
        w, h = THIRD_PERSON_SIZE
        return [CameraConfig(THIRD_PERSON_CAMERA, pose, w, h, 1.0, 0.01, 10)]

    @property
    def _default_human_render_camera_configs(self):
        pose = sapien_utils.look_at(eye=THIRD_PERSON_EYE, target=THIRD_PERSON_TARGET)
        return CameraConfig("render_camera", pose, 512, 512, 1.0, 0.01, 10)

    # ------------------------------------------------------------------- build
    def _load_agent(self, options: dict):
        super()._load_agent(options, sapien.Pose(p=[*self.arm.base_xy, 0]))

    def _load_lighting(self, options: dict):
        ambient, lights = LIGHTING[self.task_setup.lighting]
        self.scene.set_ambient_light(list(ambient))
        for direction, color in lights:
            self.scene.add_directional_light(list(direction), list(color))
        self._lights = [
            c for sub in self.scene.sub_scenes for e in sub.entities if e.name == "directional_light"
            for c in e.components if isinstance(c, sapien.render.RenderDirectionalLightComponent)
        ]

    def _load_scene(self, options: dict):
        self.table_scene = TableSceneBuilder(self, robot_init_qpos_noise=0.0)
        self.table_scene.build()
        self.clearance = self.task_setup.clearance_m
        self.board = self._build_board()
        self.blocks = {shape: self._build_block(shape) for shape in geometry.SHAPES}
        self.distractors = {kind: self._build_distractor(kind) for kind in geometry.DISTRACTOR_HEIGHT}
        self.occluder = self._build_occluder() if self.task_setup.occlusion else None
        cells = geometry.cell_centres()
        self._cell_xy = torch.tensor(np.stack([cells[s] for s in geometry.SHAPES]), dtype=torch.float32, device=self.device)
        normals, offsets = [], []
        for shape in geometry.SHAPES:
            n, d = geometry._halfplanes(geometry.hole_outline(shape, self.clearance))
            normals.append(torch.tensor(n, dtype=torch.float32))
            offsets.append(torch.tensor(d, dtype=torch.float32))
        self._hole_halfplanes = [(n.to(self.device), d.to(self.device)) for n, d in zip(normals, offsets)]
        self._outlines = [torch.tensor(geometry.block_outline(s), dtype=torch.float32, device=self.device) for s in geometry.SHAPES]
        prism = [geometry.block_collision_parts(s)[0] for s in geometry.SHAPES]
        n_max = max(len(v) for v in prism)  # pad with repeated vertices so that all shapes stack
        self._prism_vertices = torch.tensor(
            np.stack([np.concatenate([v, np.repeat(v[:1], n_max - len(v), 0)]) for v in prism]),
            dtype=torch.float32, device=self.device)
        self._fingers = [self.agent.robot.links_map[name] for name in self.arm.finger_links]
        self._finger_entity = {c.entity.global_id: f for f, link in enumerate(self._fingers) for c in link._objs}
        self._block_entity = {e.global_id: k for k, s in enumerate(geometry.SHAPES) for e in self.blocks[s]._objs}

    def _build_board(self):
        builder = self.scene.create_actor_builder()
        material = sapien.render.RenderMaterial(base_color=BOARD_COLOR, roughness=0.8)
        physical = sapien.physx.PhysxMaterial(static_friction=0.5, dynamic_friction=0.5, restitution=0.0)
        for piece in geometry.plate_pieces(self.clearance):
            path = convex_mesh_file(piece)
            builder.add_convex_collision_from_file(path, material=physical)
            builder.add_visual_from_file(path, material=material)
        for centre, half in geometry.rail_boxes():
            builder.add_box_collision(sapien.Pose(p=centre), half, material=physical)
            builder.add_box_visual(sapien.Pose(p=centre), half, material=material)
        builder.initial_pose = sapien.Pose(p=[0, 0, 0])
        return builder.build_kinematic(name="board")

    def _build_block(self, shape: str):
        builder = self.scene.create_actor_builder()
        material = sapien.render.RenderMaterial(base_color=BLOCK_COLORS[shape], roughness=0.5)
        physical = sapien.physx.PhysxMaterial(static_friction=0.6, dynamic_friction=0.6, restitution=0.0)
        for part in geometry.block_collision_parts(shape):
            path = convex_mesh_file(part)
            builder.add_convex_collision_from_file(path, material=physical, density=800)
            builder.add_visual_from_file(path, material=material)
        builder.initial_pose = sapien.Pose(p=[*_PARK_XY, _FLOOR_Z + 1])
        return builder.build(name=f"block_{shape}")

    def _build_distractor(self, kind: str):
        builder = self.scene.create_actor_builder()
        material = sapien.render.RenderMaterial(base_color=DISTRACTOR_COLORS[kind], roughness=0.6)
        for part in geometry.distractor_collision_parts(kind):
            path = convex_mesh_file(part)
            builder.add_convex_collision_from_file(path, density=500)
            builder.add_visual_from_file(path, material=material)
        builder.initial_pose = sapien.Pose(p=[*_PARK_XY, _FLOOR_Z + 1])
        return builder.build(name=f"distractor_{kind}")

    def _build_occluder(self):
        """A grey panel with no collision shape: it hides part of the board from the third-person camera."""
        builder = self.scene.create_actor_builder()
        h = OCCLUSION_HALF_SIZE
        builder.add_box_visual(half_size=[0.002, h, h], material=sapien.render.RenderMaterial(base_color=(0.35, 0.35, 0.38, 1)))
        eye = np.array(THIRD_PERSON_EYE)
        aim = np.array([0.03, geometry.cell_centres()["circle"][1], geometry.PLATE_TOP_Z])
        centre = eye + OCCLUSION_FRACTION * (aim - eye)
        builder.initial_pose = sapien_utils.look_at(eye=centre, target=eye).sp  # the panel's x axis faces the camera
        return builder.build_kinematic(name="occluder")

    # ----------------------------------------------------------------- episode
    def _initialize_episode(self, env_idx: torch.Tensor, options: dict):
        b = len(env_idx)
        starts = options.get("starts") or ([options["start"]] * b if options.get("start") is not None else None)
        if starts is None:
            starts = [sample_start(self.task_setup, np.random.default_rng(int(self._episode_seed[i]))) for i in range(b)]
        starts = [s if isinstance(s, StartState) else StartState.from_dict(s) for s in starts]
        if len(starts) != b:
            raise ValueError(f"got {len(starts)} start states for {b} scenes")
        self.starts = starts
        with torch.device(self.device):
            self.table_scene.initialize(env_idx)
            self.agent.reset(torch.tensor(self.arm.rest_qpos, dtype=torch.float32).repeat(b, 1))
            self.agent.robot.set_pose(sapien.Pose(p=[*self.arm.base_xy, 0]))
            board_p = torch.tensor([[s.board_x, s.board_y, 0.0] for s in starts], dtype=torch.float32)
            board_q = torch.tensor(_quat_yaw([s.board_yaw for s in starts]), dtype=torch.float32)
            self.board.set_pose(Pose.create_from_pq(board_p, board_q))
            for k, shape in enumerate(geometry.SHAPES):
                placed = [next((x for x in st.blocks if x.shape == shape), None) for st in starts]
                self._place(self.blocks[shape], placed, geometry.BLOCK_HEIGHT, park_slot=k)
            for k, kind in enumerate(geometry.DISTRACTOR_HEIGHT):
                placed = [next((x for x in st.distractors if x.kind == kind), None) for st in starts]
                self._place(self.distractors[kind], placed, geometry.DISTRACTOR_HEIGHT[kind], park_slot=3 + k)
            self._active = torch.tensor([[any(x.shape == s for x in st.blocks) for s in geometry.SHAPES] for st in starts])
            self._target_mask = torch.tensor(
                [[st.target in ("all", s) and any(x.shape == s for x in st.blocks) for s in geometry.SHAPES] for st in starts]
            )
        self.instructions = [
            INSTRUCTION_FULL_BOARD if st.target == "all" else INSTRUCTION.format(shape=st.target) for st in starts
        ]
        self._apply_appearance(starts[0])
        self._reset_task_state(env_idx)

    def _place(self, actor, placed, height, park_slot):
        """Put an actor at its start (x, y, yaw on the table) or park it on the floor when unused."""
        b = len(placed)
        p = torch.zeros((b, 3))
        yaw = np.zeros(b)
        for i, x in enumerate(placed):
            if x is None:
                p[i] = torch.tensor([_PARK_XY[0], _PARK_XY[1] + 0.15 * park_slot, _FLOOR_Z + height / 2])
            else:
                p[i] = torch.tensor([x.x, x.y, height / 2 + 1e-4])
                yaw[i] = x.yaw
        actor.set_pose(Pose.create_from_pq(p, torch.tensor(_quat_yaw(yaw), dtype=torch.float32)))
        actor.set_linear_velocity(torch.zeros((b, 3)))
        actor.set_angular_velocity(torch.zeros((b, 3)))

    def _apply_appearance(self, start: StartState) -> None:
        """Colours, key light and camera pose of a try: they change images only, never physics."""
        colors = start.colors or {}
        for shape, actor in self.blocks.items():
            _set_actor_color(actor, colors.get(shape, DEFAULT_BLOCK_RGB[shape]))
        _set_actor_color(self.board, colors.get("board", BOARD_COLOR[:3]))
        if "table" in colors:  # only setups that draw colours draw the table's, for every try
            for entity in self.table_scene.table._objs:
                _set_entity_color(entity, colors["table"])
        if self._lights:
            key = start.light_color or LIGHTING[self.task_setup.lighting][1][0][1]
            for light in self._lights[:: len(LIGHTING[self.task_setup.lighting][1])]:
                light.color = list(key)
        if THIRD_PERSON_CAMERA in self._sensors:
            self._sensors[THIRD_PERSON_CAMERA].camera.set_local_pose(third_person_pose(start.camera_offset).sp)

    def _reset_task_state(self, env_idx):
        n = self.num_envs
        if not hasattr(self, "_streak") or self._streak.shape[0] != n:
            z = lambda dtype=torch.bool: torch.zeros(n, dtype=dtype, device=self.device)  # noqa: E731
            self._streak = z(torch.int32)
            self._flags = {k: z() for k in ("wrong_hole", "penetration", "dropped")}
            self._carried = torch.zeros((n, 3), dtype=torch.bool, device=self.device)
            self._untouched_steps = torch.zeros((n, 3), dtype=torch.int32, device=self.device)
            self._lost_while_holding = torch.zeros((n, 3), dtype=torch.bool, device=self.device)
            self._last_gripper_cmd = torch.ones(n, device=self.device)
            self._steps_done = z(torch.int32)
            self._dist_fired = z()
            self._dist_step = z(torch.int32)
            self._forced_open_left = z(torch.int32)
            self._forced_now = z()
            self._pending = torch.zeros((self.task_setup.latency_steps, n, 7), device=self.device)
        self._streak[env_idx] = 0
        for f in self._flags.values():
            f[env_idx] = False
        self._carried[env_idx] = False
        self._untouched_steps[env_idx] = 0
        self._lost_while_holding[env_idx] = False
        self._last_gripper_cmd[env_idx] = 1.0
        self._steps_done[env_idx] = 0
        self._dist_fired[env_idx] = False
        self._dist_step[env_idx] = -1
        self._forced_open_left[env_idx] = 0
        self._pending[:, env_idx] = HOLD_ACTION.to(self.device)  # latency: the first steps hold still
        self._conditions = None

    # --------------------------------------------------------------- predicates
    def _block_raw_poses(self) -> torch.Tensor:
        """(b, 3 shapes, 7) block poses (p, wxyz), read once per step."""
        return torch.stack([self.blocks[s].pose.raw_pose for s in geometry.SHAPES], 1)

    def _block_state(self):
        """Per block (b, 3 shapes, ...): board-frame xy, yaw, bottom z, speed."""
        board = self.board.pose.raw_pose
        poses = self._block_raw_poses()
        byaw = _yaw_t(board[:, 3:7])
        c, s = torch.cos(-byaw)[:, None], torch.sin(-byaw)[:, None]
        d = poses[..., :2] - board[:, None, :2]
        local_xy = torch.stack([c * d[..., 0] - s * d[..., 1], s * d[..., 0] + c * d[..., 1]], -1)
        yaw = _yaw_t(poses[..., 3:7]) - byaw[:, None]
        bottom = self._bottoms(poses) - board[:, None, 2]
        speed = torch.stack([torch.linalg.norm(self.blocks[s].linear_velocity, dim=-1) for s in geometry.SHAPES], 1)
        return local_xy, yaw, bottom, speed

    def _bottoms(self, poses: torch.Tensor) -> torch.Tensor:
        """(b, 3) lowest world z of each block's prism."""
        rot_z = _rotmat(poses[..., 3:7])[..., 2, :]  # (b, 3, 3): the world-z row
        z = torch.einsum("bkj,kvj->bkv", rot_z, self._prism_vertices) + poses[..., 2:3]
        return z.min(dim=-1).values

    def _finger_forces(self):
        """(b, 3 shapes, 2 fingers) contact force norms between fingers and blocks."""
        if self.gpu_sim_enabled:
            out = torch.zeros((self.num_envs, 3, 2), device=self.device)
            for k, shape in enumerate(geometry.SHAPES):
                for f, link in enumerate(self._fingers):
                    out[:, k, f] = torch.linalg.norm(
                        self.scene.get_pairwise_contact_forces(link, self.blocks[shape]), dim=-1)
            return out
        # CPU: one pass over this step's contacts instead of one pass per (finger, block) pair
        impulse = np.zeros((3, 2, 3))
        for contact in self.scene.px.get_contacts():
            a, b = contact.bodies[0].entity, contact.bodies[1].entity
            for e1, e2, sign in ((a, b, 1.0), (b, a, -1.0)):
                f = self._finger_entity.get(e1.global_id)
                k = self._block_entity.get(e2.global_id)
                if f is not None and k is not None:
                    impulse[k, f] += sign * np.sum([p.impulse for p in contact.points], axis=0)
        force = np.linalg.norm(impulse, axis=-1) / self.scene.px.timestep
        return torch.as_tensor(force, dtype=torch.float32, device=self.device)[None]

    def _in_polygon(self, xy: torch.Tensor, hole: int, tol: float = 0.0) -> torch.Tensor:
        n, d = self._hole_halfplanes[hole]
        rel = xy - self._cell_xy[hole]
        return ((rel @ n.T) <= d + tol).all(dim=-1)

    def _compute_conditions(self) -> dict[str, torch.Tensor]:
        local_xy, yaw, bottom, speed = self._block_state()
        forces = self._finger_forces()
        arm_q = self.agent.robot.get_qpos()
        opening = self.arm.opening_from_qpos(arm_q)
        top = geometry.PLATE_TOP_Z
        own_dist = torch.linalg.norm(local_xy - self._cell_xy.unsqueeze(0), dim=-1)  # (b, 3)
        touched = (forces > CONTACT_EPS_N).any(dim=-1)
        matched, deep, released, settled = success_conditions(own_dist, bottom, speed, touched, opening, self.clearance)
        ok = matched & deep & released & settled
        active = self._active.to(self.device)
        target = self._target_mask.to(self.device)
        success_now = torch.where(target, ok, torch.ones_like(ok)).all(dim=1) & target.any(dim=1)

        # which hole footprint each block centre is over
        in_hole = torch.stack([self._in_polygon(local_xy, h) for h in range(3)], dim=-1)  # (b, block, hole)
        eye = torch.eye(3, dtype=torch.bool, device=self.device)
        over_other = (in_hole & ~eye).any(-1)
        over_own = (in_hole & eye).any(-1)
        half = torch.tensor([geometry.CELL_SIZE / 2, 1.5 * geometry.CELL_SIZE], device=self.device)
        over_board = (local_xy.abs() < half).all(-1)
        wrong_hole = (active & deep & over_other).any(1)
        # penetration: inside the plate's slab where there is no opening, or outline through a wall, or under the table
        in_slab = (bottom < top - PENETRATION_TOL_M) & (bottom > top - geometry.PLATE_THICKNESS - geometry.BLOCK_HEIGHT)
        solid = over_board & ~in_hole.any(-1)
        outline_out = torch.zeros_like(in_slab)
        for k in range(3):
            c, s = torch.cos(yaw[:, k]), torch.sin(yaw[:, k])
            rot = torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)  # (b, 2, 2)
            pts = torch.einsum("bij,vj->bvi", rot, self._outlines[k]) + local_xy[:, k:k + 1, :]
            outline_out[:, k] = ~self._in_polygon(pts, k, PENETRATION_TOL_M).all(-1)
        penetration = (active & ((in_slab & (solid | (over_own & outline_out))) | (bottom < -0.005))).any(1)
        # dropped: a carried block loses both fingers for a few steps while the gripper is commanded closed
        grasped = (forces > GRASP_FORCE_N).all(-1)
        lifted = bottom > 0.01
        self._carried |= grasped & lifted & active
        # the policy commanded a closed gripper and no disturbance forced it open (F04 releases are not drops)
        holding = ((self._last_gripper_cmd < 0) & ~self._forced_now).unsqueeze(1)
        lost_now = touched.logical_not() & (self._untouched_steps == 0)
        self._lost_while_holding = torch.where(lost_now, holding.expand_as(lost_now), self._lost_while_holding)
        self._untouched_steps = torch.where(touched, torch.zeros_like(self._untouched_steps), self._untouched_steps + 1)
        fell = self._carried & (self._untouched_steps >= DROP_CONFIRM_STEPS) & ~deep
        dropped_now = (fell & self._lost_while_holding & ~(over_own & matched)).any(1)
        self._carried &= ~fell
        rim = (target & ~deep & released & settled & over_board & (bottom > top - DEEP_M)).any(1)
        inserted = (active & matched & deep).sum(1)
        return dict(
            success_now=success_now, matched=(matched | ~target).all(1), deep=(deep | ~target).all(1),
            released=(released | ~target).all(1), settled=(settled | ~target).all(1),
            wrong_hole=wrong_hole, penetration=penetration, dropped=dropped_now, rim=rim,
            is_grasped=(grasped & target).any(1), blocks_inserted=inserted,
        )

    # --------------------------------------------------------------- stepping
    def _step_action(self, action):
        action = torch.as_tensor(np.asarray(action) if not isinstance(action, torch.Tensor) else action,
                                 dtype=torch.float32, device=self.device).reshape(self.num_envs, -1).clone()
        if len(self._pending):  # latency: apply the action given k steps ago
            self._pending = torch.cat([self._pending, action[None]], 0)
            action, self._pending = self._pending[0].clone(), self._pending[1:]
        self._last_gripper_cmd = action[:, -1].clone()
        forced = self._forced_open_left > 0  # F04: the gripper is forced open, whatever the policy says
        self._forced_now = forced
        action[forced, -1] = 1.0
        self._forced_open_left = torch.clamp(self._forced_open_left - 1, min=0)
        if self.control_mode == "pd_ee_delta_pose":
            # ManiSkill 3.0.1 scales the rotation part by rot_lower (-0.1), which turns it the wrong way;
            # flip it so that +yaw turns counter-clockwise about world z, as the action convention says
            action[:, 3:6] = -action[:, 3:6]
            action[:, -1] = self.arm.gripper_command_to_action(action[:, -1])
        return super()._step_action(action if self.num_envs > 1 else action[0])

    def _after_control_step(self):
        super()._after_control_step()
        self._steps_done += 1
        self._disturb()
        cond = self._compute_conditions()
        self._streak = next_streak(self._streak, cond["success_now"])
        for k in self._flags:
            self._flags[k] |= cond[k]
        self._conditions = cond

    def _target_index(self) -> list[int | None]:
        return [geometry.SHAPES.index(st.target) if st.target in geometry.SHAPES else None for st in self.starts]

    def _fire(self, i: int) -> None:
        self._dist_fired[i] = True
        self._dist_step[i] = int(self._steps_done[i])

    def _disturb(self) -> None:
        """Shove (F03), forced drop (F04) and nudge (F05), each fired at most once per try."""
        setup = self.task_setup
        if setup.disturbance is None:
            return
        for i, k in enumerate(self._target_index()):
            if k is None or bool(self._dist_fired[i]):
                continue
            block = self.blocks[geometry.SHAPES[k]]
            st = self.starts[i]
            if setup.shove_step is not None and int(self._steps_done[i]) == setup.shove_step:
                v = block.linear_velocity.clone()
                v[i] = torch.tensor([*st.shove_velocity, 0.0], device=self.device)
                block.set_linear_velocity(v)
                self._fire(i)
                continue
            bottom = float(self._block_bottom(k)[i])
            if setup.forced_drop_steps and bottom >= FORCED_DROP_TRIGGER_M:
                self._forced_open_left[i] = setup.forced_drop_steps
                self._fire(i)
            elif setup.nudge_m or setup.nudge_deg:
                hole = self._hole_world_xy(k)[i]
                near = float(torch.linalg.norm(block.pose.p[i, :2] - hole)) < NUDGE_RADIUS_M
                carried = bool(self._carried[i, k]) and bottom > geometry.PLATE_TOP_Z + 0.005
                if near and carried:
                    pose = self.board.pose
                    p, yaw = pose.p.clone(), yaw_from_quat(pose.q.cpu().numpy())
                    dx, dy, dyaw = st.nudge
                    p[i, 0] += dx
                    p[i, 1] += dy
                    yaw[i] += dyaw
                    self.board.set_pose(Pose.create_from_pq(p, torch.tensor(_quat_yaw(yaw), dtype=torch.float32)))
                    self._fire(i)

    def _block_bottom(self, k: int) -> torch.Tensor:
        return self._bottoms(self._block_raw_poses())[:, k]

    def _hole_world_xy(self, k: int) -> torch.Tensor:
        board = self.board.pose
        yaw = torch.as_tensor(yaw_from_quat(board.q.cpu().numpy()), dtype=torch.float32, device=self.device)
        c, s = torch.cos(yaw), torch.sin(yaw)
        cx, cy = self._cell_xy[k]
        return board.p[:, :2] + torch.stack([c * cx - s * cy, s * cx + c * cy], -1)

    def evaluate(self) -> dict[str, Any]:
        n = self.num_envs
        cond = self._conditions
        if cond is None:  # right after reset: nothing has been simulated yet
            f = torch.zeros(n, dtype=torch.bool, device=self.device)
            cond = dict(matched=f, deep=f, released=f, settled=f, rim=f, is_grasped=f,
                        blocks_inserted=torch.zeros(n, dtype=torch.int64, device=self.device))
        out = {k: cond[k] for k in ("matched", "deep", "released", "settled", "rim", "is_grasped", "blocks_inserted")}
        out.update({k: v.clone() for k, v in self._flags.items()})
        out["success_streak"] = self._streak.clone()
        out["disturbance_fired"] = self._dist_fired.clone()
        out["disturbance_step"] = self._dist_step.clone()
        out["success"] = self._streak >= SUCCESS_HOLD_STEPS
        return out

    # -------------------------------------------------------------- observation
    def task_state(self) -> dict[str, np.ndarray]:
        """Exact simulator state for reference and adapted policies (numpy, batch first)."""
        tcp = self.arm.grasp_pose(self.agent.tcp_pose)  # on every arm: z along the approach, y along the closing
        board = self.board.pose
        cells = geometry.cell_centres()
        byaw = yaw_from_quat(board.q.cpu().numpy())
        hole_xy = np.stack([
            board.p[:, :2].cpu().numpy() + np.stack([
                np.cos(byaw) * cells[s][0] - np.sin(byaw) * cells[s][1],
                np.sin(byaw) * cells[s][0] + np.cos(byaw) * cells[s][1]], -1)
            for s in geometry.SHAPES], 1)
        qpos = self.agent.robot.get_qpos().cpu().numpy()
        return dict(
            tcp_p=tcp.p.cpu().numpy(), tcp_q=tcp.q.cpu().numpy(),
            gripper_opening=self.arm.opening_from_qpos(qpos),
            block_p=np.stack([self.blocks[s].pose.p.cpu().numpy() for s in geometry.SHAPES], 1),
            block_q=np.stack([self.blocks[s].pose.q.cpu().numpy() for s in geometry.SHAPES], 1),
            hole_xy=hole_xy, hole_yaw=np.repeat(byaw[:, None], 3, 1),
            board_top_z=board.p[:, 2].cpu().numpy() + geometry.PLATE_TOP_Z,
            active=self._active.cpu().numpy(), target=self._target_mask.cpu().numpy(),
            is_grasped=self.evaluate()["is_grasped"].cpu().numpy(),
        )

    def _get_obs_extra(self, info: dict):
        obs = dict(tcp_pose=self.agent.tcp_pose.raw_pose)
        if self.obs_mode_struct.use_state:
            obs.update(
                block_poses=torch.cat([self.blocks[s].pose.raw_pose for s in geometry.SHAPES], -1),
                board_pose=self.board.pose.raw_pose,
                target=self._target_mask.to(self.device).float(),
                active=self._active.to(self.device).float(),
            )
        return obs

    def compute_sparse_reward(self, obs: Any, action: torch.Tensor, info: dict):
        return info["success"].float()
