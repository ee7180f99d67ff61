"""`external` (the paper's AWE, mem0-style): LLM-curated facts in an embedding store."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import dspy
from pydantic import BaseModel, Field

from memory_policies.common import MemoryText, latest_time
from memory_policies.embedding_store import (
    EmbeddingRead,
    EmbeddingStorePolicy,
    StoredMemory,
    StoreState,
)
from memory_policies.messages import MemoryState, render_conversation
from memory_policies.paper import (
    PAPER_FACT_EXTRACTION,
    PAPER_MEMORY_UPDATE,
    RELATED_PER_FACT,
    ROLE_PREFIXES,
    FactExtraction,
    MemoryUpdate,
    paper_chat,
)
from memory_policies.writes import WriteStrategy

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
    text: MemoryText = Field(description="the fact (for add and update); empty for delete")


class ExternalWrite(dspy.Signature):
    existing: str = dspy.InputField(desc="stored memories related to the messages, '[id] fact'")
    messages: str = dspy.InputField(desc="new conversation messages to memorize")
    operations: list[MemoryOperation] = dspy.OutputField(
        desc="one operation per fact the user revealed about themselves, e.g. action 'add', "
        "id 0, text 'The user is vegetarian.'; update or delete stored facts that changed"
    )


class CuratedWrites(WriteStrategy):
    """Ours: one call extracts the messages' facts and reconciles them with the related
    stored ones (add / update / delete by id)."""

    def build(self, policy: Any) -> None:
        policy.write = dspy.Predict(ExternalWrite.with_instructions(DEFAULT_WRITE))

    def write(self, policy, state, messages, times) -> None:
        assert isinstance(state, ExternalState)
        transcript = render_conversation(messages)
        related = policy._search(state, transcript, policy.top_k)
        prediction = policy._predict(
            state,
            "write",
            policy.write,
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
        policy._store(state, unique, time)


class Mem0Writes(WriteStrategy):
    """The reference's (mem0 v1.1): fact extraction, then events against related memories."""

    def build(self, policy: Any) -> None:
        policy.write = dspy.Predict(FactExtraction.with_instructions(PAPER_FACT_EXTRACTION))
        policy.write_update = dspy.Predict(MemoryUpdate.with_instructions(PAPER_MEMORY_UPDATE))

    def instruction_predictors(self, policy: Any) -> dict[str, dspy.Predict]:
        return {"write": policy.write, "write.update": policy.write_update}

    def write(self, policy, state, messages, times) -> None:
        """Extract facts from the flushed messages (role-prefixed, as the reference passes them
        to mem0); look up the memories related to each fact; one call decides the events."""
        assert isinstance(state, ExternalState)
        time = latest_time(times) or state.current_time
        transcript = "\n".join(f"{m.role}: {ROLE_PREFIXES[m.role]}{m.content}" for m in messages)
        with paper_chat():
            extracted = policy._predict(state, "write", policy.write, messages=transcript)
        if extracted is None:
            return  # counted in parse_failures; memory unchanged
        facts = list(dict.fromkeys(str(fact).strip() for fact in extracted.facts))
        facts = [fact for fact in facts if fact]
        if not facts:
            return  # mem0 makes no update call without new facts
        related: dict[int, StoredMemory] = {}
        for fact in facts:
            for memory in policy._search(state, fact, RELATED_PER_FACT):
                related.setdefault(memory.id, memory)
        with paper_chat():
            decided = policy._predict(
                state,
                "write.update",
                policy.write_update,
                existing="\n".join(f"[{m.id}] {m.text}" for m in related.values()) or "(none)",
                new_facts="\n".join(facts),
            )
        if decided is None:
            return
        removed: set[int] = set()
        additions: list[str] = []
        invalid = 0
        for event in decided.events:
            action, text = event.event.strip().upper(), event.text.strip()
            if action == "NONE":
                continue
            if action == "ADD" and text:
                additions.append(text)
            elif action == "UPDATE" and text and event.id in related:
                removed.add(event.id)  # re-stored below with a fresh vector and time
                additions.append(text)
            elif action == "DELETE" and event.id in related:
                removed.add(event.id)
            else:
                invalid += 1  # an unknown event or id, or no text: mem0 skips it too
        if invalid:
            state.parse_failures["write.invalid"] = (
                state.parse_failures.get("write.invalid", 0) + invalid
            )
        state.memories = [m for m in state.memories if m.id not in removed]
        policy._store(state, list(dict.fromkeys(additions)), time)


class ExternalPolicy(EmbeddingStorePolicy):
    """`write` extracts facts and reconciles them with similar stored ones (add/update/delete).

    Operations naming an unknown id or carrying no text cannot be applied; they are counted in
    ``state.parse_failures["write.invalid"]`` (an update of an unknown id is kept as an add,
    so the fact is not lost).
    """

    kind: ClassVar[str] = "external"
    state_type: ClassVar[type[MemoryState]] = ExternalState

    write_strategies: ClassVar[dict[str, WriteStrategy]] = {
        "own": CuratedWrites(),
        "reference": Mem0Writes(),
    }

    def _build_modules(self) -> None:
        self.read = EmbeddingRead()
        assert self.writes is not None
        self.writes.build(self)
        self.use = self._use_predictor()

    def _instruction_predictors(self) -> dict[str, dspy.Predict]:
        assert self.writes is not None
        return {**self.writes.instruction_predictors(self), "use": self.use}
