"""Old path of `evolve.simulator.run_dir` (the evaluation run directory). Works with a
`RenamedWarning` until `memory_policies.deprecation.REMOVED_IN`."""

from __future__ import annotations

from typing import Any

import evolve.simulator.run_dir as _new
from memory_policies.deprecation import warn_renamed

warn_renamed("evolve.simulator.storage", "evolve.simulator.run_dir")


def __getattr__(name: str) -> Any:
    return getattr(_new, name)
