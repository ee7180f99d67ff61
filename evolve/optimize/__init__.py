"""The self-evolution loop: GEPA population schedule, per-period chain, operators, lineage."""

from evolve.feedback import Feedback, build_feedback
from evolve.optimize import list_edit  # noqa: F401  (registers the list_edit operator)
from evolve.optimize.experiment_dir import ExperimentDir
from evolve.optimize.loop import LoopProgress, evolve_policy
from evolve.optimize.parameters import ParameterProposer, RandomStepProposer
from evolve.optimize.reflect import Proposal, Reflector
from evolve.optimize.report import format_lineage, format_table, generation_rows
from evolve.results.budget import Budget, BudgetExhausted
from evolve.results.objective import load_period_results, objective_value
from evolve.results.records import (
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

__all__ = [
    "Budget",
    "BudgetExhausted",
    "CandidateRecord",
    "CandidateStatus",
    "EvaluationScores",
    "ExperimentResult",
    "ExperimentDir",
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
    "evolve_policy",
    "fingerprint",
    "format_lineage",
    "format_table",
    "generation_rows",
    "load_period_results",
    "objective_value",
]
