"""GEPA's pickled checkpoint is checked before GEPA unpickles it: a file that names any
class or function (the only way a pickle runs code) is refused in one line, and the code
never runs; a truncated or garbled file is refused the same way."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from evolve.core.errors import DamagedRunFileError
from evolve.optimize.gepa_checkpoint import GEPA_STATE_FILE, check_gepa_state


class _Payload:
    """What a hostile run directory could hold: unpickling it creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - pickle's protocol
        return (os.system, (f"touch {self.marker}",))


def _state(**extra: object) -> dict[str, object]:
    """A state like the one GEPA writes for this toolkit: builtins only."""
    return {
        "program_candidates": [{"use": "Answer from memory."}],
        "prog_candidate_val_subscores": [{"user-0": 0.5}],
        "per_program_tracked_scores": [0.5],
        "parent_program_for_candidate": [[None]],
        "pareto_front_valset": {"user-0": {0}},
        "i": 3,
        "total_num_evals": 4,
        "validation_schema_version": 4,
        "nothing": None,
        "pair": (1, 2.5),
        **extra,
    }


def test_a_state_of_builtins_passes(tmp_path: Path) -> None:
    (tmp_path / GEPA_STATE_FILE).write_bytes(pickle.dumps(_state()))
    check_gepa_state(tmp_path)
    check_gepa_state(tmp_path / "absent")  # nothing to check before GEPA's first save


def test_a_crafted_state_is_refused_and_its_code_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    (tmp_path / GEPA_STATE_FILE).write_bytes(pickle.dumps(_state(hook=_Payload(marker))))
    with pytest.raises(DamagedRunFileError) as refused:
        check_gepa_state(tmp_path)
    message = str(refused.value)
    assert "\n" not in message
    assert str(tmp_path / GEPA_STATE_FILE) in message
    assert "system" in message and "not resumed" in message
    assert not marker.exists()


def test_a_state_naming_a_harmless_class_is_refused_too(tmp_path: Path) -> None:
    from collections import OrderedDict

    (tmp_path / GEPA_STATE_FILE).write_bytes(pickle.dumps(OrderedDict(_state())))
    with pytest.raises(DamagedRunFileError, match="collections.OrderedDict"):
        check_gepa_state(tmp_path)


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],
        lambda data: b"\x00\xff{garbage" * 3,
        lambda data: b"",
        lambda data: pickle.dumps([1, 2, 3]),
    ],
    ids=["truncated", "garbled", "empty", "not-a-dict"],
)
def test_a_damaged_state_is_refused_in_one_line(tmp_path: Path, damage) -> None:
    (tmp_path / GEPA_STATE_FILE).write_bytes(damage(pickle.dumps(_state())))
    with pytest.raises(DamagedRunFileError) as refused:
        check_gepa_state(tmp_path)
    assert "\n" not in str(refused.value)
    assert GEPA_STATE_FILE in str(refused.value)


def test_every_recorded_gepa_state_is_builtins_only() -> None:
    """The states this toolkit's runs wrote (the committed records) pass the check: the
    check refuses nothing GEPA writes for us."""
    repo = Path(__file__).resolve().parents[2]
    states = sorted((repo / "benchmarks" / "records").rglob(GEPA_STATE_FILE))
    assert states, "no recorded GEPA state to check"
    for state in states:
        check_gepa_state(state.parent)
