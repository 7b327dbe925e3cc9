"""``make engines`` timed by stage: a build from nothing, then the same build again with nothing changed.

Both builds are ``python -m engines.build`` in a fresh process, into a temporary output folder with a
temporary cache (``SAB_CACHE_DIR``: ONNX Runtime's rewritten graphs, the scene's decimated meshes) and a
temporary folder for the calibration recordings, so that the first build exports, optimises, records its
calibration queries (the simulator) and quantizes everything, and the second finds it all done. Each row
is the build's own stage table (``build_stages.json``: export, optimise, calibration recording, quantise,
tensorrt) and its wall time from the outside (imports included).

    python -m benchmarks.engines_build           # what `make engines` builds (minutes, a quiet machine)
    python -m benchmarks.engines_build --quick   # bc-state only: checks it works, numbers meaningless
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from benchmarks.common import BenchmarkError, machine, parser, print_table, run_main, write_result

NAME = "engines_build"
MODULE = "benchmarks.engines_build"
FRESH_TARGET_S = 120.0
UNCHANGED_TARGET_S = 11.0  # issue #44: "make engines unchanged weights: <= 11 s as now"


def build_once(extra: Sequence[str], out: Path, cache: Path, queries: Path) -> dict:
    from engines.build import STAGE_TIMES_FILE

    cmd = [sys.executable, "-m", "engines.build", "--out", str(out), "--queries-dir", str(queries), *extra]
    t0 = time.monotonic()
    done = subprocess.run(cmd, env={**os.environ, "SAB_CACHE_DIR": str(cache)}, capture_output=True, text=True)
    wall = round(time.monotonic() - t0, 2)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise BenchmarkError(f"{' '.join(cmd[1:])} failed ({done.returncode}): {' | '.join(tail)}")
    stages = json.loads((out / STAGE_TIMES_FILE).read_text())
    return {"wall_s": wall, **stages}


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(MODULE, __doc__.split("\n\n")[0])
    p.add_argument("--models", help="engines.build --models (default: all, as make engines; quick: bc-state)")
    p.add_argument("--released-weights", action="store_true", help="build Octo from its released weights (the Hub "
                   "or its cache); default: --random-weights, the same graphs and sizes, on machines without them")
    args = p.parse_args(argv)
    extra = ["--models", args.models or ("bc-state" if args.quick else "")] if (args.models or args.quick) else []
    if not args.released_weights:
        extra.append("--random-weights")
    mach = machine()
    with tempfile.TemporaryDirectory(prefix="sab-engines-build-") as tmp:
        tmp = Path(tmp)
        runs = {}
        for label in ("fresh", "unchanged"):
            runs[label] = build_once(extra, tmp / "engines", tmp / "cache", tmp / "queries")
    results = {"command": " ".join(["python -m engines.build", *extra]) or "python -m engines.build",
               "fresh": runs["fresh"], "unchanged": runs["unchanged"],
               "targets_s": {"fresh": FRESH_TARGET_S, "unchanged": UNCHANGED_TARGET_S},
               "meets": {"fresh": runs["fresh"]["wall_s"] <= FRESH_TARGET_S,
                         "unchanged": runs["unchanged"]["wall_s"] <= UNCHANGED_TARGET_S}}
    stages = list(runs["fresh"]["stages_s"])
    print_table(f"make engines by stage, s (targets: fresh <= {FRESH_TARGET_S:g}, unchanged <= "
                f"{UNCHANGED_TARGET_S:g})", ["build", "wall", "inside", *stages],
                [[label, r["wall_s"], r["total_s"], *(r["stages_s"][s] for s in stages)] for label, r in runs.items()])
    write_result(NAME, args.out_dir, MODULE, argv, args.quick, results, mach)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None))
