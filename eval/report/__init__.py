"""Reports of benchmark runs (spec BENCHMARK.md sections 2, 4, 5, 6 and 8).

From one or several ``tries.jsonl`` files (one file = one model) the package
writes, into an output folder, ``summary.json``, ``per_config.csv``,
``REPORT.md``, ``groups.png`` and ``heatmap.png`` (and ``latency.png`` where
the records hold per-query latencies).

- ``summary.py``: loading and validating tries files, the summary of one model
  and the paired comparison of two (fractions in 0..1, JSON-safe);
- ``markdown.py``: the REPORT.md text;
- ``plots.py``: the matplotlib pictures (matplotlib is imported lazily);
- ``write.py``: writing every file of a report into the output folder;
- ``cli.py`` and ``__main__.py``: the command line.

CLI::

    python -m eval.report --tries A/tries.jsonl [--tries B/tries.jsonl ...] --out DIR [--name NAME ...]
"""
from __future__ import annotations

from eval.report.cli import main
from eval.report.markdown import render_markdown
from eval.report.plots import plot_groups, plot_heatmap, plot_latency
from eval.report.summary import (
    FLAG_NAMES,
    N_WEAKEST,
    REQUIRED_FIELDS,
    ReportError,
    build_summary,
    load_tries,
    paired_summary,
    predicate_of,
)
from eval.report.write import write_report, write_text_atomic

__all__ = [
    "ReportError",
    "FLAG_NAMES",
    "load_tries",
    "build_summary",
    "paired_summary",
    "write_report",
    "render_markdown",
    "main",
    # also public in the single-module eval/report.py, re-exported here
    "REQUIRED_FIELDS",
    "N_WEAKEST",
    "predicate_of",
    "write_text_atomic",
    "plot_latency",
    "plot_groups",
    "plot_heatmap",
]
