"""Shared machinery of the embedding-store policies (`external`, `raw_rag`)."""

from __future__ import annotations

from typing import ClassVar

import dspy
import numpy as np
from pydantic import BaseModel, Field

from memory_policies.base import MemoryPolicy
from memory_policies.common import DEFAULT_MEMORY_USE, MemoryChoose, MemoryReply, timed_line
from memory_policies.embed import UsesEmbedder, embed_texts, top_k_indices
from memory_policies.errors import PolicyError
from memory_policies.messages import MemoryState, strip_time_header
from memory_policies.paper import PAPER_STORE_USE, StoreChatChoose, StoreChatReply
from memory_policies.variants import VARIANTS, Variant


class StoredMemory(BaseModel):
    id: int
    text: str
    time: str | None = None
    # Stored with the memory so it is embedded exactly once, even across checkpoints.
    vector: list[float]


class StoreState(MemoryState):
    memories: list[StoredMemory] = Field(default_factory=list)
    next_id: int = 1
    # Name of the embedder that produced the vectors; vectors of two embedders never mix.
    embedder: str | None = None


class EmbeddingRead(dspy.Module):
    """Not an LLM step: cosine top-k over the stored vectors."""

    def forward(self, query_vector: np.ndarray, vectors: np.ndarray, k: int) -> dspy.Prediction:
        return dspy.Prediction(indices=top_k_indices(query_vector, vectors, k))


def in_time_order(memories: list[StoredMemory]) -> list[StoredMemory]:
    # Times are "YYYY-MM-DD HH:MM" strings, so text order is time order; ids break ties.
    return sorted(memories, key=lambda m: (m.time or "", m.id))


class EmbeddingStorePolicy(UsesEmbedder, MemoryPolicy):
    """A policy whose long-term memory is a list of embedded texts retrieved by similarity."""

    parameter_names: ClassVar[tuple[str, ...]] = ("update_every", "short_term_len", "top_k")
    default_parameters: ClassVar[dict[str, int]] = {
        "update_every": 2,
        "short_term_len": 4,
        "top_k": 5,
    }
    # The reference's AWE and RAG configs retrieve 30 memories.
    paper_parameters: ClassVar[dict[str, int]] = {"top_k": 30}
    choose_signature: ClassVar[type[dspy.Signature]] = MemoryChoose
    variants: ClassVar[tuple[Variant, ...]] = VARIANTS
    paper_choose_signature: ClassVar[type[dspy.Signature]] = StoreChatChoose

    # ----- vectors ---------------------------------------------------------------------------

    def _check_embedder(self, state: StoreState) -> None:
        if state.embedder is not None and state.embedder != self.embedder.name:
            raise PolicyError(
                f"this memory state was embedded with '{state.embedder}' but the policy uses "
                f"'{self.embedder.name}'; resume with the same embedder"
            )

    def _embed(self, state: StoreState, texts: list[str]) -> np.ndarray:
        self._check_embedder(state)
        vectors = embed_texts(self.embedder, texts)
        state.embedder = self.embedder.name
        return vectors

    def _store(self, state: StoreState, texts: list[str], time: str | None) -> None:
        if not texts:
            return
        for text, vector in zip(texts, self._embed(state, texts), strict=True):
            state.memories.append(
                StoredMemory(id=state.next_id, text=text, time=time, vector=vector.tolist())
            )
            state.next_id += 1

    def _search(self, state: StoreState, query: str, k: int) -> list[StoredMemory]:
        if not state.memories:
            return []
        self._check_embedder(state)
        query_vector = embed_texts(self.embedder, [query])[0]
        matrix = np.asarray([m.vector for m in state.memories], dtype=np.float32)
        if matrix.shape[1] != query_vector.shape[0]:
            raise PolicyError(
                f"stored vectors have {matrix.shape[1]} dimensions but embedder "
                f"'{self.embedder.name}' returns {query_vector.shape[0]}"
            )
        indices = self.read(query_vector=query_vector, vectors=matrix, k=k).indices
        return [state.memories[i] for i in indices]

    # ----- use -------------------------------------------------------------------------------

    def _use_inputs(self, state: MemoryState, query: str) -> tuple[dict[str, str], list[str]]:
        assert isinstance(state, StoreState)
        # The reference searches with the message as sent (time header and, for a question,
        # the options included) and lists the hits as ``- text``, oldest first.
        rules = self.rules
        query_text = query if rules.search_with_message_as_sent else strip_time_header(query)
        found = in_time_order(self._search(state, query_text, self.top_k))
        if rules.plain_memory_lines:
            memory = "\n".join(f"- {m.text}" for m in found)
        else:
            memory = "\n".join(timed_line(m.time, m.text) for m in found) or "(nothing relevant)"
        return {"memory": memory}, [m.text for m in found]

    def _use_predictor(self) -> dspy.Predict:
        """`use` as the variant's dialogue asks it (the reference's store prompt in chat turns)."""
        return dspy.Predict(
            self.dialogue.pick(
                MemoryReply.with_instructions(DEFAULT_MEMORY_USE),
                StoreChatReply.with_instructions(PAPER_STORE_USE),
            )
        )

    def describe_memory(self, state: MemoryState) -> str:
        assert isinstance(state, StoreState)
        if not state.memories:
            return "(empty)"
        return "\n".join(timed_line(m.time, m.text) for m in in_time_order(state.memories))
