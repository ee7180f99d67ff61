"""Optuna studies over a memory policy's numeric parameters — the public entry point.

`evolve tune SPEC.toml` (see `evolve.commands.tune`) runs `run_tuning`: trials evaluate the
policy on-policy on the train users with the trial's `update_every`, `short_term_len` and
`top_k`, report the running score after each period (pruning), and the best setting is
checked on the held-out users. The implementation lives in the `evolve.tuning` package:
`spec` (TOML specs), `samplers`, `storage`, `study` (the worker), `tracking` (MLflow),
`report` (tables) and `evolution` (Optuna inside the evolution loop).
"""

from evolve.tuning import *  # noqa: F403
from evolve.tuning import __all__  # noqa: F401
