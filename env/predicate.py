"""The success predicate's version, thresholds and flags: one definition, light to import (no simulator).

Success predicate v2 (docs/BENCHMARK.md section 1) is evaluated by ``env.task.ShapeAssemblyEnv``; records,
summaries and reports name its version, and run folders of another version are not mixed with it.
"""

from __future__ import annotations

# v1: "deep" was the block's lowest point, nothing asked the block to be upright, flags did not veto a
# success, finger contact and speed were read on the last physics substep of a control step only
SUCCESS_PREDICATE_VERSION = 2
SUCCESS_HOLD_STEPS = 10
MATCH_MARGIN_M = 0.003
DEEP_M = 0.025
SETTLED_MPS = 0.02  # the fastest point of the block, on every substep
RELEASED_OPENING = 0.9
# overlap with the plate that counts as penetration: with rest offset 0, PhysX lets resting and sliding
# contacts sink a few tenths of a millimetre, so 1 mm is a real interpenetration; the upright bound is
# taken at clearance + this much for the same reason
PENETRATION_TOL_M = 0.001
TABLE_PENETRATION_M = 0.005  # a block's lowest point this far under the table top went through it
# mechanical energy (kinetic + potential) a block that nothing but the board and table touched may gain
# before the try is flagged glitch: 40x the largest gain of any try of the scripted test split (0.05 mJ),
# below the 5-34 mJ of the blocks that wrong-hole contacts threw without a depenetration cap
GLITCH_ENERGY_J = 0.002
VETO_FLAGS = ("wrong_hole", "penetration", "glitch")  # raised at any step: the try is never a success
STICKY_FLAGS = VETO_FLAGS + ("dropped",)  # flags a try keeps once raised; rim is an end state
# info values whose largest value over a try its record keeps: how close it came to penetration (deepest
# plate overlap, m) and to glitch (most energy gained while untouched, J)
MARGIN_KEYS = ("plate_overlap", "free_energy_gain")
