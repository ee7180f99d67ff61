"""Renamed keys move to their new names with a warning; both names at once is an error."""

import warnings

import pytest

from memory_policies.deprecation import REMOVED_IN, RenamedWarning, rename_keys, warn_renamed


def test_old_key_moves_to_new_name_with_a_warning_naming_both():
    with pytest.warns(RenamedWarning, match=r"llm\.embedded\.model_preset .*model_size"):
        moved = rename_keys(
            {"model_preset": "0.5b", "x": 1}, {"model_preset": "model_size"}, where="llm.embedded"
        )
    assert moved == {"model_size": "0.5b", "x": 1}


def test_data_without_old_keys_is_returned_unchanged_and_silent():
    data = {"model_size": "0.5b"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rename_keys(data, {"model_preset": "model_size"}) is data
        assert rename_keys("not a table", {"model_preset": "model_size"}) == "not a table"


def test_old_and_new_key_together_is_refused():
    with pytest.raises(ValueError, match="both set"):
        rename_keys({"model_preset": "a", "model_size": "b"}, {"model_preset": "model_size"})


def test_the_warning_is_visible_to_users_by_default():
    # FutureWarning subclasses are shown outside __main__ under the default filters.
    assert issubclass(RenamedWarning, FutureWarning)
    with pytest.warns(RenamedWarning, match=f"removed in {REMOVED_IN}"):
        warn_renamed("--old", "--new")


def test_renamed_attributes_serve_old_names_with_a_warning_and_refuse_unknown_ones():
    from memory_policies.deprecation import renamed_attributes

    namespace = {"NewThing": object()}
    getattr_ = renamed_attributes("pkg.mod", {"OldThing": "NewThing"}, namespace)
    with pytest.warns(RenamedWarning, match=r"pkg\.mod\.OldThing .*pkg\.mod\.NewThing"):
        assert getattr_("OldThing") is namespace["NewThing"]
    with pytest.raises(AttributeError, match="no attribute 'Missing'"):
        getattr_("Missing")
