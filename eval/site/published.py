"""The published reference results, read from docs/BENCHMARK.md section 8 (the one place they are written).

Every published number is kept as the text the spec prints ("96.5 [94.0, 98.5]", "199/200", "86.5-98.9"),
so the page quotes it verbatim; the page never re-draws a published range. What the page computes from
published numbers is computed by :func:`setup_counts` and :func:`computed_scores` only, and is labelled as
computed wherever it is shown: the k/n of a setup (its published % of the 50 tries) and its Wilson range,
and S and M of a run whose S the spec does not publish (the xArm6 and WidowX references).

The text of section 8 is parsed sentence by sentence; a sentence that is not there, or says something of
another shape, is a one-line error naming the file, never a page without it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from env.arms import ARMS
from env.setups import GROUPS, SCORED_IDS, difficulty_of, group_of
from eval.request import MODEL_CONFIGS
from eval.site.spec import SPEC_FILE, Spec, SpecError, read_spec, tables

RANGE = r"\d+\.\d \[\d+\.\d, \d+\.\d\]"  # "96.5 [94.0, 98.5]"
COMPUTED = "computed"  # the label every number computed from published ones carries on the page


@dataclass
class Entry:
    """One published run: a model on an arm, with the spec's numbers as printed."""
    label: str  # as the spec names it: "scripted", "octo-small-1.5", "scripted on xArm6"
    model: str  # this project's model name (eval.request.MODEL_CONFIGS)
    arm: str  # env.arms name
    track: str
    S: str | None = None
    S_note: str | None = None
    setups: dict[str, str] = field(default_factory=dict)  # setup id -> "%"
    groups: dict[str, str] = field(default_factory=dict)  # group -> "rate [lo, hi]"
    difficulty: dict[str, str] = field(default_factory=dict)
    recovery: str | None = None  # "k/n"
    recovery_ci: str | None = None  # "rate [lo, hi]" (Wilson)
    drops: str | None = None
    completion_s: str | None = None
    ms_per_query: str | None = None
    full_board: dict[str, dict[str, str]] = field(default_factory=dict)  # id -> {kn, blocks, wilson}
    status: str | None = None  # models listed without results: the published page's status

    @property
    def key(self) -> str:
        return self.label


@dataclass
class Published:
    path: Path
    heading: str
    text: str  # section 8 with its whitespace runs made single spaces: what "verbatim" is checked against
    split: str
    machine: str
    arm: str
    tries_per_setup: int
    entries: list[Entry]
    arm_groups: dict[str, dict[str, str]]  # arm -> group -> "rate [lo, hi]" (the three-arm table)
    arm_labels: dict[str, str]  # arm -> the spec's name of it ("xArm6 + Robotiq")
    tasklist: dict[str, str]  # version, sha256_prefix, note
    physics_note: str

    def entry(self, model: str, arm: str = "panda") -> Entry | None:
        for e in self.entries:
            if e.model == model and e.arm == arm and not e.status:
                return e
        return None

    @property
    def source(self) -> str:
        return f"{_display_path(self.path)} section 8"


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(SPEC_FILE.parents[1]))
    except ValueError:
        return str(path)


def _norm(text: str) -> str:
    return " ".join(text.split())


def _model_of(label: str, path: Path) -> str:
    """This project's model of a published name: the name itself or its released version ("octo-small-1.5")."""
    for name in MODEL_CONFIGS:
        if label == name or label.startswith(name + "-"):
            return name
    raise SpecError(f"{path}: section 8 names a model {label!r} that eval.request does not know")


def _arm_of(label: str, path: Path) -> str:
    """The arm a published name means: the one whose name's first word is in it ("xArm6 + Robotiq")."""
    flat = re.sub(r"[^a-z0-9]", "", label.lower())
    found = [a for a in ARMS if a.split("_")[0] in flat]
    if len(found) != 1:
        raise SpecError(f"{path}: section 8 names an arm {label!r} that is not one of {', '.join(ARMS)}")
    return found[0]


def _need(m, path: Path, what: str):
    if not m:
        raise SpecError(f"{path}: section 8 does not say {what} in the form the page quotes; "
                        f"fix the spec's sentence or eval/site/published.py")
    return m


def read_published(spec: Spec | str | Path = SPEC_FILE) -> Published:
    """The published numbers of the spec's section 8, as printed."""
    spec = spec if isinstance(spec, Spec) else read_spec(spec)
    path = spec.path
    sec = spec.section("8")
    raw, t = sec.body, _norm(sec.body)
    head = _need(re.fullmatch(r"Published reference results \(([^,]+), ([^,]+), ([^)]+)\)", sec.title), path,
                 "its heading 'Published reference results (split, machine, arm)'")
    split, machine, arm_label = (x.strip() for x in head.groups())
    split = split.replace(" split", "")
    default_arm = _arm_of(arm_label, path)
    entries: dict[str, Entry] = {}

    def entry(label: str, arm: str | None = None) -> Entry:
        if label not in entries:
            model = _model_of(label.split(" on ")[0], path)
            arm = arm or (_arm_of(label.split(" on ")[1], path) if " on " in label else default_arm)
            entries[label] = Entry(label, model, arm, MODEL_CONFIGS[model].track)
        return entries[label]

    # S
    m = _need(re.search(r"Score S, % \[95% range\]: (.*?)\. Per setup", t), path, "'Score S, % [95% range]: ...'")
    for item in m.group(1).split("; "):
        mi = _need(re.fullmatch(rf"(.+?) ({RANGE}|\d+\.\d)(?: \(([^)]*)\))?", item), path, f"S as {item!r}")
        for label in mi.group(1).split(" and "):
            e = entry(label)
            e.S, e.S_note = mi.group(2), mi.group(3)

    # per setup, %
    m = _need(re.search(r"Per setup success, % \((\d+) tries each\), order A01\.\.G02:", t), path,
              "'Per setup success, % (N tries each), order A01..G02:'")
    n_tries = int(m.group(1))
    bullets = re.findall(r"^- ([^:\n]+): (.*(?:\n  .*)*)", raw[raw.index("Per setup success"):], re.M)
    sizes = [sum(1 for g in group_of().values() if g == grp) for grp in GROUPS]
    for label, values in bullets:
        parts = [p.strip() for p in _norm(values).split("|")]
        if len(parts) != len(GROUPS):
            raise SpecError(f"{path}: section 8, {label}: {len(parts)} groups of setups, expected {len(GROUPS)}")
        pcts: list[str] = []
        for p, size in zip(parts, sizes):
            vals = [p.split()[1]] * size if p.startswith("all ") else p.split()
            if len(vals) != size or not all(v.isdigit() for v in vals):
                raise SpecError(f"{path}: section 8, {label}: {p!r} is not {size} percentages")
            pcts += vals
        entry(label).setups = dict(zip(SCORED_IDS, pcts))

    # the two tables: by task group per model, and the scripted reference by group on three arms
    tabs = tables(raw)
    by_model = _need([x for x in tabs if x[0][0] == "group" and "scripted" in x[0]], path, "the group table")[0]
    for j, label in enumerate(by_model[0][1:], start=1):
        entry(label).groups = _group_column(by_model, j, path)
    by_arm = _need([x for x in tabs if x[0][0] == "group" and "scripted" not in x[0]], path,
                   "the three-arm table")[0]
    arm_groups, arm_labels = {}, {}
    for j, label in enumerate(by_arm[0][1:], start=1):
        a = _arm_of(label, path)
        arm_groups[a], arm_labels[a] = _group_column(by_arm, j, path), label
        scripted = next((e for e in entries.values() if e.model == "scripted" and e.arm == a), None)
        if scripted is not None and not scripted.groups:
            scripted.groups = arm_groups[a]

    # by difficulty
    m = _need(re.search(r"By difficulty \([^)]*\): (.*?)\. ", t), path, "'By difficulty (...): ...'")
    for item in m.group(1).split("; "):
        both = re.fullmatch(rf"both (\S+) models ({RANGE}) at every level", item)
        if both:
            for e in entries.values():
                if e.label.startswith(both.group(1)):
                    e.difficulty = {d: both.group(2) for d in ("easy", "medium", "hard")}
            continue
        mi = _need(re.fullmatch(rf"(\S+) easy ({RANGE}), medium ({RANGE}), hard ({RANGE})", item), path,
                   f"difficulty as {item!r}")
        entry(mi.group(1)).difficulty = dict(zip(("easy", "medium", "hard"), mi.groups()[1:]))

    # secondary metrics
    sec_re = r"recovery (\d+/\d+)(?: \(({RANGE})\))?, (\d+) drops, ([\d.]+) s, ([\d.]+) ms/query".replace(
        "{RANGE}", RANGE)
    m = _need(re.search(r"Secondary on the other arms: (.*?)\. Recovery ranges", t), path,
              "'Secondary on the other arms: ...'")
    for item in m.group(1).split("; "):
        mi = _need(re.fullmatch(r"(.+?) " + sec_re, item), path, f"secondary as {item!r}")
        a = _arm_of(mi.group(1), path)
        e = next((x for x in entries.values() if x.model == "scripted" and x.arm == a), None) or entry(
            f"scripted on {mi.group(1)}", a)
        e.recovery, e.recovery_ci, e.drops, e.completion_s, e.ms_per_query = mi.groups()[1:]
    m = _need(re.search(r"Secondary: (.*?) on the Orin, recovery (\d+/\d+) each", t), path,
              "'Secondary: ... on the Orin, recovery k/n each'")
    items = m.group(1).split("; ")
    for item in items[:-1]:
        mi = _need(re.fullmatch(r"(\S+) " + sec_re, item), path, f"secondary as {item!r}")
        e = entry(mi.group(1))
        e.recovery, _, e.drops, e.completion_s, e.ms_per_query = mi.groups()[1:]
    for label, ms in re.findall(r"(\S+) ([\d.]+) ms/query", items[-1]):
        e = entry(label)
        e.ms_per_query, e.recovery = ms, m.group(2)
    m = _need(re.search(r"Recovery ranges are Wilson: (.*?)\. Full-board", t), path, "'Recovery ranges are Wilson'")
    for label, ci in re.findall(rf"(\S+) ({RANGE})", m.group(1)):
        for e in entries.values():
            if e.arm == default_arm and (e.label == label or e.label.startswith(label + "-")) and e.recovery:
                e.recovery_ci = ci

    # full board
    m = _need(re.search(r"Full board, (\S+) (\S+): (.*?)\. ", t), path, "'Full board, model arm: ...'")
    fb = entry(m.group(1), _arm_of(m.group(2), path))
    for sid, kn, blocks in re.findall(r"(FB\d\d) (\d+/\d+) \(([\d.]+)", m.group(3)):
        fb.full_board[sid] = {"kn": kn, "blocks": blocks}
    m = _need(re.search(r"Full-board Wilson ranges: (.*?)\. ", t), path, "'Full-board Wilson ranges: ...'")
    for sid, rng in re.findall(r"(FB\d\d) (\d+\.\d-\d+\.\d)", m.group(1)):
        fb.full_board.setdefault(sid, {})["wilson"] = rng

    # the task list, and the models listed without results
    m = _need(re.search(r"The published task list (v[\d.]+) has sha256 prefix ([0-9a-f]+) \(([^)]*)\)", t), path,
              "'The published task list vX has sha256 prefix ...'")
    tasklist = {"version": m.group(1), "sha256_prefix": m.group(2), "note": m.group(3)}
    m = _need(re.search(r"The published page lists (.*?) as frozen-track models without results", t), path,
              "'The published page lists ... as frozen-track models without results'")
    for label, detail, status in re.findall(r"(\S+)(?: \(([^)\"]*)\))? \(\"([^\"]+)\"\)", m.group(1)):
        e = Entry(label + (f" ({detail})" if detail else ""), label, default_arm, "frozen", status=status)
        entries[e.label] = e
    m = _need(re.search(r"(Physics differs slightly between machines .*?)$", t), path, "'Physics differs ...'")
    return Published(path=path, heading=sec.title, text=t, split=split, machine=machine, arm=default_arm,
                     tries_per_setup=n_tries, entries=list(entries.values()), arm_groups=arm_groups,
                     arm_labels=arm_labels, tasklist=tasklist, physics_note=m.group(1))


def orin_ms_per_query(spec: Spec | str | Path = SPEC_FILE) -> dict[str, float]:
    """Label -> ms per query of every published run that gives one (section 8: measured on the Orin)."""
    return {e.label: float(e.ms_per_query) for e in read_published(spec).entries if e.ms_per_query}


def _group_column(tab: list[list[str]], j: int, path: Path) -> dict[str, str]:
    rows = {r[0]: r[j] for r in tab[1:]}
    if list(rows) != list(GROUPS) or not all(re.fullmatch(RANGE, v) for v in rows.values()):
        raise SpecError(f"{path}: section 8's table column {tab[0][j]!r} is not the 7 groups' 'rate [lo, hi]'")
    return rows


# --------------------------------------------------------------------------
# Computed from published numbers (labelled "computed" on the page)
# --------------------------------------------------------------------------
def setup_counts(pub: Published, e: Entry) -> dict[str, tuple[int, int]]:
    """Each setup's (k, n): its published % of the published tries per setup."""
    out = {}
    for sid, pct in e.setups.items():
        k = int(pct) * pub.tries_per_setup / 100
        if k != int(k):
            raise SpecError(f"{pub.path}: section 8, {e.label} {sid}: {pct}% of {pub.tries_per_setup} tries is not "
                            f"a whole number of tries")
        out[sid] = (int(k), pub.tries_per_setup)
    return out


def computed_scores(pub: Published, e: Entry) -> dict[str, float | None]:
    """S and M from the published per-setup numbers, with the benchmark's own formulas (eval.stats.score);
    points only: a range drawn here would not be the published one."""
    from eval.stats import score

    if not e.setups:
        return {"S": None, "M": None}
    outcomes = {sid: [True] * k + [False] * (n - k) for sid, (k, n) in setup_counts(pub, e).items()}
    sc = score(outcomes, group_of(), difficulty_of(), n_boot=1, seed=0)
    return {"S": sc.S, "M": sc.M}


__all__ = ["Entry", "Published", "read_published", "setup_counts", "computed_scores", "COMPUTED", "RANGE"]
