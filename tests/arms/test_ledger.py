"""The test-set ledger: a design scored on test users another design used gets a warning."""

from __future__ import annotations

from types import SimpleNamespace

from evolve.arms.ledger import LEDGER_FILE, record_test_sets


def _world(seed: int, users: list[str]) -> SimpleNamespace:
    return SimpleNamespace(
        seed=seed,
        experiment=SimpleNamespace(environment=SimpleNamespace(preset="recall_crafts")),
        test=SimpleNamespace(items=[SimpleNamespace(id=user) for user in users]),
    )


def test_reused_test_users_warn_and_fresh_ones_do_not(tmp_path) -> None:
    first = _world(401, ["u004-a", "u005-b"])
    assert record_test_sets(tmp_path, "crafts", "design-1", first) == []
    # The same design resuming: no warning.
    assert record_test_sets(tmp_path, "crafts", "design-1", first) == []
    # Another design on the same users: warned, and named.
    warnings = record_test_sets(tmp_path, "crafts-v2", "design-2", first)
    assert len(warnings) == 1 and "crafts (design-1)" in warnings[0] and "2 of 2" in warnings[0]
    # Another seed is a fresh test set.
    assert record_test_sets(tmp_path, "crafts-v2", "design-2", _world(402, ["u004-c"])) == []
    # Overlapping users of a wider test set are warned too.
    wider = _world(401, ["u004-a", "u005-b", "u006-d"])
    assert "2 of 3" in record_test_sets(tmp_path, "crafts-v3", "design-3", wider)[0]
    assert (tmp_path / LEDGER_FILE).is_file()
