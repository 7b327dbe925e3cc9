"""The command line of the results page (``python -m eval.site``)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from eval.console import tolerant_output
from eval.report.summary import ReportError
from eval.report.write import write_text_atomic
from eval.site.published import read_published
from eval.site.render import render_page
from eval.site.runs import SiteError, load_runs
from eval.site.spec import SPEC_FILE, read_spec


# the page's screenshots in docs/ (docs/results-page.md shows them): file, window width and height in CSS pixels
SCREENSHOTS = (("results_page.png", 1400, 1800), ("results_page_500px.png", 500, 2200))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line on stderr, exit 2
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_site(run_dirs: Sequence[str | Path], out_dir: str | Path, *, spec: str | Path = SPEC_FILE,
               n_boot: int = 5000, seed: int = 0) -> tuple[Path, list[str]]:
    """Write ``out_dir/index.html`` from the run folders and the spec (its text, and section 8's published
    numbers); returns its path and notes on folders left out."""
    runs, notes = load_runs(run_dirs)
    spec_doc = read_spec(spec)
    html = render_page(runs, spec_doc, read_published(spec_doc), n_boot=n_boot, seed=seed)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SiteError(f"{out}: cannot write the page ({e.strerror or e})") from None
    path = out / "index.html"
    write_text_atomic(path, html)  # a full disk leaves the previous page whole, and no partial file
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
    ap.add_argument("--spec", default=str(SPEC_FILE), metavar="MD",
                    help="the benchmark spec: its sections are shown and section 8's published numbers quoted "
                         "(default: docs/BENCHMARK.md)")
    ap.add_argument("--screenshots", metavar="DIR",
                    help="also write DIR/" + " and DIR/".join(n for n, *_ in SCREENSHOTS) +
                         ": the top of the page in headless Chromium at " +
                         " and ".join(f"{w} px" for _, w, _ in SCREENSHOTS) + " (needs the package chromium)")
    ap.add_argument("--n-boot", type=int, default=5000, help="bootstrap redraws of the paired differences (5000)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    tolerant_output()  # model names and paths the locale cannot encode are printed, never a traceback
    args = ap.parse_args(argv)
    if args.n_boot < 1:
        ap.error("--n-boot must be >= 1")
    try:
        path, notes = build_site(args.runs, args.out, spec=args.spec, n_boot=args.n_boot, seed=args.seed)
    except (SiteError, ReportError) as e:
        print(f"{ap.prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    for n in notes:
        print(f"left out {n}", file=sys.stderr)
    size = path.stat().st_size
    print(f"results page written to {path} ({size / 1024:.0f} KiB)")
    if args.screenshots:
        from eval.site.browser import BrowserError, screenshot

        try:
            Path(args.screenshots).mkdir(parents=True, exist_ok=True)
            for name, width, height in SCREENSHOTS:
                shot = screenshot(path, Path(args.screenshots) / name, width, height)
                print(f"screenshot at {width} px written to {shot}")
        except (BrowserError, OSError) as e:
            print(f"{ap.prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
    return 0
