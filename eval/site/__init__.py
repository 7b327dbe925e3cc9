"""The results page: the published page's tables and charts from any set of run folders.

``python -m eval.site --runs DIR [DIR ...] --out SITE`` writes ``SITE/index.html``: one self-contained
page (inline CSS, JS and SVG; nothing fetched, it works offline from disk) with the leaderboard by the
published page's ranking rules, success by task group and by difficulty with bootstrap ranges, every
setup per run as a heatmap whose cells show k/n (hover or tap: "k/n [lo, hi]", Wilson 95%), secondary
metrics, the three arms, the full board, latency CDFs with the device named, paired differences of runs
that share a task list, the spec's published numbers (docs/BENCHMARK.md section 8, quoted as printed;
what is computed from them is labelled "computed") as "published (Orin)" beside "here", the benchmark's
own sections (the task, the setups, scoring, splits, tracks, models and status, known limits, versions),
and every run's machine, task-list and weights sha256, predicate version and command line.

- ``runs.py``: run folders, the ranking rules and the page's sections of runs;
- ``spec.py``: docs/BENCHMARK.md's sections and Markdown; ``published.py``: section 8's numbers;
- ``render.py``: the HTML;
- ``cli.py`` / ``__main__.py``: the command line.

A DIR that is not itself a run folder is searched for run folders below it (``--runs results`` builds
the page of every committed run; comparisons of several models are left out and listed).
"""
from __future__ import annotations

from eval.site.cli import build_site, main
from eval.site.published import read_published
from eval.site.runs import SiteError, leaderboard, load_run, load_runs, run_status
from eval.site.spec import read_spec

__all__ = ["build_site", "main", "SiteError", "leaderboard", "read_published", "read_spec", "load_run", "load_runs",
           "run_status"]
