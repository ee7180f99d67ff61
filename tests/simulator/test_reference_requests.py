"""What each role is shown under `protocol = "paper"`, compared with the reference code's.

`tests/fixtures/reference_output/reference_requests.json` holds the reference code's requests
from one run against the scripted stub (`benchmarks/stub_openai_server.py --scripted --log`),
reduced to information items and call parameters (`benchmarks/request_reduction.py`; no prompt
text). Here our paper mode runs against the same stub on the same environment: `evolve eval
--protocol paper` for native, AWI (`in_context`), AWE (`external`) and RAG (`raw_rag`) with
the upper bound, and the shipped Table-3 specs' per-user evolution chains (question-only and
complete feedback; `simulator/paper_run.py`). Every
role's reduced requests must equal the reference's (calls, items per request, parameters, and
the distributions of turns, memories and facts shown), or the difference must be stated,
value for value, by a kept row of `evolve/spec/paper_deviations.toml`; and every difference a kept
row states must still be found.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from simulator.paper_run import FIXTURE, REPO, PaperRun

from evolve.spec.paper_deviations import COMPARED_ITEMS, read_deviations

DEVIATIONS = REPO / "evolve" / "spec" / "paper_deviations.toml"


def _load_reduction():
    name = "request_reduction"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, REPO / "benchmarks" / "request_reduction.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


reduction = _load_reduction()


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def our_requests(paper_run: PaperRun) -> list[dict[str, Any]]:
    """Our paper mode's requests against the scripted stub (`simulator/paper_run.py`), reduced."""
    environment = load(FIXTURE / "environment.json")
    return reduction.reduce_log(reduction.load_request_log(paper_run.log), environment)


def test_every_role_sees_what_the_reference_shows_or_a_kept_deviation_says_why(our_requests):
    ours = reduction.summarize(our_requests)
    theirs = reduction.summarize(load(FIXTURE / "reference_requests.json"))
    deviations = read_deviations(DEVIATIONS)
    differences = reduction.compare(ours, theirs, deviations)
    undocumented = [d.describe() for d in differences if d.covered_by is None]
    assert not undocumented, "undocumented differences from the reference:\n" + "\n".join(
        undocumented
    )
    # No kept row states a difference that is not there (a stale row would accept its
    # values if a regression brought them back).
    used = {
        (row.id, index)
        for d in differences
        for row in deviations
        for index, e in enumerate(row.expect)
        if row.id == d.covered_by
        and e.matches(d.key.split("/")[1], d.key.split("/")[2], d.item, d.ours, d.theirs)
    }
    stale = [
        f"{row.id}: {e.item} ours {e.ours!r} reference {e.reference!r}"
        for row in deviations
        if row.status == "kept"
        for index, e in enumerate(row.expect)
        if (row.id, index) not in used
    ]
    assert not stale, "kept rows expect differences the comparison no longer finds:\n" + (
        "\n".join(stale)
    )
    # Every role of the paper's information flow was exercised on both sides.
    roles = {key.split("/", 1)[0] for key in theirs}
    expected = {"user", "native", "awi", "awe", "rag", "upper_bound", "probe", "reflector"}
    assert expected | {"embedder"} <= roles
    assert roles <= {key.split("/", 1)[0] for key in ours}


def test_the_reduced_reference_log_holds_no_prompt_text():
    text = (FIXTURE / "reference_requests.json").read_text(encoding="utf-8")
    entries = load(FIXTURE / "reference_requests.json")
    allowed = {"role", "policy", "call", "items", "embedding_model", *reduction.PARAMETERS}
    allowed |= {*reduction.QUANTITIES, "user_period", "headed_inputs"}
    assert all(set(entry) <= allowed for entry in entries)
    assert all(set(entry.get("items", [])) <= set(reduction.ITEMS) for entry in entries)
    assert "content" not in text and "Current Time" not in text


# ----- the comparison itself, on small hand-made summaries (no run) ----------------------------


def _summary(items_by_key: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    return {
        key: {
            "count": 1,
            "items": items,
            "temperature": [0.0],
            "max_tokens": [512],
            "response_format": ["none"],
        }
        for key, items in items_by_key.items()
    }


def _row(
    identifier: str, status: str, expect: list[tuple[str, Any, Any]] = (), **lists: list[str]
) -> str:
    """One `[[deviation]]` row of a scratch table, valid for `read_deviations`; `expect`:
    (item, ours, reference) per compared item."""
    fields = "".join(f"{key} = {json.dumps(values)}\n" for key, values in lists.items())
    expectations = "".join(
        f"[[deviation.expect]]\nitem = {json.dumps(item)}\nours = {json.dumps(ours)}\n"
        f"reference = {json.dumps(reference)}\n"
        for item, ours, reference in expect
    )
    return (
        f'[[deviation]]\nid = "{identifier}"\nstatus = "{status}"\n{fields}'
        'ours = "o"\nreference = "r"\nwhy = "w"\naffects = "a"\n' + expectations
    )


def test_a_scratch_table_is_checked_as_the_packaged_one_is(tmp_path):
    table = tmp_path / "deviations.toml"
    table.write_text(_row("user-sees-state", "kept", roles=["user"], items=["state"]))
    with pytest.raises(ValueError, match=r"deviations\.toml: deviation user-sees-state: id"):
        read_deviations(table)
    table.write_text(_row("unknown_item", "kept", roles=["user"], items=["mood"]))
    with pytest.raises(ValueError, match="unknown item"):
        read_deviations(table)
    # A kept row covering a compared item must state the value on each side.
    table.write_text(_row("vague", "kept", roles=["user"], items=["state"]))
    with pytest.raises(ValueError, match=r"deviation vague: .*without an expect entry"):
        read_deviations(table)


def test_an_undocumented_difference_names_role_item_ours_and_theirs(tmp_path):
    ours = _summary({"user/native/user": ["profile", "schema", "state"]})
    theirs = _summary({"user/native/user": ["profile", "schema"]})
    (difference,) = reduction.compare(ours, theirs, [])
    assert difference.covered_by is None
    assert difference.describe() == ("role user/native/user: state: ours True, reference False")
    table = tmp_path / "deviations.toml"
    table.write_text(
        _row("user_sees_state", "kept", [("state", True, False)], roles=["user"], items=["state"])
        + _row("history", "closed", roles=["native"], items=["state"])
    )
    (covered,) = reduction.compare(ours, theirs, read_deviations(table))
    assert covered.covered_by == "user_sees_state"
    # The row accepts only the values it states: the reverse difference is not covered.
    (reverse,) = reduction.compare(theirs, ours, read_deviations(table))
    assert reverse.covered_by is None
    # A closed row is history: it covers nothing, and a row of another role neither.
    ours = _summary({"native/native/reply": ["state"]})
    theirs = _summary({"native/native/reply": []})
    (uncovered,) = reduction.compare(ours, theirs, read_deviations(table))
    assert uncovered.covered_by is None


def test_a_row_naming_policies_covers_only_their_runs(tmp_path):
    table = tmp_path / "deviations.toml"
    table.write_text(
        _row(
            "awe_store",
            "kept",
            [("memory", True, False)],
            roles=["probe"],
            items=["memory"],
            policies=["awe"],
        )
    )
    ours = _summary({"probe/awe/probe": ["memory"], "probe/awi/probe": []})
    theirs = _summary({"probe/awe/probe": [], "probe/awi/probe": ["memory"]})
    found = reduction.compare(ours, theirs, read_deviations(table))
    assert {d.key: d.covered_by for d in found} == {
        "probe/awe/probe": "awe_store",
        "probe/awi/probe": None,
    }


def test_a_changed_parameter_or_a_missing_call_is_a_difference():
    ours = _summary({"probe/awi/probe": ["schema"]})
    theirs = _summary({"probe/awi/probe": ["schema"], "reflector/-/reflector": ["question"]})
    ours["probe/awi/probe"]["max_tokens"] = [8192]
    found = {(d.key, d.item) for d in reduction.compare(ours, theirs, [])}
    assert found == {("probe/awi/probe", "max_tokens"), ("reflector/-/reflector", "calls")}


def _entry(items: list[str], turns: int = 0, memories: int = 0) -> dict[str, Any]:
    return {
        "role": "native",
        "policy": "native",
        "call": "reply",
        "items": items,
        "temperature": 0.0,
        "max_tokens": 512,
        "response_format": "none",
        "turns": turns,
        "memories": memories,
        "facts": 0,
    }


def test_counts_and_per_request_item_sets_are_compared_not_unioned():
    theirs = reduction.summarize([_entry([], 0), _entry(["last_messages"], 2)])
    # The same union of items, but the history shows up twice as often and once shorter.
    ours = reduction.summarize(
        [_entry(["last_messages"], 1), _entry(["last_messages"], 2), _entry([], 0)]
    )
    found = {d.item: (d.ours, d.theirs) for d in reduction.compare(ours, theirs, [])}
    assert found == {
        "calls": (3, 2),
        "items_per_request": ([["", 1], ["last_messages", 2]], [["", 1], ["last_messages", 1]]),
        "turns": ([[0, 1], [1, 1], [2, 1]], [[0, 1], [2, 1]]),
        "memories": ([[0, 3]], [[0, 2]]),
        "facts": ([[0, 3]], [[0, 2]]),
    }


def test_a_request_belongs_to_the_user_period_of_the_latest_opening_it_quotes():
    environment = [
        {
            "id": "u0",
            "periods": [
                {"sessions": [{"session_time": "2024-01-01 10:00:00"}]},
                {"sessions": [{"session_time": "2024-02-01 10:00:00"}]},
            ],
        }
    ]
    strings = reduction._environment_strings(environment)
    history = (
        "[Current Time: 2024-01-01 10:00:00]\nhi (reply 1) [Current Time: 2024-02-01 10:00:00]"
    )
    quoting = {"messages": [{"role": "user", "content": history}]}
    assert reduction.request_user_period(quoting, strings) == "u0/p1"
    assert reduction.request_user_period({"messages": []}, strings) == "-"
    ours = reduction.summarize([{**_entry([]), "user_period": "u0/p1"}])
    theirs = reduction.summarize([{**_entry([]), "user_period": "u0/p0"}])
    (found,) = reduction.compare(ours, theirs, [])
    assert (found.item, found.ours, found.theirs) == (
        "calls_per_user_period",
        [["u0/p1", 1]],
        [["u0/p0", 1]],
    )


def test_a_request_shows_its_own_period_end_or_not():
    environment = [
        {
            "id": "u0",
            "start_time": "2024-01-01",
            "periods": [{"period_end": "2024-01-31"}, {"period_end": "2024-02-28"}],
        }
    ]
    strings = reduction._environment_strings(environment)
    today = {"messages": [{"role": "user", "content": "today is 2024-02-28"}]}
    other = {"messages": [{"role": "user", "content": "today is 2024-01-31"}]}
    assert reduction.shows_own_period_end(today, strings, "u0/p1") == 1
    assert reduction.shows_own_period_end(other, strings, "u0/p1") == 0
    assert reduction.shows_own_period_end(today, strings, "-") == 0


def test_the_stub_marks_facts_apart_from_stored_memories():
    entry = {
        "role": "update",
        "messages": [
            {"role": "user", "content": "Old: MEMO-3 MEMO-4 MEMO-3. New facts: FACT-7, FACT-8"}
        ],
    }
    assert reduction.request_quantities(entry) == {
        "turns": 0,
        "memories": 2,
        "facts": 2,
        "turn_labels": 0,
    }


def test_every_row_of_the_deviation_table_uses_the_vocabulary():
    roles = {"user", "native", "awi", "awe", "rag", "upper_bound", "probe", "reflector"}
    roles |= {"embedder"}
    items = set(reduction.ITEMS) | set(reduction.PARAMETERS)
    items |= {"feedback", "model", "embedding_model", "parsing", "calls", "wording"}
    items |= {"calls_per_user_period", "items_per_request", *reduction.QUANTITIES, "headed_inputs"}
    # Every measure the comparison reports is one a kept row must state value for value.
    assert items - {"feedback", "model", "parsing", "wording"} <= set(COMPARED_ITEMS)
    rows = read_deviations(DEVIATIONS)  # valid rows, unique ids
    for row in rows:
        assert set(row.roles) <= roles, row.id
        assert set(row.items) <= items, row.id
        assert set(row.policies) <= {*reduction.POLICIES, "awi-evolve"}, row.id


def test_a_request_moved_to_another_period_is_a_difference_where_the_role_agrees():
    def entry(where: str, turns: int) -> dict[str, Any]:
        return {**_entry(["last_messages"], turns), "user_period": where}

    theirs = reduction.summarize([entry("u0/p0", 2), entry("u0/p1", 4)])
    # The same turns over the role, and the same calls per period, but swapped.
    ours = reduction.summarize([entry("u0/p0", 4), entry("u0/p1", 2)])
    (found,) = reduction.compare(ours, theirs, [])
    assert found.item == "turns_by_user_period"
    assert (found.ours, found.theirs) == (
        [[("u0/p0", 4), 1], [("u0/p1", 2), 1]],
        [[("u0/p0", 2), 1], [("u0/p1", 4), 1]],
    )
    # Where the role's distribution differs, that difference is reported, once.
    longer = reduction.summarize([entry("u0/p0", 2), entry("u0/p1", 6)])
    assert [d.item for d in reduction.compare(longer, theirs, [])] == ["turns"]


def test_a_request_shows_its_users_start_date_and_its_memories_oldest_first_or_not():
    environment = [{"id": "u0", "start_time": "2024-01-01", "periods": []}]
    strings = reduction._environment_strings(environment)
    profile = {"messages": [{"role": "user", "content": "since 2024-01-01 I live in Oslo"}]}
    assert reduction.shows_start_date(profile, strings, "u0/p0") == 1
    assert reduction.shows_start_date({"messages": []}, strings, "u0/p0") == 0

    def shown(*marks: str) -> dict[str, Any]:
        return {"role": "reply", "messages": [{"role": "user", "content": " ".join(marks)}]}

    first_seen: dict[int, int] = {}
    # MEMO-10 and MEMO-11 are one batch (one mem0 update adds MEMO-5n..5n+4): in any order.
    assert reduction.memory_order(shown("MEMO-11", "MEMO-10"), first_seen, 0) == 1
    assert reduction.memory_order(shown("MEMO-10", "MEMO-20"), first_seen, 1) == 1
    assert reduction.memory_order(shown("MEMO-20", "MEMO-12"), first_seen, 2) == 0  # newest first
