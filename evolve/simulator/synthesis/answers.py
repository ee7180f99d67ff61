"""The answers stage: for each question, one answer per state variant, each checked by a
classifier (which variant does this answer fit?) and refined until it is matched to its own.
"""

from __future__ import annotations

import itertools
from typing import Any

from evolve.core.seeds import derive_rng
from evolve.simulator.environment import CHOICE_EXPERIENCED, CHOICE_RANDOM
from evolve.simulator.synthesis.calls import Refinement, StageCalls, numbered
from evolve.simulator.synthesis.report import Stage
from evolve.simulator.synthesis.signatures import MatchAnswer, RefineAnswer, WriteAnswers
from evolve.simulator.synthesis.validate import QuestionSpec, check_texts


def _assignment(variables: list[str], values: tuple[str, ...]) -> str:
    return ", ".join(f"{var}={value}" for var, value in zip(variables, values, strict=True))


def answer_variants(
    calls: StageCalls, index: int, question: QuestionSpec, states: list[dict[str, str]]
) -> tuple[list[tuple[str, ...]], set[tuple[str, ...]]]:
    """Every variant on the trajectory, padded with unseen ones, in a seeded order."""
    variables = question.info_types
    seen = list(dict.fromkeys(tuple(state[var] for var in variables) for state in states))
    rng = derive_rng("answer-variants", calls.seed, calls.user_id, index)
    variants = list(seen)
    if len(variants) < calls.config.min_state_variants:
        unseen = [
            combination
            for combination in itertools.product(*(i.info_choices for i in question.required_info))
            if combination not in seen
        ]
        variants += rng.sample(unseen, calls.config.min_state_variants - len(variants))
    rng.shuffle(variants)
    return variants, set(seen)


def write_answers(
    calls: StageCalls, index: int, question: QuestionSpec, states: list[dict[str, str]]
) -> dict[str, Any]:
    config = calls.config
    unit = f"answers_q{index:02d}"
    variables = question.info_types
    variants, seen = answer_variants(calls, index, question, states)
    described = [_assignment(variables, variant) for variant in variants]
    answers = calls.checked(
        Stage.ANSWERS,
        unit,
        WriteAnswers,
        lambda p: check_texts(p.answers, len(variants), "answers"),
        question=question.question,
        variants=numbered(described),
        length=config.answer_sentences,
        language=config.language_name,
    )
    for target, answer in enumerate(list(answers)):
        answers[target] = checked_answer(calls, unit, question.question, described, target, answer)
    choices = [
        {
            "state": list(variant),
            "answer": answer,
            "type": CHOICE_EXPERIENCED if variant in seen else CHOICE_RANDOM,
        }
        for variant, answer in zip(variants, answers, strict=True)
    ]
    return {"query": question.question, "required_info": variables, "answer_choices": choices}


def match_answer(
    calls: StageCalls,
    unit: str,
    question: str,
    described: list[str],
    target: int,
    answer: str,
    round_: int,
) -> tuple[bool, str]:
    """Ask the classifier which variant `answer` fits; situations in a seeded order so a
    position bias (always "1") cannot pass the check."""
    order = list(range(len(described)))
    derive_rng("match", calls.seed, calls.user_id, unit, target, round_).shuffle(order)
    prediction, error = calls.call(
        Stage.ANSWERS,
        MatchAnswer,
        key=f"{unit}/match{target}/{round_}",
        creative=False,
        question=question,
        answer=answer,
        situations=numbered([described[i] for i in order]),
    )
    if prediction is None:
        return False, f"the classifier's output was unparseable ({error})"
    try:
        option = int(prediction.option)
    except (TypeError, ValueError):
        option = 0
    if not 1 <= option <= len(order):
        return False, f"the classifier answered {prediction.option!r}, not an option number"
    picked = order[option - 1]
    return picked == target, f"the classifier matched it to ({described[picked]})"


def checked_answer(
    calls: StageCalls, unit: str, question: str, described: list[str], target: int, answer: str
) -> str:
    """`answer`, refined until the classifier matches it to its own variant."""
    others = "\n".join(d for i, d in enumerate(described) if i != target)
    refinement = Refinement(
        stage=Stage.ANSWERS,
        unit=unit,
        subject=f"variant ({described[target]})",
        budget=calls.config.retries.answer_refinements,
        judge=lambda text, round_: match_answer(
            calls, unit, question, described, target, text, round_
        ),
        signature=RefineAnswer,
        key=f"{unit}/refine{target}",
        inputs=lambda text, problem: {
            "question": question,
            "target": described[target],
            "others": others,
            "answer": text,
            "problem": f"A reader thought this answer was for: {problem}",
            "length": calls.config.answer_sentences,
            "language": calls.config.language_name,
        },
        output="refined_answer",
        empty="empty answer",
    )
    return calls.refine(refinement, answer)
