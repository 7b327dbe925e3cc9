"""A run folder in vla-evaluation-harness's result format, with latency, hardware and energy beside success.

    python -m eval.export_vla_eval RUN --out DIR

Writes ``DIR/shape_assembly_aggregate.json`` (:func:`eval.import_vla_eval.export_run`: vla-eval 0.8.0's aggregate,
built by its own ResultCollector, plus ``latency_ms_per_query``, ``hardware``, ``energy_j_per_query``).
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.export_vla_eval", description=__doc__.split("\n\n")[0])
    p.add_argument("run", metavar="RUN", help="a run folder (eval.run / eval.orin --out)")
    p.add_argument("--out", required=True, metavar="DIR", help="where to write shape_assembly_aggregate.json")
    return p


def main(argv: list[str] | None = None) -> int:
    from eval.console import tolerant_output
    from eval.import_vla_eval import export_run
    from eval.records import RecordsError

    tolerant_output()
    args = build_parser().parse_args(argv)
    try:
        path = export_run(args.run, args.out)
    except (ValueError, RecordsError, OSError) as e:  # ImportRefused, a damaged record or file: one line
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
