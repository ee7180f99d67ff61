"""A project copied (`cp -a`) or moved (`mv`), its original deleted, still runs, exports and
loads its registered model, and nothing is written where the original was: the MLflow
store's absolute artifact locations are rebased onto where the store is now."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from reliability.process_helpers import cli_env, llm_flags, run_cli, write_tiny_spec
from stub_server import StubServer


def _evolve(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = run_cli(project, *args, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _locations(project: Path) -> list[str]:
    with sqlite3.connect(project / "mlruns" / "mlflow.db") as store:
        rows = store.execute("SELECT artifact_uri FROM runs").fetchall()
        rows += store.execute("SELECT artifact_location FROM experiments").fetchall()
        rows += store.execute("SELECT storage_location FROM model_versions").fetchall()
    return [row[0] for row in rows if row[0] and row[0].startswith(("file:", "/"))]


@pytest.mark.parametrize("how", ["copied", "moved"])
def test_a_relocated_project_writes_only_into_itself(tmp_path, how):
    original = tmp_path / "original"
    spec = write_tiny_spec(original, generations=1, tracking=True)
    with StubServer(latency=0.0) as stub:
        _evolve(original, "run", spec.name, "--no-progress", *llm_flags(stub))
        _evolve(original, "export", "tiny", "--out", "bundle")
        relocated = tmp_path / "relocated"
        if how == "copied":
            subprocess.run(["cp", "-a", str(original), str(relocated)], check=True)
            shutil.rmtree(original)
        else:
            original.rename(relocated)
        text = (relocated / spec.name).read_text(encoding="utf-8")
        (relocated / spec.name).write_text(text.replace("generations = 1", "generations = 2"))
        resumed = _evolve(relocated, "run", spec.name, "--no-progress", *llm_flags(stub))
        _evolve(relocated, "export", "tiny", "--out", "bundle-2", "--name", "tiny-2")
    assert not original.exists(), sorted(str(p) for p in original.rglob("*"))[:10]
    assert "copied or moved" in resumed.stderr
    locations = _locations(relocated)
    assert locations and all(str(relocated) in loc for loc in locations), "\n".join(locations)
    load = (
        "import mlflow; mlflow.set_tracking_uri('sqlite:///mlruns/mlflow.db'); "
        "mlflow.pyfunc.load_model('models:/tiny-2@champion')"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", load],
        cwd=relocated,
        # As a user's script would: the store named, nothing ambient.
        env={k: v for k, v in cli_env(relocated).items() if not k.startswith("MLFLOW_")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
