"""variant=paper: what each policy sends its LM, pinned by a scripted LM that records every call.

One test per point of the paper protocol (agent side): no reply cap, native as chat turns, the
multiple-choice prompt answered as a JSON number, AWI's 7 types and JSON write, AWE's top_k 30,
retrieval query with the options and two-step write, RAG's one memory per message; plus the
variant's bookkeeping (spec, bundle, identity) and the in_context_oracle.
"""

from __future__ import annotations

import json
import re

import dspy
import pytest
from mp_helpers import CountingEmbedder, agent
from scripted_lm import ScriptedCall, ScriptedLM

from memory_policies import (
    InContextOracleState,
    Message,
    PolicyError,
    build_policy,
    load,
    parse_spec,
)
from memory_policies.common import REPLY_MAX_TOKENS
from memory_policies.paper import PAPER_TYPES_TO_REMEMBER, parse_answer_number

SEVEN_TYPES = [line.split(":")[0] for line in PAPER_TYPES_TO_REMEMBER.splitlines()]
QUESTION = "Which trip should I book?"
OPTIONS = ["a beach week", "a city break", "a mountain hike"]
LONG_REPLY = "First sentence. Second one. Third one. Fourth one. Fifth one."


def is_write(call: ScriptedCall) -> bool:
    """A paper-variant write: a single user message (the chat calls end with the user turn
    after a system message or history; a write has only one message)."""
    return len(call.messages) == 1 and "Output only a JSON object" in call.messages[0]["content"]


def is_question(call: ScriptedCall) -> bool:
    return '"answer": <option number>' in call.user


def paper_lm(
    *, answer: str = '```json\n{"answer": 2}\n```', writes: list | None = None
) -> ScriptedLM:
    """Replies with LONG_REPLY, answers with `answer`, writes with the next of `writes`."""
    pending = list(writes or [])

    def respond(call: ScriptedCall) -> str:
        if is_write(call):
            return json.dumps(pending.pop(0) if pending else {})
        return answer if is_question(call) else LONG_REPLY

    return ScriptedLM(respond)


def run(policy, lm, turns: list[str], state=None):
    state = state if state is not None else policy.initial_state()
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        for text in turns:
            _, state = policy.respond(state, text)
    return state


def ask(policy, lm, state, options=OPTIONS):
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        return policy.answer(state, QUESTION, options)


# ----- no reply cap ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["native", "in_context", "external", "raw_rag"])
def test_paper_replies_have_no_length_cap(kind: str) -> None:
    lm = paper_lm()
    policy = build_policy(f"{kind}:variant=paper", embedder=CountingEmbedder())
    state = run(policy, lm, ["[Current Time: 2025-03-01 09:00]\nHi, plan my week?"])
    assert state.short_term[-1].content == LONG_REPLY  # verbatim, five sentences
    assert not any("sentence" in m["content"] for m in lm.calls[0].messages)
    assert lm.calls[0].settings["max_tokens"] == lm.kwargs["max_tokens"]  # the endpoint's own
    # The evolve variant keeps its cap, in the prompt and as a generation limit: the contrast
    # is the point.
    evolve_lm = agent()
    run(build_policy(kind, embedder=CountingEmbedder()), evolve_lm, ["Hi"])
    assert "at most 3 sentences" in evolve_lm.calls[0].system
    assert evolve_lm.calls[0].settings["max_tokens"] == REPLY_MAX_TOKENS < lm.kwargs["max_tokens"]


def test_evolve_reply_cap_applies_to_replies_only_and_never_raises_the_endpoint_limit() -> None:
    lm = agent(updates=[{"label": "city", "value": "Oslo"}])
    policy = build_policy("in_context:update_every=2,short_term_len=2")
    state = run(policy, lm, ["I moved to Oslo.", "Any tips?"])  # 2 replies, then a write
    ask(policy, lm, state)
    limits = [call.settings["max_tokens"] for call in lm.calls]
    assert len(limits) == 4 and "`updates`" in lm.calls[2].system
    assert limits[:2] == [REPLY_MAX_TOKENS] * 2
    # The memory write and the answer are not capped: the endpoint's own limit.
    assert limits[2:] == [lm.kwargs["max_tokens"]] * 2
    small = agent()
    small.kwargs["max_tokens"] = 40
    run(build_policy("native"), small, ["Hi"])
    assert small.calls[0].settings["max_tokens"] == 40


# ----- native: chat turns -------------------------------------------------------------------------


def test_paper_native_sends_the_history_as_raw_chat_turns_without_system_message() -> None:
    lm = paper_lm()
    policy = build_policy("native:variant=paper")
    state = run(policy, lm, ["[Current Time: 2025-03-01 09:00]\nI moved to Oslo.", "Any tips?"])
    assert lm.calls[1].messages == [
        {"role": "user", "content": "[Current Time: 2025-03-01 09:00]\nI moved to Oslo."},
        {"role": "assistant", "content": LONG_REPLY},
        {"role": "user", "content": "Any tips?"},
    ]
    answer = ask(policy, lm, state)
    sent = lm.calls[-1].messages
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]
    assert sent[:4] == [{"role": m.role, "content": m.content} for m in state.short_term]
    assert answer.choice == 2
    assert policy.components() == {}  # no system message, so nothing to evolve


# ----- the answer prompt --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["native", "in_context", "external", "raw_rag"])
def test_paper_answer_prompt_is_question_numbered_options_and_json_number(kind: str) -> None:
    lm = paper_lm()
    policy = build_policy(f"{kind}:variant=paper", embedder=CountingEmbedder())
    answer = ask(policy, lm, policy.initial_state())
    prompt = lm.calls[-1].messages[-1]
    assert prompt["role"] == "user"
    text = prompt["content"]
    assert text.startswith(QUESTION + "\n\n")
    assert "current" in text.split("1: ")[0]  # asks for the option fitting my current situation
    assert "1: a beach week\n2: a city break\n3: a mountain hike" in text
    assert '```json\n{\n    "answer": <option number>\n}\n```' in text
    assert (answer.choice, answer.parse_error) == (2, None)


@pytest.mark.parametrize(
    ("reply", "choice"),
    [
        ('{"answer": 3}', 3),
        ('Sure!\n```json\n{"answer": 1}\n```', 1),
        ("I pick 2", None),  # no JSON: the reference's rule fails too
        ('{"answer": "2"}', None),
        ('{"answer": true}', None),
        ('{"answer": 0}', None),  # the reference would pick the last option; we refuse
        ('{"answer": 4}', None),
        ('{"choice": 2}', None),
    ],
)
def test_paper_answers_are_read_with_the_reference_json_rule(reply: str, choice) -> None:
    lm = paper_lm(answer=reply)
    policy = build_policy("native:variant=paper")
    answer = ask(policy, lm, policy.initial_state())
    assert answer.choice == choice
    assert (answer.parse_error is None) == (choice is not None)


def test_parse_answer_number_rejects_non_integers() -> None:
    assert parse_answer_number('```json\n{"answer": 7}\n```') == 7
    with pytest.raises(ValueError):
        parse_answer_number('{"answer": 2.0}')


# ----- AWI ---------------------------------------------------------------------------------------


def test_paper_in_context_write_shows_seven_types_memory_json_and_messages_json() -> None:
    lm = paper_lm(writes=[{"diet": "vegetarian"}, {"diet": "vegan", "city": "Oslo"}])
    policy = build_policy("in_context:variant=paper")
    assert policy.parameters() == {"update_every": 2, "short_term_len": 4}
    state = run(policy, lm, [f"[Current Time: 2025-03-0{i} 09:00]\nturn {i}" for i in range(1, 5)])
    writes = [call for call in lm.calls if is_write(call)]
    assert len(writes) == 2  # one per flushed round of 2 messages
    first = writes[0].messages[0]["content"]
    numbered = re.findall(r"^(\d)\. ([^:]+):", first, re.M)
    assert [f"{n}. {name}" for n, name in numbered] == SEVEN_TYPES
    assert "Current memories, as a JSON object label -> value:\n{}" in first
    conversation = json.loads(first.split("as a JSON list of messages:\n", 1)[1])
    assert conversation == [
        {"role": "user", "content": "[Current Time: 2025-03-01 09:00]\nturn 1"},
        {"role": "assistant", "content": LONG_REPLY},
    ]
    second = writes[1].messages[0]["content"]
    assert '{\n  "diet": "vegetarian"\n}' in second
    # Exact-label overwrite moves the entry to the end (latest write last).
    assert [(e.label, e.value) for e in state.memory] == [("diet", "vegan"), ("city", "Oslo")]
    answer = ask(policy, lm, state)
    system = lm.calls[-1].messages[0]
    assert system["role"] == "system"
    assert system["content"].endswith(":\n- diet: vegan\n- city: Oslo")
    assert [m["role"] for m in lm.calls[-1].messages[1:]] == ["user", "assistant"] * 2 + ["user"]
    assert answer.choice == 2


def test_paper_in_context_write_takes_an_evolved_types_text_with_braces() -> None:
    # A kept paper deviation (types_braces): the reference puts the evolved text into a
    # str.format template, so a brace crashes its next write; ours sends the text as it is.
    types = "1. Budget {monthly, in EUR}\n2. Pets }{ and their names"
    lm = paper_lm(writes=[{"budget": "900"}])
    policy = build_policy("in_context:variant=paper").with_components(
        {"write.types_to_remember": types}
    )
    state = run(policy, lm, ["[Current Time: 2025-03-01 09:00]\nturn 1", "turn 2", "turn 3"])
    (write,) = [call for call in lm.calls if is_write(call)]
    assert "Budget {monthly, in EUR}" in write.messages[0]["content"]
    assert "Pets }{ and their names" in write.messages[0]["content"]
    assert [(e.label, e.value) for e in state.memory] == [("budget", "900")]


def test_paper_in_context_write_parse_failure_is_counted_and_memory_kept() -> None:
    lm = ScriptedLM(lambda call: "not json" if is_write(call) else LONG_REPLY)
    policy = build_policy("in_context:variant=paper")
    state = run(policy, lm, ["a", "b", "c"])
    assert state.parse_failures == {"write": 1}
    assert state.memory == []


# ----- AWE ---------------------------------------------------------------------------------------


def test_paper_external_retrieves_30_with_the_full_question_prompt_as_query() -> None:
    embedder = CountingEmbedder()
    policy = build_policy("external:variant=paper", embedder=embedder)
    assert policy.top_k == 30
    assert build_policy("external:variant=paper,top_k=7", embedder=embedder).top_k == 7
    state = policy.initial_state()
    policy._store(state, [f"fact {i}" for i in range(40)], "2025-03-01 09:00")
    lm = paper_lm()
    answer = ask(policy, lm, state)
    query = embedder.texts[-1]
    assert query.startswith(QUESTION) and "2: a city break" in query and '"answer"' in query
    assert len(answer.retrieved) == 30
    system = lm.calls[-1].messages[0]["content"]
    assert system.count("\n- fact ") == 30
    # The act query is the user message as sent, time header included.
    run(policy, lm, ["[Current Time: 2025-03-02 10:00]\nbook me a table"], state=state)
    assert embedder.texts[-1] == "[Current Time: 2025-03-02 10:00]\nbook me a table"


def test_paper_external_writes_in_two_steps_extraction_then_events() -> None:
    embedder = CountingEmbedder()
    policy = build_policy("external:variant=paper", embedder=embedder)
    state = policy.initial_state()
    policy._store(state, ["The user lives in Rome.", "The user owns a cat."], "2025-01-01 09:00")
    rome, cat = (m.id for m in state.memories)
    calls: list[str] = []

    def respond(call: ScriptedCall) -> str:
        if not is_write(call):
            return LONG_REPLY
        text = call.messages[0]["content"]
        if '"facts"' in text:
            calls.append("extract")
            return json.dumps({"facts": ["The user lives in Oslo.", "The user is vegan."]})
        calls.append("update")
        assert f"[{rome}] The user lives in Rome." in text  # related memories, with ids
        assert "The user lives in Oslo.\nThe user is vegan." in text  # the new facts
        events = [
            {"event": "UPDATE", "id": rome, "text": "The user lives in Oslo."},
            {"event": "ADD", "id": 0, "text": "The user is vegan."},
            {"event": "DELETE", "id": cat, "text": ""},
            {"event": "DELETE", "id": 999, "text": ""},  # unknown id: counted, skipped
        ]
        return json.dumps({"events": events})

    lm = ScriptedLM(respond)
    state = run(policy, lm, ["[Current Time: 2025-03-01 09:00]\nI moved to Oslo.", "b", "c"], state)
    assert calls == ["extract", "update"]
    extraction = next(c for c in lm.calls if is_write(c)).messages[0]["content"]
    assert "user: USER INPUT: [Current Time: 2025-03-01 09:00]\nI moved to Oslo." in extraction
    assert f"assistant: ASSISTANT RESPONSE: {LONG_REPLY}" in extraction
    assert sorted(m.text for m in state.memories) == [
        "The user is vegan.",
        "The user lives in Oslo.",
    ]
    assert state.parse_failures == {"write.invalid": 1}
    assert "write.update" in policy.components()


def test_paper_external_makes_no_update_call_without_facts() -> None:
    lm = ScriptedLM(lambda call: json.dumps({"facts": []}) if is_write(call) else LONG_REPLY)
    policy = build_policy("external:variant=paper", embedder=CountingEmbedder())
    run(policy, lm, ["a", "b", "c"])
    assert sum(is_write(c) for c in lm.calls) == 1


# ----- RAG ---------------------------------------------------------------------------------------


def test_paper_raw_rag_stores_one_memory_per_message_and_retrieves_30() -> None:
    embedder = CountingEmbedder()
    policy = build_policy("raw_rag:variant=paper", embedder=embedder)
    assert policy.top_k == 30
    lm = paper_lm()
    state = run(policy, lm, ["[Current Time: 2025-03-01 09:00]\nI moved to Oslo.", "b", "c"])
    assert [m.text for m in state.memories] == [
        "USER INPUT: [Current Time: 2025-03-01 09:00]\nI moved to Oslo.",
        f"ASSISTANT RESPONSE: {LONG_REPLY}",
    ]
    assert not any(is_write(c) for c in lm.calls)  # no LLM write
    evolve = build_policy("raw_rag", embedder=embedder)
    assert evolve.top_k == 4
    assert len(run(evolve, agent(), ["a", "b", "c"]).memories) == 1  # one chunk per flush


# ----- variant bookkeeping ------------------------------------------------------------------------


def test_variant_is_parsed_recorded_in_bundle_and_identity(tmp_path) -> None:
    assert parse_spec("in_context:variant=paper,update_every=3") == (
        "in_context",
        {"variant": "paper", "update_every": 3},
    )
    with pytest.raises(PolicyError, match="variant .* must be one of paper, evolve, got 'papr'"):
        build_policy("native:variant=papr")
    policy = build_policy({"kind": "in_context", "variant": "paper"})
    assert policy.variant == "paper"
    assert build_policy("in_context").variant == "evolve"
    policy.save(tmp_path / "b")
    bundle = json.loads((tmp_path / "b" / "policy.json").read_text())
    assert bundle["variant"] == "paper" and "preset" not in bundle
    loaded = load(tmp_path / "b")
    assert loaded.variant == "paper" and loaded.components() == policy.components()
    # Same kind, parameters and instructions, other variant: the identity still tells them
    # apart. It keeps the old key "preset": run hashes include it (see MemoryPolicy.identity).
    evolve = build_policy("in_context").with_components(policy.components())
    assert evolve.components() == policy.components()
    assert evolve.identity() != policy.identity()
    assert policy.identity()["preset"] == "paper"


def test_old_bundles_without_variant_load_as_evolve(tmp_path) -> None:
    policy = build_policy("in_context")
    policy.save(tmp_path)
    path = tmp_path / "policy.json"
    bundle = json.loads(path.read_text())
    del bundle["variant"]
    path.write_text(json.dumps(bundle))
    assert load(tmp_path).variant == "evolve"


def test_default_variant_applies_only_when_the_spec_names_none(tmp_path) -> None:
    assert build_policy("native", default_variant="paper").variant == "paper"
    assert build_policy("native:variant=evolve", default_variant="paper").variant == "evolve"
    assert build_policy({"kind": "native", "variant": None}, default_variant="paper").variant == (
        "paper"
    )
    build_policy("raw_rag", embedder=CountingEmbedder()).save(tmp_path)
    assert build_policy(str(tmp_path), default_variant="paper").variant == "evolve"  # bundle's


# ----- in_context_oracle ------------------------------------------------------------------------

SCHEMA = {"travel_style": ["budget", "luxury"], "housing_type": ["flat", "house"]}


@pytest.mark.parametrize("variant", ["paper", "evolve"])
def test_oracle_types_list_is_the_users_own_state_variables(variant: str) -> None:
    policy = build_policy(f"in_context_oracle:variant={variant}")
    state = policy.initial_state(state_schema=SCHEMA)
    assert isinstance(state, InContextOracleState)
    assert state.types_to_remember == ["travel_style", "housing_type"]
    updates = {"travel_style": "luxury"}
    if variant == "paper":
        lm = paper_lm(writes=[updates])
    else:
        lm = agent(updates=[{"label": "travel_style", "value": "luxury"}])
    state = run(policy, lm, ["a", "b", "c"], state)
    write = next(c for c in lm.calls if "Types of Information to Remember:" in c.text)
    types = write.text.split("Types of Information to Remember:\n", 1)[1]
    # (DSPy's JSON adapter indents instruction lines; the paper adapter sends them as they are)
    assert " ".join(types.split()).startswith("1. travel_style 2. housing_type")
    assert not any(t.split(". ", 1)[1] in write.text for t in SEVEN_TYPES)
    assert "budget" not in write.text  # names only, never the values
    assert [(e.label, e.value) for e in state.memory] == [("travel_style", "luxury")]
    assert set(policy.components()) == {"write", "use"}
    # The types travel with the state: a checkpoint resumes with them.
    resumed = policy.state_from_json(state.model_dump_json())
    assert resumed.types_to_remember == state.types_to_remember


def test_oracle_needs_the_state_schema() -> None:
    policy = build_policy("in_context_oracle")
    with pytest.raises(PolicyError, match="needs the user's state schema"):
        policy.initial_state()
    with pytest.raises(PolicyError, match="must not contain"):
        policy.with_components({"write": "x\n\nTypes of Information to Remember:\ny"})


def test_oracle_state_is_not_an_in_context_state_for_the_plain_policy() -> None:
    oracle = build_policy("in_context_oracle").initial_state(state_schema=SCHEMA)
    with pytest.raises(PolicyError, match="of kind 'in_context_oracle'"):
        build_policy("in_context").state_from_json(oracle.model_dump_json())


def test_messages_are_chat_turns_in_observe_too() -> None:
    """Off-policy ingestion feeds the same history the paper chat path sends."""
    lm = paper_lm()
    policy = build_policy("native:variant=paper")
    state = policy.observe(
        policy.initial_state(),
        [Message(role="user", content="u1"), Message(role="assistant", content="a1")],
    )
    ask(policy, lm, state)
    assert lm.calls[-1].messages[:2] == [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
    ]
