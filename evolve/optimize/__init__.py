"""The self-evolution loop: GEPA population schedule, per-period chain, operators, lineage."""

from typing import Any

from evolve.budget import Budget, BudgetExhausted
from evolve.objective import objective_value
from evolve.optimize import list_edit  # noqa: F401  (registers the list_edit operator)
from evolve.optimize.experiment_dir import ExperimentDir
from evolve.optimize.feedback import Feedback, build_feedback, load_period_results
from evolve.optimize.loop import LoopProgress, evolve_policy
from evolve.optimize.parameters import ParameterProposer, RandomStepProposer
from evolve.optimize.reflect import Proposal, Reflector
from evolve.optimize.report import format_lineage, format_table, generation_rows
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


def __getattr__(name: str) -> Any:
    # Old names work with a RenamedWarning until deprecation.REMOVED_IN. `run_experiment` is
    # `evolve.api.run_experiment` (it opens the LMs); the loop is `evolve_policy`.
    if name == "ExperimentStore":
        warn_renamed("evolve.optimize.ExperimentStore", "evolve.optimize.ExperimentDir")
        return ExperimentDir
    if name == "run_experiment":
        warn_renamed(f"{__name__}.run_experiment", f"{__name__}.evolve_policy")
        return evolve_policy
    if name == "Spend":
        warn_renamed("evolve.optimize.Spend", "evolve.llm.Usage")
        from evolve.llm.usage import Usage

        return Usage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
