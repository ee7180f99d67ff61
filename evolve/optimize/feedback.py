"""Feedback for the reflector, built from stored evaluation records (no LLM).

Five kinds. The first two are the paper's (AMemGym Table 3, the reference code's "vanilla"
and "vanilla question-only" feedback), with no ground truth:

- ``complete``: every question of the scored period(s) with its lettered options, the
  option the assistant chose and the memory it answered from. No gold option, no
  correctness, no diagnosis. (The reference code labels the chosen option one letter too
  far; here the letter is the chosen option's own.)
- ``question_only``: the questions (without options) plus the memory.
- ``diagnostic`` (ours, `protocol = "evolve"`): per failure, the question, the chosen vs
  correct option, the diagnosis (write, read or utilization) with the variables that failed
  (recalled vs true value, and whether the value changed in that period), the user's message
  that revealed it, and the memory the policy held. Plus one line of totals.
- ``blind`` (the control): a proposal with no information about how the assistant did;
  the reflector is only asked to improve the text. It goes through the same operator and
  the same acceptance as the kinds above, so the gain of `diagnostic` over `blind` is the
  part of a gain that the feedback made, not selection on noise.
- ``none``: no reflective proposal at all (the unevolved-instructions control); the engine
  refuses to run the reflector under it.

The reflector may run on a 0.5B model with an 8k context that prefills ~150 tokens/s, so the
text is capped at `max_chars` characters (and `diagnostic` at `max_failures` failures).
The caps apply to what one proposal shows: the caller passes the results of every user the
proposal learns from in one call, never one call per user.
Diagnostic failures are ranked by how much they can teach the component being rewritten
(write failures first for `write`-side components, utilization first for `use`), spread
over distinct variables, and the order within a rank is drawn from the caller's RNG. The
engine seeds that RNG by the run seed and the proposal (GEPA iteration, or chain step and
attempt), so children of one parent see different subsets (one source of proposal
diversity) and a rerun with the same seed shows the same ones.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict

from evolve.results.objective import load_period_results
from evolve.simulator.records import Diagnosis, ItemResult, PeriodResult

_CHOSEN_CHARS = 90
_SAID_CHARS = 140
_MEMORY_CHARS = 220

# Which diagnoses teach a component most, best first.
_PRIORITY_WRITE = (Diagnosis.WRITE, Diagnosis.READ, Diagnosis.UTILIZATION)
_PRIORITY_USE = (Diagnosis.UTILIZATION, Diagnosis.READ, Diagnosis.WRITE)


FEEDBACK_KINDS = ("complete", "question_only", "diagnostic", "blind", "none")

# What the reflector is shown under `blind`: a request to improve, with nothing to learn from.
BLIND_FEEDBACK = (
    "No feedback is available: nothing is known about how the assistant did. Improve the "
    "text from its own content."
)

__all__ = [
    "BLIND_FEEDBACK",
    "FEEDBACK_KINDS",
    "Feedback",
    "build_feedback",
    "load_period_results",
]


class Feedback(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: str
    text: str
    failures_shown: int = 0
    failures_total: int = 0
    items_total: int = 0


def build_feedback(
    results: Sequence[PeriodResult],
    kind: str,
    *,
    component: str,
    max_failures: int,
    max_chars: int | None,
    rng: random.Random,
    periods: Iterable[int] | None = None,
) -> Feedback:
    """Feedback on the items of `results` (restricted to `periods` when given); `max_chars`
    None: no length cap (the reference's per-period feedback has none).

    `results` may include earlier periods than those scored: they are where the diagnosis
    finds the message that revealed a variable.
    """
    scored_periods = set(periods) if periods is not None else None
    scored = [r for r in results if scored_periods is None or r.period_index in scored_periods]
    items = [(result, item) for result in scored for item in result.items]
    if kind == "none":
        return Feedback(kind=kind, text="", items_total=len(items))
    if kind == "blind":
        return Feedback(kind=kind, text=BLIND_FEEDBACK, items_total=len(items))
    if kind in ("complete", "question_only"):
        return _answers_and_memory(items, kind, max_chars)
    if kind != "diagnostic":
        raise ValueError(
            f"unknown feedback kind {kind!r}; expected one of {', '.join(FEEDBACK_KINDS)}"
        )

    history = {(r.user_id, r.period_index): r for r in results}
    failures = [(result, item) for result, item in items if not item.correct]
    counts = dict.fromkeys(Diagnosis, 0)
    for _, item in items:
        counts[item.diagnosis] += 1
    correct = counts[Diagnosis.CORRECT]
    header = (
        f"{correct} of {len(items)} answers were correct. Wrong: {counts[Diagnosis.WRITE]} "
        f"write (the memory never held the right value), {counts[Diagnosis.READ]} read (it was "
        f"stored once, then lost), {counts[Diagnosis.UTILIZATION]} use (memory right, answer "
        f"wrong)."
    )
    if not failures:
        return Feedback(
            kind=kind,
            text=header + " No failures to show.",
            failures_total=0,
            items_total=len(items),
        )
    ordered = _rank_failures(failures, component, rng)
    blocks: list[str] = []
    length = len(header) + len("\nFailures:")
    shown: set[str] = set()
    for result, item in ordered:
        if len(blocks) >= max_failures:
            break
        block = _describe_failure(len(blocks) + 1, result, item, history)
        # Users with the same story fail the same way: one copy teaches as much.
        signature = block.split(".", 1)[1]
        if signature in shown:
            continue
        shown.add(signature)
        if max_chars is not None and length + len(block) + 1 > max_chars:
            if blocks:
                break
            block = block[: max(0, max_chars - length - 4)] + "..."
        blocks.append(block)
        length += len(block) + 1
    text = "\n".join([header, "Failures:", *blocks])
    return Feedback(
        kind=kind,
        text=text,
        failures_shown=len(blocks),
        failures_total=len(failures),
        items_total=len(items),
    )


def _answers_and_memory(
    items: Sequence[tuple[PeriodResult, ItemResult]], kind: str, max_chars: int | None
) -> Feedback:
    """The paper's feedback: per question, the question (with lettered options and the
    option chosen under `complete`) and the memory the answer was given from.

    The memory is shown once per user-period when every question of it saw the same memory
    (a policy that keeps all memory in its prompt), else with each question (retrieval).
    """
    with_choices = kind == "complete"
    blocks: list[str] = []
    groups = _by_user_period(items)
    # One proposal may learn from several users: their periods are told apart (a single
    # user's text, as in the paper's per-user chain, is unchanged).
    several_users = len({result.user_id for result, _ in groups}) > 1
    for result, group in groups:
        memories = [_answer_memory(result, item) for item in group]
        shared = len(set(memories)) == 1
        user = f"User {result.user_id}, period" if several_users else "Period"
        lines = [f"{user} {result.period_index}:"]
        if shared:
            lines.append(f"Memory the assistant had: {memories[0]}")
        for number, (item, memory) in enumerate(zip(group, memories, strict=True), start=1):
            lines.append(f"Question {number}: {' '.join(item.question.split())}")
            if with_choices:
                lines.extend(
                    f"  ({_letter(index)}) {' '.join(option.split())}"
                    for index, option in enumerate(item.options)
                )
                chosen = (
                    f"({_letter(item.chosen - 1)})"
                    if item.chosen is not None
                    else "no valid option (unparseable answer)"
                )
                lines.append(f"  The assistant chose: {chosen}")
            if not shared:
                lines.append(f"  Memory it had for this question: {memory}")
        blocks.append("\n".join(lines))
    text = "\n\n".join(blocks)
    if max_chars is not None and len(text) > max_chars:
        text = text[: max(0, max_chars - 3)] + "..."
    return Feedback(kind=kind, text=text, items_total=len(items))


def _by_user_period(
    items: Sequence[tuple[PeriodResult, ItemResult]],
) -> list[tuple[PeriodResult, list[ItemResult]]]:
    groups: dict[tuple[str, int], tuple[PeriodResult, list[ItemResult]]] = {}
    for result, item in items:
        groups.setdefault((result.user_id, result.period_index), (result, []))[1].append(item)
    return list(groups.values())


def _answer_memory(result: PeriodResult, item: ItemResult) -> str:
    """What the policy answered from: its retrieved memories, else its whole memory."""
    if item.retrieved:
        return " | ".join(" ".join(str(entry).split()) for entry in item.retrieved)
    return " ".join((result.memory_description or "(empty)").split())


def _letter(index: int) -> str:
    return string.ascii_uppercase[index] if index < 26 else str(index + 1)


def _rank_failures(
    failures: Sequence[tuple[PeriodResult, ItemResult]], component: str, rng: random.Random
) -> list[tuple[PeriodResult, ItemResult]]:
    priority = _PRIORITY_USE if component.startswith("use") else _PRIORITY_WRITE
    shuffled = list(failures)
    rng.shuffle(shuffled)
    shuffled.sort(key=lambda pair: priority.index(pair[1].diagnosis))
    # Spread over variables: a failure whose variables were all shown already goes last.
    picked: list[tuple[PeriodResult, ItemResult]] = []
    deferred: list[tuple[PeriodResult, ItemResult]] = []
    covered: set[str] = set()
    for result, item in shuffled:
        variables = set(_failed_variables(item)) or set(item.required_info)
        if variables <= covered:
            deferred.append((result, item))
        else:
            covered |= variables
            picked.append((result, item))
    return picked + deferred


def _failed_variables(item: ItemResult) -> list[str]:
    return [check.variable for check in item.variables if not check.correct_now]


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe_failure(
    number: int,
    result: PeriodResult,
    item: ItemResult,
    history: dict[tuple[str, int], PeriodResult],
) -> str:
    chosen = (
        f'"{_clip(item.options[item.chosen - 1], _CHOSEN_CHARS)}"'
        if item.chosen is not None
        else "no valid option (unparseable answer)"
    )
    correct = _clip(item.options[item.gold - 1], _CHOSEN_CHARS)
    lines = [
        f'{number}. Period {result.period_index}, question: "{_clip(item.question, 120)}"',
        f'   answered {chosen}; correct "{correct}"',
    ]
    if item.diagnosis == Diagnosis.UTILIZATION:
        known = ", ".join(f"{c.variable}={c.gold}" for c in item.variables)
        lines.append(f"   cause: use - memory recalled every needed fact ({known}), answer wrong")
    else:
        causes = []
        for check in item.variables:
            if check.correct_now:
                continue
            changed = result.state_updates.get(check.variable)
            change = (
                f", changed from {changed.get('old')} this period"
                if changed and changed.get("old") is not None
                else ""
            )
            recalled = check.probed if check.probed is not None else "nothing"
            causes.append(f"{check.variable} is {check.gold}{change}; memory recalled {recalled}")
        lines.append(f"   cause: {item.diagnosis.value} - " + "; ".join(causes))
        said = _revealing_message(item, result, history)
        if said:
            lines.append(f'   the user had said: "{said}"')
    memory = _clip(result.memory_description or "(empty)", _MEMORY_CHARS)
    lines.append(f"   memory held: {memory}")
    return "\n".join(lines)


def _revealing_message(
    item: ItemResult, result: PeriodResult, history: dict[tuple[str, int], PeriodResult]
) -> str | None:
    """The opening message of the session that last exposed a failed variable."""
    for check in item.variables:
        if check.correct_now:
            continue
        source = history.get((result.user_id, check.last_write_period))
        if source is None:
            continue
        for session in source.sessions:
            if check.variable in session.exposed_states:
                return _clip(session.query, _SAID_CHARS)
    return None
