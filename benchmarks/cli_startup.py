"""CLI start-up: how long every command-line tool of the project takes to answer ``--help`` and to refuse
an unknown option (target: under 2 s each), timed from process start to exit, best of ``--repeats``.

    python -m benchmarks.cli_startup             # every CLI, 3 repeats
    python -m benchmarks.cli_startup --quick     # 1 repeat

The tools are found as the test suite finds them: every module of the project's packages with a
``__main__`` guard.
"""

from __future__ import annotations

import pkgutil
import re
import subprocess
import sys
import time
from typing import Sequence

from benchmarks.common import ROOT, machine, parser, print_table, progress, result_path, run_main, write_result

NAME = "cli_startup"
MODULE = "benchmarks.cli_startup"
PACKAGES = ("binomial_stats", "env", "eval", "engines", "jetson", "benchmarks", "assembly_probe")
TARGET_S = 2.0
MAIN_GUARD = re.compile(r"""^\s*if\s+__name__\s*==\s*["']__main__["']\s*:""", re.M)


def cli_modules() -> list[str]:
    """Modules with a __main__ guard, found from the files (nothing is imported)."""
    found = []

    def walk(folder, prefix):
        for info in pkgutil.iter_modules([str(folder)]):
            name = f"{prefix}.{info.name}"
            source = folder / info.name / "__init__.py" if info.ispkg else folder / f"{info.name}.py"
            if info.ispkg:  # a package's __main__.py is listed by iter_modules as its module __main__
                walk(folder / info.name, name)
            if source.is_file() and MAIN_GUARD.search(source.read_text(encoding="utf-8", errors="replace")):
                found.append(prefix if info.name == "__main__" else name)  # a package's __main__: python -m pkg

    for pkg in PACKAGES:
        walk(ROOT / pkg, pkg)
    return sorted(found)


def _time(args: list[str]) -> tuple[float, int]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, timeout=300)
    return time.monotonic() - t0, proc.returncode


def _main(argv: Sequence[str] | None) -> int:
    ap = parser(MODULE, __doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs of each command; the best counts (default 3)")
    args = ap.parse_args(argv)
    repeats = 1 if args.quick else max(1, args.repeats)
    result_path(NAME, args.out_dir, args.quick)  # a --quick result under results/ is refused before anything is timed
    mach = machine()
    modules = cli_modules()
    rows, table = [], []
    bar = progress(total=len(modules) * 2 * repeats, desc="commands", disable=args.no_progress)
    for m in modules:
        row = {"module": m}
        for kind, extra in (("help", ["--help"]), ("bad_option", ["--no-such-option"])):
            times, codes = [], set()
            for _ in range(repeats):
                t, rc = _time([m, *extra])
                times.append(t)
                codes.add(rc)
                bar.update()
            row[f"{kind}_s"] = round(min(times), 3)
            row[f"{kind}_exit"] = sorted(codes)
        rows.append(row)
        table.append([m, row["help_s"], row["bad_option_s"], ",".join(map(str, row["bad_option_exit"]))])
    bar.close()
    worst = max(max(r["help_s"], r["bad_option_s"]) for r in rows)
    results = {"target_s": TARGET_S, "repeats": repeats, "worst_s": worst,
               "over_target": [r["module"] for r in rows if max(r["help_s"], r["bad_option_s"]) >= TARGET_S],
               "commands": rows}
    print_table("CLI start-up (best of repeats)", ["module", "--help s", "bad option s", "bad option exit"], table)
    write_result(NAME, args.out_dir, MODULE, argv, args.quick, results, mach)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
