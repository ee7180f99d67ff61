"""MLflow tracking: experiments (one parent run, one child run per proposal) and tuning
studies (one parent run, one child run per trial), on one store.

- `store`: the checked tracking URI, the client, experiments, the tags every run carries;
- `tags`: the names of the run layout (one contract with `evolve compare`, `evolve export`
  and the MLflow UI);
- `hooks`: the loop's view of a tracker (`ExperimentTracker`, a no-op; `TrackingContext`);
- `experiment`: `MLflowTracker`, the runs of an experiment; `candidate_runs`: its child
  runs, one per proposal; `content` builds what they say;
- `intervals`: the held-out verdict of the best against the base and each evaluation's
  interval bounds, as metrics and tags;
- `prompts`: the Prompt Registry side; `traces`: the evaluation traces of an experiment;
- `tracing`: `EpisodeTracer`, one trace per user episode; `period_spans`: a period's span
  tree inside it (a span per step, a span per LLM call);
- `study`: `MLflowStudyTracker`, the runs of a tuning study; `shared_parent`: the study's one
  parent run, shared by concurrent workers.

Called by the optimizer loop, tuning and the commands only (never by the simulator or a
policy). Nothing logged comes from an endpoint description: models by name, never a URL or
a key.
"""

from evolve.tracking.content import (
    candidate_description,
    candidate_run_name,
    candidates_table,
    evaluation_window,
    experiment_description,
    experiment_params,
    instruction_diff,
    instruction_diff_html,
    per_period_metrics,
    per_period_table,
    proposal_status,
)
from evolve.tracking.experiment import MLflowTracker, tracker_for
from evolve.tracking.hooks import ExperimentTracker, NullTracker, TrackingContext
from evolve.tracking.store import (
    check_sqlite_writable,
    default_artifact_location,
    describe_experiment,
    get_or_create_experiment,
    mlflow_client,
    normalize_tracking_uri,
    prepare_tracking_uri,
    prompt_name,
    quiet_mlflow,
    run_context_tags,
    store_creation_lock,
    strip_url_credentials,
    tracking_location,
)
from evolve.tracking.tags import (
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    NOTE_TAG,
    PARENT_RUN_TAG,
    PER_PERIOD_METRICS,
    STATE_FILE,
    TAG_CANDIDATE,
    TAG_CANDIDATE_REASON,
    TAG_CANDIDATE_STATUS,
    TAG_CONFIG_HASH,
    TAG_EXPERIMENT,
    TAG_GENERATION,
    TAG_KIND,
    TAG_MUTATION,
    TAG_PARENTS,
    TAG_PROMPT_PREFIX,
    TAG_RUN_DIR,
)

__all__ = [
    "EXPERIMENT_KIND",
    "EXPERIMENT_KIND_TAG",
    "NOTE_TAG",
    "PARENT_RUN_TAG",
    "PER_PERIOD_METRICS",
    "STATE_FILE",
    "TAG_CANDIDATE",
    "TAG_CANDIDATE_REASON",
    "TAG_CANDIDATE_STATUS",
    "TAG_CONFIG_HASH",
    "TAG_EXPERIMENT",
    "TAG_GENERATION",
    "TAG_KIND",
    "TAG_MUTATION",
    "TAG_PARENTS",
    "TAG_PROMPT_PREFIX",
    "TAG_RUN_DIR",
    "ExperimentTracker",
    "MLflowTracker",
    "NullTracker",
    "TrackingContext",
    "candidate_description",
    "candidate_run_name",
    "candidates_table",
    "check_sqlite_writable",
    "default_artifact_location",
    "describe_experiment",
    "evaluation_window",
    "experiment_description",
    "experiment_params",
    "get_or_create_experiment",
    "instruction_diff",
    "instruction_diff_html",
    "mlflow_client",
    "normalize_tracking_uri",
    "per_period_metrics",
    "per_period_table",
    "prepare_tracking_uri",
    "prompt_name",
    "proposal_status",
    "quiet_mlflow",
    "run_context_tags",
    "store_creation_lock",
    "strip_url_credentials",
    "tracker_for",
    "tracking_location",
]
