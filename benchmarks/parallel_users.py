"""Effective parallelism and toolkit overhead on K users of the v1.base shape.

Starts `stub_openai_server.py` in its own process (its work never competes with the
measured client for the GIL) with a fixed latency (default 0.5 s), synthesizes K users of the
paper's v1.base shape cut to 2 periods (period 0 and one update period), and evaluates them
with `concurrency = K` on the toolkit's thin `openai` client, DSPy cache off, fresh run
directories. For each run it prints

    effective parallelism = (LLM calls x latency) / wall          target >= 0.8 x K
    toolkit overhead/call = (wall - calls x latency / concurrency) / calls
    net of the stub       = overhead/call - (stub's own time beyond latency) / calls / concurrency
                                                                            target <= 5 ms

first for one user at concurrency 1 (the sequential overhead), then for K = 8, 32, 64, and
the largest number of requests the stub server saw in flight at once (so a run that never
reached K concurrent calls shows up), and the CPU time the measured process spent per call
(on a shared machine wall-time overhead includes waiting for a core; CPU time does not).
One run prints every figure:

    .venv/bin/python benchmarks/parallel_users.py [--latency 0.5] [--users 8,32,64]
        [--policy in_context] [--profile FILE]

`--profile FILE` writes a cProfile of the sequential run to FILE (it runs in the main thread,
the only one cProfile sees; the stub's latency shows up as `recv`, the rest is the toolkit's).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from eval_throughput import role_lms, stub_server_class  # noqa: E402

from evolve.core.paths import use_toolkit_caches  # noqa: E402
from evolve.simulator.evaluation import EpisodeConfig, run_evaluation  # noqa: E402
from evolve.simulator.synthesis.offline import synthesize_environment  # noqa: E402
from evolve.simulator.synthesis.presets import PRESETS
from memory_policies import build_policy  # noqa: E402

PARALLELISM_TARGET = 0.8  # x K
OVERHEAD_TARGET_MS = 5.0


def stub_stats(base_url: str, reset: bool = False) -> dict:
    root = base_url.removesuffix("/v1")
    if reset:
        request = urllib.request.Request(f"{root}/stats/reset", data=b"{}", method="POST")
    else:
        request = urllib.request.Request(f"{root}/stats")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def v1_base_users(count: int, seed: int = 0):
    """K users of the v1.base shape with 2 periods: period 0 plus one update period."""
    config = PRESETS["v1.base"].model_copy(update={"num_periods": 1})
    return synthesize_environment(config, seed=seed, num_users=count)


def measure(env, args: argparse.Namespace, base_url: str, concurrency: int, profile=None):
    lms = role_lms(base_url, "openai")
    config = EpisodeConfig(
        rounds_initial=PRESETS["v1.base"].rounds_initial,
        rounds_update=PRESETS["v1.base"].rounds_update,
        concurrency=concurrency,
        seed=0,
    )
    stub_stats(base_url, reset=True)  # resets the stub's peak in-flight counter
    with tempfile.TemporaryDirectory(prefix="evolve-parallel-") as run_dir:
        policy = build_policy(args.policy)
        if profile is not None:
            profile.enable()
        started, cpu_started = time.perf_counter(), time.process_time()
        run_evaluation(env, policy, lms, Path(run_dir), config)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        if profile is not None:
            profile.disable()
    calls = lms.usage.snapshot().total_calls
    server = stub_stats(base_url)
    if server["chat_requests"] != calls:
        print(f"warning: the stub served {server['chat_requests']} calls, the ledger has {calls}")
    return wall, calls, server["peak_in_flight"], cpu, server["excess_s"]


def figures(wall: float, calls: int, latency: float, concurrency: int) -> tuple[float, float]:
    """(effective parallelism, toolkit overhead in ms per call)."""
    parallelism = calls * latency / wall
    overhead_ms = 1000 * (wall - latency * calls / concurrency) / calls
    return parallelism, overhead_ms


def main() -> int:
    use_toolkit_caches()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.5, help="stub seconds per call")
    parser.add_argument("--users", default="8,32,64", help="K values, comma-separated")
    parser.add_argument("--policy", default="in_context", help="policy spec")
    parser.add_argument("--no-sequential", action="store_true", help="skip the 1-user run")
    parser.add_argument("--profile", type=Path, help="cProfile output of the sequential run")
    args = parser.parse_args()
    sizes = [int(k) for k in args.users.split(",")]

    stub = stub_server_class()(latency=args.latency)
    stub.start()
    base_url = stub.base_url
    rows: list[str] = []
    failures: list[str] = []
    try:
        # Warm-up: imports, connection pool and DSPy's first-call setup are not throughput.
        measure(v1_base_users(1, seed=99), args, base_url, 1)
        runs = ([] if args.no_sequential else [(1, 1)]) + [(k, k) for k in sizes]
        for users, concurrency in runs:
            env = v1_base_users(users)
            profile = cProfile.Profile() if args.profile and concurrency == 1 else None
            wall, calls, peak, cpu, excess = measure(env, args, base_url, concurrency, profile)
            parallelism, overhead_ms = figures(wall, calls, args.latency, concurrency)
            # The stub's own time beyond its latency (request parsing, answer building, late
            # wake-ups under load) is the server's, not the toolkit's: `net` leaves it out.
            server_ms = 1000 * excess / calls
            net_ms = overhead_ms - server_ms / concurrency
            label = "sequential" if concurrency == 1 else f"K = {users:>2}"
            line = (
                f"{label:<10}: {users:>2} users, concurrency {concurrency:>2}, {calls:>5} calls, "
                f"wall {wall:7.2f}s, peak in flight {peak:>2}, effective parallelism "
                f"{parallelism:6.2f} ({parallelism / concurrency:.2f} x K), overhead "
                f"{overhead_ms:5.2f} ms/call (stub's own {server_ms:4.2f}, net {net_ms:5.2f}), "
                f"client CPU {1000 * cpu / calls:4.2f} ms/call"
            )
            print(line, flush=True)
            rows.append(line)
            if concurrency > 1 and parallelism < PARALLELISM_TARGET * concurrency:
                failures.append(f"K={users}: parallelism {parallelism:.1f} < {0.8 * users:.1f}")
            if net_ms > OVERHEAD_TARGET_MS and (concurrency == 1 or users == max(sizes)):
                failures.append(f"{label.strip()}: net overhead {net_ms:.2f} ms > 5 ms")
            if profile is not None:
                profile.dump_stats(args.profile)
    finally:
        stub.stop()
    load = os.getloadavg()
    print(
        f"\nv1.base shape, 2 periods/user, policy {args.policy}, stub latency "
        f"{1000 * args.latency:.0f} ms, thin openai client, cache off; load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores"
    )
    print(
        "targets: effective parallelism >= 0.8 x K; overhead net of the stub <= 5 ms/call "
        "(sequential and max K)"
    )
    print("result: " + ("all targets met" if not failures else "MISSED: " + "; ".join(failures)))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
