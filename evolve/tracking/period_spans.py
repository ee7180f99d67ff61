"""The span tree of one user-period inside an episode trace, built from the unit's result
and the LLM calls made while it was played.

`period <p>` (from the unit's start to its end; the gold state in, the accuracy out) > one
span per step: `session <s>` (the opening query and the messages), `memory checkpoint` (the
policy's description of its memory), `question <q>` (question and options in; raw answer,
choice, gold, diagnosis out) and `probe <variable>` / `probe question <q>` (the diagnosis
probes). A step's span runs from its first LLM call to its last (at the period's end when it
made none) and holds those calls; a call that a policy's predictor labelled sits in a span
named after it ("question 3" > "use" > "llm agent").

Every LLM call is a span `llm <role>`: the messages sent, the completions, latency, whether
the response cache answered it, and its tokens under MLflow's `mlflow.chat.tokenUsage`.
Which period a call belongs to, and when a trace starts and ends: `evolve.tracking.tracing`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evolve.llm.call_events import LMCall
    from evolve.simulator.records import PeriodResult


def start_period_span(root: Any, result: PeriodResult, start_ns: int) -> Any:
    """The open span `period <p>` under the episode's `root`, with the period's gold state."""
    import mlflow

    return mlflow.start_span_no_context(
        f"period {result.period_index}",
        span_type="CHAIN",
        parent_span=root,
        inputs={
            "period_start": result.period_start,
            "period_end": result.period_end,
            "state": result.state,
            "state_updates": result.state_updates,
        },
        start_time_ns=start_ns,
    )


def record_step_spans(period: Any, result: PeriodResult, calls: list[LMCall], at_ns: int) -> None:
    """One span per step of `result` under `period`, each holding the calls made in it; a
    call of no step the result names goes directly under `period`."""
    by_step: dict[str, list[LMCall]] = {}
    for call in calls:
        by_step.setdefault(call.steps[0] if call.steps else "", []).append(call)
    for session in result.sessions:
        name = f"session {session.session_index}"
        step_span(
            period,
            name,
            "AGENT",
            {"session_time": session.session_time, "query": session.query},
            {
                "messages": [m.model_dump(mode="json") for m in session.messages],
                "rounds_completed": session.rounds_completed,
                "ended_early": session.ended_early,
            },
            by_step.pop(name, []),
            at_ns,
        )
    step_span(
        period,
        "memory checkpoint",
        "MEMORY",
        {"period": result.period_index},
        {"memory": result.memory_description},
        [],
        at_ns,
    )
    for item in result.items:
        name = f"question {item.question_index}"
        step_span(
            period,
            name,
            "TASK",
            {"question": item.question, "options": item.options},
            {
                "raw_answer": item.raw_answer,
                "chosen": item.chosen,
                "gold": item.gold,
                "correct": item.correct,
                "parse_error": item.parse_error,
                "retrieved": item.retrieved,
                "diagnosis": str(item.diagnosis),
            },
            by_step.pop(name, []),
            at_ns,
        )
    for probe in result.probes:
        name = f"probe {probe.variable}"
        step_span(
            period,
            name,
            "TASK",
            {"question": probe.question, "options": probe.options},
            {"value": probe.value, "gold": probe.gold, "correct": probe.correct},
            by_step.pop(name, []),
            at_ns,
        )
    for question_probe in result.question_probes:
        name = f"probe question {question_probe.question_index}"
        step_span(
            period,
            name,
            "TASK",
            {"query": question_probe.query},
            {
                "raw_answer": question_probe.raw_answer,
                "recalls": [r.model_dump(mode="json") for r in question_probe.recalls],
            },
            by_step.pop(name, []),
            at_ns,
        )
    for leftover in by_step.values():
        for call in leftover:
            llm_span(period, call)


def period_accuracy(result: PeriodResult) -> float | None:
    """The period's accuracy (the period span's output), None when it asked no question."""
    correct = sum(item.correct for item in result.items)
    return correct / len(result.items) if result.items else None


def step_span(
    parent: Any,
    name: str,
    kind: str,
    inputs: Any,
    outputs: Any,
    calls: list[LMCall],
    at_ns: int,
) -> None:
    """A step of the period (session, question, probe) from its first call's start to
    its last call's end (at `at_ns` when it made none), holding its calls; a call made
    by a policy's predictor sits in a span named after it ("write", "use")."""
    import mlflow

    span = mlflow.start_span_no_context(
        name,
        span_type=kind,
        parent_span=parent,
        inputs=inputs,
        start_time_ns=min((c.started_ns for c in calls), default=at_ns),
    )
    for call in calls:
        if len(call.steps) < 2:
            llm_span(span, call)
            continue
        predictor = mlflow.start_span_no_context(
            call.steps[-1],
            span_type="MEMORY" if call.steps[-1].startswith("write") else "CHAIN",
            parent_span=span,
            start_time_ns=call.started_ns,
        )
        llm_span(predictor, call)
        predictor.end(end_time_ns=call.ended_ns)
    span.end(outputs=outputs, end_time_ns=max((c.ended_ns for c in calls), default=at_ns))


def llm_span(parent: Any, call: LMCall) -> None:
    """One LLM call: messages in, completions out, tokens (under MLflow's token-usage
    attribute, which fills the Traces table's Tokens column) and latency."""
    import mlflow
    from mlflow.tracing.constant import SpanAttributeKey, TokenUsageKey

    span = mlflow.start_span_no_context(
        f"llm {call.role}",
        span_type="CHAT_MODEL",
        parent_span=parent,
        inputs={"messages": call.messages},
        attributes={
            "role": call.role,
            "latency_s": round((call.ended_ns - call.started_ns) / 1e9, 6),
            "cached": call.cached,
            SpanAttributeKey.CHAT_USAGE: {
                TokenUsageKey.INPUT_TOKENS: call.prompt_tokens,
                TokenUsageKey.OUTPUT_TOKENS: call.completion_tokens,
                TokenUsageKey.TOTAL_TOKENS: call.prompt_tokens + call.completion_tokens,
            },
        },
        start_time_ns=call.started_ns,
    )
    if call.error is not None:
        span.set_attribute("error", call.error)
    span.end(outputs={"completions": call.completions}, end_time_ns=call.ended_ns)
