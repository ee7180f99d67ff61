"""AMemGym simulator: environments, their synthesis, the simulated user, on-policy episodes,
baselines, metrics and diagnosis. Returns data, reports progress through callbacks, never
prints, and never imports optimize / tuning / tracking / commands.

The names below are the public surface. They are loaded on first use (PEP 562), so importing
one submodule (e.g. `evolve.simulator.environment` for `evolve env validate`) does not load
the episode runner, DSPy or the LLM synthesis pipeline.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public name -> the submodule defining it.
_EXPORTS: dict[str, str] = {
    # environments (the original data.json model)
    "Environment": "environment",
    "EnvironmentItem": "environment",
    "InconsistentEnvironmentError": "environment",
    "load_environment": "environment",
    "save_environment": "environment",
    # synthesis (offline and LLM); full API in evolve.simulator.synthesis
    "PRESETS": "synthesis",
    "LLMSynthesisConfig": "synthesis",
    "OfflineSynthesisConfig": "synthesis",
    "get_preset": "synthesis",
    "synthesize_environment": "synthesis",
    "synthesize_environment_llm": "synthesis",
    # episodes
    "EpisodeConfig": "evaluation",
    "EvaluationReport": "evaluation",
    "ProgressSink": "evaluation",
    "run_evaluation": "evaluation",
    "SimulatedUser": "user",
    # results, metrics, baselines
    "Diagnosis": "records",
    "PeriodResult": "records",
    "UserResult": "records",
    "MetricSummary": "metrics",
    "summarize_periods": "metrics",
    "UpperBoundTable": "upper_bound_table",
    "compute_upper_bound": "baselines",
    "RunLayout": "run_dir",
}

# Written out (not sorted(_EXPORTS)) so that linters and IDEs can read it.
__all__ = [
    "Diagnosis",
    "Environment",
    "EnvironmentItem",
    "EpisodeConfig",
    "EvaluationReport",
    "InconsistentEnvironmentError",
    "LLMSynthesisConfig",
    "MetricSummary",
    "OfflineSynthesisConfig",
    "PRESETS",
    "PeriodResult",
    "ProgressSink",
    "RunLayout",
    "SimulatedUser",
    "UpperBoundTable",
    "UserResult",
    "compute_upper_bound",
    "get_preset",
    "load_environment",
    "run_evaluation",
    "save_environment",
    "summarize_periods",
    "synthesize_environment",
    "synthesize_environment_llm",
]

if TYPE_CHECKING:
    from evolve.simulator.baselines import compute_upper_bound
    from evolve.simulator.environment import (
        Environment,
        EnvironmentItem,
        InconsistentEnvironmentError,
        load_environment,
        save_environment,
    )
    from evolve.simulator.evaluation import (
        EpisodeConfig,
        EvaluationReport,
        ProgressSink,
        run_evaluation,
    )
    from evolve.simulator.metrics import MetricSummary, summarize_periods
    from evolve.simulator.records import Diagnosis, PeriodResult, UserResult
    from evolve.simulator.run_dir import RunLayout
    from evolve.simulator.synthesis import (
        PRESETS,
        LLMSynthesisConfig,
        OfflineSynthesisConfig,
        get_preset,
        synthesize_environment,
        synthesize_environment_llm,
    )
    from evolve.simulator.upper_bound_table import UpperBoundTable
    from evolve.simulator.user import SimulatedUser


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'evolve.simulator' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"evolve.simulator.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
