"""Rewording the feedback changes no list edit: `list_edit` reads the failures the feedback
showed as data, never its sentences. On the base's recorded train run of the quickstart
(seed 13), every sentence of the diagnostic text is reworded and the list edits, with a
reflector whose reply depends on what it is shown, stay the same."""

from __future__ import annotations

import re
from pathlib import Path

from scripted_lm import scripted_role_lms

from evolve.core.seeds import derive_rng
from evolve.feedback import answered_questions, reflective_record
from evolve.feedback.builtin import DiagnosticFeedback
from evolve.optimize.list_edit import ListEditOperator
from evolve.optimize.reflect import Reflector
from evolve.results.objective import load_period_results

RECORD = Path(__file__).resolve().parents[2] / "benchmarks/records/quickstart_seeds/quickstart-s13"
BASE_RUN = RECORD / "evaluations/train/e7c63460a2325bb0/u000-aisha-rahman"
COMPONENT = "write.types_to_remember"
BASE_LIST = "1. Diet and eating habits\n2. Work and career"


def list_edits(
    seeds: range, *, kind: DiagnosticFeedback | None = None, as_data: bool = True
) -> tuple[list[str], list[dict]]:
    """The diagnostic text and the list edit it leads to, for each proposal seed.
    `as_data` False: the failures are left out of the record, so the operator has only the
    text (as when it parsed the text back)."""

    def reflector(call) -> dict:
        # Adds every fact the failures it is shown name as missing (its reply depends on them).
        named = re.findall(r"not in memory: ([^\n]+)", call.user)
        facts = [fact.strip() for line in named for fact in line.split(",")]
        # Shown the whole diagnostic instead, it reads the facts off its cause sentences.
        facts = facts or re.findall(r"cause: \w+ - (\w+) is ", call.user)
        return {"add": facts[:4]}

    operator = ListEditOperator(
        Reflector(scripted_role_lms(reflector=reflector), temperature=0.7, max_chars=4000)
    )
    results = load_period_results(BASE_RUN)
    texts, edits = [], []
    for seed in seeds:
        feedback = (kind or DiagnosticFeedback()).render(
            answered_questions(results),
            component=COMPONENT,
            max_failures=8,
            max_chars=6000,
            rng=derive_rng(13, "feedback", seed, COMPONENT),
        )
        record = reflective_record(feedback)
        if not as_data:
            record.pop("failures")
        proposal = operator.propose(
            {COMPONENT: BASE_LIST}, [COMPONENT], {COMPONENT: [record]}, seed=seed
        )
        texts.append(feedback.text)
        edits.append(proposal.model_dump())
    return texts, edits


class RewordedDiagnostic(DiagnosticFeedback):
    """The diagnostic kind with every sentence said differently (the same failures)."""

    def totals(self, counts, total) -> str:
        return f"Score: {counts} / {total}"

    def describe(self, number: int, failure) -> str:
        wrong = [fact for fact in failure.facts if not fact.in_memory]
        return "\n".join(
            [
                f"#{number} (period {failure.period}) the user asked: {failure.question}",
                f"   kind of miss: {failure.diagnosis.value.upper()}",
                "   facts: " + " / ".join(f"{f.variable} should be {f.gold}" for f in wrong),
                f"   stored at the time: {failure.memory_held[:80]}",
            ]
        )


def test_rewording_every_sentence_changes_no_list_edit():
    seeds = range(1, 6)
    texts, edits = list_edits(seeds)
    assert any(edit["components"] for edit in edits), "the record must lead to some edit"
    reworded_texts, reworded_edits = list_edits(seeds, kind=RewordedDiagnostic())

    for before, after in zip(texts, reworded_texts, strict=True):
        # Every line differs but the "Failures:" title between the totals and the failures.
        kept = set(before.splitlines()) & set(after.splitlines())
        assert kept == {"Failures:"}, kept
    assert reworded_edits == edits


def test_an_operator_reading_the_text_would_change_its_edits():
    """The check can fail: with only the text to go on, the rewording changes the edits."""
    seeds = range(1, 6)
    _, edits = list_edits(seeds, as_data=False)
    _, reworded_edits = list_edits(seeds, kind=RewordedDiagnostic(), as_data=False)
    assert reworded_edits != edits
