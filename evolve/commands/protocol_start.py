"""What every run prints about its protocol before the first LLM call.

Always: which model serves which role, and the embedder when a policy embeds. Under
`protocol = "paper"` (where a weaker simulated user or another embedder than the paper's is
then visible in the run's first line): the completion limits in use (the reference's 8192
unless the user set one) and the kept rows of the deviation table
(`evolve.spec.paper_deviations`), one line each, so that nobody reads a paper run's numbers without
seeing where it differs from the reference code. Under `evolve`: nothing more (its
differences are the protocol itself).

`check_embedder` refuses a paper run of a policy that embeds (AWE, RAG) when
$MEMORY_POLICIES_EMBEDDER names no embedder: the default local MiniLM is not the paper's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TextIO

from evolve.core.errors import ConfigError
from evolve.core.protocol import rules_for
from evolve.llm import RoleLMs
from evolve.spec.paper_deviations import start_lines
from memory_policies.embed import EMBEDDER_ENV, default_embedder


def check_embedder(protocol: str, embeds: Iterable[bool]) -> None:
    """Refuse a run of a protocol that wants the embedder named, when one of its policies
    embeds (`embeds`: per policy, its `uses_embedder`) and $MEMORY_POLICIES_EMBEDDER is unset."""
    if not rules_for(protocol).requires_named_embedder or not any(embeds):
        return
    if os.environ.get(EMBEDDER_ENV, "").strip():
        return
    raise ConfigError(
        f"protocol {protocol}: an embedding policy (AWE external, RAG raw_rag) needs its "
        f"embedder named, but ${EMBEDDER_ENV} is unset; set {EMBEDDER_ENV}="
        "openai:text-embedding-3-small (the paper's; MEMORY_POLICIES_EMBEDDING_BASE_URL for "
        f"another endpoint), or {EMBEDDER_ENV}=minilm to accept the local model's numbers"
    )


def models_line(protocol: str, lms: RoleLMs, roles: tuple[str, ...], embeds: bool) -> str:
    """Which model serves which role, and the embedder if a policy embeds, e.g. `protocol
    evolve: models simulator, agent, reflector qwen2.5-coder-1.5b-instruct@llama-server-4slots
    (embedded llama.cpp)`."""
    served: dict[str, list[str]] = {}
    for role in roles:
        identity = lms.identity(role)
        where = "embedded llama.cpp" if identity.get("endpoint") == "embedded" else "endpoint"
        served.setdefault(f"{identity.get('model')} ({where})", []).append(role)
    models = "; ".join(f"{', '.join(r)} {model}" for model, r in served.items())
    embedder = f"; embedder {default_embedder().name}" if embeds else ""
    return f"protocol {protocol}: models {models}{embedder}"


def protocol_start_lines(
    protocol: str, lms: RoleLMs, roles: tuple[str, ...], embeds: bool = False
) -> list[str]:
    """The lines a run of `protocol` prints at its start; `roles`: those the run calls;
    `embeds`: whether a policy of the run embeds (the embedder is then named)."""
    rules = rules_for(protocol)
    lines: list[str] = [models_line(protocol, lms, roles, embeds)]
    if rules.default_max_tokens is not None:
        limits = ", ".join(f"{role} {lms.identity(role).get('max_tokens')}" for role in roles)
        lines.append(
            f"protocol {protocol}: max_tokens {limits} (the reference's "
            f"{rules.default_max_tokens} where neither [llm] nor --max-tokens sets one)"
        )
    if rules.prints_deviations:
        lines.extend(start_lines())
    return lines


def print_protocol_start(
    protocol: str,
    lms: RoleLMs,
    roles: tuple[str, ...],
    file: TextIO | None = None,
    embeds: bool = False,
) -> None:
    for line in protocol_start_lines(protocol, lms, roles, embeds):
        print(line, file=file or sys.stderr)
