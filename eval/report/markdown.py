"""The REPORT.md text (:func:`render_markdown`); percentages appear only here and in the pictures."""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from env.setups import DIFFICULTIES, GROUPS
from eval.records import max_steps_label
from eval.report.plots import run_title
from eval.report.ranking import ranked_text, step_cap
from eval.report.summary import N_WEAKEST, _json_key


# --------------------------------------------------------------------------
# Presentation helpers (percent only here)
# --------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _rng(ci: Sequence[float | None] | None) -> str:
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    return f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def _pct_rng(x: float | None, ci) -> str:
    r = _rng(ci) if x is not None else ""
    return f"{_pct(x)} {r}".strip()


def _pp(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}"


def _pp_rng(d: Mapping | None) -> str:
    if not d or d.get("diff") is None:
        return "n/a"
    ci = d.get("ci")
    s = _pp(d["diff"])
    if ci and ci[0] is not None:
        s += f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"
    return s


def _excludes_zero(d: Mapping | None) -> str:
    ci = (d or {}).get("ci")
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    return "yes" if (ci[0] > 0 or ci[1] < 0) else "no"


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _machine_str(m: Any) -> str:
    if m is None:
        return "not recorded"
    if isinstance(m, list):
        return " | ".join(_machine_str(x) for x in m)
    if isinstance(m, Mapping):
        return ", ".join(f"{k} {v}" for k, v in m.items() if v not in (None, ""))
    return str(m)


def _machine_short(m: Any) -> str:
    if isinstance(m, Mapping):
        for k in ("device", "name", "gpu", "cpu"):
            if m.get(k):
                return str(m[k])
    if m is None:
        return "n/a"
    if isinstance(m, list):
        return "several"
    return str(m)


def _val(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, list):
        return ", ".join(map(str, x))
    return str(x)


def _flags_str(flags: Mapping[str, int]) -> str:
    parts = [f"{f} {c}" for f, c in sorted(flags.items(), key=lambda fc: (-fc[1], fc[0])) if c]
    return ", ".join(parts) if parts else "-"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], align: Sequence[str] | None = None) -> list[str]:
    align = align or ["l"] * len(header)
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(sep) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows]
    return out


def _s_key(item):
    s = item[1]["S"]
    return (s is None, -(s or 0.0))


# --------------------------------------------------------------------------
# REPORT.md
# --------------------------------------------------------------------------
def _picture(pictures: Iterable[str], name: str, alt: str) -> list[str]:
    """The Markdown that shows one of the report's pictures, when it was written."""
    return [f"![{alt}]({name})", ""] if name in pictures else []


def render_markdown(summaries: Mapping[str, dict], paired: Mapping[str, dict] | None = None,
                    sources: Mapping[str, str] | None = None, pictures: Iterable[str] = ()) -> str:
    """REPORT.md text for one or several model summaries (name -> summary); ``pictures``: the picture files
    written beside it (groups.png, heatmap.png, latency.png), linked where their numbers are."""
    names = list(summaries)
    several = len(names) > 1
    first = summaries[names[0]]
    pictures = set(pictures)
    L: list[str] = []
    title = "Shape assembly benchmark report" + ("" if several else f": {run_title(names[0], first)}")
    L += [f"# {title}", ""]

    shas = {_json_key(s["tasklist_sha256"]): s["tasklist_sha256"] for s in summaries.values()}
    if len(shas) == 1:
        sha = next(iter(shas.values()))
        L.append(f"Task list sha256: `{sha}`" if isinstance(sha, str) else
                 f"Task list sha256: {'not recorded' if sha is None else _val(sha)}")
    else:
        L.append("Task list sha256: differs between models: " +
                 "; ".join(f"{n} `{_val(s['tasklist_sha256'])}`" for n, s in summaries.items()))
    L.append("")
    preds = {n: s.get("predicate", 1) for n, s in summaries.items()}
    if len(set(preds.values())) == 1:
        v = next(iter(preds.values()))
        line = f"Success predicate: v{v} (docs/BENCHMARK.md section 1)"
        if v >= 2:
            line += "; a try that raised wrong_hole, penetration or glitch is never a success"
        L.append(line + ".")
    else:
        L.append("**Success predicates differ between models, the numbers are not comparable:** " +
                 "; ".join(f"{n} v{v}" for n, v in preds.items()))
    for n, s in summaries.items():
        if s.get("vetoed") and s["vetoed"]["n"]:
            fl = ", ".join(f"{f} {c}" for f, c in s["vetoed"]["flags"].items())
            L.append(f"{n + ': ' if several else ''}{s['vetoed']['n']} tries met the predicate and were vetoed "
                     f"by a flag ({fl}); they count as failures.")
    for n, s in summaries.items():
        if s.get("actions_clipped") and s["actions_clipped"]["tries"]:
            c = s["actions_clipped"]
            L.append(f"{n + ': ' if several else ''}{c['tries']} tries sent actions outside the controller's "
                     f"[-1, 1] range ({c['actions']} actions in all), which it clipped.")
    for n, s in summaries.items():
        v = s.get("served")
        if v and v["rtt_ms"]:
            warm = v.get("warmup_queries")
            line = (f"{n + ': ' if several else ''}served model, {v['queries']} queries"
                    + (f" ({warm} warm-up queries apart)" if warm else "") + ": round trip p50 "
                    f"{v['rtt_ms']['p50']:.1f} ms (p99 {v['rtt_ms']['p99']:.1f})")
            if v["server_ms"] and v["transport_ms"]:
                line += (f", the server's compute p50 {v['server_ms']['p50']:.1f} ms, transport p50 "
                         f"{v['transport_ms']['p50']:.1f} ms (p99 {v['transport_ms']['p99']:.1f})")
                if v.get("transport_share_of_rtt") is not None:
                    line += f", {100 * v['transport_share_of_rtt']:.1f}% of the round-trip time"
            if v["stale_ratio"] is not None:
                line += f"; the arm held on {100 * v['stale_ratio']:.1f}% of steps waiting for a chunk (live latency)"
            L.append(line + ".")
    L.append("")
    for n, s in summaries.items():
        if s.get("note"):  # e.g. random weights: latency only, success meaningless
            L += [f"**{n}: {_val(s['note'])}**", ""]
        if s.get("max_steps") is not None:  # a smoke run (eval.run --max-steps)
            L += [f"**{n}: {max_steps_label(step_cap(s))}**", ""]
    for n, s in summaries.items():
        who = f"{n}: " if several else ""
        if not s["n_tries"] and s["full_board"]:  # a full-board run: its own section, not the score's n/a
            L += [f"**{who}full-board tries only: see the full-board section** (S and M are for the 30 setups)", ""]
        elif not s["complete"]:
            L.append(f"**{who}incomplete: missing setups {', '.join(s['missing'])}** (S and M are n/a)")
            L.append("")
    bs = first["bootstrap"]
    L += [
        "Success rates in %. S (primary) = mean of the 7 group rates, each group weighs the same; "
        "M = mean over the 30 setups. Ranges are 95%: Wilson per setup; stratified percentile bootstrap "
        f"({bs['n_boot']} redraws of the tries within each setup, seed {bs['seed']}) for groups, difficulty, S and M. "
        "The full-board task is reported separately and is not part of S or M.",
        "",
    ]
    if sources:
        L += ["Tries: " + "; ".join(f"{n} `{p}`" for n, p in sources.items()), ""]

    # Leaderboard
    L += ["## Leaderboard", ""]
    rows = []
    for n, s in sorted(summaries.items(), key=_s_key):
        rows.append([n, _val(s["track"]), ranked_text(s),
                     _val(s["split"]), _val(s["arm"]), _machine_short(s["machine"]), str(s["n_tries"]),
                     _pct_rng(s["S"], s["S_ci"]), _pct_rng(s["M"], s["M_ci"])])
    L += _table(["Model", "Track", "Ranked", "Split", "Arm", "Machine", "Tries", "S % [95% range]",
                 "M % [95% range]"], rows, ["l"] * 6 + ["r"] * 3)
    L.append("")
    for n, s in summaries.items():
        L.append(f"- Machine ({n}): {_machine_str(s['machine'])}")
    for n, s in summaries.items():
        if s.get("weights_sha256") is not None:  # learned policies: which weights file ran
            L.append(f"- Weights ({n}): sha256 {_val(s['weights_sha256'])}")
    for n, s in summaries.items():
        if s.get("appearance") is not None:  # camera models: the frames' appearance version (env.appearance)
            L.append(f"- Appearance ({n}): v{_val(s['appearance'])} (camera frames, env/appearance.py)")
    L.append("")

    # By group / difficulty, every setup: only what some model has tries of (a subset reports what it holds)
    held = [sid for sid in first["setups"] if any(s["setups"][sid]["n"] for s in summaries.values())]
    if not held:
        L += ["No model has tries of the 30 scored setups.", ""]
        return _rest(L, summaries, paired, several, bs, pictures)
    left_out = len(first["setups"]) - len(held)
    L += ["## By group", ""]
    rows = []
    for g in GROUPS:
        setups = first["groups"][g]["setups"]
        if not set(setups) & set(held):
            continue
        rows.append([g, str(len(setups))] +
                    [_pct_rng(s["groups"][g]["rate"], s["groups"][g]["ci"]) for s in summaries.values()])
    rows.append(["**S**", "", *[f"**{_pct_rng(s['S'], s['S_ci'])}**" for s in summaries.values()]])
    L += _table(["Group", "Setups", *[f"{n} % [95%]" for n in names]], rows, ["l", "r"] + ["r"] * len(names))
    L += [""] + _picture(pictures, "groups.png", "Success by group and S, 95% bootstrap ranges")
    L += ["## By difficulty", ""]
    rows = []
    for d in DIFFICULTIES:
        setups = first["difficulty"][d]["setups"]
        if not set(setups) & set(held):
            continue
        rows.append([d, str(len(setups))] +
                    [_pct_rng(s["difficulty"][d]["rate"], s["difficulty"][d]["ci"]) for s in summaries.values()])
    L += _table(["Difficulty", "Setups", *[f"{n} % [95%]" for n in names]], rows, ["l", "r"] + ["r"] * len(names))

    # Every setup
    L += ["", "## Every setup", ""]
    if left_out:
        L += [f"{left_out} setups without tries are left out of these tables.", ""]
    if not several:
        rows = []
        for sid, e in ((sid, first["setups"][sid]) for sid in held):
            rows.append([sid, e["name"], e["group"], e["difficulty"], f"{e['k']}/{e['n']}" if e["n"] else "0/0",
                         _pct(e["rate"]), _rng(e["ci"]), _flags_str(e["flags"]) if e["n"] else "no tries"])
        L += _table(["Id", "Name", "Group", "Difficulty", "k/n", "%", "Wilson 95%", "Flags"], rows,
                    ["l"] * 4 + ["r"] * 3 + ["l"])
    else:
        rows = []
        for sid, e in ((sid, first["setups"][sid]) for sid in held):
            row = [sid, e["name"], e["group"], e["difficulty"]]
            for s in summaries.values():
                x = s["setups"][sid]
                row += [f"{x['k']}/{x['n']}", f"{_pct(x['rate'])} {_rng(x['ci'])}".strip(),
                        _flags_str(x["flags"]) if x["n"] else "no tries"]
            rows.append(row)
        head = ["Id", "Name", "Group", "Difficulty"]
        for n in names:
            head += [f"{n} k/n", f"{n} % [Wilson 95%]", f"{n} flags"]
        L += _table(head, rows, ["l"] * 4 + ["r", "r", "l"] * len(names))

    L.append("")
    L += _picture(pictures, "heatmap.png", "Success per setup, k/n in every cell")
    return _rest(L, summaries, paired, several, bs, pictures)


def _rest(L: list[str], summaries: Mapping[str, dict], paired, several: bool, bs: Mapping,
          pictures: set[str]) -> str:
    """The report from the weakest setups on: secondary metrics, latency, full board, paired differences."""
    # Weakest setups
    if not any(s["n_tries"] for s in summaries.values()):
        return _after_weakest(L, summaries, paired, several, bs, pictures)
    L += ["## Weakest setups", "",
          f"The {N_WEAKEST} lowest setups per model, with the flags of their tries "
          "(\"no flag\" = failed without a flag, i.e. ran out of steps).", ""]
    for n, s in summaries.items():
        if several:
            L.append(f"**{n}**")
            L.append("")
        if not s["weakest"]:
            L.append("- no failed tries" if s["n_tries"] else "- no tries")
        elif len(s["weakest"]) < N_WEAKEST:
            L.append(f"- (only {len(s['weakest'])} setup(s) with failed tries)")
        for w in s["weakest"]:
            fl = [f"{f} {c}" for f, c in w["flags"]]
            if w["no_flag_failures"]:
                fl.append(f"no flag {w['no_flag_failures']}")
            L.append(f"- {w['setup']} {w['name']} ({w['group']}, {w['difficulty']}): {_pct(w['rate'])}% "
                     f"({w['k']}/{w['n']}); flags: {', '.join(fl) if fl else 'none'}")
        L.append("")

    return _after_weakest(L, summaries, paired, several, bs, pictures)


def _after_weakest(L: list[str], summaries: Mapping[str, dict], paired, several: bool, bs: Mapping,
                   pictures: set[str]) -> str:
    # Secondary metrics
    L += ["## Secondary metrics (not in the score)", "",
          "Recovery: successes among tries whose disturbance fired (Wilson 95%). Drops: tries with a dropped "
          "block. Completion: mean simulated seconds to success. Inference: ms per policy query, on the machine "
          "named above.", ""]
    rows = []
    for n, s in summaries.items():
        sec = s["secondary"]
        rec = sec["recovery"]
        if rec["n"]:
            rtxt = f"{rec['k']}/{rec['n']}"
            rpct = _pct_rng(rec["rate"], rec["ci"])
        else:
            rtxt = "0/0" if sec.get("recovery_recorded") else "not recorded"
            rpct = "n/a"
        lat = sec["latency_ms"] or {}
        rows.append([n, rtxt, rpct, str(sec["dropped"]), _num(sec["mean_completion_s"]),
                     _num(lat.get("mean"), ".1f" if (lat.get("mean") or 0) >= 10 else ".2f"),
                     _num(lat.get("p50")), _num(lat.get("p90")), _num(lat.get("p99")),
                     str(lat.get("count", 0)), _machine_short(s["machine"])])
    L += _table(["Model", "Recovery k/n", "Recovery % [Wilson]", "Drops", "Completion s", "Infer ms mean",
                 "p50", "p90", "p99", "Queries", "Machine"], rows, ["l"] + ["r"] * 9 + ["l"])
    L.append("")
    if any((s["secondary"]["latency_ms"] or {}).get("count") and
           (s["secondary"]["latency_ms"] or {}).get("p50") is None for s in summaries.values()):
        L += ["Inference percentiles are n/a where the records hold only per-try means (no `infer_ms` lists).", ""]

    L += _latency_section(summaries, pictures)

    # Full board
    if any(s["full_board"] for s in summaries.values()):
        L += ["## Full-board task (separate, not in S or M)", "",
              "All three blocks in their holes at the same time, up to 900 steps.", ""]
        rows = []
        for n, s in summaries.items():
            for sid, e in s["full_board"].items():
                rows.append([n, sid, e["name"], f"{e['k']}/{e['n']}", _pct(e["rate"]), _rng(e["ci"]),
                             _num(e["blocks_inserted_mean"]), _flags_str(e["flags"])])
        L += _table(["Model", "Id", "Name", "k/n", "%", "Wilson 95%", "Mean blocks inserted (of 3)", "Flags"],
                    rows, ["l"] * 3 + ["r"] * 4 + ["l"])
        L.append("")
        if not any(s["n_tries"] for s in summaries.values()):  # a full-board run: its heatmap is this table's
            L += _picture(pictures, "heatmap.png", "Full-board success, k/n in every cell")

    # Paired
    if several:
        L += ["## Paired differences", "",
              "A - B in percentage points, paired stratified bootstrap on the tries both models share "
              f"(same setups and starting positions, {bs['n_boot']} redraws, seed {bs['seed']}). "
              "A 95% range that excludes 0 marks a difference beyond bootstrap noise.", ""]
        for key, p in (paired or {}).items():
            L += [f"### {p['a']} - {p['b']}", ""]
            if p.get("note"):
                L += [f"Note: {p['note']}.", ""]
            if p["S"] is None:
                continue
            rows = [["**S**", f"**{_pp_rng(p['S'])}**", _excludes_zero(p["S"])]]
            rows += [[g, _pp_rng(p["groups"][g]), _excludes_zero(p["groups"][g])] for g in GROUPS]
            L += _table(["", f"{p['a']} - {p['b']}, pp [95%]", "Excludes 0"], rows, ["l", "r", "l"])
            L += ["", f"Shared tries: {p['shared_tries']}.", ""]

    warn = [(n, w) for n, s in summaries.items() for w in s["warnings"] if not w.startswith("incomplete")]
    if warn:
        L += ["## Warnings", ""]
        L += [f"- {n}: {w}" if several else f"- {w}" for n, w in warn]
        L.append("")
    return "\n".join(L).rstrip() + "\n"


def _latency_section(summaries: Mapping[str, dict], pictures: set[str]) -> list[str]:
    """Latency profile: query percentiles without warm-up, warm-up apart, time per control step by stage,
    and the device and telemetry where a run recorded them (eval.orin)."""
    have = {n: s for n, s in summaries.items()
            if (s["secondary"].get("step_ms") or (s["secondary"]["latency_ms"] or {}).get("p50") is not None
                or s.get("batch"))}
    if not have:
        return []
    L = ["## Latency profile", "",
         "Per policy query, warm-up queries (the first queries of each fresh policy object: compilation, "
         "caches) excluded and shown apart.", ""]
    L += _picture(pictures, "latency.png", "Cumulative distribution (CDF) of ms per policy query, log scale, "
                                           "with mean, p50 and p99 marked")
    rows = []
    for n, s in have.items():
        lat = s["secondary"]["latency_ms"] or {}
        warm = s["secondary"].get("warmup_ms") or {}
        if s.get("batch") and not lat.get("count"):
            continue  # a --num-envs run times its batched queries once per batch: the table below
        rows.append([n, str(lat.get("count", 0)), _num(lat.get("mean"), ".3g"), _num(lat.get("p50"), ".3g"),
                     _num(lat.get("p90"), ".3g"), _num(lat.get("p99"), ".3g"), _num(lat.get("max"), ".3g"),
                     f"{warm.get('count', 0)} ({_num(warm.get('mean'), '.3g')} mean)" if warm else "0",
                     _machine_short(s["machine"])])
    if rows:
        L += _table(["Model", "Queries", "Mean ms", "p50", "p90", "p99", "Max", "Warm-up queries", "Machine"], rows,
                    ["l"] + ["r"] * 7 + ["l"])
        L.append("")
    traffic = [(n, s["host_traffic"]) for n, s in have.items() if s.get("host_traffic")]
    if traffic:  # what each query copied from host to device (TensorRT counts it; CPU runtimes copy nothing)
        L += [f"Host to device per query{' (' + n + ')' if len(summaries) > 1 else ''}: "
              f"{t['bytes_per_query']:,.0f} bytes, copy time p50 "
              f"{_num(t['ms_p50'], '.3g') + ' ms' if t['ms_p50'] is not None else 'n/a (no device)'}."
              for n, t in traffic]
        L.append("")
    steps = {n: s["secondary"]["step_ms"] for n, s in have.items() if s["secondary"].get("step_ms")}
    if steps:
        from eval.rollout import STAGES

        L += ["Time per control step by stage, ms (share of the step). observe: observation taken from the "
              "scene; preprocess / inference / postprocess: the policy query; physics: action and simulation "
              "substeps; render: sensors and observation; other: success evaluation and bookkeeping. "
              "Scenes stepped together: each scene's share of its batch's steps.", ""]
        rows = []
        for n, st in steps.items():
            total = st["total"] or 1.0
            rows.append([n] + [f"{_num(st.get(k, 0.0), '.3g')} ({100 * st.get(k, 0.0) / total:.0f}%)"
                               for k in STAGES] + [_num(st["total"], ".3g"), str(st["steps"])])
        L += _table(["Model", *STAGES, "Total", "Steps"], rows, ["l"] + ["r"] * (len(STAGES) + 2))
        L.append("")
    for n, s in have.items():
        b = s.get("batch")
        if not b:
            continue
        q = b.get("query_ms") or {}
        L += [f"Scenes stepped together ({n}): {', '.join(map(str, b['num_envs']))} per batch on "
              f"{'/'.join(s.upper() for s in b['sim'])} physics, {b['batches']} batches, {b['tries']} tries. "
              + ("Queries batched: one runner call per step for all live scenes." if b["batched_queries"] else
                 "Queries not batched: this policy is queried scene by scene.")
              + " These are the batch's queries; the latency of one scene's query is a --num-envs 1 run's.", ""]
        L += _table(["Batch query ms: mean", "p50", "p90", "p99", "max", "mean live batch", "ms per scene",
                     "tries/s", "scene steps/s", "host-device bytes/step", "image bytes/step"],
                    [[_num(q.get("mean"), ".3g"), _num(q.get("p50"), ".3g"), _num(q.get("p90"), ".3g"),
                      _num(q.get("p99"), ".3g"), _num(q.get("max"), ".3g"), _num(q.get("mean_batch"), ".3g"),
                      _num(q.get("ms_per_scene"), ".3g"), _num(b.get("tries_per_s"), ".3g"),
                      _num(b.get("scene_steps_per_s"), ".4g"), _num(b.get("host_device_bytes_per_step"), ".4g"),
                      str(b.get("image_bytes_per_step"))]], ["r"] * 11)
        L.append("")
    for n, s in have.items():
        dev = s.get("device")
        if dev:
            L += [f"Device ({n}): " + "; ".join(f"{k} {_val(v)}" for k, v in dev.items() if v not in (None, "")), ""]
        prof = s.get("profile")
        if prof:
            L += [f"Backend ({n}): {prof.get('backend')} ({prof.get('backend_reason')})", ""]
        tel = s.get("telemetry")
        if tel is not None:
            lines = tel.get("lines") or [tel.get("reason") or "telemetry unavailable"]
            L += [f"Telemetry ({n}):", ""] + [f"    {line}" for line in lines] + [""]
    return L
