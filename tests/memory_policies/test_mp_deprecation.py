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


def test_a_renamed_attribute_can_live_in_another_module():
    from memory_policies.deprecation import renamed_attributes
    from memory_policies.variants import VariantRules

    getattr_ = renamed_attributes("pkg.mod", {"Old": "memory_policies.variants:VariantRules"}, {})
    with pytest.warns(RenamedWarning, match=r"pkg\.mod\.Old .*memory_policies\.variants\.Var"):
        assert getattr_("Old") is VariantRules


def test_a_moved_module_warns_at_the_importing_line_and_serves_the_new_modules_names(tmp_path):
    """The warning names the file that imported the old path (where the user edits), and the
    shim serves every name of the new module plus its own renamed ones."""
    import importlib
    import sys

    (tmp_path / "old_home.py").write_text(
        "import memory_policies.variants as _new\n"
        "from memory_policies.deprecation import moved_module\n"
        "__getattr__ = moved_module(__name__, _new, {'OldRules': 'VariantRules'})\n"
    )
    (tmp_path / "user_code.py").write_text("import old_home\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.warns(RenamedWarning, match=r"old_home .*memory_policies\.variants") as seen:
            importlib.import_module("user_code")
        assert [w.filename for w in seen] == [str(tmp_path / "user_code.py")]
        old_home = sys.modules["old_home"]
        from memory_policies import variants

        assert old_home.variant_rules is variants.variant_rules  # silent: same name
        with pytest.warns(RenamedWarning, match=r"old_home\.OldRules .*variants\.VariantRules"):
            assert old_home.OldRules is variants.VariantRules
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("old_home", "user_code"):
            sys.modules.pop(name, None)
