"""Round trip minus server compute on loopback: what the WebSocket costs a served octo-small query.

    python -m benchmarks.remote_latency                 # -> results/benchmarks/remote_latency.json
    python -m benchmarks.remote_latency --quick         # seconds, the tiny test Octo in-process: numbers meaningless

``python -m eval.serve --model octo-small --random-weights --backend jax`` runs in its own process (as on a
device); the client (:class:`eval.remote.client.RemotePolicy`, profile octo-small) drives batch 1 and batch 8
(scenes spawned from one policy: one message and one engine call per step for all of them) with synthetic
frames at the cameras' sizes (256x256, 128x128), and keeps per model query the round trip at the client and the
server's own compute time from the reply (``server_timing.infer_ms``); transport = round trip - compute.
Steps served from the queued chunk make no round trip and are not counted. Target: transport <= 5% of the
query's compute for octo-small at batch 1 (p50). Random weights: latency only.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Sequence

import numpy as np

from benchmarks.common import BenchmarkError, machine, parser, print_table, run_main, stats_ms, write_result

TARGET_SHARE = 0.05


def _start_server(protocol: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "eval.serve", "--model", "octo-small", "--random-weights",
                             "--backend", "jax", "--protocol", protocol, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        raise BenchmarkError(f"eval.serve did not start: {proc.stderr.read().strip().splitlines()[-1:]}")
    return proc, line.split(" on ")[1].split()[0]


def measure(url: str, protocol: str, batch: int, queries: int, warmup: int, frame_sizes) -> dict:
    from eval.policies.base import query_members
    from eval.remote.client import RemotePolicy

    lead = RemotePolicy(url, protocol, "octo-small")
    members = [lead] + [lead.spawn() for _ in range(batch - 1)]
    lead.prepare_batch(batch)
    for i, m in enumerate(members):
        m.reset("put the circle in its hole", seed=i)
    rng = np.random.default_rng(0)
    frames = {"third_person": rng.integers(0, 255, (*frame_sizes[0], 3), dtype=np.uint8),
              "wrist": rng.integers(0, 255, (*frame_sizes[1], 3), dtype=np.uint8)}
    step = 0
    while len(lead.remote_ms) < warmup + queries:
        images = frames if lead.reads_observation(step) else None
        query_members(members, [{"images": images, "proprio": np.zeros(9, np.float32)} for _ in members])
        step += 1
    lead.close()
    kept = lead.remote_ms[warmup:]
    rtt = [r for r, _ in kept]
    server = [s for _, s in kept]
    transport = [r - s for r, s in kept]
    out = {"batch": batch, "queries": len(kept), "rtt_ms": stats_ms(rtt), "server_ms": stats_ms(server),
           "transport_ms": stats_ms(transport)}
    out["transport_share_p50"] = round(float(np.median(transport)) / float(np.median(server)), 4)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("benchmarks.remote_latency", __doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=30, help="timed model queries per batch size")
    p.add_argument("--protocol", default="openpi", help="openpi or vla-eval")
    args = p.parse_args(argv)
    if args.queries < 1:
        raise BenchmarkError(f"--queries must be at least 1, got {args.queries}")
    from eval.remote.wire import check_protocol

    try:
        check_protocol(args.protocol)
    except ValueError as e:
        raise BenchmarkError(str(e)) from None
    mach = machine()
    proc = server = None
    if args.quick:  # the tiny test Octo in this process: checks the benchmark runs, in seconds
        from engines.octo.testing import tiny_engine
        from eval.request import make_policy
        from eval.serve import Server, ServedModel

        server = Server(ServedModel(make_policy("octo-small", engine=tiny_engine(1)), "octo-small"), args.protocol)
        url, batches, queries, warmup, sizes = server.url, (1, 2), 3, 1, ((32, 32), (16, 16))
    else:
        proc, url = _start_server(args.protocol)
        batches, queries, warmup, sizes = (1, 8), args.queries, 3, ((256, 256), (128, 128))
    try:
        t0 = time.monotonic()
        rows = [measure(url, args.protocol, b, queries, warmup, sizes) for b in batches]
    finally:
        if server is not None:
            server.close()
        if proc is not None:
            proc.kill()
            proc.wait()
    print_table(f"octo-small served on loopback ({args.protocol}), ms per model query",
                ["batch", "n", "rtt p50", "rtt p99", "server p50", "server p99", "transport p50", "transport p99",
                 "transport/compute"],
                [[r["batch"], r["queries"], r["rtt_ms"]["p50"], r["rtt_ms"]["p99"], r["server_ms"]["p50"],
                  r["server_ms"]["p99"], r["transport_ms"]["p50"], r["transport_ms"]["p99"],
                  r["transport_share_p50"]] for r in rows])
    b1 = rows[0]
    results = {"model": "octo-small", "weights": "random (latency only)", "backend": "jax (CPU)",
               "protocol": args.protocol, "transport": "WebSocket on loopback (127.0.0.1)", "rows": rows,
               "target": f"transport <= {TARGET_SHARE:.0%} of the query's compute at batch 1 (p50)",
               "target_met": bool(b1["transport_share_p50"] <= TARGET_SHARE), "wall_s": round(time.monotonic() - t0, 1)}
    print(f"batch 1: transport {b1['transport_ms']['p50']:.3g} ms = {100 * b1['transport_share_p50']:.2f}% of "
          f"compute {b1['server_ms']['p50']:.4g} ms (target <= {TARGET_SHARE:.0%}: "
          f"{'met' if results['target_met'] else 'NOT met'})")
    write_result("remote_latency", args.out_dir, "benchmarks.remote_latency", argv, args.quick, results, mach)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None))
