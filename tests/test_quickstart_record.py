"""benchmarks/quickstart_record.py: a rerun that sent a request, asked a role more or less
often, or scored differently is reported as a change of behaviour; an identical one is not."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "quickstart_record.py"


@pytest.fixture(scope="module")
def quickstart_record():
    spec = importlib.util.spec_from_file_location("benchmark_quickstart_record", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write_run(root: Path, *, train_score: float, spend: list[dict]) -> Path:
    root.mkdir(parents=True)
    scores = {"score": train_score, "per_user": {"u0": train_score}, "summary": {"accuracy": 0.5}}
    result = {
        "best_id": "g00-c0",
        "candidates": [{"id": "g00-c0", "status": "accepted", "train": scores, "heldout": None}],
    }
    (root / "result.json").write_text(json.dumps(result))
    (root / "spend.jsonl").write_text("\n".join(json.dumps(line) for line in spend) + "\n")
    return root


COLD = [
    {"wall_s": 1.0},
    {"request": "a-1", "role": "agent", "state": "started", "wall_s": 1.1},
    {"request": "a-1", "state": "finished", "status": 200, "wall_s": 2.0},
    {"role": "agent", "cache_hit": False, "failed": False, "requests": 0, "wall_s": 2.0},
    {"role": "reflector", "cache_hit": True, "failed": False, "requests": 0, "wall_s": 2.1},
]
WARM = [
    {"role": "agent", "cache_hit": True, "failed": False, "requests": 0, "wall_s": 0.1},
    {"role": "reflector", "cache_hit": True, "failed": False, "requests": 0, "wall_s": 0.1},
]


def test_a_warm_identical_rerun_is_the_same(quickstart_record, tmp_path):
    before = quickstart_record.record(write_run(tmp_path / "a", train_score=0.4, spend=COLD))
    after = quickstart_record.record(write_run(tmp_path / "b", train_score=0.4, spend=WARM))
    assert before["roles"]["agent"] == {"calls": 1, "cache_hits": 0, "server_requests": 1}
    assert quickstart_record.compare(before, after) == []


@pytest.mark.parametrize(
    ("train_score", "spend", "expected"),
    [
        (0.5, WARM, "train"),
        (0.4, COLD, "requests reached the server"),
        (0.4, WARM[:1], "reflector: 1 calls -> 0"),
    ],
    ids=["score", "server-request", "fewer-calls"],
)
def test_a_changed_rerun_is_reported(quickstart_record, tmp_path, train_score, spend, expected):
    before = quickstart_record.record(write_run(tmp_path / "a", train_score=0.4, spend=COLD))
    after = quickstart_record.record(
        write_run(tmp_path / "b", train_score=train_score, spend=spend)
    )
    problems = quickstart_record.compare(before, after)
    assert any(expected in problem for problem in problems), problems


def test_the_journal_the_spend_listener_writes_is_read_per_role(quickstart_record, tmp_path):
    """The record reads `spend.jsonl` as `evolve run` writes it (the tracker's events through
    the one spend listener), not only the hand-written lines above."""
    from evolve.llm.usage import UsageTracker
    from evolve.results.budget import SpendJournal, SpendListener

    run = write_run(tmp_path / "run", train_score=0.4, spend=[{"wall_s": 0.0}])
    tracker = UsageTracker()
    listener = SpendListener(tracker, SpendJournal(run / "spend.jsonl").open())
    for _ in range(2):  # two agent calls the server answered, one request each
        started = tracker.request_started("agent")
        tracker.request_ended(started, failed=False, status=200)
        tracker.record("agent", {"prompt_tokens": 3}, 0.1, requests_recorded=True)
    tracker.record("agent", {}, 0.0)  # a response from DSPy's cache
    tracker.record("reflector", {}, 0.0)
    listener.close(mark_wall_time=True)
    recorded = quickstart_record.record(run)
    assert recorded["roles"] == {
        "agent": {"calls": 3, "cache_hits": 1, "server_requests": 2},
        "reflector": {"calls": 1, "cache_hits": 1, "server_requests": 0},
    }
    assert len(recorded["server_answered"]) == 2
    per_role = tracker.snapshot().roles  # the tracker's own counts agree
    assert (per_role["agent"].calls, per_role["agent"].cache_hits) == (3, 1)
    assert per_role["agent"].requests == 2
