"""The ranking rules (docs/BENCHMARK.md section 4, the published page), in one place: which runs are ranked,
and for every other run the section it belongs to and why. The results page (:mod:`eval.site`) sorts its
sections by them; a run's REPORT.md says in one word whether it is ranked (:func:`ranked_text`).

Only frozen-track runs with real weights, complete (every scored setup has its planned tries) on the test split
with the Panda and the model's own weights are ranked; the reference, adapted and sanity runs made the same way
are shown beside them for comparison. Every other run is labelled for what it is: a variant (weights other than
the model's committed ones: not the track's recipe), another arm (the scripted reference as a check of the task
list, spec section 7), an example on another split, an incomplete run, a random-weights run or a smoke run whose
tries were cut short by --max-steps ("latency only" wherever they appear: success means nothing), a full-board run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

from env.setups import SCORED_IDS
from eval.records import max_steps_label

LATENCY_ONLY = "latency only: random weights, success meaningless"
DEFAULT_ARM = "panda"
SCORE_SPLIT = "test"


def is_random_weights(summary: Mapping, run_json: Mapping | None = None) -> bool:
    """A run of a model with seeded random weights (``--random-weights``): latency only, never ranked.
    Known from run.json's options or the records' note ("random weights: latency only, ...")."""
    opts = (run_json or {}).get("options") or {}
    if isinstance(opts, Mapping) and opts.get("random_weights"):
        return True
    note = summary.get("note")
    notes = note if isinstance(note, list) else [note]
    return any(isinstance(n, str) and "random weights" in n for n in notes)


def step_cap(summary: Mapping, run_json: Mapping | None = None) -> int | None:
    """A smoke run's cap on every try's control steps (``--max-steps``), from run.json's options or the records
    (summary.json's ``max_steps``); None: the tries ran the setups' own length."""
    opts = (run_json or {}).get("options") or {}
    for v in ((opts.get("max_steps") if isinstance(opts, Mapping) else None), summary.get("max_steps")):
        if isinstance(v, list):  # records that disagree: the smallest cap is what some tries ran under
            v = min((x for x in v if type(x) is int), default=None)
        if type(v) is int:
            return v
    return None


def tries_per_setup(summary: Mapping) -> tuple[int, int, int]:
    """(fewest tries of any scored setup, the most, setups with no tries)."""
    ns = [int((e or {}).get("n") or 0) for e in (summary.get("setups") or {}).values()]
    ns += [0] * (len(SCORED_IDS) - len(ns))
    return min(ns), max(ns), sum(1 for n in ns if n == 0)


def run_status(summary: Mapping, run_json: Mapping | None = None, default_weights: str | None = None) -> dict:
    """The page's verdict on one run: which section it belongs to and why.

    ``default_weights``: sha256 of the model's committed weights file (None: the model has none); a run
    with other weights is a variant. Returns {ranked, section (a key of :data:`SECTIONS`), incomplete (the
    "Incomplete: k of n tries per setup" text or None), latency_only, variant, track, text}.
    """
    track = summary.get("track")
    split = summary.get("split")
    arm = summary.get("arm") or DEFAULT_ARM
    random_w = is_random_weights(summary, run_json)
    k, n, empty = tries_per_setup(summary)
    planned = (summary.get("run") or {}).get("planned") if isinstance(summary.get("run"), Mapping) else None
    full_only = not summary.get("n_tries") and bool(summary.get("full_board"))
    incomplete = None
    if not full_only and (empty or k < n or summary.get("complete") is False):
        incomplete = f"Incomplete: {k} of {n} tries per setup"
        if empty:
            incomplete += f" ({empty} of {len(SCORED_IDS)} setups without tries)"
    elif not full_only and isinstance(planned, int) and planned > int(summary.get("n_tries") or 0) + sum(
            int(e.get("n") or 0) for e in (summary.get("full_board") or {}).values()):
        incomplete = f"Incomplete: {summary.get('n_tries')} of {planned} planned tries"
    weights = summary.get("weights_sha256")
    variant = bool(default_weights and isinstance(weights, str) and weights != default_weights)
    cap = step_cap(summary, run_json)
    options = (run_json or {}).get("options") if isinstance(run_json, Mapping) else None
    replay = options.get("replay_latency") if isinstance(options, Mapping) else None
    replay = replay if isinstance(replay, str) and replay else None
    out = {"ranked": False, "incomplete": incomplete, "latency_only": random_w or cap is not None, "variant": variant,
           "track": track}
    if random_w:
        out.update(section="latency_only", text=f"never ranked: {LATENCY_ONLY}")
    elif cap is not None:
        out.update(section="latency_only", text=f"never ranked: {max_steps_label(cap)}")
    elif full_only:
        out.update(section="full_board", text="full-board task only (not in the score)")
    elif replay:
        shown = replay if replay.startswith("published:") else Path(replay).name
        out.update(section="latency_replay", text=f"not a result: every action delayed by the latency profile "
                                                  f"{shown} (--replay-latency): what a device's delay does")
    elif split != SCORE_SPLIT:
        ran = [sid for sid, e in (summary.get("setups") or {}).items() if (e or {}).get("n")]
        where = ", ".join(ran) if len(ran) <= 6 else f"{len(ran)} setups"
        out.update(section="example", text=f"not a result: {summary.get('n_tries')} tries of {where} on the {split} "
                                           f"split, an example; the leaderboard ranks the {SCORE_SPLIT} split")
    elif incomplete:
        out.update(section="incomplete", text=incomplete + "; not ranked")
    elif arm != DEFAULT_ARM:
        out.update(section="other_arm", text=f"not ranked: {arm}, a check of the task list (only the "
                                             f"{DEFAULT_ARM} is scored)")
    elif variant:
        out.update(section="variant", text=f"not ranked: other weights (sha256 {weights[:12]}…) than the "
                                           f"model's committed ones (sha256 {default_weights[:12]}…): not the "
                                           f"track's recipe")
    elif track == "frozen":
        out.update(ranked=True, section="ranked", text="ranked (frozen track)")
    else:
        why = {"reference": "reference track", "sanity": "sanity track", "adapted": "adapted track"}.get(
            str(track), f"track {track}")
        out.update(section="comparison", text=f"not ranked: {why}, shown for comparison")
    return out


def ranked_text(summary: Mapping, run_json: Mapping | None = None) -> str:
    """The report's "Ranked" cell of a run, from :func:`run_status`: yes, or no with the reason where it is not
    the track's (random weights, an incomplete frozen-track run); "?" for a run without a known track."""
    status = run_status(summary, run_json)
    track = summary.get("track")
    if status["latency_only"]:
        cap = step_cap(summary, run_json)
        return f"no (tries cut at {cap} steps: a smoke run)" if cap is not None and not is_random_weights(
            summary, run_json) else "no (random weights: latency only)"
    if status["ranked"]:
        return "yes"
    if track not in ("frozen", "reference", "sanity", "adapted"):
        return "?"
    if track == "frozen" and status["incomplete"]:
        return "no (incomplete)"
    return "no"


def default_weights_sha256(model: str) -> str | None:
    """sha256 of the weights file a model loads when none is given (None: it has no committed file)."""
    from eval.request import UnknownModelError, config_class

    try:
        cls = config_class(model)
        if "checkpoint" not in {f.name for f in cls.option_fields()} or cls.family is None:
            return None
        return cls(name=model).weights_sha256()
    except (UnknownModelError, ValueError):
        return None
    except OSError:  # the committed file is not there (a partial checkout): no run can be told a variant by it
        return None


