"""Which tracking URI a command uses (flag > spec > MLFLOW_TRACKING_URI > default), masking,
and the up-front checks of a URI and of MLflow's name and length limits."""

from __future__ import annotations

import http.server
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from optimize.evolve_helpers import write_spec

from evolve.core.errors import ConfigError, StorageError
from evolve.spec.config import load_spec
from evolve.stores import mlflow_limits, tracking_uri
from evolve.stores.tracking_uri import (
    DEFAULT_TRACKING_URI,
    check_tracking_uri,
    masked_uri,
    resolve_tracking_uri,
)
from evolve.tracking import tracker_for

FLAG, SPEC, ENV = "sqlite:///flag.db", "sqlite:///spec.db", "http://team:5000"


@pytest.mark.parametrize(
    ("flag", "configured", "environ", "expected", "source"),
    [
        (FLAG, SPEC, {"MLFLOW_TRACKING_URI": ENV}, FLAG, "--tracking-uri"),
        (None, SPEC, {"MLFLOW_TRACKING_URI": ENV}, SPEC, "the spec's [tracking] tracking_uri"),
        (None, None, {"MLFLOW_TRACKING_URI": ENV}, ENV, "MLFLOW_TRACKING_URI"),
        (None, None, {}, DEFAULT_TRACKING_URI, "the default"),
        # An exported but empty variable (or a blank flag) counts as unset.
        ("  ", None, {"MLFLOW_TRACKING_URI": ""}, DEFAULT_TRACKING_URI, "the default"),
    ],
)
def test_precedence_flag_spec_environment_default(flag, configured, environ, expected, source):
    location = resolve_tracking_uri(flag, configured, environ=environ)
    assert (location.uri, location.source) == (expected, source)


def test_the_spec_and_its_tracker_follow_the_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = load_spec(write_spec(tmp_path, tracking="enabled = true"))
    team = f"sqlite:///{tmp_path / 'team' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", team)
    assert spec.tracking_uri() == team
    tracker = tracker_for(spec)
    assert tracker.tracking_uri == team and tracker.location.source == "MLFLOW_TRACKING_URI"
    assert tracker_for(spec, tracking_uri=f"sqlite:///{tmp_path}/f.db").tracking_uri.endswith(
        "/f.db"
    )
    assert not (tmp_path / "mlruns").exists()


def test_masking_hides_credentials_and_query_values_only():
    assert masked_uri("https://me:s3cret@host:8443/mlflow?token=abc&x=1") == (
        "https://***@host:8443/mlflow?token=***&x=***"
    )
    # Nothing to mask: the URI exactly as given (four slashes of an absolute sqlite path).
    assert masked_uri("sqlite:////abs/mlruns/mlflow.db") == "sqlite:////abs/mlruns/mlflow.db"
    location = resolve_tracking_uri("http://u:pw@h:5000", None, environ={})
    assert "pw" not in location.describe() and "h:5000" in location.describe()


def test_an_unknown_scheme_is_refused_with_the_supported_ones():
    with pytest.raises(ConfigError, match="scheme MLflow has no store for") as error:
        check_tracking_uri("foo://bar")
    assert "sqlite" in str(error.value) and "http" in str(error.value)
    assert error.value.exit_code == 2


def test_a_file_that_is_not_a_database_is_refused(tmp_path):
    text = tmp_path / "notes.db"
    text.write_text("these are my notes, not a database\n" * 20)
    with pytest.raises(StorageError, match="not a SQLite database") as error:
        check_tracking_uri(f"sqlite:///{text}")
    assert error.value.exit_code == 5
    # A real database, an empty file and a file to be created are fine.
    sqlite3.connect(tmp_path / "real.db").execute("create table t (x)").connection.close()
    (tmp_path / "empty.db").touch()
    for name in ("real.db", "empty.db", "new.db"):
        check_tracking_uri(f"sqlite:///{tmp_path / name}")


KILLED_MID_TRANSACTION = """
import os, signal, sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("PRAGMA cache_size = 1")  # spill to the file: the journal becomes hot
connection.execute("BEGIN")
connection.executemany("INSERT INTO t VALUES (?)", [("x" * 500,)] * 2000)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_database_killed_mid_transaction_is_accepted(tmp_path):
    db_path = tmp_path / "mlflow.db"
    with sqlite3.connect(db_path) as connection:
        connection.execute("create table t (x)")
    subprocess.run([sys.executable, "-c", KILLED_MID_TRANSACTION, str(db_path)], check=False)
    assert (tmp_path / "mlflow.db-journal").exists()  # hot: only a writer rolls it back
    check_tracking_uri(f"sqlite:///{db_path}")
    with sqlite3.connect(db_path) as connection:
        assert connection.execute("select count(*) from t").fetchone() == (0,)


def test_a_refused_connection_fails_in_seconds():
    started = time.monotonic()
    with pytest.raises(StorageError, match="cannot be reached") as error:
        check_tracking_uri("http://127.0.0.1:1")
    assert time.monotonic() - started < 10
    assert "Connection refused" in str(error.value) and "--no-tracking" in str(error.value)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (a hung server)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield listener.getsockname()[1]
    listener.close()


def test_a_server_that_never_answers_fails_after_the_preflight_timeout(silent_port, monkeypatch):
    monkeypatch.setattr(tracking_uri, "PREFLIGHT_TIMEOUT_S", 0.5)
    started = time.monotonic()
    with pytest.raises(StorageError, match="timed out"):
        check_tracking_uri(f"http://127.0.0.1:{silent_port}")
    assert time.monotonic() - started < 5


MLFLOW_NOT_FOUND = b'{"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no experiment"}'


def _serve(status: int, body: bytes = b"{}") -> tuple[http.server.HTTPServer, str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_a_proxy_without_its_server_is_refused_any_other_answer_is_reachable():
    down, down_uri = _serve(503)
    up, up_uri = _serve(404, MLFLOW_NOT_FOUND)  # answers in MLflow's REST error format
    login, login_uri = _serve(401)  # behind a login: MLflow itself will say more
    try:
        with pytest.raises(StorageError, match="answered HTTP 503"):
            check_tracking_uri(down_uri)
        check_tracking_uri(up_uri)
        check_tracking_uri(login_uri)
    finally:
        for server in (down, up, login):
            server.shutdown()


def test_an_llm_endpoint_given_as_the_tracking_server_is_refused_in_one_line():
    from stub_server import StubServer

    with StubServer(latency=0.0) as stub:
        for uri in (stub.base_url, stub.base_url.removesuffix("/v1")):
            with pytest.raises(ConfigError, match="not as an MLflow tracking server") as error:
                check_tracking_uri(uri)
            assert error.value.exit_code == 2 and "\n" not in str(error.value)


# ----- MLflow's limits, checked when a spec loads ---------------------------------------------


def test_the_limits_are_mlflows_own():
    from mlflow.utils import validation

    assert mlflow_limits.EXPERIMENT_NAME_MAX_CHARS == validation.MAX_EXPERIMENT_NAME_LENGTH
    assert mlflow_limits.DESCRIPTION_MAX_CHARS == validation.MAX_EXPERIMENT_TAG_VAL_LENGTH
    for name in ("a/b", "a:b", "..x", ".", "ok name-1.2", "x" * 600):
        try:
            validation._validate_model_name(name)
            mlflow_accepts = True
        except Exception:  # noqa: BLE001 - MlflowException
            mlflow_accepts = False
        assert (mlflow_limits.registered_model_name_problem(name) is None) == mlflow_accepts, name


@pytest.mark.parametrize(
    ("body", "tracking", "message"),
    [
        (f'description = "{"d" * 20_001}"', "enabled = true", "20001 characters"),
        ("", f'experiment_name = "{"e" * 501}"', "501 characters"),
        ("", 'registered_model = "team/model:v1"', "contains the character\\(s\\) '/' ':'"),
        ("", 'registered_model = "..hidden"', "relative file path"),
    ],
)
def test_specs_beyond_mlflows_limits_are_refused_when_loaded(tmp_path, body, tracking, message):
    with pytest.raises(ConfigError, match=message) as error:
        load_spec(write_spec(tmp_path, body, tracking=tracking))
    assert "tracking" in str(error.value) or "description" in str(error.value)


def test_a_description_at_the_limit_is_accepted(tmp_path):
    long_description = "d" * mlflow_limits.DESCRIPTION_MAX_CHARS
    spec = load_spec(write_spec(tmp_path, f'description = "{long_description}"'))
    assert len(spec.description) == mlflow_limits.DESCRIPTION_MAX_CHARS


def test_postgresql_without_its_driver_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'amemgym-evolve\[postgres\]'") as error:
        check_tracking_uri("postgresql://me@127.0.0.1/db")
    assert "\n" not in str(error.value) and "me@" not in str(error.value)


def test_the_registry_follows_the_store_in_use(tmp_path):
    # In a fresh interpreter: earlier tests may have set a registry URI in this process.
    elsewhere = f"sqlite:///{tmp_path / 'team.db'}"  # a user's MLFLOW_REGISTRY_URI
    ours = f"sqlite:///{tmp_path / 'mlflow.db'}"
    script = (
        "import os, mlflow\n"
        "from evolve.tracking.store import use_tracking_uri\n"
        f"with use_tracking_uri({ours!r}):\n"
        "    inside = mlflow.get_registry_uri()\n"
        "print(inside, mlflow.get_registry_uri(), os.environ['MLFLOW_REGISTRY_URI'])\n"
    )
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "MLFLOW_REGISTRY_URI": elsewhere, "PYTHONPATH": str(repo)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # Inside: the store the model's files go to; after: the user's choice, untouched.
    assert done.stdout.split() == [ours, elsewhere, elsewhere]
