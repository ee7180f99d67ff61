"""`external` (the paper's AWE, mem0-style): LLM-curated facts in an embedding store."""

from __future__ import annotations

from typing import ClassVar, Literal

import dspy
from pydantic import BaseModel, Field

from memory_policies.base import MemoryState, Message, render_conversation
from memory_policies.common import DEFAULT_MEMORY_USE, MemoryReply, latest_time
from memory_policies.store import EmbeddingRead, EmbeddingStorePolicy, StoreState

DEFAULT_WRITE = (
    "You curate the long-term memory of a personal assistant about its user. From the new "
    "messages, extract facts about the user that will help personalise future conversations: "
    "preferences, personal details, current situation, plans, habits and constraints. Compare "
    "them with the stored memories: add facts that are new, update a stored fact that changed "
    "(keep its id), delete a stored fact that is no longer true, and leave the rest alone. "
    "Each fact is one short, self-contained sentence."
)


class ExternalState(StoreState):
    kind: Literal["external"] = "external"


class MemoryOperation(BaseModel):
    action: Literal["add", "update", "delete"]
    id: int = Field(description="id of the stored memory to update or delete; 0 for add")
    text: str = Field(description="the fact (for add and update); empty for delete")


class ExternalWrite(dspy.Signature):
    existing: str = dspy.InputField(desc="stored memories related to the messages, '[id] fact'")
    messages: str = dspy.InputField(desc="new conversation messages to memorize")
    operations: list[MemoryOperation] = dspy.OutputField(
        desc="one operation per fact the user revealed about themselves, e.g. action 'add', "
        "id 0, text 'The user is vegetarian.'; update or delete stored facts that changed"
    )


class ExternalPolicy(EmbeddingStorePolicy):
    """`write` extracts facts and reconciles them with similar stored ones (add/update/delete).

    Operations naming an unknown id or carrying no text cannot be applied; they are counted in
    ``state.parse_failures["write.invalid"]`` (an update of an unknown id is kept as an add,
    so the fact is not lost).
    """

    kind: ClassVar[str] = "external"
    state_type: ClassVar[type[MemoryState]] = ExternalState

    def _build_modules(self) -> None:
        self.write = dspy.Predict(ExternalWrite.with_instructions(DEFAULT_WRITE))
        self.read = EmbeddingRead()
        self.use = dspy.Predict(MemoryReply.with_instructions(DEFAULT_MEMORY_USE))

    def _instruction_predictors(self) -> dict[str, dspy.Predict]:
        return {"write": self.write, "use": self.use}

    def _write(self, state: MemoryState, messages: list[Message], times: list[str | None]) -> None:
        assert isinstance(state, ExternalState)
        transcript = render_conversation(messages)
        related = self._search(state, transcript, self.top_k)
        prediction = self._predict(
            state,
            "write",
            self.write,
            existing="\n".join(f"[{m.id}] {m.text}" for m in related) or "(none)",
            messages=transcript,
        )
        if prediction is None:
            return  # counted in parse_failures; memory unchanged
        time = latest_time(times) or state.current_time
        by_id = {m.id: m for m in state.memories}
        additions: list[str] = []
        invalid = 0
        for op in prediction.operations:
            text = op.text.strip()
            if op.action == "delete":
                if op.id in by_id:
                    del by_id[op.id]
                else:
                    invalid += 1
            elif not text:
                invalid += 1
            elif op.action == "update" and op.id in by_id:
                del by_id[op.id]  # replaced below by a fresh entry with a new vector and time
                additions.append(text)
            else:
                invalid += op.action == "update"
                additions.append(text)
        if invalid:
            state.parse_failures["write.invalid"] = (
                state.parse_failures.get("write.invalid", 0) + invalid
            )
        state.memories = [m for m in state.memories if m.id in by_id]
        # Duplicate facts in one batch would only crowd out other memories at read time.
        unique = list(dict.fromkeys(additions))
        self._store(state, unique, time)
