"""Assembly reasoning probe CLI.

    python -m assembly_probe build --out data/reasoning                 # full set (seed 0)
    python -m assembly_probe run --answerer oracle --data data/reasoning --out results/reasoning/oracle
    python -m assembly_probe run --answerer http --endpoint http://jetson:8000/v1 --model NAME \\
        --data data/reasoning --out runs/reasoning/NAME [--lite] [--max-images 1 --over-limit tile] \\
        [--extract-with NAME] [--prompt-style official|official-cot|legacy] [--max-tokens N]
    python -m assembly_probe gallery --data data/reasoning --out results/reasoning/gallery
    python -m assembly_probe human-sheet --data data/reasoning --out runs/reasoning/human   # the human baseline (Lite)
    python -m assembly_probe run --answerer sheet --sheet runs/reasoning/human/answers.csv --data data/reasoning \
        --lite --out runs/reasoning/human/report
    python -m assembly_probe generate-build --out data/reasoning_gen                      # Plan-k-Step-Generation
    python -m assembly_probe generate-answers --answerer http --endpoint URL --model NAME --data data/reasoning_gen \
        --out runs/reasoning_gen/NAME/answers [--protocol multi-turn|single-shot]
    python -m assembly_probe generate-score --answers DIR --data data/reasoning_gen --out runs/reasoning_gen/NAME
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

SIZES = (32, 4096)  # a sane range of image sides, px (a bad --size used to fail deep in the renderer)


def _ks(text: str, flag: str = "--plan-k") -> list[int]:
    try:
        if "-" in text:
            a, b = text.split("-", 1)
            ks = list(range(int(a), int(b) + 1))
            if not ks:  # "5-2" would silently select no k at all
                raise ValueError
            return ks
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be a range A-B (A <= B) or a comma-separated list of integers, "
                         f"got {text!r}") from None


# every numeric option of every subcommand: (dest, lowest, highest, whether the lowest is allowed); floats must
# also be finite ("nan" and "inf" parse as floats). Checked once, before any work, one line each.
NUMBERS = {
    "build": [("seed", 0, None, True), ("per_type", 1, None, True), ("lite", 0, None, True),
              ("plan_per_k", 1, None, True), ("size", *SIZES, True)],
    "run": [("seed", 0, None, True), ("timeout", 0, None, False), ("retries", 0, None, True),
            ("backoff", 0, None, True), ("retry_budget", 0, None, True), ("max_images", 1, None, True),
            ("max_fail_share", 0, 1, True), ("sweep_seeds", 0, None, True), ("limit", 1, None, True),
            ("max_tokens", 1, None, True)],
    "gallery": [("tile", 16, 1024, True)],
    "human-sheet": [("tile", 16, 1024, True)],
    "generate-build": [("seed", 0, None, True), ("per_k", 1, None, True), ("size", *SIZES, True)],
    "generate-answers": [("seed", 0, None, True), ("timeout", 0, None, False), ("retries", 0, None, True),
                         ("max_fail_share", 0, 1, True)],
}


def check_options(args) -> None:
    """ValueError (one line naming the option) for an empty folder option (Path("") is the current folder: a set or
    a report would be written into the repository root) or a numeric option out of its range or not finite."""
    for dest in ("out", "data", "answers"):
        v = getattr(args, dest, None)
        if v is not None and not v.strip():
            raise ValueError(f"--{dest} is empty; name a folder")
    for dest, lo, hi, lo_ok in NUMBERS.get(args.cmd, ()):
        v = getattr(args, dest, None)
        if v is None:  # an optional one not given
            continue
        flag = "--" + dest.replace("_", "-")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{flag} must be a finite number, got {v}")
        if dest == "max_fail_share":  # a share: [0, 1)
            if not 0 <= v < 1:
                raise ValueError(f"{flag} must lie in [0, 1), got {v:g}")
            continue
        if (v < lo if lo_ok else v <= lo) or (hi is not None and v > hi):
            want = (f"{lo}..{hi}" if hi is not None else f"at least {lo}" if lo_ok else f"more than {lo}")
            raise ValueError(f"{flag} must be {want}, got {v:g}")


def cmd_build(args) -> int:
    from assembly_probe import questions as Q
    from assembly_probe.build import build

    types = Q.TYPES if args.types == "all" else tuple(t.strip() for t in args.types.split(","))
    bad = [t for t in types if t not in Q.TYPES]
    if bad:
        raise ValueError(f"unknown question type {bad[0]!r}; valid: {', '.join(Q.TYPES)}")
    ks = _ks(args.plan_k) if args.plan_k.strip() else []
    if any(not 1 <= k <= 8 for k in ks):
        raise ValueError("--plan-k values must lie in 1..8")
    m = build(args.out, seed=args.seed, per_type=args.per_type, lite=args.lite, types=types, plan_ks=ks,
              plan_per_k=args.plan_per_k, size=args.size, progress=not args.quiet)
    print(f"wrote {m['n_items']} questions, {m['n_images']} images ({m['n_image_refs']} references) to {args.out} "
          f"in {m['build_s']:.1f} s (render {m['render_s']:.1f} s)")
    print(f"sha256_states {m['sha256_states']} (the set's identity)")
    print(f"sha256_images {m['sha256_images']} (this renderer's pixels; each file's sha256 in the manifest)")
    return 0


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def cmd_run(args) -> int:
    from assembly_probe import prompts
    from assembly_probe import questions as Q
    from assembly_probe.answerers import make_answerer
    from assembly_probe.build import load
    from assembly_probe.report import run_items, write_report

    from assembly_probe.report import RunStopped

    if (args.sheet is not None) != (args.answerer == "sheet"):
        raise ValueError("--answerer sheet needs --sheet FILE (a filled human answer sheet), and --sheet needs "
                         "--answerer sheet")
    answerer = None
    if args.answerer != "sheet":  # the sheet answerer reads its file against the set, once the set is checked
        answerer = make_answerer(args.answerer, seed=args.seed, endpoint=args.endpoint, model=args.model,
                                 api_key=os.environ.get(args.api_key_env) if args.api_key_env else None,
                                 timeout_s=args.timeout, retries=args.retries, backoff_s=args.backoff,
                                 retry_budget_s=args.retry_budget, max_images=args.max_images,
                                 over_limit=args.over_limit, prompt_style=args.prompt_style,
                                 max_tokens=args.max_tokens)
    if args.max_tokens is not None and args.answerer != "http":
        raise ValueError("--max-tokens applies to the http answerer only (the others read no prompt)")
    if args.prompt_style != prompts.DEFAULT_STYLE and args.answerer != "http":
        raise ValueError("--prompt-style applies to the http answerer only (the others read no prompt)")
    if args.extract_with and args.answerer != "http":
        raise ValueError("--extract-with applies to the http answerer only (it asks a model on the same endpoint)")
    items, manifest = load(args.data)  # every file checked against the manifest before anything is asked
    if args.answerer == "sheet":
        from assembly_probe.human import SheetAnswerer

        answerer = SheetAnswerer(args.sheet, items, manifest)
        if not args.lite:
            raise ValueError("the human answer sheet covers the Lite subset: add --lite")
    if args.lite:
        items = [it for it in items if it["lite"]]
    if args.types is not None:
        keep = {t.strip() for t in args.types.split(",") if t.strip()}
        bad = sorted(keep - set(Q.TYPES) - {"plan"})  # a misspelt type would silently drop its questions
        if bad or not keep:
            raise ValueError(f"unknown --types {', '.join(bad) or repr(args.types)}; valid: {', '.join(Q.TYPES)}, "
                             "plan")
        items = [it for it in items if it["type"] in keep]
    if args.limit is not None:
        items = items[: args.limit]
    if not items:
        raise ValueError("no questions selected")
    try:
        records = run_items(items, answerer, args.data, progress=not args.quiet, max_fail_share=args.max_fail_share,
                            extract_with=args.extract_with)
    except RunStopped as e:  # keep what was answered, for the post-mortem
        import json
        from pathlib import Path

        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "records.partial.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n"
                                                                   for r in e.records))
        raise RuntimeError(f"{e} (records so far in {args.out}/records.partial.jsonl)") from None
    sweep = None
    if args.sweep_seeds:
        if args.answerer != "random":
            raise ValueError("--sweep-seeds applies to the random answerer only")
        from assembly_probe.report import seed_sweep

        sweep = seed_sweep(items, args.data, manifest, range(args.seed, args.seed + args.sweep_seeds))
    info = answerer.describe() if hasattr(answerer, "describe") else {"name": args.answerer}
    name = "human (answer sheet)" if args.answerer == "sheet" else args.answerer
    if args.answerer == "random":
        info["seed"] = args.seed
    if args.extract_with:
        info["extract_with"] = args.extract_with
    s = write_report(records, name, manifest, args.out, sweep, answerer_info=info)
    for t, r in s["elementary"].items():
        print(f"{t:16s} {100 * r['accuracy']:6.1f}%  CI [{100 * r['ci'][0]:.1f}, {100 * r['ci'][1]:.1f}]  "
              f"chance {100 * r['chance']:.1f}%  critical {_pct(r['critical_accuracy'])}")
    for key, name in (("elementary", "Overall"), ("elementary_lite", "Lite Overall")):
        o = s["overall"].get(key)
        if o:
            print(f"{name:16s} {100 * o['accuracy']:6.1f}%  CI [{100 * o['ci'][0]:.1f}, {100 * o['ci'][1]:.1f}]  "
                  f"chance {100 * o['chance']:.1f}%  critical {_pct(o['critical_accuracy'])}  "
                  f"({o['types']} types, {o['n']} questions)")
    for key, name in (("elementary", ""), ("elementary_lite", "Lite ")):
        for level, o in (s["levels"].get(key) or {}).items():
            if o:
                print(f"{name + Q.LEVEL_NAMES[level]:30s} {100 * o['accuracy']:6.1f}%  CI [{100 * o['ci'][0]:.1f}, "
                      f"{100 * o['ci'][1]:.1f}]  chance {100 * o['chance']:.1f}%")
    for k, r in s["planning"].items():
        print(f"plan {k:3s}  exact {100 * r['exact']['rate']:5.1f}%  set {100 * r['set']['rate']:5.1f}%  "
              f"overlap {100 * r['overlap']['mean']:5.1f}%")
    q = s["queries"]
    if q["refused"]:
        print(f"refused {q['refused']} items with more than --max-images {args.max_images} images (counted wrong)")
    if q["extraction"]["asked"]:
        print(f"model-assisted extraction: {q['extraction']['parsed']} of {q['extraction']['asked']} parsed")
    if s["cut_off"]:
        print(f"cut off at the token limit: {s['cut_off']} replies (counted as answered; raise --max-tokens)")
    print(f"unparseable {s['unparseable']}, errors {s['errors']}; report in {args.out}/REPORT.md")
    return 0


def cmd_human_sheet(args) -> int:
    from assembly_probe.build import load
    from assembly_probe.human import write_sheet

    items, manifest = load(args.data)
    page, sheet = write_sheet(items, manifest, args.data, args.out, tile=args.tile)
    print(f"wrote the Lite questions' page {page} and the blank answer sheet {sheet}; once filled, score it with: "
          f"python -m assembly_probe run --answerer sheet --sheet {sheet} --data {args.data} --lite --out DIR")
    return 0


def cmd_gallery(args) -> int:
    from assembly_probe.build import load
    from assembly_probe.gallery import write_gallery

    items, manifest = load(args.data)
    paths = write_gallery(items, args.data, args.out, tile=args.tile, set_sha256_states=manifest.get("sha256_states"))
    print(f"wrote {len(paths)} example PNGs and their page to {args.out}")
    return 0


def cmd_generate_build(args) -> int:
    from assembly_probe import genset as GS

    ks = _ks(args.ks, "--ks")
    if not ks or any(not 1 <= k <= 7 for k in ks):
        raise ValueError("--ks values must lie in 1..7")
    m = GS.build(args.out, seed=args.seed, ks=ks, per_k=args.per_k, size=args.size, progress=not args.quiet)
    print(f"wrote {m['n_cases']} generation cases, {m['n_images']} images to {args.out} in {m['build_s']:.1f} s")
    _print_calibration(m["calibration"])
    print(f"sha256_states {m['sha256_states']} (the set's identity)")
    print(f"sha256_images {m['sha256_images']} (this renderer's pixels; each file's sha256 in the manifest)")
    return 0


def _print_calibration(cal) -> None:
    rd, mse = cal["reading"], cal["mse"]
    at = rd["separation_margin_at"]
    print(f"part-level reading: correct read right {rd['correct_read_right']}/{rd['correct_images']}, wrong rejected "
          f"{rd['wrong_rejected']}/{rd['wrong_images']}; separation margin {rd['separation_margin']:.3f} "
          f"({at['population']} {at['case']} step {at['step']}, {at['kind']})")
    for kind, r in rd["correct"].items():
        w = rd["wrong"].get(kind, {"images": 0, "rejected": 0})
        c = rd["cases"].get(kind, {"cases": 0, "accepted": 0})
        print(f"  {kind:11s} correct {r['read_right']}/{r['images']} (margin {r['min_margin']:.3f}), wrong rejected "
              f"{w['rejected']}/{w['images']}, reference cases {c['accepted']}/{c['cases']}")
    c = rd["cases"]["wrong_turn"]
    print(f"  cases with one wrong turn rejected {c['cases'] - c['accepted']}/{c['cases']}")
    print(f"MSE diagnostic: tolerance {mse['tolerance_mse']:.3g}, correct at most {mse['correct_max_mse']:.3g} "
          f"({mse['correct_max_at']['kind']}), wrong at least {mse['wrong_min_mse']:.3g} "
          f"({mse['wrong_min_at']['kind']}), " + ("apart" if mse["separated"] else "overlapping")
          + f"; agrees with the reading on {cal['agreement']['agree']}/{cal['agreement']['images']} images")


def cmd_generate_calibrate(args) -> int:
    from assembly_probe import genset as GS

    m = GS.recalibrate(args.data, progress=not args.quiet)
    _print_calibration(m["calibration"])
    return 0


def cmd_generate_answers(args) -> int:
    from assembly_probe import genset as GS

    if args.answerer == "http":
        from assembly_probe.answerers import make_answerer
        from assembly_probe.gendriver import generate

        if args.perturb:
            raise ValueError("--perturb applies to the oracle and wrong answerers only")
        client = make_answerer("http", endpoint=args.endpoint, model=args.model,
                               api_key=os.environ.get(args.api_key_env) if args.api_key_env else None,
                               timeout_s=args.timeout, retries=args.retries)
        run = generate(args.data, args.out, client, args.protocol, max_fail_share=args.max_fail_share,
                       progress=not args.quiet)
        print(f"wrote {args.protocol} answers of {args.model} for {len(run['cases'])} cases to {args.out} "
              f"({run['failed']} failed)")
        return 0
    n = GS.write_answers(args.data, args.out, args.answerer, seed=args.seed, perturb=args.perturb)
    print(f"wrote {args.answerer} answers for {n} cases to {args.out}" + (f" ({args.perturb})" if args.perturb else ""))
    return 0


def cmd_generate_score(args) -> int:
    from assembly_probe import genset as GS

    records, manifest = GS.score_answers(args.data, args.answers, progress=not args.quiet)
    run = GS.read_run(args.answers)
    name = args.name or Path(args.answers).resolve().name
    args.out = args.out or str(Path("runs/reasoning_gen") / name)
    s = GS.write_report(records, manifest, name, args.out, run)
    for k, r in s["per_k"].items():
        print(f"plan-gen {k:3s}  {r['success']}/{r['n']}  ({100 * r['rate']:.1f}%)  MSE diagnostic {r['mse_success']}"
              f"/{r['n']}  agree {r['agree']}/{r['n']}")
    print(f"accepted {s['success']} of {s['n_cases']} by the part-level reading ({s['protocol']}); MSE diagnostic "
          f"{s['mse_success']}; report in {args.out}/REPORT.md")
    return 0


def main(argv=None) -> int:
    from assembly_probe import prompts
    from assembly_probe import scene as S

    p = argparse.ArgumentParser(prog="python -m assembly_probe", description="Assembly reasoning probe.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="generate questions and render images")
    b.add_argument("--out", required=True)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--per-type", type=int, default=100)
    b.add_argument("--lite", type=int, default=20, help="first N per type form the Lite subset")
    b.add_argument("--types", default="all", help="comma-separated elementary types, or all")
    b.add_argument("--plan-k", default="1-8", help="k values, e.g. 1-8 or 1,3; empty for none")
    b.add_argument("--plan-per-k", type=int, default=20)
    b.add_argument("--size", type=int, default=S.IMAGE_SIZE, help="image side in pixels")
    b.add_argument("--quiet", action="store_true")
    r = sub.add_parser("run", help="answer a built set and write a report")
    r.add_argument("--answerer", required=True, help="oracle, random, http, or sheet (a filled human answer sheet)")
    r.add_argument("--sheet", help="sheet: the filled answers.csv of human-sheet (the human baseline; with --lite)")
    r.add_argument("--data", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--seed", type=int, default=0, help="random answerer seed")
    r.add_argument("--endpoint", help="http: OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    r.add_argument("--model", default="default", help="http: model name sent in the request")
    r.add_argument("--api-key-env", help="http: name of an environment variable holding the API key")
    r.add_argument("--timeout", type=float, default=120.0, help="http: seconds per request")
    r.add_argument("--retries", type=int, default=4, help="http: retries of a query after 429, 5xx, a timeout or "
                   "a dropped connection (exponential backoff)")
    r.add_argument("--backoff", type=float, default=1.0, help="http: first wait before a retry, seconds (doubles)")
    r.add_argument("--retry-budget", type=float, default=300.0, help="http: most seconds of waits per query")
    r.add_argument("--max-images", type=int, help="http: most images the server takes per request (vLLM's "
                   "default is 1); an item with more is refused or tiled, see --over-limit")
    r.add_argument("--over-limit", default="refuse", help="http: refuse (skip the item, counted wrong) or tile "
                   "(pack its images into --max-images labelled grids)")
    r.add_argument("--max-fail-share", type=float, default=0.1, help="stop once at least 3 queries failed and "
                   "they are more than this share of those asked")
    r.add_argument("--prompt-style", default=prompts.DEFAULT_STYLE,
                   help="http: official (the LEGO-Puzzles / VLMEvalKit format: <image N> in place, 'Options:' lines, "
                   "'Please select the correct answer'), official-cot (the same, asking to think step by step and end "
                   "with 'Answer: ...'; give it --max-tokens) or legacy (a system prompt, options inline, images after)")
    r.add_argument("--max-tokens", type=int, help="http: the reply's token limit (default 512); a reply cut off by "
                   "it (finish_reason length) is counted per type in the report")
    r.add_argument("--extract-with", metavar="MODEL", help="http: ask MODEL on the same endpoint for the final "
                   "answer of replies the rules cannot parse (reported separately)")
    r.add_argument("--sweep-seeds", type=int, default=0,
                   help="random: also run this many seeds and report how often each interval covers chance")
    r.add_argument("--lite", action="store_true", help="only the Lite subset")
    r.add_argument("--types", help="comma-separated types (plan for planning)")
    r.add_argument("--limit", type=int, help="first N selected questions only")
    r.add_argument("--quiet", action="store_true")
    g = sub.add_parser("gallery", help="example questions: composite PNGs and a page (5 per type)")
    g.add_argument("--data", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--tile", type=int, default=224, help="image tile size in the composites")
    hs = sub.add_parser("human-sheet", help="the human baseline for Lite: a page of its questions (no answers) and "
                        "a blank answer sheet, scored with run --answerer sheet")
    hs.add_argument("--data", required=True)
    hs.add_argument("--out", required=True)
    hs.add_argument("--tile", type=int, default=224, help="image tile size in the composites")
    gb = sub.add_parser("generate-build", help="Plan-k-Step-Generation set: inputs, every valid step state, "
                        "invalid states for calibration")
    gb.add_argument("--out", required=True)
    gb.add_argument("--seed", type=int, default=0)
    gb.add_argument("--ks", default="2-5", help="k values, e.g. 2-5")
    gb.add_argument("--per-k", type=int, default=20)
    gb.add_argument("--size", type=int, default=S.IMAGE_SIZE)
    gb.add_argument("--quiet", action="store_true")
    gc = sub.add_parser("generate-calibrate", help="calibrate a built generation set again (rewrites its manifest)")
    gc.add_argument("--data", required=True)
    gc.add_argument("--quiet", action="store_true")
    ga = sub.add_parser("generate-answers", help="answer folders: from the references (oracle, perhaps perturbed; "
                        "wrong at one turn) or from an image-generating model (http)")
    ga.add_argument("--answerer", required=True, help="oracle, wrong or http")
    ga.add_argument("--data", required=True)
    ga.add_argument("--out", required=True)
    ga.add_argument("--seed", type=int, default=0)
    ga.add_argument("--perturb", help="oracle/wrong: each image perturbed (jpeg85, shift1, resample2x, down2x, "
                    "bright+3, bright-3)")
    ga.add_argument("--protocol", default="multi-turn", help="http: multi-turn (each turn sees the model's own "
                    "previous image; the paper's) or single-shot (all k images from one request)")
    ga.add_argument("--endpoint", help="http: OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    ga.add_argument("--model", default="default", help="http: model name sent in the request")
    ga.add_argument("--api-key-env", help="http: name of an environment variable holding the API key")
    ga.add_argument("--timeout", type=float, default=300.0, help="http: seconds per request")
    ga.add_argument("--retries", type=int, default=4, help="http: retries after 429, 5xx, a timeout or a drop")
    ga.add_argument("--max-fail-share", type=float, default=0.1, help="http: stop once at least 3 cases failed and "
                    "they are more than this share of those asked")
    ga.add_argument("--quiet", action="store_true")
    gs = sub.add_parser("generate-score", help="score generated step images: DIR/<case id>/step1.png .. stepk.png")
    gs.add_argument("--answers", required=True)
    gs.add_argument("--data", default="data/reasoning_gen", help="the generation set (generate-build)")
    gs.add_argument("--out", help="report folder (default: runs/reasoning_gen/<name>)")
    gs.add_argument("--name", help="name in the report (default: the answers folder's name)")
    gs.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    from assembly_probe.answerers import AnswererError
    from assembly_probe.build import DataError
    from assembly_probe.genset import GenError
    from assembly_probe.human import SheetError

    cmds = {"build": cmd_build, "run": cmd_run, "gallery": cmd_gallery, "human-sheet": cmd_human_sheet, "generate-build": cmd_generate_build,
            "generate-calibrate": cmd_generate_calibrate, "generate-answers": cmd_generate_answers,
            "generate-score": cmd_generate_score}
    try:
        check_options(args)
        return cmds[args.cmd](args)
    except (AnswererError, DataError, GenError, SheetError, ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
