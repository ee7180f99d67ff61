"""Old path of `evolve.optimize.experiment_dir` (the experiment directory `runs/<name>/`;
`ExperimentStore` is `ExperimentDir`). Works with a `RenamedWarning` until
`memory_policies.deprecation.REMOVED_IN`."""

from __future__ import annotations

from typing import Any

import evolve.optimize.experiment_dir as _new
from memory_policies.deprecation import warn_renamed

warn_renamed("evolve.optimize.store", "evolve.optimize.experiment_dir")

_RENAMED = {"ExperimentStore": "ExperimentDir"}


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        warn_renamed(
            f"evolve.optimize.store.{name}", f"evolve.optimize.experiment_dir.{_RENAMED[name]}"
        )
        return getattr(_new, _RENAMED[name])
    return getattr(_new, name)
