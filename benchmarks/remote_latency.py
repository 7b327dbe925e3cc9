"""Round trip minus server compute on loopback: what the transport costs a served model's query.

    python -m benchmarks.remote_latency                 # -> results/benchmarks/remote_latency.json
    python -m benchmarks.remote_latency --quick         # seconds, the tiny test Octo in-process: numbers meaningless

Each model is served by ``python -m eval.serve`` in its own process (as on a device): octo-small with random
weights on JAX at batch 1 and batch 8 (scenes spawned from one policy: one message and one engine call per step
for all of them) with synthetic frames at the cameras' sizes (256x256, 128x128), and bc-state on ONNX Runtime at
batch 1 over both protocols with a real scene state. The client is :class:`eval.remote.client.RemotePolicy`
with the model's native profile; per model query it keeps the round trip at the client and the server's own
compute time from the reply (``server_timing.infer_ms``); transport = round trip - compute. The policy's
first queries are warm-up (``Policy.warmup_queries``) and are left out, as a run's summary leaves them out; steps
served from a queued chunk make no round trip and are not counted. Per row: p50/p99 of each, the transport's
p50 as a share of the compute's p50, and its share of the round-trip time (summed, as ``summary.json``'s
``served.transport_share_of_rtt``). Target: transport <= 5% of the compute for octo-small at batch 1 (p50).
bc-state computes in about a millisecond, so its transport is most of its round trip: reported, no target.
``results.conditions`` says whether the machine was loaded when the run began (1-minute load average at or
above half the usable cores): loaded numbers are not quiet-machine numbers. Random weights: latency only.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Sequence

import numpy as np

from benchmarks.common import BenchmarkError, machine, parser, print_table, run_main, stats_ms, write_result

TARGET_SHARE = 0.05
LOADED_PER_CORE = 0.5  # a 1-minute load average at start of half a core per usable core or more: "loaded"


def _start_server(model: str, backend: str, protocol: str) -> tuple[subprocess.Popen, str]:
    extra = ["--random-weights"] if model.startswith("octo") else []
    proc = subprocess.Popen([sys.executable, "-m", "eval.serve", "--model", model, *extra, "--backend", backend,
                             "--protocol", protocol, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        raise BenchmarkError(f"eval.serve did not start: {proc.stderr.read().strip().splitlines()[-1:]}")
    return proc, line.split(" on ")[1].split()[0]


def _bc_state_observation() -> dict:
    from env import make_env

    env = make_env("A01", obs_mode="state")
    try:
        env.reset(seed=0)
        return {"state": {k: v[0] for k, v in env.unwrapped.task_state().items()}}
    finally:
        env.close()


def measure(url: str, protocol: str, profile: str, batch: int, queries: int, observation) -> dict:
    """``queries`` timed model queries of ``batch`` scenes (after the policy's warm-up), as one row."""
    from eval.policies.base import query_members
    from eval.remote.client import RemotePolicy
    from eval.report.summary import served_latency

    lead = RemotePolicy(url, protocol, profile)
    members = [lead] + [lead.spawn() for _ in range(batch - 1)]
    lead.prepare_batch(batch)
    for i, m in enumerate(members):
        m.reset("put the circle in its hole", seed=i)
    step = 0
    while len(lead.remote_latency()["rtt_ms"]) < queries:
        query_members(members, [observation(lead.reads_observation(step)) for _ in members])
        step += 1
    lead.close()
    times = lead.remote_latency()
    out = {"model": profile, "protocol": protocol, "batch": batch, "queries": len(times["rtt_ms"]),
           "warmup_queries": len(lead.remote_latency(warmup=True)["rtt_ms"]),
           "rtt_ms": stats_ms(times["rtt_ms"]), "server_ms": stats_ms(times["server_ms"]),
           "transport_ms": stats_ms(times["transport_ms"])}
    out["transport_share_of_compute_p50"] = round(out["transport_ms"]["p50"] / out["server_ms"]["p50"], 4)
    out["transport_share_of_rtt"] = round(served_latency([{"remote_ms": times}])["transport_share_of_rtt"], 4)
    return out


def conditions(mach: dict) -> str:
    load, cores = (mach.get("load_average_start") or [None])[0], mach.get("usable_cores") or 1
    if load is None:
        return "unknown (no load average on this OS)"
    state = "loaded" if load >= LOADED_PER_CORE * cores else "quiet"
    return f"{state} (1-minute load average {load:g} on {cores} usable cores at the start)"


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("benchmarks.remote_latency", __doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=30, help="timed octo-small queries per batch size (bc-state: "
                                                           "ten times as many)")
    p.add_argument("--protocol", default="openpi", help="the protocol of the octo-small rows: openpi or vla-eval")
    args = p.parse_args(argv)
    if args.queries < 1:
        raise BenchmarkError(f"--queries must be at least 1, got {args.queries}")
    from eval.remote.wire import SERVED_PROTOCOLS

    if args.protocol not in SERVED_PROTOCOLS:
        raise BenchmarkError(f"--protocol must be one of {', '.join(SERVED_PROTOCOLS)}, got {args.protocol!r}")
    mach = machine()
    rng = np.random.default_rng(0)
    sizes = ((32, 32), (16, 16)) if args.quick else ((256, 256), (128, 128))
    frames = {"third_person": rng.integers(0, 255, (*sizes[0], 3), dtype=np.uint8),
              "wrist": rng.integers(0, 255, (*sizes[1], 3), dtype=np.uint8)}

    def camera_obs(reads: bool) -> dict:
        return {"images": frames if reads else None, "proprio": np.zeros(9, np.float32)}

    state = _bc_state_observation()
    # (model, backend, protocol, batch, queries, observation)
    n = 3 if args.quick else args.queries
    plan = [("octo-small", "jax", args.protocol, b, n, camera_obs) for b in ((1, 2) if args.quick else (1, 8))]
    plan += [("bc-state", "ort", proto, 1, 10 * n, lambda reads: state) for proto in SERVED_PROTOCOLS]
    rows = []
    t0 = time.monotonic()
    for model, backend, protocol, batch, queries, obs in plan:
        proc = server = None
        try:
            if args.quick and model == "octo-small":  # the tiny test Octo in this process: seconds
                from engines.octo.testing import tiny_octo
                from eval.request import make_policy
                from eval.serve import Server, ServedModel

                server = Server(ServedModel(make_policy("octo-small", engine=tiny_octo(1)), "octo-small"), protocol)
                url = server.url
            else:
                proc, url = _start_server(model, backend, protocol)
            rows.append({"backend": f"{backend} (CPU)", **measure(url, protocol, model, batch, queries, obs)})
        finally:
            if server is not None:
                server.close()
            if proc is not None:
                proc.kill()
                proc.wait()
    print_table("served on loopback, ms per model query (warm-up queries left out)",
                ["model", "protocol", "batch", "n", "rtt p50", "rtt p99", "server p50", "transport p50",
                 "transport p99", "transport/compute p50", "transport/rtt"],
                [[r["model"], r["protocol"], r["batch"], r["queries"], r["rtt_ms"]["p50"], r["rtt_ms"]["p99"],
                  r["server_ms"]["p50"], r["transport_ms"]["p50"], r["transport_ms"]["p99"],
                  r["transport_share_of_compute_p50"], r["transport_share_of_rtt"]] for r in rows])
    b1 = rows[0]
    results = {"weights": "octo-small: random (latency only); bc-state: the shipped weights",
               "transport": "WebSocket on loopback (127.0.0.1)", "conditions": conditions(mach), "rows": rows,
               "target": f"transport <= {TARGET_SHARE:.0%} of the query's compute for octo-small at batch 1 (p50)",
               "target_met": bool(b1["transport_share_of_compute_p50"] <= TARGET_SHARE),
               "wall_s": round(time.monotonic() - t0, 1)}
    print(f"octo-small batch 1: transport {b1['transport_ms']['p50']:.3g} ms = "
          f"{100 * b1['transport_share_of_compute_p50']:.2f}% of compute {b1['server_ms']['p50']:.4g} ms (target <= "
          f"{TARGET_SHARE:.0%}: {'met' if results['target_met'] else 'NOT met'}); {results['conditions']}")
    write_result("remote_latency", args.out_dir, "benchmarks.remote_latency", argv, args.quick, results, mach)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None))
