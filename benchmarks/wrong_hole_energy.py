"""Drops of every block over every other shape's hole: energy gained from contact, blocks thrown, flags.

Each shape is let go 2 mm above each other shape's hole, at 24 yaws (every 15 deg), at the clearances
0.5, 2 and 3 mm (setups A04, A01, A02): 432 drops of 40 control steps. A passive block can only lose
mechanical energy (kinetic + potential); a gain is energy PhysX put in. The result names the largest
gain, how many drops gained more than 1 mJ and the glitch tolerance, and how many blocks left the board;
``--without-cap`` repeats the same drops with PhysX's unbounded default depenetration speed (v1).

    python -m benchmarks.wrong_hole_energy --without-cap   # 2 x 432 drops, about 10 minutes
    python -m benchmarks.wrong_hole_energy --quick         # 24 drops at 2 mm
"""

from __future__ import annotations

import math
import sys
import time
from typing import Sequence

import numpy as np

NAME = "wrong_hole_energy"
PHYSX_DEFAULT_DEPENETRATION_MPS = 1e32  # PhysX's default maximum depenetration velocity: unbounded
MODULE = "benchmarks.wrong_hole_energy"
SETUPS = ("A04", "A01", "A02")  # clearance 0.5, 2, 3 mm
YAWS_DEG = tuple(range(0, 360, 15))
STEPS = 40
HOLD_OPEN = np.array([0, 0, 0, 0, 0, 0, 1], dtype=np.float32)


def mechanical_energy(actor) -> float:
    """Kinetic (linear and rotational) plus potential energy (J) of a one-body actor, from its PhysX body."""
    import sapien

    body = actor._objs[0].find_component_by_type(sapien.physx.PhysxRigidDynamicComponent)
    mass_pose = body.entity.pose * body.cmass_local_pose
    rot = mass_pose.to_transformation_matrix()[:3, :3]
    v, w = np.asarray(body.linear_velocity, float), np.asarray(body.angular_velocity, float)
    w_body = rot.T @ w
    return float(0.5 * body.mass * v @ v + 0.5 * np.sum(np.asarray(body.inertia) * w_body ** 2)
                 + body.mass * 9.81 * mass_pose.p[2])


def potential_energy(actor) -> float:
    import sapien

    body = actor._objs[0].find_component_by_type(sapien.physx.PhysxRigidDynamicComponent)
    return float(body.mass * 9.81 * (body.entity.pose * body.cmass_local_pose).p[2])


def drop_over_hole(env, block: str, hole: str, yaw: float, steps: int = STEPS, depenetration_mps: float | None = None):
    """(largest energy gain J, largest kinetic energy J, thrown off the cell, flags) of one drop.

    Every drop runs in a freshly built scene (PhysX's contact caches would carry one drop into the next).
    ``depenetration_mps`` replaces the block's depenetration cap for this drop (PhysX's own default,
    unbounded, is 1e32): the sweep without the cap shows what the cap removes."""
    import torch
    from mani_skill.utils.structs.pose import Pose

    from env import geometry
    from env.predicate import STICKY_FLAGS
    from env.starts import BlockStart, StartState

    board_xy = (0.03, 0.0)
    start = StartState(target=block, blocks=(BlockStart(block, -0.18, 0.0, 0.0),),
                       board_x=board_xy[0], board_y=board_xy[1], board_yaw=0.0)
    env.reset(seed=0, options={"start": start, "reconfigure": True})  # a fresh scene: no contact caches carried over
    actor = env.unwrapped.blocks[block]
    if depenetration_mps is not None:
        import sapien

        actor._objs[0].find_component_by_type(sapien.physx.PhysxRigidDynamicComponent).set_max_depenetration_velocity(
            depenetration_mps)
    xy = np.array(board_xy) + geometry.cell_centres()[hole]
    q = torch.tensor([[math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]], dtype=torch.float32)
    p = torch.tensor([[xy[0], xy[1], geometry.PLATE_TOP_Z + geometry.BLOCK_HEIGHT / 2 + 0.002]], dtype=torch.float32)
    actor.set_pose(Pose.create_from_pq(p, q))
    actor.set_linear_velocity(torch.zeros((1, 3)))
    actor.set_angular_velocity(torch.zeros((1, 3)))
    e0 = mechanical_energy(actor)
    e_max, ke_max = e0, 0.0
    flags: set[str] = set()
    for _ in range(steps):
        _, _, _, _, info = env.step(HOLD_OPEN)
        e = mechanical_energy(actor)
        e_max = max(e_max, e)
        ke_max = max(ke_max, e - potential_energy(actor))
        flags |= {f for f in STICKY_FLAGS if bool(info[f][0])}
    end = actor.pose.p[0].numpy()
    off = bool(np.any(np.abs(end[:2] - xy) > geometry.CELL_SIZE / 2))
    return e_max - e0, ke_max, off, sorted(flags)


def _main(argv: Sequence[str] | None) -> int:
    from benchmarks.common import machine, parser, print_table, progress, write_result

    ap = parser(MODULE, __doc__.split("\n\n")[0])
    ap.add_argument("--without-cap", action="store_true",
                    help="also sweep with PhysX's unbounded default depenetration speed (v1's physics), same drops")
    args = ap.parse_args(argv)
    from env import geometry, make_env  # after parsing: --help answers without loading the simulator
    from env.predicate import GLITCH_ENERGY_J
    from env.task import MAX_DEPENETRATION_MPS

    mach = machine()
    setups = SETUPS[:1] if args.quick else SETUPS
    yaws = YAWS_DEG[::6] if args.quick else YAWS_DEG
    pairs = [(b, h) for b in geometry.SHAPES for h in geometry.SHAPES if b != h]
    variants = {"capped": None, **({"uncapped": PHYSX_DEFAULT_DEPENETRATION_MPS} if args.without_cap else {})}
    t0 = time.monotonic()
    bar = progress(total=len(variants) * len(setups) * len(pairs) * len(yaws), desc="drops",
                   disable=args.no_progress)
    results = {"max_depenetration_mps": MAX_DEPENETRATION_MPS, "glitch_tolerance_mj": GLITCH_ENERGY_J * 1e3}
    table = []
    for variant, cap in variants.items():
        rows = []
        for setup in setups:
            env = make_env(setup, obs_mode="state")
            for block, hole in pairs:
                for yaw in yaws:
                    gain, ke, off, flags = drop_over_hole(env, block, hole, math.radians(yaw), depenetration_mps=cap)
                    rows.append({"setup": setup, "clearance_mm": round(env.unwrapped.clearance * 1e3, 2),
                                 "block": block, "hole": hole, "yaw_deg": yaw, "gain_mj": round(gain * 1e3, 4),
                                 "ke_max_mj": round(ke * 1e3, 4), "off_board": off, "flags": flags})
                    bar.update()
            env.close()
        gains = np.array([r["gain_mj"] for r in rows])
        results[variant] = {
            "depenetration_mps": cap if cap is not None else MAX_DEPENETRATION_MPS, "drops": len(rows),
            "max_gain_mj": float(gains.max()), "gains_over_1mj": int((gains > 1.0).sum()),
            "gains_over_glitch_tolerance": int((gains > GLITCH_ENERGY_J * 1e3).sum()),
            "off_board": int(sum(r["off_board"] for r in rows)),
            "flagged": {f: int(sum(f in r["flags"] for r in rows)) for f in ("glitch", "penetration", "wrong_hole")},
            "worst": sorted(rows, key=lambda r: -r["gain_mj"])[:8], "rows": rows,
        }
        v = results[variant]
        table.append([variant, v["depenetration_mps"], len(rows), v["max_gain_mj"], v["gains_over_1mj"],
                      v["off_board"], v["flagged"]["glitch"], v["flagged"]["penetration"]])
    bar.close()
    results["wall_s"] = round(time.monotonic() - t0, 1)
    print_table("wrong-hole drops", ["physics", "depenetration m/s", "drops", "max gain mJ", "> 1 mJ", "off board",
                                     "glitch", "penetration"], table)
    write_result(NAME, args.out_dir, MODULE, argv, args.quick, results, mach)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.common import run_main

    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
