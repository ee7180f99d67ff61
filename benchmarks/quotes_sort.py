"""How well does a statement land under the right type? `in_context_quotes`' sorting measured
on the recall catalog's revealing sentences, against the complete types list.

Each recall variable's values come with paraphrases that reveal them ("I prick my finger to
check my glucose before meals now."); the right type is the variable's domain, the right fact
its label. Sorters:

- `embedding`: the policy's write (MiniLM, nearest slot by cosine: the complete list names
  each domain's facts, so one slot per fact), over all sentences, scored by domain and by fact;
- `embedding-lines`: the nearest whole domain line (the write before slots per fact);
- `embedding-values`: the same with each line naming its facts' values (what a reflector
  shown diagnostic feedback could write);
- `model`: the bundled model (`--model-size`) choosing each sentence's type as a
  schema-constrained choice, one sentence a call, over `--model-sentences` of them (a seeded
  sample); add `--model` to run it (it starts llama-server).

    .venv/bin/python benchmarks/quotes_sort.py [--model] [--model-size 1.5b]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Literal

import dspy
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from types_list_room import ideal_types_list  # noqa: E402

from evolve.simulator.synthesis.catalogs import load_catalog  # noqa: E402
from memory_policies.embed import default_embedder, embed_texts  # noqa: E402
from memory_policies.in_context_quotes import filing_slots, type_items  # noqa: E402

# Paraphrases per value: the first two of each (the catalog has more for some values).
PER_VALUE = 2


def labelled_sentences() -> list[tuple[str, str, str]]:
    """(sentence, domain, fact label) for the first `PER_VALUE` paraphrases of every recall
    value."""
    catalog = load_catalog()
    return [
        (paraphrase, variable.domain, variable.label)
        for variable in catalog.variables.values()
        if variable.recall
        for paraphrases in variable.values.values()
        for paraphrase in paraphrases[:PER_VALUE]
    ]


def with_values_list() -> str:
    """The complete list whose lines also name each fact's values."""
    catalog = load_catalog()
    facts: dict[str, list[str]] = {}
    for variable in catalog.variables.values():
        if variable.recall:
            facts.setdefault(variable.domain, []).append(
                f"{variable.label} ({', '.join(variable.values)})"
            )
    return "\n".join(
        f"{index}. {domain.capitalize()}: {'; '.join(sorted(items))}"
        for index, (domain, items) in enumerate(sorted(facts.items()), start=1)
    )


def embedding_correct(
    sentences: list[tuple[str, str, str]], slots: dict[str, str]
) -> tuple[int, int]:
    """(right domain, right fact) counts when each sentence goes to its nearest slot (label ->
    matched text; a label is "Domain (fact)" or a whole line's "Domain")."""
    labels = list(slots)
    vectors = embed_texts(default_embedder(), [*slots.values(), *(s for s, _, _ in sentences)])
    nearest = np.argmax(vectors[len(slots) :] @ vectors[: len(slots)].T, axis=1)
    domains = facts = 0
    for index, (_, domain, fact) in zip(nearest, sentences, strict=True):
        name, _, listed = labels[index].partition(" (")
        domains += name.casefold() == domain
        facts += listed.removesuffix(")") == fact
    return domains, facts


def model_correct(sentences: list[tuple[str, str, str]], model_size: str) -> tuple[int, float]:
    from evolve.llm import open_role_lms
    from evolve.llm.config import EmbeddedModelConfig, LLMConfig

    types_list = ideal_types_list()
    names = tuple(type_items(types_list))

    class SortOne(dspy.Signature):
        sentence: str = dspy.InputField(desc="something the user said")
        type: Literal.__getitem__(names) = dspy.OutputField(  # type: ignore[valid-type]
            desc="the listed type it tells about"
        )

    instruction = (
        "You keep the long-term memory of a personal assistant. Say which type listed below "
        f"the user's sentence tells about.\n\nTypes:\n{types_list}"
    )
    sort = dspy.Predict(SortOne.with_instructions(instruction))
    config = LLMConfig(embedded=EmbeddedModelConfig(model_size=model_size, cache=False))
    correct = 0
    with open_role_lms(config) as lms, dspy.context(lm=lms.lm("agent")):
        started = time.perf_counter()
        for sentence, domain, _ in sentences:
            correct += sort(sentence=sentence).type.casefold() == domain
        return correct, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="store_true", help="also sort with the bundled model")
    parser.add_argument("--model-size", default="1.5b", choices=["0.5b", "1.5b"])
    parser.add_argument("--model-sentences", type=int, default=48)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sentences = labelled_sentences()
    total = len(sentences)
    print(f"{total} revealing sentences, 10 domains, {len(filing_slots(ideal_types_list()))} facts")
    lines = {name: line for name, line in type_items(ideal_types_list()).items()}
    for name, slots, by_fact in (
        ("embedding", filing_slots(ideal_types_list()), True),
        ("embedding-lines", lines, False),
        ("embedding-values", type_items(with_values_list()), False),
    ):
        domains, facts = embedding_correct(sentences, slots)
        line = f"{name:<17} domain {domains}/{total} = {domains / total:.2f}"
        print(line + (f", fact {facts}/{total} = {facts / total:.2f}" if by_fact else ""))
    if args.model:
        sample = random.Random(args.seed).sample(sentences, args.model_sentences)
        correct, seconds = model_correct(sample, args.model_size)
        print(
            f"model {args.model_size:<11} {correct}/{len(sample)} = {correct / len(sample):.2f} "
            f"({seconds / len(sample):.1f} s a sentence)"
        )


if __name__ == "__main__":
    main()
