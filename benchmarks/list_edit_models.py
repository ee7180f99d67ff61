"""Which bundled model should reflect? Valid structured list edits per model size.

For each model size, starts the embedded server with it and asks the `list_edit` operator (the
quickstart's reflector, at the quickstart's reflector temperature) for an edit of the
quickstart's base types list, shown the diagnostic feedback of two write failures (the same
feedback as the real-model list-edit test), `--tries` times with different seeds and the
response cache off. A proposal is valid when it parses, passes the proposal checks, keeps
every item of the list and adds at least one. Prints valid / tries, what was added, and the
mean wall seconds per proposal.

    .venv/bin/python benchmarks/list_edit_models.py [--model-sizes 0.5b 1.5b] [--tries 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import evolve  # noqa: F401  (sets cache locations)
from evolve.llm.config import EmbeddedModelConfig, LLMConfig
from evolve.llm.roles import open_role_lms
from evolve.optimize.edits import list_items, proposal_problem
from evolve.optimize.list_edit import ListEditOperator
from evolve.optimize.reflect import Reflector

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "optimize"))
from test_list_edit_integration import COMPONENT, FEEDBACK, TYPES  # noqa: E402


def measure(model_size: str, tries: int, temperature: float) -> str:
    config = LLMConfig(embedded=EmbeddedModelConfig(model_size=model_size, cache=False))
    valid = 0
    added: Counter[str] = Counter()
    problems: Counter[str] = Counter()
    with open_role_lms(config) as lms:
        operator = ListEditOperator(Reflector(lms, temperature=temperature, max_chars=1400))
        started = time.perf_counter()
        for seed in range(tries):
            proposal = operator.propose(
                {COMPONENT: TYPES}, [COMPONENT], {COMPONENT: [{"Feedback": FEEDBACK}]}, seed=seed
            )
            text = proposal.components.get(COMPONENT)
            if text is None:
                problems["no proposal"] += 1
                continue
            problem = proposal_problem(COMPONENT, text, FEEDBACK)
            items = list_items(text)
            if problem is not None:
                problems[problem.split(":")[0][:60]] += 1
            elif items[:2] != list_items(TYPES):
                problems["dropped a base item"] += 1
            elif len(items) <= 2:
                problems["added nothing"] += 1
            else:
                valid += 1
                added.update(items[2:])
        per_call = (time.perf_counter() - started) / tries
    return (
        f"{model_size}: {valid}/{tries} valid edits ({per_call:.1f} s each); added: "
        f"{dict(added.most_common(6))}; rejected: {dict(problems)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-sizes", nargs="+", default=["0.5b", "1.5b"])
    parser.add_argument("--tries", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.7)
    args = parser.parse_args()
    for model_size in args.model_sizes:
        print(measure(model_size, args.tries, args.temperature), flush=True)


if __name__ == "__main__":
    main()
