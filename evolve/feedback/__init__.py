"""Feedback for the reflector, built from stored evaluation records (no LLM): the scored
questions as data (`questions`), the kind registry (`kinds`) and the built-in kinds
(`builtin`)."""

from evolve.feedback.builtin import BLIND_FEEDBACK
from evolve.feedback.kinds import (
    BUILTIN_KINDS,
    FEEDBACK_KINDS,
    Feedback,
    FeedbackKind,
    build_feedback,
    failures_of,
    feedback_kind,
    reflective_record,
    register_feedback_kind,
)
from evolve.feedback.questions import AnsweredQuestion, FactCheck, answered_questions

__all__ = [
    "BLIND_FEEDBACK",
    "BUILTIN_KINDS",
    "FEEDBACK_KINDS",
    "AnsweredQuestion",
    "FactCheck",
    "Feedback",
    "FeedbackKind",
    "answered_questions",
    "build_feedback",
    "failures_of",
    "feedback_kind",
    "reflective_record",
    "register_feedback_kind",
]
