"""The names of the run layout: tags, the state file and the per-period curves. They are one
contract with `evolve compare`, `evolve export` and the MLflow UI, hence one place."""

from __future__ import annotations

from evolve.simulator.metric_registry import metrics_in

STATE_FILE = "mlflow.json"
TAG_KIND = "evolve.kind"
TAG_EXPERIMENT = "evolve.experiment"
TAG_CONFIG_HASH = "evolve.config_hash"
TAG_RUN_DIR = "evolve.run_dir"
TAG_CANDIDATE = "evolve.candidate_id"
TAG_GENERATION = "evolve.generation"
TAG_PARENTS = "evolve.parent_ids"
TAG_MUTATION = "evolve.mutation"
# What became of a proposal: accepted (joined the population and was evaluated on every
# train user), rejected (not better than its parent on GEPA's minibatch) or invalid (the
# proposal could not be used), with the reason in `TAG_CANDIDATE_REASON`.
TAG_CANDIDATE_STATUS = "evolve.candidate_status"
TAG_CANDIDATE_REASON = "evolve.candidate_reason"
TAG_PROMPT_PREFIX = "evolve.prompt."
PARENT_RUN_TAG = "mlflow.parentRunId"
# MLflow's description of a run or an experiment (what the UI shows as "Description").
NOTE_TAG = "mlflow.note.content"
# What the experiment is, for MLflow UIs that read it; 3.17's ignores it and shows an
# experiment's runs only by its `workflowType` (see `evolve.stores.tracking_uri.RUNS_VIEW_QUERY`).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# Per-period curves of a candidate (`<split>_period/<name>`, step = period): the metrics
# declared for the per-period view.
PER_PERIOD_METRICS = tuple(declaration.name for declaration in metrics_in("per_period"))
