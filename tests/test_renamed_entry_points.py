"""Spec and entry-point names renamed so that each has one meaning; the old ones still work,
with a `RenamedWarning`, and the new ones are silent.

- a tuning study's spec file: `TuneSpec` -> `StudySpec` (the `[tuning]` table stays
  `TuningSpec`), with its readers `load_tune_spec` -> `load_study_spec`,
  `tune_spec_from_dict` -> `study_spec_from_dict`, `is_tuning_spec` -> `is_study_spec`;
- the module `evolve.tune` -> `evolve.tuning` (`evolve tune`, the command, stays);
- the inner loops that take open LMs: `evolve.optimize.run_experiment` -> `evolve_policy` and
  `evolve.tuning.run_tuning` -> `run_study`; `evolve.api.run_experiment` and
  `evolve.api.run_tuning` keep their names (they open the LMs from the spec).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
from fresh_import import import_fresh

import evolve.api
import evolve.optimize
import evolve.optimize.loop
import evolve.tuning
import evolve.tuning.spec
import evolve.tuning.study
from memory_policies.deprecation import RenamedWarning

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "tune_quick.toml"

# (module, old name, new name)
RENAMED = [
    (evolve.tuning, "TuneSpec", "StudySpec"),
    (evolve.tuning, "load_tune_spec", "load_study_spec"),
    (evolve.tuning, "tune_spec_from_dict", "study_spec_from_dict"),
    (evolve.tuning, "run_tuning", "run_study"),
    (evolve.tuning.spec, "TuneSpec", "StudySpec"),
    (evolve.tuning.spec, "load_tune_spec", "load_study_spec"),
    (evolve.tuning.spec, "tune_spec_from_dict", "study_spec_from_dict"),
    (evolve.tuning.spec, "is_tuning_spec", "is_study_spec"),
    (evolve.tuning.study, "run_tuning", "run_study"),
    (evolve.api, "load_tune_spec", "load_study_spec"),
    (evolve.optimize, "run_experiment", "evolve_policy"),
    (evolve.optimize.loop, "run_experiment", "evolve_policy"),
]


@pytest.mark.parametrize(
    ("module", "old", "new"), RENAMED, ids=[f"{m.__name__}.{old}" for m, old, _ in RENAMED]
)
def test_an_old_name_warns_and_is_the_new_one(module, old, new):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        current = getattr(module, new)  # the new name: silent
    with pytest.warns(RenamedWarning, match=rf"{module.__name__}\.{old} .* use .*\.{new}"):
        assert getattr(module, old) is current


def test_old_names_import_with_from_and_unknown_names_still_fail():
    with pytest.warns(RenamedWarning, match="TuneSpec"):
        from evolve.tuning import TuneSpec
    assert TuneSpec is evolve.tuning.StudySpec
    with pytest.raises(AttributeError, match="no_such_name"):
        evolve.tuning.no_such_name  # noqa: B018
    with pytest.raises(AttributeError, match="no_such_name"):
        evolve.optimize.no_such_name  # noqa: B018


def test_a_spec_read_through_the_old_names_is_the_same_study_spec():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = evolve.tuning.load_study_spec(QUICK)
        assert evolve.tuning.spec.is_study_spec(QUICK)
    with pytest.warns(RenamedWarning):
        old = evolve.api.load_tune_spec(QUICK)
    with pytest.warns(RenamedWarning):
        assert isinstance(old, evolve.tuning.TuneSpec)
    assert old == spec


def test_the_old_module_evolve_tune_warns_and_mirrors_evolve_tuning():
    with pytest.warns(RenamedWarning, match=r"evolve\.tune is deprecated.*use evolve\.tuning"):
        tune = import_fresh("evolve.tune")
    assert tune.__all__ == evolve.tuning.__all__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in evolve.tuning.__all__:
            assert getattr(tune, name) is getattr(evolve.tuning, name)
    # Old names of the package work through the old module too, still warning.
    with pytest.warns(RenamedWarning, match="run_tuning"):
        assert tune.run_tuning is evolve.tuning.run_study


# `evolve.tune` is only the shim: nothing of ours imports it (an import would warn).
_OLD_MODULE = re.compile(r"(from|import)\s+evolve\.tune\b(?!\w)|from\s+evolve\s+import\s+tune\b")


def test_nothing_imports_the_old_module():
    places = [ROOT / "evolve", ROOT / "tests", ROOT / "benchmarks", ROOT / "examples"]
    here = Path(__file__).resolve()
    shim = ROOT / "evolve" / "tune.py"
    found = [
        str(path.relative_to(ROOT))
        for place in places
        for path in place.rglob("*.py")
        if path.resolve() not in (here, shim)
        and _OLD_MODULE.search(path.read_text(encoding="utf-8"))
    ]
    docs = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    found += [str(p.relative_to(ROOT)) for p in docs if "evolve.tune." in p.read_text("utf-8")]
    assert not found, f"use evolve.tuning, not evolve.tune, in: {found}"
