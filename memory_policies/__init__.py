"""Memory policies for LLM assistants, as DSPy programs with explicit, serializable state.

Needs only `dspy` (and numpy; sentence-transformers for the default local embedder).
"""

from memory_policies.base import BUNDLE_FILE, BUNDLE_FORMAT_VERSION, MemoryPolicy
from memory_policies.embed import (
    Embedder,
    HashingEmbedder,
    LocalMiniLMEmbedder,
    OpenAIEmbedder,
    default_embedder,
    embedder_from_config,
)
from memory_policies.errors import PolicyError
from memory_policies.external import ExternalPolicy, ExternalState
from memory_policies.in_context import (
    InContextOraclePolicy,
    InContextOracleState,
    InContextPolicy,
    InContextState,
)
from memory_policies.in_context_quotes import InContextQuotesPolicy
from memory_policies.mem0_system import Mem0Policy
from memory_policies.memory_system import MemorySystem, MemorySystemPolicy, MemorySystemState
from memory_policies.messages import MemoryState, Message, PolicyAnswer
from memory_policies.native import NativePolicy, NativeState
from memory_policies.parameters import ParameterRule
from memory_policies.raw_rag import RawRagPolicy, RawRagState
from memory_policies.registry import (
    POLICY_KINDS,
    build_policy,
    create_policy,
    load,
    parse_spec,
    read_bundle,
    register_policy,
)
from memory_policies.variants import DEFAULT_VARIANT, VARIANTS, Variant

__all__ = [
    "BUNDLE_FILE",
    "BUNDLE_FORMAT_VERSION",
    "DEFAULT_VARIANT",
    "POLICY_KINDS",
    "Embedder",
    "ExternalPolicy",
    "ExternalState",
    "HashingEmbedder",
    "InContextOraclePolicy",
    "InContextQuotesPolicy",
    "InContextOracleState",
    "InContextPolicy",
    "InContextState",
    "LocalMiniLMEmbedder",
    "Mem0Policy",
    "MemoryPolicy",
    "MemoryState",
    "MemorySystem",
    "MemorySystemPolicy",
    "MemorySystemState",
    "Message",
    "NativePolicy",
    "NativeState",
    "OpenAIEmbedder",
    "ParameterRule",
    "PolicyAnswer",
    "PolicyError",
    "RawRagPolicy",
    "RawRagState",
    "VARIANTS",
    "Variant",
    "build_policy",
    "create_policy",
    "default_embedder",
    "embedder_from_config",
    "load",
    "parse_spec",
    "read_bundle",
    "register_policy",
]
