"""A copied or moved sqlite store is rebased onto where it is now, and only then."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from evolve.tracking.store_location import LOCATION_FILE, rebase_moved_store


def _store(directory: Path, root: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    db = directory / "mlflow.db"
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE experiments (artifact_location TEXT)")
        connection.execute("CREATE TABLE runs (artifact_uri TEXT)")
        connection.executemany(
            "INSERT INTO experiments VALUES (?)",
            [(f"{root}/0",), ((root / "artifacts").as_uri(),), ("s3://bucket/elsewhere",)],
        )
        connection.executemany(
            "INSERT INTO runs VALUES (?)",
            [((root / "artifacts" / "r1" / "artifacts").as_uri(),), ("/other/mlruns_x/r2",)],
        )
    return db


def _rows(db: Path) -> list[str]:
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT artifact_location FROM experiments").fetchall()
        rows += connection.execute("SELECT artifact_uri FROM runs").fetchall()
    return [row[0] for row in rows]


def test_a_store_in_place_is_left_alone_and_its_location_recorded(tmp_path):
    here = tmp_path / "project" / "mlruns"
    db = _store(here, here)
    before = _rows(db)
    assert rebase_moved_store(db) is None
    assert _rows(db) == before
    assert (here / LOCATION_FILE).read_text().strip() == str(here)


def test_a_moved_store_points_at_its_new_place(tmp_path):
    old = tmp_path / "old_%_place" / "mlruns"  # LIKE's wildcards in a path change nothing
    db = _store(old, old)
    assert rebase_moved_store(db) is None  # recorded where it is
    new = tmp_path / "new" / "mlruns"
    old.parent.rename(tmp_path / "new")
    note = rebase_moved_store(new / "mlflow.db")
    assert note is not None and str(old) in note and "3 artifact location(s)" in note
    assert _rows(new / "mlflow.db") == [
        f"{new}/0",
        (new / "artifacts").as_uri(),
        "s3://bucket/elsewhere",
        (new / "artifacts" / "r1" / "artifacts").as_uri(),
        "/other/mlruns_x/r2",
    ]
    assert rebase_moved_store(new / "mlflow.db") is None  # once


def test_a_store_from_before_the_record_is_judged_by_its_experiments(tmp_path):
    old = tmp_path / "old" / "mlruns"
    new = tmp_path / "new" / "mlruns"
    db = _store(new, old)  # made elsewhere, moved here, no record
    assert rebase_moved_store(db) is not None
    assert _rows(db)[1] == (new / "artifacts").as_uri()


def test_an_experiment_elsewhere_is_not_taken_for_the_stores_old_place(tmp_path):
    here = tmp_path / "project" / "mlruns"
    db = _store(here, tmp_path / "data")  # a user's experiment under /data/artifacts
    before = _rows(db)
    assert rebase_moved_store(db) is None
    assert _rows(db) == before
