"""The 11 elementary question types. Every generator takes a seeded ``numpy`` Generator and
returns an item whose answer is read from the exact scene state (see ``scene.py``).

Item fields: ``type``, ``prompt`` (the legacy prompt: the question with its options inline, the images
labelled after it), ``question`` (the question as the official LEGO-Puzzles prompt has it: ``<image N>`` where
the N-th image goes, see :mod:`assembly_probe.prompts`), ``answer_format`` (choice | yesno | order),
``labels`` (choice/order), ``options`` (label -> text; an option that is a picture names it: "image B"),
``answer``, ``images`` (label, role, state, camera) and ``meta`` (what the oracle needs beyond the images'
states).

Option counts are the paper's (LEGO-Puzzles, Tang et al. 2025: chance 1/3 for height with "same height",
1/5 for next step and outlier, 1/2 for the yes/no types, 1/24 for ordering, 1/4 for the rest; overall chance
27.5%), and the right answer's letter cycles with the item's index, so every letter is the answer equally often
in the full set and in its Lite prefix.
"""

from __future__ import annotations

import math
import string

import numpy as np

from env import geometry
from assembly_probe import planning as P
from assembly_probe import scene as S

TYPES = ("height", "adjacency", "rotation", "multiview", "rotation_status", "position",
         "next_step", "dependency", "backwards", "ordering", "outlier")
LABELS = string.ascii_uppercase
YES_NO = {"A": "Yes", "B": "No"}  # the yes/no types' options in the official prompt (A. Yes / B. No)
ROTATION_STEPS = 4  # rotation options: 0, 1, 2, 3 quarters of the block's symmetry period (square 22.5 deg apart,
# triangle 30 deg; issue 35: 15 deg steps could not be told apart at the render size)
SAME_HEIGHT = "They are the same height."  # the official dataset's third height option


# ----------------------------------------------------------------- standard scenes
def standard_scene(rng: np.random.Generator, yaw_deg: float = 15.0, permute: bool = True) -> dict:
    """Benchmark-like scene: 3-cell board (cell order shuffled) and the three blocks on the table."""
    order = [str(s) for s in rng.permutation(geometry.SHAPES)] if permute else list(geometry.SHAPES)
    board = S.standard_board(order, x=0.03 + rng.uniform(-0.02, 0.02), y=rng.uniform(-0.02, 0.02),
                             yaw=float(np.deg2rad(rng.uniform(-yaw_deg, yaw_deg))))
    st = {"board": board, "blocks": []}
    for i, shape in enumerate(geometry.SHAPES):
        x, y = free_xy(rng, st)
        st["blocks"].append({"id": f"b{i}", "shape": shape, "color": S.DEFAULT_COLOR[shape], "x": x, "y": y,
                             "z": S.Z_TABLE, "yaw": float(rng.uniform(-math.pi, math.pi))})
    return st


def free_xy(rng, st, exclude=(), region=S.TABLE_REGION, gap=0.02) -> tuple[float, float]:
    """A table spot clear of the board and of every block footprint (discs) except ``exclude``."""
    for _ in range(5000):
        p = np.array([rng.uniform(*region[0]), rng.uniform(*region[1])])
        if S.over_board(st["board"], p, 0.033):
            continue
        if all(np.hypot(p[0] - b["x"], p[1] - b["y"]) > 0.033 + S.radius(b["shape"]) + gap
               for b in st["blocks"] if b["id"] not in exclude):
            return float(p[0]), float(p[1])
    raise RuntimeError("no free table spot")


def cell_index(st, shape) -> int:
    return next(i for i, c in enumerate(st["board"]["cells"]) if c[0] == shape)


def by_id(st) -> dict:
    return {b["id"]: b for b in st["blocks"]}


def copy_state(st) -> dict:
    return {"board": dict(st["board"], cells=[list(c) for c in st["board"]["cells"]]),
            "blocks": [dict(b) for b in st["blocks"]]}


def insert(st, blk) -> None:
    """Drop a block through its own hole (it fits at the board's yaw)."""
    xy = S.cell_world(st["board"], cell_index(st, blk["shape"]))
    blk.update(x=float(xy[0]), y=float(xy[1]), z=S.Z_TABLE, yaw=float(st["board"]["yaw"]))


def rest_on_cell(st, blk, i, yaw) -> None:
    xy = S.cell_world(st["board"], i)
    blk.update(x=float(xy[0]), y=float(xy[1]), z=S.Z_PLATE, yaw=float(yaw))


def varied_scene(rng) -> dict:
    """Standard scene where blocks may be inserted, rest on a hole they do not fit, or sit on another block."""
    st = standard_scene(rng)
    free_cells = list(range(3))
    for j in rng.permutation(3):
        blk = st["blocks"][int(j)]
        mode = rng.choice(["table", "table", "plate", "inserted"])
        own = cell_index(st, blk["shape"])
        if mode == "inserted" and own in free_cells:
            insert(st, blk)
            free_cells.remove(own)
        elif mode == "plate":
            wrong = [i for i in free_cells if i != own]
            if wrong:
                i = wrong[int(rng.integers(len(wrong)))]
                rest_on_cell(st, blk, i, rng.uniform(-math.pi, math.pi))
                free_cells.remove(i)
    # maybe stack one block on another that is not in a hole
    if rng.uniform() < 0.5:
        ids = [str(i) for i in rng.permutation([b["id"] for b in st["blocks"]])]
        blocks = by_id(st)
        top, base = blocks[ids[0]], blocks[ids[1]]
        inserted = abs(base["z"] - S.Z_TABLE) < 1e-9 and S.over_board(st["board"], (base["x"], base["y"]), 0.0, 0.0)
        if not inserted and abs(top["z"] - S.Z_TABLE) < 1e-9 and not S.over_board(st["board"], (top["x"], top["y"]), 0, 0):
            top.update(x=base["x"], y=base["y"], z=base["z"] + S.STACK_DZ, yaw=float(rng.uniform(-math.pi, math.pi)))
    return st


def _img(label, role, state, camera="front"):
    return {"label": label, "role": role, "state": S.round_state(state), "camera": camera}


def _choice_item(kind, prompt, question, options, answer, images, meta=None, labels=None):
    labels = labels or list(options)
    return {"type": kind, "answer_format": "choice", "labels": labels, "options": options, "prompt": prompt,
            "question": question, "answer": answer, "images": images, "meta": meta or {}}


def _yesno_item(kind, prompt, question, answer, images, meta):
    return {"type": kind, "answer_format": "yesno", "labels": list(YES_NO), "options": dict(YES_NO),
            "prompt": prompt, "question": question, "answer": answer, "images": images, "meta": meta}


def _letters_prompt(labels) -> str:
    return f"Answer with one letter ({', '.join(labels)})."


def _inline(options) -> str:
    return " ".join(f"{lab}: {txt}." for lab, txt in options.items())


def _arrange(rng, answer, wrong, slot: int):
    """The answer at position ``slot`` (the item's index modulo the option count: balanced letters), the wrong
    payloads shuffled around it -> (labels, payloads in label order, answer label)."""
    wrong = [wrong[int(j)] for j in rng.permutation(len(wrong))]
    payloads = wrong[:slot] + [answer] + wrong[slot:]
    labels = list(LABELS[: len(payloads)])
    return labels, payloads, labels[slot]


def _image_options(labels) -> dict:
    return {lab: f"image {lab}" for lab in labels}


# ----------------------------------------------------------------- 1 height
def _inserted(st, b) -> bool:
    return abs(b["z"] - S.Z_TABLE) < 1e-9 and S.over_board(st["board"], (b["x"], b["y"]), 0.0, 0.0)


def q_height(rng, index):
    """Which of two blocks is higher above the table, or are they at the same height (the paper's three
    options)? Never a block inside a hole (its centre is as high as a block on the table, though it looks
    sunk). Half the A/B items have the image-plane position say the opposite."""
    want = index % 3  # 0: A higher, 1: B higher, 2: the same height
    want_conflict = (index // 3) % 2 == 0
    for _ in range(1000):
        st = varied_scene(rng)
        a, b = [st["blocks"][int(i)] for i in rng.permutation(3)[:2]]
        if _inserted(st, a) or _inserted(st, b):
            continue
        dz = a["z"] - b["z"]
        if want == 2:
            if abs(dz) > 1e-9:
                continue
            conflict = False
            break
        if (dz > 0) != (want == 0) or abs(dz) < 0.025:
            continue
        (_, va), (_, vb) = S.project("front", [[a["x"], a["y"], a["z"]], [b["x"], b["y"], b["z"]]])
        conflict = (a["z"] > b["z"]) != (va < vb)
        if conflict == want_conflict:
            break
    else:
        raise RuntimeError("height: no scene")
    options = {"A": S.block_name(a), "B": S.block_name(b), "C": SAME_HEIGHT}
    prompt = ("Which block is higher above the table (compare the heights of their centres in 3D, not their "
              f"positions in the image)? {_inline(options)} " + _letters_prompt(list(options)))
    question = ("<image 1> The image shows a table with a board of shaped holes and coloured blocks. Compare the "
                "heights of the centres of two blocks above the table in 3D space, not their positions in the "
                f"image. Which block is higher: {S.block_name(a)} or {S.block_name(b)}?")
    return _choice_item("height", prompt, question, options, "ABC"[want], [_img("Image 1", "scene", st)],
                        {"subjects": {"A": a["id"], "B": b["id"]}, "image_plane_conflict": bool(conflict)})


# ----------------------------------------------------------------- 2 adjacency
TOUCH_M = 0.001  # touching: closest points at most 1 mm apart
APART_MIN_M = 0.012
# A "no" item's gap must be one a person sees in the image it comes with: the two silhouettes at least this many
# pixels apart at the render size (about 2% of the picture). Measured on renders (tests): at 8 px the pixels
# between the two blocks show at least 5 px of table or board, neither block's colour, after anti-aliasing
# and with the key light's shadows; at 3 px (issue 21's minimum) two such gaps looked like touching (issue 35).
APART_MIN_PX = 8.0


def q_adjacency(rng, index):
    touch = index % 2 == 0
    for _ in range(1000):
        st = standard_scene(rng)
        a, b, c = [st["blocks"][int(i)] for i in rng.permutation(3)]
        if touch and rng.uniform() < 0.3:
            b.update(x=a["x"], y=a["y"], z=a["z"] + S.STACK_DZ)
        else:
            gap = 0.0003 if touch else rng.uniform(APART_MIN_M, 0.05)
            b["x"], b["y"] = S.place_beside(a, b["shape"], b["yaw"], rng.uniform(-math.pi, math.pi), gap)
            (x0, x1), (y0, y1) = S.TABLE_REGION
            if S.over_board(st["board"], (b["x"], b["y"]), S.radius(b["shape"])) or not (
                    x0 - 0.02 < b["x"] < x1 + 0.02 and y0 - 0.02 < b["y"] < y1 + 0.02):
                continue
        if min(S.blocks_distance(c, a), S.blocks_distance(c, b)) < 0.015:
            continue
        d = S.blocks_distance(a, b)
        if (d <= TOUCH_M) == touch and (touch or gap_in_image_px(a, b, "front") >= APART_MIN_PX):
            break
    else:
        raise RuntimeError("adjacency: no scene")
    prompt = f"Do {S.block_name(a)} and {S.block_name(b)} touch each other? Answer yes or no."
    question = (f"<image 1> The image shows a table with a board of shaped holes and coloured blocks. Do "
                f"{S.block_name(a)} and {S.block_name(b)} touch each other?")
    return _yesno_item("adjacency", prompt, question, "yes" if d <= TOUCH_M else "no", [_img("Image 1", "scene", st)],
                       {"subjects": [a["id"], b["id"]], "distance_m": d})


def gap_in_image_px(a: dict, b: dict, camera: str, size: int = S.IMAGE_SIZE) -> float:
    """Pixels between two blocks' silhouettes in a camera's image: 0 when one hides part of the other.
    A 'no' adjacency answer is decidable from the picture only if this is a few pixels or more."""
    return S.polygon_distance(S.silhouette(a, camera, size), S.silhouette(b, camera, size))


# ----------------------------------------------------------------- 3 rotation
def rotation_needed_deg(shape, block_yaw, hole_yaw) -> float:
    """Smallest counter-clockwise turn in [0, period) that makes the block fit its hole."""
    period = math.degrees(geometry.symmetry_period(shape))
    return round(math.degrees(hole_yaw - block_yaw) % period, 6) % period


def q_rotation(rng, index):
    """How far must a square or triangle turn (counter-clockwise, seen from above) to fit its hole? Options
    0, 1, 2 and 3 quarters of its symmetry period in that order (square: 0, 22.5, 45, 67.5 degrees)."""
    st = standard_scene(rng, yaw_deg=20)
    blk = st["blocks"][1 + int(rng.integers(2))]  # square or triangle: the circle fits at any yaw
    period = math.degrees(geometry.symmetry_period(blk["shape"]))
    values = [period * i / ROTATION_STEPS for i in range(ROTATION_STEPS)]
    r = values[index % ROTATION_STEPS]
    blk["yaw"] = float(st["board"]["yaw"] - math.radians(r) + int(rng.integers(-1, 2)) * math.radians(period))
    blk["x"], blk["y"] = free_xy(rng, st, exclude=(blk["id"],))
    labels = list(LABELS[:ROTATION_STEPS])
    options = {lab: f"{v:g} degrees" for lab, v in zip(labels, values)}
    prompt = (f"The image is a top view. By how many degrees must {S.block_name(blk)} turn counter-clockwise "
              f"(seen from above) so that it fits into its hole? {_inline(options)} " + _letters_prompt(labels))
    question = (f"<image 1> The image is a top view of a table with a board of shaped holes and coloured blocks. By "
                f"how many degrees must {S.block_name(blk)} turn counter-clockwise (seen from above) so that it fits "
                "into its matching hole?")
    return _choice_item("rotation", prompt, question, options, labels[index % ROTATION_STEPS],
                        [_img("Image 1", "scene", st, "top")],
                        {"subject": blk["id"], "values_deg": dict(zip(labels, values))})


# ----------------------------------------------------------------- 4 multiview
VIEW_PAIRS = (("front", "side"), ("front", "robot"), ("side", "robot"), ("robot", "side"), ("side", "front"),
              ("robot", "front"))


def mirror(st) -> dict:
    """The scene mirrored across the board's axis (y -> 2 y_board - y)."""
    out = copy_state(st)
    yb = st["board"]["y"]
    out["board"]["yaw"] = -st["board"]["yaw"]
    out["board"]["cells"] = [[s, cx, -cy] for s, cx, cy in st["board"]["cells"]]
    for b in out["blocks"]:
        b["y"] = 2 * yb - b["y"]
        b["yaw"] = -b["yaw"]
    return out


def _changed(rng, st, kind):
    out = copy_state(st)
    blocks = out["blocks"]
    on_table = [b for b in blocks if abs(b["z"] - S.Z_TABLE) < 1e-9 and not S.over_board(out["board"], (b["x"], b["y"]), 0, 0)
                and not any(abs(o["x"] - b["x"]) < 1e-9 and abs(o["y"] - b["y"]) < 1e-9 and o is not b for o in blocks)]
    if kind == "mirror":
        return mirror(st)
    if kind == "move" and on_table:
        b = on_table[int(rng.integers(len(on_table)))]
        for _ in range(100):
            x, y = free_xy(rng, out, exclude=(b["id"],))
            if math.hypot(x - b["x"], y - b["y"]) > 0.08:
                b["x"], b["y"] = x, y
                return out
        return None
    if kind == "recolor":
        i, j = rng.permutation(3)[:2]
        blocks[i]["color"], blocks[j]["color"] = blocks[j]["color"], blocks[i]["color"]
        return out
    if kind == "rotate":
        cand = [b for b in on_table if b["shape"] != "circle"]
        if not cand:
            return None
        b = cand[int(rng.integers(len(cand)))]
        period = geometry.symmetry_period(b["shape"])
        b["yaw"] += rng.uniform(0.3, 0.5) * period * rng.choice([-1.0, 1.0])
        return out
    return None


def q_multiview(rng, index):
    st = varied_scene(rng)
    ref_cam, cand_cam = VIEW_PAIRS[index % len(VIEW_PAIRS)]
    entries = [(st, True)]
    seen = {S.canonical(S.round_state(st))}

    def add_changed(kind: str) -> None:
        d = _changed(rng, st, kind)
        key = None if d is None else S.canonical(S.round_state(d))
        if key is not None and key not in seen:
            seen.add(key)
            entries.append((d, False))

    for kind in rng.permutation(["mirror", "move", "recolor", "rotate"]):
        if len(entries) == 4:
            break
        add_changed(str(kind))
    for attempt in range(200):  # scenes with no free table block: other colour swaps
        if len(entries) == 4:
            break
        add_changed(("recolor", "move")[attempt % 2])
    labels, states, answer = _arrange(rng, entries[0][0], [e[0] for e in entries[1:]], index % len(entries))
    images = [_img("Image 1", "reference", st, ref_cam)] + [_img(lab, "candidate", s, cand_cam) for lab, s in zip(labels, states)]
    prompt = (f"Image 1 shows a scene from the {ref_cam} camera. Images A-D are taken from the {cand_cam} camera. "
              f"Which of them shows the same scene as Image 1? " + _letters_prompt(labels))
    question = (f"<image 1> shows a scene (a table, a board of shaped holes and coloured blocks) from the {ref_cam} "
                f"camera. The options are pictures taken from the {cand_cam} camera. Which of them shows the same scene?")
    return _choice_item("multiview", prompt, question, _image_options(labels), answer, images,
                        {"reference_camera": ref_cam, "candidate_camera": cand_cam})


# ----------------------------------------------------------------- 5 rotation status
def q_rotation_status(rng, index):
    turn = index % 2 == 0
    st = standard_scene(rng, yaw_deg=20)
    blk = st["blocks"][1 + int(rng.integers(2))] if turn else st["blocks"][int(rng.integers(3))]
    hole_yaw = st["board"]["yaw"]
    if blk["shape"] == "circle":
        blk["yaw"] = float(rng.uniform(-math.pi, math.pi))
    else:
        period = geometry.symmetry_period(blk["shape"])
        off = rng.uniform(math.radians(15), period / 2) * rng.choice([-1.0, 1.0]) if turn else 0.0
        blk["yaw"] = float(hole_yaw + off + int(rng.integers(-1, 2)) * period)
    blk["x"], blk["y"] = free_xy(rng, st, exclude=(blk["id"],))
    fits = S.yaw_fits(blk["shape"], blk["yaw"], hole_yaw)
    assert fits != turn
    prompt = (f"The image is a top view. Must {S.block_name(blk)} turn about the vertical axis before it can fit "
              f"into its hole? Answer yes or no.")
    question = (f"<image 1> The image is a top view of a table with a board of shaped holes and coloured blocks. Must "
                f"{S.block_name(blk)} turn about the vertical axis before it can fit into its matching hole?")
    return _yesno_item("rotation_status", prompt, question, "no" if fits else "yes",
                       [_img("Image 1", "scene", st, "top")], {"subject": blk["id"]})


# ----------------------------------------------------------------- 6 position
def holes_left_to_right(st, camera) -> list[int]:
    pts = [[*S.cell_world(st["board"], i), geometry.PLATE_TOP_Z] for i in range(len(st["board"]["cells"]))]
    return [int(i) for i in np.argsort(S.project(camera, pts)[:, 0])]


def cell_taken(st, i) -> bool:
    """A block stands in hole ``i`` (inserted) or rests on it."""
    xy = S.cell_world(st["board"], i)
    return any(abs(b["x"] - xy[0]) < 1e-6 and abs(b["y"] - xy[1]) < 1e-6 for b in st["blocks"])


def free_on_table(st) -> list[dict]:
    """Blocks on the table, off the board, with nothing resting on them: the ones a step can pick up or build on."""
    return [b for b in st["blocks"] if abs(b["z"] - S.Z_TABLE) < 1e-9
            and not S.over_board(st["board"], (b["x"], b["y"]), 0, 0)
            and not any(o is not b and abs(o["x"] - b["x"]) < 1e-9 and abs(o["y"] - b["y"]) < 1e-9
                        for o in st["blocks"])]


POSITION_OPTIONS = ("at the left hole", "at the middle hole", "at the right hole", "on top of another block")


def q_position(rng, index):
    """The paper's installation position: the current structure, the part and the resulting structure are given;
    where was the part installed? The part goes into its own hole, rests on a hole it does not fit, or sits on
    another block, so the part's shape alone does not give the answer; each option is the answer of a quarter
    of the items, and half of the hole answers are insertions."""
    want = index % 4  # A-C: the hole at that place from left to right in the image; D: on another block
    camera = ("front", "robot")[(index // 4) % 2]
    for _ in range(500):
        st = standard_scene(rng, yaw_deg=25)
        if rng.uniform() < 0.5:  # a part is installed already
            insert(st, st["blocks"][int(rng.integers(3))])
        free = free_on_table(st)
        if want < 3:
            cell = holes_left_to_right(st, camera)[want]
            fits = rng.uniform() < 0.5  # half of the hole answers are an insertion, half a part resting on it
            free = [b for b in free if (b["shape"] == st["board"]["cells"][cell][0]) == fits]
            if cell_taken(st, cell):
                continue
        if not free:
            continue
        part = free[int(rng.integers(len(free)))]
        after = copy_state(st)
        moved = by_id(after)[part["id"]]
        if want < 3:
            if st["board"]["cells"][cell][0] == part["shape"]:
                insert(after, moved)
                placement = "inserted"
            else:
                rest_on_cell(after, moved, cell, rng.uniform(-math.pi, math.pi))
                placement = "rests_on_hole"
        else:
            bases = [b for b in free if b["id"] != part["id"]]
            if not bases:
                continue
            base = bases[int(rng.integers(len(bases)))]
            moved.update(x=base["x"], y=base["y"], z=base["z"] + S.STACK_DZ, yaw=float(rng.uniform(-math.pi, math.pi)))
            placement = "stacked"
        break
    else:
        raise RuntimeError("position: no scene")
    labels = list(LABELS[:4])
    options = dict(zip(labels, POSITION_OPTIONS))
    prompt = ("Image 1 shows the current scene, Image 2 a part, and Image 3 the scene after that part was placed. "
              "Where was the part placed (left and right as seen in Images 1 and 3)? "
              + _inline(options) + " " + _letters_prompt(labels))
    question = ("<image 1> is the current scene (a table, a board of shaped holes and coloured blocks), <image 2> a "
                "part, and <image 3> the scene after that part was placed. Where was the part placed (left and right "
                "as seen in the scene pictures)?")
    images = [_img("Image 1", "current", st, camera), _img("Image 2", "part", S.part_state([part], st["board"]), "part"),
              _img("Image 3", "result", after, camera)]
    return _choice_item("position", prompt, question, options, labels[want], images,
                        {"subject": part["id"], "camera": camera, "placement": placement})


# ----------------------------------------------------------------- 7 next step
NEXT_STEP_OPTIONS = 5  # the paper's count: the right state and four wrong ones


def _next_step_pool(rng, st, x, waiting) -> list[tuple[dict, str]]:
    """Wrong states one step on from ``st`` when the instruction is to insert ``x``: x on a hole of another
    shape, another block inserted, x on its own hole at a yaw that does not fit, x moved on the table, nothing
    done, x and another block inserted, x put on another block, x inserted while a block already in its hole is
    taken out."""
    blocks = st["blocks"]
    ix = blocks.index(x)
    pool = []
    occupied = {cell_index(st, b["shape"]) for b in blocks if b not in waiting}
    wrong_cells = [i for i in range(3) if i != cell_index(st, x["shape"]) and i not in occupied]
    if wrong_cells:
        d = copy_state(st)
        rest_on_cell(d, d["blocks"][ix], wrong_cells[int(rng.integers(len(wrong_cells)))], rng.uniform(-math.pi, math.pi))
        pool.append((d, "wrong_hole"))
    other = [b for b in waiting if b is not x]
    if other:
        d = copy_state(st)
        insert(d, d["blocks"][blocks.index(other[int(rng.integers(len(other)))])])
        pool.append((d, "wrong_block"))
        d = copy_state(st)
        insert(d, d["blocks"][ix])
        insert(d, d["blocks"][blocks.index(other[int(rng.integers(len(other)))])])
        pool.append((d, "two_steps"))
        d = copy_state(st)
        base = d["blocks"][blocks.index(other[int(rng.integers(len(other)))])]
        d["blocks"][ix].update(x=base["x"], y=base["y"], z=base["z"] + S.STACK_DZ, yaw=float(rng.uniform(-math.pi, math.pi)))
        pool.append((d, "stacked"))
    if x["shape"] != "circle":
        d = copy_state(st)
        period = geometry.symmetry_period(x["shape"])
        rest_on_cell(d, d["blocks"][ix], cell_index(st, x["shape"]),
                     st["board"]["yaw"] + rng.uniform(math.radians(20), period / 2) * rng.choice([-1.0, 1.0]))
        pool.append((d, "bad_yaw"))
    done = [b for b in blocks if b not in waiting]
    if done:
        d = copy_state(st)
        insert(d, d["blocks"][ix])
        back = d["blocks"][blocks.index(done[0])]
        back["x"], back["y"] = free_xy(rng, d, exclude=(back["id"],))
        back["yaw"] = float(rng.uniform(-math.pi, math.pi))
        pool.append((d, "taken_out"))
    d = copy_state(st)
    for _ in range(200):  # moved far enough to be seen
        xy = free_xy(rng, d, exclude=(x["id"],))
        if math.hypot(xy[0] - x["x"], xy[1] - x["y"]) > 0.06:
            d["blocks"][ix]["x"], d["blocks"][ix]["y"] = xy
            pool.append((d, "moved_on_table"))
            break
    pool.append((copy_state(st), "unchanged"))
    return pool


def q_next_step(rng, index):
    for _ in range(200):
        st = standard_scene(rng)
        blocks = st["blocks"]
        if rng.uniform() < 0.5:  # one block already in its hole
            insert(st, blocks[int(rng.integers(3))])
        waiting = [b for b in blocks if not _inserted(st, b)]
        x = waiting[int(rng.integers(len(waiting)))]
        good = copy_state(st)
        insert(good, good["blocks"][blocks.index(x)])
        pool = _next_step_pool(rng, st, x, waiting)
        if len(pool) >= NEXT_STEP_OPTIONS - 1:
            break
    else:
        raise RuntimeError("next step: too few wrong states")
    chosen = [pool[int(j)] for j in rng.permutation(len(pool))[:NEXT_STEP_OPTIONS - 1]]
    labels, states, answer = _arrange(rng, (good, "right"), chosen, index % NEXT_STEP_OPTIONS)
    images = [_img("Image 1", "current", st)] + [_img(lab, "candidate", s, "front") for lab, (s, _) in zip(labels, states)]
    span = f"{labels[0]}-{labels[-1]}"
    prompt = (f"Image 1 shows the current state. Instruction: put {S.block_name(x)} into its matching hole. "
              f"Which of images {span} shows the state right after this step is done correctly? " + _letters_prompt(labels))
    question = (f"<image 1> is the current state of a table with a board of shaped holes and coloured blocks. "
                f"Instruction: put {S.block_name(x)} into its matching hole (it falls through and stands on the "
                "table under the hole). Which option shows the state right after this step is done correctly?")
    return _choice_item("next_step", prompt, question, _image_options(labels), answer, images,
                        {"subject": x["id"], "distractor_kinds": [k for _, k in states if k != "right"]})


# ----------------------------------------------------------------- 8 dependency
def part_key(blocks) -> list:
    """What identifies a set of parts: their shapes and colours (not where they lie)."""
    return sorted((b["shape"], b["color"]) for b in blocks)


def _part_distractors(rng, added, before, colors_used):
    """Part sets that do not account for the step: a colour or a shape changed, one part missing or one too many,
    or a part already in the scene before the step instead."""
    out = []
    spare = [c for c in S.PALETTE if c not in colors_used]
    i = int(rng.integers(len(added)))
    out.append(("colour", [dict(b, color=spare[int(rng.integers(len(spare)))]) if j == i else b
                           for j, b in enumerate(added)]))
    others = [sh for sh in geometry.SHAPES if sh not in {b["shape"] for b in added}]
    if others:
        out.append(("shape", [dict(b, shape=others[int(rng.integers(len(others)))]) if j == i else b
                              for j, b in enumerate(added)]))
    if len(added) > 1:
        out.append(("missing", [b for j, b in enumerate(added) if j != i]))
    if before:
        out.append(("already_there", [before[int(rng.integers(len(before)))]]))
        out.append(("extra", added + [before[int(rng.integers(len(before)))]]))
    else:
        out.append(("extra", added + [dict(added[i], color=spare[-1], shape=others[0] if others else added[i]["shape"])]))
    return out


def q_dependency(rng, index):
    """The paper's dependency question: which parts account for the transition between two structures? Image 1
    holds the parts used so far, Image 2 the structure one step later with one or two parts added; the options
    are part sets shown alone (the right one, and sets with a colour or a shape changed, one part missing or one
    too many, or a part that was there before). Colours are drawn from the palette, so both shape and colour
    must be read."""
    n_new = 1 + index % 2
    for _ in range(500):
        st = standard_scene(rng, yaw_deg=20)
        colors = [str(c) for c in rng.permutation(list(S.PALETTE))[:3]]
        for b, c in zip(st["blocks"], colors):
            b["color"] = c
            if rng.uniform() < 0.5:
                insert(st, b)
        order = [int(i) for i in rng.permutation(3)]
        n_before = int(rng.integers(max(0, 2 - n_new), 3 - n_new + 1))
        before_ids = {st["blocks"][i]["id"] for i in order[:n_before]}
        added_ids = {st["blocks"][i]["id"] for i in order[n_before:n_before + n_new]}
        after = {"board": st["board"], "blocks": [b for b in st["blocks"] if b["id"] in before_ids | added_ids]}
        before = {"board": st["board"], "blocks": [b for b in st["blocks"] if b["id"] in before_ids]}
        added = [b for b in after["blocks"] if b["id"] in added_ids]
        entries = [(added, True)]
        seen = {S.canonical(part_key(added))}
        pool = _part_distractors(rng, added, before["blocks"], colors)
        for _kind, parts in (pool[int(j)] for j in rng.permutation(len(pool))):
            if len(entries) == 4:
                break
            key = S.canonical(part_key(parts))
            if key not in seen:
                seen.add(key)
                entries.append((parts, False))
        if len(entries) == 4:
            break
    else:
        raise RuntimeError("dependency: no part sets")
    labels, sets, answer = _arrange(rng, entries[0][0], [e[0] for e in entries[1:]], index % len(entries))
    images = [_img("Image 1", "before", before), _img("Image 2", "after", after)]
    for lab, parts in zip(labels, sets):
        parts = [dict(b, id=f"p{j}") for j, b in enumerate(parts)]
        images.append(_img(lab, "candidate", S.part_state(parts, st["board"]), "part"))
    prompt = ("Images 1 and 2 show the same assembly before and after one step. Images A-D each show a set of "
              "parts. Which set holds exactly the parts added in that step? " + _letters_prompt(labels))
    question = ("<image 1> and <image 2> show the same assembly (a board of shaped holes and coloured blocks) before "
                "and after one step. Each option shows a set of parts. Which set holds exactly the parts added in "
                "that step?")
    return _choice_item("dependency", prompt, question, _image_options(labels), answer, images,
                        {"parts_added": len(added)})


# ----------------------------------------------------------------- 9-11: stacked-block domain
RULES = ("One move takes a block that has nothing resting on it and drops it into its matching hole of the board "
         "(it falls through and stands on the table under the hole). ")


def q_backwards(rng, index):
    for _ in range(100):
        dom = P.make_domain(rng, int(rng.integers(3, 7)))
        order = P.random_order(dom, rng)
        m = int(rng.integers(2, min(4, len(order)) + 1))
        target = set(order[:m])
        if any(u in target and v in target for u, v in P.edges(dom)) or rng.uniform() < 0.2:
            break
    mid = P.random_order(dom, rng, target)[: int(rng.integers(1, m))]  # any legal path, not only the reference
    good = P.state_of(dom, mid)
    avoid = [P.state_of(dom, s) for s in P.ideals(dom, target)]
    steps = []
    for _ in range(3):
        j = int(rng.integers(0, m))
        path = P.random_order(dom, rng, target)
        steps.append((path[:j], path[j]))
    dis = P.draw_distractors(dom, steps, target, rng, avoid=avoid)
    labels, states, answer = _arrange(rng, good, [st for st, _ in dis], index % (len(dis) + 1))
    images = [_img("Initial", "initial", P.state_of(dom, ()), "plan"), _img("Target", "target", P.state_of(dom, target), "plan")]
    images += [_img(lab, "candidate", s, "plan") for lab, s in zip(labels, states)]
    prompt = (RULES + "Image 'Initial' shows the start and 'Target' the goal. Which of images A-D is a valid "
              "intermediate state on the way from the start to the goal? " + _letters_prompt(labels))
    question = (RULES + "<image 1> shows the start and <image 2> the goal. Which option is a valid intermediate "
                "state on the way from the start to the goal?")
    return _choice_item("backwards", prompt, question, _image_options(labels), answer, images,
                        {"domain": dom, "target": sorted(target), "distractor_kinds": [k for _, k in dis]})


ORDERING_STATES = 4


def q_ordering(rng, index):
    """Four intermediate states of one assembly, shuffled, with its start and its end shown: put them in order.
    The first state's letter cycles with the item's index."""
    dom = P.make_domain(rng, int(rng.integers(ORDERING_STATES + 1, 9)))
    order = P.random_order(dom, rng)
    picks = sorted(int(i) for i in rng.choice(np.arange(1, len(order)), ORDERING_STATES, replace=False))
    states = [P.state_of(dom, order[:i]) for i in picks]
    first = index % ORDERING_STATES
    rest = [int(j) for j in rng.permutation(np.arange(1, ORDERING_STATES))]
    slots = rest[:first] + [0] + rest[first:]  # slots[label position] = step index shown there
    labels = list(LABELS[:ORDERING_STATES])
    shown = [states[j] for j in slots]
    answer = [labels[slots.index(i)] for i in range(ORDERING_STATES)]
    images = [_img("Initial", "initial", P.state_of(dom, ()), "plan"), _img("Target", "target", P.state_of(dom, order), "plan")]
    images += [_img(lab, "state", s, "plan") for lab, s in zip(labels, shown)]
    prompt = (RULES + "Image 'Initial' shows the start and 'Target' the end of one assembly, in which blocks are moved "
              "one at a time. Images A-D show four states in between. Put them in order from first to last. Answer "
              "with the four letters in order, e.g. 'Answer: C, A, D, B'.")
    question = (RULES + "<image 1> shows the start and <image 2> the end of one assembly, in which blocks are moved one "
                "at a time. The options show four states in between. Put them in order from first to last.")
    return {"type": "ordering", "answer_format": "order", "labels": labels, "options": _image_options(labels),
            "prompt": prompt, "question": question, "answer": answer, "images": images,
            "meta": {"domain": dom, "steps": picks}}


OUTLIER_OPTIONS = 5  # the paper's count: four states of one sequence and the one that does not belong


def outlier_candidates(dom, states) -> list[int]:
    """Indices i such that the other states are legal, nested and distinct (one sequence)."""
    read = [P.read_state(dom, s) for s in states]
    out = []
    for i in range(len(states)):
        rest = [r for j, r in enumerate(read) if j != i]
        if all(ok for ok, _ in rest):
            sets = [ins for _, ins in rest]
            if all(a <= b or b <= a for a in sets for b in sets) and len({frozenset(s) for s in sets}) == len(rest):
                out.append(i)
    return out


def q_outlier(rng, index):
    n_chain = OUTLIER_OPTIONS - 1
    for _ in range(200):
        dom = P.make_domain(rng, int(rng.integers(n_chain, 8)))
        order = P.random_order(dom, rng)
        picks = sorted(int(i) for i in rng.choice(len(order) + 1, n_chain, replace=False))
        chain = [P.state_of(dom, order[:i]) for i in picks]
        if rng.uniform() < 0.3:  # a legal state from another sequence
            other = P.random_order(dom, rng)
            odd, kind = P.state_of(dom, other[: int(rng.integers(1, len(other) + 1))]), "other_sequence"
        else:
            j = int(rng.integers(0, len(order)))
            kind = str(rng.choice(["wrong_hole", "bad_yaw", "precedence"]))
            odd = P.distractor(dom, kind, set(order[:j]), order[j], set(order), rng)
            if odd is None:
                continue
        if outlier_candidates(dom, chain + [odd]) == [n_chain]:
            break
    else:
        raise RuntimeError("outlier: no item")
    labels, shown, answer = _arrange(rng, odd, chain, index % OUTLIER_OPTIONS)
    images = [_img(lab, "state", s, "plan") for lab, s in zip(labels, shown)]
    span = f"{labels[0]}-{labels[-1]}"
    prompt = (RULES + f"{n_chain} of images {span} are states of one assembly sequence; one does not belong to it "
              "(it could not occur in the same sequence, or could not occur at all). Which one? " + _letters_prompt(labels))
    question = (RULES + f"{n_chain} of the options are states of one assembly sequence; one does not belong to it (it "
                "could not occur in the same sequence, or could not occur at all). Which one?")
    return _choice_item("outlier", prompt, question, _image_options(labels), answer, images,
                        {"domain": dom, "outlier_kind": kind})


GENERATORS = {
    "height": q_height, "adjacency": q_adjacency, "rotation": q_rotation, "multiview": q_multiview,
    "rotation_status": q_rotation_status, "position": q_position, "next_step": q_next_step,
    "dependency": q_dependency, "backwards": q_backwards, "ordering": q_ordering, "outlier": q_outlier,
}

# the paper's three levels (LEGO-Puzzles: 4 + 4 + 3 of the 11 types), in the order of TYPES
LEVELS = {"spatial_understanding": ("height", "adjacency", "rotation", "multiview"),
          "single_step_reasoning": ("rotation_status", "position", "next_step", "dependency"),
          "multi_step_reasoning": ("backwards", "ordering", "outlier")}
LEVEL_NAMES = {"spatial_understanding": "Spatial Understanding", "single_step_reasoning": "Single-Step Reasoning",
               "multi_step_reasoning": "Multi-Step Reasoning"}
CHANCE = {"height": 1 / 3, "adjacency": 1 / 2, "rotation": 1 / ROTATION_STEPS, "multiview": 1 / 4,
          "rotation_status": 1 / 2, "position": 1 / 4, "next_step": 1 / NEXT_STEP_OPTIONS, "dependency": 1 / 4,
          "backwards": 1 / 4, "ordering": 1 / math.factorial(ORDERING_STATES), "outlier": 1 / OUTLIER_OPTIONS}
