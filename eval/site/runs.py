"""Run folders for the results page: loading, the leaderboard's ranking rules and sections.

A run folder is what ``eval.run`` / ``eval.orin`` write: ``summary.json`` (one model, built by
:func:`eval.report.summary.build_summary`), with ``run.json`` and ``tries.jsonl`` beside it where they
exist.  The page reads every number of a run from its ``summary.json`` (so the page and the run's own
report agree), and reads ``tries.jsonl`` only for what a summary does not hold: the per-query latencies
of the CDF and the paired differences (:func:`eval.report.summary.paired_summary`).

Ranking rules (docs/BENCHMARK.md section 4, the published page): only frozen-track runs with real
weights, complete (every scored setup has its planned tries) on the test split with the Panda are ranked;
the leaderboard shows beside them the reference, adapted and sanity runs made with the track's own model
(Panda, test split, every setup). Every other run has its own section, labelled for what it is: a variant
(weights other than the model's committed ones: not the track's recipe), another arm (the scripted
reference as a check of the task list, spec section 7), a dev-split example, an incomplete run, a
random-weights run ("latency only" wherever it appears), a full-board run.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from env.setups import DIFFICULTIES, GROUPS, SCORED_IDS
from eval.report.ranking import (DEFAULT_ARM, LATENCY_ONLY, SCORE_SPLIT, default_weights_sha256,  # noqa: F401
                                 is_random_weights, run_status, tries_per_setup)
from eval.report.summary import ReportError, load_tries, summary_problem
from eval.run_folder import run_json_problem

# the page's sections of runs, in the page's order, with their headings
SECTIONS = {
    "ranked": "Ranked: frozen track (released models, real weights, complete test-split runs)",
    "comparison": "Not ranked, shown for comparison: reference, adapted and sanity tracks",
    "variant": "Variants: other weights than the model's own (not the track's recipe)",
    "other_arm": "Other arms: the scripted reference as a check of the task list (spec section 7)",
    "incomplete": "Incomplete runs",
    "latency_replay": "Latency replayed (--replay-latency): what a device's delay does to success, not results",
    "example": "Examples on other splits (latency and the device report, not results)",
    "latency_only": "Random weights or tries cut short by --max-steps (latency only, success meaningless)",
    "full_board": "Full-board task only",
}
SECTION_SHORT = {"ranked": "ranked", "comparison": "leaderboard, not ranked", "variant": "variant",
                 "other_arm": "other arm", "incomplete": "incomplete", "latency_replay": "latency replayed", "example": "example",
                 "latency_only": "latency only", "full_board": "full board"}


class SiteError(ValueError):
    """Bad input to the results page (message is one line naming the folder or file)."""


@dataclass
class Run:
    """One run folder: its summary, run.json, per-query latencies and (lazily) its records."""
    folder: Path
    summary: dict
    run_json: dict | None
    tries_path: Path | None
    latencies: list[float] = field(default_factory=list)
    rid: str = ""
    label: str = ""
    status: dict = field(default_factory=dict)
    _records: list[dict] | None = None

    @property
    def model(self) -> str:
        return str(self.summary.get("model"))

    @property
    def scored(self) -> bool:
        """Has tries on the 30 scored setups (a full-board-only run has none)."""
        return bool(self.summary.get("n_tries"))

    def records(self) -> list[dict]:
        if self._records is None:
            self._records = _load_records(self.tries_path) if self.tries_path else []
        return self._records


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------
def _read_json(path: Path) -> Any:
    # what to do about a damaged file: a summary is written again from its tries, a run.json restored or set aside
    fix = (f"rebuild it with python -m eval.report --tries {path.parent / 'tries.jsonl'} --out {path.parent}"
           if path.name == "summary.json" else "restore it, or move it away to show the run without its settings")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise SiteError(f"{path}: cannot read ({e.strerror or e})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise SiteError(f"{path}: not JSON ({' '.join(str(e).split())}): {fix}") from None


def _load_records(path: Path) -> list[dict]:
    try:
        return load_tries(path)
    except ReportError as e:
        raise SiteError(" ".join(str(e).split())) from None


def _run_kind(summary: Any) -> str:
    """'run', 'comparison' (eval.report over several models) or 'other' (not a benchmark summary)."""
    if isinstance(summary, dict) and isinstance(summary.get("models"), dict):
        return "comparison"
    if isinstance(summary, dict) and isinstance(summary.get("setups"), dict) and "S" in summary:
        return "run"
    return "other"


def load_run(folder: str | Path) -> Run:
    """One run folder; a :class:`SiteError` naming the folder or file when it is not one."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SiteError(f"{folder}: no such folder")
    sp = folder / "summary.json"
    if not sp.is_file():
        raise SiteError(f"{folder}: no summary.json (not a run folder: eval.run and eval.orin write one)")
    summary = _read_json(sp)
    kind = _run_kind(summary)
    if kind == "comparison":
        raise SiteError(f"{sp}: a comparison of several models (eval.report with several --tries), not one "
                        f"run; pass the runs' own folders")
    if kind != "run":
        raise SiteError(f"{sp}: not a benchmark run's summary (no S and setups)")
    missing = [k for k in ("model", "n_tries", "complete", "S_ci", "groups", "difficulty", "secondary",
                           "full_board") if k not in summary]
    if missing:
        raise SiteError(f"{sp}: lacks {', '.join(missing)} (written by an older release? rebuild it with "
                        f"python -m eval.report --tries {folder / 'tries.jsonl'} --out {folder})")
    problem = summary_problem(summary)
    if problem is not None:  # every number of the page comes from here: none may be of another type
        raise SiteError(f"{sp}: {problem} (a damaged summary): rebuild it with python -m eval.report --tries "
                        f"{folder / 'tries.jsonl'} --out {folder}")
    rj = folder / "run.json"
    run_json = _read_json(rj) if rj.is_file() else None
    problem = None if run_json is None else run_json_problem(run_json)
    if problem is not None:
        raise SiteError(f"{rj}: {problem} (a damaged run.json): restore it, or move it away to show the run "
                        f"without its settings")
    tp = folder / "tries.jsonl"
    run = Run(folder=folder, summary=summary, run_json=run_json, tries_path=tp if tp.is_file() else None)
    if run.tries_path:
        run.latencies = sorted(float(v) for r in run.records() if r.get("setup") in SCORED_IDS
                               and isinstance(r.get("infer_ms"), list) for v in r["infer_ms"])
    return run


def find_runs(root: str | Path) -> tuple[list[Path], list[str]]:
    """Run folders at or below ``root`` (sorted), and why other folders with a summary.json were left out."""
    root = Path(root)
    found, skipped = [], []
    for sp in sorted(root.rglob("summary.json")):
        # a damaged summary.json is an error, not a run quietly missing from the page
        kind = _run_kind(_read_json(sp))
        if kind == "run":
            found.append(sp.parent)
        else:
            why = {"comparison": "a comparison of several runs", "other": "not a benchmark run (no S and setups)"}[kind]
            skipped.append(f"{sp.parent}: {why}")
    return found, skipped


def load_runs(dirs: Sequence[str | Path]) -> tuple[list[Run], list[str]]:
    """Every run of ``dirs``: a run folder itself, or a folder holding run folders below it."""
    runs: list[Run] = []
    notes: list[str] = []
    seen: set[Path] = set()
    for d in dirs:
        d = Path(d)
        if d.is_dir() and not (d / "summary.json").exists():
            found, skipped = find_runs(d)
            if not found:
                raise SiteError(f"{d}: no summary.json in it or below it (not a run folder)")
            notes += skipped
            folders = found
        else:
            folders = [d]
        for f in folders:
            key = f.resolve()
            if key in seen:
                continue
            seen.add(key)
            runs.append(load_run(f))
    if not runs:
        raise SiteError("no run folders given")
    _name_runs(runs)
    defaults: dict[str, str | None] = {}
    for r in runs:
        if r.model not in defaults:
            defaults[r.model] = default_weights_sha256(r.model)
        r.status = run_status(r.summary, r.run_json, defaults[r.model])
    board = leaderboard(runs)  # every section of the page lists the runs in the leaderboard's order
    return [r for sec in board.values() for _, r in sec], notes


def _name_runs(runs: list[Run]) -> None:
    paths = [r.folder.resolve() for r in runs]
    common = Path(*paths[0].parts[:min(len(p.parts) for p in paths)]) if paths else Path()
    for p in paths[1:]:
        while common not in (p, *p.parents):
            common = common.parent
    for i, (r, p) in enumerate(zip(runs, paths)):
        r.rid = f"r{i}"
        rel = p.relative_to(common) if p != common else Path(p.name)
        r.label = str(rel)


# --------------------------------------------------------------------------
# Sections (the ranking rules: eval.report.ranking)
# --------------------------------------------------------------------------
def leaderboard(runs: Sequence[Run]) -> dict[str, list[tuple[int | None, Run]]]:
    """Runs by leaderboard section, best S first; ranked runs get competition ranks (equal S, equal rank)."""
    def key(r: Run):
        s = r.summary.get("S")
        return (s is None, -(s or 0.0), r.label)

    out: dict[str, list[tuple[int | None, Run]]] = {s: [] for s in SECTIONS}
    for r in sorted(runs, key=key):
        out[r.status["section"]].append((None, r))
    ranked = out["ranked"]
    for i, (_, r) in enumerate(ranked):
        prev = ranked[i - 1] if i else None
        rank = prev[0] if prev and prev[1].summary.get("S") == r.summary.get("S") else i + 1
        ranked[i] = (rank, r)
    return out


def package_version(run: Run, name: str) -> str | None:
    """A package's version as the run's run.json recorded it (eval.run writes the environment since v2)."""
    env = (run.run_json or {}).get("environment")
    pk = env.get("packages") if isinstance(env, Mapping) else None
    v = pk.get(name) if isinstance(pk, Mapping) else None
    return str(v) if v else None


# --------------------------------------------------------------------------
# Helpers for the page
# --------------------------------------------------------------------------
def device_name(summary: Mapping) -> str:
    """The machine that ran the policy, in a few words (eval.orin's device, else the records' machine)."""
    dev = summary.get("device")
    if isinstance(dev, Mapping) and dev.get("name"):
        return str(dev["name"])
    m = summary.get("machine")
    if isinstance(m, Mapping):
        cpu = m.get("device") or m.get("gpu") or m.get("cpu")
        cores = m.get("cores")
        if cpu:
            return f"{cpu}" + (f", {cores} cores" if cores else "")
    if isinstance(m, list):
        return "several machines"
    return str(m) if m else "machine not recorded"


def quantile_points(values: Sequence[float], n: int = 120) -> list[tuple[float, float]]:
    """(value, cumulative fraction) points of a sorted sample's empirical CDF, at most ~n of them."""
    if not values:
        return []
    m = len(values)
    idx = sorted({min(m - 1, int(round(i * (m - 1) / (n - 1)))) for i in range(n)} if m > n else set(range(m)))
    return [(float(values[i]), (i + 1) / m) for i in idx]


def command_line(run: Run) -> str:
    """The command that makes this run folder, rebuilt from run.json and the summary (runs do not record
    their argv)."""
    s, rj = run.summary, run.run_json or {}
    orin = "device" in s or "telemetry" in s
    parts = ["python", "-m", "eval.orin" if orin else "eval.run", "--model", str(rj.get("model") or s.get("model"))]
    arm = rj.get("arm") or s.get("arm")
    if arm and arm != "panda":
        parts += ["--arm", str(arm)]
    parts += ["--split", str(rj.get("split") or s.get("split"))]
    ran = [sid for sid, e in (s.get("setups") or {}).items() if e.get("n")]
    fb = list((s.get("full_board") or {}).keys())
    if len(ran) == len(SCORED_IDS) and not fb:
        sel = "all"
    elif not ran and fb and len(fb) == 3:
        sel = "FB"
    else:
        sel = ",".join(ran + fb)
    n = max([e.get("n") or 0 for e in (s.get("setups") or {}).values()] +
            [e.get("n") or 0 for e in (s.get("full_board") or {}).values()] + [0])
    parts += ["--setups", sel, "--tries", str(n)]
    from eval.request import secret_options

    opts = rj.get("options") or {}
    for k, v in sorted(opts.items()) if isinstance(opts, Mapping) else ():
        if k in secret_options():  # an older run.json may hold a token: the page never shows one
            parts += ["--" + k.replace("_", "-"), "TOKEN"]
            continue
        flag = "--" + str(k).replace("_", "-")
        if v is True:
            parts.append(flag)
        elif v not in (None, False):
            parts += [flag, str(v)]
    meta = s.get("run") if isinstance(s.get("run"), Mapping) else {}
    if meta.get("workers") and int(meta["workers"]) > 1:
        parts += ["--workers", str(meta["workers"])]
    if meta.get("num_envs") and int(meta["num_envs"]) > 1:
        parts += ["--num-envs", str(meta["num_envs"])]
    elif s.get("batch") and s["batch"].get("num_envs"):
        parts += ["--num-envs", str(max(s["batch"]["num_envs"]))]
    if meta.get("executor") and meta["executor"] != "local":
        parts += ["--executor", str(meta["executor"])]
    parts += ["--out", str(run.folder)]
    return " ".join(parts)


__all__ = ["Run", "SiteError", "LATENCY_ONLY", "SECTIONS", "SECTION_SHORT", "DEFAULT_ARM", "SCORE_SPLIT",
           "load_run", "load_runs", "find_runs", "run_status", "leaderboard", "is_random_weights", "tries_per_setup",
           "default_weights_sha256", "package_version", "device_name", "quantile_points", "command_line", "GROUPS",
           "DIFFICULTIES"]
