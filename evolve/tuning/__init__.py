"""Optuna tuning of a policy's numeric parameters (update_every, short_term_len, top_k).

This package is the public name (`evolve tune`, the command, is a verb: it runs a study):
load and resolve a study spec (`StudySpec`: a run spec plus its `[tuning]` table, a
`TuningSpec`), run the study (`run_study`, with the LMs open; `evolve.api.run_tuning` opens
them from the spec), read its result, and plug Optuna into evolution. Storage, samplers,
spend journals, trackers and report rendering are internals of the submodules (`storage`,
`samplers`, `spend`, `tracking`, `report`, `readback`; the worker: `study` with its `job`,
`layout`, `trials` and `heldout`).
"""

from evolve.core.spec_base import IntRange
from evolve.tuning.evolution import CandidateTuning, OptunaParameterProposer, tune_best_candidate
from evolve.tuning.records import HeldoutRecord, TrialRecord, TuningResult
from evolve.tuning.report import format_result
from evolve.tuning.spec import (
    ResolvedTuning,
    StudySpec,
    TuningSpec,
    load_study_spec,
    resolve_tuning,
    study_spec_from_dict,
)
from evolve.tuning.spend import recorded_spend
from evolve.tuning.study import TuneProgress, run_study
from evolve.tuning.tracking import StudyTracker, study_tracker_for

__all__ = [
    "CandidateTuning",
    "HeldoutRecord",
    "IntRange",
    "OptunaParameterProposer",
    "ResolvedTuning",
    "StudySpec",
    "StudyTracker",
    "TrialRecord",
    "TuneProgress",
    "TuningResult",
    "TuningSpec",
    "format_result",
    "load_study_spec",
    "recorded_spend",
    "resolve_tuning",
    "run_study",
    "study_spec_from_dict",
    "study_tracker_for",
    "tune_best_candidate",
]
