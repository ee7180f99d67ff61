"""The strict-warnings helper fails on what its block does, not on what an earlier test left."""

from __future__ import annotations

import gc
import sys
import warnings

import pytest
from strict_warnings import no_warnings


def _leak_an_open_file_in_a_cycle(path) -> None:
    """An open file only the cyclic collector can reach: finalized (with a ResourceWarning)
    whenever the next collection happens, as a test's unclosed pipe is."""
    holder: dict = {"file": open(path)}  # noqa: SIM115 - leaked on purpose
    holder["self"] = holder


def test_a_leak_from_before_the_block_is_not_its_failure(tmp_path, monkeypatch) -> None:
    (tmp_path / "f.txt").write_text("x")
    # A warning made an error inside a finalizer is "unraisable": pytest reports it after the
    # test, where it failed whichever strict test was running. Caught here to be checked.
    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    gc.disable()  # the leak must still be pending when the block starts
    try:
        _leak_an_open_file_in_a_cycle(tmp_path / "f.txt")
        with warnings.catch_warnings(record=True):  # the leak's warning, away from the report
            warnings.simplefilter("always")
            with no_warnings():
                gc.collect()  # a collection inside the block finds nothing of the earlier leak
    finally:
        gc.enable()
    assert unraisable == []


def test_a_warning_inside_the_block_is_an_error() -> None:
    with pytest.raises(DeprecationWarning), no_warnings():
        warnings.warn("old", DeprecationWarning, stacklevel=1)
