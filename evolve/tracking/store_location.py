"""A sqlite MLflow store that was copied or moved points at its own artifacts again.

MLflow records absolute artifact locations in a sqlite store: each experiment's
`artifact_location`, each run's `artifact_uri`, each logged model's and model version's
storage location (`file:///<store dir>/artifacts/...`). Copy or move a project and the store
still points at the old directory: a copy writes its new artifacts into the original (and
breaks once the original is deleted), a move recreates the old path.

So the store's directory is recorded beside it (`.evolve-store-location`), and every open
compares it with where the store is now. When they differ, every location under the old
directory is rebased onto the new one, in one transaction, with a one-line note; a copy
(`cp -a`) carries its artifacts along, so the copy then reads and writes only its own. A
store without the record (made before it existed) is judged by its evolve experiments, whose
artifacts evolve always puts in `<store dir>/artifacts`.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from urllib.parse import unquote, urlparse

from evolve.core.files import atomic_write_text

LOCATION_FILE = ".evolve-store-location"

# Where MLflow (3.x) keeps absolute artifact locations in a sqlite store.
LOCATION_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "storage_location"),
    ("model_versions", "source"),
)


def rebase_moved_store(db_path: Path) -> str | None:
    """Rebase the store at `db_path` if it was copied or moved (call with the store's
    creation lock held); a note saying so, else None."""
    here = db_path.resolve().parent
    record = here / LOCATION_FILE
    recorded = record.read_text(encoding="utf-8").strip() if record.is_file() else None
    with sqlite3.connect(db_path) as connection:
        old = Path(recorded) if recorded else _inferred_location(connection, here)
        moved = 0
        if old is not None and old != here:
            moved = _rebase(connection, old, here)
    if recorded != str(here):
        # A read-only store directory cannot keep the record: it is judged again next time.
        with contextlib.suppress(OSError):
            atomic_write_text(record, f"{here}\n")
    if not moved or old is None:
        return None
    return (
        f"the MLflow store {db_path} was copied or moved from {old}: {moved} artifact "
        f"location(s) now point under {here}"
    )


def _inferred_location(connection: sqlite3.Connection, here: Path) -> Path | None:
    """For a store with no record: the directory its evolve experiments' artifacts were
    put in (`<store dir>/artifacts`), when that is not here."""
    if not _has_column(connection, "experiments", "artifact_location"):
        return None
    for (location,) in connection.execute("SELECT artifact_location FROM experiments"):
        path = _as_path(location or "")
        # Only a store directory of the same name (mlruns/ moved with its project): an
        # experiment a user put in some other `.../artifacts` must not be taken for ours.
        ours = path is not None and path.name == "artifacts" and path.parent.name == here.name
        if ours and path.parent != here:
            return path.parent
    return None


def _rebase(connection: sqlite3.Connection, old: Path, new: Path) -> int:
    """Rewrite every location under `old` (as a file URI or a plain path) to `new`."""
    changed = 0
    prefixes = [(old.as_uri(), new.as_uri()), (str(old), str(new))]
    for table, column in LOCATION_COLUMNS:
        if not _has_column(connection, table, column):
            continue
        for before, after in prefixes:
            # substr, not LIKE: a path may hold LIKE's wildcards (_ and %).
            cursor = connection.execute(
                f'UPDATE "{table}" SET "{column}" = ? || substr("{column}", ?) '  # noqa: S608
                f'WHERE substr("{column}", 1, ?) = ? OR "{column}" = ?',
                (after, len(before) + 1, len(before) + 1, before + "/", before),
            )
            changed += cursor.rowcount
    return changed


def _has_column(connection: sqlite3.Connection, table: str, column: str) -> bool:
    rows = connection.execute(f'PRAGMA table_info("{table}")').fetchall()
    return any(row[1] == column for row in rows)


def _as_path(location: str) -> Path | None:
    if location.startswith("file:"):
        return Path(unquote(urlparse(location).path))
    return Path(location) if location.startswith("/") else None
