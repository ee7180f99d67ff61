"""The built-in feedback kinds.

Five kinds. The first two are the paper's (AMemGym Table 3, the reference code's "vanilla"
and "vanilla question-only" feedback), with no ground truth:

- ``complete``: every question of the scored period(s) with its lettered options, the
  option the assistant chose and the memory it answered from. No gold option, no
  correctness, no diagnosis. (The reference code labels the chosen option one letter too
  far; here the letter is the chosen option's own.)
- ``question_only``: the questions (without options) plus the memory.
- ``diagnostic`` (ours, `protocol = "evolve"`): per failure, the question, the chosen vs
  correct option, the diagnosis (write, read or utilization) with the facts that failed
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
over distinct facts, and the order within a rank is drawn from the caller's RNG. The
engine seeds that RNG by the run seed and the proposal (GEPA iteration, or chain step and
attempt), so children of one parent see different subsets (one source of proposal
diversity) and a rerun with the same seed shows the same ones.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence

from evolve.feedback.kinds import Feedback, FeedbackKind, register_feedback_kind
from evolve.feedback.questions import AnsweredQuestion
from evolve.simulator.records import Diagnosis

_CHOSEN_CHARS = 90
_SAID_CHARS = 140
_MEMORY_CHARS = 220

# Which diagnoses teach a component most, best first.
_PRIORITY_WRITE = (Diagnosis.WRITE, Diagnosis.READ, Diagnosis.UTILIZATION)
_PRIORITY_USE = (Diagnosis.UTILIZATION, Diagnosis.READ, Diagnosis.WRITE)

# What the reflector is shown under `blind`: a request to improve, with nothing to learn from.
BLIND_FEEDBACK = (
    "No feedback is available: nothing is known about how the assistant did. Improve the "
    "text from its own content."
)


class NoFeedback(FeedbackKind):
    """`none`: nothing is proposed, so nothing is shown."""

    name = "none"
    proposes = False

    def render(self, questions, *, component, max_failures, max_chars, rng) -> Feedback:
        return Feedback(kind=self.name, text="", items_total=len(questions))


class BlindFeedback(FeedbackKind):
    """`blind`: a request to improve the text, with nothing to learn from."""

    name = "blind"

    def render(self, questions, *, component, max_failures, max_chars, rng) -> Feedback:
        return Feedback(kind=self.name, text=BLIND_FEEDBACK, items_total=len(questions))


class CompleteFeedback(FeedbackKind):
    """`complete` (the paper's): questions, lettered options, the choice and the memory."""

    name = "complete"
    with_choices = True

    def render(self, questions, *, component, max_failures, max_chars, rng) -> Feedback:
        """The memory is shown once per user-period when every question of it saw the same
        memory (a policy that keeps all memory in its prompt), else with each question
        (retrieval)."""
        blocks: list[str] = []
        groups = _by_user_period(questions)
        # One proposal may learn from several users: their periods are told apart (a single
        # user's text, as in the paper's per-user chain, is unchanged).
        several_users = len({group[0].user_id for group in groups}) > 1
        for group in groups:
            memories = [question.answered_from for question in group]
            shared = len(set(memories)) == 1
            first = group[0]
            user = f"User {first.user_id}, period" if several_users else "Period"
            lines = [f"{user} {first.period}:"]
            if shared:
                lines.append(f"Memory the assistant had: {memories[0]}")
            for number, (question, memory) in enumerate(zip(group, memories, strict=True), 1):
                lines.append(f"Question {number}: {' '.join(question.question.split())}")
                if self.with_choices:
                    lines.extend(
                        f"  ({_letter(index)}) {' '.join(option.split())}"
                        for index, option in enumerate(question.options)
                    )
                    chosen = (
                        f"({_letter(question.chosen - 1)})"
                        if question.chosen is not None
                        else "no valid option (unparseable answer)"
                    )
                    lines.append(f"  The assistant chose: {chosen}")
                if not shared:
                    lines.append(f"  Memory it had for this question: {memory}")
            blocks.append("\n".join(lines))
        text = "\n\n".join(blocks)
        if max_chars is not None and len(text) > max_chars:
            text = text[: max(0, max_chars - 3)] + "..."
        return Feedback(kind=self.name, text=text, items_total=len(questions))


class QuestionOnlyFeedback(CompleteFeedback):
    """`question_only` (the paper's): the questions, without options, and the memory."""

    name = "question_only"
    with_choices = False


class DiagnosticFeedback(FeedbackKind):
    """`diagnostic` (ours): each failure with its truth, diagnosis and the memory held."""

    name = "diagnostic"

    def render(self, questions, *, component, max_failures, max_chars, rng) -> Feedback:
        failures = [question for question in questions if not question.correct]
        counts = dict.fromkeys(Diagnosis, 0)
        for question in questions:
            counts[question.diagnosis] += 1
        header = self.totals(counts, len(questions))
        if not failures:
            return Feedback(
                kind=self.name,
                text=header + " No failures to show.",
                items_total=len(questions),
            )
        blocks: list[str] = []
        shown: list[AnsweredQuestion] = []
        length = len(header) + len("\nFailures:")
        signatures: set[tuple] = set()
        for failure in _rank_failures(failures, component, rng):
            if len(blocks) >= max_failures:
                break
            # Users with the same story fail the same way: one copy teaches as much.
            signature = _story(failure)
            if signature in signatures:
                continue
            signatures.add(signature)
            block = self.describe(len(blocks) + 1, failure)
            if max_chars is not None and length + len(block) + 1 > max_chars:
                if blocks:
                    break
                block = block[: max(0, max_chars - length - 4)] + "..."
            blocks.append(block)
            shown.append(failure)
            length += len(block) + 1
        return Feedback(
            kind=self.name,
            text="\n".join([header, "Failures:", *blocks]),
            failures_shown=len(blocks),
            failures_total=len(failures),
            items_total=len(questions),
            failures=tuple(shown),
        )

    def totals(self, counts: dict[Diagnosis, int], total: int) -> str:
        """The line of totals that opens the feedback."""
        return (
            f"{counts[Diagnosis.CORRECT]} of {total} answers were correct. Wrong: "
            f"{counts[Diagnosis.WRITE]} write (the memory never held the right value), "
            f"{counts[Diagnosis.READ]} read (it was stored once, then lost), "
            f"{counts[Diagnosis.UTILIZATION]} use (memory right, answer wrong)."
        )

    def describe(self, number: int, failure: AnsweredQuestion) -> str:
        """One failure's block: the question, the answer against the correct option, the
        diagnosis with the facts that failed, the user's words and the memory held."""
        chosen = (
            f'"{_clip(failure.options[failure.chosen - 1], _CHOSEN_CHARS)}"'
            if failure.chosen is not None
            else "no valid option (unparseable answer)"
        )
        correct = _clip(failure.options[failure.gold - 1], _CHOSEN_CHARS)
        lines = [
            f'{number}. Period {failure.period}, question: "{_clip(failure.question, 120)}"',
            f'   answered {chosen}; correct "{correct}"',
        ]
        if failure.diagnosis == Diagnosis.UTILIZATION:
            known = ", ".join(f"{fact.variable}={fact.gold}" for fact in failure.facts)
            lines.append(
                f"   cause: use - memory recalled every needed fact ({known}), answer wrong"
            )
        else:
            causes = []
            for fact in failure.facts:
                if fact.in_memory:
                    continue
                change = (
                    f", changed from {fact.changed_from} this period"
                    if fact.changed_from is not None
                    else ""
                )
                recalled = fact.recalled if fact.recalled is not None else "nothing"
                causes.append(f"{fact.variable} is {fact.gold}{change}; memory recalled {recalled}")
            lines.append(f"   cause: {failure.diagnosis.value} - " + "; ".join(causes))
            if failure.user_said:
                lines.append(f'   the user had said: "{_clip(failure.user_said, _SAID_CHARS)}"')
        memory = _clip(failure.memory_held or "(empty)", _MEMORY_CHARS)
        lines.append(f"   memory held: {memory}")
        return "\n".join(lines)


def _story(failure: AnsweredQuestion) -> tuple:
    """What a failure shows, whoever the user: two users with one story are shown once."""
    chosen = failure.options[failure.chosen - 1] if failure.chosen is not None else None
    facts = tuple(
        (fact.variable, fact.gold, fact.recalled, fact.in_memory, fact.changed_from)
        for fact in failure.facts
    )
    said = failure.user_said if failure.diagnosis != Diagnosis.UTILIZATION else None
    return (
        failure.period,
        failure.question,
        chosen,
        failure.options[failure.gold - 1],
        failure.diagnosis,
        facts,
        said,
        failure.memory_held,
    )


def _by_user_period(questions: Sequence[AnsweredQuestion]) -> list[list[AnsweredQuestion]]:
    groups: dict[tuple[str, int], list[AnsweredQuestion]] = {}
    for question in questions:
        groups.setdefault((question.user_id, question.period), []).append(question)
    return list(groups.values())


def _letter(index: int) -> str:
    return string.ascii_uppercase[index] if index < 26 else str(index + 1)


def _rank_failures(
    failures: Sequence[AnsweredQuestion], component: str, rng: random.Random
) -> list[AnsweredQuestion]:
    priority = _PRIORITY_USE if component.startswith("use") else _PRIORITY_WRITE
    shuffled = list(failures)
    rng.shuffle(shuffled)
    shuffled.sort(key=lambda failure: priority.index(failure.diagnosis))
    # Spread over facts: a failure whose facts were all shown already goes last.
    picked: list[AnsweredQuestion] = []
    deferred: list[AnsweredQuestion] = []
    covered: set[str] = set()
    for failure in shuffled:
        facts = set(failure.missing_facts()) or set(failure.required_facts)
        if facts <= covered:
            deferred.append(failure)
        else:
            covered |= facts
            picked.append(failure)
    return picked + deferred


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


for _kind in (
    CompleteFeedback,
    QuestionOnlyFeedback,
    DiagnosticFeedback,
    BlindFeedback,
    NoFeedback,
):
    register_feedback_kind(_kind, builtin=True)
