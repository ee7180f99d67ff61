"""Which MLflow tracking URI a command uses, and refusing one that cannot work up front.

Precedence, the same for every command that tracks or reads tracking (`run`, `tune`,
`export`, and the Python API): the `--tracking-uri` flag (or `tracking_uri=` argument), then
the spec's `[tracking] tracking_uri` (for `export <name>`: the one the run's spec named, as
written, so a relative store of a moved or copied checkout is its own), then the
`MLFLOW_TRACKING_URI` environment variable, then the local default
`sqlite:///mlruns/mlflow.db` (relative to the current directory). A team that sets
`MLFLOW_TRACKING_URI` for its server gets every run there without editing specs.

Checked before any LLM call (and before `export` writes anything), each failure one line
with the README's exit code:
- a plain path or a `file:` URI (MLflow's file store, in maintenance mode): exit 2, naming
  the sqlite URI to use instead;
- an in-memory database (`sqlite://`, `sqlite:///:memory:`): exit 2, it would lose every run;
- Databricks (`databricks`, `databricks-uc`, `uc`): exit 2, not supported;
- a scheme MLflow has no store for (`foo://bar`): exit 2;
- a database URL whose driver is not installed (`postgresql://`, `mysql://`): exit 2,
  naming the package or extra to install;
- a sqlite URI naming a file that is not a SQLite database: exit 5 (as for Optuna storages);
- an HTTP(S) server that does not answer within `PREFLIGHT_TIMEOUT_S`: exit 5; one that
  answers, but not as MLflow's REST API (an LLM endpoint given by mistake): exit 2. MLflow's
  own client retries a dead server for about four minutes (seven retries with exponential
  backoff) before it raises; one request without retries tells the same in seconds.

Why hand-written: MLflow resolves `MLFLOW_TRACKING_URI` only for its process-wide fluent
state, while the toolkit uses explicit clients per store; and MLflow has no pre-flight check.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from evolve.core.errors import ConfigError, StorageError

DEFAULT_TRACKING_URI = "sqlite:///mlruns/mlflow.db"
ENV_VAR = "MLFLOW_TRACKING_URI"
# One request, no retry: a live server answers /health in milliseconds; two phases
# (connect, read) of this timeout stay well within the 10 s a user waits for a verdict.
PREFLIGHT_TIMEOUT_S = 4.0
# What MLflow's HTTP client retries for minutes: a proxy in front of a stopped server.
_UNAVAILABLE_STATUSES = {502, 503, 504}

SOURCE_FLAG = "--tracking-uri"
SOURCE_SPEC = "the spec's [tracking] tracking_uri"
SOURCE_ENV = ENV_VAR
SOURCE_DEFAULT = "the default"


@dataclass(frozen=True)
class TrackingLocation:
    """A tracking URI and where it came from (a flag, the spec, the environment, the default)."""

    uri: str
    source: str

    def describe(self) -> str:
        """One line for the start of a command; credentials and query values masked."""
        return f"MLflow tracking URI: {masked_uri(self.uri)} (from {self.source})"


def resolve_tracking_uri(
    flag: str | None,
    configured: str | None,
    *,
    configured_source: str = SOURCE_SPEC,
    environ: Mapping[str, str] | None = None,
) -> TrackingLocation:
    """The tracking URI by precedence: flag > configured (spec) > `MLFLOW_TRACKING_URI` > default.

    Blank values count as unset (an exported but empty variable must not select "").
    """
    environ = os.environ if environ is None else environ
    candidates = (
        (flag, SOURCE_FLAG),
        (configured, configured_source),
        (environ.get(ENV_VAR), SOURCE_ENV),
    )
    for value, source in candidates:
        if value is not None and value.strip():
            return TrackingLocation(value.strip(), source)
    return TrackingLocation(DEFAULT_TRACKING_URI, SOURCE_DEFAULT)


def masked_uri(uri: str) -> str:
    """The URI without user name, password or query values (tokens travel there).

    Edited as text, never parsed and rebuilt: rebuilding drops a slash of `sqlite:////abs`."""
    if "://" not in uri:
        return uri
    scheme, rest = uri.split("://", 1)
    rest, hash_mark, fragment = rest.partition("#")
    rest, question_mark, query = rest.partition("?")
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    if query:
        query = "&".join(
            f"{part.split('=', 1)[0]}=***" if "=" in part else part
            for part in query.split("&")
            if part
        )
    masked_fragment = "***" if fragment else ""
    return f"{scheme}://{authority}{slash}{path}{question_mark}{query}{hash_mark}{masked_fragment}"


def sqlite_file(uri: str) -> Path | None:
    """The database file of a `sqlite:///PATH` URI, without its query (SQLAlchemy's
    connection options: never part of a file name); None for any other URI."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def _sqlite_suggestion(path: str) -> str:
    """The sqlite URI of a store in `path` (a file ending in .db, else a directory)."""
    path = path.rstrip("/") or "."
    return f"sqlite:///{path}" if path.endswith(".db") else f"sqlite:///{path}/mlflow.db"


# Built into MLflow, but they need Databricks' SDK and workspace credentials, which the
# toolkit neither installs nor passes on: a traceback deep inside MLflow otherwise.
_DATABRICKS_SCHEMES = ("databricks", "databricks-uc", "uc")
_FIX = f"fix --tracking-uri, [tracking] tracking_uri or {ENV_VAR}"


def check_uri_form(uri: str) -> None:
    """Refuse the forms that would crash or lose data: a plain path or `file:` URI, an
    in-memory database, Databricks."""
    shown = masked_uri(uri)
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme == "sqlite" and (
        uri.rstrip("/") == "sqlite:" or sqlite_file(uri) is None or "mode=memory" in parsed.query
    ):
        raise ConfigError(
            f"tracking URI {shown!r} is an in-memory database: every run would be lost when "
            f"the command ends; expected a file, e.g. {DEFAULT_TRACKING_URI} (the default), "
            f"or pass --no-tracking; {_FIX}"
        )
    if scheme in _DATABRICKS_SCHEMES or uri.lower() in _DATABRICKS_SCHEMES:
        raise ConfigError(
            f"tracking URI {shown!r}: Databricks-hosted MLflow is not supported by evolve; "
            f"expected a sqlite store ({DEFAULT_TRACKING_URI}), a database URL or an MLflow "
            f"server (http://host:5000); {_FIX}, or pass --no-tracking"
        )
    if scheme == "file" or (not scheme and "://" not in uri) or len(scheme) == 1:
        # `len(scheme) == 1`: a Windows drive letter, still a plain path.
        suggestion = _sqlite_suggestion(parsed.path if scheme == "file" else uri)
        if suggestion == DEFAULT_TRACKING_URI:
            suggestion += " (the default)"
        raise ConfigError(
            f"tracking URI {shown!r} names MLflow's file store, which MLflow keeps in "
            "maintenance mode and evolve does not support; expected a sqlite store, e.g. "
            f"{suggestion}; {_FIX}"
        )


def check_database_driver(uri: str) -> None:
    """Refuse a database URL (PostgreSQL, MySQL, SQL Server) whose driver is missing."""
    from evolve.stores.database_urls import missing_driver_message

    scheme = urlparse(uri).scheme.lower()
    if scheme.split("+", 1)[0] not in ("postgresql", "mysql", "mssql"):
        return
    message = missing_driver_message(uri)
    if message:
        raise ConfigError(f"tracking URI {masked_uri(uri)}: {message}")


def check_scheme(uri: str) -> None:
    """Refuse a URI no MLflow tracking store (built in or plugin) can open."""
    try:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry
    except ImportError:  # a future MLflow moved its registry: MLflow itself will tell
        return
    try:
        _tracking_store_registry.get_store_builder(uri)
    except MlflowException:
        supported = sorted(s for s in _tracking_store_registry._registry if s)
        raise ConfigError(
            f"tracking URI {masked_uri(uri)!r} has a scheme MLflow has no store for; expected "
            f"one of {', '.join(supported)} (e.g. sqlite:///mlruns/mlflow.db or "
            "http://host:5000); fix --tracking-uri, [tracking] tracking_uri or "
            f"{ENV_VAR}"
        ) from None


def check_sqlite_database(db_path: Path) -> None:
    """Refuse an existing file that is not a SQLite database (MLflow would raise a traceback
    from deep inside its schema migration)."""
    if not db_path.is_file() or db_path.stat().st_size == 0:
        return  # created by MLflow on first use
    # Read-write when allowed: a transaction cut by a kill leaves a hot journal, which a
    # read-only connection cannot roll back ("attempt to write a readonly database").
    mode = "rw" if os.access(db_path, os.W_OK) else "ro"
    try:
        connection = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode={mode}", uri=True)
        try:
            connection.execute("PRAGMA schema_version").fetchone()
        finally:
            connection.close()
    except sqlite3.DatabaseError as error:
        raise StorageError(
            f"MLflow tracking DB {db_path} is not a SQLite database ({error}); expected an "
            "MLflow sqlite store or a path where one can be created; pass another "
            f"--tracking-uri (or {ENV_VAR}), or move the file away"
        ) from None


def check_server_reachable(uri: str, timeout_s: float | None = None) -> None:
    """One request to an HTTP(S) tracking server, without MLflow's retries.

    Any answer counts as reachable (even 401 or 404: the server is there), except the
    statuses of a proxy whose server is down. Certificates and credentials are MLflow's
    (`MLFLOW_TRACKING_TOKEN`, `MLFLOW_TRACKING_SERVER_CERT_PATH`, ...).
    """
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    timeout_s = PREFLIGHT_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        response = http_request(
            get_default_host_creds(uri),
            "/health",
            "GET",
            max_retries=0,
            timeout=timeout_s,
            raise_on_status=False,
        )
    except Exception as error:  # noqa: BLE001 - requests, urllib3 and MLflow wrap differently
        raise StorageError(
            f"MLflow tracking server {masked_uri(uri)} cannot be reached within {timeout_s:g} "
            f"s ({_connection_failure(error)}); start it (mlflow server), fix --tracking-uri "
            f"or {ENV_VAR}, or pass --no-tracking"
        ) from None
    if response.status_code in _UNAVAILABLE_STATUSES:
        raise StorageError(
            f"MLflow tracking server {masked_uri(uri)} answered HTTP {response.status_code} "
            "(unavailable); start it or fix --tracking-uri, or pass --no-tracking"
        )
    check_speaks_mlflow(uri, timeout_s)


def check_speaks_mlflow(uri: str, timeout_s: float) -> None:
    """Refuse a server that answers, but not as MLflow does (an LLM endpoint given by
    mistake): MLflow's REST API answers an experiment lookup with the experiment or with an
    `error_code`. Refused ("the server is behind a login") answers pass: MLflow will tell."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    try:
        response = http_request(
            get_default_host_creds(uri),
            "/api/2.0/mlflow/experiments/get-by-name",
            "GET",
            max_retries=0,
            timeout=timeout_s,
            raise_on_status=False,
            params={"experiment_name": "Default"},
        )
    except Exception:  # noqa: BLE001 - it answered /health a moment ago; MLflow will tell
        return
    if response.status_code in (401, 403):
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and ("experiment" in body or "error_code" in body):
        return
    raise ConfigError(
        f"tracking URI {masked_uri(uri)} answers, but not as an MLflow tracking server "
        f"(HTTP {response.status_code} to an experiment lookup); is it an LLM endpoint? "
        f"expected an MLflow server (mlflow server --port 5000); {_FIX}, or pass --no-tracking"
    )


def _connection_failure(error: Exception) -> str:
    """The operating system's reason inside the layers of wrapping ("Connection refused")."""
    text = " ".join(str(error).split())
    found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if found:
        return found.group(1).strip()
    if "timed out" in text.lower() or "timeout" in text.lower():
        return "timed out"
    return text[:160]


def check_tracking_uri(uri: str) -> None:
    """Every check that needs no store: form, scheme, driver, a sqlite file's format, a
    server's answer."""
    check_uri_form(uri)
    check_scheme(uri)
    check_database_driver(uri)
    db_path = sqlite_file(uri)
    if db_path is not None:
        check_sqlite_database(db_path)
    elif urlparse(uri).scheme in ("http", "https"):
        check_server_reachable(uri)
