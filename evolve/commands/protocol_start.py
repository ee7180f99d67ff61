"""What every run prints about its protocol before the first LLM call.

Always: which model serves which role. Under `protocol = "paper"`: the completion limits in
use (the reference's 8192 unless the user set one) and the kept rows of the deviation table
(`evolve.paper_deviations`), one line each, so that nobody reads a paper run's numbers
without seeing where it differs from the reference code. Under `evolve`: nothing more (its
differences are the protocol itself).
"""

from __future__ import annotations

import sys
from typing import TextIO

from evolve.llm import RoleLMs
from evolve.paper_deviations import start_lines
from evolve.protocol import rules_for


def protocol_start_lines(protocol: str, lms: RoleLMs, roles: tuple[str, ...]) -> list[str]:
    """The lines a run of `protocol` prints at its start; `roles`: those the run calls."""
    rules = rules_for(protocol)
    lines: list[str] = [serving_line(lms, roles)]
    if rules.default_max_tokens is not None:
        limits = ", ".join(f"{role} {lms.identity(role).get('max_tokens')}" for role in roles)
        lines.append(
            f"protocol {protocol}: max_tokens {limits} (the reference's "
            f"{rules.default_max_tokens} where neither [llm] nor --max-tokens sets one)"
        )
    if rules.prints_deviations:
        lines.extend(start_lines())
    return lines


def serving_line(lms: RoleLMs, roles: tuple[str, ...]) -> str:
    """Which model serves which role, e.g. `models: simulator, agent, reflector:
    qwen2.5-coder-1.5b-instruct@llama-server-4slots (embedded llama.cpp)`."""
    served: dict[str, list[str]] = {}
    for role in roles:
        identity = lms.identity(role)
        where = "embedded llama.cpp" if identity.get("endpoint") == "embedded" else "endpoint"
        served.setdefault(f"{identity.get('model')} ({where})", []).append(role)
    return "models: " + "; ".join(f"{', '.join(r)}: {model}" for model, r in served.items())


def print_protocol_start(
    protocol: str, lms: RoleLMs, roles: tuple[str, ...], file: TextIO | None = None
) -> None:
    for line in protocol_start_lines(protocol, lms, roles):
        print(line, file=file or sys.stderr)
