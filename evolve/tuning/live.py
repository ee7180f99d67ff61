"""A tuning study read live from its Optuna storage (for `evolve compare`).

`runs/<name>/tuning.json` is what one invocation last saw; a study shared by workers on other
machines moves on without it. This module rebuilds the `TuningResult` from the storage (trial
states, parameters, values, per-period reports), keeping from the snapshot only what the
storage does not hold (held-out checks, notes).
"""

from __future__ import annotations

from pathlib import Path

import optuna

from evolve.core.errors import ConfigError, StorageError
from evolve.tuning.records import (
    IN_MEMORY_STORAGE,
    TuningResult,
    best_trial_numbers,
    trial_records,
)
from evolve.tuning.spec import StudySpec
from evolve.tuning.storage import normalize_storage_url, open_storage, redact_storage_url


def live_storage_url(
    *, override: str | None, spec: StudySpec | None, snapshot: TuningResult | None
) -> str | None:
    """Where to read the study: `--storage`, else the spec's, else the snapshot's (unless it
    was in memory or its URL was stored redacted, i.e. it named a database user)."""
    if override:
        return override
    if spec is not None:
        return spec.storage_url()
    if snapshot is None or snapshot.storage == IN_MEMORY_STORAGE or "***@" in snapshot.storage:
        return None
    return snapshot.storage


def load_live_result(
    storage_url: str,
    study_name: str,
    *,
    snapshot: TuningResult | None,
    spec: StudySpec | None,
    directory: Path | None,
) -> TuningResult:
    """The study as its storage holds it now (spend from the local journals when present)."""
    from evolve.tuning.layout import STUDY_ATTR_HASH
    from evolve.tuning.spend import StudySpendJournals

    url = normalize_storage_url(storage_url)
    for prefix in ("sqlite:///", "journal:"):
        # A reader must not create an empty database where the study was expected.
        if url.startswith(prefix) and not Path(url.removeprefix(prefix)).is_file():
            raise StorageError(
                f"study storage {url} does not exist; pass --storage with the study's URL"
            )
    storage = open_storage(url, heartbeat_grace_s=None)  # a reader sends no heartbeats
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        known = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise ConfigError(
            f"no study {study_name!r} in {redact_storage_url(url)} (studies there: "
            f"{', '.join(known) or 'none'}); pass --study-name, or --storage for another storage"
        ) from None
    if directory is not None and directory.is_dir():
        journals = StudySpendJournals(directory, study_name)
        records = trial_records(study, journals.trial_spend())
        spent = journals.total(records)
        spent_calls, spent_tokens = spent.requests, spent.tokens
    else:  # another machine's study: what the workers recorded on each trial
        records = trial_records(study)
        spent_calls = sum(r.llm_calls for r in records)
        spent_tokens = sum(r.tokens for r in records)
    best = best_trial_numbers(study)
    update = {
        "trials": records,
        "best": best,
        "storage": redact_storage_url(url),
        "llm_calls": spent_calls,
        "tokens": spent_tokens,
    }
    if snapshot is not None and snapshot.study_name == study_name:
        finished = sum(r.finished for r in records)
        return snapshot.model_copy(
            update={
                **update,
                "complete": snapshot.complete and finished >= snapshot.requested_trials,
            }
        )
    if spec is None:
        raise ConfigError(
            f"study {study_name!r} has no local snapshot; pass the study spec (.toml) so the "
            "study's space and objectives are known"
        )
    tuning = spec.tuning
    return TuningResult(
        name=spec.name,
        study_name=study_name,
        config_hash=str(study.user_attrs.get(STUDY_ATTR_HASH, "")),
        objectives=list(tuning.objectives),
        sampler=tuning.sampler,
        pruner=tuning.pruner.kind if not tuning.multi_objective else "none",
        requested_trials=tuning.requested_trials(),
        space=tuning.grid(),
        **update,
    )
