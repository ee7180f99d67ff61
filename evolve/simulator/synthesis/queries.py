"""The opening-queries stage: per period, one opening message per session that reveals its
variables, each checked by a classifier (which values does this message reveal?) and refined
until they are read back as intended.
"""

from __future__ import annotations

from typing import Any

import dspy

from evolve.core.seeds import derive_rng
from evolve.simulator.synthesis.calls import Refinement, StageCalls, numbered, options_text
from evolve.simulator.synthesis.offline import _advance, _groups, _session_times
from evolve.simulator.synthesis.report import Stage
from evolve.simulator.synthesis.signatures import (
    InferValues,
    RefineQuery,
    WriteQueries,
    options_model,
    with_output_type,
)
from evolve.simulator.synthesis.validate import check_texts, quoted_identifiers


def session_groups(
    calls: StageCalls,
    period: int,
    schema: dict[str, list[str]],
    events: list[list[dict[str, Any]]],
) -> list[tuple[list[str], str | None]]:
    if period == 0:
        rng = derive_rng("initial-sessions", calls.seed, calls.user_id)
        groups = _groups(rng, list(schema), calls.config.variables_per_initial_session)
        return [([var for var in schema if var in group], None) for group in groups]
    return [(event["variables"], event["event"]) for event in events[period]]


def write_queries(
    calls: StageCalls,
    period: int,
    schema: dict[str, list[str]],
    states: list[dict[str, str]],
    updates: list[dict[str, Any]],
    events: list[list[dict[str, Any]]],
) -> dict[str, Any]:
    config = calls.config
    unit = f"queries_p{period:02d}"
    state = states[period]
    groups = session_groups(calls, period, schema, events)
    lines = []
    for variables, event in groups:
        if event is None:
            context = "an early conversation"
            reveal = ", ".join(f"{var} = {state[var]}" for var in variables)
        else:
            context = event
            old = updates[period]["old"]
            reveal = ", ".join(f"{var} = {state[var]} (was {old[var]})" for var in variables)
        lines.append(f"context: {context}; reveal: {reveal}")
    day = config.start_date if period == 0 else _advance(config, period)
    names = list(schema)

    def check(prediction: dspy.Prediction) -> tuple[list[str], list[str]]:
        texts, problems = check_texts(prediction.queries, len(groups), "messages")
        for number, text in enumerate(texts, 1):
            quoted = quoted_identifiers(text, names)
            if quoted:
                problems.append(f"message {number} quotes variable names {quoted}")
        return texts, problems

    queries = calls.checked(
        Stage.QUERIES,
        unit,
        WriteQueries,
        check,
        profile=calls.profile_text,
        date=f"{day:%Y-%m-%d}",
        sessions=numbered(lines),
        language=config.language_name,
    )
    times = _session_times(
        derive_rng("session-times", calls.seed, calls.user_id, period), day, len(groups)
    )
    sessions = []
    for session, ((variables, event), query) in enumerate(zip(groups, queries, strict=True)):
        exposed = {var: state[var] for var in variables}
        query = checked_query(calls, unit, session, query, exposed, schema)
        sessions.append(
            {
                "event": event,
                "exposed_states": exposed,
                "query": query,
                "session_time": times[session],
            }
        )
    return {"sessions": sessions}


def infer_values(
    calls: StageCalls, unit: str, session: int, round_: int, query: str, exposed: dict[str, str],
    schema: dict[str, list[str]],
) -> tuple[bool, str]:  # fmt: skip
    model = options_model("Inferred", {var: schema[var] for var in exposed})
    signature = with_output_type(InferValues, "inferred", model)
    prediction, error = calls.call(
        Stage.QUERIES,
        signature,
        key=f"{unit}/infer{session}/{round_}",
        creative=False,
        message=query,
        variables=options_text(schema, list(exposed)),
    )
    if prediction is None:
        return False, f"the classifier's output was unparseable ({error})"
    inferred = prediction.inferred.model_dump(by_alias=True)
    wrong = [
        f"{var} read as {inferred.get(var)!r} instead of {value!r}"
        for var, value in exposed.items()
        if inferred.get(var) != value
    ]
    return not wrong, "; ".join(wrong)


def checked_query(
    calls: StageCalls,
    unit: str,
    session: int,
    query: str,
    exposed: dict[str, str],
    schema: dict[str, list[str]],
) -> str:
    """`query`, refined until the classifier reads the exposed values back from it."""
    reveal = (
        options_text(schema, list(exposed))
        + "\nintended: "
        + ", ".join(f"{var} = {value}" for var, value in exposed.items())
    )
    refinement = Refinement(
        stage=Stage.QUERIES,
        unit=unit,
        subject=f"session {session + 1}",
        budget=calls.config.retries.query_refinements,
        judge=lambda text, round_: infer_values(
            calls, unit, session, round_, text, exposed, schema
        ),
        signature=RefineQuery,
        key=f"{unit}/refine{session}",
        inputs=lambda text, problem: {
            "message": text,
            "reveal": reveal,
            "problem": problem,
            "language": calls.config.language_name,
        },
        output="refined_query",
        empty="empty message",
    )
    return calls.refine(refinement, query)
