"""Build everything this machine can run: ONNX exports always, TensorRT engines where a GPU and TensorRT exist.

    python -m engines.build            # what `make engines` runs
    python -m engines.build --precisions fp32,fp16 --batch-max 8
    python -m engines.build --models octo-small --checkpoint-octo-small ~/octo-small-1.5
    python -m engines.build --models octo-small --onnx-from DIR   # a Jetson: engines from graphs made on x86

Prints a table of what was built, where, and why anything was skipped.
Outputs go to build/engines/ (ignored by git). Octo (octo-small, octo-base) is
exported from a checkpoint when one is given (--checkpoint-octo-small DIR),
else from seeded random weights of the exact architecture, marked latency-only
in the table and in the ONNX metadata. Nothing is downloaded. ``--onnx-from DIR`` takes Octo's two graphs
exported elsewhere (``<model>_backbone.onnx``, ``<model>_sampler.onnx``, e.g. from an x86 machine with JAX)
instead of exporting them, so that a machine without JAX (the Jetson image) builds their TensorRT engines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

OUT = Path("build/engines")


def _bc_state_onnx(out: Path, args) -> list[tuple[str, Path, str]]:
    from engines.bc_mlp import DEFAULT_WEIGHTS, export_onnx, load
    from engines.onnx_utils import sha256_file

    if not DEFAULT_WEIGHTS.exists():
        raise Skipped(f"no weights at {DEFAULT_WEIGHTS}; train them with: python -m eval.training.train_bc")
    model, config, _ = load(DEFAULT_WEIGHTS)
    path = export_onnx(model, config, out / "bc_state.onnx", source=f"{DEFAULT_WEIGHTS.name} sha256 "
                       f"{sha256_file(DEFAULT_WEIGHTS)[:16]}")
    return [("onnx", path, "")]


def _octo_onnx(model: str):
    def export(out: Path, args) -> list[tuple[str, Path, str]]:
        if args.onnx_from:
            return _octo_exported(model, Path(args.onnx_from))
        from engines.optional import require

        for module in ("jax", "jax2onnx", "onnx"):
            require(module, "jax" if module == "jax" else "export")
        from engines.octo.checkpoint import load, resolve
        from engines.octo.config import PRESETS
        from engines.octo.export import export_octo, file_stem
        from engines.octo.params import init_params

        checkpoint = getattr(args, f"checkpoint_{model.replace('-', '_')}")
        if checkpoint:  # a given checkpoint must load; its errors are one line
            c = load(resolve(model, checkpoint), model=model, expect=PRESETS[model]())
            cfg, params, source, random = c.config, c.params, c.identity, False
        else:
            cfg = PRESETS[model]()
            params = init_params(cfg, args.seed, with_t5=False)
            source, random = f"random-weights:{model}:seed{args.seed}", True
        onnx = export_octo(cfg, params, out, file_stem(model), source=source, random_weights=random, progress=True)
        note = " (random weights: latency only)" if random else ""
        return [("onnx backbone", onnx.backbone, note), ("onnx sampler", onnx.sampler, note)]

    return export


def _octo_exported(model: str, folder: Path) -> list[tuple[str, Path, str]]:
    """Octo's two graphs as exported elsewhere, checked (ONNX checker, this project's export format); no JAX."""
    from engines.octo.export import EXPORT_FORMAT, file_stem
    from engines.onnx_utils import check_onnx_file, metadata

    rows = []
    for part in ("backbone", "sampler"):
        path = folder / f"{file_stem(model)}_{part}.onnx"
        if not path.is_file():
            raise FileNotFoundError(f"no {path}: export it on a machine with JAX (python -m engines.build --models "
                                    f"{model} --out DIR) and copy both graphs into {folder}")
        check_onnx_file(path)
        meta = metadata(path)
        if meta.get("format") != EXPORT_FORMAT:
            raise ValueError(f"{path} is not this project's export ({meta.get('format')!r}, expected {EXPORT_FORMAT!r})"
                             "; export it again with python -m engines.build")
        note = " (random weights: latency only)" if meta.get("latency_only") == "true" else ""
        rows.append((f"onnx {part}", path, f"{note} (exported elsewhere)"))
    return rows


class Skipped(Exception):
    """An artifact this machine cannot or need not build; the message is the reason shown."""


EXPORTS = {"bc-state": _bc_state_onnx, "octo-small": _octo_onnx("octo-small"), "octo-base": _octo_onnx("octo-base")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engines.build", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--models", default=",".join(EXPORTS), help=f"comma-separated, of: {', '.join(EXPORTS)}")
    p.add_argument("--precisions", default="fp32,fp16", help="TensorRT precisions (fp32, fp16, int8, fp8)")
    p.add_argument("--batch-max", type=int, default=1, help="largest batch of the optimisation profile")
    p.add_argument("--checkpoint-octo-small", metavar="DIR", help="octo-small-1.5 checkpoint (default: random "
                   "weights, latency only)")
    p.add_argument("--checkpoint-octo-base", metavar="DIR", help="octo-base-1.5 checkpoint (default: random weights)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--onnx-from", metavar="DIR", help="Octo's graphs exported elsewhere (<model>_backbone.onnx, "
                   "<model>_sampler.onnx): build their engines without JAX")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in EXPORTS]
    if unknown:
        print(f"error: unknown model {', '.join(unknown)}; valid: {', '.join(EXPORTS)}", file=sys.stderr)
        return 2
    if args.batch_max < 1:
        print(f"error: --batch-max must be at least 1, got {args.batch_max}", file=sys.stderr)
        return 2
    from engines import trt

    precisions = [x for x in args.precisions.split(",") if x]
    bad = [x for x in precisions if x not in trt.PRECISIONS]
    if bad:
        print(f"error: unknown precision {', '.join(bad)}; valid: {', '.join(trt.PRECISIONS)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    reason = trt.unavailable_reason()
    for name in models:
        try:
            built = EXPORTS[name](out, args)
        except Skipped as e:
            rows.append((name, "onnx", "skipped", str(e)))
            continue
        except Exception as e:  # noqa: BLE001 - reported in the table, the run goes on
            rows.append((name, "onnx", "failed", (str(e).strip().splitlines() or [type(e).__name__])[0]))
            continue
        for artifact, path, note in built:
            rows.append((name, artifact, "built", f"{path}{note}"))
        for artifact, path, _ in built:
            part = artifact.removeprefix("onnx").strip()
            for precision in precisions:
                label = f"tensorrt {precision}" + (f" {part}" if part else "")
                if reason:
                    rows.append((name, label, "skipped", reason))
                    continue
                try:
                    engine = trt.build_engine(path, out, path.stem, precision, args.batch_max,
                                              timing_cache=out / "timing.cache")
                    rows.append((name, label, "built", str(engine)))
                except Exception as e:  # noqa: BLE001
                    rows.append((name, label, "failed", (str(e).strip().splitlines() or [type(e).__name__])[0]))
    width = [max(len(r[i]) for r in rows + [("model", "artifact", "status", "where / why")]) for i in range(3)]
    print(f"{'model':<{width[0]}}  {'artifact':<{width[1]}}  {'status':<{width[2]}}  where / why")
    for r in rows:
        print(f"{r[0]:<{width[0]}}  {r[1]:<{width[1]}}  {r[2]:<{width[2]}}  {r[3]}")
    return 1 if any(r[2] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
