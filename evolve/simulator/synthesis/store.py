"""Old path of `evolve.simulator.synthesis.work_dir` (the LLM synthesis work directory;
`UserStore` is `UserUnitFiles`). Works with a `RenamedWarning` until
`memory_policies.deprecation.REMOVED_IN`."""

from __future__ import annotations

from typing import Any

import evolve.simulator.synthesis.work_dir as _new
from memory_policies.deprecation import warn_renamed

warn_renamed("evolve.simulator.synthesis.store", "evolve.simulator.synthesis.work_dir")

_RENAMED = {"UserStore": "UserUnitFiles"}


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        warn_renamed(
            f"evolve.simulator.synthesis.store.{name}",
            f"evolve.simulator.synthesis.work_dir.{_RENAMED[name]}",
        )
        return getattr(_new, _RENAMED[name])
    return getattr(_new, name)
