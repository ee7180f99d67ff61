"""The self-evolution loop: GEPA population schedule, per-period chain, operators, lineage."""

from typing import Any

from evolve.budget import Budget, BudgetExhausted
from evolve.objective import objective_value
from evolve.optimize import list_edit  # noqa: F401  (registers the list_edit operator)
from evolve.optimize.feedback import Feedback, build_feedback, load_period_results
from evolve.optimize.loop import LoopProgress, run_experiment
from evolve.optimize.parameters import ParameterProposer, RandomStepProposer
from evolve.optimize.reflect import Proposal, Reflector
from evolve.optimize.report import format_lineage, format_table, generation_rows
from evolve.optimize.store import ExperimentStore
from evolve.records import (
    CandidateRecord,
    CandidateStatus,
    EvaluationScores,
    ExperimentResult,
    GenerationRecord,
    Mutation,
    best_of,
    candidate_record,
    fingerprint,
)
from memory_policies.deprecation import warn_renamed

__all__ = [
    "Budget",
    "BudgetExhausted",
    "CandidateRecord",
    "CandidateStatus",
    "EvaluationScores",
    "ExperimentResult",
    "ExperimentStore",
    "Feedback",
    "GenerationRecord",
    "LoopProgress",
    "Mutation",
    "ParameterProposer",
    "Proposal",
    "RandomStepProposer",
    "Reflector",
    "best_of",
    "build_feedback",
    "candidate_record",
    "fingerprint",
    "format_lineage",
    "format_table",
    "generation_rows",
    "load_period_results",
    "objective_value",
    "run_experiment",
]


def __getattr__(name: str) -> Any:
    if name == "Spend":
        warn_renamed("evolve.optimize.Spend", "evolve.llm.Usage")
        from evolve.llm.usage import Usage

        return Usage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
