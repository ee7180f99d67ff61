"""LLM endpoints per role, the embedded llama.cpp server and usage accounting."""

from evolve.llm.config import (
    ROLES,
    EmbeddedModelConfig,
    EndpointConfig,
    LLMConfig,
    Role,
    add_llm_arguments,
    llm_config_from_args,
    protocol_llm_config,
)
from evolve.llm.roles import RoleLMs, build_lm, open_role_lms, open_role_lms_from_args
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
    "add_llm_arguments",
    "build_lm",
    "llm_config_from_args",
    "open_role_lms",
    "open_role_lms_from_args",
    "protocol_llm_config",
]
