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
from memory_policies.deprecation import renamed_attributes

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


__getattr__ = renamed_attributes(__name__, {"RoleUsage": "Usage"}, globals())
