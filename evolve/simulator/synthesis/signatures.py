"""DSPy signatures of the synthesis stages (all run in the `simulator` role).

Instructions are short on purpose: the embedded model is 0.5B parameters with an 8k context.
Every output field name is unique across signatures, which keeps prompts unambiguous and
lets a scripted test LM tell the stages apart. Synthesis steps take `feedback` (why the
previous attempt was rejected; "none" on the first try).
"""

from __future__ import annotations

from typing import Literal

import dspy
import pydantic
from pydantic import BaseModel, ConfigDict, Field


class InfoDraft(BaseModel):
    info_type: str = Field(description="English snake_case name of the personal fact")
    info_choices: list[str] = Field(description="mutually exclusive English snake_case options")


class QuestionDraft(BaseModel):
    question: str
    required_info: list[InfoDraft]


class VariableGroup(BaseModel):
    name: str = Field(description="English snake_case variable name, clear without the question")
    merges: list[str] = Field(description="the info types this variable covers")


class VariableOptions(BaseModel):
    name: str
    options: list[str] = Field(description="English snake_case options")


class ChangeDraft(BaseModel):
    variable: str
    new_value: str


class EventDraft(BaseModel):
    variables: list[str] = Field(description="the changed variables this event explains")
    event: str = Field(description="what happened, one or two sentences")


_FEEDBACK = "why your previous attempt was rejected ('none' on the first try)"


class ExtractProfile(dspy.Signature):
    """Find the person's full name in `extra_info` and summarize `extra_info` in 2-4 sentences,
    leaving out what `basic_profile` already says. Write the summary in `language`."""

    basic_profile: str = dspy.InputField()
    extra_info: str = dspy.InputField()
    language: str = dspy.InputField()
    feedback: str = dspy.InputField(desc=_FEEDBACK)
    name: str = dspy.OutputField(desc="full name as written in extra_info")
    summary: str = dspy.OutputField()


class DraftQuestions(dspy.Signature):
    """Write questions this user could ask an AI assistant for advice at any time in the
    horizon. A good answer to each must depend on personal facts (`required_info`) that can
    change over the horizon; each fact has mutually exclusive options, each leading to
    different advice. Avoid facts that never change or change daily. Questions in
    `language`; info types and options in English snake_case."""

    profile: str = dspy.InputField()
    horizon: str = dspy.InputField()
    requirements: str = dspy.InputField()
    language: str = dspy.InputField()
    feedback: str = dspy.InputField(desc=_FEEDBACK)
    questions: list[QuestionDraft] = dspy.OutputField()


class GroupInfoTypes(dspy.Signature):
    """Turn these info types into state variables. Info types that describe the same fact of
    the user's life become one variable; unrelated ones stay separate. Each info type goes in
    exactly one variable. Name variables in English snake_case so they are clear without the
    question."""

    info_types: str = dspy.InputField()
    feedback: str = dspy.InputField(desc=_FEEDBACK)
    variables: list[VariableGroup] = dspy.OutputField()


class UnifyOptions(dspy.Signature):
    """Each variable merges info types with different option lists. Give each variable one
    list of mutually exclusive English snake_case options that serves all its questions and
    lets the value change several times over the horizon."""

    profile: str = dspy.InputField()
    horizon: str = dspy.InputField()
    merged: str = dspy.InputField(desc="each variable with the questions and options it merges")
    requirements: str = dspy.InputField()
    feedback: str = dspy.InputField(desc=_FEEDBACK)
    unified: list[VariableOptions] = dspy.OutputField()


class PickInitialState(dspy.Signature):
    """Pick each variable's value on the start date: consistent with the profile, and not
    at an extreme, so it can change in either direction later."""

    profile: str = dspy.InputField()
    start_date: str = dspy.InputField()
    horizon: str = dspy.InputField()
    variables: str = dspy.InputField(desc="each variable with its options")
    feedback: str = dspy.InputField(desc=_FEEDBACK)
    # The type is replaced per user by a model with one enum-typed field per variable.
    initial_state: dict[str, str] = dspy.OutputField()


class UpdateState(dspy.Signature):
    """Decide which of the user's variables change during this period. Changes must be
    realistic for this person and gradual; related variables may change together. Each new
    value must be one of the variable's options and differ from its current value. Prefer
    variables that changed less often. Summary in `language`."""

    profile: str = dspy.InputField()
    period: str = dspy.InputField()
    variables: str = dspy.InputField(desc="each variable: current value, options, changes so far")
    earlier: str = dspy.InputField(desc="summaries of earlier periods")
    requirements: str = dspy.InputField()
    language: str = dspy.InputField()
    feedback: str = dspy.InputField(desc=_FEEDBACK)
    period_summary: str = dspy.OutputField(desc="one or two sentences on this period")
    changes: list[ChangeDraft] = dspy.OutputField()


class NarrateEvents(dspy.Signature):
    """Write concrete life events that explain these changes. Group related changes into one
    event; every change is explained by exactly one event. Imply the new values without
    quoting variable names or values, and never suggest a change to the unchanged facts.
    Events in `language`."""

    profile: str = dspy.InputField()
    period: str = dspy.InputField()
    changes: str = dspy.InputField()
    unchanged: str = dspy.InputField()
    language: str = dspy.InputField()
    feedback: str = dspy.InputField(desc=_FEEDBACK)
    events: list[EventDraft] = dspy.OutputField()


class WriteAnswers(dspy.Signature):
    """Answer the question once per variant of the user's situation, in order. Each answer
    gives practical advice clearly fitted to its variant and distinguishable from the others,
    without quoting the variant's values. Answers in `language`."""

    question: str = dspy.InputField()
    variants: str = dspy.InputField(desc="numbered situations")
    length: str = dspy.InputField(desc="sentences per answer")
    language: str = dspy.InputField()
    feedback: str = dspy.InputField(desc=_FEEDBACK)
    answers: list[str] = dspy.OutputField(desc="one answer per variant, in order")


class MatchAnswer(dspy.Signature):
    """Which numbered situation is this answer written for? Reply with its number."""

    question: str = dspy.InputField()
    answer: str = dspy.InputField()
    situations: str = dspy.InputField()
    option: int = dspy.OutputField()


class RefineAnswer(dspy.Signature):
    """Rewrite the answer so it clearly fits the target situation and could not be mistaken
    for any other, without quoting the values. Keep it practical. Answer in `language`."""

    question: str = dspy.InputField()
    target: str = dspy.InputField()
    others: str = dspy.InputField()
    answer: str = dspy.InputField()
    problem: str = dspy.InputField()
    length: str = dspy.InputField(desc="sentences")
    language: str = dspy.InputField()
    refined_answer: str = dspy.OutputField()


class WriteQueries(dspy.Signature):
    """Write the first message this user sends to an AI assistant in each numbered session: a
    natural request for help that, through its context, reveals the listed facts clearly
    enough to tell them apart from the other options, without quoting variable names. One
    message per session, in order, in `language`, in character."""

    profile: str = dspy.InputField()
    date: str = dspy.InputField()
    sessions: str = dspy.InputField(desc="per session: its context and the facts to reveal")
    language: str = dspy.InputField()
    feedback: str = dspy.InputField(desc=_FEEDBACK)
    queries: list[str] = dspy.OutputField(desc="one message per session, in order")


class InferValues(dspy.Signature):
    """From the user's message alone, infer the most likely option of each variable."""

    message: str = dspy.InputField()
    variables: str = dspy.InputField(desc="each variable with its options")
    # The type is replaced per check by a model with one enum-typed field per variable.
    inferred: dict[str, str] = dspy.OutputField()


class RefineQuery(dspy.Signature):
    """Rewrite the user's message so each listed fact can be inferred unambiguously, while it
    stays a natural request in character, without quoting variable names. In `language`."""

    message: str = dspy.InputField()
    reveal: str = dspy.InputField(desc="facts the message must reveal, with their options")
    problem: str = dspy.InputField(desc="what a reader inferred wrongly")
    language: str = dspy.InputField()
    refined_query: str = dspy.OutputField()


def options_model(name: str, options: dict[str, list[str]]) -> type[BaseModel]:
    """A model with one field per variable whose value must be one of its options.

    With constrained decoding the server can then only emit valid values; elsewhere an
    invalid value is a parse failure. Field names are positional because variable names may
    clash with pydantic attributes; the JSON keys are the variable names (aliases).
    """
    fields: dict[str, tuple[object, object]] = {}
    for index, (variable, values) in enumerate(options.items()):
        fields[f"v{index}"] = (Literal[tuple(values)], Field(alias=variable))
    return pydantic.create_model(  # type: ignore[call-overload]
        name, __config__=ConfigDict(extra="forbid", populate_by_name=False), **fields
    )


def with_output_type(
    signature: type[dspy.Signature], field: str, annotation: object
) -> type[dspy.Signature]:
    return signature.with_updated_fields(field, type_=annotation)
