"""The tracking URI through `evolve run|tune|export`: MLFLOW_TRACKING_URI is honoured (below the
flag and the spec), printed at start, and a URI that cannot work is refused in one line with
the README's exit code before any LM is opened."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest
from optimize.evolve_helpers import World, write_spec
from tuning.tune_helpers import PAPER_GRID, TuneWorld, write_tune_spec

from evolve.cli import main
from evolve.core.errors import EXIT_BAD_INPUT, EXIT_STORAGE
from evolve.spec.config import load_spec
from evolve.tracking import mlflow_client, tracker_for
from evolve.tracking.runs_view import runs_view_route


@pytest.fixture
def opened(monkeypatch) -> list[object]:
    """`evolve run` and `evolve tune` get scripted LMs; the list records every opening."""
    configs: list[object] = []

    @contextlib.contextmanager
    def run_lms(config):
        configs.append(config)
        yield World().lms

    @contextlib.contextmanager
    def tune_lms(config):
        configs.append(config)
        yield TuneWorld().lms

    monkeypatch.setattr("evolve.commands.run.open_role_lms", run_lms)
    monkeypatch.setattr("evolve.commands.tune.open_role_lms", tune_lms)
    return configs


@pytest.fixture
def team_store(tmp_path, monkeypatch) -> str:
    """A team's store named only by MLFLOW_TRACKING_URI; the cwd is where ./mlruns would go."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path / 'team' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def test_run_and_export_land_in_the_environments_store(tmp_path, team_store, opened, capsys):
    spec = write_spec(tmp_path, optimizer="generations = 0", tracking="enabled = true")
    assert main(["run", str(spec), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"MLflow tracking URI: {team_store} (from MLFLOW_TRACKING_URI)" in err
    assert not (tmp_path / "mlruns").exists()  # nothing went to the local default
    client = mlflow_client(team_store)
    experiment = client.get_experiment_by_name("amemgym-evolve/exp")
    runs = client.search_runs([experiment.experiment_id])
    assert {r.data.tags["evolve.kind"] for r in runs} == {"experiment", "candidate"}

    assert main(["export", "exp", "--out", str(tmp_path / "bundle")]) == 0
    captured = capsys.readouterr()
    assert "registered exp version 1" in captured.out
    # The variable is still set after `run` in this process (MLflow's own restore of its
    # process-wide URI unsets it), and export follows it, not a path the run recorded.
    assert "(from MLFLOW_TRACKING_URI)" in captured.err
    assert client.get_registered_model("exp").latest_versions
    assert not (tmp_path / "mlruns").exists()


def test_the_flag_beats_the_spec_which_beats_the_environment(tmp_path, team_store):
    spec_store = f"sqlite:///{tmp_path / 'spec' / 'mlflow.db'}"
    spec = load_spec(write_spec(tmp_path, tracking=f'tracking_uri = "{spec_store}"'))
    tracker = tracker_for(spec)
    assert tracker.tracking_uri == spec_store
    assert tracker.location.source == "the spec's [tracking] tracking_uri"
    flag_store = f"sqlite:///{tmp_path / 'flag' / 'mlflow.db'}"
    tracker = tracker_for(spec, tracking_uri=flag_store)
    assert (tracker.tracking_uri, tracker.location.source) == (flag_store, "--tracking-uri")
    assert not (tmp_path / "team").exists()


def test_tune_lands_in_the_environments_store(tmp_path, team_store, opened, capsys):
    spec = write_tune_spec(
        tmp_path,
        f'trials = 2\nsampler = "grid"\n[tuning.parameters]\n{PAPER_GRID}',
        tracking='enabled = true\nexperiment_name = "team-tune"',
    )
    assert main(["tune", str(spec), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "(from MLFLOW_TRACKING_URI)" in captured.err and team_store in captured.out
    experiment = mlflow_client(team_store).get_experiment_by_name("team-tune")
    assert experiment is not None
    runs = mlflow_client(team_store).search_runs([experiment.experiment_id])
    assert sum(r.data.tags.get("evolve.kind") == "tuning" for r in runs) == 1
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()
    # It ends with the exact commands and address, not a "..." to fill in: the store is
    # named (it is not the default), and the address opens the scored runs view.
    evolve_ui, by_hand = captured.out.rstrip().splitlines()[-2:]
    assert f" ui {spec} --tracking-uri {team_store} " in evolve_ui
    assert f" ui --backend-store-uri {team_store} --workers 1, then open " in by_hand
    assert by_hand.endswith(runs_view_route(experiment.experiment_id))
    assert "..." not in captured.out


# ----- refused up front ---------------------------------------------------------------------------


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("evolve: error:")]
    assert len(errors) == 1, err[-2000:]
    return errors[0]


def not_a_database(tmp_path: Path) -> str:
    path = tmp_path / "notes.db"
    path.write_text("meeting notes, not a database\n" * 50)
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def untracked_runs(tmp_path_factory) -> Path:
    """A runs directory holding one finished, untracked experiment `exp` (for export)."""
    directory = tmp_path_factory.mktemp("untracked")
    with pytest.MonkeyPatch.context() as patch:

        @contextlib.contextmanager
        def run_lms(config):
            yield World().lms

        patch.setattr("evolve.commands.run.open_role_lms", run_lms)
        spec = write_spec(directory, optimizer="generations = 0")
        assert main(["run", str(spec), "--runs-dir", str(directory / "runs"), "--no-progress"]) == 0
    return directory / "runs"


@pytest.mark.parametrize(
    ("uri", "code", "message"),
    [
        (lambda tmp: "foo://bar", EXIT_BAD_INPUT, "scheme MLflow has no store for"),
        (not_a_database, EXIT_STORAGE, "is not a SQLite database"),
        (lambda tmp: "http://127.0.0.1:1", EXIT_STORAGE, "cannot be reached"),
        (lambda tmp: "mlruns", EXIT_BAD_INPUT, "e.g. sqlite:///mlruns/mlflow.db (the default)"),
        (lambda tmp: "file:./store", EXIT_BAD_INPUT, "e.g. sqlite:///./store/mlflow.db"),
        (lambda tmp: "databricks", EXIT_BAD_INPUT, "Databricks-hosted MLflow is not supported"),
        (lambda tmp: "databricks-uc://p", EXIT_BAD_INPUT, "Databricks-hosted MLflow"),
        (lambda tmp: "sqlite://", EXIT_BAD_INPUT, "is an in-memory database"),
        (lambda tmp: "sqlite:///:memory:", EXIT_BAD_INPUT, "is an in-memory database"),
        (lambda tmp: "mysql://me@127.0.0.1/db", EXIT_BAD_INPUT, "pip install mysqlclient"),
        (lambda tmp: "postgresql+pg8000://me@127.0.0.1/db", EXIT_BAD_INPUT, "pip install pg8000"),
    ],
    ids=[
        "unknown-scheme",
        "not-a-database",
        "unreachable-server",
        "plain-path",
        "file-uri",
        "databricks",
        "databricks-uc",
        "sqlite-memory",
        "sqlite-memory-file",
        "mysql-without-driver",
        "postgresql-without-driver",
    ],
)
@pytest.mark.parametrize("command", ["run", "tune", "export"])
def test_a_bad_tracking_uri_is_one_line_before_any_lm(
    tmp_path, monkeypatch, opened, untracked_runs, capsys, command, uri, code, message
):
    monkeypatch.chdir(tmp_path)
    if command == "tune":
        grid = f'trials = 1\nsampler = "grid"\n[tuning.parameters]\n{PAPER_GRID}'
        spec = write_tune_spec(tmp_path, grid, tracking="enabled = true")
        args = ["tune", str(spec)]
    elif command == "run":
        args = ["run", str(write_spec(tmp_path, tracking="enabled = true"))]
    else:
        args = [
            "export",
            "exp",
            "--runs-dir",
            str(untracked_runs),
            "--out",
            str(tmp_path / "bundle"),
        ]
    started = time.monotonic()
    result = main([*args, "--tracking-uri", uri(tmp_path)])
    line = one_error_line(capsys)
    assert result == code and message in line, line
    assert time.monotonic() - started < 10
    assert opened == []  # refused before any LM was opened
    assert not (tmp_path / "bundle").exists()  # export refused before writing the bundle
    # Nothing written for the store either (MLflow would make ./mlruns or a file ":memory:").
    assert not {"mlruns", "store", ":memory:"} & {path.name for path in tmp_path.iterdir()}


@pytest.mark.parametrize(
    ("body", "tracking", "message"),
    [
        (f'description = "{"d" * 20_001}"', "enabled = true", "description has 20001 characters"),
        ("", f'experiment_name = "{"e" * 501}"', "experiment name has 501 characters"),
        ("", 'registered_model = "bad/name:x?"', "contains the character"),
    ],
)
def test_mlflows_limits_are_one_line_before_any_lm(
    tmp_path, opened, capsys, body, tracking, message
):
    spec = write_spec(tmp_path, body, tracking=tracking)
    result = main(["run", str(spec), "--runs-dir", str(tmp_path / "runs")])
    line = one_error_line(capsys)
    assert result == EXIT_BAD_INPUT and message in line and len(line) < 600
    assert opened == []


TOKEN = "t0ken-s3cret-value"


def files_naming(root: Path, secret: str) -> list[str]:
    """Every file under `root` whose name or content holds `secret`."""
    return [
        str(path)
        for path in root.rglob("*")
        if secret in path.name or (path.is_file() and secret.encode() in path.read_bytes())
    ]


def test_a_token_in_the_tracking_uri_is_in_no_file_or_file_name(
    tmp_path, monkeypatch, opened, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}?token={TOKEN}"
    spec = write_spec(tmp_path, optimizer="generations = 0", tracking="enabled = true")
    assert main(["run", str(spec), "--no-progress", "--tracking-uri", uri]) == 0
    assert files_naming(tmp_path, TOKEN) == []
    assert TOKEN not in capsys.readouterr().err
    # A store given on the command line is not the experiment's: export follows the
    # documented precedence (--tracking-uri, the spec's, MLFLOW_TRACKING_URI, the default),
    # never the recorded (masked) address.
    bundle = ["export", "exp", "--out", str(tmp_path / "bundle")]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(bundle) == 0
    assert "registered exp version 1" in capsys.readouterr().out
    assert files_naming(tmp_path, TOKEN) == []
