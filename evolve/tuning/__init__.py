"""Optuna tuning of a policy's numeric parameters (update_every, short_term_len, top_k).

The public entry point is `evolve.tune` (which re-exports this package's surface): load and
resolve a tuning spec, run the study, read its result, and plug Optuna into evolution.
Storage, samplers, spend journals, trackers and report rendering are internals of the
submodules (`storage`, `samplers`, `spend`, `tracking`, `report`, `readback`; the worker:
`study` with its `job`, `layout`, `trials` and `heldout`).
"""

from evolve.spec_base import IntRange
from evolve.tuning.evolution import CandidateTuning, OptunaParameterProposer, tune_best_candidate
from evolve.tuning.records import HeldoutRecord, TrialRecord, TuningResult
from evolve.tuning.report import format_result
from evolve.tuning.spec import (
    ResolvedTuning,
    TuneSpec,
    TuningSpec,
    load_tune_spec,
    resolve_tuning,
    tune_spec_from_dict,
)
from evolve.tuning.spend import recorded_spend
from evolve.tuning.study import TuneProgress, run_tuning
from evolve.tuning.tracking import StudyTracker, study_tracker_for

__all__ = [
    "CandidateTuning",
    "HeldoutRecord",
    "IntRange",
    "OptunaParameterProposer",
    "ResolvedTuning",
    "StudyTracker",
    "TrialRecord",
    "TuneProgress",
    "TuneSpec",
    "TuningResult",
    "TuningSpec",
    "format_result",
    "load_tune_spec",
    "recorded_spend",
    "resolve_tuning",
    "run_tuning",
    "study_tracker_for",
    "tune_best_candidate",
    "tune_spec_from_dict",
]
