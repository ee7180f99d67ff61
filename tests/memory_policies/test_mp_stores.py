"""What each policy's `write` does to long-term memory, and what `read` brings back."""

from __future__ import annotations

import pytest
from mp_helpers import CountingEmbedder, agent, agent_context, calls_for, messages, section

from memory_policies import HashingEmbedder, Message, PolicyError, build_policy


def _observe(policy, lm, batch, state=None):
    with agent_context(lm):
        return policy.observe(state or policy.initial_state(), batch)


def _one_by_one(outputs):
    """Successive write calls return successive outputs."""
    queue = list(outputs)
    return lambda call: queue.pop(0)


def test_in_context_same_label_overwrites_new_label_appends() -> None:
    policy = build_policy("in_context:update_every=1,short_term_len=0")
    lm = agent(
        updates=_one_by_one(
            [
                [{"label": "diet", "value": "vegetarian"}, {"label": "city", "value": "Lyon"}],
                [{"label": "pet", "value": "a cat"}],
                [{"label": "Diet ", "value": "vegan"}, {"label": "", "value": "ignored"}],
            ],
        )
    )
    state = _observe(
        policy,
        lm,
        [
            Message(role="user", content="[Current Time: 2024-01-01 10:00]\nhi"),
            Message(role="user", content="[Current Time: 2024-02-01 10:00]\nhi"),
            Message(role="user", content="[Current Time: 2024-03-01 10:00]\nhi"),
        ],
    )
    assert [(e.label, e.value, e.time) for e in state.memory] == [
        ("city", "Lyon", "2024-01-01 10:00"),
        ("pet", "a cat", "2024-02-01 10:00"),
        ("Diet", "vegan", "2024-03-01 10:00"),
    ]
    described = policy.describe_memory(state)
    assert described.splitlines() == [
        "- [2024-01-01 10:00] city: Lyon",
        "- [2024-02-01 10:00] pet: a cat",
        "- [2024-03-01 10:00] Diet: vegan",
    ]
    # The write sees the current memory, and `use` gets all of it in the prompt.
    third_write = calls_for(lm, "updates")[2]
    assert section(third_write.user, "memory") == (
        "- [2024-01-01 10:00] diet: vegetarian\n- [2024-01-01 10:00] city: Lyon\n"
        "- [2024-02-01 10:00] pet: a cat"
    )
    with agent_context(lm):
        result = policy.answer(state, "what do I eat?")
    assert result.retrieved == ["city: Lyon", "pet: a cat", "Diet: vegan"]
    assert section(calls_for(lm, "reply")[0].user, "memory") == described


def test_external_add_update_delete_and_invalid_operations() -> None:
    lm = agent(
        operations=_one_by_one(
            [
                [
                    {"action": "add", "id": 0, "text": "User lives in Lyon."},
                    {"action": "add", "id": 0, "text": "User has a cat."},
                    {"action": "add", "id": 0, "text": "User has a cat."},
                ],
                [
                    {"action": "update", "id": 1, "text": "User moved to Paris."},
                    {"action": "delete", "id": 2, "text": ""},
                    {"action": "delete", "id": 99, "text": ""},
                    {"action": "update", "id": 42, "text": "User likes jazz."},
                    {"action": "add", "id": 0, "text": "  "},
                ],
            ],
        )
    )
    policy = build_policy(
        {"kind": "external", "update_every": 1, "short_term_len": 0, "top_k": 10},
        embedder=HashingEmbedder(),
    )
    state = _observe(
        policy,
        lm,
        [
            Message(role="user", content="[Current Time: 2024-01-01 10:00]\nI live in Lyon"),
            Message(role="user", content="[Current Time: 2024-06-01 10:00]\nmoved"),
        ],
    )
    assert [(m.id, m.text, m.time) for m in state.memories] == [
        (3, "User moved to Paris.", "2024-06-01 10:00"),
        (4, "User likes jazz.", "2024-06-01 10:00"),
    ]
    # Unknown ids (99, 42) and an empty text could not be applied as given.
    assert state.parse_failures == {"write.invalid": 3}
    second_write = calls_for(lm, "operations")[1]
    assert sorted(section(second_write.user, "existing").splitlines()) == [
        "[1] User lives in Lyon.",
        "[2] User has a cat.",
    ]
    assert state.embedder == "hashing-256"
    assert all(len(m.vector) == 256 for m in state.memories)


def test_external_read_returns_top_k_similar_in_time_order() -> None:
    policy = build_policy(
        {"kind": "external", "update_every": 1, "short_term_len": 0, "top_k": 2},
        embedder=HashingEmbedder(),
    )
    facts = [
        ("2024-01-01 10:00", "User enjoys hiking in the mountains."),
        ("2024-02-01 10:00", "User drinks green tea every morning."),
        ("2024-03-01 10:00", "User prefers hiking boots from Brand X."),
        ("2024-04-01 10:00", "User works as a nurse."),
    ]
    queue = [[{"action": "add", "id": 0, "text": text}] for _, text in facts]
    lm = agent(operations=lambda call: queue.pop(0))
    state = _observe(
        policy, lm, [Message(role="user", content=f"[Current Time: {t}]\nx") for t, _ in facts]
    )
    with agent_context(lm):
        result = policy.answer(state, "any hiking ideas for the mountains?")
    assert result.retrieved == [facts[0][1], facts[2][1]]
    assert section(calls_for(lm, "reply")[0].user, "memory") == (
        f"- [{facts[0][0]}] {facts[0][1]}\n- [{facts[2][0]}] {facts[2][1]}"
    )


def test_raw_rag_stores_verbatim_chunks_without_llm_writes() -> None:
    policy = build_policy(
        "raw_rag:update_every=2,short_term_len=0,top_k=1", embedder=HashingEmbedder()
    )
    lm = agent()
    batch = [
        Message(role="user", content="[Current Time: 2024-01-01 10:00]\nmy dog is called Rex"),
        Message(role="assistant", content="nice"),
        Message(role="user", content="I cook pasta on fridays"),
        Message(role="assistant", content="yum"),
    ]
    state = _observe(policy, lm, batch)
    assert lm.calls == []
    assert [m.text for m in state.memories] == [
        "User: [Current Time: 2024-01-01 10:00]\nmy dog is called Rex\nAssistant: nice",
        "User: I cook pasta on fridays\nAssistant: yum",
    ]
    with agent_context(lm):
        assert policy.answer(state, "what is my dog called").retrieved == [state.memories[0].text]


def test_vectors_from_another_embedder_are_refused() -> None:
    writer = build_policy("raw_rag:update_every=1,short_term_len=0", embedder=HashingEmbedder(32))
    state = _observe(writer, agent(), messages(2))
    reader = build_policy("raw_rag", embedder=_Renamed(HashingEmbedder(32), "other-32"))
    with pytest.raises(PolicyError, match="embedded with 'hashing-32'.*same embedder"):
        reader.answer(state, "hello")
    other_dim = build_policy("raw_rag", embedder=_Renamed(HashingEmbedder(16), "hashing-32"))
    with pytest.raises(PolicyError, match="dimensions"):
        other_dim.answer(state, "hello")


class _Renamed:
    def __init__(self, inner, name):
        self.inner, self.name = inner, name

    def embed(self, texts):
        return self.inner.embed(texts)


def test_search_query_drops_the_time_header() -> None:
    embedder = CountingEmbedder()
    policy = build_policy("raw_rag:update_every=1,short_term_len=0", embedder=embedder)
    state = _observe(policy, agent(), messages(1))
    with agent_context(agent()):
        policy.respond(state, "[Current Time: 2024-01-01 10:00]\nwhere is my dog?")
    assert "where is my dog?" in embedder.texts
