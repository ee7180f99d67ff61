"""The evaluation package: the episode runner, in rooms (each module says what it holds):

- `episode`: `EpisodeConfig`, how episodes are played;
- `context`: `RunOptions`, `RunContext`, `UnitFiles`, `ProgressSink`, `PolicySchedule`;
- `identity`: what the results depend on (the resume guard);
- `scheduler`: `run_evaluation`, which units run when, period barriers, the report;
- `unit`: one user in one period (sessions, checkpoint, questions, probes);
- `replay`: off-policy replay of recorded transcripts;
- `probes`: questions, the protocol's probe strategies, per-item results.

`evolve.simulator.runner` re-exports the public names.
"""
