"""LLM endpoints per role, the embedded llama.cpp server and usage accounting."""

from evolve.llm.config import (
    ROLES,
    EmbeddedModelConfig,
    EndpointConfig,
    LLMConfig,
    Role,
    protocol_llm_config,
)
from evolve.llm.roles import RoleLMs, build_lm, open_role_lms
from evolve.llm.server import EmbeddedServer
from evolve.llm.usage import Usage, UsageSummary, UsageTracker

__all__ = [
    "ROLES",
    "EmbeddedModelConfig",
    "EmbeddedServer",
    "EndpointConfig",
    "LLMConfig",
    "Role",
    "RoleLMs",
    "Usage",
    "UsageSummary",
    "UsageTracker",
    "build_lm",
    "open_role_lms",
    "protocol_llm_config",
]
