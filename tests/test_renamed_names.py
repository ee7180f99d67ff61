"""Renamed `evolve` modules and names keep working, with a `RenamedWarning`, until
`memory_policies.deprecation.REMOVED_IN`; the new names work silently.

"store" now means only a policy's memory store (and MLflow's tracking store): our own folders
are directories, and what reads or writes units there is named for its files.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from fresh_import import import_fresh

from memory_policies.deprecation import RenamedWarning


@pytest.mark.parametrize(
    ("old", "new", "names"),
    [
        (
            "evolve.optimize.store",
            "evolve.optimize.experiment_dir",
            ["ExperimentDir", "experiment_dir_for"],
        ),
        ("evolve.simulator.storage", "evolve.simulator.run_dir", ["RunLayout", "read_json"]),
        ("evolve.simulator.synthesis.store", "evolve.simulator.synthesis.work_dir", ["WorkDir"]),
    ],
)
def test_an_old_module_path_warns_and_reexports(old: str, new: str, names: list[str]) -> None:
    module = importlib.import_module(new)
    with pytest.warns(RenamedWarning, match=rf"{old} .*{new}"):
        shim = import_fresh(old)
    for name in names:
        assert getattr(shim, name) is getattr(module, name)
    with pytest.raises(AttributeError):
        shim.NoSuchName  # noqa: B018


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("evolve.optimize", "ExperimentStore", "ExperimentDir"),
        ("evolve.optimize.experiment_dir", "ExperimentStore", "ExperimentDir"),
        ("evolve.simulator.runner", "UnitStore", "UnitFiles"),
        ("evolve.simulator.run.context", "UnitStore", "UnitFiles"),
        ("evolve.tuning.study", "TuningStore", "TuningDir"),
        ("evolve.tuning.layout", "TuningStore", "TuningDir"),
        ("evolve.commands.env_llm", "run_llm_generate", "run_llm_synthesize"),
        ("evolve.commands.env_llm", "add_llm_generate_arguments", "add_llm_synthesize_arguments"),
    ],
)
def test_an_old_name_warns_and_is_the_new_one(module: str, old: str, new: str) -> None:
    home = importlib.import_module(module)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RenamedWarning)
        renamed = getattr(home, new)  # the new name: no warning
    with pytest.warns(RenamedWarning, match=rf"{module}\.{old} .*{module}\.{new}"):
        assert getattr(home, old) is renamed
    with pytest.raises(AttributeError):
        getattr(home, "NoSuchName")  # noqa: B009


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("evolve.optimize.store", "evolve.optimize.experiment_dir", "ExperimentStore"),
        ("evolve.simulator.synthesis.store", "evolve.simulator.synthesis.work_dir", "UserStore"),
    ],
)
def test_an_old_class_name_under_its_old_module_path_warns(old: str, new: str, name: str) -> None:
    with pytest.warns(RenamedWarning):
        shim = import_fresh(old)
    with pytest.warns(RenamedWarning, match=rf"{old}\.{name} "):
        cls = getattr(shim, name)
    assert cls.__module__ == new


def test_the_new_modules_import_silently() -> None:
    code = (
        "import warnings\n"
        "warnings.simplefilter('error', FutureWarning)\n"
        "import evolve.optimize.experiment_dir, evolve.simulator.run_dir\n"
        "import evolve.simulator.synthesis.work_dir, memory_policies.embedding_store\n"
        "import memory_policies.memory_system, evolve.simulator.runner, evolve.tuning.study\n"
        "import evolve.optimize, evolve.commands.env\n"
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, env=env
    )
    assert done.returncode == 0, done.stderr
