"""One usage record (`evolve.llm.usage.Usage`): it adds up, files written with the four older
record types (per-role usage, an episode unit's, a synthesis stage's, a spend ledger's) load
silently."""

from __future__ import annotations

import json

from strict_warnings import no_warnings

from evolve.llm.usage import Usage, UsageSummary, add_usage
from evolve.optimize.experiment_dir import ExperimentDir
from evolve.results.budget import SpendJournal
from evolve.simulator.records import PeriodResult
from evolve.simulator.synthesis.report import UserOutcome, sum_usage


def test_usage_adds_and_subtracts_field_by_field():
    a = Usage(calls=2, cache_hits=1, requests=1, prompt_tokens=10, completion_tokens=2)
    b = Usage(calls=1, failures=1, requests=2, prompt_tokens=5, latency_s=0.5, wall_time_s=1.0)
    total = a + b
    assert total == Usage(
        calls=3,
        cache_hits=1,
        failures=1,
        requests=3,
        prompt_tokens=15,
        completion_tokens=2,
        latency_s=0.5,
        wall_time_s=1.0,
    )
    assert total.tokens == 17
    assert total - b == a
    assert sum([a, b], Usage()) == total == sum_usage({"x": a, "y": b})


def test_a_breakdown_is_a_mapping_of_usages():
    target = {"agent": Usage(calls=1)}
    add_usage(target, {"agent": Usage(calls=2), "simulator": Usage(calls=5)})
    assert target == {"agent": Usage(calls=3), "simulator": Usage(calls=5)}
    summary = UsageSummary(roles=target)
    assert summary.total() == Usage(calls=8) and summary.total_calls == 8


def _period_json(usage: dict) -> dict:
    return {"user_id": "u", "period_index": 0, "state": {}, "usage": usage}


def test_stored_records_of_the_old_types_load_silently(tmp_path):
    with no_warnings():
        # An episode unit (`result.json` / `users/<u>/period_NN/`) before: llm_calls.
        period = PeriodResult.model_validate(
            _period_json({"llm_calls": 3, "prompt_tokens": 10, "completion_tokens": 5})
        )
        # A synthesis user's report entry: billed_calls (calls the server answered).
        outcome = UserOutcome.model_validate(
            {
                "user_id": "u",
                "status": "included",
                "usage": {
                    "profile": {
                        "calls": 4,
                        "billed_calls": 3,
                        "parse_failures": 1,
                        "rejected": 2,
                        "prompt_tokens": 7,
                        "completion_tokens": 1,
                    }
                },
            }
        )
        # A run folder's spend ledger, and a journal carrying one.
        (tmp_path / "ledger.json").write_text(
            json.dumps({"llm_calls": 7, "tokens": 70, "wall_time_s": 5.0, "unknown_outcome": 1})
        )
        ledger = ExperimentDir(tmp_path).load_spend()
        journal = tmp_path / "old.jsonl"
        journal.write_text(
            json.dumps({"carried": {"llm_calls": 2, "tokens": 20, "wall_time_s": 1.0}})
            + "\n"
            + json.dumps({"role": "agent", "prompt": 3, "completion": 1, "cache_hit": False})
            + "\n"
        )
        journaled = SpendJournal(journal).total()
    assert period.usage == Usage(calls=3, prompt_tokens=10, completion_tokens=5)
    assert outcome.usage["profile"] == Usage(
        calls=4, cache_hits=1, parse_failures=1, rejected=2, prompt_tokens=7, completion_tokens=1
    )
    assert (ledger.requests, ledger.tokens, ledger.wall_time_s, ledger.unknown_outcome) == (
        7,
        70,
        5.0,
        1,
    )
    assert (journaled.requests, journaled.tokens, journaled.wall_time_s) == (3, 24, 1.0)


def test_a_ledger_written_now_keeps_the_names_older_readers_know(tmp_path):
    store = ExperimentDir(tmp_path)
    spend = Usage(requests=4, prompt_tokens=30, completion_tokens=3, wall_time_s=2.0)
    store.save_spend(spend)
    stored = json.loads(store.ledger_file.read_text())
    assert (stored["llm_calls"], stored["tokens"], stored["wall_time_s"]) == (4, 33, 2.0)
    with no_warnings():
        assert store.load_spend() == spend  # both spellings in one file: the new ones win


def test_a_new_usage_dump_round_trips():
    usage = Usage(calls=2, cache_hits=1, requests=1, prompt_tokens=3, wall_time_s=1.5)
    assert Usage.model_validate(usage.model_dump(mode="json")) == usage


def test_tracked_usage_counts_the_calls_dspy_saw_and_their_tokens():
    from types import SimpleNamespace

    from evolve.llm.usage import tracked_usage

    tracker = SimpleNamespace(
        usage_data={
            "openai/a": [
                {"prompt_tokens": 4, "completion_tokens": 1},
                {"prompt_tokens": 2, "prompt_tokens_details": {"cached_tokens": 2}},
            ],
            "anthropic/b": [{"input_tokens": 3, "output_tokens": 5}],
        }
    )
    # Prompt-cache reuse depends on scheduling: not in a unit's record.
    assert tracked_usage(tracker) == Usage(calls=3, prompt_tokens=9, completion_tokens=6)
