"""Tuning's door to the study tracker (`evolve.tracking.study`, where the run layout of a
study is described): the same names, and a factory that hands the tracker tuning's own
report formatter (tracking never imports tuning)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from evolve.tracking.store import mlflow_client
from evolve.tracking.study import (
    MLflowStudyTracker,
    NullStudyTracker,
    StudyContext,
    StudyTracker,
    study_description,
    study_params,
    trial_description,
)
from evolve.tracking.study import study_tracker_for as _study_tracker_for
from evolve.tracking.study_records import (
    KIND_TRIAL,
    KIND_TUNING,
    TAG_BEST_PREFIX,
    TAG_OBJECTIVES,
    TAG_STORAGE,
    TAG_STUDY,
    TAG_TRIAL,
    TAG_TRIAL_STATE,
    study_summary,
)

if TYPE_CHECKING:
    from evolve.tuning.spec import StudySpec

__all__ = [
    "KIND_TRIAL",
    "KIND_TUNING",
    "TAG_BEST_PREFIX",
    "TAG_OBJECTIVES",
    "TAG_STORAGE",
    "TAG_STUDY",
    "TAG_TRIAL",
    "TAG_TRIAL_STATE",
    "MLflowStudyTracker",
    "NullStudyTracker",
    "StudyContext",
    "StudyTracker",
    "mlflow_client",
    "study_description",
    "study_params",
    "study_summary",
    "study_tracker_for",
    "trial_description",
]


def study_tracker_for(spec: StudySpec, *, tracking_uri: str | None = None, enabled: bool = True):
    """The tracker a command should use (a `NullStudyTracker` when disabled), logging the
    trial table as `tuning.txt` at the end."""
    from evolve.tuning.report import format_result

    return _study_tracker_for(
        spec, tracking_uri=tracking_uri, enabled=enabled, format_report=format_result
    )
