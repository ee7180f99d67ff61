"""Optuna tuning of a policy's numeric parameters (update_every, short_term_len, top_k).

The public entry point is `evolve.tune` (which re-exports this package's surface).
"""

from evolve.tuning.evolution import CandidateTuning, OptunaParameterProposer, tune_best_candidate
from evolve.tuning.records import HeldoutRecord, TrialRecord, TuningResult
from evolve.tuning.report import (
    format_result,
    render_tuning_dir,
    render_tuning_experiment,
    tuning_dir_for,
)
from evolve.tuning.samplers import TrialSeededSampler, enqueue_grid_points, grid_order
from evolve.tuning.spec import (
    DEFAULT_STORAGE,
    IntRange,
    ResolvedTuning,
    TuneSpec,
    TuningSpec,
    is_tuning_spec,
    load_tune_spec,
    resolve_tuning,
    tune_spec_from_dict,
)
from evolve.tuning.spend import StudySpendJournals, recorded_spend
from evolve.tuning.storage import open_storage, open_study, redact_storage_url
from evolve.tuning.study import TuneProgress, TuningJob, TuningStore, job_from, run_tuning
from evolve.tuning.tracking import (
    MLflowStudyTracker,
    NullStudyTracker,
    StudyTracker,
    study_tracker_for,
)

__all__ = [
    "DEFAULT_STORAGE",
    "CandidateTuning",
    "HeldoutRecord",
    "IntRange",
    "MLflowStudyTracker",
    "NullStudyTracker",
    "OptunaParameterProposer",
    "ResolvedTuning",
    "StudySpendJournals",
    "StudyTracker",
    "TrialRecord",
    "TrialSeededSampler",
    "TuneProgress",
    "TuneSpec",
    "TuningJob",
    "TuningResult",
    "TuningSpec",
    "TuningStore",
    "enqueue_grid_points",
    "format_result",
    "grid_order",
    "is_tuning_spec",
    "job_from",
    "load_tune_spec",
    "open_storage",
    "open_study",
    "recorded_spend",
    "redact_storage_url",
    "render_tuning_dir",
    "render_tuning_experiment",
    "resolve_tuning",
    "run_tuning",
    "study_tracker_for",
    "tune_best_candidate",
    "tune_spec_from_dict",
    "tuning_dir_for",
]
