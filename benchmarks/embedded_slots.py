"""Embedded llama-server throughput: aggregate completion tokens/s at 1 slot vs N slots.

For each slot count, starts the embedded server (`evolve.llm.EmbeddedServer`, the bundled
model unless --model-path/--model-size), sends one untimed warm-up request, then the same
8 distinct ~300-token chat prompts with `max_tokens` 64 from as many client threads as the
server has slots, and prints the completion tokens per second of wall time. Prompts differ
from their first sentence on, so no request reuses another's prompt cache.

Target: tokens/s at 4 slots >= 3x tokens/s at 1 slot, on otherwise idle cores.
Also printed: completion tokens per CPU-second of the server process, which says how much
batching saves when the machine is shared (wall-time figures then depend on the load), and the
server's own per-request timings of the two phases. Slots batch the decode steps of several
requests; prompt evaluation is already a batch of ~300 tokens with one request, so on a
compute-bound CPU it gains little from slots and bounds the overall ratio.

`--issue-protocol` also runs the warm-cache sequence behind an earlier 4.3x: one server with
4 slots, the 8 prompts at client concurrency 1, then the same 8 at concurrency 4. The second
batch finds every prompt in the server's prompt cache (the printed "prompt tokens evaluated"
drops to a handful), so that ratio measures batched decoding without prompt evaluation.

    .venv/bin/python benchmarks/embedded_slots.py [--slots 1 4] [--model-size 0.5b]
        [--issue-protocol]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import evolve  # noqa: F401  (sets cache locations)
from evolve.llm.config import EmbeddedModelConfig
from evolve.llm.server import EmbeddedServer

TOPICS = (
    "a community garden", "a small bakery", "a city bus line", "a hiking club",
    "a public library", "a chess tournament", "a jazz festival", "a robotics class",
)  # fmt: skip
WORDS = (
    "morning", "evening", "river", "window", "lantern", "orchard", "ladder", "copper",
    "meadow", "harbor", "pencil", "violin", "compass", "blanket", "thunder", "glacier",
)  # fmt: skip


@dataclass
class Measurement:
    slots: int
    wall_seconds: float
    cpu_seconds: float
    prompt_tokens: int
    prompt_tokens_evaluated: int  # the rest came from the server's prompt cache
    completion_tokens: int
    prompt_ms_per_token: float  # server-side, mean over requests (batched requests overlap)
    decode_ms_per_token: float

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.wall_seconds

    @property
    def tokens_per_cpu_second(self) -> float:
        return self.completion_tokens / self.cpu_seconds


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def build_prompts(count: int, target_tokens: int) -> list[str]:
    """Distinct prompts of about `target_tokens` tokens (~0.75 words per token)."""
    prompts = []
    for index in range(count):
        rng = random.Random(index)
        topic = TOPICS[index % len(TOPICS)]
        lines = [f"Notes number {index + 1} about {topic}, written by volunteer {index + 7}."]
        while sum(len(line.split()) for line in lines) < target_tokens * 0.72:
            picked = " ".join(rng.choice(WORDS) for _ in range(6))
            lines.append(f"Item {len(lines)}: the {topic} mentioned {picked}.")
        lines.append(f"Write a detailed paragraph describing {topic} from these notes.")
        prompts.append("\n".join(lines))
    return prompts


def post_json(url: str, payload: dict, timeout: float = 600) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def chat(server: EmbeddedServer, prompt: str, max_tokens: int) -> dict:
    answer = post_json(
        f"{server.base_url}/chat/completions",
        {
            "model": server.model_name,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
        },
    )
    usage = answer["usage"]
    if usage["completion_tokens"] > max_tokens:
        raise RuntimeError(
            f"the server generated {usage['completion_tokens']} tokens, max_tokens {max_tokens}"
        )
    timings = answer.get("timings", {})  # llama-server's own phase timings
    return {
        **usage,
        "prompt_evaluated": timings.get("prompt_n", usage["prompt_tokens"]),
        "prompt_ms_per_token": timings.get("prompt_per_token_ms", float("nan")),
        "decode_ms_per_token": timings.get("predicted_per_token_ms", float("nan")),
    }


def run_batch(
    server: EmbeddedServer, prompts: list[str], max_tokens: int, concurrency: int
) -> Measurement:
    """Send every prompt from `concurrency` client threads; time the whole batch."""
    assert server.process is not None
    cpu_before, started = cpu_seconds(server.process.pid), time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        usages = list(pool.map(lambda prompt: chat(server, prompt, max_tokens), prompts))
    wall = time.perf_counter() - started
    cpu = cpu_seconds(server.process.pid) - cpu_before
    return Measurement(
        slots=server.config.slots,
        wall_seconds=wall,
        cpu_seconds=cpu,
        prompt_tokens=sum(usage["prompt_tokens"] for usage in usages),
        prompt_tokens_evaluated=sum(usage["prompt_evaluated"] for usage in usages),
        completion_tokens=sum(usage["completion_tokens"] for usage in usages),
        prompt_ms_per_token=sum(u["prompt_ms_per_token"] for u in usages) / len(usages),
        decode_ms_per_token=sum(u["decode_ms_per_token"] for u in usages) / len(usages),
    )


def prompt_sizes(server: EmbeddedServer, prompts: list[str]) -> list[int]:
    return [
        len(post_json(f"http://127.0.0.1:{server.port}/tokenize", {"content": p})["tokens"])
        for p in prompts
    ]


def measure(
    config: EmbeddedModelConfig, prompts: list[str], max_tokens: int
) -> tuple[Measurement, list[int]]:
    """A fresh server with `config.slots` slots, client concurrency = slots."""
    with EmbeddedServer(config) as server:
        sizes = prompt_sizes(server, prompts)
        chat(server, "Say hello.", 8)  # untimed: pages the model in
        return run_batch(server, prompts, max_tokens, concurrency=config.slots), sizes


def describe(label: str, result: Measurement) -> str:
    return (
        f"{label}: {result.completion_tokens} completion tokens in {result.wall_seconds:.1f}s "
        f"= {result.tokens_per_second:.1f} tokens/s; prompt tokens evaluated "
        f"{result.prompt_tokens_evaluated} of {result.prompt_tokens}; server CPU "
        f"{result.cpu_seconds:.1f}s = {result.tokens_per_cpu_second:.1f} tokens/CPU-s "
        f"(load {os.getloadavg()[0]:.1f}); per request: prompt {result.prompt_ms_per_token:.1f} "
        f"ms/token, decode {result.decode_ms_per_token:.1f} ms/token"
    )


def issue_protocol(config: EmbeddedModelConfig, prompts: list[str], max_tokens: int) -> None:
    """The warm-cache sequence behind an earlier 4.3x: one server, N slots, the prompts at client
    concurrency 1, then the same prompts at concurrency N on the same server. The second
    batch finds the first batch's prompts in the server's prompt cache, so it measures
    batched decoding plus cache hits, not slots against one slot."""
    with EmbeddedServer(config) as server:
        sizes = prompt_sizes(server, prompts)
        chat(server, "Say hello.", 8)
        serial = run_batch(server, prompts, max_tokens, concurrency=1)
        parallel = run_batch(server, prompts, max_tokens, concurrency=config.slots)
    print(
        f"issue protocol, one server with {config.slots} slots, prompts={len(prompts)} "
        f"(tokens {min(sizes)}-{max(sizes)}) max_tokens={max_tokens}",
        flush=True,
    )
    print(describe("  concurrency 1 (cold prompt cache)", serial))
    print(describe(f"  concurrency {config.slots} (same prompts again)", parallel))
    print(
        f"  ratio {parallel.tokens_per_second / serial.tokens_per_second:.2f}x; prompt tokens "
        f"evaluated {serial.prompt_tokens_evaluated} then {parallel.prompt_tokens_evaluated}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model-size", choices=["0.5b", "1.5b"], default="0.5b")
    parser.add_argument("--model-path", type=Path)
    parser.add_argument("--threads", type=int, help="server threads (default: all cores)")
    parser.add_argument(
        "--issue-protocol",
        action="store_true",
        help="also run the warm-cache sequence: one server with the largest slot count, "
        "concurrency 1 then the same prompts at concurrency = slots",
    )
    args = parser.parse_args()

    prompts = build_prompts(args.prompts, args.prompt_tokens)
    results = []
    for slots in args.slots:
        config = EmbeddedModelConfig(
            slots=slots,
            model_size=args.model_size,
            model_path=args.model_path,
            threads=args.threads,
        )
        result, sizes = measure(config, prompts, args.max_tokens)
        results.append(result)
        print(
            describe(
                f"slots={slots:<2} concurrency={slots:<2} prompts={len(prompts)} "
                f"(tokens {min(sizes)}-{max(sizes)}) max_tokens={args.max_tokens}",
                result,
            ),
            flush=True,
        )
    if len(results) >= 2:
        base, best = results[0], results[-1]
        ratio = best.tokens_per_second / base.tokens_per_second
        verdict = "met" if ratio >= 3 else "NOT met"
        cpu_ratio = best.tokens_per_cpu_second / base.tokens_per_cpu_second
        print(
            f"aggregate completion tokens/s, {best.slots} slots vs {base.slots}: {ratio:.2f}x "
            f"(target >= 3x: {verdict}); per server CPU-second: {cpu_ratio:.2f}x"
        )
        # Tokens of all slots per unit of time, phase by phase (slots run side by side).
        prompt_gain = best.slots * base.prompt_ms_per_token / best.prompt_ms_per_token
        decode_gain = best.slots * base.decode_ms_per_token / best.decode_ms_per_token
        print(
            f"by phase, {best.slots} slots vs {base.slots}: prompt evaluation {prompt_gain:.2f}x, "
            f"decoding {decode_gain:.2f}x"
        )
    if args.issue_protocol:
        config = EmbeddedModelConfig(
            slots=max(args.slots),
            model_size=args.model_size,
            model_path=args.model_path,
            threads=args.threads,
        )
        issue_protocol(config, prompts, args.max_tokens)


if __name__ == "__main__":
    main()
