"""Thread and polling settings of the embedded server, idle and beside one busy process.

llama.cpp's worker threads wait for each other at every step; with `--poll` above 0 they spin
while waiting. On 2 cores with one other busy process, a thread that loses its core stalls
the others. For each setting (threads, poll) this starts the embedded server with the bundled
model, sends the same requests (a recall-sized prompt, 48 decoded tokens, no prompt reuse),
one at a time and then `--slots` at once, first on idle cores and then beside one process that
spins on one core, and prints prompt and decode speed (tokens/s) and the slowdown that the
competitor causes. Ratios are what to compare: absolute speeds vary by machine.

    .venv/bin/python benchmarks/embedded_threads.py [--model-size 1.5b] [--requests 4]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import evolve  # noqa: F401  (sets cache locations)
from evolve.llm.config import EmbeddedModelConfig
from evolve.llm.server import EmbeddedServer

PROMPT = (
    "You keep the long-term memory of a personal assistant. Memory:\n"
    + "\n".join(
        f"- fact {i}: the user said something about topic {i} on day {i}" for i in range(30)
    )
    + "\nQuestion: which topic did the user mention on day {n}? Answer in one sentence."
)


def spin(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def ask(base_url: str, n: int) -> tuple[float, float]:
    """(prompt tokens/s, decode tokens/s) of one request; `n` makes each prompt unique."""
    body = {
        "prompt": PROMPT.replace("{n}", str(n)) + f" (request {n})",
        "n_predict": 48,
        "temperature": 0.0,
        "cache_prompt": False,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        base_url.removesuffix("/v1") + "/completion",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        timings = json.load(response)["timings"]
    return timings["prompt_per_second"], timings["predicted_per_second"]


def measure(
    server: EmbeddedServer, requests: int, parallel: int, offset: int
) -> tuple[float, float]:
    with ThreadPoolExecutor(parallel) as pool:
        results = list(
            pool.map(lambda n: ask(server.base_url, n), range(offset, offset + requests))
        )
    prompt = sum(r[0] for r in results) / len(results)
    decode = sum(r[1] for r in results) / len(results)
    return prompt, decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-size", default="1.5b")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument(
        "--settings", nargs="+", default=["2:50", "2:0", "1:0"], help="threads:poll pairs"
    )
    args = parser.parse_args()
    offset = 0
    for setting in args.settings:
        threads, poll = (int(part) for part in setting.split(":"))
        config = EmbeddedModelConfig(
            model_size=args.model_size, threads=threads, poll=poll, slots=args.slots, cache=False
        )
        with EmbeddedServer(config) as server:
            ask(server.base_url, -1)  # warm up
            rows = []
            for label, busy in (("idle", False), ("one busy process", True)):
                competitor = None
                if busy:
                    competitor = multiprocessing.Process(target=spin, args=(time.time() + 900,))
                    competitor.start()
                try:
                    for parallel in (1, args.slots):
                        offset += args.requests
                        prompt, decode = measure(server, args.requests, parallel, offset)
                        rows.append((label, parallel, prompt, decode))
                finally:
                    if competitor is not None:
                        competitor.terminate()
                        competitor.join()
        for label, parallel, prompt, decode in rows:
            idle = next(r for r in rows if r[0] == "idle" and r[1] == parallel)
            print(
                f"threads {threads} poll {poll:>2} | {label:<16} {parallel} at once: prompt "
                f"{prompt:6.1f} tok/s, decode {decode:5.1f} tok/s per request "
                f"(x{idle[3] / decode:.2f} slower decode than idle)",
                flush=True,
            )


if __name__ == "__main__":
    main()
