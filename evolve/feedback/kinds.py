"""Feedback kinds: what the reflector is shown about an evaluation. A kind is one class,
registered by name: whether it lets the reflector propose at all, and how it renders the
scored questions (`AnsweredQuestion`, data) as text. The spec's accepted names, the JSON
schema's list and the engine's checks all come from this registry, so a new kind (a plugin
module, see docs/extending.md) is one file.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from evolve.feedback.questions import AnsweredQuestion, answered_questions
from evolve.simulator.records import PeriodResult


class Feedback(BaseModel):
    """One proposal's feedback: the text the reflector reads and, as data, the failures
    that text showed (diagnosing kinds only; an operator reads these, not the text)."""

    model_config = ConfigDict(frozen=True)

    kind: str
    text: str
    failures_shown: int = 0
    failures_total: int = 0
    items_total: int = 0
    failures: tuple[AnsweredQuestion, ...] = Field(
        default=(), description="The failures the text shows, in its order (diagnosed)."
    )


class FeedbackKind:
    """A kind of feedback. Subclasses set `name` (and `proposes = False` for a kind under
    which nothing may be proposed) and implement `render`."""

    name: ClassVar[str]
    # False: no reflective proposal at all (the unevolved-instructions control).
    proposes: ClassVar[bool] = True

    def render(
        self,
        questions: Sequence[AnsweredQuestion],
        *,
        component: str,
        max_failures: int,
        max_chars: int | None,
        rng: random.Random,
    ) -> Feedback:
        """The feedback on `questions` for a proposal to `component`; `max_chars` None:
        no length cap. `rng` orders what a kind samples (seeded by the proposal)."""
        raise NotImplementedError


FEEDBACK_KINDS: dict[str, Callable[[], FeedbackKind]] = {}
BUILTIN_KINDS: list[str] = []


def register_feedback_kind(kind: type[FeedbackKind], *, builtin: bool = False) -> None:
    """Make `kind` selectable as `optimizer.feedback = "<kind.name>"`."""
    name = getattr(kind, "name", "")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(
            f"a feedback kind needs a `name` that is an identifier; {kind.__name__} has {name!r}"
        )
    FEEDBACK_KINDS[name] = kind
    if builtin and name not in BUILTIN_KINDS:
        BUILTIN_KINDS.append(name)


def feedback_kind(name: str) -> FeedbackKind:
    """The registered kind `name`; plugin modules are imported first."""
    from memory_policies.registry import load_plugins

    load_plugins()
    try:
        return FEEDBACK_KINDS[name]()
    except KeyError:
        raise ValueError(
            f"feedback = {name!r} is not a feedback kind; expected one of "
            f"{', '.join(map(repr, FEEDBACK_KINDS))} (a plugin module registers more with "
            "register_feedback_kind; see docs/extending.md)"
        ) from None


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
    """Feedback of kind `kind` on the questions of `results` (restricted to `periods` when
    given). `results` may include earlier periods than those scored: they are where the
    diagnosis finds the message that revealed a fact."""
    return feedback_kind(kind).render(
        answered_questions(results, periods),
        component=component,
        max_failures=max_failures,
        max_chars=max_chars,
        rng=rng,
    )


def reflective_record(feedback: Feedback) -> dict[str, Any]:
    """A component's record in a reflective dataset (GEPA's, or the chain's one record):
    the text under "Feedback" (GEPA's convention) and the shown failures as data, which
    operators read instead of parsing the text."""
    return {
        "Feedback": feedback.text,
        "failures_shown": feedback.failures_shown,
        "failures_total": feedback.failures_total,
        "failures": [failure.model_dump(mode="json") for failure in feedback.failures],
    }


def failures_of(records: Sequence[Mapping[str, Any]]) -> list[AnsweredQuestion]:
    """The failures a component's reflective records showed, as data, in order."""
    return [
        AnsweredQuestion.model_validate(failure)
        for record in records
        for failure in record.get("failures", [])
    ]
