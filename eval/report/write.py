"""Writing a report into an output folder (:func:`write_report`).

From one or several ``tries.jsonl`` files (one file = one model) this module
writes, into an output folder:

* ``summary.json``  -- one model: its summary (:func:`build_summary`);
  several: ``{"models": {name: summary}, "paired": {"A - B": ...}}``.
  All rates are fractions in 0..1 (fields named ``rate``, ``diff``, ``ci``);
  n/a is ``null``.  Percentages only appear in the presentation files.
* ``per_config.csv`` -- one row per model and setup: model, setup, name, group,
  difficulty, k, n, rate, wilson_low, wilson_high, scored (the 30 scored
  setups always, empty fields where a setup has no tries; full-board setups
  only where they were run, with ``scored`` false).
* ``REPORT.md``     -- leaderboard, by-group, by-difficulty and every-setup
  tables, weakest setups, secondary metrics, full-board task, and for several
  models the paired differences.
* ``groups.png``    -- success per group (and S) with 95 % bootstrap bars.
* ``heatmap.png``   -- setup x model success rates, annotated.

Every file is staged beside its final name and renamed into place once all are written.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from env.setups import SCORED_IDS
from eval.report.markdown import render_markdown
from eval.report.plots import _label, plot_groups, plot_heatmap, plot_latency
from eval.report.summary import (
    ReportError,
    batch_summary,
    _split_records,
    _validate,
    build_summary,
    load_tries,
    paired_summary,
    PAIRED_CHECK,
    predicate_of,
    summary_problem,
)
from eval.records import problem_text


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) beside ``path`` and rename it into place: readers never see half a file, and a
    failed write leaves no partial file. An OSError (disk full, read-only) becomes a one-line ReportError."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")  # two writers at once never share one
    try:
        # surrogateescape: a name that came from a non-UTF-8 locale's argv or file name goes back as its bytes
        tmp.write_text(text, encoding="utf-8", errors="surrogateescape")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ReportError(f"{path}: cannot write ({e.strerror or e}): free space or fix permissions, then rerun "
                          f"the same command (the tries are kept)") from None



# --------------------------------------------------------------------------
# Writing the report
# --------------------------------------------------------------------------
def _unique_names(names: list[str], paths: list[Path]) -> list[str]:
    out: list[str] = []
    for i, (n, p) in enumerate(zip(names, paths)):
        cand = n
        if names.count(n) > 1:
            cand = f"{n} ({p.resolve().parent.name})"
        base, k = cand, 2
        while cand in out:
            cand = f"{base} #{k}"
            k += 1
        out.append(cand)
    return out


def _csv_rows(name: str, s: dict) -> list[list[Any]]:
    rows = []
    for sid, e in list(s["setups"].items()) + list(s["full_board"].items()):
        ci = e["ci"] or [None, None]
        rows.append([name, sid, e["name"], e["group"], e["difficulty"], e["k"], e["n"],
                     "" if e["rate"] is None else repr(float(e["rate"])),
                     "" if ci[0] is None else repr(float(ci[0])), "" if ci[1] is None else repr(float(ci[1])),
                     "true" if sid in SCORED_IDS else "false"])
    return rows


def write_report(tries_paths: Sequence[str | Path], out_dir: str | Path, *, names: Sequence[str] | None = None,
                 n_boot: int = 5000, seed: int = 0, extra: Mapping[str, Any] | None = None,
                 allow_mixed_predicates: bool = False) -> dict:
    """Write summary.json, per_config.csv, REPORT.md, groups.png and heatmap.png
    into ``out_dir`` for one model per tries file.  Returns what summary.json
    holds.  ``names`` (one per file) override the model names, which else come
    from the records' ``model`` field or the file's parent folder. ``extra`` (device, telemetry, profile:
    what eval.orin measured beside the records) is added to every model's summary."""
    paths = [Path(p) for p in tries_paths]
    if not paths:
        raise ReportError("no tries file given")
    if names is not None and len(names) != len(paths):
        raise ReportError(f"{len(names)} names for {len(paths)} tries files; give one --name per --tries")
    records: list[list[dict]] = []
    raw_names: list[str] = []
    for i, p in enumerate(paths):
        recs = load_tries(p)
        if not recs:
            raise ReportError(f"{p}: no tries")
        try:
            _validate(recs)
        except ReportError as e:
            raise ReportError(f"{p}: {e}") from None
        records.append(recs)
        if names is not None:
            raw_names.append(str(names[i]))
        else:
            models = list(dict.fromkeys(str(r["model"]) for r in recs if r.get("model") is not None))
            if len(models) > 1:
                raise ReportError(f"{p}: records hold several models ({', '.join(models)}); one tries file = one model")
            raw_names.append(models[0] if models else (p.resolve().parent.name or p.stem))
    model_names = _unique_names(raw_names, paths)
    versions = {}
    for p, recs in zip(paths, records):
        try:
            versions[p] = predicate_of(recs)
        except ReportError as e:
            raise ReportError(f"{p}: {e}") from None
    if len(set(versions.values())) > 1 and not allow_mixed_predicates:
        raise ReportError("the runs were scored with different success predicates (" +
                          ", ".join(f"{p}: v{v}" for p, v in versions.items()) +
                          "); their numbers are not comparable: rerun the older one, or pass "
                          "--allow-mixed-predicates to put them side by side anyway")

    summaries: dict[str, dict] = {}
    sources: dict[str, str] = {}
    for n, p, recs in zip(model_names, paths, records):
        try:
            summaries[n] = build_summary(recs, model=n, n_boot=n_boot, seed=seed)
        except ReportError as e:
            raise ReportError(f"{p}: {e}") from None
        summaries[n]["source"] = str(p)
        summaries[n].update(extra or {})
        batches_file = p.parent / "batches.jsonl"
        if batches_file.exists():  # a --num-envs run: latency at batch N and throughput (eval.rollout)
            from eval.records import RecordsError, read_tries

            try:
                summaries[n]["batch"] = batch_summary(read_tries(batches_file, kind="batch"))
            except RecordsError as e:
                raise ReportError(str(e)) from None
        sources[n] = str(p)

    paired: dict[str, dict] = {}
    for i in range(len(model_names)):
        for j in range(i + 1, len(model_names)):
            a, b = model_names[i], model_names[j]
            paired[f"{a} - {b}"] = paired_summary(records[i], records[j], name_a=a, name_b=b,
                                                  n_boot=n_boot, seed=seed)

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"{out}: cannot create folder ({e.strerror or e})") from None
    result = summaries[model_names[0]] if len(model_names) == 1 else {"models": summaries, "paired": paired}

    def data_files(stage) -> None:
        stage("summary.json").write_text(json.dumps(result, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        with open(stage("per_config.csv"), "w", newline="", encoding="utf-8", errors="surrogateescape") as f:
            w = csv.writer(f)
            w.writerow(["model", "setup", "name", "group", "difficulty", "k", "n", "rate", "wilson_low",
                        "wilson_high", "scored"])
            for n, s in summaries.items():
                w.writerows(_csv_rows(n, s))

    _write_files(out, summaries, paired, sources, dict(zip(model_names, records)), data_files)
    return result


def rebuild_report(out_dir: str | Path) -> dict:
    """REPORT.md and the pictures of a report folder again, from its summary.json as it is (every number and
    what eval.run / eval.orin added beside the records: the run, the device, telemetry) and the tries files it
    names (the latency picture's queries). summary.json and per_config.csv are not written."""
    out = Path(out_dir)
    sp = out / "summary.json"
    try:
        result = json.loads(sp.read_text(encoding="utf-8"))
    except OSError as e:
        raise ReportError(f"{sp}: cannot read ({e.strerror or e}): not a report folder") from None
    except ValueError as e:
        raise ReportError(f"{sp}: not JSON ({' '.join(str(e).split())})") from None
    if isinstance(result, dict) and isinstance(result.get("models"), dict):
        summaries, paired = result["models"], result.get("paired") or {}
    elif isinstance(result, dict) and "setups" in result and "model" in result:
        summaries, paired = {str(result["model"]): result}, {}
    else:
        raise ReportError(f"{sp}: not a benchmark report's summary (no setups, no models)")
    for n, s in summaries.items():  # every number of REPORT.md comes from here: none may be of another type
        problem = summary_problem(s, f"models.{n}" if "models" in result else "")
        if problem is not None:
            raise ReportError(f"{sp}: {problem} (a damaged summary): write the report again from the tries with "
                              f"python -m eval.report --tries ... --out {out}")
    bad = PAIRED_CHECK(paired)
    if bad is not None:
        raise ReportError(f"{sp}: {problem_text(bad, 'paired')} (a damaged summary): write the report again from "
                          f"the tries with python -m eval.report --tries ... --out {out}")
    records, sources = {}, {}
    for n, s in summaries.items():
        src = Path(str(s.get("source") or out / "tries.jsonl"))
        if not src.is_file() and len(summaries) == 1 and (out / "tries.jsonl").is_file():
            src = out / "tries.jsonl"  # a folder moved since: its own tries
        if not src.is_file():
            raise ReportError(f"{sp}: {n}'s tries file {src} is not there (run from the folder the report was made "
                              f"in, or rebuild with python -m eval.report --tries ...)")
        records[n] = load_tries(src)
        sources[n] = str(s.get("source") or src)
    _write_files(out, summaries, paired, sources, records, None)
    return result


def _write_files(out: Path, summaries: Mapping[str, dict], paired: Mapping[str, dict], sources: Mapping[str, str],
                 records: Mapping[str, list[dict]], data_files) -> None:
    """The report's files: ``data_files(stage)`` (summary.json, per_config.csv; None: left as they are), then
    the pictures and REPORT.md, which links the pictures that were drawn. Every file is written beside its
    final name first and renamed once all are written: a crash or a full disk leaves the previous report
    whole, never a truncated picture or a mix of two reports."""
    queries = {n: [float(v) for r in _split_records(recs)[0] if isinstance(r.get("infer_ms"), list)
                   for v in r["infer_ms"]] for n, recs in records.items()}
    staged: dict[str, Path] = {}

    def stage(name: str) -> Path:
        staged[name] = out / f".{Path(name).stem}.partial{Path(name).suffix}"
        return staged[name]

    try:
        if data_files is not None:
            data_files(stage)
        if not plot_groups(summaries, stage("groups.png")):  # no scored tries (a full-board run): no groups
            staged.pop("groups.png").unlink(missing_ok=True)
        plot_heatmap(summaries, stage("heatmap.png"))
        if any(queries.values()):
            warmup = {n: sum(len(r.get("warmup_ms") or []) for r in _split_records(recs)[0])
                      for n, recs in records.items()}
            plot_latency({_label(n, summaries[n]): v for n, v in queries.items()}, stage("latency.png"),
                         {_label(n, s): _machine_name(s) for n, s in summaries.items()},
                         {_label(n, summaries[n]): w for n, w in warmup.items()})
        pictures = [n for n in staged if n.endswith(".png")]
        stage("REPORT.md").write_text(render_markdown(summaries, paired, sources, pictures), encoding="utf-8",
                                     errors="surrogateescape")
        for name, tmp in staged.items():
            os.replace(tmp, out / name)
        for name in ("latency.png", "groups.png"):  # an earlier report's picture would describe other tries
            if name not in staged:
                (out / name).unlink(missing_ok=True)
    except OSError as e:
        raise ReportError(f"{out}: cannot write the report ({e.strerror or e}): free space or fix permissions, "
                          f"then rerun the same command (the tries are kept)") from None
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)


def _machine_name(summary: Mapping[str, Any]) -> str:
    """The machine a model's queries ran on, for the latency picture: eval.orin's device, else the CPU."""
    device = summary.get("device")
    if isinstance(device, Mapping) and device.get("name"):
        return str(device["name"])
    from eval.report.markdown import _machine_short

    return _machine_short(summary.get("machine"))
