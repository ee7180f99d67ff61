"""A tiny OpenAI-compatible chat server for benchmarks: fixed latency, valid JSON outputs.

Why one long file: the server runs as its own process from a bare path (tests, benchmarks
and scripts start it with any Python, standard library only), so its routes, its scripted
answers and the launcher that starts it (`StubServer`) live together.

POST /v1/chat/completions sleeps `--latency` seconds, then answers with a JSON object that
fills every requested output field with a minimal valid value. Field names and types come
from the request's `response_format` JSON schema, or, without one, from DSPy's prompt
("Your output fields are: 1. `name` (type) ..."). Standard library only; run it as a separate
process so that its work never competes with the measured client for the GIL:

    python benchmarks/stub_openai_server.py --port 8765 --latency 0.1

Fault and accounting tests drive it through two extra routes:

- `GET /stats` -> `{"requests": N, "chat_requests": N, "in_flight": N, "peak_in_flight": N,
  "fault": {...}}`: a server-side request counter to compare with the toolkit's ledger, and
  the most chat requests served at once, `excess_s`: the seconds spent serving chat
  requests beyond the latency, summed, and `last_chat_arrival`: the wall-clock time
  (`time.time()`) the latest chat request arrived, or null (`POST /stats/reset` zeroes the
  counters);
- `POST /fault` with `{"mode": M, "count": N}` sets a fault for the next N chat requests
  (`count` omitted or null: until changed). Modes: `none`, `http500` (an HTTP 500 error),
  `non_json` (200 with content that is not JSON), `non_json_probes` (the same for diagnosis
  probes only, as `guess_role` tells them; every other request is answered normally),
  `truncated` (a body cut short before its declared length), `hang` (never answers; the
  client must time out), `trickle` (a 200 whose body comes one byte a second: no read ever
  waits long, so only a deadline for the whole response ends it). `--fault MODE` sets the
  same at start.

`--port 0` picks a free port; the first line printed is always `stub server on URL`.

`--scripted` answers every request as its role expects, for this toolkit and for the reference
AMemGym code alike (see `guess_role`): plain text for chat replies and simulated-user follow-
ups, a fenced `{"answer": n}` for multiple-choice prompts (a function of the question, its
options and the marks of everything shown; one in eight unparseable, so the reference's random
fallback runs; with `--environment FILE`, the upper bound answers the option the shown state
makes right, about one in five wrong as another option, 0, -1, `true` or no JSON), the
asked-for variables for diagnosis probes (real keys with values picked by content, so some are
right and some wrong, and about one in five with placeholder keys), JSON memory writes (marked
`MEMO-<n>`), mem0-style fact lists (one fact marked `FACT-<n>`, or none) and memory events (five
memories marked `MEMO-<n>`: ADDs, the first an UPDATE of the lowest-marked stored memory when
five are shown), reflector proposals, and unit vectors on `POST /v1/embeddings` (see
`hashed_vector`). Each answer is a function of the request's content, never of the order
requests arrive in (see `Script`), and every mark is a function of the marks a request shows,
never of its wording (`marks_in`), so both codebases get the same answers and make the same
marks for the same content.

`--log FILE` appends one JSON line per chat or embeddings request (role guess, messages,
temperature, max_tokens, response_format, model, and seed, top_p, stop and the penalties where
the request sets them; for embeddings the input texts) with the
current tag, which `POST /log/tag` `{"tag": "native"}` sets (the run a request belongs to).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_ids = itertools.count(1)

FAULT_MODES = ("none", "http500", "non_json", "non_json_probes", "truncated", "hang", "trickle")


class ServerState:
    """Request counters and the current fault, shared by the handler threads."""

    def __init__(self, fault: str = "none", fault_count: int | None = None) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.chat_requests = 0
        self.in_flight = 0
        self.peak_in_flight = 0  # most chat requests served at once since start or reset
        # Seconds the handler spent on chat requests beyond the configured latency (parsing,
        # building and writing the answer, sleeping late): the server's cost, not the client's.
        self.excess_s = 0.0
        self.fault = fault
        self.fault_remaining = fault_count
        self.last_prompt = ""  # the previous chat prompt, for the prompt-cache figure
        # When the latest chat request arrived (epoch seconds, comparable with a client's
        # clock on this machine): proves that no request arrived after a given moment.
        self.last_chat_arrival: float | None = None

    def reused_prompt_chars(self, prompt: str) -> int:
        """Characters of `prompt` shared with the previous prompt from the start, as a
        one-slot llama-server would reuse them from its prompt cache."""
        with self.lock:
            previous, self.last_prompt = self.last_prompt, prompt
        return len(os.path.commonprefix([previous, prompt]))

    def set_fault(self, mode: str, count: int | None) -> None:
        if mode not in FAULT_MODES:
            raise ValueError(f"unknown fault mode {mode!r}; expected one of {FAULT_MODES}")
        with self.lock:
            self.fault, self.fault_remaining = mode, count

    def next_fault(self) -> str:
        """The fault for the chat request being served (consumes one of its count)."""
        with self.lock:
            self.chat_requests += 1
            mode = self.fault
            if mode != "none" and self.fault_remaining is not None:
                self.fault_remaining -= 1
                if self.fault_remaining <= 0:
                    self.fault, self.fault_remaining = "none", None
            return mode

    def reset_counters(self) -> None:
        with self.lock:
            self.requests = self.chat_requests = 0
            self.peak_in_flight = self.in_flight
            self.excess_s = 0.0
            self.last_chat_arrival = None

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "requests": self.requests,
                "chat_requests": self.chat_requests,
                "in_flight": self.in_flight,
                "peak_in_flight": self.peak_in_flight,
                "excess_s": self.excess_s,
                "last_chat_arrival": self.last_chat_arrival,
                "fault": {"mode": self.fault, "remaining": self.fault_remaining},
            }


def value_for(schema: dict[str, Any], defs: dict[str, Any], name: str = "") -> Any:
    """A minimal value valid for a JSON schema (enough for DSPy's output models)."""
    if "$ref" in schema:
        return value_for(defs.get(schema["$ref"].split("/")[-1], {}), defs, name)
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return value_for(options[0], defs, name)
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object":
        properties = schema.get("properties", {})
        return {key: value_for(sub, defs, key) for key, sub in properties.items()}
    if kind == "array":
        return []
    if kind == "integer":
        return 1
    if kind == "number":
        return 1.0
    if kind == "boolean":
        return False
    return f"stub {name}".strip()


def outputs_for(request: dict[str, Any]) -> dict[str, Any]:
    response_format = request.get("response_format") or {}
    schema = None
    if isinstance(response_format, dict):
        schema = (response_format.get("json_schema") or {}).get("schema") or response_format.get(
            "schema"
        )
    if schema:
        return value_for(schema, schema.get("$defs", {}))
    system = "\n".join(
        str(m.get("content", "")) for m in request.get("messages", []) if m.get("role") == "system"
    )
    section = system.split("Your output fields are:", 1)[-1].split("All interactions", 1)[0]
    outputs: dict[str, Any] = {}
    for name, kind in re.findall(r"\d+\. `(\w+)` \(([^)]*)\)", section):
        kind = kind.lower()
        outputs[name] = 1 if "int" in kind else [] if kind.startswith("list") else f"stub {name}"
    return outputs


# ----- the scripted, role-aware mode ----------------------------------------------------------

ROLE_GUESSES = (
    "user",  # a simulated-user follow-up
    "reply",  # the assistant's chat reply
    "answer",  # a multiple-choice question put to the policy
    "upper_bound",  # a multiple-choice question with the state given
    "probe",  # a diagnosis probe: the required variables and their possible values
    "write",  # a JSON memory write (AWI)
    "extract",  # a fact extraction (AWE, mem0 style)
    "update",  # memory events against related memories (AWE, mem0 style)
    "reflector",  # a proposal for a new memory-types section or instruction
    "structured",  # any other structured (JSON schema) request
    "embedding",  # POST /v1/embeddings
)
_OPTION_LINE = re.compile(r"^\d+: ", re.M)
# Placeholder keys of the kind a template shows: a probe reply that copies them fills no variable.
PLACEHOLDER_PROBE = {"info_type1": "choice", "info_type2": "choice"}
# Request settings logged when present, beyond temperature, max_tokens and response_format.
SAMPLING_SETTINGS = ("seed", "top_p", "stop", "n", "presence_penalty", "frequency_penalty")
EMBEDDING_DIMS = 1536  # text-embedding-3-small's size, which mem0's defaults assume


def _text(message: dict[str, Any]) -> str:
    content = message.get("content", "")
    if isinstance(content, list):  # content parts
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def _schema_properties(request: dict[str, Any]) -> set[str]:
    response_format = request.get("response_format") or {}
    if not isinstance(response_format, dict):
        return set()
    schema = (response_format.get("json_schema") or {}).get("schema") or {}
    return set(schema.get("properties", {}))


def json_objects(text: str) -> Iterator[Any]:
    """Every JSON value that starts at a `{` in `text`, in order (the rest is skipped)."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            yield decoder.raw_decode(text, match.start())[0]
        except ValueError:
            continue


def probe_schema(text: str) -> dict[str, list[str]] | None:
    """The first JSON object in `text` whose values are all lists of strings (a schema of
    variables and their possible values), or None."""
    for value in json_objects(text):
        if (
            isinstance(value, dict)
            and value
            and all(
                isinstance(v, list) and all(isinstance(x, str) for x in v) for v in value.values()
            )
        ):
            return value
    return None


def guess_role(request: dict[str, Any]) -> str:
    """Which role a chat request plays, from its shape and the output it asks for (never from
    an implementation's wording, so one rule serves this toolkit and the reference code)."""
    messages = request.get("messages") or []
    properties = _schema_properties(request)
    full = "\n".join(_text(m) for m in messages)
    if properties:  # a DSPy request with a JSON schema: its output field names say the role
        if properties == {"message"}:
            return "user"
        if "choice" in properties:
            return (
                "upper_bound" if re.search(r"\b(current_state|known_state)\b", full) else "answer"
            )
        if properties & {"new_text", "new_types", "new_prompt"}:
            return "reflector"
        return "structured"
    last = _text(messages[-1]) if messages else ""
    json_mode = (request.get("response_format") or {}).get("type") == "json_object"
    if len(_OPTION_LINE.findall(last)) >= 2 and '"answer"' in last:
        return "upper_bound" if json_mode else "answer"
    if '"new_types"' in full or '"new_prompt"' in full or '"new_text"' in full:
        return "reflector"
    if json_mode and "ADD" in full and "DELETE" in full and "event" in full:
        return "update"
    if json_mode and '"facts"' in full:
        return "extract"
    if probe_schema(last) is not None:
        # The reference's simulated user sees the whole schema in a single message; a probe
        # is asked inside the agent's conversation (history or a memory system message).
        return "user" if len(messages) == 1 and not json_mode else "probe"
    if json_mode:
        return "write"
    return "reply"


# Memories one scripted mem0-style update adds (see Script.chat).
ADDS_PER_UPDATE = 5
# What a scripted memory says after its mark: long enough that a chain's feedback, which
# quotes the memory per question, passes 1,600 characters (a length cap then shows).
MEMORY_TEXT = (
    "the user shared a preference about their routine, their plans and their home, and asked "
    "the assistant to keep it in mind"
)
# Marks (`MEMO-<n>`, `(reply <n>)`, ...) are content keys below this bound.
MARK_RANGE = 10**9
# Mixed into every content key. This salt is one for which the reference fixture
# (tests/fixtures/reference_output/) reaches every branch its tests need: unparseable
# answers, upper-bound answers of every wrong form, write and read failures, and user-periods
# on every side of the memory score's margin, two of them between a 1- and a 2-standard-error
# margin (so a weaker margin shows). `tests/simulator/test_reference_fixture.py` and
# `test_paper_run_per_item.py` check each.
SCRIPT_SALT = "stub-139"


def content_key(*parts: str) -> int:
    """A stable number from request content (the same content gives the same number in any
    process and either codebase; Python's `hash` is salted per process)."""
    digest = hashlib.sha256("\x1f".join((SCRIPT_SALT, *parts)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


_OPTION_TEXT = re.compile(r"^\s*(\d+): (.*\S)\s*$", re.M)


def options_in(text: str) -> list[str]:
    """The texts of a multiple-choice prompt's numbered options (`1: ...` lines), in order."""
    return [option for _, option in _OPTION_TEXT.findall(text)]


def option_numbers_in(text: str) -> list[int]:
    """The numbers printed before a multiple-choice prompt's options, in order: the stub
    answers with the number printed next to the option it picks, as a model would."""
    return [int(number) for number, _ in _OPTION_TEXT.findall(text)]


_FACT_MARK = re.compile(r"FACT-\d+")
_REPLY_MARK = re.compile(r"\(reply \d+\)")
# What names a piece of content alike in both codebases: a stored memory, an extracted fact,
# a scripted reply or follow-up, a session opening's time. Marks, not wording, key every
# scripted answer that depends on what a role is shown.
_CONTENT_MARK = re.compile(
    r"MEMO-\d+|FACT-\d+|\((?:reply|follow-up) \d+\)|\[Current Time: [^\]]+\]"
)
# One fact extraction in this many finds no fact.
NO_FACT_EVERY = 7


def marks_in(text: str) -> list[str]:
    """The distinct content marks in `text`, sorted."""
    return sorted(set(_CONTENT_MARK.findall(text)))


# Stored memories an update request shows with their ids: this toolkit's `[id] text` lines
# and mem0's Python-repr list (`{'id': '0', 'text': '...'}`).
_LISTED_MEMORY = re.compile(r"^\[(\d+)\] (MEMO-\d+[^\n]*)$", re.M)
_REPR_MEMORY = re.compile(
    r"""['"]id['"]\s*:\s*['"](\w+)['"]\s*,\s*['"]text['"]\s*:\s*['"](MEMO-[^'"]*)"""
)
_SESSION_TIME = re.compile(r"\[Current Time: ([^\]]+)\]")
_FIELD_HEADER = re.compile(r"^\[\[ ## \w+ ## \]\]\s*\n", re.M)


def question_in(text: str) -> str:
    """A multiple-choice prompt's question: its first paragraph (both codebases open with it;
    DSPy's field headers such as `[[ ## question ## ]]` are not part of it)."""
    return _FIELD_HEADER.sub("", text).strip().split("\n\n", 1)[0].strip()


def state_in(text: str) -> dict[str, str]:
    """The first JSON object in `text` whose values are all strings (a state shown to the
    upper bound), or {}."""
    for value in json_objects(text):
        if isinstance(value, dict) and value and all(isinstance(v, str) for v in value.values()):
            return value
    return {}


class OptionStates:
    """Which option each state makes right, per question, from an environment file (the
    original `data.json` list): the scripted upper bound then answers as a model told the
    state would, mostly right."""

    def __init__(self, path: Path | None = None) -> None:
        self.questions: dict[tuple[str, ...], tuple[list[str], list[tuple[str, ...]]]] = {}
        self.queries: list[str] = []  # the questions' texts, for `hashed_vector`
        if path is None:
            return
        for item in json.loads(path.read_text(encoding="utf-8")):
            for qa in item.get("qas", []):
                self.queries.append(qa["query"])
                options = tuple(choice["answer"] for choice in qa["answer_choices"])
                states = [tuple(choice["state"]) for choice in qa["answer_choices"]]
                self.questions[options] = (list(qa["required_info"]), states)

    def right_option(self, options: list[str], state: dict[str, str]) -> int | None:
        """The 1-based option the state makes right, or None when unknown."""
        known = self.questions.get(tuple(options))
        if known is None:
            return None
        required, states = known
        wanted = tuple(state.get(name) for name in required)
        return states.index(wanted) + 1 if wanted in states else None


def _fenced(value: Any) -> str:
    return f"```json\n{json.dumps(value, ensure_ascii=False)}\n```"


# How a scripted upper bound gets an answer wrong, by content key: another option, the
# numbers 0 and -1 (the reference indexes its option list with them: the last options), JSON
# `true` (the reference reads option 1) and no JSON at all (its random fallback).
WRONG_UPPER_BOUND_FORMS = ("next", 0, -1, True, "unparseable")
UNPARSEABLE = "I cannot tell which option fits best."
# One answer in this many is unparseable (the reference's random fallback runs): rare enough
# that most user-periods of 8 questions have none, where the paper's number is compared as
# it stands.
UNPARSEABLE_EVERY = 8


class Script:
    """Scripted answers and the request log (thread-safe).

    Every answer is a function of the request's content (`content_key`), never of a counter
    or of the order requests arrive in: the same request gets the same answer in either
    codebase, so a multiple-choice question, an upper-bound question with the same state and a
    probe of the same variables are answered alike by the reference and by this toolkit, and
    their per-item scores can be compared. A question's answer depends on its question and
    options (the upper bound's also on the state shown), a probe's on its variables, and
    every other role's on all the messages (its marks tell two requests apart)."""

    def __init__(self, log_path: Path | None = None, environment: Path | None = None) -> None:
        self.lock = threading.Lock()
        self.log_path = log_path
        self.tag = ""
        self.option_states = OptionStates(environment)

    def record(self, entry: dict[str, Any]) -> None:
        if self.log_path is None:
            return
        with self.lock:
            line = json.dumps({"tag": self.tag, **entry}, ensure_ascii=False)
            with open(self.log_path, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")

    def chat(self, request: dict[str, Any]) -> tuple[str, str]:
        """(role guess, answer content) for one chat request."""
        role = guess_role(request)
        messages = request.get("messages") or []
        texts = [_text(message) for message in messages]
        last = texts[-1] if texts else ""
        properties = _schema_properties(request)
        mark = content_key(role, *self._marked_content(role, texts)) % MARK_RANGE
        if role == "user":
            text = f"Thanks, that helps. What else should I keep in mind? (follow-up {mark})"
            return role, json.dumps({"message": text}) if properties else text
        if role == "reply":
            return role, f"Here is one suggestion that could work for you (reply {mark})."
        if role in ("answer", "upper_bound"):
            return role, self._choose(role, last, properties, texts[:-1])
        if role == "probe":
            schema = probe_schema(last) or {}
            # The latest reply shown (else the latest session time) tells the periods apart (a
            # probe answered alike in every period could never show a read failure). Both
            # codebases quote the latest exchange last, whatever memory they show before it.
            shown = "\n".join(texts)
            latest = _REPLY_MARK.findall(shown)[-1:] or sorted(_SESSION_TIME.findall(shown))[-1:]
            key = content_key(role, json.dumps(schema, sort_keys=True), *latest)
            if key % 5 == 4:
                return role, _fenced(PLACEHOLDER_PROBE)
            values = {
                name: choices[((key >> 8) + j) % len(choices)] if choices else ""
                for j, (name, choices) in enumerate(schema.items())
            }
            return role, _fenced(values)
        if role == "write":
            return role, json.dumps({f"note_{mark}": f"MEMO-{mark}: {MEMORY_TEXT}"})
        if role == "extract":
            # A fact is marked FACT-, a stored memory MEMO-: a request quoting both is counted
            # right (facts to decide on, memories related to them).
            # Some extractions find nothing (mem0 then adds nothing; so must ours).
            if mark % NO_FACT_EVERY == 0:
                return role, json.dumps({"facts": []})
            return role, json.dumps({"facts": [f"FACT-{mark}: the user shared a preference"]})
        if role == "update":
            # Several memories per update, so a user's store outgrows the paper's top_k (30)
            # and the retrieval cut shows in what the agent is shown.
            texts = [
                f"MEMO-{ADDS_PER_UPDATE * mark + k}: {MEMORY_TEXT}" for k in range(ADDS_PER_UPDATE)
            ]
            # An update shown a full batch of stored memories rewrites the first one (UPDATE)
            # instead of adding a fifth memory: the store then grows by 4, not 5, and an
            # UPDATE that kept the old memory would show in the counts.
            ours = '"events"' in last or "events" in properties  # this toolkit's event list
            stored = (_LISTED_MEMORY if ours else _REPR_MEMORY).findall(last)
            # The stored memory with the lowest mark: the two codebases list the related
            # memories in different orders (kept row store_ties), so "the first" would not do.
            lowest = min(stored, key=lambda memory: int(memory[1][5:].split(":")[0]), default=None)
            updated = lowest if len(stored) >= ADDS_PER_UPDATE else None
            if ours:
                events = [{"event": "ADD", "id": 0, "text": text} for text in texts]
                if updated is not None:
                    events[0] = {"event": "UPDATE", "id": int(updated[0]), "text": texts[0]}
                return role, json.dumps({"events": events})
            memory = [{"id": str(k), "text": text, "event": "ADD"} for k, text in enumerate(texts)]
            if updated is not None:
                memory[0] = {
                    "id": updated[0],
                    "text": texts[0],
                    "event": "UPDATE",
                    "old_memory": updated[1],
                }
            return role, json.dumps({"memory": memory})
        if role == "reflector":
            return role, self._proposal(messages, properties, mark)
        return role, json.dumps(outputs_for(request))

    @staticmethod
    def _marked_content(role: str, texts: list[str]) -> list[str]:
        """What a role's mark is a function of: the marks of the content it is shown
        (`marks_in`), never its prompt's wording, so that the two codebases, whose prompts
        differ by design, make the same mark for the same content: a reply depends on the
        current turn, a follow-up on the reply it answers, a memory update on the facts it
        decides on, a memory write, a fact extraction and a proposal on everything marked
        that they are shown."""
        if role == "reply":
            return marks_in(texts[-1]) or texts[-1:]
        if role == "user":
            replies = _REPLY_MARK.findall("\n".join(texts))
            return replies[-1:] or marks_in("\n".join(texts))
        if role == "update":
            return sorted(set(_FACT_MARK.findall("\n".join(texts))))
        if role in ("write", "extract", "reflector"):
            return marks_in("\n".join(texts))
        return texts

    def _choose(self, role: str, last: str, properties: set[str], shown: list[str]) -> str:
        """A multiple-choice answer: the agent's by the question, its options and the marks
        of everything it is shown (one key in `UNPARSEABLE_EVERY` unparseable); the upper
        bound's the option the state makes right when the environment is known, every fifth
        key wrong in one of `WRONG_UPPER_BOUND_FORMS`."""
        options = options_in(last)
        numbers = option_numbers_in(last) or [1]
        count = len(numbers)
        parts = [role, question_in(last), *options]
        if role == "answer":
            # What the policy is shown (history, memories, retrieved turns): a memory stored,
            # dropped or retrieved differently changes the answer, as it would a model's.
            parts += marks_in("\n".join(shown))
        if role == "upper_bound":
            parts += [f"{k}={v}" for k, v in sorted(state_in(last).items())]
        key = content_key(*parts)
        picked = key % count  # 0-based: which option, answered by its printed number
        right = self.option_states.right_option(options, state_in(last))
        form: Any = None
        if role == "upper_bound" and right is not None:
            picked = right - 1
            if (key >> 16) % 5 == 4:
                form = WRONG_UPPER_BOUND_FORMS[(key >> 24) % len(WRONG_UPPER_BOUND_FORMS)]
                if form == "next" or properties:
                    picked, form = (picked + 1) % count, None
        choice: Any = numbers[picked] if form is None else form
        if properties:
            return json.dumps({"choice": choice})
        if choice == "unparseable" or (role == "answer" and (key >> 16) % UNPARSEABLE_EVERY == 0):
            return UNPARSEABLE
        return _fenced({"answer": choice})

    @staticmethod
    def _proposal(messages: list[dict[str, Any]], properties: set[str], mark: int) -> str:
        section = (
            "1. Current situation: what the user says is true for them now, with the date.\n"
            f"2. Changes: a value the user revises replaces the old one (revision {mark})."
        )
        if properties:
            key = next(iter(properties & {"new_text", "new_types", "new_prompt"}))
            return json.dumps({key: section})
        changes = [f"track current values and their changes (revision {mark})"]
        shown = "\n".join(_text(m) for m in messages)
        if '"new_prompt"' in shown:
            prompt = f"{section}\nMemories: {{current_memories}}\nConversation: {{conversation}}"
            return _fenced({"new_prompt": prompt, "changes": changes})
        if '"new_text"' in shown:
            return _fenced({"new_text": section, "changes": changes})
        return _fenced({"new_types": section, "changes": changes})

    def embed(self, request: dict[str, Any]) -> list[list[float]]:
        texts = request.get("input", [])
        texts = [texts] if isinstance(texts, str) else list(texts)
        dims = int(request.get("dimensions") or EMBEDDING_DIMS)
        return [hashed_vector(str(text), dims, self.option_states.queries) for text in texts]


def hashed_vector(text: str, dims: int, questions: Sequence[str] = ()) -> list[float]:
    """A unit vector that depends only on the content marks `text` carries (`marks_in`), or,
    for a text without marks, on the environment's question it quotes (one of `questions`):
    its angle in the first two dimensions is a hash of them (angle 0 for neither). So a
    question ranks every stored memory in a strict order of its own (no ties for a store to
    break its own way), unit length makes L2 (mem0's Milvus default) and cosine (ours) rank
    alike, and a search does not depend on the wording around the marks or the question (the
    two codebases' queries are worded differently by design)."""
    marks = marks_in(text) or [query for query in questions if query in text][:1]
    angle = (math.pi / 2) * (content_key("embedding", *marks) / 2**64) if marks else 0.0
    vector = [0.0] * dims
    vector[0], vector[1] = math.cos(angle), math.sin(angle)
    return vector


def make_handler(
    latency: float, state: ServerState | None = None, script: Script | None = None
) -> type[BaseHTTPRequestHandler]:
    """The request handler; with a `script`, answers are role-aware and requests are logged."""
    state = state or ServerState()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: clients reuse connections
        # Headers and body go out in two writes; with Nagle on, the body waits for the
        # client's delayed ACK (~40 ms), which would be charged to the toolkit's overhead.
        disable_nagle_algorithm = True

        def _finish_chat(self) -> None:
            """A chat request stops counting as in flight once its answer is being written:
            the client may send its next request before this thread runs again."""
            if getattr(self, "_chat_started", None) is None:
                return
            with state.lock:
                state.in_flight -= 1
                state.excess_s += time.perf_counter() - self._chat_started - latency
            self._chat_started = None

        def _send(
            self,
            status: int,
            payload: dict[str, Any],
            truncate: bool = False,
            trickle: bool = False,
        ) -> None:
            self._finish_chat()
            body = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if truncate:
                # Half the declared body, then close: the client sees a short read.
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            if trickle:
                for index in range(len(body)):
                    try:
                        self.wfile.write(body[index : index + 1])
                        self.wfile.flush()
                    except OSError:  # the client gave up: the point of the fault
                        self.close_connection = True
                        return
                    time.sleep(1.0)
                return
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server naming)
            with state.lock:
                state.requests += 1
            if self.path.rstrip("/").endswith("/stats"):
                self._send(200, state.stats())
            elif self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:  # noqa: N802
            received = time.perf_counter()
            arrived = time.time()
            length = int(self.headers.get("Content-Length", "0"))
            request = json.loads(self.rfile.read(length) or b"{}")
            if self.path.rstrip("/").endswith("/stats/reset"):
                state.reset_counters()
                self._send(200, state.stats())
                return
            if self.path.rstrip("/").endswith("/fault"):
                try:
                    state.set_fault(str(request.get("mode", "none")), request.get("count"))
                except ValueError as error:
                    self._send(400, {"error": {"message": str(error)}})
                    return
                self._send(200, state.stats())
                return
            if self.path.rstrip("/").endswith("/log/tag") and script is not None:
                script.tag = str(request.get("tag", ""))
                self._send(200, {"tag": script.tag})
                return
            if self.path.rstrip("/").endswith("/embeddings") and script is not None:
                self._embeddings(request)
                return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            with state.lock:
                state.requests += 1
                state.in_flight += 1
                state.peak_in_flight = max(state.peak_in_flight, state.in_flight)
                state.last_chat_arrival = max(state.last_chat_arrival or 0.0, arrived)
            self._chat_started = received
            try:
                self._complete(request)
            finally:
                self._finish_chat()

        def _embeddings(self, request: dict[str, Any]) -> None:
            with state.lock:
                state.requests += 1
            assert script is not None
            vectors = script.embed(request)
            script.record(
                {"role": "embedding", "model": request.get("model"), "input": request.get("input")}
            )
            data = [
                {"object": "embedding", "index": i, "embedding": vector}
                for i, vector in enumerate(vectors)
            ]
            usage = {"prompt_tokens": len(vectors), "total_tokens": len(vectors)}
            self._send(
                200,
                {"object": "list", "data": data, "model": request.get("model"), "usage": usage},
            )

        def _complete(self, request: dict[str, Any]) -> None:
            fault = state.next_fault()
            if fault == "hang":
                # Hold the connection without answering until the client gives up.
                while True:
                    time.sleep(3600)
            if script is None:
                content = json.dumps(outputs_for(request))
            else:
                role, content = script.chat(request)
                script.record(
                    {
                        "role": role,
                        "model": request.get("model"),
                        "messages": request.get("messages"),
                        "temperature": request.get("temperature"),
                        "max_tokens": request.get(
                            "max_tokens", request.get("max_completion_tokens")
                        ),
                        "response_format": request.get("response_format"),
                        # Sampling settings the request sets (absent: the server's default).
                        **{
                            name: request[name]
                            for name in SAMPLING_SETTINGS
                            if request.get(name) is not None
                        },
                    }
                )
            time.sleep(latency)
            if fault == "http500":
                self._send(500, {"error": {"message": "stub fault: internal error"}})
                return
            if fault == "non_json" or (
                fault == "non_json_probes" and guess_role(request) == "probe"
            ):
                content = "I am not JSON, sorry."
            prompt = "".join(str(m.get("content", "")) for m in request.get("messages", []))
            prompt_tokens, completion_tokens = len(prompt) // 4, max(1, len(content) // 4)
            reused_tokens = state.reused_prompt_chars(prompt) // 4
            self._send(
                200,
                {
                    "id": f"stub-{next(_ids)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": request.get("model", "stub"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": content},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "prompt_tokens_details": {"cached_tokens": reused_tokens},
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                    },
                    # llama-server's per-request timings: the latency, split between the
                    # prompt and decoding in proportion to their tokens (the prompt's whole:
                    # its reused part depends on the order requests arrive in, and a run's
                    # records must not).
                    "timings": stub_timings(latency, prompt_tokens, completion_tokens),
                },
                truncate=fault == "truncated",
                trickle=fault == "trickle",
            )

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # one line per request would dominate the benchmark's output

    return Handler


def stub_timings(latency: float, evaluated: int, decoded: int) -> dict[str, float | int]:
    """Timings in llama-server's shape (`prompt_ms`, `predicted_ms`) that add up to the
    latency."""
    total = max(1, evaluated + decoded)
    return {
        "prompt_n": evaluated,
        "prompt_ms": round(1000 * latency * evaluated / total, 3),
        "predicted_n": decoded,
        "predicted_ms": round(1000 * latency * decoded / total, 3),
    }


class _Server(ThreadingHTTPServer):
    # The default backlog (5) drops connection attempts when dozens of clients connect at
    # once; the kernel then retries them after a second, which a benchmark would charge to
    # the toolkit. One thread per connection serves any number of concurrent requests.
    request_queue_size = 256


def serve(
    port: int,
    latency: float,
    fault: str = "none",
    scripted: bool = False,
    log_path: Path | None = None,
    environment: Path | None = None,
) -> None:
    state = ServerState(fault)
    script = Script(log_path, environment) if scripted or log_path is not None else None
    server = _Server(("127.0.0.1", port), make_handler(latency, state, script))
    server.daemon_threads = True
    print(f"stub server on http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


# ----- launching it in its own process -----------------------------------------------------


class StubServer:
    """This server in its own process (the one launcher tests and benchmarks share).

    with StubServer(latency=0.05) as stub:
        stub.base_url            # http://127.0.0.1:PORT/v1
        stub.set_fault("non_json", count=3)
        stub.stats()["chat_requests"]
        stub.tag("ours native")  # with log=...: labels the requests that follow
    """

    def __init__(
        self,
        latency: float = 0.01,
        fault: str = "none",
        scripted: bool = False,
        log: Path | None = None,
        environment: Path | None = None,
        stderr: Path | None = None,
        preexec_fn: Callable[[], Any] | None = None,
    ) -> None:
        self.latency = latency
        self.fault = fault
        self.scripted = scripted
        self.log = log
        self.environment = environment
        # Where the server's stderr goes (e.g. broken-pipe tracebacks when a killed client's
        # call is answered); None: this process's. `preexec_fn` runs in the child first.
        self.stderr = stderr
        self.preexec_fn = preexec_fn
        self.process: subprocess.Popen[str] | None = None
        self.base_url = ""

    def __enter__(self) -> StubServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        command = [sys.executable, str(Path(__file__).resolve()), "--port", "0"]
        command += ["--latency", str(self.latency), "--fault", self.fault]
        if self.scripted:
            command.append("--scripted")
        if self.log is not None:
            command += ["--log", str(self.log)]
        if self.environment is not None:
            command += ["--environment", str(self.environment)]
        if self.stderr is None:
            self.process = subprocess.Popen(
                command, stdout=subprocess.PIPE, text=True, preexec_fn=self.preexec_fn
            )
        else:
            self.stderr.parent.mkdir(parents=True, exist_ok=True)
            with open(self.stderr, "wb") as handle:
                self.process = subprocess.Popen(
                    command,
                    stdout=subprocess.PIPE,
                    stderr=handle,
                    text=True,
                    preexec_fn=self.preexec_fn,
                )
        assert self.process.stdout is not None
        first_line = self.process.stdout.readline()
        match = re.search(r"(http://\S+/v1)", first_line)
        if not match:
            self.stop()
            raise RuntimeError(f"the stub server did not start: {first_line!r}")
        self.base_url = match.group(1)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.stats()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()  # else it stays open until a collection finds it

    def _request(self, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        request = urllib.request.Request(
            f"{self.base_url}{path}", data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    def stats(self) -> dict[str, Any]:
        return self._request("/stats")

    def set_fault(self, mode: str, count: int | None = None) -> dict[str, Any]:
        return self._request("/fault", {"mode": mode, "count": count})

    def tag(self, tag: str) -> dict[str, Any]:
        return self._request("/log/tag", {"tag": tag})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--latency", type=float, default=0.1, help="seconds slept per call")
    parser.add_argument("--fault", choices=FAULT_MODES, default="none", help="initial fault")
    parser.add_argument(
        "--scripted", action="store_true", help="role-aware answers for both implementations"
    )
    parser.add_argument("--log", type=Path, help="append every request as a JSON line (scripted)")
    parser.add_argument(
        "--environment",
        type=Path,
        help="an environment file (original data.json list): the scripted upper bound answers "
        "the option the shown state makes right",
    )
    args = parser.parse_args()
    serve(args.port, args.latency, args.fault, args.scripted, args.log, args.environment)
