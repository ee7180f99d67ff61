"""LLM-driven environment generation following the AMemGym paper's pipeline.

Persona -> profile -> questions -> schema -> initial state -> per-period updates and events
-> personalized answers (classifier-checked) -> opening queries (classifier-checked), each
stage validated, resumable and accounted in tokens. Produces the same `Environment` type as
the offline generator. See README.md in this directory.
"""

from evolve.simulator.generate.config import (
    LLMGenerationConfig,
    Prices,
    RetryBudget,
    generation_config_from_dict,
    load_generation_config,
)
from evolve.simulator.generate.personas import (
    PersonaRecord,
    catalog_personas,
    load_nemotron_personas,
)
from evolve.simulator.generate.pipeline import (
    GenerationCancelled,
    GenerationResult,
    ProgressEvent,
    StageFailure,
    UserPipeline,
    generate_environment_llm,
)
from evolve.simulator.generate.report import GenerationReport, Stage, StageUsage, UserOutcome

__all__ = [
    "GenerationCancelled",
    "GenerationReport",
    "GenerationResult",
    "LLMGenerationConfig",
    "PersonaRecord",
    "Prices",
    "ProgressEvent",
    "RetryBudget",
    "Stage",
    "StageFailure",
    "StageUsage",
    "UserOutcome",
    "UserPipeline",
    "catalog_personas",
    "generate_environment_llm",
    "generation_config_from_dict",
    "load_generation_config",
    "load_nemotron_personas",
]
