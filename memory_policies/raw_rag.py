"""`raw_rag` (the paper's RAG): raw message chunks in an embedding store; no LLM write."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import dspy

from memory_policies.common import latest_time
from memory_policies.embedding_store import EmbeddingRead, EmbeddingStorePolicy, StoreState
from memory_policies.messages import MemoryState, Message, render_conversation
from memory_policies.paper import ROLE_PREFIXES
from memory_policies.writes import WriteStrategy


class RawRagState(StoreState):
    kind: Literal["raw_rag"] = "raw_rag"


class ChunkWrite(dspy.Module):
    """Not an LLM step: the messages leaving the buffer become one stored chunk, verbatim."""

    def forward(self, messages: list[Message]) -> dspy.Prediction:
        return dspy.Prediction(chunk=render_conversation(messages))


class MessageWrite(dspy.Module):
    """Not an LLM step (variant=paper): each message becomes its own memory, role-prefixed as
    the reference agent stores them."""

    def forward(self, messages: list[Message]) -> dspy.Prediction:
        return dspy.Prediction(memories=[ROLE_PREFIXES[m.role] + m.content for m in messages])


class ChunkWrites(WriteStrategy):
    """Ours: each flush of `update_every` messages is one memory (2 = one exchange)."""

    def build(self, policy: Any) -> None:
        policy.write = ChunkWrite()

    def write(self, policy, state, messages, times) -> None:
        assert isinstance(state, RawRagState)
        time = latest_time(times) or state.current_time
        policy._store(state, [policy.write(messages=messages).chunk], time)


class MessageWrites(WriteStrategy):
    """The reference's: each message is its own memory."""

    def build(self, policy: Any) -> None:
        policy.write = MessageWrite()

    def write(self, policy, state, messages, times) -> None:
        assert isinstance(state, RawRagState)
        time = latest_time(times) or state.current_time
        policy._store(state, policy.write(messages=messages).memories, time)


class RawRagPolicy(EmbeddingStorePolicy):
    """Each flush of `update_every` messages is stored as one chunk (2 = one exchange);
    under variant=paper each message is stored as its own memory, and 30 are retrieved."""

    kind: ClassVar[str] = "raw_rag"
    state_type: ClassVar[type[MemoryState]] = RawRagState
    default_parameters: ClassVar[dict[str, int]] = {
        "update_every": 2,
        "short_term_len": 4,
        # Chunks are whole exchanges, longer than curated facts: fewer keep prompts lean.
        "top_k": 4,
    }

    write_strategies: ClassVar[dict[str, WriteStrategy]] = {
        "own": ChunkWrites(),
        "reference": MessageWrites(),
    }

    def _build_modules(self) -> None:
        assert self.writes is not None
        self.writes.build(self)
        self.read = EmbeddingRead()
        self.use = self._use_predictor()
