"""The stub server's scripted mode: role-aware answers both implementations parse, and the log.

The reference fixture and the request comparison rest on it (tests/simulator/
test_reference_fixture.py, test_reference_requests.py); these pin the branches it must reach.
"""

from __future__ import annotations

import json
import re
import urllib.request

from stub_server import StubServer, stub_openai_server

from memory_policies.paper import load_reference_json, paper_question_prompt

Script = stub_openai_server.Script
guess_role = stub_openai_server.guess_role

SCHEMA = {"travel_style": ["budget", "luxury"], "housing_type": ["house", "flat", "boat"]}


def chat(*messages: tuple[str, str], **extra) -> dict:
    return {"messages": [{"role": r, "content": c} for r, c in messages], **extra}


def _answer(content: str) -> int | None:
    try:
        return load_reference_json(content)["answer"]
    except ValueError:
        return None


def test_answers_are_a_function_of_the_question_not_of_the_order_requests_arrive_in():
    questions = [
        paper_question_prompt(f"Where should I go on trip {k}?", ["beach", "city", "hills"])
        for k in range(40)
    ]
    requests = [chat(("user", "hello"), ("assistant", "hi"), ("user", q)) for q in questions]
    assert {guess_role(r) for r in requests} == {"answer"}
    first = [_answer(Script().chat(r)[1]) for r in requests]
    # Another server, the requests in reverse order, each asked twice: the same answers.
    script = Script()
    again = [_answer(script.chat(r)[1]) for r in reversed(requests)][::-1]
    assert again == first == [_answer(script.chat(r)[1]) for r in requests]
    # Unmarked conversation before the question does not change the answer; every option is
    # picked, and about one answer in eight is unparseable (the reference's random fallback).
    elsewhere = chat(("user", "other history"), ("user", questions[0]))
    assert _answer(Script().chat(elsewhere)[1]) == first[0]
    assert {1, 2, 3} <= set(first)
    assert 2 <= first.count(None) <= 10


def test_an_answer_depends_on_which_marked_memories_are_shown_not_on_their_wording():
    """A memory stored, dropped or retrieved differently changes answers, as it would a
    model's; the same memories in another codebase's wording and order do not."""
    questions = [
        paper_question_prompt(f"Which gift suits me, case {k}?", ["book", "plant", "tea", "pen"])
        for k in range(40)
    ]

    def answers(system: str) -> list[int | None]:
        return [_answer(Script().chat(chat(("system", system), ("user", q)))[1]) for q in questions]

    shown = answers("Memories:\n- MEMO-11: likes tea\n- MEMO-12: has a garden")
    reworded = answers("Relevant user memories (earliest first):\nMEMO-12: x\nMEMO-11: y")
    one_dropped = answers("Memories:\n- MEMO-11: likes tea")
    assert reworded == shown
    assert sum(a != b for a, b in zip(shown, one_dropped, strict=True)) >= 10


def test_the_upper_bound_answers_the_option_the_shown_state_makes_right(tmp_path):
    qas = [
        {
            "query": f"Which plan suits me, case {k}?",
            "required_info": ["travel_style"],
            "answer_choices": [
                {"answer": f"budget plan {k}", "state": ["budget"]},
                {"answer": f"luxury plan {k}", "state": ["luxury"]},
                {"answer": f"mixed plan {k}", "state": ["mixed"]},
            ],
        }
        for k in range(60)
    ]
    environment = tmp_path / "environment.json"
    environment.write_text(json.dumps([{"id": "u0", "qas": qas}]))
    script = Script(environment=environment)
    answers, rights = [], []
    for qa in qas:
        options = [choice["answer"] for choice in qa["answer_choices"]]
        for right, choice in enumerate(qa["answer_choices"], start=1):
            state = json.dumps({"travel_style": choice["state"][0]}, indent=2)
            prompt = paper_question_prompt(qa["query"], options).replace(
                "\n\n", f"\n\nGiven my state:\n{state}\n\n", 1
            )
            upper = chat(("user", prompt), response_format={"type": "json_object"})
            assert guess_role(upper) == "upper_bound"
            content = script.chat(upper)[1]
            assert content == Script(environment=environment).chat(upper)[1]
            answers.append(_answer(content) if "answer" in content else None)
            rights.append(right)
    right_share = sum(a == r for a, r in zip(answers, rights, strict=True)) / len(rights)
    assert 0.7 <= right_share <= 0.9
    wrong = {a for a, r in zip(answers, rights, strict=True) if a != r}
    # Every wrong form the reference must survive: another option, 0, -1, true, no JSON.
    assert {0, -1, True, None} <= wrong and wrong - {0, -1, True, None}
    # Without the environment the stub cannot know the right option: it picks by content.
    assert Script().chat(upper)[1] != "" and guess_role(upper) == "upper_bound"


def test_probes_fill_the_real_variables_by_content_and_sometimes_placeholders():
    script = Script()
    replies = []
    for k in range(30):
        schema = {f"{name}_{k}": choices for name, choices in SCHEMA.items()}
        probe = f"What is true for me now?\n{json.dumps(schema, indent=2)}\nReply in JSON."
        request = chat(("system", f"memories: {k}"), ("user", "hi"), ("user", probe))
        assert guess_role(request) == "probe"
        reply = load_reference_json(script.chat(request)[1])
        # The memories shown do not matter, the variables asked do.
        other = chat(("system", "memories: none"), ("user", "hey"), ("user", probe))
        assert load_reference_json(Script().chat(other)[1]) == reply
        replies.append((schema, reply))
    filled = [reply for schema, reply in replies if set(reply) == set(schema)]
    placeholders = [reply for schema, reply in replies if not set(reply) & set(schema)]
    assert len(filled) + len(placeholders) == 30 and 2 <= len(placeholders) <= 12
    picked = {value for reply in filled for value in reply.values()}
    assert {"budget", "luxury", "house", "flat", "boat"} <= picked
    # The same schema alone in one plain message is the reference's simulated user.
    assert guess_role(chat(("user", probe))) == "user"


def test_memory_writes_mem0_calls_and_the_reflector_get_what_they_parse():
    script = Script()
    json_mode = {"response_format": {"type": "json_object"}}
    write = chat(("user", "Update the memory from this conversation."), **json_mode)
    extract = chat(("system", 'Return {"facts": [...]}'), ("user", "Input: hi"), **json_mode)
    update = chat(("user", "Decide ADD, UPDATE, DELETE or NONE per event."), **json_mode)
    reflect = chat(("system", ""), ("user", 'Return {"new_types": "...", "changes": []}'))
    assert [guess_role(r) for r in (write, extract, update, reflect)] == [
        "write",
        "extract",
        "update",
        "reflector",
    ]
    assert "MEMO-" in json.dumps(json.loads(script.chat(write)[1]))
    assert json.loads(script.chat(extract)[1])["facts"]
    assert json.loads(script.chat(update)[1])["memory"][0]["event"] == "ADD"
    proposal = load_reference_json(script.chat(reflect)[1])
    assert proposal["new_types"] and proposal["changes"]


def test_the_log_records_each_request_with_its_tag_and_embeddings_are_served(tmp_path):
    log = tmp_path / "requests.jsonl"
    with StubServer(latency=0.0, scripted=True, log=log) as stub:
        stub.tag("reference native overall")

        def post(path: str, payload: dict) -> dict:
            request = urllib.request.Request(
                f"{stub.base_url}{path}",
                data=json.dumps(payload).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.loads(response.read())

        reply = post(
            "/chat/completions",
            chat(("user", "Any tips?"), model="m", temperature=0.2, max_tokens=64),
        )
        texts = ["MEMO-1: a cat", "The memory MEMO-1 says: cat", "MEMO-2: a cat"]
        vectors = post("/embeddings", {"model": "e", "input": texts})
    assert re.search(r"\(reply \d+\)", reply["choices"][0]["message"]["content"])
    first, second, third = (row["embedding"] for row in vectors["data"])
    # A vector is a function of the marks a text carries, not of its wording; unit length.
    assert len(first) == 1536 and first == second and first != third
    assert abs(sum(x * x for x in third) - 1.0) < 1e-9
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["tag"], e["role"]) for e in entries] == [
        ("reference native overall", "reply"),
        ("reference native overall", "embedding"),
    ]
    assert entries[0]["temperature"] == 0.2 and entries[0]["max_tokens"] == 64
    assert entries[0]["messages"] == [{"role": "user", "content": "Any tips?"}]


def test_an_answer_is_the_number_printed_next_to_the_option_picked():
    prompt = paper_question_prompt("Where should I go?", ["beach", "city", "hills"])
    shifted = prompt.replace("1: beach", "0: beach").replace("2: city", "1: city")
    shifted = shifted.replace("3: hills", "2: hills")
    as_printed = _answer(Script().chat(chat(("user", prompt)))[1])
    # The same options numbered from 0: the same option picked, answered by its new number.
    assert _answer(Script().chat(chat(("user", shifted)))[1]) == as_printed - 1


def test_an_update_shown_five_stored_memories_rewrites_the_lowest_marked_one():
    """Instead of adding a fifth memory; the lowest mark, not the first listed, because the
    two codebases list related memories in different orders."""
    stored = "\n".join(f"[{k}] MEMO-{10 + k}: a stored memory" for k in (3, 4, 1, 5, 2))
    ours = chat(
        ("user", f'Decide ADD, UPDATE, DELETE or NONE; "events" list.\n{stored}\nFACT-3: new'),
        response_format={"type": "json_object"},
    )
    events = json.loads(Script().chat(ours)[1])["events"]
    assert [e["event"] for e in events] == ["UPDATE", "ADD", "ADD", "ADD", "ADD"]
    assert events[0]["id"] == 1 and "MEMO-" in events[0]["text"]
    # mem0's prompt lists the stored memories as a Python repr; fewer than five: only ADDs.
    listed = str(
        [{"id": str(k), "text": f"MEMO-{10 + k}: a stored memory"} for k in (2, 0, 1, 3, 4)]
    )
    reference = chat(
        ("user", f"Decide ADD, UPDATE, DELETE or NONE per event.\n{listed}\nFACT-3: new"),
        response_format={"type": "json_object"},
    )
    memory = json.loads(Script().chat(reference)[1])["memory"]
    assert memory[0]["event"] == "UPDATE" and memory[0]["id"] == "0"
    assert memory[0]["old_memory"].startswith("MEMO-10")
    fewer = chat(
        ("user", f"Decide ADD, UPDATE, DELETE or NONE per event.\n{listed[:60]}\nFACT-3: new"),
        response_format={"type": "json_object"},
    )
    assert {m["event"] for m in json.loads(Script().chat(fewer)[1])["memory"]} == {"ADD"}


def test_the_embedding_of_an_unmarked_text_is_that_of_the_environment_question_it_quotes(
    tmp_path,
):
    """Two codebases word their search queries differently around the same question: both
    get the question's vector, and every stored memory ranks in one strict order."""
    environment = tmp_path / "env.json"
    qa = {"query": "Which hobby suits me?", "required_info": [], "answer_choices": []}
    environment.write_text(json.dumps([{"qas": [qa]}]))
    script = Script(environment=environment)

    def vector(text: str) -> list[float]:
        return script.embed({"input": [text], "dimensions": 4})[0]

    ours = vector("Which hobby suits me?\n\nFrom the options below, pick one:\n1: chess")
    theirs = vector("Which hobby suits me?  Please select the most suitable answer: 1: chess")
    assert ours == theirs != vector("no question here")
    memories = [vector(f"MEMO-{k}: the same words") for k in range(50)]
    scores = [sum(a * b for a, b in zip(ours, m, strict=True)) for m in memories]
    assert len(set(scores)) == len(scores)  # no ties


def test_a_probe_is_answered_by_its_variables_and_the_latest_reply_shown():
    """Whatever memory a codebase shows before the latest exchange (ours shows a RAG probe its
    retrieved turns, the reference's shows none), the latest reply dates the probe."""
    probe = json.dumps(SCHEMA)
    latest = ("user", "(follow-up 5)"), ("assistant", "(reply 9)")
    bare = chat(*latest, ("user", f"Which values hold? {probe}"))
    with_memory = chat(
        ("system", "[Current Time: 2021-03-01 10:00:00] (reply 3)"),
        *latest,
        ("user", f"Which values hold? {probe}"),
    )
    assert guess_role(bare) == guess_role(with_memory) == "probe"
    assert Script().chat(bare)[1] == Script().chat(with_memory)[1]


def test_some_fact_extractions_find_nothing():
    extractions = [
        chat(
            ("user", f'Extract "facts" from: hi (reply {k})'),
            response_format={"type": "json_object"},
        )
        for k in range(60)
    ]
    facts = [json.loads(Script().chat(r)[1])["facts"] for r in extractions]
    assert any(f == [] for f in facts) and any(f for f in facts)


def test_the_log_records_the_sampling_settings_a_request_sets(tmp_path):
    log = tmp_path / "requests.jsonl"
    with StubServer(latency=0.0, scripted=True, log=log) as stub:
        request = urllib.request.Request(
            f"{stub.base_url}/chat/completions",
            data=json.dumps(chat(("user", "Any tips?"), seed=7, top_p=0.1)).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=5).read()
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["seed"] == 7 and entry["top_p"] == 0.1 and "stop" not in entry
