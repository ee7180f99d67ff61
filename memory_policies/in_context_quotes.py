"""`in_context_quotes`: an `in_context` memory whose entries are the user's own sentences,
sorted by the types list. A memory policy a small model can run.

Why: asked to write label -> value entries (`in_context`), the bundled 0.5B model copied its
own looping replies into memory, filed facts under wrong labels and lost most of them (on the
recall world its memory did no better than none). Here the write makes no LLM call: each of the
user's new statements (questions, greetings and thanks dropped, and sentences that repeat the
assistant's previous reply or what memory already holds) goes, verbatim, into the slot of the
types list it is most similar to (sentence embeddings, cosine). A line that lists its facts
after its name is one slot per fact, any other line one slot (`filing_slots`). Each slot keeps
its `ENTRIES_PER_SLOT` newest entry (one entry per write), dated, so the memory stays up to
date and the reader sees the newest.

The types list (`write.types_to_remember`, one type a line: a name, then after ':' or in
parentheses what it covers) is therefore the memory's schema and its size: a narrow list files
everything under its few slots, whose newest entries push out the older facts; each listed
type or fact is room for its own statements, which is what an evolved types list adds.

Why every statement is filed, even one like none of the types: with a floor (cosine 0.2 with
the nearest slot, else not kept) a narrow list kept fewer facts and a list of generic names
was worth less, so in a replay of recorded conversations the complete list gained on the base
and on generic lists; but on-policy the evolved lists, which name the train user's facts, lost
more of the held-out users' indirect statements ("School runs every morning and homework checks
every evening." is like no "children" slot): held-out best minus base +0.042 and +0.021 on the
quickstart's seeds 13 and 14, and the blind control beat it on seed 13 (0.562 vs 0.438;
`benchmarks/records/quickstart_seeds-filing-floor/`). What a
line says after its name steers the sorting, so a reflector's descriptions matter too.

Measured on the recall catalog's 260 revealing sentences against the complete types list (one
line per domain naming its facts, `benchmarks/quotes_sort.py`): MiniLM put 184 (0.71) under the
right domain and 121 (0.47) under the right fact, slot per fact (170, 0.65, matching whole lines);
the bundled 1.5B, asked for each sentence's type as a schema-constrained choice, one sentence a
call, 21 of a sample of 48 (0.44), and sorting by the model cost a call per write.
Role-confused follow-ups of a small simulated user ("I understand you're having trouble
falling asleep. Creating a bedtime routine ...") repeat the assistant's reply; filed as facts,
they pushed real facts out of their type.

The read shows the `top_k` entries whose sentences are most similar to the query (the question
with its options, or the user's message being replied to), in memory order; `use` is
`in_context`'s. Why not every entry: with the complete types list the recorded memories hold 13
to 40 entries, misfiled and outdated ones among them, and the bundled 1.5B shown all of them
answered 0.507 of the questions, against 0.576 shown the single nearest entry
(`benchmarks/read_replay.py --read-top-k 1`, query the question alone); ranked with the options,
the nearest is the sentence that revealed the current value for 103 of the 125 questions whose
sentence memory holds. A narrow types list keeps few entries, so `top_k` changes little
there. Under `variant = "paper"` this kind does not exist (the reference has no such policy).
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

import dspy
import numpy as np

from memory_policies.common import (
    DEFAULT_MEMORY_USE,
    MEMORY_TEXT_MAX_CHARS,
    MemoryReply,
    latest_time,
)
from memory_policies.embed import UsesEmbedder, embed_texts, top_k_indices
from memory_policies.in_context import (
    InContextPolicy,
    InContextRead,
    InContextState,
    MemoryEntry,
)
from memory_policies.messages import MemoryState, Message
from memory_policies.variants import EVOLVE, Variant

QUOTES_TYPES = "1. Diet and food\n2. Work and career"
TYPES_COMPONENT = "write.types_to_remember"

_ITEM = re.compile(r"^\s*(?:\d+[.)]|[-*\u2022])?\s*(?P<text>\S.*)$")
_TIME_HEADER = re.compile(r"^\[Current Time:[^\]]*\]\s*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_TYPE_NAME_CHARS = 60
# The sentences of one write, at most (a longer batch keeps its last ones).
_MAX_SENTENCES = 12
# A sentence this short that opens with a greeting, thanks or a reaction to the assistant's
# advice ("Thanks for the suggestion.", "That sounds like a good plan.", "I'll definitely try
# it.") or announces news ("Quick update on my side.") is not a fact about the user: dropped.
# A short fact ("I'm vegan now.") is kept. The simulated user opens most follow-ups with such a
# reaction; filed, they pushed facts out of their slot.
COURTESY_WORDS = 8
_COURTESY = re.compile(
    r"^\W*(?:hi|hello|hey|thanks|thank you|great|ok|okay|sure|sounds|that sounds|that's a "
    r"(?:good|great|nice)|good idea|great idea|i appreciate|i'm glad|i am glad|"
    r"i(?:'ll| will) (?:definitely |also )?(?:try|check|look|consider|give|keep)|"
    # announcements of news to come ("Quick update on my side.")
    r"(?:a |just a )?(?:quick |small |little |short )?update|(?:a few|some) things have changed)"
    r"\b",
    re.I,
)
# A sentence whose words are mostly (this share) in the assistant's previous reply repeats it.
ECHO_SHARE = 0.6
_WORD = re.compile(r"[a-z0-9']+")
# Entries kept per slot: the newest. Shown an older and a newer statement of one fact, the
# bundled 1.5B often answered from the older ("I cook on Sunday and a couple of weeknights"
# over "I make every meal from scratch").
ENTRIES_PER_SLOT = 1


def type_items(types_to_remember: str) -> dict[str, str]:
    """Name -> whole line of each item of a types list (one item a line, numbered or
    bulleted); the name is the text before the first ':' or '('. The first item of a name wins."""
    items: dict[str, str] = {}
    seen: set[str] = set()
    for line in types_to_remember.splitlines():
        match = _ITEM.match(line)
        if not match:
            continue
        text = match.group("text").strip()
        name = re.split(r"[:(]", text, maxsplit=1)[0].strip(" .;,")[:_TYPE_NAME_CHARS].strip()
        if name and name.casefold() not in seen:
            seen.add(name.casefold())
            items[name] = text
    return items


def filing_slots(types_to_remember: str) -> dict[str, str]:
    """Label -> text to match, one slot per fact a types list names. A line that lists its facts
    after its name ("Travel: travel style, travel frequency" or "Travel (style; frequency)") is
    one slot per fact, labelled "Travel (travel style)" and matched as "Travel: travel style";
    any other line is one slot, its name, matched as the whole line.

    Why per fact: a type that covers several facts would keep only its newest statements, so
    older facts of the same type were pushed out; and a statement filed under the fact it tells
    about is easier to find when a question asks for it (the 1.5B answered 0.75 from
    statements filed under the fact's name, 0.56 from the same statements unfiled)."""
    slots: dict[str, str] = {}
    for name, line in type_items(types_to_remember).items():
        described = line[len(name) :].strip(" :.").removeprefix("(").removesuffix(")")
        separator = ";" if ";" in described else ","
        facts = [
            re.sub(r"^(?:and|or)\s+", "", fact.strip(" .()"), flags=re.I)
            for fact in described.split(separator)
        ]
        facts = [fact for fact in facts if fact]
        if len(facts) < 2:
            slots.setdefault(name, line)
            continue
        for fact in facts:
            slots.setdefault(f"{name} ({fact[:_TYPE_NAME_CHARS]})", f"{name}: {fact}")
    return slots


def user_sentences(messages: list[Message]) -> list[str]:
    """The user's statements in order (time headers, questions, and greetings, thanks, reactions
    and announcements of fewer than `COURTESY_WORDS` words removed), the last `_MAX_SENTENCES`.
    A question asks for help and states nothing to remember."""
    sentences: list[str] = []
    for message in messages:
        if message.role != "user":
            continue
        text = _TIME_HEADER.sub("", message.content.strip())
        sentences += [
            s.strip()
            for s in _SENTENCE_END.split(text)
            if s.strip() and not s.strip().endswith("?") and not _is_courtesy(s)
        ]
    return sentences[-_MAX_SENTENCES:]


def _is_courtesy(sentence: str) -> bool:
    return len(sentence.split()) < COURTESY_WORDS and bool(_COURTESY.match(sentence))


def repeats(sentence: str, reply: str) -> bool:
    """Whether `sentence` mostly repeats `reply`'s words (`ECHO_SHARE` of its words or more):
    a user echoing the assistant tells nothing new about themselves."""
    words = _WORD.findall(sentence.lower())
    if not words:
        return False
    said = set(_WORD.findall(reply.lower()))
    return sum(word in said for word in words) >= ECHO_SHARE * len(words)


class InContextQuotesState(InContextState):
    kind: Literal["in_context_quotes"] = "in_context_quotes"  # type: ignore[assignment]
    # The assistant's latest reply: a user sentence that repeats it is not filed (it may come
    # in the write after the reply's).
    previous_reply: str = ""


class InContextQuotesPolicy(UsesEmbedder, InContextPolicy):
    """`in_context` whose write files the user's sentences into the nearest slot of the types
    list, and whose read shows the `top_k` entries nearest the query (see the module
    docstring)."""

    kind: ClassVar[str] = "in_context_quotes"
    parameter_names: ClassVar[tuple[str, ...]] = ("update_every", "short_term_len", "top_k")
    default_parameters: ClassVar[dict[str, int]] = {
        "update_every": 2,
        "short_term_len": 4,
        "top_k": 1,
    }
    state_type: ClassVar[type[MemoryState]] = InContextQuotesState
    # The reference has no such policy (its nearest is in_context:variant=paper).
    variants: ClassVar[tuple[Variant, ...]] = (EVOLVE.name,)

    def _build_modules(self) -> None:
        self.types_to_remember = QUOTES_TYPES
        self.read = InContextRead()
        self.use = dspy.Predict(MemoryReply.with_instructions(DEFAULT_MEMORY_USE))

    def _write(self, state: MemoryState, messages: list[Message], times: list[str | None]) -> None:
        assert isinstance(state, InContextQuotesState)
        slots = filing_slots(self.types_to_remember)
        sentences = self._new_statements(state, messages)
        if not sentences or not slots:
            return
        labels = list(slots)
        vectors = embed_texts(self.embedder, [*slots.values(), *sentences])
        similarity = vectors[len(slots) :] @ vectors[: len(slots)].T
        kinds = [labels[index] for index in np.argmax(similarity, axis=1)]
        time = latest_time(times) or state.current_time
        by_type: dict[str, list[str]] = {}
        for sentence, kind in zip(sentences, kinds, strict=True):
            by_type.setdefault(kind, []).append(sentence)
        for kind, said in by_type.items():
            value = " ".join(said)[:MEMORY_TEXT_MAX_CHARS]
            # List order = write time; a slot's oldest entries beyond ENTRIES_PER_SLOT go.
            state.memory.append(MemoryEntry(label=kind, value=value, time=time))
            same = [e for e in state.memory if e.label == kind]
            for stale in same[:-ENTRIES_PER_SLOT]:
                state.memory.remove(stale)

    def _use_inputs(self, state: MemoryState, query: str) -> tuple[dict[str, str], list[str]]:
        assert isinstance(state, InContextQuotesState)
        shown = self._nearest_entries(state.memory, _TIME_HEADER.sub("", query.strip()))
        return {"memory": self.read(entries=shown).memory}, [f"{e.label}: {e.value}" for e in shown]

    def _nearest_entries(self, entries: list[MemoryEntry], query: str) -> list[MemoryEntry]:
        """The `top_k` entries whose sentences are most similar to `query`, in memory order.
        The sentences alone are compared: a misfiled entry's label names another fact."""
        if len(entries) <= self.top_k or not query:
            return list(entries)
        vectors = embed_texts(self.embedder, [query, *(e.value for e in entries)])
        kept = set(top_k_indices(vectors[0], vectors[1:], self.top_k))
        return [entry for index, entry in enumerate(entries) if index in kept]

    def _new_statements(self, state: InContextQuotesState, messages: list[Message]) -> list[str]:
        """The user's statements in `messages` that are new: not repeating the assistant's
        previous reply, nor a sentence memory or this batch already holds. Updates
        `state.previous_reply`."""
        kept: list[str] = []
        held = {sentence for entry in state.memory for sentence in _SENTENCE_END.split(entry.value)}
        for message in messages:
            if message.role == "assistant":
                state.previous_reply = message.content
                continue
            for sentence in user_sentences([message]):
                if sentence in held or repeats(sentence, state.previous_reply):
                    continue
                held.add(sentence)
                kept.append(sentence)
        return kept[-_MAX_SENTENCES:]

    def components(self) -> dict[str, str]:
        return {TYPES_COMPONENT: self.types_to_remember, "use": self.use.signature.instructions}

    def _set_components(self, updates: dict[str, str]) -> None:
        if TYPES_COMPONENT in updates:
            self.types_to_remember = updates[TYPES_COMPONENT].strip()
        if "use" in updates:
            self.use.signature = self.use.signature.with_instructions(updates["use"].strip())
