"""Record an `evolve run`'s scores and LLM requests, or check a rerun against a record.

A refactoring that claims to change no behaviour can be checked end to end on the real
model: record the quickstart before it, rerun the same spec after it on a fresh `runs/`
directory with the same warm response cache, and compare. Same behaviour means the same
scores for every candidate, the same number of LLM calls per role (cache hits included:
the same prompts were asked), and no request reaching the server (every prompt was
already answered once, so a changed prompt shows up as a server request).

    .venv/bin/python benchmarks/quickstart_record.py record runs/quickstart --out before.json
    .venv/bin/python benchmarks/quickstart_record.py compare before.json runs-after/quickstart

`record` reads `result.json` (candidates, their train / held-out scores, the best) and the
spend journal `spend.jsonl` (one line per finished LLM call with its role and whether the
response cache answered it; one line per HTTP request started). `compare` prints both side by
side and exits 1 when scores or calls per role differ or the rerun sent any request.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

SUMMARY_FIELDS = ("accuracy", "memory_score", "memory_score_period_mean")


def _scores(scores: dict[str, Any] | None) -> dict[str, Any]:
    """A candidate's scores on one split: the objective, per user, and the summary's figures."""
    if not scores:
        return {}
    summary = scores.get("summary") or {}
    return {
        "score": scores.get("score"),
        "per_user": scores.get("per_user"),
        **{name: summary.get(name) for name in SUMMARY_FIELDS},
    }


def record(run_dir: Path) -> dict[str, Any]:
    """Scores per candidate and calls / cache hits / server requests per role."""
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    candidates = [
        {
            "id": candidate["id"],
            "status": candidate.get("status"),
            "train": _scores(candidate.get("train")),
            "heldout": _scores(candidate.get("heldout")),
        }
        for candidate in result["candidates"]
    ]
    calls: Counter[str] = Counter()
    cache_hits: Counter[str] = Counter()
    requests: Counter[str] = Counter()
    answered: list[str] = []  # calls the server answered (not the response cache)
    for line in (run_dir / "spend.jsonl").read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        role = entry.get("role")
        if role is None:
            continue  # wall-time and request-outcome lines
        if entry.get("state") == "started":
            requests[role] += 1
        elif "cache_hit" in entry:
            calls[role] += 1
            cache_hits[role] += bool(entry["cache_hit"])
            if not entry["cache_hit"]:
                answered.append(f"{role}: {entry.get('prompt')} prompt + "
                                f"{entry.get('completion')} completion tokens")  # fmt: skip
    roles = sorted(set(calls) | set(requests))
    return {
        "run": str(run_dir),
        "best_id": result.get("best_id"),
        "candidates": candidates,
        "roles": {
            role: {
                "calls": calls[role],
                "cache_hits": cache_hits[role],
                "server_requests": requests[role],
            }
            for role in roles
        },
        "server_answered": answered,
    }


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The differences that say behaviour changed (empty: none)."""
    problems: list[str] = []
    if before["best_id"] != after["best_id"]:
        problems.append(f"best candidate {before['best_id']} -> {after['best_id']}")
    old = {candidate["id"]: candidate for candidate in before["candidates"]}
    new = {candidate["id"]: candidate for candidate in after["candidates"]}
    if sorted(old) != sorted(new):
        problems.append(f"candidates {sorted(old)} -> {sorted(new)}")
    for candidate_id in sorted(set(old) & set(new)):
        for part in ("status", "train", "heldout"):
            if old[candidate_id][part] != new[candidate_id][part]:
                problems.append(
                    f"{candidate_id} {part}: {old[candidate_id][part]} -> {new[candidate_id][part]}"
                )
    for role in sorted(set(before["roles"]) | set(after["roles"])):
        old_calls = before["roles"].get(role, {}).get("calls", 0)
        new_calls = after["roles"].get(role, {}).get("calls", 0)
        if old_calls != new_calls:
            problems.append(f"{role}: {old_calls} calls -> {new_calls}")
        sent = after["roles"].get(role, {}).get("server_requests", 0)
        if sent:
            problems.append(f"{role}: {sent} requests reached the server on the rerun")
    return problems


def _print_side_by_side(before: dict[str, Any], after: dict[str, Any]) -> None:
    print(f"{'role':<12} {'calls':>12} {'cache hits':>14} {'server requests':>18}")
    for role in sorted(set(before["roles"]) | set(after["roles"])):
        old = before["roles"].get(role, {})
        new = after["roles"].get(role, {})
        print(
            f"{role:<12} {old.get('calls', 0):>5} -> {new.get('calls', 0):<5}"
            f"{old.get('cache_hits', 0):>6} -> {new.get('cache_hits', 0):<6}"
            f"{old.get('server_requests', 0):>8} -> {new.get('server_requests', 0):<8}"
        )
    for candidate in after["candidates"]:
        print(f"{candidate['id']:<10} {candidate['status']:<10} train {candidate['train']} "
              f"heldout {candidate['heldout']}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    record_parser = commands.add_parser("record", help="write a run's record")
    record_parser.add_argument("run_dir", type=Path)
    record_parser.add_argument("--out", type=Path, required=True)
    compare_parser = commands.add_parser("compare", help="check a rerun against a record")
    compare_parser.add_argument("record_file", type=Path)
    compare_parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    if args.command == "record":
        args.out.write_text(json.dumps(record(args.run_dir), indent=2) + "\n", encoding="utf-8")
        print(f"recorded {args.run_dir} in {args.out}")
        return 0
    before = json.loads(args.record_file.read_text(encoding="utf-8"))
    after = record(args.run_dir)
    _print_side_by_side(before, after)
    problems = compare(before, after)
    for problem in problems:
        print(f"DIFFERENT: {problem}")
    for call in after.get("server_answered", []):
        # A reply that failed to parse is never cached: a rerun asks it again (and gets the
        # same failure from a deterministic model).
        print(f"answered by the server on the rerun: {call}")
    print("SAME behaviour" if not problems else f"{len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
