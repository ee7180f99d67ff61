"""A BM25 keyword store as a memory system (needs `pip install rank-bm25`)."""

from rank_bm25 import BM25Okapi

from memory_policies import MemorySystem, MemorySystemPolicy, Message, register_policy


class BM25System(MemorySystem):
    """One user's memory: one document per flushed batch of messages, ranked by BM25."""

    def __init__(self) -> None:
        self.documents: list[str] = []

    def add(self, messages: list[Message], at: str | None) -> None:
        text = " ".join(f"{m.role}: {m.content}" for m in messages)
        self.documents.append(f"[{at}] {text}" if at else text)

    def search(self, query: str, k: int) -> list[str]:
        if not self.documents:
            return []
        index = BM25Okapi([doc.lower().split() for doc in self.documents])
        scores = index.get_scores(query.lower().split())
        best = sorted(range(len(scores)), key=lambda i: -scores[i])[:k]
        return [self.documents[i] for i in sorted(best)]  # oldest first

    def snapshot(self) -> dict:
        return {"documents": list(self.documents)}

    def restore(self, snapshot: dict) -> None:
        self.documents = list(snapshot["documents"])


@register_policy
class BM25Policy(MemorySystemPolicy):
    kind = "bm25"

    def open_system(self) -> MemorySystem:
        return BM25System()
