"""The episode runner's public names (the modules live in `evolve.simulator.run`).

Kept so that ``from evolve.simulator.runner import run_evaluation, EpisodeConfig, ...`` goes on
working; new code may import from the room that holds a name.
"""

from __future__ import annotations

from evolve.simulator.run.context import (
    PolicySchedule,
    ProgressSink,
    RunContext,
    RunOptions,
    UnitFiles,
    UserRun,
)
from evolve.simulator.run.episode import EpisodeConfig, ProbeScope, probe_scope_problem
from evolve.simulator.run.identity import check_resumable, resolved_config, run_identity
from evolve.simulator.run.probes import (
    PROBE_STRATEGIES,
    QUESTION_HINT,
    last_update_period,
    parse_recalled_values,
    probe_question,
    required_variables,
    structured_probe_prompt,
)
from evolve.simulator.run.replay import load_recorded_sessions, recorded_sessions_path
from evolve.simulator.run.scheduler import EvaluationReport, load_report, run_evaluation
from evolve.simulator.run.unit import run_unit

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
