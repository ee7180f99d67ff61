"""The MLflow store: a checked tracking URI, a client on it, experiments, and the tags every
run carries (source, user, git), shared by the experiment and the study trackers.

The tracking URI is `--tracking-uri`, else the spec's, else `MLFLOW_TRACKING_URI`, else
`sqlite:///mlruns/mlflow.db` relative to the current directory, with artifacts under
`mlruns/artifacts/` (`evolve.stores.tracking_uri`, which also refuses unusable URIs up front).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from evolve.core.errors import ConfigError, StorageError, shown_value
from evolve.core.locking import exclusive_file_lock
from evolve.stores.tracking_uri import (
    TrackingLocation,
    check_tracking_uri,
    resolve_tracking_uri,
    sqlite_file,
)
from evolve.tracking.sqlite_store import ensure_complete_store
from evolve.tracking.store_location import rebase_moved_store
from evolve.tracking.tags import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, NOTE_TAG

if TYPE_CHECKING:
    from evolve.spec.config import RunSpec

logger = logging.getLogger(__name__)


def quiet_mlflow() -> None:
    """Keep MLflow's and alembic's INFO logs, warnings, telemetry and progress bars quiet."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for name in ("mlflow", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # It logs a database error (statement and parameters included) and raises it too; the
    # raised one becomes our one-line error (a full disk: exit 5), the log only noise.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", module=r"mlflow(\..*)?$")
    warnings.filterwarnings("ignore", category=FutureWarning, message=r".*mlflow.*")


def default_artifact_location(tracking_uri: str) -> str | None:
    """For a sqlite store: `<db dir>/artifacts` (absolute file URI); else the server decides."""
    db_path = sqlite_file(tracking_uri)
    if db_path is None:
        return None
    return (db_path.parent.resolve() / "artifacts").as_uri()


def normalize_tracking_uri(tracking_uri: str) -> str:
    """A relative sqlite path made absolute (relative to the current directory, once)."""
    db_path = sqlite_file(tracking_uri)
    if db_path is None or db_path.is_absolute():
        return tracking_uri
    query = tracking_uri.partition("?")[2]
    return f"sqlite:///{db_path.resolve()}" + (f"?{query}" if query else "")


def prepare_tracking_uri(tracking_uri: str) -> str:
    """Normalize; create the directory of a sqlite store; refuse URIs with credentials, an
    unknown scheme, a file that is no database and a server that does not answer."""
    tracking_uri = normalize_tracking_uri(tracking_uri)
    parsed = urlparse(tracking_uri)
    if parsed.password or (parsed.username and parsed.scheme in ("http", "https")):
        raise ConfigError(
            f"tracking URI {parsed.scheme}://{parsed.hostname}... carries credentials; set "
            "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (or a token) in the "
            "environment instead"
        )
    check_tracking_uri(tracking_uri)
    db_path = sqlite_file(tracking_uri)
    if db_path is not None:
        check_sqlite_writable(db_path)
    return tracking_uri


def check_sqlite_writable(db_path: Path) -> None:
    """Fail at once on a store that cannot be written (SQLAlchemy would retry for minutes).

    The store's own folder (`mlruns/`) is created when missing, but not its ancestors: a
    missing ancestor is usually a typo (`sqlite:////nonexistent/dir/x.db`), and creating the
    tree would scatter stores where nobody looks."""
    if not db_path.parent.parent.is_dir():
        raise StorageError(
            f"MLflow tracking DB {db_path}: directory {db_path.parent.parent} does not exist; "
            "expected an existing directory (the store's own folder is created); create it "
            "(mkdir -p) or fix --tracking-uri, [tracking] tracking_uri or MLFLOW_TRACKING_URI"
        )
    try:
        db_path.parent.mkdir(exist_ok=True)
        if db_path.exists():
            os.close(os.open(db_path, os.O_RDWR))
        _store_lock_path(db_path).touch(exist_ok=True)  # sqlite writes journals there too
    except OSError as error:
        raise StorageError(
            f"MLflow tracking DB {db_path} is not writable ({error.strerror or error}); make it "
            "writable, pass --tracking-uri with another store, or --no-tracking"
        ) from None


def _store_lock_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".lock")


def store_creation_lock(tracking_uri: str) -> contextlib.AbstractContextManager[None]:
    """Held around the first use of a sqlite store: opening it creates or migrates its
    schema, and two processes doing that at once die with `duplicate column name`."""
    db_path = sqlite_file(tracking_uri)
    if db_path is None:
        return contextlib.nullcontext()
    return exclusive_file_lock(_store_lock_path(db_path))


@functools.cache
def run_context_tags() -> dict[str, str]:
    """The tags MLflow's fluent `start_run` sets: user, source name and type, and the git
    commit, branch and repo URL of the entry point; when the entry point is no git checkout
    (an installed `evolve` command), those of the current directory (where the specs are).
    MLflow strips credentials from repo URLs; this strips any left, to be sure."""
    from mlflow.tracking.context.registry import resolve_tags
    from mlflow.utils.git_utils import get_git_branch, get_git_commit, get_git_repo_url
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_BRANCH, MLFLOW_GIT_COMMIT, MLFLOW_GIT_REPO_URL

    tags = {k: str(v) for k, v in resolve_tags().items() if v is not None}
    if MLFLOW_GIT_COMMIT not in tags:
        cwd = os.getcwd()
        git = {
            MLFLOW_GIT_COMMIT: get_git_commit(cwd),
            MLFLOW_GIT_BRANCH: get_git_branch(cwd),
            MLFLOW_GIT_REPO_URL: get_git_repo_url(cwd),
        }
        tags.update({k: v for k, v in git.items() if v})
    return {k: strip_url_credentials(v) for k, v in tags.items()}


def strip_url_credentials(text: str) -> str:
    """`scheme://user:secret@host/...` -> `scheme://host/...` (anything else unchanged)."""
    return re.sub(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]+@", r"\1", text)


def describe_experiment(client: Any, experiment_id: str, description: str) -> None:
    """The experiment's description and kind (set again on every start: the spec may change)."""
    _set_experiment_tag(client, experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    if description.strip():
        _set_experiment_tag(client, experiment_id, NOTE_TAG, description.strip())


def _set_experiment_tag(client: Any, experiment_id: str, key: str, value: str) -> None:
    """`set_experiment_tag`, safe when processes set the same new tag at once (workers of one
    study starting together). MLflow's SQL store looks the tag up, then inserts it; a second
    process doing the same in between makes the insert break the table's unique key. Then the
    tag exists, and setting it again updates it."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import IntegrityError

    try:
        client.set_experiment_tag(experiment_id, key, value)
    except MlflowException as error:
        if not isinstance(error.__cause__, IntegrityError):
            raise
        client.set_experiment_tag(experiment_id, key, value)


def prompt_name(experiment: str, component: str) -> str:
    """`<experiment>.<component>` in the characters the Prompt Registry accepts."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{experiment}.{component}").strip("-.") or "prompt"


def mlflow_client(tracking_uri: str):
    quiet_mlflow()
    from mlflow.tracking import MlflowClient

    uri = prepare_tracking_uri(tracking_uri)
    # Explicit registry URI: the default is MLflow's process-wide one, which may point elsewhere.
    with store_creation_lock(uri):
        db_path = sqlite_file(uri)
        if db_path is not None:
            # Built or upgraded beside the store and renamed in: never half a schema.
            note = ensure_complete_store(db_path)
            if note:
                logger.warning("evolve: note: %s", note)
            moved = rebase_moved_store(db_path)
            if moved:
                logger.warning("evolve: note: %s", moved)
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.search_experiments(max_results=1)  # opens the store: schema created here
    return client


def get_or_create_experiment(client: Any, name: str, tracking_uri: str) -> str:
    # Serialized too: two processes creating one experiment at once would collide.
    with store_creation_lock(normalize_tracking_uri(tracking_uri)):
        return _get_or_create_experiment(client, name, tracking_uri)


def _get_or_create_experiment(client: Any, name: str, tracking_uri: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage != "active":
            raise ConfigError(
                f"MLflow experiment {name!r} is deleted; restore it (mlflow experiments "
                "restore) or set [tracking] experiment_name to another name"
            )
        return experiment.experiment_id
    return client.create_experiment(name, artifact_location=default_artifact_location(tracking_uri))


def tracking_location(flag: str | None, spec: RunSpec) -> TrackingLocation:
    """The tracking URI of a command by precedence (see `evolve.stores.tracking_uri`), checked and
    normalized before any LLM call."""
    location = resolve_tracking_uri(flag, spec.tracking.tracking_uri)
    return TrackingLocation(prepare_tracking_uri(location.uri), location.source)


def filter_literal(value: str) -> str:
    """`value` as a string literal of an MLflow search filter. MLflow's filter parser takes
    no escapes (a backslash before a quote matches nothing), so the literal is quoted with
    the kind of quote `value` does not hold; a value holding both cannot be searched for."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise ConfigError(
        f"{shown_value(value)} holds both kinds of quote (' and \"), which MLflow's search "
        "cannot match; choose a name without one of them"
    )


def now_ms() -> int:
    """MLflow's timestamps: milliseconds since the epoch."""
    return int(time.time() * 1000)


@contextlib.contextmanager
def use_tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's process-wide tracking URI set to `uri` for the block, then restored, and
    `MLFLOW_TRACKING_URI` as it was: MLflow's own restore unsets the variable when no URI was
    set in-process, and the user's choice of store would be gone for the next command.

    The model registry follows the same store for the block: a registry URI set elsewhere
    (`MLFLOW_REGISTRY_URI`, or an earlier `mlflow.set_registry_uri`, which also sets that
    variable) would register the model in another store than the one holding its files."""
    from mlflow.tracking._model_registry import utils as registry
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri as use_uri

    saved = os.environ.get("MLFLOW_TRACKING_URI")
    saved_registry, saved_registry_env = registry._registry_uri, os.environ.get(REGISTRY_ENV)
    try:
        with use_uri(uri):
            registry._registry_uri = uri
            yield
    finally:
        registry._registry_uri = saved_registry
        if saved_registry_env is None:
            os.environ.pop(REGISTRY_ENV, None)
        else:
            os.environ[REGISTRY_ENV] = saved_registry_env
        if saved is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved


REGISTRY_ENV = "MLFLOW_REGISTRY_URI"


def run_is_active(client: Any, run_id: str | None) -> bool:
    """Whether `run_id` names a run of the store that is not deleted."""
    if not run_id:
        return False
    try:
        return client.get_run(run_id).info.lifecycle_stage == "active"
    except Exception:  # noqa: BLE001 - any lookup failure means: make a new run
        return False


# MLflow's tag listing a run's table artifacts (what `log_table` sets; the UI reads it).
LOGGED_ARTIFACTS_TAG = "mlflow.loggedArtifacts"


def replace_table(
    client: Any, run_id: str, table: dict[str, list[Any]], artifact_file: str
) -> None:
    """`table` (column -> values) as an MLflow table artifact, replaced: MLflow's `log_table`
    appends to an existing one, so a resumed experiment would list its rows twice."""
    import json

    columns = list(table)
    rows = [list(row) for row in zip(*table.values(), strict=True)]
    client.log_text(run_id, json.dumps({"columns": columns, "data": rows}), artifact_file)
    listed = json.loads(client.get_run(run_id).data.tags.get(LOGGED_ARTIFACTS_TAG, "[]"))
    entry = {"path": artifact_file, "type": "table"}
    if entry not in listed:
        client.set_tag(run_id, LOGGED_ARTIFACTS_TAG, json.dumps([*listed, entry]))


def metric_value(value: float) -> float:
    """A metric as the runs table shows it: counts as they are, other values to 7 significant
    digits: `0.3333333`, never the summing noise of `0.33333333333333354`. That is finer than
    any score, interval or p the toolkit computes can resolve, so comparisons keep their
    precision."""
    number = float(value)
    if not math.isfinite(number) or number.is_integer():
        return number
    return float(f"{number:.7g}")


def logged_metric(key: str, value: float, timestamp: int, step: int) -> Any:
    """An MLflow `Metric` with its value as `metric_value` gives it."""
    from mlflow.entities import Metric

    return Metric(key, metric_value(value), timestamp, step)
