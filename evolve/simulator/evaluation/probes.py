"""Questions and probes of one unit: multiple-choice answers on private copies of the
checkpoint, recall probes in the protocol's style, and the per-item results.

Under protocol "evolve" the probes ask the current value of every variable the questions need
(each variable once per period; with probes = "wrong_only" only those of wrongly answered
questions); under "paper" one structured probe per question over its required variables, as
the reference code does. `ProtocolRules.probe_style` names the strategy (`PROBE_STRATEGIES`).
Both diagnoses (ours and the original's, see `metrics`) are derived from whichever probe ran.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import dspy

from evolve.llm import call_events
from evolve.llm.response_cache import held_until_parsed
from evolve.llm.usage import Usage, tracked_usage
from evolve.simulator.baselines import random_score
from evolve.simulator.evaluation.episode import EpisodeConfig, ProbeScope
from evolve.simulator.metrics import Recall, check_variables, diagnose
from evolve.simulator.records import (
    ItemResult,
    ProbeResult,
    QuestionProbeResult,
    VariableRecall,
)

if TYPE_CHECKING:
    from evolve.simulator.environment import EnvironmentItem
    from evolve.simulator.evaluation.context import RunContext

# Appended to every question, as the original prompt asks for the answer fitting the user's
# *current* situation (not whichever the conversation mentioned first).
QUESTION_HINT = "(Choose the option that fits my current situation and preferences.)"


def probe_question(variable: str) -> str:
    return f"What is my current {variable.replace('_', ' ')}?"


def required_variables(item: EnvironmentItem) -> list[str]:
    """Distinct variables required by any question, in first-appearance order."""
    seen: dict[str, None] = {}
    for qa in item.qas:
        for variable in qa.required_info:
            seen.setdefault(variable, None)
    return list(seen)


def _read_only_answer(
    run: RunContext,
    checkpoint: str,
    question: str,
    options: list[str] | None,
    step: str,
    parsed: Callable[[Any], bool] = lambda answer: True,
) -> tuple[Any, bool, Usage]:
    """One policy.answer on a private copy of the checkpoint: (answer, mutated, usage); its
    LM calls are labelled `step` ("question 3", "probe diet") for traces.

    The replies it took reach the response cache only if the answer parsed, by the policy's
    check and by `parsed` (our own reading of it, e.g. a probe's JSON): the adapter accepts a
    reply whose text merely fits the signature, which a later check may still refuse.
    """
    state = run.policy.state_from_json(checkpoint)
    with held_until_parsed() as held:
        with (
            dspy.track_usage() as tracker,
            run.slot(),
            run.lms.context("agent"),
            call_events.step(step),
        ):
            answer = run.policy.answer(state, question, options=options)
        if answer.parse_error is None and parsed(answer):
            held.accept()
    return answer, state.model_dump_json() != checkpoint, tracked_usage(tracker)


def _probe_variable(
    run: RunContext, item: EnvironmentItem, period_index: int, variable: str, checkpoint: str
) -> tuple[ProbeResult, bool, Usage]:
    options = [str(value) for value in item.state_schema[variable]]
    question = probe_question(variable)
    answer, mutated, usage = _read_only_answer(
        run, checkpoint, question, options, f"probe {variable}"
    )
    chosen, error = _checked_choice(answer, len(options))
    gold = str(item.periods[period_index].state[variable])
    value = options[chosen - 1] if chosen else None
    probe = ProbeResult(
        variable=variable,
        question=question,
        options=options,
        chosen=chosen,
        value=value,
        gold=gold,
        correct=value == gold,
        parse_failed=error is not None,
        parse_error=error,
        raw_answer=answer.text,
        retrieved=list(answer.retrieved),
    )
    return probe, mutated, usage


def recalls_for(
    probes: Sequence[ProbeResult],
    question_probes: Sequence[QuestionProbeResult],
    question_index: int,
) -> dict[str, Recall]:
    """What one period's probe recalled for a question's variables: the question's own probe
    under paper (the original reads the same question's probe at the write period), the
    per-variable probes otherwise."""
    if question_probes:
        own = next((p for p in question_probes if p.question_index == question_index), None)
        return {} if own is None else {r.variable: r for r in own.recalls}
    return {probe.variable: probe for probe in probes}


def last_update_period(item: EnvironmentItem, variable: str, period_index: int) -> int:
    """The original's write_pos: the last period <= `period_index` whose updates set the
    variable (exposure in a session does not count); 0 when none does."""
    for index in range(period_index, -1, -1):
        if variable in (item.periods[index].updates or {}):
            return index
    return 0


def structured_probe_prompt(item: EnvironmentItem, question_index: int) -> str:
    """The paper protocol's diagnosis probe, in this toolkit's words: the question's required
    variables with their possible values, one JSON object back."""
    variables = item.qas[question_index].required_info
    schema = {v: [str(value) for value in item.state_schema[v]] for v in variables}
    example = json.dumps({variables[0]: "..."}, ensure_ascii=False) if variables else "{}"
    return (
        "From what you know about me, what is true for me right now? Each name below lists "
        f"the values it can take:\n{json.dumps(schema, indent=2, ensure_ascii=False)}\n\n"
        "Reply with only a JSON object that has every name above as a key and, as its value, "
        f"the one listed value that fits me now, copied exactly, e.g. {example}."
    )


def parse_recalled_values(text: str) -> tuple[dict[str, Any], str | None]:
    """The JSON object of a structured probe reply (a fenced block, the whole text, or its
    outermost braces), or ({}, why it could not be read)."""
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, flags=re.DOTALL)
    candidates = [fenced.group(1)] if fenced else []
    candidates.append(text)
    if "{" in text and "}" in text:
        candidates.append(text[text.index("{") : text.rindex("}") + 1])
    for candidate in candidates:
        try:
            value = json.loads(candidate.strip())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value, None
    return {}, f"no JSON object in the probe reply {text[:80]!r}"


def _probe_question(
    run: RunContext, item: EnvironmentItem, period_index: int, question_index: int, checkpoint: str
) -> tuple[QuestionProbeResult, bool, Usage]:
    query = structured_probe_prompt(item, question_index)
    answer, mutated, usage = _read_only_answer(
        run,
        checkpoint,
        query,
        None,
        f"probe question {question_index}",
        lambda reply: parse_recalled_values(reply.text)[1] is None,
    )
    values, error = (
        ({}, answer.parse_error) if answer.parse_error else parse_recalled_values(answer.text)
    )
    gold_state = item.periods[period_index].state
    recalls = []
    for variable in item.qas[question_index].required_info:
        gold = str(gold_state[variable])
        present = variable in values
        recalls.append(
            VariableRecall(
                variable=variable,
                gold=gold,
                value=values.get(variable),
                missing=not present,
                correct=present and values[variable] == gold,
            )
        )
    probe = QuestionProbeResult(
        question_index=question_index,
        query=query,
        raw_answer=answer.text,
        parse_error=error,
        recalls=recalls,
        retrieved=list(answer.retrieved),
    )
    return probe, mutated, usage


ReadOnlyOutcome = tuple[Any, bool, Usage]


@dataclass(frozen=True)
class Probed:
    """What one unit's questions and probes gave: the answers in question order, the probes
    (per variable or per question) and every read-only task's (result, mutated, usage)."""

    answers: list[Any]
    probes: list[ProbeResult]
    question_probes: list[QuestionProbeResult]
    outcomes: list[ReadOnlyOutcome]


class PerQuestionProbes:
    """The reference's diagnosis: one structured probe per question over its required
    variables, every question probed (run alongside the questions)."""

    def scope(self, config: EpisodeConfig) -> ProbeScope:
        return "all"

    def run(
        self,
        run: RunContext,
        item: EnvironmentItem,
        period_index: int,
        checkpoint: str,
        questions: Sequence[Callable[[], ReadOnlyOutcome]],
    ) -> Probed:
        tasks = list(questions) + [
            functools.partial(_probe_question, run, item, period_index, qi, checkpoint)
            for qi in range(len(item.qas))
        ]
        outcomes = run.map(tasks)
        return Probed(
            answers=[answer for answer, _, _ in outcomes[: len(questions)]],
            probes=[],
            question_probes=[probe for probe, _, _ in outcomes[len(questions) :]],
            outcomes=outcomes,
        )


class PerVariableProbes:
    """Ours: one multiple-choice probe per variable the questions need (each once per
    period); with probes = "wrong_only" only those of wrongly answered questions, which must
    wait for the answers."""

    def scope(self, config: EpisodeConfig) -> ProbeScope:
        return config.probes

    def run(
        self,
        run: RunContext,
        item: EnvironmentItem,
        period_index: int,
        checkpoint: str,
        questions: Sequence[Callable[[], ReadOnlyOutcome]],
    ) -> Probed:
        if run.config.probes == "wrong_only":
            answered = run.map(questions)
            answers = [answer for answer, _, _ in answered]
            wrong = [
                qa
                for qi, (qa, answer) in enumerate(zip(item.qas, answers, strict=True))
                if not _answered_correctly(item, period_index, qi, answer)
            ]
            variables = list(dict.fromkeys(v for qa in wrong for v in qa.required_info))
            probed = run.map(
                [
                    functools.partial(_probe_variable, run, item, period_index, v, checkpoint)
                    for v in variables
                ]
            )
            return Probed(
                answers=answers,
                probes=[probe for probe, _, _ in probed],
                question_probes=[],
                outcomes=answered + probed,
            )
        variables = required_variables(item)
        tasks = [
            functools.partial(_probe_variable, run, item, period_index, v, checkpoint)
            for v in variables
        ]
        outcomes = run.map(tasks + list(questions))
        return Probed(
            answers=[answer for answer, _, _ in outcomes[len(variables) :]],
            probes=[probe for probe, _, _ in outcomes[: len(variables)]],
            question_probes=[],
            outcomes=outcomes,
        )


# `ProtocolRules.probe_style` -> how a unit probes recall.
PROBE_STRATEGIES: dict[str, PerQuestionProbes | PerVariableProbes] = {
    "per_question": PerQuestionProbes(),
    "per_variable": PerVariableProbes(),
}


def _answered_correctly(
    item: EnvironmentItem, period_index: int, question_index: int, answer: Any
) -> bool:
    options = item.qas[question_index].answer_choices
    chosen, _ = _checked_choice(answer, len(options))
    gold_index = item.gold_choice_index(period_index, question_index)
    return chosen is not None and [str(v) for v in options[chosen - 1].state] == [
        str(v) for v in options[gold_index].state
    ]


def answer_question(
    run: RunContext, item: EnvironmentItem, question_index: int, checkpoint: str
) -> tuple[Any, bool, Usage]:
    qa = item.qas[question_index]
    options = [choice.answer for choice in qa.answer_choices]
    # A paper-variant policy's own prompt already asks for the option fitting the current
    # situation (as the reference's does); the hint would say it twice.
    asks = run.policy.rules.question_asks_for_current_situation
    question = qa.query if asks else f"{qa.query}\n{QUESTION_HINT}"
    return _read_only_answer(run, checkpoint, question, options, f"question {question_index}")


def _checked_choice(answer: Any, option_count: int) -> tuple[int | None, str | None]:
    """The 1-based choice, or None with the reason; out-of-range counts as unparseable."""
    choice = answer.choice
    if answer.parse_error:
        return None, answer.parse_error
    if isinstance(choice, bool) or not isinstance(choice, int):
        return None, f"no option number in the answer {answer.text[:80]!r}"
    if not 1 <= choice <= option_count:
        return None, f"choice {choice} is not an option number in 1..{option_count}"
    return choice, None


def item_result(
    run: RunContext,
    item: EnvironmentItem,
    period_index: int,
    question_index: int,
    answer: Any,
    probes_by_period: Sequence[Mapping[str, Recall]],
) -> ItemResult:
    qa = item.qas[question_index]
    period = item.periods[period_index]
    options = [choice.answer for choice in qa.answer_choices]
    option_states = [[str(v) for v in choice.state] for choice in qa.answer_choices]
    gold_index = item.gold_choice_index(period_index, question_index)
    gold_state = option_states[gold_index]
    chosen, error = _checked_choice(answer, len(options))
    correct = chosen is not None and option_states[chosen - 1] == gold_state
    current = {k: str(v) for k, v in period.state.items()}
    checks = check_variables(
        qa.required_info,
        current,
        {v: item.last_write_period(v, period_index) for v in qa.required_info},
        probes_by_period,
        {v: last_update_period(item, v, period_index) for v in qa.required_info},
    )
    ub = (
        run.upper_bound.correct(item.id, question_index, gold_index)
        if run.upper_bound is not None
        else None
    )
    return ItemResult(
        question_index=question_index,
        question=qa.query,
        required_info=list(qa.required_info),
        options=options,
        option_states=option_states,
        gold=gold_index + 1,
        gold_state=gold_state,
        chosen=chosen,
        chosen_state=option_states[chosen - 1] if chosen else None,
        correct=correct,
        parse_failed=error is not None,
        parse_error=error,
        raw_answer=answer.text,
        retrieved=list(answer.retrieved),
        random_score=random_score(option_states, gold_state),
        upper_bound_correct=ub,
        variables=checks,
        diagnosis=diagnose(correct, checks),
    )
