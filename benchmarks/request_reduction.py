"""What each role was shown: logged chat requests reduced to information items and parameters.

The scripted stub (`stub_openai_server.py --scripted --log FILE`) records every request either
implementation sends. Prompts differ in wording by design (ours are our own), so requests are
compared by what they carry, found by looking for the environment's own data in them:

| item | present when the request holds |
|---|---|
| `profile` | a line of the user's profile (`formatted_str`) |
| `dates` | the start date or a period's end date as a bare date (session timestamps excluded) |
| `state` | a variable paired with one of its values (`"name": "value"`): the state given |
| `schema` | a variable with every one of its possible values |
| `last_messages` | earlier messages (a scripted reply or follow-up, or an earlier opening) |
| `memory` | a stored memory (the stub's memories are marked `MEMO-<n>`, its facts `FACT-<n>`) |
| `options` | two or more answer options of a question |
| `question` | a question of the environment |
| `system_message` | a non-empty system message |

and by the call parameters `temperature`, `max_tokens`, `response_format` (its type), `top_p`,
`stop` and `seed` ("set" when one is sent; "unset" where the request leaves them to the
server). An
embeddings request is reduced to its `embedding_model` and `headed_inputs`, how many of its
texts carry a session time header (a search query sent as the message was, or stripped).

Each request gets a key (role, policy, call): the role in the deviation table's vocabulary
(`user`, `native`, `awi`, `awe`, `rag`, `upper_bound`, `probe`, `reflector`, `embedder`), the
policy whose run sent it, and the stub's guess of the call (reply, answer, write, ...). Each
request also gets its user-period (that of the latest session opening it quotes; a reflector
request that quotes none, the user whose questions it quotes and its rank among them; an AWI or
mem0 memory operation, the latest user-period before it in its run; else '-') and counts:
`turns` (earlier conversation turns it quotes), `memories` (distinct `MEMO-` marks), `facts`
(distinct `FACT-` marks), `turn_labels` (stored turns shown with the reference RAG's speaker
labels), `own_period_end` and `start_date` (1 when it shows its own period's end date, the
simulated user's "today", or its user's start date), `memory_order` (1 when the memories it
shows are oldest first; not for AWE and RAG) and, for a policy's own calls and the simulated
user's, `shown` (a digest of the marked memories, facts, turns and session openings it shows,
as a set: which ones, not only how many; the stub marks content alike in both codebases).

A group is summarised by its number of calls, its calls per user-period
(`calls_per_user_period`), the union of its items, how many requests carry each item set
(`items_per_request`, not unioned), the set of each parameter's values, the distribution of
each count over its requests, and the same item sets and counts per user-period
(`<name>_by_user_period`, compared where the group's distribution and calls per user-period
agree); `compare` lists every difference between two summaries, each with the kept row of the
deviation table that states exactly it (same role, policy, item and value on each side) or
none.

Reducing a log needs the standard library only (plus the environment's JSON), so the
reference's log can be reduced anywhere; the test suite reduces ours the same way
(tests/simulator/test_reference_requests.py). The deviation table has one reader,
`evolve.spec.paper_deviations` (`load_deviations()` for the packaged table, `read_deviations(path)`
for another file, both validated): `compare` takes its rows.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evolve.spec.paper_deviations import Deviation

ITEMS = (
    "profile",
    "dates",
    "state",
    "schema",
    "last_messages",
    "memory",
    "options",
    "question",
    "system_message",
)
UNSET = "unset"  # a parameter the request does not set
PARAMETERS = ("temperature", "max_tokens", "response_format", "top_p", "seed", "stop")
POLICIES = ("native", "awi", "awe", "rag")
# The stub's call guesses that are the policy's own calls (the role is then the policy).
POLICY_CALLS = ("reply", "answer", "write", "extract", "update")
ROLE_OF_CALL = {
    "user": "user",
    "probe": "probe",
    "upper_bound": "upper_bound",
    "reflector": "reflector",
    "embedding": "embedder",
}
MEMORY_MARK = "MEMO-"  # what the scripted stub writes into every memory it makes up
MEMORY_MARKS = re.compile(r"MEMO-\d+")
# Memories one scripted mem0 update adds (the stub's ADDS_PER_UPDATE): marked 5n..5n+4.
ADDS_PER_UPDATE = 5
FACT_MARKS = re.compile(r"FACT-\d+")  # what it writes into every fact it extracts
# Per-request counts, compared as distributions per role and call (not unioned).
QUANTITIES = (
    "turns",
    "memories",
    "facts",
    "own_period_end",
    "start_date",
    "memory_order",
    "turn_labels",
    "shown",
)
# How the reference's RAG stores a conversation turn: the speaker's label before its text.
TURN_LABELS = re.compile(r"\b(?:USER INPUT|ASSISTANT RESPONSE): ")
# A measure's distribution over [user-period, value] pairs is named with this suffix.
BY_USER_PERIOD = "_by_user_period"
CONVERSATION_MARKS = re.compile(r"\((?:reply|follow-up) \d+\)")
OPENING_MARKS = re.compile(r"\[Current Time: [^\]]+\]")
# Everything the stub marks alike in both codebases (its `_CONTENT_MARK`): stored memories,
# facts, scripted replies and follow-ups, session openings.
CONTENT_MARKS = re.compile(
    "|".join(m.pattern for m in (MEMORY_MARKS, FACT_MARKS, CONVERSATION_MARKS, OPENING_MARKS))
)
# The calls whose marked content is compared item by item (`shown`): the policy's own and the
# simulated user's (a diagnosis probe is not: the reference's AWE and RAG probes see an empty
# store, kept row awe_rag_diagnosis_store, and its counts already show that).
SHOWN_CALLS = ("reply", "answer", "write", "extract", "update", "user")


def load_request_log(path: Path) -> list[dict[str, Any]]:
    """The stub's JSON-lines log."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content", "")
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def policy_of_tag(tag: str) -> str:
    """The policy a log tag names ('reference awi overall' -> 'awi'); an evolution chain's
    agent is 'awi-evolve' (the reference evolves AWI); '-' for none (the upper bound)."""
    words = tag.lower().split()
    if "evolution" in words:
        return "awi-evolve"
    return next((word for word in words if word in POLICIES), "-")


def _environment_strings(environment: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    profiles, dates, questions, options = [], set(), [], []
    for item in environment:
        profile = item.get("user_profile") or {}
        text = profile.get("formatted_str", "") if isinstance(profile, Mapping) else str(profile)
        profiles += [line for line in text.splitlines() if len(line) > 20]
        dates.add(str(item.get("start_time", ""))[:10])
        for period in item.get("periods", []):
            if period.get("period_end"):
                dates.add(str(period["period_end"])[:10])
        for qa in item.get("qas", []):
            questions.append(qa["query"])
            options.append([choice["answer"] for choice in qa["answer_choices"]])
    # Which user-period a session opening belongs to, by its timestamp.
    sessions = {
        str(session["session_time"]): f"{item.get('id', index)}/p{period_index}"
        for index, item in enumerate(environment)
        for period_index, period in enumerate(item.get("periods", []))
        for session in period.get("sessions", [])
        if session.get("session_time")
    }
    period_ends = {
        f"{item.get('id', index)}/p{period_index}": str(period.get("period_end", ""))[:10]
        for index, item in enumerate(environment)
        for period_index, period in enumerate(item.get("periods", []))
    }
    # The user whose question each query is (queries more than one user asks are left out).
    askers: dict[str, set[str]] = {}
    for index, item in enumerate(environment):
        for qa in item.get("qas", []):
            askers.setdefault(qa["query"], set()).add(str(item.get("id", index)))
    question_users = {query: min(users) for query, users in askers.items() if len(users) == 1}
    schemas: dict[str, set[str]] = {}
    for item in environment:
        for name, values in item.get("state_schema", {}).items():
            schemas.setdefault(name, set()).update(str(v) for v in values)
    return {
        "profiles": profiles,
        "dates": sorted(d for d in dates if d),
        "questions": questions,
        "options": options,
        "schemas": schemas,
        "sessions": sessions,
        "period_ends": period_ends,
        "question_users": question_users,
        "start_dates": {
            str(item.get("id", index)): str(item.get("start_time", ""))[:10]
            for index, item in enumerate(environment)
        },
    }


# Calls whose last message is the user's current turn (not an earlier message).
CHAT_TURN_CALLS = ("reply", "answer", "probe")


def request_items(entry: Mapping[str, Any], strings: Mapping[str, Any]) -> list[str]:
    """The information items a logged chat request carries (see the module docstring)."""
    messages = entry.get("messages") or []
    texts = [_text(m) for m in messages]
    full = "\n".join(texts)
    # A chat turn's last message is the current one; a single prompt quotes the conversation.
    earlier = "\n".join(texts[:-1]) if entry.get("role") in CHAT_TURN_CALLS else full
    found: set[str] = set()
    if any(line in full for line in strings["profiles"]):
        found.add("profile")
    if any(re.search(rf"{re.escape(d)}(?![ T]\d\d:)", full) for d in strings["dates"]):
        found.add("dates")
    for name, values in strings["schemas"].items():
        quoted = re.escape(name)
        if any(
            re.search(rf"[\"']?{quoted}[\"']?\s*[:=]\s*[\"']?{re.escape(value)}", full)
            for value in values
        ):
            found.add("state")
        if name in full and all(value in full for value in values):
            found.add("schema")
    if CONVERSATION_MARKS.search(earlier) or "[Current Time:" in earlier:
        found.add("last_messages")
    if MEMORY_MARK in full:
        found.add("memory")
    if any(sum(option in full for option in group) >= 2 for group in strings["options"]):
        found.add("options")
    if any(question in full for question in strings["questions"]):
        found.add("question")
    if messages and messages[0].get("role") == "system" and texts[0].strip():
        found.add("system_message")
    return sorted(found)


def request_quantities(entry: Mapping[str, Any]) -> dict[str, int]:
    """How much of each countable thing a logged chat request shows: earlier conversation
    turns (the stub's reply / follow-up marks and session openings before the current turn),
    stored memories (distinct MEMO- marks), extracted facts (distinct FACT- marks) and
    stored turns' speaker labels (`TURN_LABELS`)."""
    texts = [_text(m) for m in entry.get("messages") or []]
    full = "\n".join(texts)
    earlier = "\n".join(texts[:-1]) if entry.get("role") in CHAT_TURN_CALLS else full
    turns = {m.group(0) for m in CONVERSATION_MARKS.finditer(earlier)}
    turns |= {m.group(0) for m in OPENING_MARKS.finditer(earlier)}
    return {
        "turns": len(turns),
        "memories": len(set(MEMORY_MARKS.findall(full))),
        "facts": len(set(FACT_MARKS.findall(full))),
        "turn_labels": len(TURN_LABELS.findall(full)),
    }


OPENING_TIME = re.compile(r"\[Current Time: ([^\]]+)\]")


def shown_digest(entry: Mapping[str, Any]) -> str:
    """Which marked content a request shows, as a short digest of its sorted content marks
    (`CONTENT_MARKS`: the memories, facts, turns and session openings): two requests with
    the same digest show the same memories and turns, whatever their order or wording. The
    stub's marks are functions of content, never of wording, so the digests of the two
    codebases' requests are comparable (a memory kept, dropped or retrieved differently
    changes it)."""
    full = "\n".join(_text(m) for m in entry.get("messages") or [])
    marks = "\n".join(sorted(set(CONTENT_MARKS.findall(full))))
    return hashlib.sha256(marks.encode("utf-8")).hexdigest()[:12]


def request_user_period(entry: Mapping[str, Any], strings: Mapping[str, Any]) -> str:
    """The user-period a request belongs to: that of the latest session opening it quotes
    (every conversation, history or transcript starts with one), or '-' when it quotes none
    (the upper bound, or a memory without timestamps)."""
    full = "\n".join(_text(m) for m in entry.get("messages") or [])
    times = [t for t in OPENING_TIME.findall(full) if t in strings["sessions"]]
    return strings["sessions"][max(times)] if times else "-"


def shows_start_date(entry: Mapping[str, Any], strings: Mapping[str, Any], where: str) -> int:
    """1 when the request shows its user's start date (the profile's date) as a bare date."""
    start = strings["start_dates"].get(where.split("/")[0], "")
    if not start:
        return 0
    full = "\n".join(_text(m) for m in entry.get("messages") or [])
    return int(re.search(rf"{re.escape(start)}(?![ T]\d\d:)", full) is not None)


def shows_own_period_end(entry: Mapping[str, Any], strings: Mapping[str, Any], where: str) -> int:
    """1 when the request shows the end date of its own user-period as a bare date (the
    simulated user's 'today'), else 0: `dates` alone cannot tell it from another date."""
    end = strings["period_ends"].get(where, "")
    if not end:
        return 0
    full = "\n".join(_text(m) for m in entry.get("messages") or [])
    return int(re.search(rf"{re.escape(end)}(?![ T]\d\d:)", full) is not None)


def _response_format(value: Any) -> str:
    if not value:
        return "none"
    return str(value.get("type", "other")) if isinstance(value, Mapping) else str(value)


def reduce_request(entry: Mapping[str, Any], strings: Mapping[str, Any]) -> dict[str, Any]:
    """One logged request as {role, policy, call, items, parameters} (no prompt text)."""
    call = str(entry.get("role", "structured"))
    policy = policy_of_tag(str(entry.get("tag", "")))
    if call in POLICY_CALLS:
        role = "awi" if policy == "awi-evolve" else policy
    else:
        role = ROLE_OF_CALL.get(call, call)
    if role in ("upper_bound", "reflector"):
        policy = "-"  # one per run, whichever policy's run computed it
    reduced: dict[str, Any] = {"role": role, "policy": policy, "call": call}
    if call == "embedding":
        reduced["embedding_model"] = entry.get("model")
        inputs = entry.get("input") or []
        inputs = [inputs] if isinstance(inputs, str) else inputs
        # A search query sent as the message was (its time header kept) or stripped.
        reduced["headed_inputs"] = sum(bool(OPENING_MARKS.search(str(text))) for text in inputs)
        return reduced
    reduced["items"] = request_items(entry, strings)
    reduced.update(request_quantities(entry))
    if call in SHOWN_CALLS:
        reduced["shown"] = shown_digest(entry)
    reduced["user_period"] = request_user_period(entry, strings)
    reduced["own_period_end"] = shows_own_period_end(entry, strings, reduced["user_period"])
    reduced["start_date"] = shows_start_date(entry, strings, reduced["user_period"])
    reduced["temperature"] = entry.get("temperature")
    reduced["max_tokens"] = entry.get("max_tokens")
    reduced["response_format"] = _response_format(entry.get("response_format"))
    # "unset": the request leaves it to the server (a word, not null: the deviation table is
    # TOML, which has no null).
    for name in ("top_p", "stop"):
        reduced[name] = UNSET if entry.get(name) is None else entry[name]
    # Whether a seed is sent, not its value (each request's own: a list of them says nothing).
    reduced["seed"] = UNSET if entry.get("seed") is None else "set"
    return reduced


# Policies whose memory order is not compared: the reference sorts mem0's hits by their
# creation time in whole seconds, so hits made in one second (one update's memories, or with
# the fast stub several updates') keep the search's order, which varies between runs.
UNORDERED_STORES = frozenset({"awe", "rag"})


# Roles whose requests often quote no session opening but happen inside one user's period,
# in the order the period runs: AWI writes and mem0's extraction and update.
INHERITING_ROLES = frozenset({"awi", "awe"})


def reflector_user(entry: Mapping[str, Any], strings: Mapping[str, Any]) -> str | None:
    """The user whose chain a reflector request belongs to: the one user whose questions its
    feedback quotes, or None."""
    full = "\n".join(_text(m) for m in entry.get("messages") or [])
    users = {user for query, user in strings["question_users"].items() if query in full}
    return next(iter(users)) if len(users) == 1 else None


def memory_order(entry: Mapping[str, Any], first_seen: dict[int, int], position: int) -> int:
    """1 when the stored memories a request shows (its `MEMO-` marks, in the order shown)
    appear oldest first, else 0. A memory's age is that of its batch (the memories one write
    made), the position of the first request of the run that showed the batch; `first_seen`
    is updated with the batches shown here for the first time."""
    full = "\n".join(_text(m) for m in entry.get("messages") or [])
    # The memories one scripted mem0 update adds are made at one time: a batch, whose members
    # may be shown in any order (`MEMO-<ADDS_PER_UPDATE * n + k>`, k < ADDS_PER_UPDATE).
    batches = [int(mark[5:]) // ADDS_PER_UPDATE for mark in MEMORY_MARKS.findall(full)]
    shown = list(dict.fromkeys(batches))
    for batch in shown:
        first_seen.setdefault(batch, position)
    ages = [first_seen[batch] for batch in shown]
    return int(ages == sorted(ages))


def reduce_log(
    entries: Iterable[Mapping[str, Any]], environment: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Every request of a log reduced (order kept).

    Requests that quote no session opening are placed too, so that calls are compared per
    user-period: a memory operation (`INHERITING_ROLES`) belongs to the user-period of the
    latest request before it in the same run (tag) that quotes one (a user's period runs as
    one piece in both codebases); the n-th reflector request (from 0) quoting one user's
    questions in a run belongs to `<user>/p<n>`, the period its chain reflects on (ours
    reflects on every user's period before the next period starts)."""
    strings = _environment_strings(environment)
    reduced = []
    latest: dict[str, str] = {}  # tag -> the latest user-period seen
    reflections: dict[tuple[str, str], int] = {}  # (tag, user) -> reflector requests so far
    first_seen: dict[str, dict[int, int]] = {}  # tag -> memory batch -> first request showing it
    for position, entry in enumerate(entries):
        row = reduce_request(entry, strings)
        tag = str(entry.get("tag", ""))
        if "items" in row and row["policy"] not in UNORDERED_STORES:
            row["memory_order"] = memory_order(entry, first_seen.setdefault(tag, {}), position)
        if row.get("user_period", "-") != "-":
            latest[tag] = row["user_period"]
        elif row["role"] == "reflector" and (user := reflector_user(entry, strings)):
            step = reflections.get((tag, user), 0)
            reflections[tag, user] = step + 1
            row["user_period"] = f"{user}/p{step}"
        elif row.get("user_period") == "-" and row["role"] in INHERITING_ROLES and tag in latest:
            row["user_period"] = latest[tag]
        reduced.append(row)
    return reduced


def _distribution(values: Iterable[Any]) -> list[list[Any]]:
    """[[value, how many requests], ...] sorted by value: a per-request count, not a union."""
    counts: dict[Any, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return [[value, counts[value]] for value in sorted(counts)]


def summarize(reduced: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per 'role/policy/call': the count, the union of items and how many requests carry each
    item set (`items_per_request`), each parameter's set of values, the distribution of each
    quantity over the requests (`turns`, `memories`, `facts`), the calls per user-period, and
    the item sets and quantities per user-period (`<name>_by_user_period`: how many requests
    of each user-period carry each value)."""
    groups: dict[str, dict[str, Any]] = {}
    per_request: dict[str, dict[str, list[Any]]] = {}
    for entry in reduced:
        key = f"{entry['role']}/{entry['policy']}/{entry['call']}"
        group = groups.setdefault(key, {"count": 0})
        group["count"] += 1
        if "items" in entry:
            group["items"] = sorted(set(group.get("items", [])) | set(entry["items"]))
            lists = per_request.setdefault(key, {})
            lists.setdefault("items_per_request", []).append(",".join(sorted(entry["items"])))
            for name in QUANTITIES:
                if name in entry:
                    lists.setdefault(name, []).append(entry[name])
            if "user_period" in entry:
                where = entry["user_period"]
                lists.setdefault("calls_per_user_period", []).append(where)
                # The same measures per user-period (compared where the role's agree).
                request_items = ",".join(sorted(entry["items"]))
                lists.setdefault(f"items_per_request{BY_USER_PERIOD}", []).append(
                    (where, request_items)
                )
                for name in QUANTITIES:
                    if name in entry:
                        lists.setdefault(f"{name}{BY_USER_PERIOD}", []).append((where, entry[name]))
        if "headed_inputs" in entry:
            per_request.setdefault(key, {}).setdefault("headed_inputs", []).append(
                entry["headed_inputs"]
            )
        for name in (*PARAMETERS, "embedding_model"):
            if name in entry:
                values = {json.dumps(v) for v in group.get(name, [])} | {json.dumps(entry[name])}
                group[name] = sorted((json.loads(v) for v in values), key=json.dumps)
    for key, lists in per_request.items():
        for name, values in lists.items():
            groups[key][name] = _distribution(values)
    return dict(sorted(groups.items()))


# ----- differences, and the deviation rows that cover them --------------------------------


@dataclass(frozen=True)
class Difference:
    key: str  # role/policy/call
    item: str  # an information item, a parameter, or "calls" (made on one side only)
    ours: Any
    theirs: Any
    covered_by: str | None  # the id of the kept deviation row that states it

    @property
    def role(self) -> str:
        return self.key.split("/", 1)[0]

    def describe(self) -> str:
        return f"role {self.key}: {self.item}: ours {self.ours!r}, reference {self.theirs!r}"


def _covering(
    deviations: Sequence[Deviation], key: str, item: str, ours: Any, theirs: Any
) -> str | None:
    """The kept row that states exactly this difference (its role, policy, item and the
    value on each side), or None: a row never accepts a value it does not state."""
    role, policy, call = key.split("/", 2)
    for row in deviations:
        if row.accepts(role, policy, call, item, ours, theirs):
            return row.id
    return None


def compare(
    ours: Mapping[str, Mapping[str, Any]],
    theirs: Mapping[str, Mapping[str, Any]],
    deviations: Sequence[Deviation] = (),
) -> list[Difference]:
    """Every difference between two summaries (`summarize`), each with the kept deviation row
    that covers it (same role and item, and the same policy when the row names policies) or
    None. `deviations`: rows of `evolve.spec.paper_deviations` (`read_deviations(path)`)."""
    differences: list[Difference] = []

    def add(key: str, item: str, ours_value: Any, theirs_value: Any) -> None:
        covered = _covering(deviations, key, item, ours_value, theirs_value)
        differences.append(Difference(key, item, ours_value, theirs_value, covered))

    for key in sorted(set(ours) | set(theirs)):
        mine, reference = ours.get(key), theirs.get(key)
        if mine is None or reference is None:
            item = "embedding_model" if key.startswith("embedder/") else "calls"
            add(
                key,
                item,
                f"{mine['count']} calls" if mine else "no such call",
                f"{reference['count']} calls" if reference else "no such call",
            )
            continue
        mine_items, their_items = set(mine.get("items", [])), set(reference.get("items", []))
        for item in sorted(mine_items ^ their_items):
            add(key, item, item in mine_items, item in their_items)
        for name in (*PARAMETERS, "embedding_model"):
            if mine.get(name) != reference.get(name):
                add(key, name, mine.get(name), reference.get(name))
        if mine["count"] != reference["count"]:
            add(key, "calls", mine["count"], reference["count"])
        # Per-request measures, where the reference's reduced log has them; where a role's
        # distribution and its calls per user-period agree, the same measure per user-period
        # must agree too (the same counts in other periods).
        same_periods = mine.get("calls_per_user_period") == reference.get("calls_per_user_period")
        for name in ("calls_per_user_period", "items_per_request", *QUANTITIES, "headed_inputs"):
            if name not in reference:
                continue
            if mine.get(name) != reference[name]:
                add(key, name, mine.get(name), reference[name])
                continue
            refined = f"{name}{BY_USER_PERIOD}"
            if same_periods and refined in reference and mine.get(refined) != reference[refined]:
                add(key, refined, mine.get(refined), reference[refined])
    return differences
