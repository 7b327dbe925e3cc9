"""Build everything this machine can run: ONNX exports always, TensorRT engines where a GPU and TensorRT exist.

    python -m engines.build            # what `make engines` runs
    python -m engines.build --precisions fp32,fp16 --batch-max 8

Prints a table of what was built, where, and why anything was skipped.
Outputs go to build/engines/ (ignored by git).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

OUT = Path("build/engines")


def _bc_state_onnx(out: Path) -> tuple[str, str]:
    from engines.bc_mlp import DEFAULT_WEIGHTS, export_onnx, load
    from engines.onnx_utils import sha256_file

    if not DEFAULT_WEIGHTS.exists():
        return "skipped", f"no weights at {DEFAULT_WEIGHTS}; train them with: python -m eval.train_bc"
    model, config, _ = load(DEFAULT_WEIGHTS)
    path = export_onnx(model, config, out / "bc_state.onnx", source=f"{DEFAULT_WEIGHTS.name} sha256 "
                       f"{sha256_file(DEFAULT_WEIGHTS)[:16]}")
    return "built", str(path)


EXPORTS = {"bc-state": _bc_state_onnx}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engines.build", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--precisions", default="fp32,fp16", help="TensorRT precisions (fp32, fp16, int8, fp8)")
    p.add_argument("--batch-max", type=int, default=1, help="largest batch of the optimisation profile")
    args = p.parse_args(argv)
    from engines import trt

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, export in EXPORTS.items():
        try:
            status, where = export(out)
        except Exception as e:  # noqa: BLE001 - reported in the table, the run goes on
            status, where = "failed", str(e).splitlines()[0]
        rows.append((name, "onnx", status, where))
        if status != "built":
            continue
        reason = trt.unavailable_reason()
        for precision in args.precisions.split(","):
            if reason:
                rows.append((name, f"tensorrt {precision}", "skipped", reason))
                continue
            try:
                engine = trt.build_engine(where, out, name.replace("-", "_"), precision, args.batch_max,
                                          timing_cache=out / "timing.cache")
                rows.append((name, f"tensorrt {precision}", "built", str(engine)))
            except Exception as e:  # noqa: BLE001
                rows.append((name, f"tensorrt {precision}", "failed", str(e).splitlines()[0]))
    width = [max(len(r[i]) for r in rows + [("model", "artifact", "status", "where / why")]) for i in range(3)]
    print(f"{'model':<{width[0]}}  {'artifact':<{width[1]}}  {'status':<{width[2]}}  where / why")
    for r in rows:
        print(f"{r[0]:<{width[0]}}  {r[1]:<{width[1]}}  {r[2]:<{width[2]}}  {r[3]}")
    return 1 if any(r[2] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
