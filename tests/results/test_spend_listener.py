"""The one spend listener (`evolve.results.budget.SpendListener`): what `evolve run`'s budget,
`evolve eval` and a tuning study journal, through one code path."""

from __future__ import annotations

import json
from pathlib import Path

from evolve.llm.usage import UsageTracker
from evolve.results.budget import SpendJournal, SpendListener
from evolve.tuning.spend import StudySpendJournals


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_request_is_on_disk_before_it_is_sent(tmp_path):
    """The tracker tells its listeners before the transport sends; the line must be in the file
    (flushed, as another process reading it after a kill -9 sees it) by then."""
    tracker = UsageTracker()
    listener = SpendListener(tracker, SpendJournal(tmp_path / "spend.jsonl").open())
    started = tracker.request_started("agent")  # the transport sends after this returns
    on_disk = _lines(tmp_path / "spend.jsonl")  # a fresh handle: only what was flushed
    assert on_disk[-1] == {
        "request": started.request_id,
        "role": "agent",
        "state": "started",
        "wall_s": on_disk[-1]["wall_s"],
    }
    tracker.request_ended(started, failed=False, status=200)
    tracker.record(
        "agent", {"prompt_tokens": 5, "completion_tokens": 2}, 0.1, requests_recorded=True
    )
    listener.close()
    spend = SpendJournal(tmp_path / "spend.jsonl").total()
    assert (spend.requests, spend.tokens, spend.unknown_outcome) == (1, 7, 0)


def test_wall_time_continues_from_earlier_invocations_and_is_marked_at_close(tmp_path):
    tracker = UsageTracker()
    listener = SpendListener(tracker, SpendJournal(tmp_path / "s.jsonl").open(), wall_before=50.0)
    tracker.record("agent", {}, 0.0)  # a cache hit
    listener.close(mark_wall_time=True)
    tracker.record("agent", {"prompt_tokens": 1}, 0.0)  # after close: not journaled
    lines = _lines(tmp_path / "s.jsonl")
    assert len(lines) == 2 and lines[0]["cache_hit"] is True and set(lines[1]) == {"wall_s"}
    assert 50.0 <= lines[0]["wall_s"] <= lines[1]["wall_s"] < 60.0


def test_a_redirected_block_gets_its_own_file_and_a_request_ends_where_it_started(tmp_path):
    tracker = UsageTracker()
    journals = StudySpendJournals(tmp_path, "study")
    listener = journals.listener(tracker, worker=False)
    assert journals.files() == []  # the process file opens on its first event
    with journals.trial(listener, 3):
        started = tracker.request_started("agent")
    tracker.request_ended(started, failed=False, status=200)  # after its trial ended
    tracker.record("simulator", {"prompt_tokens": 2}, 0.0)
    listener.close()
    names = [path.name for path in journals.files()]
    assert names == ["main.jsonl", "trial-0003.jsonl"]
    trial = _lines(journals.directory / "trial-0003.jsonl")
    assert [line.get("state") for line in trial] == ["started"]  # its file was closed
    main = _lines(journals.directory / "main.jsonl")
    assert [line.get("role") for line in main] == ["simulator"]
    spend = journals.trial_spend()[3]
    assert (spend.requests, spend.unknown_outcome) == (1, 1)


def test_a_torn_last_line_is_cut_and_garbage_sets_the_journal_aside(tmp_path, caplog):
    path = tmp_path / "spend.jsonl"
    journal = SpendJournal(path).open()
    journal.record_call(
        role="agent",
        prompt_tokens=5,
        completion_tokens=2,
        cache_hit=False,
        failed=False,
        wall_time_s=1.0,
    )
    journal.close()
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"role": "agent", "prom')  # a crash mid-write
    assert SpendJournal(path).total().tokens == 7
    SpendJournal(path).open().close()  # the torn line is cut, silently: it is expected
    assert not caplog.records
    assert path.read_text(encoding="utf-8").endswith("}\n")

    with open(path, "a", encoding="utf-8") as handle:
        handle.write("\x00garbage\n")  # damage, not a crash
    journal = SpendJournal(path)
    assert journal.total().tokens == 7 and journal.unreadable_lines == 1
    journal.open().close()
    warning = caplog.text
    assert "damaged run file" in warning and "spend.jsonl" in warning
    assert (tmp_path / "spend.jsonl.damaged").exists()
    fresh = SpendJournal(path)
    assert fresh.total().tokens == 7 and fresh.unreadable_lines == 0
