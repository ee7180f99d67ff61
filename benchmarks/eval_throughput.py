"""Evaluation throughput: concurrency 1 vs N against a stub server with a fixed latency.

Starts `stub_openai_server.py` in its own process (so its work never competes with the
measured client for the GIL), evaluates a synthesized environment with concurrency 1 and then
N (fresh run directories, DSPy cache off), and prints the speedup and the toolkit's own
overhead per LLM call:

    overhead/call = (wall time - latency x calls / concurrency) / calls

Targets: speedup >= 6x at concurrency 8 with 8 users, overhead <= 5 ms/call. Each LM client
(`--client openai,litellm`: the toolkit's thin client and DSPy's LiteLLM route) is measured
in turn, so their per-call overheads can be compared.

    .venv/bin/python benchmarks/eval_throughput.py [--latency 0.1] [--users 8] [--policy SPEC]
        [--client openai,litellm]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from evolve.core.paths import use_toolkit_caches
from evolve.llm import EndpointConfig, RoleLMs, build_lm
from evolve.simulator.evaluation import EpisodeConfig, run_evaluation
from evolve.simulator.synthesis.offline import synthesize_environment
from evolve.simulator.synthesis.presets import PRESETS
from memory_policies import build_policy

HERE = Path(__file__).resolve().parent


def stub_server_class() -> Any:
    """`StubServer` from the stub script (benchmarks/ is not a package): one launcher."""
    name = "stub_openai_server"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "stub_openai_server.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before exec: dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name].StubServer


def role_lms(base_url: str, client: str) -> RoleLMs:
    endpoint = EndpointConfig(
        model="stub",
        base_url=base_url,
        client=client,
        api_key_env="STUB_API_KEY",  # unset: local servers get a placeholder key
        cache=False,  # every call must reach the server
        retries=0,
        timeout=30,
    )
    return RoleLMs.from_lms(
        simulator=build_lm(endpoint), agent=build_lm(endpoint), reflector=build_lm(endpoint)
    )


def measure(
    env, policy_spec: str, base_url: str, concurrency: int, rounds: tuple[int, int], client: str
):
    lms = role_lms(base_url, client)
    config = EpisodeConfig(
        rounds_initial=rounds[0], rounds_update=rounds[1], concurrency=concurrency, seed=0
    )
    with tempfile.TemporaryDirectory(prefix="evolve-bench-") as run_dir:
        started = time.perf_counter()
        report = run_evaluation(env, build_policy(policy_spec), lms, Path(run_dir), config)
        wall = time.perf_counter() - started
    usage = lms.usage.snapshot()
    return wall, usage.total_calls, usage, report


def main() -> int:
    use_toolkit_caches()  # the toolkit's cache locations, as the `evolve` command uses
    parser = argparse.ArgumentParser(description="evaluation throughput benchmark")
    parser.add_argument("--latency", type=float, default=0.1, help="stub seconds per call")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--policy", default="in_context", help="policy spec (default in_context)")
    parser.add_argument("--rounds-init", type=int, default=1)
    parser.add_argument("--rounds-update", type=int, default=2)
    parser.add_argument(
        "--client", default="openai,litellm", help="LM clients to measure, comma-separated"
    )
    args = parser.parse_args()

    env = synthesize_environment(PRESETS[args.preset], seed=0, num_users=args.users)
    summaries = []
    with stub_server_class()(latency=args.latency) as stub:
        for client in args.client.split(","):
            print(f"client {client}:")
            summaries.append(f"{client:<8} " + run_client(env, args, stub.base_url, client))
    print(
        f"\n{args.users} users, {args.preset} preset, policy {args.policy}, latency "
        f"{1000 * args.latency:.0f} ms:"
    )
    print("\n".join(summaries))
    return 0


def run_client(env, args: argparse.Namespace, base_url: str, client: str) -> str:
    """Measure one LM client at concurrency 1 and N; returns its summary line."""
    rounds = (args.rounds_init, args.rounds_update)
    # Warm-up: imports, connection pools and DSPy's first-call setup are not throughput.
    first_user = env.model_copy(update={"items": env.items[:1]})
    measure(first_user, args.policy, base_url, 1, (1, 1), client)
    rows = []
    for concurrency in (1, args.concurrency):
        wall, calls, usage, report = measure(
            env, args.policy, base_url, concurrency, rounds, client
        )
        ideal = args.latency * calls / concurrency
        overhead_ms = 1000 * (wall - ideal) / calls if calls else float("nan")
        rows.append((concurrency, wall, calls, overhead_ms, report.summary.n_items))
        roles = ", ".join(f"{role} {u.calls}" for role, u in usage.roles.items())
        print(
            f"concurrency {concurrency:>2}: {calls} LLM calls ({roles}), "
            f"{report.summary.n_items} items, wall {wall:.2f}s, ideal {ideal:.2f}s, "
            f"overhead {overhead_ms:.2f} ms/call"
        )
        if concurrency == 1:
            # Where the sequential overhead goes: inside the LM client (litellm, HTTP,
            # JSON) versus outside it (DSPy adapter, policy, runner, storage).
            in_client = sum(u.latency_s for u in usage.roles.values()) - args.latency * calls
            outside = wall - sum(u.latency_s for u in usage.roles.values())
            print(
                f"  per call: LM client {1000 * in_client / calls:.2f} ms, DSPy adapter + "
                f"policy + runner + storage {1000 * outside / calls:.2f} ms"
            )
    (_, wall_1, calls_1, _, _), (_, wall_n, calls_n, overhead_n, _) = rows
    if calls_1 != calls_n:
        print(f"warning: call counts differ between runs ({calls_1} vs {calls_n})")
    speedup = wall_1 / wall_n
    return (
        f"speedup {speedup:.2f}x at concurrency {args.concurrency} (target >= 6x); overhead "
        f"{rows[0][3]:.2f} ms/call sequential, {overhead_n:.2f} ms/call concurrent "
        f"(target <= 5 ms)"
    )


if __name__ == "__main__":
    sys.exit(main())
