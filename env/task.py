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

**Success** (predicate v2, ``SUCCESS_PREDICATE_VERSION``; evaluated every control step, all four for
10 steps in a row):
1. matched: the block's centre is within clearance + 3 mm of its own hole's centre in the board plane;
2. deep: every vertex of the block's bottom face is at least 25 mm below the plate's top face, and the
   block is upright: its axis within the tilt a block standing through its own hole can have at this
   clearance (``env.geometry.max_upright_tilt`` at clearance + the 1 mm overlap tolerance);
3. released: on every physics substep of the step no finger touches the block and the gripper is at
   least 90% open;
4. settled: on every physics substep of the step no point of the block moves faster than 2 cm/s.
A try is a success only if, besides, it never raised a vetoing flag (``VETO_FLAGS``: ``wrong_hole``,
``penetration``, ``glitch``); ``info["success_raw"]`` is the predicate's own verdict, and a vetoed one
ends the try (``info["fail"]``). ``info`` carries each condition, the streak counter and the flags
``wrong_hole`` (a block through another shape's hole), ``penetration`` (a block more than 1 mm inside
the plate, by an exact convex overlap test; through the plate where there is no hole; under the
table), ``glitch`` (a block no robot link, other body or disturbance touched gained mechanical
energy), ``dropped`` (all sticky over the try) and ``rim`` (the block rests on the board, not through,
right now).

**Physics choices.** The board is a plate of convex prisms around each hole
(see :mod:`env.geometry`), so a block passes only through a real opening. The
simulation runs at 500 Hz (25 substeps per 20 Hz control step) with 20 position
iterations and TGS: at 100 Hz a block moving at 5 cm/s travels 0.5 mm per step,
as much as the tightest clearance, and PhysX then resolves wall contacts late and
jams or tunnels; at 500 Hz the per-step motion is 0.1 mm. Contact offset is
5 mm (contacts are generated before the walls meet, which also keeps the
solver from seeing deep first contacts), rest offset 0 so that the geometric
clearance is the physical clearance. The blocks' and distractors' depenetration
speed is capped at 1 m/s: PhysX's default is unbounded, and a block whose corner
dropped into a wrong hole's gap was pushed out of the wall fast enough to gain up
to 34 mJ and leave the board. A tighter cap (0.2 m/s) also slowed how fast the
closing fingers are pushed out of a grasped block, so grasps closed further into
the knob than under v1; at 1 m/s grasps are v1's and no block leaves the board.
Gains that remain are flagged ``glitch`` (``benchmarks/wrong_hole_energy.py``).

**GPU scenes** (``sim_backend="physx_cuda"``, ``num_envs`` N). ManiSkill calls ``_after_control_step`` before
its own fetch of the GPU buffers; the predicate still reads the step's own state, because the per-substep
monitor fetches every buffer after each substep (``_after_simulation_step``), the last one included. A
shove or nudge writes its scene's rows of the rigid-body buffer and pushes them into PhysX at once
(``px.gpu_apply_rigid_dynamic_data``), before ManiSkill's fetch would overwrite them, so that it acts on the
next step as on the CPU. A reset of some scenes (``options["env_idx"]``) writes only their rows of the
per-scene state (``starts``, ``instructions``, active and target blocks, counters, flags); a start drawn from
a seed uses the seed of the scene's own index, so a partial reset needs one seed per scene (N) or none.
Appearance, per scene where ManiSkill renders each sub-scene apart: the key light (each sub-scene has its
own lights) and the third-person camera pose (each sub-scene has its own render camera). Colours cannot
differ between sub-scenes: SAPIEN builds every sub-scene's render shapes of an actor with the same material
objects (the table's come from one cached model), so a colour set on one is set on all. A batch whose
scenes would differ in colours is refused with one line, and the caller splits its batches by colours;
with ``render_backend="none"`` nothing is rendered and appearance is not applied or checked.
"""

from __future__ import annotations

import functools
import hashlib
import math
import sys
import time
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

from env import appearance, geometry, overlap
from env.cache import cache_root, reuse, write_sealed
from env.arms import ArmSpec, check_assets, get_arm, register_agents
from env.predicate import (DEEP_M, GLITCH_ENERGY_J, MATCH_MARGIN_M, PENETRATION_TOL_M, RELEASED_OPENING,  # noqa: F401
                           SETTLED_MPS, STICKY_FLAGS, SUCCESS_HOLD_STEPS, SUCCESS_PREDICATE_VERSION,
                           TABLE_PENETRATION_M, VETO_FLAGS)
from env.setups import CONTROL_FREQ, Setup, get_setup
from env.setups import HOLD_ACTION as HOLD_ACTION_VALUES
from env.starts import DEFAULT_BLOCK_RGB, StartState, sample_start

ENV_ID = "ShapeAssembly-v1"
SIM_FREQ = 500
CONTACT_EPS_N = 1e-3
GRASP_FORCE_N = 0.5
DROP_CONFIRM_STEPS = 3
MAX_DEPENETRATION_MPS = 1.0
GRAVITY_MPS2 = 9.81
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

HOLD_ACTION = torch.tensor(HOLD_ACTION_VALUES)  # no motion, gripper open

from env.instructions import INSTRUCTION, INSTRUCTION_FULL_BOARD, all_instructions  # noqa: E402,F401


def _mesh_cache_dir() -> Path:
    path = cache_root() / "meshes"
    path.mkdir(parents=True, exist_ok=True)
    return path


def convex_mesh_file(vertices: np.ndarray) -> str:
    """Write a convex piece to an .obj named by its content; atomic, shared by workers."""
    vertices = np.round(np.asarray(vertices, dtype=np.float64), 9)
    key = hashlib.sha256(vertices.tobytes()).hexdigest()[:24]
    path = _mesh_cache_dir() / f"{key}.obj"
    if not reuse(path, "collision mesh"):  # sealed: a damaged file is written again (env.cache)
        write_sealed(path, lambda tmp: geometry.write_convex_obj(vertices, tmp))
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


def _cap_depenetration(actor):
    """Bound the speed at which PhysX pushes the actor's bodies out of an overlap (see Physics choices)."""
    for entity in actor._objs:
        _rigid(entity).set_max_depenetration_velocity(MAX_DEPENETRATION_MPS)
    return actor


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


@functools.lru_cache(maxsize=None)
def upright_bound(shape: str, clearance: float) -> float:
    """Most tilt (rad) the upright test accepts: a block through its own hole tilted more overlaps the
    plate by more than the penetration tolerance (``geometry.max_upright_tilt`` at clearance + tol).

    Kept in the project's cache (``<cache_root>/upright/``, sealed as every entry is): the search solves about
    400 small LPs per shape, 0.6 s of CPU a shape in every process that builds a scene (each worker of a run).
    An entry is named by the shape, the clearance, env/geometry.py's source and SciPy's version (its LP solver),
    so a change to any of them computes the bound afresh."""
    import json
    from importlib.metadata import version

    at = clearance + PENETRATION_TOL_M
    key = hashlib.sha256(f"{shape}|{at!r}|scipy {version('scipy')}|".encode()
                         + Path(geometry.__file__).read_bytes()).hexdigest()[:24]
    path = cache_root() / "upright" / f"{shape}-{key}.json"
    if reuse(path, "upright bound"):
        entry = json.loads(path.read_text())
        if entry.get("shape") == shape and entry.get("clearance_m") == at and isinstance(entry.get("bound_rad"), float):
            return entry["bound_rad"]
        print(f"cached upright bound {path} is not this shape's and clearance's: computing it again", file=sys.stderr)
    bound = geometry.max_upright_tilt(shape, at)
    write_sealed(path, lambda tmp: tmp.write_text(json.dumps({"shape": shape, "clearance_m": at, "bound_rad": bound})))
    return bound


def _rigid(entity) -> "sapien.physx.PhysxRigidDynamicComponent":
    return entity.find_component_by_type(sapien.physx.PhysxRigidDynamicComponent)


def success_conditions(own_dist, bottom_face_top, tilt_cos, upright_cos, point_speed, touched, opening, clearance):
    """The spec's four success conditions per block (tensors of shape (scenes, blocks)).

    own_dist: distance (m) of each block centre from its own hole's centre in the board plane;
    bottom_face_top: the highest vertex of the block's bottom face above the board's base (m);
    tilt_cos: cosine of the angle between the block's axis and vertical; upright_cos: the cosine of
    each shape's upright bound (blocks,); point_speed: the fastest point of the block on any substep of
    the step (m/s); touched: a finger touched the block on some substep; opening: the gripper's least
    opening fraction on the step's substeps, per scene.
    """
    matched = own_dist <= clearance + MATCH_MARGIN_M
    deep = (bottom_face_top <= geometry.PLATE_TOP_Z - DEEP_M) & (tilt_cos >= upright_cos)
    released = (~touched) & (opening >= RELEASED_OPENING).unsqueeze(-1)
    settled = point_speed < SETTLED_MPS
    return matched, deep, released, settled


def next_streak(streak, success_now):
    """Consecutive steps with all conditions true; any break resets it to zero."""
    return torch.where(success_now, streak + 1, torch.zeros_like(streak))


# ----------------------------------------------------------- per-scene rows of a (partial) reset
def reset_rows(env_idx, n: int) -> list[int]:
    """The scene indices a reset writes, in the order of its per-scene inputs (starts, seeds)."""
    rows = [int(i) for i in (env_idx.tolist() if hasattr(env_idx, "tolist") else env_idx)]
    if len(set(rows)) != len(rows) or not all(0 <= r < n for r in rows):
        raise ValueError(f"reset env_idx {rows} must name distinct scenes of 0..{n - 1}")
    return rows


def _full(rows: list[int], n: int) -> bool:
    return sorted(rows) == list(range(n))


def write_rows(full: list | None, rows: list[int], values: list, n: int) -> list:
    """A per-scene list of N entries with ``rows`` set to ``values`` and every other entry kept."""
    if len(values) != len(rows):
        raise ValueError(f"got {len(values)} values for {len(rows)} scenes")
    if rows == list(range(n)):
        return list(values)
    if full is None or len(full) != n:
        if not _full(rows, n):
            raise ValueError(f"a partial reset of scenes {rows} needs a reset of all {n} scenes first")
        full = [None] * n
    out = list(full)
    for r, v in zip(rows, values):
        out[r] = v
    return out


def write_tensor_rows(full: torch.Tensor | None, rows: list[int], values: torch.Tensor, n: int) -> torch.Tensor:
    """``write_rows`` for a tensor batch first: rows of ``full`` replaced in place, the others kept."""
    if rows == list(range(n)):
        return values
    if full is None or full.shape[0] != n:
        if not _full(rows, n):
            raise ValueError(f"a partial reset of scenes {rows} needs a reset of all {n} scenes first")
        full = values.new_zeros((n, *values.shape[1:]))
    full[torch.tensor(rows, device=full.device)] = values.to(full.device)
    return full


def episode_seeds(episode_seed, rows: list[int], n: int) -> list[int]:
    """The episode seed of each reset scene, by the scene's index among the N. ManiSkill keeps a seed list
    given to ``reset`` as given, so a partial reset with a seed per reset scene only would index it wrongly."""
    seeds = np.atleast_1d(np.asarray(episode_seed))
    if len(seeds) != n:
        raise ValueError(f"a reset of scenes {rows} draws starts from per-scene seeds, but there are {len(seeds)} "
                         f"seeds for {n} scenes: give reset() one seed per scene (all {n}), or the starts")
    return [int(seeds[r]) for r in rows]


def check_shared_appearance(starts: list, fields: tuple[str, ...]) -> None:
    """Refuse (one line) scenes of one batch that differ in an appearance field their sub-scenes share."""
    for name in fields:
        values = [getattr(st, name) for st in starts]
        if any(v != values[0] for v in values[1:]):
            raise ValueError(f"the scenes of one GPU batch share {name} (SAPIEN gives every sub-scene the same "
                             f"render materials and lights here): tries that differ in {name} cannot run in one "
                             f"batch; split the batch by {name}, or build the env with render_backend='none'")


# SAPIEN frees a render device's compiled pipelines with the device's last render system, so a process that
# builds a scene after dropping every earlier one (a worker moving on to the next setup, a benchmark's or a
# test's next scenes) compiled them all again: a camera scene took 4.2 s to build instead of 0.2 s on lavapipe
# (2-core AMD EPYC). One empty render system per device, kept for the process's life, keeps them.
_RENDER_CONTEXTS: dict[str, Any] = {}


def hold_render_context(device) -> None:
    """Keep ``device``'s render context (and its compiled pipelines) alive for the rest of the process."""
    key = str(device)
    if key not in _RENDER_CONTEXTS:
        _RENDER_CONTEXTS[key] = sapien.render.RenderSystem(device)


@register_env(ENV_ID, max_episode_steps=300)
class ShapeAssemblyEnv(BaseEnv):
    __doc__ = __doc__

    SUPPORTED_REWARD_MODES = ("none", "sparse")

    def __init__(self, *args, setup: str | Setup = "A01", arm: str = "panda", visual_meshes: str = "simplified",
                 **kwargs):
        self.task_setup = setup if isinstance(setup, Setup) else get_setup(setup)
        # the scene's appearance (env.appearance): "source" renders v1's meshes, for comparisons and tests
        self.appearance_version = appearance.appearance_version(visual_meshes)
        self.visual_meshes = visual_meshes
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

    # Which observations are rendered. A policy that reads the cameras on some steps only (Octo reads the
    # frames of its history window at each query step) has the rollout switch rendering off for the steps it
    # does not read: their observations carry no sensor data. A rendered frame does not depend on the renders
    # skipped before it (tests/test_rollout.py). ``last_render_ms`` is the time of the last render, 0 when
    # skipped, so that the rollout can split a step's time into physics and render.
    render_sensors: bool = True
    last_render_ms: float = 0.0

    def _get_obs_sensor_data(self, apply_texture_transforms: bool = True) -> dict:
        if not self.render_sensors:
            self.last_render_ms = 0.0
            return {}
        t0 = time.perf_counter()
        data = super()._get_obs_sensor_data(apply_texture_transforms)
        self.last_render_ms = (time.perf_counter() - t0) * 1e3
        return data

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
        # the lights of each sub-scene, in the order added (the key light first)
        self._lights = [
            [c for e in sub.entities if e.name == "directional_light"
             for c in e.components if isinstance(c, sapien.render.RenderDirectionalLightComponent)]
            for sub in self.scene.sub_scenes
        ]

    def _load_scene(self, options: dict):
        self._lights = []  # ManiSkill loads lighting only where it can render (not with render_backend="none")
        if self.scene.can_render():
            hold_render_context(self._render_device)
        self.table_scene = TableSceneBuilder(self, robot_init_qpos_noise=0.0)
        self.table_scene.build()
        if self.visual_meshes == "simplified" and self.scene.can_render():  # render bodies only: no physics
            appearance.simplify_visuals([e for sub in self.scene.sub_scenes for e in sub.entities])
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
        prism = [geometry.block_collision_parts(s)[0] for s in geometry.SHAPES]
        # shapes stack padded with repeated vertices (a repeated vertex changes no min, max or hull)
        self._prism_vertices = overlap._pad(prism).to(self.device)
        self._bottom_faces = overlap._pad([geometry.bottom_face(s) for s in geometry.SHAPES]).to(self.device)
        self._upright_cos = torch.tensor([math.cos(upright_bound(s, self.clearance)) for s in geometry.SHAPES],
                                         dtype=torch.float32, device=self.device)
        self._block_polytopes = [overlap.PolytopeSet.of([overlap.prism(v)]).to(self.device).first() for v in prism]
        plate = [overlap.prism(v) for v in geometry.plate_pieces(self.clearance)]
        plate += [overlap.box(c, h) for c, h in geometry.rail_boxes()]
        self._plate_polytopes = overlap.PolytopeSet.of(plate).to(self.device)
        self._plate_lo = self._plate_polytopes.vertices.amin(1)  # (pieces, 3) bounding boxes, board frame
        self._plate_hi = self._plate_polytopes.vertices.amax(1)
        comps = [_rigid(self.blocks[s]._objs[0]) for s in geometry.SHAPES]
        self._block_mass = torch.tensor([c.mass for c in comps], dtype=torch.float32, device=self.device)
        self._block_inertia = torch.tensor(np.stack([c.inertia for c in comps]), dtype=torch.float32, device=self.device)
        self._block_cmass = torch.tensor(np.stack([np.concatenate([c.cmass_local_pose.p, c.cmass_local_pose.q])
                                                   for c in comps]), dtype=torch.float32, device=self.device)
        self._block_points = overlap._pad([geometry.block_vertices(s) for s in geometry.SHAPES]).to(self.device)
        self._fingers = [self.agent.robot.links_map[name] for name in self.arm.finger_links]
        self._finger_entity = {c.entity.global_id: f for f, link in enumerate(self._fingers) for c in link._objs}
        self._block_entity = {e.global_id: k for k, s in enumerate(geometry.SHAPES) for e in self.blocks[s]._objs}
        # CPU contact pass: what each body is (a block; a finger; another robot link or a distractor, whose
        # touch can give a block energy); the board and the table are neither
        role = {c.entity.global_id: ("robot", -1) for link in self.agent.robot.links for c in link._objs}
        role.update({e.global_id: ("robot", -1) for d in self.distractors.values() for e in d._objs})
        role.update({gid: ("finger", f) for gid, f in self._finger_entity.items()})
        role.update({gid: ("block", k) for gid, k in self._block_entity.items()})
        self._contact_role = role
        self._block_components = comps
        # every collision vertex relative to the centre of mass, in block frame (point speeds)
        self._block_points_np = (self._block_points - self._block_cmass[:, None, :3]).cpu().numpy().astype(np.float64)
        self._gpu_contact_query = None

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
        return _cap_depenetration(builder.build(name=f"block_{shape}"))

    def _build_distractor(self, kind: str):
        builder = self.scene.create_actor_builder()
        material = sapien.render.RenderMaterial(base_color=DISTRACTOR_COLORS[kind], roughness=0.6)
        for part in geometry.distractor_collision_parts(kind):
            path = convex_mesh_file(part)
            builder.add_convex_collision_from_file(path, density=500)
            builder.add_visual_from_file(path, material=material)
        builder.initial_pose = sapien.Pose(p=[*_PARK_XY, _FLOOR_Z + 1])
        return _cap_depenetration(builder.build(name=f"distractor_{kind}"))

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
        n = self.num_envs
        rows = reset_rows(env_idx, n)  # the scenes reset, in the order of the given starts
        b = len(rows)
        starts = options.get("starts") or ([options["start"]] * b if options.get("start") is not None else None)
        if starts is None:
            starts = [sample_start(self.task_setup, np.random.default_rng(seed))
                      for seed in episode_seeds(self._episode_seed, rows, n)]
        starts = [s if isinstance(s, StartState) else StartState.from_dict(s) for s in starts]
        if len(starts) != b:
            raise ValueError(f"got {len(starts)} start states for {b} scenes")
        # ManiSkill writes the reset scenes' rows in ascending order (its reset mask): order the starts so
        order = sorted(range(b), key=rows.__getitem__)
        rows, starts = [rows[j] for j in order], [starts[j] for j in order]
        all_starts = write_rows(getattr(self, "starts", None), rows, starts, n)
        self._check_appearance(all_starts)  # before the task writes anything: a refused reset keeps its state
        self.starts = all_starts
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
            active = torch.tensor([[any(x.shape == s for x in st.blocks) for s in geometry.SHAPES] for st in starts])
            target = torch.tensor(
                [[st.target in ("all", s) and any(x.shape == s for x in st.blocks) for s in geometry.SHAPES] for st in starts]
            )
        self._active = write_tensor_rows(getattr(self, "_active", None), rows, active, n)
        self._target_mask = write_tensor_rows(getattr(self, "_target_mask", None), rows, target, n)
        if not self.gpu_sim_enabled:
            self._active_np = self._active[0].numpy().copy()  # CPU substep monitor: one scene
            self._active_idx = [k for k in range(3) if self._active_np[k]]
        self._grip_idx = list(self.arm.gripper_qpos_idx)
        self.instructions = write_rows(getattr(self, "instructions", None), rows, [
            INSTRUCTION_FULL_BOARD if st.target == "all" else INSTRUCTION.format(shape=st.target) for st in starts
        ], n)
        self._apply_appearance(rows)
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

    def _lights_per_scene(self) -> bool:
        """Each sub-scene has its own lights (not so when ManiSkill puts every scene in one for its GUI)."""
        return len(self._lights) == self.num_envs and all(self._lights)

    def _check_appearance(self, starts: list) -> None:
        """Refuse a batch whose scenes differ in an appearance property their sub-scenes share (see GPU scenes)."""
        if self.num_envs == 1 or not self.scene.can_render():
            return
        camera = self._sensors.get(THIRD_PERSON_CAMERA)
        shared = ("colors",) + (() if self._lights_per_scene() else ("light_color",)) + (
            () if camera is None or len(camera.camera._render_cameras) == self.num_envs else ("camera_offset",))
        check_shared_appearance(starts, shared)

    def _apply_appearance(self, rows: list[int]) -> None:
        """Colours, key light and camera pose of the tries of scenes ``rows``: they change images only, never
        physics. Colours are shared by all sub-scenes (``_check_appearance`` saw that the batch agrees on them)."""
        if not self.scene.can_render():
            return  # nothing is rendered (render_backend="none"): no render bodies, lights or cameras to set
        start = self.starts[rows[0]]
        colors = start.colors or {}
        for shape, actor in self.blocks.items():
            _set_actor_color(actor, colors.get(shape, DEFAULT_BLOCK_RGB[shape]))
        _set_actor_color(self.board, colors.get("board", BOARD_COLOR[:3]))
        if "table" in colors:  # only setups that draw colours draw the table's, for every try
            for entity in self.table_scene.table._objs:
                _set_entity_color(entity, colors["table"])
        default_key = LIGHTING[self.task_setup.lighting][1][0][1]
        if self._lights_per_scene():
            for r in rows:
                self._lights[r][0].color = list(self.starts[r].light_color or default_key)
        else:  # one set of lights for every scene: the batch agrees on the key light's colour
            for light in (ls[0] for ls in self._lights if ls):
                light.color = list(start.light_color or default_key)
        if THIRD_PERSON_CAMERA in self._sensors:
            camera = self._sensors[THIRD_PERSON_CAMERA].camera
            if self.num_envs == 1 or len(camera._render_cameras) != self.num_envs:
                camera.set_local_pose(third_person_pose(start.camera_offset).sp)
            else:  # one render camera per sub-scene: each scene's own viewpoint
                for r in rows:
                    camera._render_cameras[r].set_local_pose(third_person_pose(self.starts[r].camera_offset).sp)
                camera._cached_local_pose = None  # ManiSkill caches the batch of local poses

    def _reset_task_state(self, env_idx):
        n = self.num_envs
        if not hasattr(self, "_streak") or self._streak.shape[0] != n:
            z = lambda dtype=torch.bool: torch.zeros(n, dtype=dtype, device=self.device)  # noqa: E731
            self._streak = z(torch.int32)
            self._flags = {k: z() for k in STICKY_FLAGS}
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
            self._energy_ref = torch.full((n, 3), float("inf"), device=self.device)
            self._energy_start = torch.full((n, 3), float("inf"), device=self.device)
            self._new_substep_window()
        self._streak[env_idx] = 0
        self._energy_ref[env_idx] = float("inf")
        self._energy_start[env_idx] = float("inf")
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
        cond = getattr(self, "_conditions", None)
        if cond is not None and not _full(reset_rows(env_idx, n), n):
            for v in cond.values():  # a partial reset: the other scenes keep their last step's conditions
                v[env_idx] = 0
        else:
            self._conditions = None

    # --------------------------------------------------------------- predicates
    def _block_raw_poses(self) -> torch.Tensor:
        """(b, 3 shapes, 7) block poses (p, wxyz), read once per step."""
        return torch.stack([self.blocks[s].pose.raw_pose for s in geometry.SHAPES], 1)

    def _block_state(self):
        """Per block (b, 3 shapes, ...): board-frame position (xyz) and rotation (3x3), world rotation."""
        board = self.board.pose.raw_pose
        poses = self._block_raw_poses()
        byaw = _yaw_t(board[:, 3:7])
        c, s = torch.cos(-byaw), torch.sin(-byaw)
        zero, one = torch.zeros_like(c), torch.ones_like(c)
        to_board = torch.stack([c, -s, zero, s, c, zero, zero, zero, one], -1).reshape(-1, 1, 3, 3)
        rot = _rotmat(poses[..., 3:7])
        local_p = torch.einsum("bkij,bkj->bki", to_board.expand(-1, 3, -1, -1), poses[..., :3] - board[:, None, :3])
        local_rot = to_board @ rot
        return local_p, local_rot, rot, poses

    def _bottoms(self, poses: torch.Tensor) -> torch.Tensor:
        """(b, 3) lowest world z of each block's prism."""
        rot_z = _rotmat(poses[..., 3:7])[..., 2, :]  # (b, 3, 3): the world-z row
        z = torch.einsum("bkj,kvj->bkv", rot_z, self._prism_vertices) + poses[..., 2:3]
        return z.min(dim=-1).values

    def _plate_overlap(self, local_p: torch.Tensor, local_rot: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """(b, 3) deepest overlap (m) of each block's prism with any plate piece or rail; 0 if none."""
        verts = torch.einsum("bkij,kvj->bkvi", local_rot, self._prism_vertices) + local_p[:, :, None, :]
        lo, hi = verts.amin(2), verts.amax(2)  # (b, 3, 3)
        near = ((lo[:, :, None] < self._plate_hi[None, None]) & (hi[:, :, None] > self._plate_lo[None, None])
                ).all(-1) & active[..., None]  # bounding boxes overlap: the exact test decides
        depth = torch.zeros(local_p.shape[:2], device=self.device)
        plate = self._plate_polytopes
        for k, block in enumerate(self._block_polytopes):  # one shape at a time: no padding to the circle's 64
            bi, pi = near[:, k].nonzero(as_tuple=True)
            if not len(bi):
                continue
            rot = local_rot[bi, k]
            d = overlap.overlap_depth(
                torch.einsum("nij,vj->nvi", rot, block.vertices) + local_p[bi, k][:, None, :],
                torch.einsum("nij,fj->nfi", rot, block.normals), torch.einsum("nij,fj->nfi", rot, block.edges),
                plate.vertices[pi], plate.normals[pi], plate.edges[pi])
            depth[:, k] = torch.zeros(len(depth), device=self.device).scatter_reduce(
                0, bi, d.clamp_min(0.0), reduce="amax")
        return depth

    # ----------------------------------------------------- per-substep monitor
    def _new_substep_window(self) -> None:
        """Start the record of a control step's substeps: touches, least opening, fastest point."""
        n = self.num_envs
        self._sub_touched = torch.zeros((n, 3), dtype=torch.bool, device=self.device)
        self._sub_bumped = torch.zeros((n, 3), dtype=torch.bool, device=self.device)
        self._sub_opening = torch.full((n,), float("inf"), device=self.device)
        self._sub_speed = torch.zeros((n, 3), device=self.device)
        self._sub_force = torch.zeros((n, 3, 2), device=self.device)
        self._sub_count = 0
        if not self.gpu_sim_enabled:  # raw CPU readings, turned into the above once per control step
            steps = self._sim_steps_per_control
            self._sub_raw_v = np.zeros((steps, 3, 3))
            self._sub_raw_w = np.zeros((steps, 3, 3))
            self._sub_raw_q = np.tile(np.array([1.0, 0.0, 0.0, 0.0]), (steps, 3, 1))
            self._sub_raw_grip = np.zeros((steps, len(self.arm.gripper_qpos_idx)))
            self._sub_raw_touched = np.zeros(3, dtype=bool)
            self._sub_raw_bumped = np.zeros(3, dtype=bool)
            self._sub_raw_force = np.zeros((3, 2))

    def _before_control_step(self):
        super()._before_control_step()
        self._new_substep_window()
        if not torch.isfinite(self._energy_start).all():  # the first step after a reset: the start's energy
            local_p, local_rot, rot, poses = self._block_state()
            self._energy_start = torch.where(torch.isfinite(self._energy_start), self._energy_start,
                                             self._block_energy(poses, rot))

    def _after_simulation_step(self):
        """After every physics substep: finger touches, other bodies' touches, gripper opening and the
        fastest point of each block, so that released and settled hold on every substep, not only on
        the last one of a control step."""
        super()._after_simulation_step()
        if not self.gpu_sim_enabled:  # one CPU scene: read the PhysX components directly, cheaply
            i = self._sub_count
            active = self._active_np
            last = i == self._sim_steps_per_control - 1  # the grasp force is read on the last substep
            if last or not (self._sub_raw_touched[active].all() and self._sub_raw_bumped[active].all()):
                force = self._cpu_contacts(self._sub_raw_touched, self._sub_raw_bumped)
                if last:
                    self._sub_raw_force = force
            for k in self._active_idx:
                c = self._block_components[k]
                self._sub_raw_v[i, k] = c.linear_velocity
                self._sub_raw_w[i, k] = c.angular_velocity
                self._sub_raw_q[i, k] = c.entity.pose.q
            self._sub_raw_grip[i] = self.agent.robot._objs[0].qpos[self._grip_idx]
            self._sub_count += 1
            return
        self.scene._gpu_fetch_all()
        force, bumped = self._gpu_contacts()
        qpos = self.agent.robot.get_qpos()
        v = torch.stack([self.blocks[s].linear_velocity for s in geometry.SHAPES], 1)
        w = torch.stack([self.blocks[s].angular_velocity for s in geometry.SHAPES], 1)
        rot = _rotmat(self._block_raw_poses()[..., 3:7])
        arm = torch.einsum("bkij,kvj->bkvi", rot, self._block_points - self._block_cmass[:, None, :3])
        speed = torch.linalg.norm(v[:, :, None] + torch.cross(w[:, :, None].expand_as(arm), arm, dim=-1), dim=-1)
        self._sub_touched |= (force > CONTACT_EPS_N).any(-1)
        self._sub_bumped |= bumped
        self._sub_opening = torch.minimum(self._sub_opening, self.arm.opening_from_qpos(qpos))
        self._sub_speed = torch.maximum(self._sub_speed, speed.amax(-1))
        self._sub_force = force
        self._sub_count += 1

    def _close_substep_window(self) -> None:
        """CPU: the control step's raw substep readings as the tensors the predicates read."""
        if self.gpu_sim_enabled or self._sub_count == 0:
            return
        n = self._sub_count
        w, q = self._sub_raw_w[:n], self._sub_raw_q[:n]
        qw, qv = q[..., :1], q[..., 1:]
        # rotate each vertex (relative to the centre of mass) by its substep's rotation: r' = r + 2 qw (qv x r)
        # + 2 qv x (qv x r), without building matrices
        r = self._block_points_np[None]
        qv_, qw_ = qv[:, :, None], qw[:, :, None]
        t = 2.0 * np.cross(qv_, r)
        arm = r + qw_ * t + np.cross(qv_, t)
        speed = np.linalg.norm(self._sub_raw_v[:n, :, None] + np.cross(w[:, :, None], arm), axis=-1).max(-1).max(0)
        grip = self.arm.gripper_opening(self._sub_raw_grip[:n].mean(-1)).min()
        self._sub_touched = torch.from_numpy(self._sub_raw_touched.copy())[None]
        self._sub_bumped = torch.from_numpy(self._sub_raw_bumped.copy())[None]
        self._sub_opening = torch.tensor([float(grip)])
        self._sub_speed = torch.from_numpy(speed.astype(np.float32))[None]
        self._sub_force = torch.from_numpy(self._sub_raw_force.astype(np.float32))[None]

    def _cpu_contacts(self, touched: np.ndarray, bumped: np.ndarray) -> np.ndarray:
        """One pass over this substep's PhysX contacts: marks the blocks a finger touches (``touched``) and
        those another body (robot link, block, distractor) touches (``bumped``); returns the finger-block
        forces (3 blocks, 2 fingers) in N."""
        impulse = np.zeros((3, 2, 3))
        role = self._contact_role
        for contact in self.scene.px.get_contacts():
            bodies = contact.bodies
            ra = role.get(bodies[0].entity.global_id)
            if ra is None:
                continue
            rb = role.get(bodies[1].entity.global_id)
            if rb is None or (ra[0] != "block" and rb[0] != "block"):
                continue  # only contacts of a block with a finger, another link, block or distractor
            points = contact.points
            total = points[0].impulse
            for p in points[1:]:
                total = total + p.impulse
            touching = bool(total.any()) or min(p.separation for p in points) < 0.0
            if not touching:
                continue
            for (kind_a, ia), (kind_b, ib), sign in ((ra, rb, 1.0), (rb, ra, -1.0)):
                if kind_b != "block":
                    continue
                bumped[ib] = True
                if kind_a == "finger":
                    impulse[ib, ia] += sign * total
        force = np.linalg.norm(impulse, axis=-1) / self.scene.px.timestep
        touched |= (force > CONTACT_EPS_N).any(-1)
        return force

    def _gpu_contacts(self):
        """GPU PhysX: the same as ``_cpu_contacts`` from one pair-impulse query for every scene."""
        links = list(self.agent.robot.links)
        others = [self.blocks[s] for s in geometry.SHAPES] + list(self.distractors.values())
        if self._gpu_contact_query is None:
            pairs, rows = [], []
            for k, shape in enumerate(geometry.SHAPES):
                block = self.blocks[shape]
                for j, body in enumerate(links + others):
                    if body is block:
                        continue
                    pairs += list(zip(body._bodies, block._bodies))
                    rows.append((k, j))
            self._gpu_contact_query = (self.scene.px.gpu_create_contact_pair_impulse_query(pairs), rows)
        query, rows = self._gpu_contact_query
        self.scene.px.gpu_query_contact_pair_impulses(query)
        imp = query.cuda_impulses.torch().clone().reshape(len(rows), self.num_envs, 3)
        mag = torch.linalg.norm(imp, dim=-1) / self.scene.px.timestep  # (rows, b)
        force = torch.zeros((self.num_envs, 3, 2), device=self.device)
        bumped = torch.zeros((self.num_envs, 3), dtype=torch.bool, device=self.device)
        finger_rows = {links.index(f): i for i, f in enumerate(self._fingers)}
        for r, (k, j) in enumerate(rows):
            if j in finger_rows:
                force[:, k, finger_rows[j]] = mag[r]
            bumped[:, k] |= mag[r] > 0
        return force, bumped

    def _block_energy(self, poses: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
        """(b, 3) kinetic (linear and rotational) plus potential energy of each block (J)."""
        v = torch.stack([self.blocks[s].linear_velocity for s in geometry.SHAPES], 1)
        w = torch.stack([self.blocks[s].angular_velocity for s in geometry.SHAPES], 1)
        inertia_rot = rot @ _rotmat(self._block_cmass[:, 3:7])  # principal axes in the world
        w_body = torch.einsum("bkji,bkj->bki", inertia_rot, w)
        com_z = poses[..., 2] + torch.einsum("bkj,kj->bk", rot[..., 2, :], self._block_cmass[:, :3])
        m = self._block_mass
        return (0.5 * m * (v * v).sum(-1) + 0.5 * (self._block_inertia * w_body * w_body).sum(-1)
                + m * GRAVITY_MPS2 * com_z)

    def _in_polygon(self, xy: torch.Tensor, hole: int) -> torch.Tensor:
        n, d = self._hole_halfplanes[hole]
        rel = xy - self._cell_xy[hole]
        return ((rel @ n.T) <= d).all(dim=-1)

    def _compute_conditions(self) -> dict[str, torch.Tensor]:
        local_p, local_rot, rot, poses = self._block_state()
        local_xy = local_p[..., :2]
        active = self._active.to(self.device)
        target = self._target_mask.to(self.device)
        top = geometry.PLATE_TOP_Z
        own_dist = torch.linalg.norm(local_xy - self._cell_xy.unsqueeze(0), dim=-1)  # (b, 3)
        face_z = torch.einsum("bkj,kvj->bkv", local_rot[..., 2, :], self._bottom_faces) + local_p[..., 2:3]
        lowest = torch.einsum("bkj,kvj->bkv", local_rot[..., 2, :], self._prism_vertices).amin(-1) + local_p[..., 2]
        tilt_cos = local_rot[..., 2, 2]
        touched = self._sub_touched
        matched, deep, released, settled = success_conditions(
            own_dist, face_z.amax(-1), tilt_cos, self._upright_cos, self._sub_speed, touched,
            self._sub_opening, self.clearance)
        ok = matched & deep & released & settled
        success_now = torch.where(target, ok, torch.ones_like(ok)).all(dim=1) & target.any(dim=1)

        # which hole footprint each block centre is over
        in_hole = torch.stack([self._in_polygon(local_xy, h) for h in range(3)], dim=-1)  # (b, block, hole)
        eye = torch.eye(3, dtype=torch.bool, device=self.device)
        over_other = (in_hole & ~eye).any(-1)
        over_own = (in_hole & eye).any(-1)
        half = torch.tensor([geometry.CELL_SIZE / 2, 1.5 * geometry.CELL_SIZE], device=self.device)
        over_board = (local_xy.abs() < half).all(-1)
        through = face_z.amax(-1) <= top - DEEP_M  # the whole bottom face is through the plate
        wrong_hole = (active & through & over_other).any(1)
        # penetration: more than the tolerance inside a plate piece or rail (exact convex overlap), through
        # the plate where there is no hole, or under the table
        solid = over_board & ~in_hole.any(-1)
        plate_overlap = self._plate_overlap(local_p, local_rot, active)
        penetration = (active & ((plate_overlap > PENETRATION_TOL_M) | (through & solid)
                                 | (lowest < -TABLE_PENETRATION_M))).any(1)
        # glitch: a block that nothing but the board and table touched during this step gained mechanical
        # energy over the least it had since its last touch, the energy it started the step with included
        energy = self._block_energy(poses, rot)
        fired_now = (self._dist_step == self._steps_done).unsqueeze(1)
        untouched = ~self._sub_bumped & ~fired_now & active
        ref = torch.minimum(self._energy_ref, self._energy_start)
        gain = torch.where(untouched, energy - ref, torch.zeros_like(energy))
        glitch = (gain > GLITCH_ENERGY_J).any(1)
        self._energy_ref = torch.where(untouched, torch.minimum(ref, energy), torch.full_like(ref, float("inf")))
        self._energy_start = energy
        # dropped: a carried block loses both fingers for a few steps while the gripper is commanded closed
        forces = self._sub_force
        grasped = (forces > GRASP_FORCE_N).all(-1)
        lifted = lowest > 0.01
        self._carried |= grasped & lifted & active
        # the policy commanded a closed gripper and no disturbance forced it open (F04 releases are not drops)
        holding = ((self._last_gripper_cmd < 0) & ~self._forced_now).unsqueeze(1)
        lost_now = touched.logical_not() & (self._untouched_steps == 0)
        self._lost_while_holding = torch.where(lost_now, holding.expand_as(lost_now), self._lost_while_holding)
        self._untouched_steps = torch.where(touched, torch.zeros_like(self._untouched_steps), self._untouched_steps + 1)
        fell = self._carried & (self._untouched_steps >= DROP_CONFIRM_STEPS) & ~deep
        dropped_now = (fell & self._lost_while_holding & ~(over_own & matched)).any(1)
        self._carried &= ~fell
        rim = (target & ~deep & released & settled & over_board).any(1)
        inserted = (active & matched & deep).sum(1)
        return dict(
            success_now=success_now, matched=(matched | ~target).all(1), deep=(deep | ~target).all(1),
            released=(released | ~target).all(1), settled=(settled | ~target).all(1),
            wrong_hole=wrong_hole, penetration=penetration, glitch=glitch, dropped=dropped_now, rim=rim,
            is_grasped=(grasped & target).any(1), blocks_inserted=inserted,
            # the margins of penetration and glitch, for records: deepest plate overlap (m), energy gained (J)
            plate_overlap=plate_overlap.amax(1), free_energy_gain=gain.amax(1),
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
        # GPU: ManiSkill fetches its buffers only after this returns, but _after_simulation_step fetched them
        # after the last substep, so the predicate below reads this step's state (tests/test_gpu_physics.py)
        super()._after_control_step()
        self._close_substep_window()
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
        wrote = False  # a velocity or pose written into the GPU buffers, to be pushed into PhysX
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
                wrote = True
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
                    wrote = True
        if wrote and self.gpu_sim_enabled:
            # the buffers hold this step's fetched state with the disturbed rows changed: push them into PhysX
            # now, or ManiSkill's fetch after this control step overwrites them and the disturbance never acts.
            # Rigid bodies only (blocks and the kinematic board); ManiSkill's own tasks do the same.
            self.scene.px.gpu_apply_rigid_dynamic_data()

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
            zero = torch.zeros(n, device=self.device)
            cond = dict(matched=f, deep=f, released=f, settled=f, rim=f, is_grasped=f, plate_overlap=zero,
                        free_energy_gain=zero, blocks_inserted=torch.zeros(n, dtype=torch.int64, device=self.device))
        out = {k: cond[k] for k in ("matched", "deep", "released", "settled", "rim", "is_grasped", "blocks_inserted",
                                    "plate_overlap", "free_energy_gain")}
        out.update({k: v.clone() for k, v in self._flags.items()})
        out["success_streak"] = self._streak.clone()
        out["disturbance_fired"] = self._dist_fired.clone()
        out["disturbance_step"] = self._dist_step.clone()
        vetoed = torch.stack([self._flags[k] for k in VETO_FLAGS]).any(0)
        out["success_raw"] = self._streak >= SUCCESS_HOLD_STEPS  # the predicate's verdict
        out["success"] = out["success_raw"] & ~vetoed  # the scored one: a vetoing flag at any step overrides it
        out["fail"] = out["success_raw"] & vetoed  # a vetoed success ends the try: it can never count
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
