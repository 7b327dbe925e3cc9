"""The locked task list: for every split, setup and try, the seed and the resolved start.

Spec section 3: every model gets the same tries in the same starting states, and
the task list's sha256 identifies the benchmark (reports print the test sha256).

Files (``env/tasklists/<version>/``):

* ``<split>.jsonl``: one entry per line, in ``SETUPS`` order then try order::

      {"seed":...,"setup":"A01","start":{...},"try":0}

  serialised with ``json.dumps(entry, sort_keys=True, separators=(",", ":"))``
  (floats as Python's repr), ``\\n`` after every line, UTF-8. ``start`` is
  ``StartState.to_dict()`` and is treated here as an opaque JSON object.
* ``LOCK.json``: ``{"version", "splits": {split: {"sha256", "tries", "per_setup"}}}``.
  :func:`load` refuses a file whose sha256 is not the one in the lock.

Command line::

    python -m env.tasklist generate [--split S|all]   # write files and LOCK.json
    python -m env.tasklist show --split S             # counts and the sha256 line
    python -m env.tasklist verify [--split S|all]     # re-derive and compare bytes (float rounding alone is reported, not failed)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Iterable, Mapping

import numpy as np

from env.setups import FULL_BOARD_IDS, SETUPS, get_setup
from env.starts import SPLITS, StartState, derive_seed, sample_start

VERSION = "v1"
# tries per setup, for every setup in SETUPS (30 scored + the full-board ones)
TRIES_PER_SETUP: Mapping[str, int] = MappingProxyType({"train": 100, "dev": 20, "test": 50, "confirm": 50})
TASKLIST_ROOT = Path(__file__).resolve().parent / "tasklists"
LOCK_NAME = "LOCK.json"
_CMD = "python -m env.tasklist"

assert tuple(TRIES_PER_SETUP) == SPLITS, "TRIES_PER_SETUP must list every split of env.starts.SPLITS"


class TaskListError(Exception):
    """Base class of task-list errors; the message is one line."""


class UnknownSplitError(TaskListError, ValueError):
    pass


class TaskListMissingError(TaskListError, FileNotFoundError):
    pass


class TaskListHashError(TaskListError):
    """The file's bytes are not the ones LOCK.json names."""


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise UnknownSplitError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    return split


def version_dir(version: str = VERSION, root: str | os.PathLike | None = None) -> Path:
    """Folder of one task-list version; ``root`` defaults to ``env/tasklists``."""
    return Path(root if root is not None else TASKLIST_ROOT) / version


def split_path(split: str, version: str = VERSION, root: str | os.PathLike | None = None) -> Path:
    return version_dir(version, root) / f"{check_split(split)}.jsonl"


def lock_path(version: str = VERSION, root: str | os.PathLike | None = None) -> Path:
    return version_dir(version, root) / LOCK_NAME


# ---------------------------------------------------------------- derive and serialise


def build(split: str, *, progress: bool = False) -> list[dict]:
    """Entries of ``split`` for the current version, derived from the seeds."""
    n = TRIES_PER_SETUP[check_split(split)]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n * len(SETUPS), desc=split, unit="try", file=sys.stderr, delay=2.0, leave=False)
    entries = []
    for setup_id in SETUPS:
        setup = get_setup(setup_id)
        for i in range(n):
            seed = derive_seed(split, setup_id, i)
            start = sample_start(setup, np.random.default_rng(seed)).to_dict()
            entries.append({"setup": setup_id, "try": i, "seed": seed, "start": start})
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    return entries


def entry_line(entry: dict) -> str:
    """The canonical line of one entry (no trailing newline)."""
    # allow_nan=False: NaN/inf are not JSON and never belong in a start
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), allow_nan=False)


def serialise(entries: Iterable[dict]) -> bytes:
    return "".join(entry_line(e) + "\n" for e in entries).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _lock_record(data: bytes, n_entries: int, per_setup: int) -> dict:
    return {"sha256": sha256_hex(data), "tries": n_entries, "per_setup": per_setup}


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _lock_bytes(lock: dict) -> bytes:
    return (json.dumps(lock, indent=2, sort_keys=True) + "\n").encode("utf-8")


def read_lock(version: str = VERSION, root: str | os.PathLike | None = None) -> dict:
    path = lock_path(version, root)
    if not path.is_file():
        raise TaskListMissingError(
            f"{path}: task-list lock not found; generate it with `{_CMD} generate --split all`"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def generate(splits: Iterable[str] = SPLITS, root: str | os.PathLike | None = None,
             *, progress: bool = False) -> dict[str, dict]:
    """Write ``<split>.jsonl`` for ``splits`` and update LOCK.json (other splits kept).

    Returns ``{split: {"sha256", "tries", "per_setup", "previous_sha256"}}``
    (``previous_sha256`` is None when the split was not locked before).
    """
    splits = [check_split(s) for s in splits]
    try:
        lock = read_lock(VERSION, root)
    except TaskListMissingError:
        lock = {"version": VERSION, "splits": {}}
    lock["version"] = VERSION
    old = dict(lock.get("splits", {}))
    result = {}
    for split in splits:
        entries = build(split, progress=progress)
        data = serialise(entries)
        _write_atomic(split_path(split, VERSION, root), data)
        rec = _lock_record(data, len(entries), TRIES_PER_SETUP[split])
        old_sha = old.get(split, {}).get("sha256")
        lock.setdefault("splits", {})[split] = rec
        result[split] = dict(rec, previous_sha256=old_sha)
    lock["splits"] = {s: lock["splits"][s] for s in SPLITS if s in lock["splits"]}
    _write_atomic(lock_path(VERSION, root), _lock_bytes(lock))
    return result


# ---------------------------------------------------------------- load


@dataclass(frozen=True)
class TaskList:
    """One split of a locked task list; ``entries`` are the parsed JSON lines."""

    version: str
    split: str
    sha256: str
    entries: tuple[dict, ...]
    _index: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_index", {(e["setup"], e["try"]): e for e in self.entries})

    def __hash__(self):
        return hash((self.version, self.split, self.sha256))

    def __len__(self) -> int:
        return len(self.entries)

    def entry(self, setup_id: str, try_index: int) -> dict:
        try:
            return self._index[(setup_id, try_index)]
        except KeyError:
            n = self.tries(setup_id)
            raise KeyError(
                f"no try {try_index} of setup {setup_id!r} in task list {self.version}/{self.split} "
                f"({n} tries for this setup)"
            ) from None

    def seed(self, setup_id: str, try_index: int) -> int:
        return self.entry(setup_id, try_index)["seed"]

    def start(self, setup_id: str, try_index: int) -> StartState:
        return StartState.from_dict(self.entry(setup_id, try_index)["start"])

    def setup_ids(self) -> tuple[str, ...]:
        """Setups present, in file order."""
        return tuple(dict.fromkeys(e["setup"] for e in self.entries))

    def tries(self, setup_id: str) -> int:
        """Number of tries of ``setup_id`` in this split."""
        return sum(1 for e in self.entries if e["setup"] == setup_id)


def load(split: str, version: str = VERSION, root: str | os.PathLike | None = None) -> TaskList:
    """Read one split and check its sha256 against LOCK.json; refuses on mismatch."""
    path = split_path(split, version, root)
    if not path.is_file():
        raise TaskListMissingError(
            f"{path}: task list not found; generate it with `{_CMD} generate --split {split}`"
        )
    data = path.read_bytes()
    found = sha256_hex(data)
    lock = read_lock(version, root)
    rec = lock.get("splits", {}).get(split)
    if rec is None:
        raise TaskListHashError(
            f"{path}: split {split!r} is not in {lock_path(version, root)} (found sha256 {found}); "
            f"lock it with `{_CMD} generate --split {split}`"
        )
    if rec["sha256"] != found:
        raise TaskListHashError(
            f"{path}: sha256 mismatch: expected {rec['sha256']} (LOCK.json), found {found}; "
            f"check with `{_CMD} verify`, restore the file or regenerate with `{_CMD} generate --split {split}`"
        )
    entries = tuple(json.loads(line) for line in data.decode("utf-8").splitlines())
    return TaskList(version=version, split=split, sha256=found, entries=entries)


# ---------------------------------------------------------------- verify


def _first_difference(file_data: bytes, derived: bytes) -> str:
    a = file_data.decode("utf-8", errors="replace").splitlines()
    b = derived.decode("utf-8").splitlines()
    for k, (la, lb) in enumerate(zip(a, b)):
        if la != lb:
            try:
                e = json.loads(lb)
                where = f"setup {e['setup']} try {e['try']}"
            except (ValueError, KeyError, TypeError):  # pragma: no cover - derived lines are ours
                where = f"line {k + 1}"
            return f"first difference at {where} (line {k + 1})"
    if len(a) != len(b):
        return f"file has {len(a)} tries, derived {len(b)}"
    return "bytes differ (line endings or trailing data)"


ROUNDING_ULPS = 4  # a re-derived float this many units in the last place from the stored one is rounding


def _ulps(a: float, b: float) -> float:
    return abs(a - b) / max(math.ulp(a), math.ulp(b))


def _rounding_only(stored, derived, path: str = "") -> tuple[float, str] | None:
    """(largest ulp distance, its field) when two JSON values differ only in float rounding, else None."""
    if isinstance(stored, dict) and isinstance(derived, dict):
        if stored.keys() != derived.keys():
            return None
        parts = [_rounding_only(stored[k], derived[k], f"{path}.{k}" if path else k) for k in stored]
    elif isinstance(stored, list) and isinstance(derived, list):
        if len(stored) != len(derived):
            return None
        parts = [_rounding_only(a, b, f"{path}[{i}]") for i, (a, b) in enumerate(zip(stored, derived))]
    elif isinstance(stored, float) and isinstance(derived, float):
        u = _ulps(stored, derived)
        return (u, path) if u <= ROUNDING_ULPS else None
    else:
        return (0.0, path) if stored == derived and type(stored) is type(derived) else None
    if any(p is None for p in parts):
        return None
    return max(parts, default=(0.0, path), key=lambda p: p[0])


def _rounding_difference(file_data: bytes, derived: bytes) -> str | None:
    """One line when the file and the re-derivation differ only by float rounding (same tries, same
    structure, every float within ROUNDING_ULPS), else None."""
    a, b = file_data.decode("utf-8", errors="replace").splitlines(), derived.decode("utf-8").splitlines()
    if len(a) != len(b):
        return None
    worst, where, n = 0.0, "", 0
    for la, lb in zip(a, b):
        if la == lb:
            continue
        try:
            ea, eb = json.loads(la), json.loads(lb)
        except ValueError:
            return None
        r = _rounding_only(ea, eb)
        if r is None:
            return None
        n += 1
        if r[0] > worst or not where:
            worst, where = r[0], f"setup {eb['setup']} try {eb['try']} {r[1]}"
    return (f"re-derived on this machine, {n} tries differ from the stored starts only in float rounding "
            f"(at most {worst:.0f} ulp, at {where}); the stored starts are the contract")


def verify_split(split: str, root: str | os.PathLike | None = None, *,
                 progress: bool = False) -> tuple[bool, str]:
    """Re-derive ``split`` and compare with its file and the lock; (ok, one-line message)."""
    entries = build(split, progress=progress)
    derived = serialise(entries)
    want = _lock_record(derived, len(entries), TRIES_PER_SETUP[split])
    path = split_path(split, VERSION, root)
    if not path.is_file():
        return False, f"{split}: MISSING {path} (run `{_CMD} generate --split {split}`)"
    data = path.read_bytes()
    problems, note = [], ""
    if data != derived:
        rounding = _rounding_difference(data, derived)
        if rounding is None:
            problems.append(f"file differs from derived: {_first_difference(data, derived)}")
        else:
            note = f" ({rounding})"
    try:
        rec = read_lock(VERSION, root).get("splits", {}).get(split)
    except TaskListMissingError:
        rec = None
    if rec is None:
        problems.append("not in LOCK.json")
    else:
        if rec.get("sha256") != sha256_hex(data):
            problems.append(f"LOCK.json sha256 {rec.get('sha256')} != file sha256 {sha256_hex(data)}")
        for key in ("tries", "per_setup"):
            if rec.get(key) != want[key]:
                problems.append(f"LOCK.json {key} {rec.get(key)} != {want[key]}")
    if problems:
        return False, f"{split}: DIFFERS: " + "; ".join(problems)
    return True, f"{split}: OK {want['tries']} tries, sha256 {sha256_hex(data)}{note}"


def verify(splits: Iterable[str] = SPLITS, root: str | os.PathLike | None = None,
           *, progress: bool = False) -> list[tuple[str, bool, str]]:
    return [(s, *verify_split(check_split(s), root, progress=progress)) for s in splits]


# ---------------------------------------------------------------- command line


def summary_lines(tl: TaskList, path: Path | None = None) -> list[str]:
    """Lines of ``show``: tries per setup group, scored and full-board counts, total, sha256."""
    per_setup = Counter(e["setup"] for e in tl.entries)
    fb = set(FULL_BOARD_IDS)
    groups: dict[str, Counter] = {}
    for sid, n in per_setup.items():
        group = SETUPS[sid].group if sid in SETUPS else "(unknown setup)"
        groups.setdefault(group, Counter())[sid] = n
    lines = [f"task list {tl.version}, split {tl.split}" + (f": {path}" if path else "")]
    width = max(len(g) for g in groups) if groups else 0
    for group, counts in groups.items():
        ids = list(counts)
        span = ids[0] if len(ids) == 1 else f"{ids[0]}..{ids[-1]}"
        lines.append(f"  {group:<{width}}  {span:<10} {len(ids):>2} setups {sum(counts.values()):>7,} tries")
    scored = {s: n for s, n in per_setup.items() if s not in fb}
    full = {s: n for s, n in per_setup.items() if s in fb}
    lines.append(f"scored: {sum(scored.values()):,} tries ({len(scored)} setups)")
    lines.append(f"full board: {sum(full.values()):,} tries ({len(full)} setups)")
    lines.append(f"total: {len(tl.entries):,} tries")
    lines.append(f"sha256: {tl.sha256}")
    return lines


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=f"{_CMD}", description="Generate, show and verify the locked task list "
                f"(version {VERSION}; tries per setup: "
                + ", ".join(f"{s} {n}" for s, n in TRIES_PER_SETUP.items()) + ").")
    sub = p.add_subparsers(dest="command", metavar="{generate,show,verify}", parser_class=_Parser)
    g = sub.add_parser("generate", help="write <split>.jsonl and LOCK.json")
    g.add_argument("--split", default="all", help=f"one of: {', '.join(SPLITS)}, all (default all)")
    s = sub.add_parser("show", help="tries per setup group, totals and the sha256 line")
    s.add_argument("--split", required=True, help=f"one of: {', '.join(SPLITS)}")
    v = sub.add_parser("verify", help="re-derive the splits and compare with the files and the lock")
    v.add_argument("--split", default="all", help=f"one of: {', '.join(SPLITS)}, all (default all)")
    for sp in (g, s, v):
        sp.add_argument("--root", default=None, help=f"task-list root folder (default {TASKLIST_ROOT})")
    return p


def _splits_arg(value: str, allow_all: bool = True) -> list[str]:
    if allow_all and value == "all":
        return list(SPLITS)
    if value not in SPLITS:
        valid = ", ".join(SPLITS) + (", all" if allow_all else "")
        raise UnknownSplitError(f"unknown split {value!r}; valid: {valid}")
    return [value]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        splits = _splits_arg(args.split, allow_all=args.command != "show")
    except UnknownSplitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        if args.command == "generate":
            for split, rec in generate(splits, args.root, progress=True).items():
                prev = rec["previous_sha256"]
                state = "new" if prev is None else "unchanged" if prev == rec["sha256"] else f"CHANGED from {prev}"
                print(f"{split}: {rec['tries']:,} tries ({rec['per_setup']} per setup), "
                      f"sha256 {rec['sha256']} ({state})")
            print(f"wrote {version_dir(VERSION, args.root)}")
            return 0
        if args.command == "show":
            tl = load(splits[0], VERSION, args.root)
            print("\n".join(summary_lines(tl, split_path(splits[0], VERSION, args.root))))
            return 0
        ok = True
        for split, good, msg in verify(splits, args.root, progress=True):
            print(msg)
            ok &= good
        return 0 if ok else 1
    except TaskListError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
