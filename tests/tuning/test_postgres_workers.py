"""A real PostgreSQL study shared by the main `evolve tune` and two `--worker` processes.

Needs a server: `.ci/run` starts one (`.ci/postgres.sh`) and sets EVOLVE_TEST_POSTGRES_URL
(`postgresql+psycopg://USER@127.0.0.1:PORT/DB`, the password in PGPASSWORD). Without the
variable the test skips with that reason; under CI=true a missing server fails instead.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from reliability.process_helpers import cli_env, llm_flags, write_small_environment
from stub_server import StubServer

POSTGRES_URL_ENV = "EVOLVE_TEST_POSTGRES_URL"
GRID = {"update_every": [2, 4, 8], "short_term_len": [0, 2]}
REQUESTED = 5  # of a 6-point grid: the last points are raced for


@pytest.fixture
def postgres_url() -> Iterator[str]:
    url = os.environ.get(POSTGRES_URL_ENV)
    if not url:
        reason = (
            f"{POSTGRES_URL_ENV} is not set: no PostgreSQL server to test against (.ci/run "
            "starts one with .ci/postgres.sh; or export postgresql+psycopg://USER@HOST/DB "
            "and PGPASSWORD)"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"under CI=true this test must run: {reason}")
        pytest.skip(reason)
    yield url


def _spec(directory: Path, url: str, study: str, tracking_uri: str) -> Path:
    write_small_environment(directory / "env.json")
    path = directory / "pg.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            name = "pg-tune"
            seed = 0
            concurrency = 2

            [environment]
            file = "env.json"
            train_users = 1
            heldout_users = 1

            [policy]
            kind = "in_context"
            parameters = {{ update_every = 2, short_term_len = 2 }}

            [tracking]
            tracking_uri = "{tracking_uri}"
            experiment_name = "pg-{study}"

            [tuning]
            sampler = "grid"
            trials = {REQUESTED}
            objectives = ["accuracy"]
            heldout = "best"
            storage = "{url}"
            study_name = "{study}"

            [tuning.parameters]
            update_every = {GRID["update_every"]}
            short_term_len = {GRID["short_term_len"]}

            [tuning.pruner]
            kind = "none"
            """
        ),
        encoding="utf-8",
    )
    return path


def _start(home: Path, spec: Path, stub: StubServer, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "evolve.cli", "tune", str(spec), "--no-progress"]
    command += [*llm_flags(stub), "--runs-dir", str(home / "runs")]
    command += ["--upper-bound-cache", str(home / "ub"), *extra]
    return subprocess.Popen(
        command,
        cwd=home,
        env=cli_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_main_and_two_workers_share_a_postgres_study(tmp_path, postgres_url):
    from evolve.tracking import PARENT_RUN_TAG, TAG_KIND, mlflow_client
    from evolve.tuning.tracking import KIND_TRIAL, KIND_TUNING, TAG_TRIAL

    study_name = f"ci-{uuid.uuid4().hex[:10]}"  # a fresh study in a shared database
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = _spec(tmp_path, postgres_url, study_name, tracking_uri)
    try:
        with StubServer(latency=0.02) as stub:
            # The main invocation first (it creates the MLflow parent run the workers join),
            # the workers right after: all three pop grid points from the same queue.
            processes = [_start(tmp_path, spec, stub)]
            processes += [_start(tmp_path, spec, stub, "--worker") for _ in range(2)]
            outputs = [p.communicate(timeout=600) for p in processes]
        codes = [p.returncode for p in processes]
        if codes != [0, 0, 0]:
            # pytest.fail prints its message whole (an assert's is cut), and the stderr of the
            # process that failed is the one that says why.
            names = ["main", "worker 1", "worker 2"]
            pytest.fail(
                "\n\n".join(
                    f"--- {name}: exit {code}\n{err[-4000:]}"
                    for name, code, (_, err) in zip(names, codes, outputs, strict=True)
                )
            )
        main_out = outputs[0][0]
        assert "held-out (best" in main_out, main_out

        study = optuna.load_study(study_name=study_name, storage=postgres_url)
        finished = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
        assert len(finished) == REQUESTED
        assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
        points = [tuple(sorted(t.params.items())) for t in finished]
        assert len(set(points)) == REQUESTED, f"a grid point was evaluated twice: {points}"

        client = mlflow_client(tracking_uri)
        experiment = client.get_experiment_by_name(f"pg-{study_name}")
        runs = client.search_runs([experiment.experiment_id], max_results=1000)
        parents = [r for r in runs if r.data.tags.get(TAG_KIND) == KIND_TUNING]
        assert len(parents) == 1, [r.data.tags for r in parents]
        parent_id = parents[0].info.run_id
        trials = [r for r in runs if r.data.tags.get(TAG_KIND) == KIND_TRIAL]
        assert all(r.data.tags.get(PARENT_RUN_TAG) == parent_id for r in trials)
        tracked = {int(r.data.tags[TAG_TRIAL]) for r in trials}
        assert {t.number for t in finished} <= tracked
    finally:
        with contextlib.suppress(KeyError):
            optuna.delete_study(study_name=study_name, storage=postgres_url)
