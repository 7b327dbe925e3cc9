"""The device loop: evaluate a model with device defaults and profile it on the machine it runs on.

    make engines && python -m eval.orin --model octo-small     # one dev try of A01 -> runs/orin/octo-small
    python -m eval.orin --model octo-small --split test --setups all --tries 50 --out runs/orin_test

The same runner and options as ``python -m eval.run``, with device defaults:
the fastest backend available (a TensorRT engine where TensorRT and a GPU
exist, else ONNX Runtime), the device identified (Jetson module, L4T/JetPack,
power mode and jetson_clocks; or GPU and driver; or the CPU), and telemetry
(power per rail, clocks, temperatures; energy per query and per successful try)
sampled in the background while the tries run. The report adds a latency
section: per-query percentiles with warm-up apart, a histogram, time per
control step by stage, the device and the telemetry or why there is none.

``--replay-latency FILE`` delays every action by a latency drawn from a
measured profile (a tries.jsonl), so a CPU machine shows what a device's
latency would do to success (see eval.latency_replay).
"""

from __future__ import annotations

import argparse
import sys
import time

from eval import run as eval_run


OUT_ROOT = "runs/orin"  # where a run goes without --out: runs/orin/<model>


def build_parser() -> argparse.ArgumentParser:
    # the headline command names only the model: its run folder is the model's own under runs/orin (a second
    # run of the same request resumes it; another request there is refused by the run folder's identity)
    p = eval_run.build_parser(prog="python -m eval.orin", description=__doc__.split("\n\n")[0],
                              out_default=f"{OUT_ROOT}/<model>")
    d = p.add_argument_group("device")
    d.add_argument("--telemetry-interval", type=float, default=0.1, help="seconds between telemetry samples")
    return p


def default_out(model: str) -> str:
    """``runs/orin/<model>``; a policy named by import string (package.module:Class) by its class."""
    name = model.rsplit(":", 1)[-1] if ":" in model else model
    return f"{OUT_ROOT}/{''.join(c if c.isalnum() or c in '-_.' else '_' for c in name) or 'model'}"


def _fail(msg: str, code: int = 2) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.out is None:
        args.out = default_out(args.model)
        print(f"run folder: {args.out} (--out DIR for another)", file=sys.stderr)
    if not args.telemetry_interval > 0:
        return _fail("--telemetry-interval must be positive")
    from jetson.device import identify_device
    from jetson.telemetry import start_telemetry

    device = None
    telemetry = None

    def device_report(request, records: list[dict]) -> dict:
        """The device, its telemetry over this session's window and the backend, for eval.run's report."""
        nonlocal telemetry
        t1 = time.monotonic()
        queries = sum(int(r.get("infer_queries") or 0) for r in records)
        successes = sum(bool(r.get("success")) for r in records)
        # energy per query over this session's window: a resumed run's earlier tries were not measured
        telemetry = tel.summary(queries=queries, successes=successes, start=t0, end=t1)
        return {
            "device": _device_fields(device),
            "telemetry": {"available": telemetry.available, "source": telemetry.source, "reason": telemetry.reason,
                          "lines": telemetry.lines(), "detail": telemetry.to_dict()},
            "profile": {"backend": request.model.backend, "backend_reason": request.model.runtime_reason,
                        "precision": request.model.precision, "window_s": round(t1 - t0, 3)},
        }

    device = identify_device()
    print("; ".join(device.summary_lines()), file=sys.stderr)
    with start_telemetry(interval_s=args.telemetry_interval) as tel:
        t0 = time.monotonic()
        outcome = eval_run.run(args, device_default=True, report_extra=device_report)
    # a run with hung tries still gets its device report
    if outcome.rc not in (0, eval_run.EXIT_HUNG) or telemetry is None or outcome.summary is None:
        return outcome.rc
    lat = outcome.summary["secondary"]["latency_ms"] or {}
    if lat.get("p50") is not None:
        print(f"latency ms per query: mean {lat['mean']:.3g}, p50 {lat['p50']:.3g}, p90 {lat['p90']:.3g}, "
              f"p99 {lat['p99']:.3g} ({lat['count']} queries after warm-up); {telemetry.lines()[0]}")
    return outcome.rc


def _device_fields(device) -> dict:
    """The device as the report names it."""
    d = device.to_dict()
    fields = {"kind": d.get("kind"), "name": d.get("name")}
    if device.jetson is not None:
        j = d["jetson"]
        fields.update({k: j.get(k) for k in ("model", "l4t", "jetpack", "power_mode", "jetson_clocks")})
    for g in d.get("gpus") or ():
        fields.update(gpu=g.get("name"), driver=g.get("driver"), compute_capability=g.get("compute_capability"))
        break
    cpu = d.get("cpu") or {}
    fields.update(cpu=cpu.get("model"), cores=cpu.get("cores"))
    sw = d.get("software") or {}
    fields.update({k: sw.get(k) for k in ("cuda", "tensorrt", "onnxruntime", "jax", "torch") if sw.get(k)})
    fields["notes"] = "; ".join(d.get("notes") or ()) or None
    return fields


if __name__ == "__main__":
    sys.exit(main())
