"""Old path of `evolve.simulator.run_dir` (the evaluation run directory). Works with a
`RenamedWarning` until `memory_policies.deprecation.REMOVED_IN`."""

import evolve.simulator.run_dir as _new
from memory_policies.deprecation import moved_module

__getattr__ = moved_module(__name__, _new)
