"""Does the quickstart's answer step lose what the write filed? The recorded memories of a
`types_list_room.py` run, answered again with only the entries nearest the question.

`benchmarks/filing_replay.py` shows that with the complete types list the write files the
sentence that revealed a variable's current value for 0.87 of the questions, yet the 1.5B
answers only about half of those right: with 20-40 entries in the prompt, the right one sits
among misfiled and outdated ones. Here every recorded period's end state (`checkpoint.json`:
memory and recent messages) is loaded as it was, and each question is answered again by the
policy's own answer step, with the memory cut to the `k` entries most similar (MiniLM cosine)
to the question and its options (`--top-k`, several values compare), by the policy's own read
with its `top_k` set (`--read-top-k`, with and without the recent messages: `--without-recent`),
with every entry's slot label replaced by a neutral one (`--unlabelled`), or with every entry
restated in a few words by the model, alone or beside the quote (`--restated`: what a write
storing the value beside the quote would give). No conversation is simulated: the memories
are the recorded ones, so only the reading changes.

    .venv/bin/python benchmarks/read_replay.py \\
        --room benchmarks/records/types_list_room/lean-answer [--seeds 13 14 15] [--top-k 3 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from types_list_room import TYPES, ideal_types_list  # noqa: E402

from evolve import api  # noqa: E402
from evolve.llm import open_role_lms  # noqa: E402
from evolve.spec.config import resolve  # noqa: E402
from memory_policies.embed import embed_texts  # noqa: E402
from memory_policies.in_context import MemoryEntry  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def nearest(policy, entries: list[MemoryEntry], query: str, k: int) -> list[MemoryEntry]:
    """The `k` entries most similar to `query`, in their memory order."""
    if len(entries) <= k:
        return entries
    texts = [f"{e.label}: {e.value}" for e in entries]
    vectors = embed_texts(policy.embedder, [query, *texts])
    scores = vectors[1:] @ vectors[0]
    keep = set(np.argsort(-scores)[:k].tolist())
    return [e for index, e in enumerate(entries) if index in keep]


def restated(lm, cache: dict[tuple[str, str], str], entry: MemoryEntry) -> str:
    """The entry's sentence restated in a few words as a fact about the user (cached)."""
    key = (entry.label, entry.value)
    if key not in cache:
        messages = [
            {
                "role": "user",
                "content": f'A user said: "{entry.value}"\nIn at most eight words, state '
                f"what this tells about the user's {entry.label}. Reply with the words only.",
            }
        ]
        reply = lm(messages=messages, temperature=0, max_tokens=24)[0]
        text = reply if isinstance(reply, str) else reply.get("text", "")
        cache[key] = " ".join(str(text).split()).strip(' ."') or entry.value
    return cache[key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "experiments" / "quickstart.toml")
    parser.add_argument("--room", type=Path, required=True, help="a types_list_room.py --out")
    parser.add_argument("--seeds", type=int, nargs="+", default=[13, 14, 15])
    parser.add_argument("--top-k", type=int, nargs="*", default=[3, 5])
    parser.add_argument(
        "--restated",
        action="store_true",
        help="also every entry restated in a few words by the model (one call per distinct "
        "entry; the write that would store it): the restatement alone, and beside the quote",
    )
    parser.add_argument(
        "--unlabelled",
        action="store_true",
        help="also every entry with its slot label replaced by 'said' (a misfiled sentence's "
        "label names another fact)",
    )
    parser.add_argument(
        "--read-top-k",
        type=int,
        nargs="*",
        default=[],
        help="also answered by the policy itself with its parameter top_k set to each value "
        "(its own read: the entries whose sentences are nearest the question)",
    )
    parser.add_argument(
        "--without-recent",
        action="store_true",
        help="also each --read-top-k variant without the recent messages in the prompt (what "
        "short_term_len 0 shows, except that the last exchange is not in memory)",
    )
    parser.add_argument("--conditions", nargs="+", default=["base", "ideal"])
    args = parser.parse_args()
    spec = api.load_spec(args.spec)
    variants = ["recorded", *(f"top{k}" for k in args.top_k)]
    variants += [f"read{k}" for k in args.read_top_k]
    variants += [f"read{k}-alone" for k in args.read_top_k] if args.without_recent else []
    variants += ["unlabelled"] if args.unlabelled else []
    variants += ["restated", "restated+quote"] if args.restated else []
    restatements: dict[tuple[str, str], str] = {}
    totals = {(c, v): [0, 0] for c in args.conditions for v in variants}
    with open_role_lms(spec.llm) as lms, lms.context("agent"):
        for seed in args.seeds:
            seeded = spec.model_copy(
                update={"environment": spec.environment.model_copy(update={"seed": seed})}
            )
            resolved = resolve(seeded)
            policies = {
                "base": resolved.base_policy,
                "ideal": resolved.base_policy.with_components({TYPES: ideal_types_list()}),
            }
            for condition in args.conditions:
                policy = policies[condition]
                users = args.room / f"seed{seed}" / condition / "users"
                started = time.perf_counter()
                for period_dir in sorted(users.glob("*/period_*")):
                    result = json.loads((period_dir / "result.json").read_text())
                    saved = json.loads((period_dir / "checkpoint.json").read_text())
                    for item in result["items"]:
                        totals[condition, "recorded"][0] += item["correct"]
                        totals[condition, "recorded"][1] += 1
                        query = "\n".join([item["question"], *item["options"]])
                        for variant in variants[1:]:
                            state = policy.state_type.model_validate(saved)
                            answering = policy
                            if variant.startswith("read"):
                                k = variant.removeprefix("read").removesuffix("-alone")
                                answering = policy.with_parameters(top_k=int(k))
                                if variant.endswith("-alone"):
                                    state.short_term, state.short_term_times = [], []
                            elif variant == "unlabelled":
                                state.memory = [
                                    e.model_copy(update={"label": "said"}) for e in state.memory
                                ]
                            elif variant.startswith("restated"):
                                lm = lms.lm("agent")
                                state.memory = [
                                    e.model_copy(
                                        update={
                                            "value": restated(lm, restatements, e)
                                            + (f' ("{e.value}")' if "quote" in variant else "")
                                        }
                                    )
                                    for e in state.memory
                                ]
                            else:
                                state.memory = nearest(
                                    policy, state.memory, query, int(variant[3:])
                                )
                            answer = answering.answer(state, item["question"], item["options"])
                            totals[condition, variant][0] += answer.choice == item["gold"]
                            totals[condition, variant][1] += 1
                took = time.perf_counter() - started
                line = ", ".join(
                    f"{v} {totals[condition, v][0]}/{totals[condition, v][1]}" for v in variants
                )
                print(f"seed {seed} {condition}: cumulative {line} ({took:.0f} s)", flush=True)
    print()
    if restatements:
        # An empty restatement falls back to the quote: counted, not hidden.
        kept = sum(text == value for (_, value), text in restatements.items())
        print(f"restated {len(restatements)} distinct entries; {kept} empty replies kept the quote")
    for variant in variants:
        shares = {c: totals[c, variant][0] / max(totals[c, variant][1], 1) for c in args.conditions}
        gap = (
            f"; ideal - base {shares['ideal'] - shares['base']:+.3f}"
            if {"base", "ideal"} <= shares.keys()
            else ""
        )
        print(
            f"{variant:<9} "
            + ", ".join(f"{c} {s:.3f}" for c, s in shares.items())
            + gap
            + f" (of {statistics.fmean(t[1] for t in totals.values()):.0f} questions each)"
        )


if __name__ == "__main__":
    main()
