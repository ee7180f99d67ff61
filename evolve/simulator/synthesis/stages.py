"""The synthesis stages up to the state trajectory: profile, questions, schema refinement,
initial state, and per period the state updates and the life events behind them. Each is one
checked call (`StageCalls.checked`): its output validated, the call retried with the
problems fed back. The answers and the opening queries are `answers` and `queries`.
"""

from __future__ import annotations

from datetime import date
from typing import Any

import dspy

from evolve.simulator.synthesis.calls import StageCalls, options_text
from evolve.simulator.synthesis.config import LLMSynthesisConfig
from evolve.simulator.synthesis.offline import DATE_FORMAT, _advance
from evolve.simulator.synthesis.personas import PersonaRecord
from evolve.simulator.synthesis.report import Stage
from evolve.simulator.synthesis.signatures import (
    DraftQuestions,
    ExtractProfile,
    GroupInfoTypes,
    NarrateEvents,
    PickInitialState,
    UnifyOptions,
    UpdateState,
    options_model,
    with_output_type,
)
from evolve.simulator.synthesis.validate import (
    QuestionSpec,
    check_changes,
    check_events,
    check_groups,
    check_profile,
    check_questions,
    check_unified,
    info_type_occurrences,
)

# Earlier period summaries shown to the update step: enough for continuity, bounded prompts.
_EARLIER_SUMMARIES = 3
_PROFILE_FIELDS = (
    "name",
    "age",
    "gender",
    "marital_status",
    "education_level",
    "occupation",
    "hobbies_and_interests",
    "skills_and_expertise",
    "complementary_info",
)


def horizon(config: LLMSynthesisConfig) -> str:
    return f"the {config.total_months} months from {config.start_date:%Y-%m-%d}"


def choices_text(config: LLMSynthesisConfig) -> str:
    low, high = config.choices_per_state
    return str(low) if low == high else f"{low} to {high}"


def period_dates(config: LLMSynthesisConfig, period: int) -> tuple[date, date]:
    return _advance(config, period - 1), _advance(config, period)


def write_profile(calls: StageCalls, persona: PersonaRecord) -> dict[str, Any]:
    basic = "\n".join(f"{key}: {value}" for key, value in persona.facts.items())
    extra = "\n".join(f"{key}: {value}" for key, value in persona.texts.items())
    name, summary = calls.checked(
        Stage.PROFILE,
        "profile",
        ExtractProfile,
        lambda p: check_profile(str(p.name), str(p.summary), persona.known_name),
        basic_profile=basic or "(none)",
        extra_info=extra[: calls.config.profile_chars] or "(none)",
        language=calls.config.language_name,
    )
    profile: dict[str, Any] = {
        "uuid": persona.user_id,
        "name": name,
        **persona.facts,
        "complementary_info": summary,
    }
    profile["formatted_str"] = "\n".join(
        f"{key}: {profile[key]}" for key in _PROFILE_FIELDS if key in profile
    )
    return profile


def draft_questions(calls: StageCalls) -> list[dict[str, Any]]:
    config = calls.config
    requirements = (
        f"Exactly {config.num_questions} questions. Each has exactly "
        f"{config.states_per_question} required_info items with {choices_text(calls.config)} "
        "options each."
    )
    specs = calls.checked(
        Stage.QUESTIONS,
        "questions",
        DraftQuestions,
        lambda p: check_questions(p.questions, config),
        creative=True,
        profile=calls.profile_text,
        horizon=horizon(calls.config),
        requirements=requirements,
        language=config.language_name,
    )
    return [spec.model_dump() for spec in specs]


def group_schema(calls: StageCalls, questions: list[QuestionSpec]) -> dict[str, Any]:
    """Merge overlapping info types into variables and give each one option list."""
    config = calls.config
    occurrences = info_type_occurrences(questions)
    listing = [f"q{i + 1}: {q.question}" for i, q in enumerate(questions)] + [
        f"- {info_type}: {' | '.join(uses[0][1])} (in "
        f"{', '.join(f'q{index + 1}' for index, _ in uses)})"
        for info_type, uses in occurrences.items()
    ]
    mapping = calls.checked(
        Stage.SCHEMA,
        "schema",
        GroupInfoTypes,
        lambda p: check_groups(p.variables, questions, config),
        info_types="\n".join(listing),
    )
    members: dict[str, list[str]] = {}
    for info_type in occurrences:
        members.setdefault(mapping[info_type], []).append(info_type)
    schema: dict[str, list[str]] = {}
    conflicts: dict[str, list[tuple[int, list[str]]]] = {}
    for variable, info_types in members.items():
        uses = [use for info_type in info_types for use in occurrences[info_type]]
        option_lists = {tuple(options) for _, options in uses}
        if len(option_lists) == 1:
            schema[variable] = list(uses[0][1])
        else:
            conflicts[variable] = uses
    if conflicts:
        merged = "\n".join(
            f"- {variable}: "
            + "; ".join(f"q{index + 1} options {' | '.join(opts)}" for index, opts in uses)
            for variable, uses in conflicts.items()
        )
        unified = calls.checked(
            Stage.SCHEMA,
            "schema_options",
            UnifyOptions,
            lambda p: check_unified(p.unified, list(conflicts), config),
            profile=calls.profile_text,
            horizon=horizon(calls.config),
            merged="\n".join(
                [*(f"q{i + 1}: {q.question}" for i, q in enumerate(questions)), merged]
            ),
            requirements=f"{choices_text(calls.config)} options per variable.",
        )
        schema.update(unified)
    ordered = {variable: schema[variable] for variable in members}
    canonical = [
        QuestionSpec.model_validate(
            {
                "question": question.question,
                "required_info": [
                    {"info_type": mapping[t], "info_choices": ordered[mapping[t]]}
                    for t in question.info_types
                ],
            }
        ).model_dump()
        for question in questions
    ]
    return {"schema": ordered, "questions": canonical, "mapping": mapping}


def pick_initial_state(calls: StageCalls, schema: dict[str, list[str]]) -> dict[str, str]:
    model = options_model("InitialState", schema)
    signature = with_output_type(PickInitialState, "initial_state", model)

    def check(prediction: dspy.Prediction) -> tuple[dict[str, str], list[str]]:
        state = prediction.initial_state.model_dump(by_alias=True)
        return {var: state[var] for var in schema}, []

    return calls.checked(
        Stage.INITIAL_STATE,
        "initial_state",
        signature,
        check,
        profile=calls.profile_text,
        start_date=f"{calls.config.start_date:%Y-%m-%d}",
        horizon=horizon(calls.config),
        variables=options_text(schema),
    )


def update_state(
    calls: StageCalls,
    period: int,
    schema: dict[str, list[str]],
    state: dict[str, str],
    counts: dict[str, int],
    updates: list[dict[str, Any]],
) -> dict[str, Any]:
    config = calls.config
    start, end = period_dates(calls.config, period)
    limit = config.max_changes_per_state
    variables = "\n".join(
        f"- {var}: now {state[var]}; options {' | '.join(values)}; changed {counts[var]} of "
        f"at most {limit} times" + (" (may not change again)" if counts[var] >= limit else "")
        for var, values in schema.items()
    )
    earlier = [
        f"period {index}: {update['period_summary']}"
        for index, update in enumerate(updates)
        if update
    ][-_EARLIER_SUMMARIES:]
    low, high = config.changes_per_period
    span = str(low) if low == high else f"between {low} and {high}"

    # The accepted prediction's summary goes with its changes.
    accepted: dict[str, str] = {}

    def check(prediction: dspy.Prediction) -> tuple[dict[str, str], list[str]]:
        changes, problems = check_changes(prediction.changes, schema, state, counts, config, period)
        summary = " ".join(str(prediction.period_summary).split())
        if not summary:
            problems.append("period_summary is empty")
        if not problems:
            accepted["summary"] = summary
        return changes, problems

    changes = calls.checked(
        Stage.UPDATES,
        f"updates_p{period:02d}",
        UpdateState,
        check,
        creative=True,
        profile=calls.profile_text,
        period=f"{start:%Y-%m-%d} to {end:%Y-%m-%d} (period {period} of {config.num_periods})",
        variables=variables,
        earlier="\n".join(earlier) or "none",
        requirements=f"Change {span} variables.",
        language=config.language_name,
    )
    return {
        "period_start": start.strftime(DATE_FORMAT),
        "period_end": end.strftime(DATE_FORMAT),
        "period_summary": accepted["summary"],
        "changes": {var: changes[var] for var in schema if var in changes},
        "old": {var: state[var] for var in schema if var in changes},
    }


def narrate_events(
    calls: StageCalls,
    period: int,
    update: dict[str, Any],
    previous: dict[str, str],
    state: dict[str, str],
) -> list[dict[str, Any]]:
    changed = list(update["changes"])
    unchanged = [var for var in state if var not in update["changes"]]
    events = calls.checked(
        Stage.EVENTS,
        f"events_p{period:02d}",
        NarrateEvents,
        lambda p: check_events(p.events, changed, unchanged),
        profile=calls.profile_text,
        period=f"{update['period_start']} to {update['period_end']}: {update['period_summary']}",
        changes="\n".join(f"- {var}: {previous[var]} -> {state[var]}" for var in changed),
        unchanged="\n".join(f"- {var}: {state[var]}" for var in unchanged) or "none",
        language=calls.config.language_name,
    )
    return [{"variables": variables, "event": text} for variables, text in events]
