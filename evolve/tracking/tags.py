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
# On an experiment's parent run: the candidate it selected (validation, else train users).
TAG_BEST_CANDIDATE = "evolve.best_candidate"
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
# The held-out test of the best against the base (`evolve.stats.PairedComparison`), on the
# parent run and on the exported model: the verdict word (beats / within noise / worse, read
# from the interval), what it rests on in words, and how it was computed.
TAG_HELDOUT_VERDICT = "evolve.heldout_verdict"
TAG_HELDOUT_EVIDENCE = "evolve.heldout_evidence"
TAG_HELDOUT_METHOD = "evolve.heldout_method"
TAG_HELDOUT_SEED = "evolve.heldout_seed"
TAG_HELDOUT_RESAMPLES = "evolve.heldout_resamples"
HELDOUT_VERDICT_TAGS = (
    TAG_HELDOUT_VERDICT,
    TAG_HELDOUT_EVIDENCE,
    TAG_HELDOUT_METHOD,
    TAG_HELDOUT_SEED,
    TAG_HELDOUT_RESAMPLES,
)
