"""Stored results of an evaluation episode: plain, JSON-serializable pydantic records.

Everything the metrics, the diagnosis and the reflective mutation need is kept here, so that
scores can be recomputed from disk without a single LLM call. Indices of answer options are
1-based (as the policy answers them); period and question indices are 0-based (as in the
environment file).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evolve.llm.usage import Usage


class Diagnosis(StrEnum):
    """Why an item was answered wrongly (or that it was not)."""

    CORRECT = "correct"
    WRITE = "write"  # a required variable never made it into memory correctly
    READ = "read"  # it was stored correctly once, but is not recalled correctly now
    UTILIZATION = "utilization"  # every required variable is recalled, the answer is still wrong


class TranscriptMessage(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: str
    content: str


class SessionTranscript(BaseModel):
    """One session of a period: the opening query, then user <-> assistant rounds."""

    session_index: int
    session_time: str
    query: str
    exposed_states: dict[str, str] = Field(default_factory=dict)
    messages: list[TranscriptMessage] = Field(default_factory=list)
    rounds_planned: int
    rounds_completed: int
    replayed: bool = Field(
        default=False, description="Off-policy: messages came from a recorded transcript."
    )
    simulator_parse_failures: int = 0
    simulator_echo_retries: int = Field(
        default=0,
        description="Follow-ups asked again because the first copied an earlier message.",
    )
    ended_early: str | None = Field(
        default=None, description="Why the session has fewer rounds than planned, if it has."
    )


class ProbeResult(BaseModel):
    """Diagnosis probe: the policy's recalled current value of one state variable."""

    variable: str
    question: str
    options: list[str]
    chosen: int | None = Field(description="1-based option index; None when unparseable.")
    value: str | None
    gold: str
    correct: bool
    parse_failed: bool
    parse_error: str | None = None
    raw_answer: str = ""
    retrieved: list[str] = Field(default_factory=list)


class VariableRecall(BaseModel):
    """One variable inside a question probe: the value the reply gave for it."""

    variable: str
    gold: str
    value: Any = Field(default=None, description="As the reply gave it (any JSON), or None.")
    missing: bool = Field(description="The reply had no value for this variable.")
    correct: bool


class QuestionProbeResult(BaseModel):
    """Paper protocol: one probe per question over its required variables (the original's
    diagnosis probe): the policy is shown each variable's possible values and asked for the
    current one of each, as one JSON object."""

    question_index: int
    query: str
    raw_answer: str = ""
    parse_error: str | None = None
    recalls: list[VariableRecall] = Field(default_factory=list)
    retrieved: list[str] = Field(default_factory=list)

    @property
    def parse_failed(self) -> bool:
        return self.parse_error is not None

    def recall(self, variable: str) -> VariableRecall | None:
        return next((r for r in self.recalls if r.variable == variable), None)


class VariableCheck(BaseModel):
    """One required variable of an item, as both diagnoses see it."""

    variable: str
    gold: str
    probed: str | None
    correct_now: bool
    last_write_period: int
    correct_at_last_write: bool = Field(
        description="The probe at the end of `last_write_period` recalled the value."
    )
    last_update_period: int | None = Field(
        default=None,
        description="The original's write_pos: the last period <= now whose updates set the "
        "variable (exposure in a session does not count). None in records made before it.",
    )
    correct_at_last_update: bool | None = Field(
        default=None, description="The probe at the end of `last_update_period` recalled it."
    )


class ItemResult(BaseModel):
    """One multiple-choice question asked at the end of one period."""

    question_index: int
    question: str
    required_info: list[str]
    options: list[str]
    option_states: list[list[str]]
    gold: int = Field(description="1-based index of the option matching the period's state.")
    gold_state: list[str]
    chosen: int | None = Field(description="1-based; None when the answer was unparseable.")
    chosen_state: list[str] | None
    correct: bool
    parse_failed: bool = Field(description="Counted as wrong; no random fallback is drawn.")
    parse_error: str | None = None
    raw_answer: str = ""
    retrieved: list[str] = Field(default_factory=list)
    random_score: float = Field(description="Expected accuracy of a uniform random choice.")
    upper_bound_correct: bool | None = Field(
        default=None, description="The agent LLM, told the gold state, chose the gold option."
    )
    variables: list[VariableCheck] = Field(default_factory=list)
    diagnosis: Diagnosis


class PeriodResult(BaseModel):
    """Everything that happened to one user in one period; the unit of resumption."""

    user_id: str
    period_index: int
    period_start: str = ""
    period_end: str = ""
    state: dict[str, str] = Field(description="The period's gold state (every variable).")
    state_updates: dict[str, dict[str, str | None]] = Field(
        default_factory=dict, description="Variables that changed entering this period: old/new."
    )
    exposed_states: dict[str, str] = Field(
        default_factory=dict, description="States the period's sessions expose to the assistant."
    )
    sessions: list[SessionTranscript] = Field(default_factory=list)
    off_policy: bool = False
    memory_description: str = ""
    items: list[ItemResult] = Field(default_factory=list)
    probes: list[ProbeResult] = Field(
        default_factory=list, description="Per-variable probes (protocol evolve)."
    )
    question_probes: list[QuestionProbeResult] = Field(
        default_factory=list, description="One probe per question (protocol paper)."
    )
    probe_scope: Literal["all", "wrong_only"] = Field(
        default="all",
        description="wrong_only: only the variables of wrongly answered items were probed.",
    )
    policy_parse_failures: dict[str, int] = Field(
        default_factory=dict, description="Increase of state.parse_failures during the sessions."
    )
    evaluation_mutated_state: bool = Field(
        default=False,
        description="answer() changed the memory it was given; the checkpoint was kept instead.",
    )
    # LM calls of the unit as DSPy's usage tracker sees them (cache hits not among them).
    usage: Usage = Field(default_factory=Usage)
    wall_time_s: float = 0.0

    @property
    def accuracy(self) -> float:
        return sum(item.correct for item in self.items) / len(self.items) if self.items else 0.0

    def probe(self, variable: str) -> ProbeResult | None:
        return next((probe for probe in self.probes if probe.variable == variable), None)


class UserResult(BaseModel):
    user_id: str
    periods: list[PeriodResult] = Field(default_factory=list)
