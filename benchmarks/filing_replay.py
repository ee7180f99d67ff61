"""Does the value land in memory? `in_context_quotes`' write replayed, without any LLM, over the
recorded on-policy conversations of `types_list_room.py`, and scored by FILING RECALL.

For each recorded run (`--records`/seed<N>/{base,ideal}), every user's sessions are fed, period
by period and in order, to the policy's own `observe` (so its short-term buffer batches them as
on-policy: with update_every=2, short_term_len=2 a write takes one user+assistant exchange, one
exchange late; the buffer carries over sessions and periods, and the period's last exchange is
still in the buffer when the questions are asked). At each period end, for each variable a
question of the period requires, the sentence that revealed its CURRENT value (the catalog
paraphrase in the opening message of the latest session that exposed the variable) is looked up:

- `rec`: it is in memory (the recall);
- `same`: only an earlier sentence of the same current value is (still right);
- `old`: only sentences of an older value of the variable are (memory is outdated);
- `none`: nothing of the variable is in memory;
- `vis`: in memory or in the short-term buffer (what the answer step sees);
- `max`: share whose revealing exchange has left the buffer at all (the most `rec` can reach);
- `conf`: share (of all) where memory holds the current sentence and an older value's too;
- `fact`: of `rec`, the share filed under the variable's own fact slot (complete list only).

A variable whose latest exposure is not its current value (changed and not said since) is
`unrevealed` and left out. Variants of the write are parameters of a subclass (the policy module
is not touched); variant `A` is the shipped class itself and is checked against the recorded
checkpoints (memory and buffer equal at every period end). Each types list is replayed on its
own run's transcripts (`base` list on base transcripts, complete list on ideal ones); the cross
replay (each list on the other run's transcripts) is printed as a check. Also printed: the share
of all the catalog's revealing sentences that clear each similarity floor, and the recorded
answers (right, and diagnosed `write` by the probes) by the filing status of their variable.

    .venv/bin/python benchmarks/filing_replay.py [--records DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from types_list_room import ideal_types_list  # noqa: E402

from evolve.simulator.synthesis.catalogs import load_catalog  # noqa: E402
from memory_policies.common import MEMORY_TEXT_MAX_CHARS, latest_time  # noqa: E402
from memory_policies.embed import default_embedder, embed_texts  # noqa: E402
from memory_policies.in_context import MemoryEntry  # noqa: E402
from memory_policies.in_context_quotes import (  # noqa: E402
    _MAX_SENTENCES,
    _SENTENCE_END,
    _TIME_HEADER,
    InContextQuotesPolicy,
    InContextQuotesState,
    filing_slots,
    repeats,
    type_items,
    user_sentences,
)
from memory_policies.messages import Message  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "records" / "types_list_room" / "lean-answer"
OUT = ROOT / "benchmarks" / "records" / "filing_replay"
TYPES = "write.types_to_remember"

# Sentences that react to the assistant's advice rather than state a fact (E: `anchors`): a
# sentence nearer to one of these than to every slot is not filed.
NON_FACT_ANCHORS = (
    "I'll definitely try that and see if it helps.",
    "I'll look into those suggestions.",
    "That sounds like a great way to stay motivated.",
    "It's important to approach it with care and patience.",
    "You could try a few things to make it easier.",
)
# A follow-up's intention to act on the advice ("I'll definitely try packing light.").
_INTENT = re.compile(r"^\W*(?:i(?:'ll| will| am going to|'m going to)|let me)\b", re.I)


class CachedEmbedder:
    """The local MiniLM, each text embedded once per process."""

    def __init__(self) -> None:
        self.inner = default_embedder()
        self.name = self.inner.name
        self.cache: dict[str, np.ndarray] = {}

    def embed(self, texts: list[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self.cache))
        if missing:
            for text, vector in zip(missing, self.inner.embed(missing), strict=True):
                self.cache[text] = np.asarray(vector, dtype=np.float32)
        return np.stack([self.cache[t] for t in texts])


@dataclass(frozen=True)
class Write:
    """A variant of the quotes write."""

    name: str
    floor: float | None = None  # B: a sentence whose best slot cosine is below is not filed
    per_slot: int = 1  # C: entries kept per slot
    lines: bool = False  # D: one slot per whole line (no per-fact split)
    unit: str = "sentence"  # E: "message" files a message's kept sentences as one text
    drop_intents: bool = False  # E: follow-up sentences opening "I'll ..." are not filed
    openers_only: bool = False  # E: only a session's opening message (time header) is filed
    anchors: bool = False  # E: a sentence nearest a NON_FACT_ANCHORS text is not filed
    supersede: float | None = None  # E: a filed text drops older entries this similar (cosine)
    shipped: bool = False  # A: the policy class as shipped


class ReplayPolicy(InContextQuotesPolicy):
    """The quotes write with `Write`'s knobs; with the defaults it is the shipped `_write`
    (checked by `main`)."""

    write_variant: Write = Write("default")

    def _write(self, state, messages, times) -> None:  # type: ignore[override]
        assert isinstance(state, InContextQuotesState)
        w = self.write_variant
        slots = (
            type_items(self.types_to_remember) if w.lines else filing_slots(self.types_to_remember)
        )
        units = self._units(state, messages)
        if not units or not slots:
            return
        labels = list(slots)
        targets = [*slots.values(), *(NON_FACT_ANCHORS if w.anchors else ())]
        vectors = embed_texts(self.embedder, [*targets, *units])
        similarity = vectors[len(targets) :] @ vectors[: len(targets)].T
        best = np.argmax(similarity, axis=1)
        time_ = latest_time(times) or state.current_time
        by_type: dict[str, list[str]] = {}
        for text, index, row in zip(units, best, similarity, strict=True):
            if index >= len(labels):  # nearest a non-fact anchor
                continue
            if w.floor is not None and row[index] < w.floor:
                continue
            by_type.setdefault(labels[index], []).append(text)
        if w.supersede is not None and state.memory and by_type:
            # An update of a fact filed under another slot: drop the older entries the new
            # texts are this similar to (paraphrase detection by MiniLM).
            filed = [text for said in by_type.values() for text in said]
            old = embed_texts(self.embedder, [e.value for e in state.memory])
            new = embed_texts(self.embedder, filed)
            close = (new @ old.T >= w.supersede).any(axis=0)
            state.memory = [e for e, drop in zip(state.memory, close, strict=True) if not drop]
        for kind, said in by_type.items():
            state.memory.append(
                MemoryEntry(label=kind, value=" ".join(said)[:MEMORY_TEXT_MAX_CHARS], time=time_)
            )
            same = [e for e in state.memory if e.label == kind]
            for stale in same[: -w.per_slot]:
                state.memory.remove(stale)

    def _units(self, state: InContextQuotesState, messages: list[Message]) -> list[str]:
        """The shipped `_new_statements` (same filters, same order), plus the variant's: the
        texts to file, sentences or whole messages."""
        w = self.write_variant
        held = {s for entry in state.memory for s in _SENTENCE_END.split(entry.value)}
        kept: list[tuple[int, str]] = []
        for number, message in enumerate(messages):
            if message.role == "assistant":
                state.previous_reply = message.content
                continue
            opener = bool(_TIME_HEADER.match(message.content.strip()))
            if w.openers_only and not opener:
                continue
            for sentence in user_sentences([message]):
                if sentence in held or repeats(sentence, state.previous_reply):
                    continue
                if w.drop_intents and not opener and _INTENT.match(sentence):
                    continue
                held.add(sentence)
                kept.append((number, sentence))
        kept = kept[-_MAX_SENTENCES:]
        if w.unit == "message":
            grouped: dict[int, list[str]] = {}
            for number, sentence in kept:
                grouped.setdefault(number, []).append(sentence)
            return [" ".join(group) for group in grouped.values()]
        return [sentence for _, sentence in kept]


@dataclass
class Tally:
    counts: Counter = field(default_factory=Counter)

    def share(self, key: str) -> float:
        return self.counts[key] / max(self.counts["n"], 1)


def build(
    w: Write, types: str, parameters: dict, embedder: CachedEmbedder
) -> InContextQuotesPolicy:
    cls = InContextQuotesPolicy if w.shipped else ReplayPolicy
    policy = cls(embedder=embedder, **parameters).with_components({TYPES: types})
    if not w.shipped:
        policy.write_variant = w
    return policy


def replayed_periods(catalog, policy, user_dir: Path) -> Iterator[tuple[Path, Any, list[dict]]]:
    """A recorded user's periods fed to `policy` in order: after each, the period's directory,
    the policy's state, and the revealing events of the sessions so far (`revealing_events`)."""
    period_dirs = sorted(user_dir.glob("period_*"))
    events = revealing_events(catalog, period_dirs)
    state = policy.initial_state()
    for index, period_dir in enumerate(period_dirs):
        transcript = json.loads((period_dir / "transcript.json").read_text())
        for session in transcript["sessions"]:
            state = policy.observe(state, [Message(**m) for m in session["messages"]])
        yield period_dir, state, [e for period in events[: index + 1] for e in period]


def revealing_events(catalog, period_dirs: list[Path]) -> list[list[dict]]:
    """Per period, its sessions' revealing sentences: dicts of variable, value, sentence, time."""
    events = []
    for period_dir in period_dirs:
        transcript = json.loads((period_dir / "transcript.json").read_text())
        found = []
        for session in transcript["sessions"]:
            for variable, value in session["exposed_states"].items():
                spec = catalog.variables[variable]
                said = [p for p in spec.values.get(value, []) if p in session["query"]]
                assert said, (period_dir, variable, value)
                found.append(
                    dict(
                        variable=variable,
                        value=value,
                        sentence=said[0],
                        time=session["session_time"],
                    )
                )
        events.append(found)
    return events


def holds(memory: list[MemoryEntry], sentence: str) -> MemoryEntry | None:
    return next((e for e in memory if sentence in e.value), None)


def score_period(catalog, state, result, events_so_far, tally: Tally, slot_log: Counter) -> dict:
    """Tally the period's required variables; returns variable -> filing status."""
    statuses: dict[str, str] = {}
    buffer = " ".join(m.content for m in state.short_term if m.role == "user")
    required = {v for item in result["items"] for v in item["required_info"]}
    for variable in sorted(required):
        current = result["state"][variable]
        said = [e for e in events_so_far if e["variable"] == variable]
        if not said or said[-1]["value"] != current:
            tally.counts["unrevealed"] += 1
            statuses[variable] = "unrevealed"
            continue
        tally.counts["n"] += 1
        latest = said[-1]["sentence"]
        older_values = {e["sentence"] for e in said if e["value"] != current}
        same_value = {e["sentence"] for e in said[:-1] if e["value"] == current} - {latest}
        entry = holds(state.memory, latest)
        stale = any(holds(state.memory, s) for s in older_values)
        in_buffer = latest in buffer
        tally.counts["max"] += not in_buffer
        if entry is not None:
            tally.counts["rec"] += 1
            tally.counts["conf"] += stale
            spec = catalog.variables[variable]
            own_slot = entry.label == f"{spec.domain.capitalize()} ({spec.label})"
            tally.counts["fact"] += own_slot
            slot_log[entry.label] += 1
            statuses[variable] = (
                "in memory + older value"
                if stale
                else "in memory, own fact slot"
                if own_slot
                else "in memory, other slot"
            )
        elif any(holds(state.memory, s) for s in same_value):
            tally.counts["same"] += 1
            statuses[variable] = "earlier same-value sentence"
        elif stale:
            tally.counts["old"] += 1
            statuses[variable] = "buffer + older value" if in_buffer else "older value only"
        else:
            tally.counts["none"] += 1
            statuses[variable] = "buffer only" if in_buffer else "nothing"
        tally.counts["vis"] += entry is not None or in_buffer
    return statuses


def replay_run(
    catalog,
    run_dir: Path,
    transcripts_dir: Path,
    w: Write,
    types: str,
    embedder,
    check: bool = False,
    answers: Counter | None = None,
) -> tuple[Tally, Counter, int]:
    """Replay `transcripts_dir`'s users through the write with `types`; score at period ends.
    With `check`, compare memory and buffer with `run_dir`'s checkpoints (returns mismatches);
    with `answers`, count the recorded answers (right, probe-diagnosed write failures) by the
    filing status of their variable (meaningful when the transcripts are `run_dir`'s own)."""
    parameters = json.loads((run_dir / "run.json").read_text())["config"]["policy"]["parameters"]
    policy = build(w, types, parameters, embedder)
    tally, slot_log, mismatches = Tally(), Counter(), 0
    for user_dir in sorted((transcripts_dir / "users").iterdir()):
        for period_dir, state, so_far in replayed_periods(catalog, policy, user_dir):
            if check:
                recorded = json.loads((period_dir / "checkpoint.json").read_text())
                mine = state.model_dump(mode="json")
                mismatches += (
                    recorded["memory"] != mine["memory"]
                    or recorded["short_term"] != mine["short_term"]
                )
            result = json.loads((period_dir / "result.json").read_text())
            statuses = score_period(catalog, state, result, so_far, tally, slot_log)
            if answers is not None:
                for item in result["items"]:
                    for variable in item["required_info"]:
                        status = statuses[variable]
                        answers[(status, "n")] += 1
                        answers[(status, "right")] += item["correct"]
                        answers[(status, "write")] += item["diagnosis"] == "write"
    return tally, slot_log, mismatches


VARIANTS = [
    Write("A shipped", shipped=True),
    *(Write(f"B floor {t}", floor=t) for t in (0.15, 0.2, 0.25, 0.3)),
    Write("C 2 per slot", per_slot=2),
    Write("C 3 per slot", per_slot=3),
    Write("D whole lines", lines=True),
    Write("D lines, 2 per slot", lines=True, per_slot=2),
    Write("E whole message", unit="message"),
    Write("E no follow-up I'll", drop_intents=True),
    Write("E non-fact anchors", anchors=True),
    Write("E openers only", openers_only=True),
    Write("E openers, floor 0.2", openers_only=True, floor=0.2),
    Write("E openers, floor 0.25", openers_only=True, floor=0.25),
    Write("E openers, floor 0.3", openers_only=True, floor=0.3),
    Write("E no I'll, floor 0.2", drop_intents=True, floor=0.2),
    Write("E no I'll, floor 0.25", drop_intents=True, floor=0.25),
    Write("E no I'll, floor 0.3", drop_intents=True, floor=0.3),
    Write("E anchors, floor 0.25", anchors=True, floor=0.25),
    Write("E no I'll, 2 per slot", drop_intents=True, per_slot=2),
    *(Write(f"E supersede {t}", supersede=t) for t in (0.3, 0.4, 0.5)),
    *(Write(f"E supersede {t}, floor 0.2", supersede=t, floor=0.2) for t in (0.3, 0.4)),
    Write("E supersede 0.4, fl 0.2, no I'll", supersede=0.4, floor=0.2, drop_intents=True),
    Write("E openers, 2 per slot", openers_only=True, per_slot=2),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=Path, default=RECORDS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[13, 14, 15])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    started = time.perf_counter()
    catalog = load_catalog()
    embedder = CachedEmbedder()
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    runs = {seed: args.records / f"seed{seed}" for seed in args.seeds}
    lists = {}
    for condition in ("base", "ideal"):
        found = {
            json.loads((run / condition / "run.json").read_text())["config"]["policy"][
                "components"
            ][TYPES]
            for run in runs.values()
        }
        assert len(found) == 1, found
        lists[condition] = found.pop()
    assert lists["ideal"] == ideal_types_list()
    say(f"records {args.records.relative_to(ROOT)}, seeds {args.seeds}")
    say(
        f"base list: {lists['base']!r}; "
        f"complete list: {len(filing_slots(lists['ideal']))} fact slots"
    )

    # A, the shipped class, must reproduce the recorded checkpoints; the subclass with default
    # knobs must reproduce A.
    for w in (VARIANTS[0], Write("default")):
        bad = sum(
            replay_run(catalog, run / c, run / c, w, lists[c], embedder, check=True)[2]
            for run in runs.values()
            for c in ("base", "ideal")
        )
        say(f"check '{w.name}': {bad} of 36 user-period checkpoints differ from the replay")

    header = (
        f"{'variant':<32}| {'list':<5} {'rec':>5} {'same':>5} {'old':>5} {'none':>5} {'vis':>5} "
        f"{'max':>5} {'conf':>5} {'fact':>5} | {'ideal-base rec':>14}"
    )
    say(
        "\nown transcripts (each list on its own run's conversations); shares of (user, period, "
        "required variable)"
    )
    say(header)
    say("-" * len(header))
    results: dict[str, dict[str, Tally]] = {}
    cross: dict[str, dict[str, Tally]] = {}
    for w in VARIANTS:
        results[w.name], cross[w.name] = {}, {}
        for condition, other in (("base", "ideal"), ("ideal", "base")):
            own, mine = Tally(), Tally()
            for run in runs.values():
                tally, _, _ = replay_run(
                    catalog, run / condition, run / condition, w, lists[condition], embedder
                )
                own.counts.update(tally.counts)
                tally, _, _ = replay_run(
                    catalog, run / other, run / other, w, lists[condition], embedder
                )
                mine.counts.update(tally.counts)
            results[w.name][condition], cross[w.name][condition] = own, mine
        for condition in ("base", "ideal"):
            t = results[w.name][condition]
            row = f"{w.name if condition == 'base' else '':<32}| {condition:<5} " + " ".join(
                f"{t.share(k):>5.2f}" for k in ("rec", "same", "old", "none", "vis", "max", "conf")
            )
            fact = t.counts["fact"] / max(t.counts["rec"], 1)
            row += f" {fact:>5.2f} |" if condition == "ideal" else f" {'':>5} |"
            if condition == "ideal":
                b, i = results[w.name]["base"], results[w.name]["ideal"]
                row += f" {i.share('rec') - b.share('rec'):>+14.2f}"
            say(row)
    n = {c: results[VARIANTS[0].name][c].counts for c in ("base", "ideal")}
    say(
        f"(n = {n['base']['n']} base, {n['ideal']['n']} ideal (user, period, variable); unrevealed "
        f"left out: {n['base']['unrevealed']} and {n['ideal']['unrevealed']})"
    )

    say("\ncross check (each list on the OTHER run's transcripts): rec base / ideal / gap")
    for w in VARIANTS:
        b, i = cross[w.name]["base"], cross[w.name]["ideal"]
        say(
            f"{w.name:<32}  {b.share('rec'):.2f} / {i.share('rec'):.2f} / "
            f"{i.share('rec') - b.share('rec'):+.2f}"
        )

    # Where the shipped write's misses go, on the complete list.
    say("\nshipped write, complete list: slots the current sentences sit under (top 8)")
    slots = Counter()
    for run in runs.values():
        slots.update(
            replay_run(
                catalog, run / "ideal", run / "ideal", VARIANTS[0], lists["ideal"], embedder
            )[1]
        )
    say(", ".join(f"{label} {count}" for label, count in slots.most_common(8)))
    say(
        "\nall 260 catalog revealing sentences (not only the recorded ones): share whose best "
        "slot cosine reaches the floor"
    )
    sentences = [
        p for v in catalog.variables.values() if v.recall for ps in v.values.values() for p in ps
    ]
    for condition in ("base", "ideal"):
        slots = filing_slots(lists[condition])
        vectors = embed_texts(embedder, [*slots.values(), *sentences])
        best = (vectors[len(slots) :] @ vectors[: len(slots)].T).max(axis=1)
        say(
            f"  {condition:<5} "
            + ", ".join(f">= {t}: {(best >= t).mean():.2f}" for t in (0.15, 0.2, 0.25, 0.3))
            + f" (median {np.median(best):.2f})"
        )

    say(
        "\nrecorded answers (the shipped write's memory, identical to the replay) by the filing "
        "status of the question's variable: questions, right, probe says 'write'"
    )
    for condition in ("base", "ideal"):
        answers: Counter = Counter()
        for run in runs.values():
            replay_run(
                catalog,
                run / condition,
                run / condition,
                VARIANTS[0],
                lists[condition],
                embedder,
                answers=answers,
            )
        for status in sorted({s for s, _ in answers}, key=lambda s: -answers[(s, "n")]):
            asked, right = answers[(status, "n")], answers[(status, "right")]
            say(
                f"  {condition:<5} {status:<27} {asked:>3}  right {right:>3} "
                f"({right / asked:.2f})  write {answers[(status, 'write')]:>3}"
            )
    say(f"\n{time.perf_counter() - started:.0f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "output.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
