"""Old path of `evolve.optimize.experiment_dir` (the experiment directory `runs/<name>/`;
`ExperimentStore` is `ExperimentDir`). Works with a `RenamedWarning` until
`memory_policies.deprecation.REMOVED_IN`."""

import evolve.optimize.experiment_dir as _new
from memory_policies.deprecation import moved_module

__getattr__ = moved_module(__name__, _new, {"ExperimentStore": "ExperimentDir"})
