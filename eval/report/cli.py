"""The command line of the report (run by ``python -m eval.report``, see ``eval/report/__main__.py``).

CLI::

    python -m eval.report --tries A/tries.jsonl [--tries B/tries.jsonl ...] --out DIR [--name NAME ...]
    python -m eval.report --rebuild DIR [DIR ...]   # REPORT.md and pictures again from DIR/summary.json
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from eval.console import tolerant_output
from eval.report.markdown import _pct, _pct_rng
from eval.report.summary import ReportError
from eval.report.write import rebuild_report, write_report


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line on stderr, exit 2
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = _Parser(
        prog="python -m eval.report",
        description="Write a benchmark report (summary.json, per_config.csv, REPORT.md, groups.png, heatmap.png) "
                    "from one tries.jsonl per model; several models are compared side by side and paired.",
    )
    ap.add_argument("--tries", action="append", metavar="PATH",
                    help="a model's tries.jsonl (repeat for several models)")
    ap.add_argument("--out", metavar="DIR", help="output folder (created if needed)")
    ap.add_argument("--rebuild", nargs="+", metavar="DIR",
                    help="instead of --tries/--out: write REPORT.md and the pictures of these report folders again "
                         "from their summary.json as it is (its numbers, and what eval.run or eval.orin added: "
                         "run, device, telemetry) and the tries files it names; summary.json and per_config.csv "
                         "are left untouched")
    ap.add_argument("--name", action="append", metavar="NAME",
                    help="model name, one per --tries in the same order (default: the records' model field, "
                         "else the file's folder name)")
    ap.add_argument("--n-boot", type=int, default=5000, help="bootstrap redraws (default 5000)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    ap.add_argument("--allow-mixed-predicates", action="store_true",
                    help="report runs scored with different success predicate versions side by side "
                         "(refused by default: their numbers are not comparable)")
    tolerant_output()  # model names and paths the locale cannot encode are printed, never a traceback
    args = ap.parse_args(argv)
    if args.n_boot < 1:
        ap.error("--n-boot must be >= 1")
    if args.rebuild:
        if args.tries or args.out or args.name:
            ap.error("--rebuild takes report folders only (no --tries, --out or --name)")
        for d in args.rebuild:
            try:
                rebuild_report(d)
            except (ReportError, ValueError, OSError) as e:
                print(f"{ap.prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
                return 2
            print(f"report rebuilt in {d} (summary.json unchanged)")
        return 0
    if not args.tries or not args.out:
        ap.error("the following arguments are required: --tries, --out (or --rebuild DIR)")
    try:
        res = write_report(args.tries, args.out, names=args.name, n_boot=args.n_boot, seed=args.seed,
                           allow_mixed_predicates=args.allow_mixed_predicates)
    except (ReportError, ValueError, OSError) as e:
        msg = " ".join(str(e).split())
        print(f"{ap.prog}: error: {msg}", file=sys.stderr)
        return 2
    models = res["models"] if "models" in res else {res["model"]: res}
    for n, s in models.items():
        print(f"{n}: S {_pct_rng(s['S'], s['S_ci'])}, M {_pct(s['M'])}"
              + ("" if s["complete"] else f" (incomplete: missing {', '.join(s['missing'])})"))
    print(f"report written to {args.out}")
    return 0
