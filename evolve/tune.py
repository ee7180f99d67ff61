"""Deprecated module path: `evolve.tune` is now `evolve.tuning` (importing this warns).

Every name of `evolve.tuning` is available here, the old ones (`TuneSpec`, `load_tune_spec`,
`run_tuning`, ...) with their own warning.
"""

from evolve import tuning as _new
from evolve.tuning import *  # noqa: F403  (`from evolve.tune import *` keeps working)
from evolve.tuning import __all__  # noqa: F401
from memory_policies.deprecation import moved_module

__getattr__ = moved_module(__name__, _new)
