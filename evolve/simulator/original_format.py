"""The reference AMemGym code's result files, as pydantic models, and its diagnosis arithmetic.

Hand-written because the reference code has no importable schema: its per-user files are
plain JSON lists written by `eval/overall.py` and `eval/diagnosis.py` (AGI-Eval-Official/
amemgym @ ffcd188). Modelling them lets this toolkit (a) write the original's
`diagnosis_results.json` / `diagnosis_metrics.json` with exactly the original's meaning, (b)
read the reference code's own outputs and score them with the same functions (the fidelity
fixture, `benchmarks/cross_check.py`).

The original's diagnosis, per period x question, over the question's required variables:
a variable recalled wrongly now is a write failure when the same question's probe also
recalled it wrongly in the period the variable was last updated (`write_pos`), else a read
failure; `memory_success` is 1 when neither happened. It does not depend on whether the
multiple-choice answer was right (our partition, in `metrics`, does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from evolve.simulator.metrics import diagnose, random_score
from evolve.simulator.records import (
    ItemResult,
    PeriodResult,
    QuestionProbeResult,
    VariableCheck,
    VariableRecall,
)

if TYPE_CHECKING:
    from evolve.simulator.environment import EnvironmentItem

# A recalled value counts as correct at or above this score (the original compares with .5).
_CORRECT_SCORE = 0.5


class OriginalVariableRecall(BaseModel):
    """One required variable inside one diagnosis probe (`results[i]` of the original)."""

    model_config = ConfigDict(extra="forbid")

    info_type: str
    json_error: bool = Field(description="The probe's reply had no value for this variable.")
    answer_state: str = Field(description="The gold value in the probed period.")
    response_state: Any = Field(description="The value as the reply gave it (any JSON), or null.")
    write_pos: int = Field(description="Last period <= read_pos whose updates set the variable.")
    read_pos: int = Field(description="The probed period.")
    score: float = Field(description="1.0 when response_state == answer_state, else 0.0.")


class OriginalDiagnosisEntry(BaseModel):
    """One probe: a period x question of `diagnosis_results.json`."""

    model_config = ConfigDict(extra="forbid")

    query: str
    raw_response: str
    results: list[OriginalVariableRecall]


class OriginalDiagnosisMetrics(BaseModel):
    """`diagnosis_metrics.json`: [period][question] counts (0/1 for memory_success)."""

    model_config = ConfigDict(extra="forbid")

    write_failure: list[list[int]]
    read_failure: list[list[int]]
    memory_success: list[list[int]]

    def means(self) -> dict[str, float | None]:
        """Mean over period x question cells of each matrix (the original has no aggregate;
        this is the natural reading of its figures), None when there are no cells."""
        return {
            name: _matrix_mean(getattr(self, name))
            for name in ("write_failure", "read_failure", "memory_success")
        }


class OriginalOverallResult(BaseModel):
    """One period x question of `overall_results.json` (`answer` 0-based, `response` 1-based)."""

    model_config = ConfigDict(extra="allow")

    query: str
    answer: int
    answer_state: list[Any]
    answer_choice: str
    raw_response: str
    response: int | None
    response_state: list[Any] | None
    response_choice: str | None
    json_error: bool
    scores: dict[str, float]


def _matrix_mean(matrix: Sequence[Sequence[float]]) -> float | None:
    cells = [value for row in matrix for value in row]
    return sum(cells) / len(cells) if cells else None


def parse_diagnosis_results(data: Any) -> list[list[OriginalDiagnosisEntry]]:
    """Validate a loaded `diagnosis_results.json` ([period][question])."""
    return [[OriginalDiagnosisEntry.model_validate(entry) for entry in row] for row in data]


def parse_overall_results(data: Any) -> list[list[OriginalOverallResult]]:
    """Validate a loaded `overall_results.json` ([period][question])."""
    return [[OriginalOverallResult.model_validate(entry) for entry in row] for row in data]


def diagnosis_metrics(
    results: Sequence[Sequence[OriginalDiagnosisEntry]],
) -> OriginalDiagnosisMetrics:
    """The original's per period x question write / read failure counts and memory success.

    The write score of a variable is read from the SAME question's probe at `write_pos`
    (results[write_pos][question].results[same position]), as the original does.
    """
    write_failure: list[list[int]] = []
    read_failure: list[list[int]] = []
    memory_success: list[list[int]] = []
    for period_index, row in enumerate(results):
        write_row, read_row, success_row = [], [], []
        for question_index, entry in enumerate(row):
            writes = reads = 0
            for position, recall in enumerate(entry.results):
                if recall.read_pos != period_index:
                    raise ValueError(
                        f"diagnosis entry [{period_index}][{question_index}] variable "
                        f"{recall.info_type!r} has read_pos {recall.read_pos}; expected "
                        f"{period_index} (entries must be stored by the period they probe)"
                    )
                if recall.score >= _CORRECT_SCORE:
                    continue
                then = results[recall.write_pos][question_index].results[position]
                if then.score < _CORRECT_SCORE:
                    writes += 1
                else:
                    reads += 1
            write_row.append(writes)
            read_row.append(reads)
            success_row.append(int(writes == 0 and reads == 0))
        write_failure.append(write_row)
        read_failure.append(read_row)
        memory_success.append(success_row)
    return OriginalDiagnosisMetrics(
        write_failure=write_failure, read_failure=read_failure, memory_success=memory_success
    )


def overall_accuracy_matrix(
    results: Sequence[Sequence[OriginalOverallResult]],
) -> list[list[float]]:
    """`overall_metrics.json`'s accuracy: 1.0 where the chosen option's state is the gold one."""
    return [[float(entry.response_state == entry.answer_state) for entry in row] for row in results]


def diagnosis_entries(period: PeriodResult) -> list[OriginalDiagnosisEntry] | None:
    """One user-period's probes in the original's `diagnosis_results.json` shape.

    Under paper each entry is the question's own probe. Under evolve the per-variable
    probes are regrouped by question: `query` lists their questions and `raw_response`
    their replies, one line each. None when the period cannot be written this way (probes
    were wrong_only, or the records predate the last-update bookkeeping).
    """
    if period.probe_scope != "all":
        return None
    entries = []
    for item in period.items:
        own = next(
            (p for p in period.question_probes if p.question_index == item.question_index), None
        )
        results = []
        for check in item.variables:
            if check.last_update_period is None:
                return None
            if own is not None:
                recall = own.recall(check.variable)
                value = None if recall is None else recall.value
                json_error = recall is None or recall.missing
            else:
                probe = period.probe(check.variable)
                value = None if probe is None else probe.value
                json_error = probe is None or probe.parse_failed
            results.append(
                OriginalVariableRecall(
                    info_type=check.variable,
                    json_error=json_error,
                    answer_state=check.gold,
                    response_state=value,
                    write_pos=check.last_update_period,
                    read_pos=period.period_index,
                    score=float(check.correct_now),
                )
            )
        if own is not None:
            query, raw = own.query, own.raw_answer
        else:
            probes = [period.probe(v) for v in item.required_info]
            query = "\n".join(p.question for p in probes if p is not None)
            raw = "\n".join(f"{p.variable}: {p.raw_answer}" for p in probes if p is not None)
        entries.append(OriginalDiagnosisEntry(query=query, raw_response=raw, results=results))
    return entries


def period_results_from_original(
    item: EnvironmentItem,
    overall: Sequence[Sequence[OriginalOverallResult]],
    diagnosis: Sequence[Sequence[OriginalDiagnosisEntry]] | None = None,
) -> list[PeriodResult]:
    """The reference code's per-user results as this toolkit's records, so that our metric
    code scores them (`metrics.summarize`). An answer the original replaced by a random
    choice (`json_error`) is stored as unparseable, scored as the original scored its draw.
    Without `diagnosis` the items carry no variable checks."""
    periods = []
    for period_index, row in enumerate(overall):
        state = {k: str(v) for k, v in item.periods[period_index].state.items()}
        items = []
        for question_index, entry in enumerate(row):
            qa = item.qas[question_index]
            option_states = [[str(v) for v in choice.state] for choice in qa.answer_choices]
            gold_state = [str(v) for v in entry.answer_state]
            checks = []
            if diagnosis is not None:
                for position, recall in enumerate(diagnosis[period_index][question_index].results):
                    then = diagnosis[recall.write_pos][question_index].results[position]
                    checks.append(
                        VariableCheck(
                            variable=recall.info_type,
                            gold=recall.answer_state,
                            probed=None
                            if recall.response_state is None
                            else str(recall.response_state),
                            correct_now=recall.score >= _CORRECT_SCORE,
                            last_write_period=recall.write_pos,
                            correct_at_last_write=then.score >= _CORRECT_SCORE,
                            last_update_period=recall.write_pos,
                            correct_at_last_update=then.score >= _CORRECT_SCORE,
                        )
                    )
            # From the record's states, not the reference's own score field.
            correct = [str(v) for v in entry.response_state] == gold_state
            items.append(
                ItemResult(
                    question_index=question_index,
                    question=entry.query,
                    required_info=list(qa.required_info),
                    options=[choice.answer for choice in qa.answer_choices],
                    option_states=option_states,
                    gold=entry.answer + 1,
                    gold_state=gold_state,
                    chosen=None if entry.json_error else entry.response,
                    chosen_state=None if entry.json_error else entry.response_state,
                    correct=correct,
                    parse_failed=entry.json_error,
                    raw_answer=entry.raw_response,
                    random_score=random_score(option_states, gold_state),
                    variables=checks,
                    diagnosis=diagnose(correct, checks),
                )
            )
        probes = []
        for question_index, entry in enumerate(diagnosis[period_index] if diagnosis else []):
            unread = all(recall.json_error for recall in entry.results)
            probes.append(
                QuestionProbeResult(
                    question_index=question_index,
                    query=entry.query,
                    raw_answer=entry.raw_response,
                    parse_error="no value for any variable in the reply" if unread else None,
                    recalls=[
                        VariableRecall(
                            variable=recall.info_type,
                            gold=recall.answer_state,
                            value=recall.response_state,
                            missing=recall.json_error,
                            correct=recall.score >= _CORRECT_SCORE,
                        )
                        for recall in entry.results
                    ],
                )
            )
        periods.append(
            PeriodResult(
                user_id=item.id,
                period_index=period_index,
                state=state,
                items=items,
                question_probes=probes,
            )
        )
    return periods
