"""The per-generation table's spend rows: stages, what is in no row (and why), the total."""

from __future__ import annotations

from evolve.llm.usage import Usage
from evolve.optimize.report import spend_rows
from evolve.results.records import ExperimentResult, GenerationRecord


def _result(stage_spend: dict[str, Usage], calls: int) -> ExperimentResult:
    return ExperimentResult(
        name="x",
        config_hash="h",
        schedule="population",
        candidates=[],
        generations=[GenerationRecord(generation=0, llm_calls=10, tokens=100)],
        llm_calls=calls,
        tokens=calls * 10,
        stage_spend=stage_spend,
    )


def _labels(result: ExperimentResult) -> list[str]:
    return [line.split("  ")[1].strip() for line in spend_rows(result, width=40)[:-1]]


def test_rows_that_add_up_have_no_leftover_row():
    stages = {"upper bound": Usage(requests=5, prompt_tokens=50)}
    assert _labels(_result(stages, calls=15)) == ["upper bound", "total = spent"]


def test_a_leftover_is_named_for_what_it_can_be():
    stages = {"upper bound": Usage(requests=5, prompt_tokens=50)}
    assert "in no row: redone or replayed work" in _labels(_result(stages, calls=20))
    # A run recorded before stages were: its upper bound and held-out tests are the rest.
    assert "in no row: stages not recorded" in _labels(_result({}, calls=20))
