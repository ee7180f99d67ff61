"""The runs view `evolve ui` opens: an experiment's runs table with its score columns.

MLflow 3.17's UI keeps the runs table's columns in the browser (local storage), so a new
browser sees run name, creation time, dataset, duration, source and models, and no score.
What a link can carry is a *shared view*: an experiment tag
`mlflow.sharedViewState.<key>` holding the table's state as JSON, applied by the UI when
the address says `?viewStateShareKey=<key>` (the UI's own "Share" button writes the same
tag). The toolkit writes one such view per experiment, `evolve-scores`, whose columns are
the score metrics the experiment's runs have, and opens it with `workflowType`, which
decides between the runs table and the GenAI overview.

What a shared view cannot carry: MLflow drops the expanded, pinned and hidden runs from it,
so a parent run opens collapsed; the parent of an experiment therefore carries its best
candidate's scores under the same metric names (`final_metrics`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

SHARE_KEY = "evolve-scores"
SHARED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
# MLflow 3.17 shows an experiment as a GenAI app (an empty overview) unless the address
# asks for the model-training view.
WORKFLOW_QUERY = "workflowType=machine_learning"
# The score columns, in the order shown, of each kind of run the toolkit logs: tuning trials
# (`value`), candidates and their parent (held-out / validation / train) and the held-out
# test of the best against its base. A store's view shows the first `MAX_COLUMNS` its runs
# have: with the run name and creation time, five fit in the table at 1440 px.
SCORE_METRICS = (
    "value",
    "heldout_accuracy",
    "heldout_memory_score",
    "validation_accuracy",
    "train_accuracy",
    "train_memory_score",
    "heldout_difference",
)
MAX_COLUMNS = 5
# The table's column ids (ag-grid's `colId` in MLflow 3.17's runs table). The run name is
# widened for `g03-c0 memory 0.69/0.59 acc 0.79/0.73` and `best memory ... g03-c0`; MLflow's
# default columns (dataset, duration, source, models) say nothing about a memory policy and
# are left out to make room for the scores.
RUN_NAME_COLUMN = "attributes.`Run Name`"
CREATED_COLUMN = "runDateAndNestInfo"
RUN_NAME_WIDTH_PX = 300
METRIC_WIDTH_PX = 132


def metric_column(name: str) -> str:
    """The UI's key of a metric column (its `makeCanonicalSortKey`)."""
    return f"metrics.`{name}`"


def score_columns(metric_keys: Iterable[str]) -> list[str]:
    """The score metrics among `metric_keys`, in the view's order, at most `MAX_COLUMNS`."""
    present = set(metric_keys)
    return [name for name in SCORE_METRICS if name in present][:MAX_COLUMNS]


def shared_view_state(metrics: list[str]) -> str:
    """The tag's value: the runs table's columns (run name, created, then `metrics`) with
    their widths, newest run first. These are the UI's own state keys."""
    columns = [metric_column(name) for name in metrics]
    widths = {RUN_NAME_COLUMN: RUN_NAME_WIDTH_PX, **dict.fromkeys(columns, METRIC_WIDTH_PX)}
    state: dict[str, Any] = {
        "orderByKey": "attributes.start_time",
        "orderByAsc": False,
        "selectedColumns": columns,
        "columnOrder": [RUN_NAME_COLUMN, CREATED_COLUMN, *columns],
        "columnWidths": widths,
    }
    return json.dumps(state, sort_keys=True)


def runs_view_route(experiment_id: str) -> str:
    """The UI route (after the server's address) of the experiment's scored runs view. It
    names the runs tab: the experiment's bare route redirects there without the view."""
    return f"/#/experiments/{experiment_id}/runs?viewStateShareKey={SHARE_KEY}&{WORKFLOW_QUERY}"


def experiment_metric_keys(client: Any, experiment_id: str, max_runs: int = 500) -> set[str]:
    """Every metric name the experiment's newest `max_runs` runs carry."""
    keys: set[str] = set()
    for run in client.search_runs([experiment_id], max_results=max_runs):
        keys.update(run.data.metrics)
    return keys


def publish_runs_view(client: Any, experiment_id: str) -> list[str]:
    """Write (or refresh) the experiment's `evolve-scores` view; returns its score metrics.
    Written only when it changed, so opening the UI twice adds nothing to the store."""
    metrics = score_columns(experiment_metric_keys(client, experiment_id))
    value = shared_view_state(metrics)
    tag = SHARED_VIEW_TAG_PREFIX + SHARE_KEY
    if client.get_experiment(experiment_id).tags.get(tag) != value:
        client.set_experiment_tag(experiment_id, tag, value)
    return metrics
