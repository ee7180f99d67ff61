"""Speculative decoding on the embedded llama-server: decode speed and identical outputs.

For each mode of `[llm.embedded] speculative` (off, draft: the bundled 0.5B drafts for the
served model; ngram: drafts from n-grams already in the context) and each slot count, starts
the embedded server, sends one untimed warm-up request, then a fixed set of prompts shaped
like the toolkit's own calls (conversational replies of the assistant and JSON memory
writes that copy the user's words) from as many client threads as the server has slots, all
greedy (temperature 0). It prints per mode and slot count:

- decoded tokens per second of wall time, and the ratio to `off` at the same slot count;
- the draft acceptance rate (accepted / drafted tokens, from the server's timings);
- how many outputs equal `off`'s at the same slot count (greedy decoding with a draft must
  give the model's own tokens; batching several requests may itself perturb the last bits,
  so only equal slot counts are compared).

Only ratios mean something on a shared machine; run it on idle cores.

    .venv/bin/python benchmarks/speculative_decoding.py [--model-size 1.5b]
        [--modes off draft ngram] [--slots 1 2 4] [--max-tokens 128] [--draft-tokens 4]

`--modes off off ...` repeats the baseline: batched decoding is itself not bit-reproducible
across runs, and the repeat shows how many outputs differ from that alone.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import evolve  # noqa: F401  (sets cache locations)
from evolve.llm.config import EmbeddedModelConfig
from evolve.llm.server import EmbeddedServer

SYSTEM = "You are a helpful personal assistant. Answer the user warmly and concretely."
REPLIES = (
    "I just moved to Lisbon for a job in logistics and I'm trying to pick up surfing on "
    "weekends. Any tips for a beginner who gets seasick?",
    "My daughter turns seven next month and she is obsessed with dinosaurs and baking. "
    "Could you help me plan a small party at home for eight kids?",
    "I've been sleeping badly since I started night shifts at the hospital. What could I "
    "change in my routine before and after a shift?",
    "We adopted a retired greyhound last week. He is shy and won't climb the stairs. How "
    "do I help him settle in?",
)
WRITES = (
    "The user said: 'I switched from running to swimming because of my knee, and I now swim "
    "three mornings a week at the municipal pool.' Rewrite the memory list as JSON with the "
    "key memories, keeping every earlier entry. Earlier entries: ['runs 5 km daily', 'lives "
    "in Porto', 'works as a nurse on night shifts'].",
    "The user said: 'We finally sold the old car and bought an electric one, a small "
    "hatchback, mostly for the school run.' Rewrite the memory list as JSON with the key "
    "memories, keeping every earlier entry. Earlier entries: ['two children, 7 and 10', "
    "'drives a 2009 diesel estate', 'budget-conscious'].",
    "The user said: 'I'm vegetarian now, since January, and I cook mostly Indian dishes at "
    "home.' Rewrite the memory list as JSON with the key memories, keeping every earlier "
    "entry. Earlier entries: ['loves barbecue', 'cooks twice a week', 'allergic to "
    "peanuts'].",
    "The user said: 'My manager moved me to the Berlin office, so I commute by train now and "
    "read on the way.' Rewrite the memory list as JSON with the key memories, keeping every "
    "earlier entry. Earlier entries: ['works in Munich', 'drives to work', 'reads sci-fi'].",
)


@dataclass
class Measurement:
    mode: str
    slots: int
    wall_s: float
    decoded: int
    outputs: list[str]
    drafted: int = 0
    accepted: int = 0
    decode_ms: list[float] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.decoded / self.wall_s

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def chat(base_url: str, model: str, prompt: str, max_tokens: int) -> dict:
    payload = {
        "model": model,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "cache_prompt": False,  # every mode evaluates every prompt: only decoding differs
    }
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=1800) as response:
        return json.load(response)


def measure(
    mode: str, slots: int, model_size: str, max_tokens: int, draft_tokens: int
) -> Measurement:
    config = EmbeddedModelConfig(
        model_size=model_size,
        slots=slots,
        speculative=mode,
        draft_tokens=draft_tokens,
        cache=False,
    )
    prompts = [*REPLIES, *WRITES]
    with EmbeddedServer(config) as server:
        chat(server.base_url, server.model_name, "Say hello.", 8)  # warm-up, untimed
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=slots) as pool:
            answers = list(
                pool.map(lambda p: chat(server.base_url, server.model_name, p, max_tokens), prompts)
            )
        wall = time.perf_counter() - started
    result = Measurement(
        mode, slots, wall, sum(a["usage"]["completion_tokens"] for a in answers), []
    )
    for answer in answers:
        result.outputs.append(answer["choices"][0]["message"]["content"])
        timings = answer.get("timings") or {}
        result.drafted += int(timings.get("draft_n") or 0)
        result.accepted += int(timings.get("draft_n_accepted") or 0)
        result.decode_ms.append(float(timings.get("predicted_ms") or 0.0))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-size", default="1.5b", choices=("0.5b", "1.5b"))
    parser.add_argument("--modes", nargs="+", default=["off", "draft", "ngram"])
    parser.add_argument("--slots", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--draft-tokens", type=int, default=4)
    args = parser.parse_args()
    if args.modes[0] != "off":
        args.modes.insert(0, "off")
    print(f"model {args.model_size}; {len(REPLIES) + len(WRITES)} prompts, greedy, "
          f"max_tokens {args.max_tokens}")  # fmt: skip
    print(f"{'mode':<6} {'slots':>5} {'wall s':>7} {'decoded':>7} {'tok/s':>6} {'vs off':>6} "
          f"{'accept':>6} {'same as off':>11}")  # fmt: skip
    for slots in args.slots:
        baseline: Measurement | None = None
        for mode in args.modes:
            found = measure(mode, slots, args.model_size, args.max_tokens, args.draft_tokens)
            if baseline is None:  # the first `off`; a second one shows batching's own noise
                baseline = found
            assert baseline is not None
            same = sum(a == b for a, b in zip(found.outputs, baseline.outputs, strict=True))
            acceptance = f"{found.acceptance:.0%}" if found.acceptance is not None else "-"
            print(
                f"{mode:<6} {slots:>5} {found.wall_s:>7.1f} {found.decoded:>7} "
                f"{found.tokens_per_second:>6.2f} "
                f"{found.tokens_per_second / baseline.tokens_per_second:>5.2f}x "
                f"{acceptance:>6} {same:>5}/{len(found.outputs)}",
                flush=True,
            )


if __name__ == "__main__":
    main()
