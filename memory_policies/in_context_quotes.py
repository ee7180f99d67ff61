"""`in_context_quotes`: an `in_context` memory whose entries are the user's own sentences,
sorted by the types list. A memory policy a small model can run.

Why: asked to write label -> value entries (`in_context`), the bundled 0.5B model copied its
own looping replies into memory, filed facts under wrong labels and lost most of them (on the
recall world its memory did no better than none). Sorting is a task it can do: the write step
only says, for each of the user's new statements (questions, greetings and thanks dropped),
which listed type it tells about, as a JSON object with one key per sentence, each
constrained to the listed names. The toolkit then keeps each sentence
verbatim under its type. Each type keeps its `ENTRIES_PER_TYPE` newest entries (one entry per
write), dated, so the memory stays up to date and the reader sees the newest.

The types list (`write.types_to_remember`) is therefore the memory's schema and its size: a
narrow list files everything under its few types, whose newest entries push out the older
facts; each listed type is room for its own facts, which is what an evolved types list adds.

Measured on the bundled 1.5B (recall world, the complete types list): offered 'other' for a
sentence of no listed type, it answered 'other' for nearly every sentence once the reply had a
key per sentence, and its memory stayed empty; asked for a plain list of types, it often
returned fewer types than sentences, a parse failure that left the memory unchanged (9 in 6
user-periods; 23 of its 26 wrong answers were write failures). Hence one key per sentence and
no 'other'.

Reading and use are `in_context`'s (every entry in the prompt). Under `variant = "paper"` this
kind does not exist (the reference has no such policy).
"""

from __future__ import annotations

import functools
import re
from typing import ClassVar, Literal

import dspy
import pydantic

from memory_policies.base import MemoryState, Message
from memory_policies.common import (
    DEFAULT_MEMORY_USE,
    MEMORY_TEXT_MAX_CHARS,
    MemoryReply,
    latest_time,
)
from memory_policies.in_context import (
    InContextPolicy,
    InContextRead,
    InContextState,
    MemoryEntry,
    compose_write_instruction,
    render_entries,
    split_write_instruction,
)
from memory_policies.variants import EVOLVE, Variant

QUOTES_WRITE = (
    "You keep the long-term memory of a personal assistant about its user. For each of the "
    "user's new sentences, in order, say which type listed below the sentence tells about "
    "(the closest one)."
)

QUOTES_TYPES = "1. Diet and food\n2. Work and career"

_ITEM = re.compile(r"^\s*(?:\d+[.)]|[-*\u2022])?\s*(?P<text>\S.*)$")
_TIME_HEADER = re.compile(r"^\[Current Time:[^\]]*\]\s*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_TYPE_NAME_CHARS = 60
# The sentences of one write, at most (a longer batch keeps its last ones).
_MAX_SENTENCES = 12
# A statement this short that opens with a greeting or thanks ("Hi!", "Thanks a lot!") is not a
# fact: dropped. A short fact ("I'm vegan now.") is kept.
MIN_WORDS = 4
_GREETING = re.compile(r"^\W*(?:hi|hello|hey|thanks|thank you|great|ok|okay|sure)\b", re.I)
# Entries kept per type, newest last (see the module docstring).
ENTRIES_PER_TYPE = 2


def type_names(types_to_remember: str) -> list[str]:
    """The short names of a types list: each item's text before its first ':' or '(' (one
    item a line, numbered or bulleted), without duplicates."""
    names: list[str] = []
    seen: set[str] = set()
    for line in types_to_remember.splitlines():
        match = _ITEM.match(line)
        if not match:
            continue
        name = re.split(r"[:(]", match.group("text"), maxsplit=1)[0].strip(" .;,")
        name = name[:_TYPE_NAME_CHARS].strip()
        if name and name.casefold() not in seen:
            seen.add(name.casefold())
            names.append(name)
    return names


def user_sentences(messages: list[Message]) -> list[str]:
    """The user's statements in order (time headers, questions and greetings or thanks of fewer
    than `MIN_WORDS` words removed), the last `_MAX_SENTENCES`. A question asks for help and states
    nothing to remember; sorted as a type, it replaced that type's real sentence (the 0.5B
    filed most requests under a type)."""
    sentences: list[str] = []
    for message in messages:
        if message.role != "user":
            continue
        text = _TIME_HEADER.sub("", message.content.strip())
        sentences += [
            s.strip()
            for s in _SENTENCE_END.split(text)
            if s.strip() and not s.strip().endswith("?") and not _is_greeting(s)
        ]
    return sentences[-_MAX_SENTENCES:]


def _is_greeting(sentence: str) -> bool:
    return len(sentence.split()) < MIN_WORDS and bool(_GREETING.match(sentence))


class SortSentences(dspy.Signature):
    memory: str = dspy.InputField(desc="current long-term memory, oldest first")
    sentences: str = dspy.InputField(desc="the user's new sentences, numbered")
    types: dict[str, str] = dspy.OutputField(desc="the type of each numbered sentence")


@functools.lru_cache(maxsize=256)
def _sort_signature(names: tuple[str, ...], count: int) -> type[dspy.Signature]:
    """The write's signature for `count` sentences: `types` holds one key per sentence
    (`sentence_1` ...), each one of `names` (why, and why no 'other': the module docstring);
    the schema fixes the count."""
    choice = Literal.__getitem__(names)  # type: ignore[attr-defined]
    per_sentence = pydantic.create_model(  # type: ignore[call-overload]
        "SentenceTypes",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **{sentence_key(index): (choice, ...) for index in range(1, count + 1)},
    )
    return SortSentences.with_updated_fields("types", type_=per_sentence)


def sentence_key(index: int) -> str:
    """The key of the `index`-th (from 1) sentence's type in the write's reply."""
    return f"sentence_{index}"


class InContextQuotesState(InContextState):
    kind: Literal["in_context_quotes"] = "in_context_quotes"  # type: ignore[assignment]


class InContextQuotesPolicy(InContextPolicy):
    """`in_context` whose write sorts the user's sentences by the types list (see module)."""

    kind: ClassVar[str] = "in_context_quotes"
    state_type: ClassVar[type[MemoryState]] = InContextQuotesState
    # The reference has no such policy (its nearest is in_context:variant=paper).
    variants: ClassVar[tuple[Variant, ...]] = (EVOLVE.name,)

    def _build_modules(self) -> None:
        self.write = dspy.Predict(SortSentences.with_instructions(self._initial_write()))
        self.read = InContextRead()
        self.use = dspy.Predict(MemoryReply.with_instructions(DEFAULT_MEMORY_USE))

    def _initial_write(self) -> str:
        return compose_write_instruction(QUOTES_WRITE, QUOTES_TYPES)

    def _write(self, state: MemoryState, messages: list[Message], times: list[str | None]) -> None:
        sentences = user_sentences(messages)
        instruction = self.write.signature.instructions
        _, types = split_write_instruction(instruction)
        names = tuple(type_names(types))
        if not sentences or not names:
            return
        signature = _sort_signature(names, len(sentences)).with_instructions(instruction)
        prediction = self._predict(
            state,
            "write",
            self.write,
            signature=signature,
            memory=render_entries(state.memory),
            sentences="\n".join(f"{i}. {s}" for i, s in enumerate(sentences, start=1)),
        )
        if prediction is None:
            return  # counted in parse_failures (a sentence left unsorted among them)
        kinds = [getattr(prediction.types, sentence_key(i)) for i in range(1, len(sentences) + 1)]
        time = latest_time(times) or state.current_time
        by_type: dict[str, list[str]] = {}
        for sentence, kind in zip(sentences, kinds, strict=True):
            if kind in names:
                by_type.setdefault(kind, []).append(sentence)
        for kind, said in by_type.items():
            value = " ".join(said)[:MEMORY_TEXT_MAX_CHARS]
            # List order = write time; a type's oldest entries beyond ENTRIES_PER_TYPE go.
            state.memory.append(MemoryEntry(label=kind, value=value, time=time))
            same = [e for e in state.memory if e.label == kind]
            for stale in same[:-ENTRIES_PER_TYPE]:
                state.memory.remove(stale)
