"""What every run prints about its protocol before the first LLM call.

Under `protocol = "paper"`: the completion limits in use (the reference's 8192 unless the
user set one) and the kept rows of the deviation table (`evolve.paper_deviations`), one line
each, so that nobody reads a paper run's numbers without seeing where it differs from the
reference code. Under `evolve`: nothing (its differences are the protocol itself).
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
    lines: list[str] = []
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
    protocol: str, lms: RoleLMs, roles: tuple[str, ...], file: TextIO | None = None
) -> None:
    for line in protocol_start_lines(protocol, lms, roles):
        print(line, file=file or sys.stderr)
