"""`in_context` (the paper's AWI): a label -> value memory placed in the prompt, LLM-written."""

from __future__ import annotations

from typing import ClassVar, Literal

import dspy
from pydantic import BaseModel, Field

from memory_policies.base import MemoryPolicy, MemoryState, Message, render_conversation
from memory_policies.common import (
    DEFAULT_MEMORY_USE,
    MemoryChoose,
    MemoryReply,
    latest_time,
    timed_line,
)
from memory_policies.errors import PolicyError

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
    label: str = Field(description="short topic name, e.g. 'diet'")
    value: str = Field(description="the current information for this topic")


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


def compose_write_instruction(write: str, types_to_remember: str) -> str:
    return f"{write.strip()}{_SEAM}{types_to_remember.strip()}"


def split_write_instruction(instruction: str) -> tuple[str, str]:
    write, seam, types = instruction.partition(_SEAM)
    return write, types if seam else ""


class InContextPolicy(MemoryPolicy):
    kind: ClassVar[str] = "in_context"
    state_type: ClassVar[type[MemoryState]] = InContextState
    choose_signature: ClassVar[type[dspy.Signature]] = MemoryChoose

    def _build_modules(self) -> None:
        self.write = dspy.Predict(
            InContextWrite.with_instructions(
                compose_write_instruction(DEFAULT_WRITE, DEFAULT_TYPES_TO_REMEMBER)
            )
        )
        self.read = InContextRead()
        self.use = dspy.Predict(MemoryReply.with_instructions(DEFAULT_MEMORY_USE))

    def _write(self, state: MemoryState, messages: list[Message], times: list[str | None]) -> None:
        assert isinstance(state, InContextState)
        prediction = self._predict(
            state,
            "write",
            self.write,
            memory=render_entries(state.memory),
            messages=render_conversation(messages),
        )
        if prediction is None:
            return  # counted in parse_failures; memory unchanged
        time = latest_time(times) or state.current_time
        for update in prediction.updates:
            label, value = update.label.strip(), update.value.strip()
            if not label or not value:
                continue
            key = label.casefold()
            # Overwrite = drop the old entry and append: the list stays ordered by write time.
            state.memory = [e for e in state.memory if e.label.casefold() != key]
            state.memory.append(MemoryEntry(label=label, value=value, time=time))

    def _use_inputs(self, state: MemoryState, query: str) -> tuple[dict[str, str], list[str]]:
        assert isinstance(state, InContextState)
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
