"""vla-eval's results as a run folder, and a run folder in vla-eval's result format.

    python -m eval.import_vla_eval DIR --server ws://HOST:PORT --out RUN     # vla-eval run -> run folder
    python -m eval.export_vla_eval RUN --out DIR                            # run folder -> vla-eval's format

**Import.** ``DIR`` is a ``vla-eval run`` output folder (or its ``<name>_aggregate.json``) of the shape-assembly
benchmark (:mod:`eval.vla_eval_benchmark`): vla-eval 0.8.0 writes one aggregate per benchmark entry
(vla_eval/results/export.py ``_build_aggregate``: ``tasks[].episodes[]`` with each episode's ``metrics``, its task's
fields and ``failure_reason`` where the harness failed it). Each episode's ``metrics`` is the try's record as
``eval.run`` writes it, checked field by field (:func:`eval.records.record_problem`); the episodes must be the locked
task list's tries of the params (split, setups, tries per setup: every setup present has its first N tries, each
once, with the task list's seed and sha256), none failed by the harness and the run not partial, else the import
is refused in one line naming the episode. The run folder is that of ``eval.run --model remote --server URL
--protocol vla-eval --profile P`` with the same split, setups, tries, arm and max_steps (``--server``: vla-eval's
results do not keep the server's URL, vla_eval/recording.py ``set_run_metadata`` keeps only reporting settings;
a token in its query is left out), its records labelled as that run labels them and given the backend, weights
and note the server's HELLO declared (the aggregate's ``server_info``); ``run.json`` says the tries ran under
vla-eval (``request.harness``). The report, statistics and results page then read it as any run.

**Export.** Any run folder as ``<DIR>/shape_assembly_aggregate.json``, built by vla-eval's own
:class:`vla_eval.results.collector.ResultCollector` (one task per setup, each try an episode with its record as
``metrics``; ``success`` aggregated as vla-eval aggregates it), with what vla-eval's results do not carry as extra
top-level fields: ``latency_ms_per_query`` (the report's percentiles after warm-up, and the served split where the
model was served), ``hardware`` (device, CPU, GPU, JetPack/L4T and power mode where a Jetson ran it) and
``energy_j_per_query`` (where telemetry measured it, else null with the reason), and ``source_run`` naming the
folder. An exported file is refused by the import (the run folder is the record).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from collections import Counter
from dataclasses import replace
from pathlib import Path

from eval.records import record_label, record_problem

AGGREGATE_SUFFIX = "_aggregate.json"
EXPORT_NAME = "shape_assembly"


class ImportRefused(ValueError):
    """Results that are not the task list's tries of one benchmark run (one line naming the file and episode)."""


# ------------------------------------------------------------------ import
def find_aggregate(path: str | Path) -> Path:
    """The shape-assembly aggregate of a vla-eval output folder (or the file itself)."""
    from eval.vla_eval_benchmark import BENCHMARK_IMPORT

    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise ImportRefused(f"{path}: no such folder or file (a vla-eval output folder, or its *{AGGREGATE_SUFFIX})")
    ours = [p for p in sorted(path.glob(f"*{AGGREGATE_SUFFIX}"))
            if (_read_json(p).get("config") or {}).get("benchmark") == BENCHMARK_IMPORT]
    if len(ours) != 1:
        what = "no" if not ours else f"{len(ours)}"
        raise ImportRefused(f"{path}: {what} aggregate of benchmark {BENCHMARK_IMPORT} (vla-eval writes "
                            f"<name>{AGGREGATE_SUFFIX} at the end of a run; `vla-eval export` writes it from the "
                            f"recording)" + ("; name one of the files" if len(ours) > 1 else ""))
    return ours[0]


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) else "not JSON"
        raise ImportRefused(f"{path}: {why}") from None
    if not isinstance(data, dict):
        raise ImportRefused(f"{path}: a JSON {type(data).__name__}, not vla-eval's aggregate (an object)")
    return data


def server_url(url: str) -> tuple[str, bool]:
    """The URL as run.json may keep it (no user, password, query or fragment: a token rides in the query) and
    whether it held a token."""
    from eval.remote import wire

    wire.check_url(url, "vla-eval")
    parts = urllib.parse.urlsplit(url)
    token = "token" in urllib.parse.parse_qs(parts.query) or parts.password is not None
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "") if parts.hostname else parts.netloc
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")), token


def read_vla_eval(path: str | Path) -> tuple[Path, dict, list[dict]]:
    """(aggregate file, aggregate, the episodes' records in plan order), every check of the module docstring made;
    one-line :class:`ImportRefused` otherwise."""
    from eval.vla_eval_benchmark import HARNESS, VLA_EVAL_PROFILES, plan

    agg_path = find_aggregate(path)
    agg = _read_json(agg_path)
    where = str(agg_path)
    if "source_run" in agg:
        raise ImportRefused(f"{where}: an export of the run folder {agg['source_run'].get('folder')!r} "
                            "(eval.export_vla_eval), not a vla-eval run: the run folder itself is the record")
    if agg.get("partial"):
        raise ImportRefused(f"{where}: a partial vla-eval run (the server was lost, or shards did not finish): "
                            "rerun vla-eval with the same --eval-id to finish it, then `vla-eval export`")
    config = agg.get("config") if isinstance(agg.get("config"), dict) else {}
    params = config.get("params") if isinstance(config.get("params"), dict) else {}
    if config.get("episodes_per_task", 1) != 1:
        raise ImportRefused(f"{where}: episodes_per_task is {config.get('episodes_per_task')!r}; each task is one "
                            "try of the task list, so a second episode replays it: set episodes_per_task: 1")
    profile = params.get("profile")
    if profile not in VLA_EVAL_PROFILES:
        raise ImportRefused(f"{where}: params.profile {profile!r} is not one of {', '.join(VLA_EVAL_PROFILES)}")
    try:
        tasklist, setups, tries, arm = plan(params.get("split", "dev"), params.get("setups", "A01"),
                                            params.get("tries", 1), params.get("arm", "panda"), params.get("max_steps"))
    except Exception as e:  # noqa: BLE001 - the params' own one-line errors (unknown setup, split, arm)
        raise ImportRefused(f"{where}: {e}") from None
    split = params.get("split", "dev")
    tasks = agg.get("tasks")
    if not isinstance(tasks, list) or not all(isinstance(t, dict) and isinstance(t.get("episodes"), list)
                                              for t in tasks):
        raise ImportRefused(f"{where}: 'tasks' is not vla-eval's list of tasks with their episodes")
    by_try: dict[tuple[str, int], dict] = {}
    for t in tasks:
        for e in t["episodes"]:
            if not isinstance(e, dict):
                raise ImportRefused(f"{where}: task {t.get('task')!r}: an episode that is not an object")
            label = f"task {t.get('task')!r} (setup {e.get('setup')!r} try {e.get('try')!r})"
            if e.get("failure_reason"):
                detail = [ln for ln in str(e.get("failure_detail") or "").splitlines() if ln.strip()]
                raise ImportRefused(f"{where}: {label} failed in vla-eval ({e['failure_reason']}: "
                                    f"{detail[-1].strip() if detail else 'no detail'}): rerun the run after fixing it")
            r = e.get("metrics")
            problem = record_problem(r) if isinstance(r, dict) else "not an object"
            if problem is not None:
                raise ImportRefused(f"{where}: {label}: its metrics are not a try's record ({problem})")
            key = (r["setup"], r["try"])
            if (e.get("setup"), e.get("try"), e.get("seed")) != (r["setup"], r["try"], r.get("seed")):
                raise ImportRefused(f"{where}: {label}: the episode's task and its record name other tries")
            if r.get("split") != split or r.get("tasklist_sha256") != tasklist.sha256:
                raise ImportRefused(f"{where}: {label}: recorded on split {r.get('split')!r} with task list "
                                    f"{str(r.get('tasklist_sha256'))[:12]}, not the {split} task list "
                                    f"{tasklist.sha256[:12]} of this release")
            if key[0] not in {s.id for s in setups} or key[1] >= tries:
                raise ImportRefused(f"{where}: {label}: not one of the params' tries ({params.get('setups')!r}, "
                                    f"{tries} per setup)")
            if r.get("seed") != tasklist.seed(*key):
                raise ImportRefused(f"{where}: {label}: seed {r.get('seed')!r} is not the task list's "
                                    f"{tasklist.seed(*key)}")
            if r.get("harness") != HARNESS:
                raise ImportRefused(f"{where}: {label}: recorded under {r.get('harness')!r}, not {HARNESS} (this "
                                    "installation's); import it where that version is installed")
            if key in by_try:
                raise ImportRefused(f"{where}: {record_label(r)} is recorded twice (episodes_per_task above 1, or "
                                    "two runs merged): keep one")
            by_try[key] = r
    present = [s for s in setups if any(k[0] == s.id for k in by_try)]
    if not present:
        raise ImportRefused(f"{where}: no episodes")
    for s in present:
        missing = [t for t in range(tries) if (s.id, t) not in by_try]
        if missing:
            raise ImportRefused(f"{where}: setup {s.id} lacks tries {', '.join(map(str, missing[:8]))}"
                                f"{' ...' if len(missing) > 8 else ''} of its first {tries}: the episodes are not "
                                "the task list's (max_tasks, or a run cut short?)")
    records = [by_try[(s.id, t)] for s in present for t in range(tries)]
    return agg_path, agg, records


def import_run(path: str | Path, out: str | Path, server: str, fresh: bool = False) -> dict:
    """Write the run folder ``out`` from vla-eval's results at ``path`` (see the module docstring); its summary."""
    from eval.remote.client import ServerUnreachable, check_metadata, check_metadata_fields
    from eval.remote.profiles import get_profile
    from eval.report import write_report
    from eval.request import ResolvedModel, RunRequest, model_config
    from eval.rollout import LABELS
    from eval.run_folder import RunConfig, TryLog, prepare_out
    from eval.vla_eval_benchmark import HARNESS, PROTOCOL, plan

    agg_path, agg, records = read_vla_eval(path)
    params = agg["config"]["params"]
    url, had_token = server_url(server)
    info = agg.get("server_info") if isinstance(agg.get("server_info"), dict) else {}
    try:
        check_metadata_fields(info, url)
        check_metadata(get_profile(params["profile"], PROTOCOL), info, url)
    except ServerUnreachable as e:
        raise ImportRefused(f"{agg_path}: server_info: {e}") from None
    tasklist, setups, tries, arm = plan(params.get("split", "dev"), params.get("setups", "A01"), params.get("tries", 1),
                                        params.get("arm", "panda"), params.get("max_steps"))
    present = [s for s in setups if any(r["setup"] == s.id for r in records)]
    config = model_config("remote", server=url, protocol=PROTOCOL, profile=params["profile"])
    request = RunRequest(model=ResolvedModel.of(config, check=False), setups=tuple(present), split=params.get("split", "dev"),
                         tries=tries, arm=arm.name, max_steps=params.get("max_steps"))
    cfg = RunConfig.of(request, out, tasklist.sha256)
    harness = {"name": "vla-eval", "version": HARNESS.split()[-1], "results": str(Path(agg_path).resolve()),
               "eval_id": agg.get("eval_id"), "benchmark": agg.get("benchmark")}
    cfg = replace(cfg, request={**cfg.request, "harness": harness,
                                **({"credentials": {"token": "set (in the server URL's query)"}} if had_token else {})})
    identity = request.identity()
    labels = {k: v for k, v in identity.items() if k in LABELS}
    served = {k: info.get(k) for k in ("backend", "weights_sha256", "note") if isinstance(info.get(k), str)}
    out_dir, done, lock = prepare_out(cfg, fresh=fresh)
    try:
        if done:
            raise ImportRefused(f"{out_dir} already holds {len(done)} tries: import into a new folder, or --fresh")
        log = TryLog(out_dir / "tries.jsonl", stamp={"run_identity": cfg.run_identity})
        try:
            for r in records:
                fields = {k: r.get(k) if r.get(k) is not None else served.get(k) for k in served}
                log.append({**r, **fields, **labels})
        finally:
            log.close()
        return write_report([out_dir / "tries.jsonl"], out_dir, extra={"harness": harness})
    finally:
        lock.release()


# ------------------------------------------------------------------ export
def export_run(run: str | Path, out: str | Path) -> Path:
    """Write ``<out>/shape_assembly_aggregate.json`` of the run folder ``run`` (see the module docstring)."""
    from vla_eval.config import EvalConfig
    from vla_eval.results.collector import ResultCollector

    from eval.report.summary import build_summary, summary_problem
    from eval.run_folder import read_records, run_json_problem
    from eval.vla_eval_benchmark import BENCHMARK_IMPORT, HARNESS, METRIC_KEYS, suite_of

    run = Path(run)
    tries_file = run / "tries.jsonl"
    if not tries_file.is_file():
        raise ImportRefused(f"{run}: no tries.jsonl (name a run folder: eval.run --out)")
    records = read_records(tries_file)  # checked field by field (RecordsError: one line)
    if not records:
        raise ImportRefused(f"{tries_file}: no tries")
    run_json = _read_json(run / "run.json") if (run / "run.json").is_file() else {}
    problem = run_json_problem(run_json) if run_json else None
    if problem:
        raise ImportRefused(f"{run / 'run.json'}: {problem}")
    summary = None
    if (run / "summary.json").is_file():
        summary = _read_json(run / "summary.json")
        problem = summary_problem(summary)
        if problem:
            raise ImportRefused(f"{run / 'summary.json'}: {problem} (rebuild it: python -m eval.report --rebuild)")
    if summary is None or summary.get("n_tries") != len(records):  # a run still running: its records as they are
        summary = {**(summary or {}), **build_summary(records, n_boot=200)}
    order = {sid: i for i, sid in enumerate(dict.fromkeys(r["setup"] for r in records))}
    records = sorted(records, key=lambda r: (order[r["setup"]], r["try"]))
    request = run_json.get("request") if isinstance(run_json.get("request"), dict) else {}
    params = {"split": records[0].get("split"), "setups": ",".join(order), "arm": records[0].get("arm") or "panda",
              "tries": max(Counter(r["setup"] for r in records).values())}
    if request.get("profile") or records[0].get("profile"):
        params["profile"] = request.get("profile") or records[0].get("profile")
    caps = {r.get("max_steps") for r in records}
    if caps != {None}:
        params["max_steps"] = min(c for c in caps if c is not None)
    config = EvalConfig.from_dict({"benchmark": BENCHMARK_IMPORT, "name": EXPORT_NAME, "episodes_per_task": 1,
                                   "params": params}).to_dict()
    collector = ResultCollector(benchmark_name=EXPORT_NAME, mode="sync", metric_keys=dict(METRIC_KEYS))
    for task_idx, r in enumerate(records):
        metrics = {k: v for k, v in r.items() if k != "run_identity"}
        collector.record(r["setup"], {
            "episode_id": 0, "metrics": metrics, "steps": r.get("steps") or 0, "elapsed_sec": r.get("wall_s") or 0.0,
            "name": r["setup"], "suite": suite_of(r["setup"]), "setup": r["setup"], "try": r["try"],
            "seed": r.get("seed"), "split": r.get("split"), "episode_idx": 0, "task_idx": task_idx})
    body = dict(collector.get_benchmark_result(config=config))
    body["num_episodes_total"] = len(records)
    body["eval_id"] = f"export-{records[0].get('run_identity') or run.name}"
    body.update(latency_hardware_energy(summary, records))
    body["source_run"] = {"folder": str(run.resolve()), "model": summary.get("model"),
                          "run_identity": records[0].get("run_identity"), "exported_by": "eval.export_vla_eval",
                          "harness_format": HARNESS}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{EXPORT_NAME}{AGGREGATE_SUFFIX}"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(body, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # written whole or not at all, as vla-eval's export writes (results/export.py)
    return path


def latency_hardware_energy(summary: dict, records: list[dict]) -> dict:
    """The fields vla-eval's results lack: latency per query (ms percentiles after warm-up; a served model's round
    trip, server compute and transport), the hardware (device, JetPack/L4T, power mode where a Jetson ran it) and
    energy per query where telemetry measured it."""
    secondary = summary.get("secondary") or {}
    latency = dict(secondary.get("latency_ms") or {})
    warm = secondary.get("warmup_ms") or {}
    latency["warmup_queries"] = warm.get("count", 0)
    if summary.get("served"):
        latency["served"] = summary["served"]
    device = summary.get("device") if isinstance(summary.get("device"), dict) else {}
    machine = records[0].get("machine") or {}
    hardware = {"device": device.get("name") or f"CPU: {machine.get('cpu')}", "kind": device.get("kind", "cpu"),
                "cpu": device.get("cpu") or machine.get("cpu"), "cores": device.get("cores") or machine.get("cores"),
                "gpu": device.get("gpu"), "jetson_model": device.get("model"), "l4t": device.get("l4t"),
                "jetpack": device.get("jetpack"), "power_mode": device.get("power_mode"),
                "backend": summary.get("backend"), "precision": records[0].get("precision"),
                "source": "eval.orin's device report" if device else "the records' machine (eval.run: no device "
                                                                     "report; JetPack, L4T and power mode unknown)"}
    telemetry = summary.get("telemetry") if isinstance(summary.get("telemetry"), dict) else {}
    detail = telemetry.get("detail") if isinstance(telemetry.get("detail"), dict) else {}
    energy = detail.get("energy_per_query_j")
    energy_note = (f"measured by {telemetry.get('source')}" if energy is not None
                   else telemetry.get("reason") or "not measured (eval.run; eval.orin samples the device's telemetry)")
    return {"latency_ms_per_query": latency, "hardware": hardware,
            "energy_j_per_query": energy if isinstance(energy, (int, float)) else None, "energy_source": energy_note}


# ------------------------------------------------------------------ command lines
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.import_vla_eval",
                                description="A vla-eval run of the shape-assembly benchmark as a run folder "
                                            "(report, statistics, results page).")
    p.add_argument("results", metavar="DIR", help="vla-eval's output folder (its output_dir), or the benchmark's "
                                                  f"*{AGGREGATE_SUFFIX} in it")
    p.add_argument("--server", required=True, metavar="URL",
                   help="the model server the vla-eval run used (ws://HOST:PORT; vla-eval's results do not keep it): "
                        "the run folder is that of eval.run --model remote --server URL --protocol vla-eval")
    p.add_argument("--out", required=True, help="the run folder to write")
    p.add_argument("--fresh", action="store_true", help="discard what OUT holds first")
    return p


def main(argv: list[str] | None = None) -> int:
    from eval.console import tolerant_output

    tolerant_output()
    args = build_parser().parse_args(argv)
    try:
        summary = import_run(args.results, args.out, args.server, fresh=args.fresh)
    except (ValueError, RuntimeError, OSError) as e:  # ImportRefused, RecordsError, ReportError, RunMismatchError
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    k = sum(v["k"] for v in summary["setups"].values()) + sum(v["k"] for v in summary.get("full_board", {}).values())
    n = sum(v["n"] for v in summary["setups"].values()) + sum(v["n"] for v in summary.get("full_board", {}).values())
    print(f"{summary['model']} under vla-eval: {k}/{n} successes; run folder {args.out} (report in "
          f"{Path(args.out) / 'REPORT.md'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
