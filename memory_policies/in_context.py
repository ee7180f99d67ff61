"""`in_context` (the paper's AWI): a label -> value memory placed in the prompt, LLM-written."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import dspy
from pydantic import BaseModel, Field

from memory_policies.base import MemoryPolicy
from memory_policies.common import (
    DEFAULT_MEMORY_USE,
    MemoryChoose,
    MemoryLabel,
    MemoryReply,
    MemoryText,
    latest_time,
    timed_line,
)
from memory_policies.errors import PolicyError
from memory_policies.messages import MemoryState, render_conversation
from memory_policies.paper import (
    PAPER_IN_CONTEXT_USE,
    PAPER_IN_CONTEXT_WRITE,
    PAPER_TYPES_TO_REMEMBER,
    InContextChatChoose,
    InContextChatReply,
    InContextJSONWrite,
    paper_chat,
)
from memory_policies.variants import VARIANTS, Variant
from memory_policies.writes import WriteStrategy

TYPES_HEADER = "Types of Information to Remember:"
# The composed write instruction is "<write>\n\n<TYPES_HEADER>\n<types_to_remember>"; the
# header is the seam that keeps the two parts separately addressable.
_SEAM = f"\n\n{TYPES_HEADER}\n"

DEFAULT_WRITE = (
    "You maintain the long-term memory of a personal assistant about its user. Read the new "
    "conversation messages and record the information that will help personalise future "
    "conversations. Keep each value short and specific. When the user's situation or a "
    "preference changed, overwrite the old entry by reusing its label with the new value."
)

DEFAULT_TYPES_TO_REMEMBER = (
    "1. Preferences: likes, dislikes and favourites (food, products, activities, styles).\n"
    "2. Personal details: family, relationships, job, home, health, important dates.\n"
    "3. Current situation and how it changes: what the user is dealing with right now.\n"
    "4. Plans and goals: upcoming events, trips, projects, intentions.\n"
    "5. Habits, routines and constraints: schedule, budget, diet, tools and devices used.\n"
    "6. Opinions and experiences the user shared about things they tried."
)


class MemoryEntry(BaseModel):
    label: str
    value: str
    time: str | None = None


class InContextState(MemoryState):
    kind: Literal["in_context"] = "in_context"
    memory: list[MemoryEntry] = Field(default_factory=list)


class MemoryUpdate(BaseModel):
    label: MemoryLabel = Field(description="short topic name, e.g. 'diet'")
    value: MemoryText = Field(description="the current information for this topic")


class InContextWrite(dspy.Signature):
    memory: str = dspy.InputField(desc="current long-term memory, oldest first")
    messages: str = dspy.InputField(desc="new conversation messages to memorize")
    updates: list[MemoryUpdate] = dspy.OutputField(
        # Small models take an "empty list if nothing to remember" escape hatch every time;
        # a concrete example of one entry per revealed fact keeps them writing.
        desc="one entry per fact the user revealed about themselves, e.g. label 'diet', "
        "value 'vegetarian'; reuse an existing label to replace its value"
    )


class InContextRead(dspy.Module):
    """Not an LLM step: the whole memory goes into the prompt, one line per entry."""

    def forward(self, entries: list[MemoryEntry]) -> dspy.Prediction:
        return dspy.Prediction(memory=render_entries(entries))


def render_entries(entries: list[MemoryEntry]) -> str:
    if not entries:
        return "(empty)"
    return "\n".join(timed_line(e.time, f"{e.label}: {e.value}") for e in entries)


def render_paper_entries(entries: list[MemoryEntry]) -> str:
    """The reference's memory lines: ``- label: value``, oldest write first, no times."""
    return "\n".join(f"- {e.label}: {e.value}" for e in entries)


def _as_text(value: Any) -> str:
    # The reference stores whatever JSON value the LM gave; we keep text, JSON for the rest.
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def compose_write_instruction(write: str, types_to_remember: str) -> str:
    return f"{write.strip()}{_SEAM}{types_to_remember.strip()}"


def split_write_instruction(instruction: str) -> tuple[str, str]:
    write, seam, types = instruction.partition(_SEAM)
    return write, types if seam else ""


class InContextWrites(WriteStrategy):
    """An in-context write: its signature, its initial instruction and types to remember."""

    signature: type[dspy.Signature]
    instruction: str
    types_to_remember: str

    def build(self, policy: Any) -> None:
        # The policy composes the instruction: the oracle leaves the types out.
        policy.write = dspy.Predict(self.signature.with_instructions(policy._initial_write()))


class LabelledWrites(InContextWrites):
    """Ours: the memory and the messages as text; label -> value updates (a label is matched
    case-insensitively; empty labels or values are skipped)."""

    signature = InContextWrite
    instruction = DEFAULT_WRITE
    types_to_remember = DEFAULT_TYPES_TO_REMEMBER

    def write(self, policy, state, messages, times) -> None:
        assert isinstance(state, InContextState)
        time = latest_time(times) or state.current_time
        prediction = policy._predict(
            state,
            "write",
            policy.write,
            signature=policy._write_signature(state),
            memory=render_entries(state.memory),
            messages=render_conversation(messages),
        )
        if prediction is None:
            return  # counted in parse_failures; memory unchanged
        for update in prediction.updates:
            label, value = update.label.strip(), update.value.strip()
            if not label or not value:
                continue
            key = label.casefold()
            # Overwrite = drop the old entry and append: the list stays ordered by write time.
            state.memory = [e for e in state.memory if e.label.casefold() != key]
            state.memory.append(MemoryEntry(label=label, value=value, time=time))


class JSONObjectWrites(InContextWrites):
    """The reference's: the memory as a JSON object and the messages as a JSON list, answered
    by one JSON object of label -> complete value (exact-label overwrite), the original's 7
    types."""

    signature = InContextJSONWrite
    instruction = PAPER_IN_CONTEXT_WRITE
    types_to_remember = PAPER_TYPES_TO_REMEMBER

    def write(self, policy, state, messages, times) -> None:
        assert isinstance(state, InContextState)
        time = latest_time(times) or state.current_time
        with paper_chat():
            prediction = policy._predict(
                state,
                "write",
                policy.write,
                signature=policy._write_signature(state),
                current_memories=json.dumps(
                    {e.label: e.value for e in state.memory}, indent=2, ensure_ascii=False
                ),
                conversation=json.dumps(
                    [m.model_dump() for m in messages], indent=2, ensure_ascii=False
                ),
            )
        if prediction is None:
            return  # counted in parse_failures; memory unchanged
        for label, value in prediction.memory_updates.items():
            # Exact label match, as the reference; overwrite = drop and append (time order).
            state.memory = [e for e in state.memory if e.label != label]
            state.memory.append(MemoryEntry(label=label, value=_as_text(value), time=time))


class InContextPolicy(MemoryPolicy):
    """Under variant=paper: the reference's 7 types, a write that sees the memory as a JSON
    object and the flushed messages as a JSON list and answers one JSON object of
    label -> complete value (exact-label overwrite), and replies from a system message with
    ``- label: value`` lines followed by the recent messages as chat turns."""

    kind: ClassVar[str] = "in_context"
    state_type: ClassVar[type[MemoryState]] = InContextState
    choose_signature: ClassVar[type[dspy.Signature]] = MemoryChoose
    variants: ClassVar[tuple[Variant, ...]] = VARIANTS
    paper_choose_signature: ClassVar[type[dspy.Signature]] = InContextChatChoose

    write_strategies: ClassVar[dict[str, WriteStrategy]] = {
        "own": LabelledWrites(),
        "reference": JSONObjectWrites(),
    }

    def _build_modules(self) -> None:
        assert self.writes is not None
        self.writes.build(self)
        self.read = InContextRead()
        self.use = dspy.Predict(
            self.dialogue.pick(
                MemoryReply.with_instructions(DEFAULT_MEMORY_USE),
                InContextChatReply.with_instructions(PAPER_IN_CONTEXT_USE),
            )
        )

    def _initial_write(self) -> str:
        assert isinstance(self.writes, InContextWrites)
        return compose_write_instruction(self.writes.instruction, self.writes.types_to_remember)

    def _write_signature(self, state: InContextState) -> type[dspy.Signature]:
        """The write signature for this state (the oracle adds the user's own types)."""
        return self.write.signature

    def _use_inputs(self, state: MemoryState, query: str) -> tuple[dict[str, str], list[str]]:
        assert isinstance(state, InContextState)
        if self.rules.plain_memory_lines:
            memory = render_paper_entries(state.memory)
        else:
            memory = self.read(entries=state.memory).memory
        retrieved = [f"{e.label}: {e.value}" for e in state.memory]
        return {"memory": memory}, retrieved

    def components(self) -> dict[str, str]:
        write, types = split_write_instruction(self.write.signature.instructions)
        return {
            "write": write,
            "write.types_to_remember": types,
            "use": self.use.signature.instructions,
        }

    def _set_components(self, updates: dict[str, str]) -> None:
        for name, text in updates.items():
            if TYPES_HEADER in text:
                raise PolicyError(
                    f"component '{name}' must not contain the line '{TYPES_HEADER}': it separates "
                    "'write' from 'write.types_to_remember'; edit each part on its own"
                )
        current = self.components()
        if "write" in updates or "write.types_to_remember" in updates:
            instruction = compose_write_instruction(
                updates.get("write", current["write"]),
                updates.get("write.types_to_remember", current["write.types_to_remember"]),
            )
            self.write.signature = self.write.signature.with_instructions(instruction)
        if "use" in updates:
            self.use.signature = self.use.signature.with_instructions(updates["use"].strip())

    def describe_memory(self, state: MemoryState) -> str:
        assert isinstance(state, InContextState)
        return render_entries(state.memory)


class InContextOracleState(InContextState):
    kind: Literal["in_context_oracle"] = "in_context_oracle"  # type: ignore[assignment]
    # The user's own state-schema variable names: this user's types to remember.
    types_to_remember: list[str] = Field(default_factory=list)


def render_schema_types(variables: Sequence[str]) -> str:
    return "\n".join(f"{i}. {name}" for i, name in enumerate(variables, start=1))


class InContextOraclePolicy(InContextPolicy):
    """`in_context` told exactly what to remember: the types list is the user's own state-schema
    variable names (the reference's "awi-hack"), the ceiling for evolving the types list.

    The names are per user, so they live in the state: ``initial_state(state_schema=...)``
    requires the user's schema (the evaluation runner passes it for every user). The mutable
    parts are `write` and `use`; the types are not a component.
    """

    kind: ClassVar[str] = "in_context_oracle"
    state_type: ClassVar[type[MemoryState]] = InContextOracleState

    def _initial_write(self) -> str:
        assert isinstance(self.writes, InContextWrites)
        return self.writes.instruction

    def initial_state(
        self, *, state_schema: Mapping[str, Sequence[str]] | None = None
    ) -> MemoryState:
        if not state_schema:
            raise PolicyError(
                "the in_context_oracle policy remembers the user's own state variables, so it "
                "needs the user's state schema: call initial_state(state_schema=item's "
                "state_schema); got none"
            )
        return InContextOracleState(types_to_remember=[str(name) for name in state_schema])

    def _write_signature(self, state: InContextState) -> type[dspy.Signature]:
        assert isinstance(state, InContextOracleState)
        if not state.types_to_remember:
            raise PolicyError(
                "this in_context_oracle state has no types to remember; build it with "
                "initial_state(state_schema=...)"
            )
        instruction = compose_write_instruction(
            self.write.signature.instructions, render_schema_types(state.types_to_remember)
        )
        return self.write.signature.with_instructions(instruction)

    def components(self) -> dict[str, str]:
        return {"write": self.write.signature.instructions, "use": self.use.signature.instructions}

    def _set_components(self, updates: dict[str, str]) -> None:
        for name, text in updates.items():
            if TYPES_HEADER in text:
                raise PolicyError(
                    f"component '{name}' must not contain the line '{TYPES_HEADER}': the "
                    "oracle appends the user's own variables under it"
                )
        MemoryPolicy._set_components(self, updates)

    def _instruction_predictors(self) -> dict[str, dspy.Predict]:
        return {"write": self.write, "use": self.use}
