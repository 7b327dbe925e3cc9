"""Assembly reasoning probe CLI.

    python -m eval.reasoning build --out data/reasoning                 # full set (seed 0)
    python -m eval.reasoning run --answerer oracle --data data/reasoning --out results/reasoning/oracle
    python -m eval.reasoning run --answerer http --endpoint http://jetson:8000/v1 --model NAME \\
        --data data/reasoning --out runs/reasoning/NAME [--lite]
    python -m eval.reasoning gallery --data data/reasoning --out results/reasoning/gallery
"""

from __future__ import annotations

import argparse
import os
import sys


def _ks(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-", 1)
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",") if x.strip()]


def cmd_build(args) -> int:
    from eval.reasoning import questions as Q
    from eval.reasoning.build import build

    types = Q.TYPES if args.types == "all" else tuple(t.strip() for t in args.types.split(","))
    bad = [t for t in types if t not in Q.TYPES]
    if bad:
        raise ValueError(f"unknown question type {bad[0]!r}; valid: {', '.join(Q.TYPES)}")
    ks = _ks(args.plan_k) if args.plan_k else []
    if any(not 1 <= k <= 8 for k in ks):
        raise ValueError("--plan-k values must lie in 1..8")
    m = build(args.out, seed=args.seed, per_type=args.per_type, lite=args.lite, types=types, plan_ks=ks,
              plan_per_k=args.plan_per_k, size=args.size, progress=not args.quiet)
    print(f"wrote {m['n_items']} questions, {m['n_images']} images ({m['n_image_refs']} references) to {args.out} "
          f"in {m['build_s']:.1f} s (render {m['render_s']:.1f} s)")
    print(f"sha256 {m['sha256']}")
    print(f"sha256_states {m['sha256_states']}")
    return 0


def cmd_run(args) -> int:
    from eval.reasoning.answerers import make_answerer
    from eval.reasoning.build import load
    from eval.reasoning.report import run_items, write_report

    answerer = make_answerer(args.answerer, seed=args.seed, endpoint=args.endpoint, model=args.model,
                             api_key=os.environ.get(args.api_key_env) if args.api_key_env else None,
                             timeout_s=args.timeout)
    items, manifest = load(args.data)
    if args.lite:
        items = [it for it in items if it["lite"]]
    if args.types:
        keep = set(args.types.split(","))
        items = [it for it in items if it["type"] in keep]
    if args.limit:
        items = items[: args.limit]
    if not items:
        raise ValueError("no questions selected")
    records = run_items(items, answerer, args.data, progress=not args.quiet)
    sweep = None
    if args.sweep_seeds:
        if args.answerer != "random":
            raise ValueError("--sweep-seeds applies to the random answerer only")
        from eval.reasoning.report import seed_sweep

        sweep = seed_sweep(items, args.data, manifest, range(args.seed, args.seed + args.sweep_seeds))
    s = write_report(records, args.answerer, manifest, args.out, sweep)
    for t, r in s["elementary"].items():
        print(f"{t:16s} {100 * r['accuracy']:6.1f}%  CI [{100 * r['ci'][0]:.1f}, {100 * r['ci'][1]:.1f}]  "
              f"chance {100 * r['chance']:.1f}%  critical {100 * (r['critical_accuracy'] or 0):.1f}%")
    for k, r in s["planning"].items():
        print(f"plan {k:3s}  exact {100 * r['exact']['rate']:5.1f}%  set {100 * r['set']['rate']:5.1f}%  "
              f"overlap {100 * r['overlap']['mean']:5.1f}%")
    print(f"unparseable {s['unparseable']}, errors {s['errors']}; report in {args.out}/REPORT.md")
    return 0


def cmd_gallery(args) -> int:
    from eval.reasoning.build import load
    from eval.reasoning.gallery import write_gallery

    items, _ = load(args.data)
    paths = write_gallery(items, args.data, args.out, tile=args.tile)
    print(f"wrote {len(paths)} example PNGs to {args.out}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.reasoning", description="Assembly reasoning probe.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="generate questions and render images")
    b.add_argument("--out", required=True)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--per-type", type=int, default=100)
    b.add_argument("--lite", type=int, default=20, help="first N per type form the Lite subset")
    b.add_argument("--types", default="all", help="comma-separated elementary types, or all")
    b.add_argument("--plan-k", default="1-8", help="k values, e.g. 1-8 or 1,3; empty for none")
    b.add_argument("--plan-per-k", type=int, default=20)
    b.add_argument("--size", type=int, default=256, help="image side in pixels")
    b.add_argument("--quiet", action="store_true")
    r = sub.add_parser("run", help="answer a built set and write a report")
    r.add_argument("--answerer", required=True, help="oracle, random or http")
    r.add_argument("--data", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--seed", type=int, default=0, help="random answerer seed")
    r.add_argument("--endpoint", help="http: OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    r.add_argument("--model", default="default", help="http: model name sent in the request")
    r.add_argument("--api-key-env", help="http: name of an environment variable holding the API key")
    r.add_argument("--timeout", type=float, default=120.0, help="http: seconds per request")
    r.add_argument("--sweep-seeds", type=int, default=0,
                   help="random: also run this many seeds and report how often each interval covers chance")
    r.add_argument("--lite", action="store_true", help="only the Lite subset")
    r.add_argument("--types", help="comma-separated types (plan for planning)")
    r.add_argument("--limit", type=int, help="first N selected questions only")
    r.add_argument("--quiet", action="store_true")
    g = sub.add_parser("gallery", help="example question composites (small PNGs)")
    g.add_argument("--data", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--tile", type=int, default=192, help="image tile size in the composites")
    args = p.parse_args(argv)
    from eval.reasoning.answerers import AnswererError
    from eval.reasoning.build import DataError

    try:
        return {"build": cmd_build, "run": cmd_run, "gallery": cmd_gallery}[args.cmd](args)
    except (AnswererError, DataError, ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
