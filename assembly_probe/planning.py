"""Stacked-block planning domain, constraint graph, order checker and Plan-k-step items.

Domain: blocks start on the table in stacks (each block rests on the knob of the
one below). A *move* takes a block with nothing resting on it and drops it into
its own hole of a 3x3 board (it falls through and stands on the table). So the
constraint graph has an edge (upper, lower) for every block resting directly on
another: the upper block must be moved first. A state is *valid* toward a target
when every block is either untouched at its start pose or inserted in its own
hole at a yaw that fits, the inserted set contains every block that rested on
an inserted block, and (given a target) the inserted set is inside the target's.
"""

from __future__ import annotations

import itertools
import math
import string

import numpy as np

from env import exact, geometry
from assembly_probe import scene as S

LABELS = string.ascii_uppercase
POSE_TOL = 1e-5  # m / rad; states are stored rounded to 1e-6
DISTRACTOR_KINDS = ("wrong_hole", "bad_yaw", "precedence", "extra_block")
FALLBACK_KINDS = ("other_hole",)  # subtler (needs the target image): only when no main kind is possible


# ----------------------------------------------------------------- order checking
def is_topological_order(order, nodes, edges) -> bool:
    """True iff ``order`` lists every node exactly once and every edge (u, v) has u before v."""
    order = list(order)
    if len(order) != len(set(order)) or set(order) != set(nodes):
        return False
    pos = {n: i for i, n in enumerate(order)}
    return all(pos[u] < pos[v] for u, v in edges if u in pos and v in pos)


def all_topological_orders(nodes, edges):
    """Every topological order (Kahn's algorithm with backtracking); for small graphs and tests."""
    nodes = list(nodes)
    preds = {n: {u for u, v in edges if v == n and u in nodes} for n in nodes}
    out, cur = [], []

    def rec(left):
        if not left:
            out.append(list(cur))
            return
        for n in sorted(left):
            if not (preds[n] & left):
                cur.append(n)
                rec(left - {n})
                cur.pop()
    rec(set(nodes))
    return out


# ----------------------------------------------------------------- domain
STACK_SPACING = 0.085  # m between stack centres on the table
STACKS_APART_PX = 4.0  # every stack's outline this far from every other's and from the board's in the plan view
CAMERA = "plan"


def board_outline(board: dict, camera: str = CAMERA) -> np.ndarray:
    """Image outline of the board and of anything that can stand in or on its holes (a block inserted or resting on
    a rim, at any yaw): the plate's top and, over every cell, a cylinder as wide as the widest block up to the top
    of a knob on a block resting on the plate."""
    hx, hy = S.board_half_extent(board)
    c, s_ = math.cos(board["yaw"]), math.sin(board["yaw"])
    pts = [(board["x"] + c * u - s_ * v, board["y"] + s_ * u + c * v, geometry.PLATE_TOP_Z)
           for u in (-hx, hx) for v in (-hy, hy)]
    r = max(S.radius(sh) for sh in geometry.SHAPES)
    top = S.Z_PLATE + S.H / 2 + geometry.KNOB_HEIGHT
    for i in range(len(board["cells"])):
        x, y = S.cell_world(board, i)
        pts += [(float(x) + r * math.cos(a), float(y) + r * math.sin(a), z)
                for a in np.linspace(0, 2 * math.pi, 16, endpoint=False) for z in (geometry.PLATE_TOP_Z, top)]
    return S.hull2d(S.project(camera, pts))


def apart_on_screen(outline: np.ndarray, others: list[np.ndarray], min_px: float = STACKS_APART_PX) -> bool:
    """Whether an image outline stays ``min_px`` or more from every one of ``others`` (bounding boxes first)."""
    lo, hi = outline.min(axis=0), outline.max(axis=0)
    for q in others:
        if (q.min(axis=0) - hi >= min_px).any() or (lo - q.max(axis=0) >= min_px).any():
            continue
        if S.polygon_distance(outline, q) < min_px:
            return False
    return True


def stacks_clear_on_screen(stacks_blocks: list[list[dict]], board: dict, camera: str = CAMERA) -> bool:
    """No two stacks, and no stack and the board, overlap or come within ``STACKS_APART_PX`` in the image
    (a block 16 cm behind a stack used to look as if it stood on it, issue 35)."""
    others = [board_outline(board, camera)]
    for bs in stacks_blocks:
        o = S.stack_silhouette(bs, camera)
        if not apart_on_screen(o, others):
            return False
        others.append(o)
    return True


def make_domain(rng: np.random.Generator, n_blocks: int, min_stack: int = 2) -> dict:
    """Board, blocks in stacks, and each block's hole. ``n_blocks`` <= 9. The stacks stand in
    ``scene.STACK_REGION``, placed so that none overlaps another or the board in the plan view."""
    if not 1 <= n_blocks <= 9:
        raise ValueError("n_blocks must be in 1..9")
    shapes = list(geometry.SHAPES) * 2 + [str(s) for s in rng.choice(geometry.SHAPES, 3)]
    rng.shuffle(shapes)
    board = S.grid_board(shapes, x=0.07 + rng.uniform(-0.01, 0.01), y=rng.uniform(-0.015, 0.015),
                         yaw=float(np.deg2rad(rng.uniform(-8, 8))))
    cells = [int(c) for c in rng.permutation(9)[:n_blocks]]
    colors = [str(c) for c in rng.permutation(list(S.PALETTE))[:n_blocks]]
    ids = [f"b{i}" for i in range(n_blocks)]
    (x0, x1), (y0, y1) = S.STACK_REGION
    for _ in range(200):
        # stacks: bottom to top, at most 3 high; at least one of min_stack when possible
        while True:
            stacks: list[list[str]] = []
            for b in ids:
                open_ = [s for s in stacks if len(s) < 3]
                if open_ and rng.uniform() < 0.6:
                    open_[int(rng.integers(len(open_)))].append(b)
                else:
                    stacks.append([b])
            if n_blocks < min_stack or max(len(s) for s in stacks) >= min_stack:
                break
        yaws = {b: float(rng.uniform(-math.pi, math.pi)) for b in ids}

        def stack_blocks(stack, p):
            return [{"id": b, "shape": shapes[cells[ids.index(b)]], "color": colors[ids.index(b)], "x": float(p[0]),
                     "y": float(p[1]), "z": S.Z_TABLE + level * S.STACK_DZ, "yaw": yaws[b]}
                    for level, b in enumerate(stack)]

        placed: list[tuple[np.ndarray, list[dict]]] = []
        outlines = [board_outline(board)]
        for stack in stacks:
            for _ in range(300):
                p = np.array([rng.uniform(x0, x1), rng.uniform(y0, y1)])
                if S.over_board(board, p, 0.036) or any(exact.norm(p - q) <= STACK_SPACING for q, _ in placed):
                    continue
                blocks = stack_blocks(stack, p)
                outline = S.stack_silhouette(blocks, CAMERA)
                if apart_on_screen(outline, outlines):
                    placed.append((p, blocks))
                    outlines.append(outline)
                    break
            else:
                break  # no room for this stack: draw the stacks again
        if len(placed) == len(stacks):
            break
    else:
        raise RuntimeError("no room for the stacks")
    below = {}
    for stack in stacks:
        for level, b in enumerate(stack):
            below[b] = stack[level - 1] if level else None
    blocks = sorted((b for _, bs in placed for b in bs), key=lambda b: int(b["id"][1:]))
    return S.round_state({"board": board, "blocks": blocks, "below": below,
                          "cell_of": {b: cells[i] for i, b in enumerate(ids)}})


def edges(dom: dict) -> list[tuple[str, str]]:
    """Constraint graph: (upper, lower) for each block resting directly on another."""
    return sorted((u, v) for u, v in dom["below"].items() if v is not None)


def uppers(dom: dict, b: str) -> list[str]:
    return sorted(u for u, v in dom["below"].items() if v == b)


def initial_state(dom: dict) -> dict:
    return {"board": dom["board"], "blocks": [dict(b) for b in dom["blocks"]]}


def inserted_pose(dom: dict, b: str) -> tuple[float, float, float, float]:
    xy = S.cell_world(dom["board"], dom["cell_of"][b])
    return float(xy[0]), float(xy[1]), S.Z_TABLE, float(dom["board"]["yaw"])


def state_of(dom: dict, inserted) -> dict:
    """State with the blocks of ``inserted`` in their holes and the rest at their starts."""
    st = initial_state(dom)
    for blk in st["blocks"]:
        if blk["id"] in inserted:
            blk["x"], blk["y"], blk["z"], blk["yaw"] = inserted_pose(dom, blk["id"])
    return S.round_state(st)


def legal_moves(dom: dict, inserted, target=None) -> list[str]:
    ins = set(inserted)
    return [b for b in dom["cell_of"] if b not in ins and (target is None or b in target)
            and all(u in ins for u in uppers(dom, b))]


def random_order(dom: dict, rng: np.random.Generator, target=None) -> list[str]:
    """A uniformly drawn legal move at every step until the target (or every block) is in."""
    order: list[str] = []
    while True:
        moves = legal_moves(dom, order, target)
        if not moves:
            return order
        order.append(moves[int(rng.integers(len(moves)))])


def read_state(dom: dict, state: dict):
    """(physically legal, inserted ids) of a state, read from its block poses alone."""
    start = {b["id"]: b for b in dom["blocks"]}
    inserted = set()
    for blk in state["blocks"]:
        s0 = start[blk["id"]]
        same = all(abs(blk[k] - s0[k]) <= POSE_TOL for k in ("x", "y", "z", "yaw"))
        if same:
            continue
        x, y, z, hole_yaw = inserted_pose(dom, blk["id"])
        in_hole = abs(blk["x"] - x) <= POSE_TOL and abs(blk["y"] - y) <= POSE_TOL and abs(blk["z"] - z) <= POSE_TOL
        if in_hole and S.yaw_fits(blk["shape"], blk["yaw"], hole_yaw):
            inserted.add(blk["id"])
        else:
            return False, None
    closed = all(u in inserted for b in inserted for u in uppers(dom, b))
    return closed, (inserted if closed else None)


def valid_toward(dom: dict, state: dict, target: set) -> bool:
    ok, ins = read_state(dom, state)
    return bool(ok and ins <= set(target))


def ideals(dom: dict, target) -> list[frozenset]:
    """Every valid inserted set inside ``target`` (all states on some legal path to it)."""
    target = sorted(target)
    out = []
    for r in range(len(target) + 1):
        for combo in itertools.combinations(target, r):
            s = set(combo)
            if all(u in s for b in s for u in uppers(dom, b)):
                out.append(frozenset(s))
    return out


# ----------------------------------------------------------------- distractors
def distractor(dom: dict, kind: str, prev: set, move: str | None, target: set, rng: np.random.Generator):
    """A state one step past ``prev`` that looks like a move but is wrong toward ``target``; None if
    this kind is impossible here. ``move`` is the reference move from ``prev``."""
    st = state_of(dom, prev)
    by_id = {b["id"]: b for b in st["blocks"]}
    board = dom["board"]
    occupied = {dom["cell_of"][b] for b in prev}
    if kind == "wrong_hole" and move is not None:
        shape = by_id[move]["shape"]
        cells = [i for i, c in enumerate(board["cells"]) if c[0] != shape and i not in occupied]
        if not cells:
            return None
        xy = S.cell_world(board, cells[int(rng.integers(len(cells)))])
        by_id[move].update(x=float(xy[0]), y=float(xy[1]), z=S.Z_PLATE, yaw=float(rng.uniform(-math.pi, math.pi)))
    elif kind == "other_hole" and move is not None:  # through an empty hole of its shape that the target gives another block
        shape = by_id[move]["shape"]
        own = dom["cell_of"][move]
        cells = [i for i, c in enumerate(board["cells"]) if c[0] == shape and i not in occupied and i != own]
        if not cells:
            return None
        xy = S.cell_world(board, cells[int(rng.integers(len(cells)))])
        by_id[move].update(x=float(xy[0]), y=float(xy[1]), z=S.Z_TABLE, yaw=float(board["yaw"]))
    elif kind == "bad_yaw" and move is not None:
        shape = by_id[move]["shape"]
        if shape == "circle":
            return None
        period = geometry.symmetry_period(shape)
        x, y, _, hole_yaw = inserted_pose(dom, move)
        off = rng.uniform(math.radians(20), period / 2) * rng.choice([-1.0, 1.0])
        by_id[move].update(x=x, y=y, z=S.Z_PLATE, yaw=float(hole_yaw + off))  # rests on the rim: it cannot pass
    elif kind == "precedence":
        covered = [b for b in dom["cell_of"] if b not in prev and any(u not in prev for u in uppers(dom, b))]
        if not covered:
            return None
        c = covered[int(rng.integers(len(covered)))]
        x, y, z, yaw = inserted_pose(dom, c)
        by_id[c].update(x=x, y=y, z=z, yaw=yaw)
        u = c
        while (ups := [w for w in uppers(dom, u) if w not in prev]):  # the stack above drops one level
            u = ups[0]
            by_id[u]["z"] = by_id[u]["z"] - S.STACK_DZ
    elif kind == "extra_block":
        extra = [b for b in legal_moves(dom, prev) if b not in target]
        if not extra:
            return None
        e = extra[int(rng.integers(len(extra)))]
        x, y, z, yaw = inserted_pose(dom, e)
        by_id[e].update(x=x, y=y, z=z, yaw=yaw)
    else:
        return None
    return S.round_state(st)


def draw_distractors(dom, steps, target, rng, kinds=DISTRACTOR_KINDS, avoid=()):
    """One distractor per (prev set, reference move) in ``steps``, kinds spread evenly; all invalid
    toward ``target`` and all distinct from each other and from ``avoid`` states."""
    seen = {S.canonical(s) for s in avoid}
    out = []
    for prev, move in steps:
        order = list(rng.permutation(list(kinds)))
        order.sort(key=lambda k: sum(1 for _, kk in out if kk == k))  # least used kind first
        for kind in order + list(FALLBACK_KINDS):
            st = distractor(dom, kind, set(prev), move, set(target), rng)
            if st is None or valid_toward(dom, st, target):
                continue
            key = S.canonical(st)
            if key in seen:
                continue
            seen.add(key)
            out.append((st, kind))
            break
        else:
            raise RuntimeError("no distractor possible for this step")
    return out


# ----------------------------------------------------------------- Plan-k-step
def plan_prompt(k: int, labels) -> str:
    return (
        "Image 'Initial' shows the start and image 'Target' the goal. One move takes a block that has nothing "
        "resting on it and drops it into its matching hole of the board (it falls through and stands on the table). "
        f"Reaching the target takes {k + 1} moves. Candidates {labels[0]}-{labels[-1]} show possible states; "
        f"exactly {k} of them are the states after moves 1 to {k} of a legal plan, the others are wrong. "
        f"Answer with those {k} letters in the order of the moves, e.g. 'Answer: {', '.join(labels[:k])}'."
    )


def plan_question(k: int) -> str:
    """The question of the official prompt style (``<image N>`` markers, see :mod:`assembly_probe.prompts`)."""
    return ("<image 1> shows the start and <image 2> the goal: a 3x3 board of shaped holes and blocks in stacks. "
            "One move takes a block that has nothing resting on it and drops it into its matching hole of the board "
            f"(it falls through and stands on the table). Reaching the goal takes {k + 1} moves. The options show "
            f"possible states; exactly {k} of them are the states after moves 1 to {k} of a legal plan, the others "
            f"are wrong. Which {k} options, in the order of the moves?")


def make_plan_item(rng: np.random.Generator, k: int, camera: str = "plan") -> dict:
    """Plan-k-step: k+1 moves from initial to target; k valid step states and k distractors."""
    for _ in range(100):
        n = min(9, k + 1 + int(rng.integers(0, 3)))
        dom = make_domain(rng, n)
        order = random_order(dom, rng)[: k + 1]
        target = set(order)
        if len(order) == k + 1 and any(u in target and v in target for u, v in edges(dom)):
            break
    else:
        raise RuntimeError("could not draw a constrained plan")
    valid = [state_of(dom, order[:i]) for i in range(1, k + 1)]
    steps = [(order[: i - 1], order[i - 1]) for i in range(1, k + 1)]
    avoid = [state_of(dom, s) for s in ideals(dom, target)]
    dis = draw_distractors(dom, steps, target, rng, avoid=avoid)
    cands = [(st, "valid") for st in valid] + dis
    perm = rng.permutation(len(cands))
    labels = LABELS[: 2 * k]
    candidates, answer = [], [None] * k
    for lab, j in zip(labels, perm):
        st, kind = cands[j]
        candidates.append({"label": lab, "state": st, "kind": kind, "valid": kind == "valid"})
        if kind == "valid":
            answer[int(j)] = lab
    images = [{"label": "Initial", "role": "initial", "state": state_of(dom, ()), "camera": camera},
              {"label": "Target", "role": "target", "state": state_of(dom, target), "camera": camera}]
    images += [{"label": c["label"], "role": "candidate", "state": c["state"], "camera": camera} for c in candidates]
    return {
        "type": "plan", "k": k, "answer_format": "plan", "labels": list(labels),
        "options": {lab: f"image {lab}" for lab in labels}, "prompt": plan_prompt(k, labels),
        "question": plan_question(k), "images": images, "answer": answer,
        "meta": {"domain": dom, "target": sorted(target), "reference_order": order, "edges": edges(dom),
                 "kinds": {c["label"]: c["kind"] for c in candidates}},
    }


def score_plan(item: dict, chosen) -> dict:
    """exact: the chosen states form a legal complete path (any order the constraints allow);
    set: exactly the valid candidates, order ignored; overlap: share of the k chosen that are valid."""
    k = item["k"]
    dom = item["meta"]["domain"]
    target = set(item["meta"]["target"])
    if chosen is None:
        return {"exact": False, "set": False, "overlap": 0.0, "parsed": False}
    by_label = {im["label"]: im["state"] for im in item["images"] if im["role"] == "candidate"}
    valid = {lab for lab, st in by_label.items() if valid_toward(dom, st, target)}
    uniq = [c for c in dict.fromkeys(chosen) if c in by_label]
    overlap = sum(1 for c in uniq if c in valid) / k
    moves, prev = [], set()
    exact = len(chosen) == k and len(uniq) == k
    for c in chosen if exact else []:
        ok, ins = read_state(dom, by_label[c])
        if not ok or not ins <= target or not (prev < ins) or len(ins - prev) != 1:
            exact = False
            break
        moves.append(next(iter(ins - prev)))
        prev = ins
    if exact:
        rest = target - prev
        exact = len(rest) == 1 and is_topological_order(moves + sorted(rest), target, edges(dom))
    return {"exact": bool(exact), "set": set(chosen) == valid and len(chosen) == k, "overlap": float(overlap),
            "parsed": True}


def legal_path(dom: dict, target: set, sets: list) -> tuple[bool, str]:
    """(legal, reason) of the inserted sets at steps 1..k toward ``target``: each inside the target, closed
    (every block resting on an inserted one inserted too), one block more than the step before, and the one
    block left a legal last move. The Plan-k-Step-Generation matcher and the part-level verifier both end here."""
    prev: set = set()
    for i, s in enumerate(sets, start=1):
        s = set(s)
        if not s <= target:
            return False, f"step {i}: a block outside the target is inserted"
        if not all(u in s for b in s for u in uppers(dom, b)):
            return False, f"step {i}: a block is inserted while another rests on it"
        if not prev < s or len(s - prev) != 1:
            return False, f"step {i} does not add exactly one block to step {i - 1}"
        prev = s
    rest = target - prev
    if len(rest) != 1 or not all(u in prev for u in uppers(dom, next(iter(rest)))):
        return False, "the last move is not legal"
    return True, "legal path"


def plan_chance(k: int) -> dict:
    """Chance of a uniformly random ordered list of k distinct candidates out of 2k."""
    n = 2 * k
    return {"exact": 1.0 / math.perm(n, k), "set": 1.0 / math.comb(n, k), "overlap": 0.5}
