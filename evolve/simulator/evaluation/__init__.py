"""The evaluation package: the episode runner, in rooms (each module says what it holds):

- `episode`: `EpisodeConfig`, how episodes are played;
- `context`: `RunOptions`, `RunContext`, `UnitFiles`, `ProgressSink`, `PolicySchedule`;
- `identity`: what the results depend on (the resume guard);
- `scheduler`: `run_evaluation`, which units run when, period barriers, the report;
- `unit`: one user in one period (sessions, checkpoint, questions, probes);
- `replay`: off-policy replay of recorded transcripts;
- `probes`: questions, the protocol's probe strategies, per-item results.

This package is the evaluation's one public face: import its names from here
(`from evolve.simulator.evaluation import run_evaluation, EpisodeConfig`).
"""

from __future__ import annotations

from evolve.simulator.evaluation.context import (
    PolicySchedule,
    ProgressSink,
    RunContext,
    RunOptions,
    UnitFiles,
    UserRun,
)
from evolve.simulator.evaluation.episode import EpisodeConfig, ProbeScope, probe_scope_problem
from evolve.simulator.evaluation.identity import check_resumable, resolved_config, run_identity
from evolve.simulator.evaluation.probes import (
    PROBE_STRATEGIES,
    QUESTION_HINT,
    last_update_period,
    parse_recalled_values,
    probe_question,
    required_variables,
    structured_probe_prompt,
)
from evolve.simulator.evaluation.replay import load_recorded_sessions, recorded_sessions_path
from evolve.simulator.evaluation.scheduler import EvaluationReport, load_report, run_evaluation
from evolve.simulator.evaluation.unit import run_unit

__all__ = [
    "PROBE_STRATEGIES",
    "QUESTION_HINT",
    "EpisodeConfig",
    "EvaluationReport",
    "PolicySchedule",
    "ProbeScope",
    "ProgressSink",
    "RunContext",
    "RunOptions",
    "UnitFiles",
    "UserRun",
    "check_resumable",
    "last_update_period",
    "load_recorded_sessions",
    "load_report",
    "parse_recalled_values",
    "probe_question",
    "probe_scope_problem",
    "recorded_sessions_path",
    "required_variables",
    "resolved_config",
    "run_evaluation",
    "run_identity",
    "run_unit",
    "structured_probe_prompt",
]
