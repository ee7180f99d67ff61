"""Deprecated module path: `evolve.tune` is now `evolve.tuning` (importing this warns).

Every name of `evolve.tuning` is available here, the old ones (`TuneSpec`, `load_tune_spec`,
`run_tuning`, ...) with their own warning.
"""

from typing import Any

from evolve import tuning as _tuning
from evolve.tuning import *  # noqa: F403
from evolve.tuning import __all__  # noqa: F401
from memory_policies.deprecation import warn_renamed

warn_renamed("evolve.tune", "evolve.tuning")


def __getattr__(name: str) -> Any:
    return getattr(_tuning, name)
