"""The stub server's scripted mode: role-aware answers both implementations parse, and the log.

The reference fixture and the request comparison rest on it (tests/simulator/
test_reference_fixture.py, test_reference_requests.py); these pin the branches it must reach.
"""

from __future__ import annotations

import json
import urllib.request

from stub_server import StubServer, stub_openai_server

from memory_policies.paper import load_reference_json, paper_question_prompt

Script = stub_openai_server.Script
guess_role = stub_openai_server.guess_role

SCHEMA = {"travel_style": ["budget", "luxury"], "housing_type": ["house", "flat", "boat"]}


def chat(*messages: tuple[str, str], **extra) -> dict:
    return {"messages": [{"role": r, "content": c} for r, c in messages], **extra}


def test_every_fourth_answer_is_unparseable_so_the_reference_falls_back_to_random():
    script = Script()
    question = paper_question_prompt("Where should I go?", ["beach", "city", "hills"])
    request = chat(("user", "hello"), ("assistant", "hi"), ("user", question))
    assert guess_role(request) == "answer"
    answers = []
    for _ in range(8):
        role, content = script.chat(request)
        try:
            answers.append(load_reference_json(content)["answer"])
        except ValueError:
            answers.append(None)
    assert answers == [1, 2, 3, None, 2, 3, 1, None]
    # With the state given and JSON mode it is the upper bound, never unparseable.
    upper = chat(("user", question), response_format={"type": "json_object"})
    assert guess_role(upper) == "upper_bound"
    assert all("answer" in load_reference_json(script.chat(upper)[1]) for _ in range(8))


def test_probes_fill_the_real_variables_with_cycling_values_and_sometimes_placeholders():
    script = Script()
    probe = f"What is true for me now?\n{json.dumps(SCHEMA, indent=2)}\nReply in JSON."
    request = chat(("system", "memories: none"), ("user", "hi"), ("user", probe))
    assert guess_role(request) == "probe"
    replies = [load_reference_json(script.chat(request)[1]) for _ in range(5)]
    assert replies[:4] == [
        {"travel_style": "budget", "housing_type": "flat"},
        {"travel_style": "luxury", "housing_type": "boat"},
        {"travel_style": "budget", "housing_type": "house"},
        {"travel_style": "luxury", "housing_type": "flat"},
    ]
    assert not set(replies[4]) & set(SCHEMA)  # placeholder keys: every variable missing
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
        vectors = post("/embeddings", {"model": "e", "input": ["a cat", "a cat", "a dog"]})
    assert "(reply 0)" in reply["choices"][0]["message"]["content"]
    first, second, third = (row["embedding"] for row in vectors["data"])
    assert len(first) == 1536 and first == second and first != third
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["tag"], e["role"]) for e in entries] == [
        ("reference native overall", "reply"),
        ("reference native overall", "embedding"),
    ]
    assert entries[0]["temperature"] == 0.2 and entries[0]["max_tokens"] == 64
    assert entries[0]["messages"] == [{"role": "user", "content": "Any tips?"}]
