"""Environment synthesis: building AMemGym environments (the original `data.json` model).

Two ways, one `Environment` type:
- offline (`offline.py`): seeded sampling over the built-in catalog, no LLM, byte-identical
  for the same preset, seed and user count;
- LLM (`pipeline.py`, the paper's pipeline): persona -> profile -> questions -> schema ->
  initial state -> per-period updates and events -> personalized answers (classifier-checked)
  -> opening queries (classifier-checked), each stage validated, resumable and accounted in
  tokens. docs/environments.md ("LLM-synthesized environments") documents it.
"""

from evolve.simulator.synthesis.catalogs import Catalog, load_catalog
from evolve.simulator.synthesis.config import (
    LLMSynthesisConfig,
    Prices,
    RetryBudget,
    load_synthesis_config,
    synthesis_config_from_dict,
)
from evolve.simulator.synthesis.offline import synthesize_environment, synthesize_user
from evolve.simulator.synthesis.personas import (
    PersonaRecord,
    catalog_personas,
    load_nemotron_personas,
)
from evolve.simulator.synthesis.pipeline import (
    ProgressEvent,
    StageFailure,
    SynthesisCancelled,
    SynthesisResult,
    UserPipeline,
    synthesize_environment_llm,
)
from evolve.simulator.synthesis.presets import PRESETS, OfflineSynthesisConfig, get_preset
from evolve.simulator.synthesis.report import Stage, SynthesisReport, UserOutcome

__all__ = [
    "PRESETS",
    "Catalog",
    "LLMSynthesisConfig",
    "OfflineSynthesisConfig",
    "PersonaRecord",
    "Prices",
    "ProgressEvent",
    "RetryBudget",
    "Stage",
    "StageFailure",
    "SynthesisCancelled",
    "SynthesisReport",
    "SynthesisResult",
    "UserOutcome",
    "UserPipeline",
    "catalog_personas",
    "get_preset",
    "load_catalog",
    "load_nemotron_personas",
    "load_synthesis_config",
    "synthesis_config_from_dict",
    "synthesize_environment",
    "synthesize_environment_llm",
    "synthesize_user",
]
