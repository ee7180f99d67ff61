"""Old path of `evolve.simulator.synthesis.work_dir` (the LLM synthesis work directory;
`UserStore` is `UserUnitFiles`). Works with a `RenamedWarning` until
`memory_policies.deprecation.REMOVED_IN`."""

import evolve.simulator.synthesis.work_dir as _new
from memory_policies.deprecation import moved_module

__getattr__ = moved_module(__name__, _new, {"UserStore": "UserUnitFiles"})
