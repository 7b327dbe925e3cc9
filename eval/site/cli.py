"""The command line of the results page (``python -m eval.site``)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from eval.report.summary import ReportError
from eval.site.render import render_page
from eval.site.runs import PUBLISHED_FILE, SiteError, load_published, load_runs


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line on stderr, exit 2
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_site(run_dirs: Sequence[str | Path], out_dir: str | Path, *, published: str | Path = PUBLISHED_FILE,
               n_boot: int = 5000, seed: int = 0) -> tuple[Path, list[str]]:
    """Write ``out_dir/index.html`` from the run folders; returns its path and notes on folders left out."""
    runs, notes = load_runs(run_dirs)
    pub = load_published(published)
    html = render_page(runs, pub, n_boot=n_boot, seed=seed)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        path = out / "index.html"
        tmp = out / ".index.partial.html"
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        raise SiteError(f"{out}: cannot write the page ({e.strerror or e})") from None
    return path, notes


def main(argv: Sequence[str] | None = None) -> int:
    ap = _Parser(
        prog="python -m eval.site",
        description="Build one self-contained results page (SITE/index.html: leaderboard, success by group and "
                    "difficulty, every setup, secondary metrics, three arms, full board, latency, paired "
                    "differences, published numbers) from run folders. A folder that is not a run folder is "
                    "searched for run folders below it.")
    ap.add_argument("--runs", nargs="+", required=True, metavar="DIR", help="run folders (or folders holding them)")
    ap.add_argument("--out", required=True, metavar="SITE", help="output folder; the page is SITE/index.html")
    ap.add_argument("--published", default=str(PUBLISHED_FILE), metavar="JSON",
                    help="the published numbers (default: eval/site/published.json, spec section 8)")
    ap.add_argument("--n-boot", type=int, default=5000, help="bootstrap redraws of the paired differences (5000)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    args = ap.parse_args(argv)
    if args.n_boot < 1:
        ap.error("--n-boot must be >= 1")
    try:
        path, notes = build_site(args.runs, args.out, published=args.published, n_boot=args.n_boot, seed=args.seed)
    except (SiteError, ReportError) as e:
        print(f"{ap.prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    for n in notes:
        print(f"left out {n}", file=sys.stderr)
    size = path.stat().st_size
    print(f"results page written to {path} ({size / 1024:.0f} KiB)")
    return 0
