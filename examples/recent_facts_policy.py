"""A policy kind with a numeric parameter of its own and no paper variant, in one file.

It keeps the user's last `max_notes` messages verbatim as its long-term memory (no LLM write)
and replies from them. `max_notes` is its own parameter, so the class declares its rule;
the shared ones (`update_every`, `short_term_len`) need none. It declares no `variants`, so
it follows only the `evolve` flow and `recent_facts:variant=paper` is refused when built.
"""

from typing import ClassVar, Literal

import dspy
from pydantic import Field

from memory_policies import MemoryPolicy, MemoryState, Message, ParameterRule, register_policy
from memory_policies.common import DEFAULT_MEMORY_USE, MemoryChoose, MemoryReply, PassThrough


class RecentFactsState(MemoryState):
    kind: Literal["recent_facts"] = "recent_facts"
    notes: list[str] = Field(default_factory=list)


@register_policy
class RecentFactsPolicy(MemoryPolicy):
    kind = "recent_facts"
    state_type = RecentFactsState
    parameter_names = ("update_every", "short_term_len", "max_notes")
    default_parameters: ClassVar[dict[str, int]] = {
        "update_every": 2,
        "short_term_len": 2,
        "max_notes": 8,
    }
    parameter_rules: ClassVar[dict[str, ParameterRule]] = {
        "max_notes": ParameterRule(1, 50, "user messages kept as long-term memory")
    }
    choose_signature = MemoryChoose

    def _build_modules(self) -> None:
        self.write = PassThrough()
        self.read = PassThrough()
        self.use = dspy.Predict(MemoryReply.with_instructions(DEFAULT_MEMORY_USE))

    def _write(self, state: MemoryState, messages: list[Message], times: list) -> None:
        said = [m.content for m in messages if m.role == "user"]
        state.notes = (state.notes + said)[-self.max_notes :]

    def _use_inputs(self, state: MemoryState, query: str) -> tuple[dict[str, str], list[str]]:
        return {
            "memory": "\n".join(f"- {note}" for note in state.notes) or "(nothing)"
        }, state.notes

    def describe_memory(self, state: MemoryState) -> str:
        return "\n".join(state.notes)
