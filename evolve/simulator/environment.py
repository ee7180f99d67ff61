"""AMemGym environment data: one item per simulated user, exactly the original `data.json`.

The data model, its lossless import/export and its consistency checks (what `evolve env
validate` runs) change together, so they share this module.

An environment file is a JSON list of items::

    {id, start_time, user_profile, state_schema,
     periods: [{period_start, period_end, period_summary,
                sessions: [{event, exposed_states, query, session_time}],
                state, updates: {var: {old, new}}, update_cnts}],
     qas: [{query, required_info, answer_choices: [{state, answer, type}]}]}

Period 0 holds the initial state (its `period_start` is null and its `updates` set every
variable from null). Answer-choice `type` is `"experience"` when the choice's state tuple occurs
on the user's trajectory and `"random"` for the unseen padding (the original's names).
`update_cnts` counts changes per variable: the original repeats the final totals in every
period, the offline generator writes cumulative counts up to the period; nothing relies on it.

Files made by the original code load and save back to equal JSON, key order included: unknown
keys are kept (`extra="allow"`), keys absent from the input stay absent, and each record
remembers the key order it was read with. Structural problems are reported by pydantic;
consistency problems (values outside the schema, exposures that disagree with the state, a
question without a gold choice, ...) by `EnvironmentItem.problems()`, naming the item, period
and variable so that a hand-edited file can be fixed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from evolve.core.errors import EnvironmentDataError
from evolve.core.files import atomic_write_text, read_json_file
from evolve.core.spec_base import problem_lines

# Types of answer choices, as the original generator names them.
CHOICE_EXPERIENCED = "experience"
CHOICE_RANDOM = "random"

# Problems quoted in an exception message; more are kept on `InconsistentEnvironmentError`.
_PROBLEMS_IN_MESSAGE = 3
# Problems kept (and listed by `evolve env validate`); the rest are only counted, so a file
# of millions of bogus users costs neither gigabytes of strings nor millions of lines.
PROBLEMS_KEPT = 50


class InconsistentEnvironmentError(EnvironmentDataError):
    """An environment file loaded but its content is malformed or inconsistent.

    `problems` holds the first `PROBLEMS_KEPT`; `total` counts all of them.
    """

    def __init__(self, source: str, problems: list[str], total: int | None = None) -> None:
        self.source = source
        self.problems = list(problems[:PROBLEMS_KEPT])
        self.total = len(problems) if total is None else total
        shown = "; ".join(self.problems[:_PROBLEMS_IN_MESSAGE])
        more = self.total - min(len(self.problems), _PROBLEMS_IN_MESSAGE)
        suffix = (
            f"; ... and {more} more (run `evolve env validate` to list the first {PROBLEMS_KEPT})"
            if more > 0
            else ""
        )
        super().__init__(f"{source}: {self.total} problem(s): {shown}{suffix}")


def first_problems(problems: Iterable[str], limit: int = PROBLEMS_KEPT) -> tuple[list[str], int]:
    """The first `limit` problems and how many there are in all (the rest are only counted)."""
    kept: list[str] = []
    total = 0
    for problem in problems:
        if total < limit:
            kept.append(problem)
        total += 1
    return kept, total


class _Record(BaseModel):
    """A JSON object of the original format that saves back exactly as it was read."""

    model_config = ConfigDict(extra="allow")

    _key_order: list[str] | None = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        # Keyword order is not a file's key order: constructed records use field order.
        self._key_order = None

    @model_validator(mode="wrap")
    @classmethod
    def _remember_key_order(cls, data: Any, handler: Any) -> Any:
        record = handler(data)
        if isinstance(data, dict):
            record._key_order = list(data.keys())
        return record

    def to_original(self) -> dict[str, Any]:
        """Plain JSON data: the keys that were given (read or set), in their original order."""
        present: dict[str, Any] = {
            name: getattr(self, name)
            for name in type(self).model_fields
            if name in self.model_fields_set
        }
        present.update(self.__pydantic_extra__ or {})
        order = self._key_order or []
        keys = [key for key in order if key in present]
        keys += [key for key in present if key not in keys]
        return {key: _plain(present[key]) for key in keys}


def _plain(value: Any) -> Any:
    if isinstance(value, _Record):
        return value.to_original()
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {key: _plain(inner) for key, inner in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(inner) for inner in value]
    return value


class AnswerChoice(_Record):
    state: list[StrictStr] = Field(description="Values of the question's required_info, in order.")
    answer: StrictStr
    type: StrictStr | None = Field(
        default=None, description='"experience" (on the trajectory) or "random" (padding).'
    )


class QA(_Record):
    query: StrictStr
    required_info: list[StrictStr]
    answer_choices: list[AnswerChoice]


class Session(_Record):
    event: StrictStr | None = None
    # Values are strings; the original generator occasionally stored one-element lists.
    exposed_states: dict[str, StrictStr | list[StrictStr]] = Field(default_factory=dict)
    query: StrictStr
    session_time: StrictStr

    def exposed_values(self) -> dict[str, str]:
        """Exposed values as plain strings (one-element lists unwrapped)."""
        return {name: _as_value(value) for name, value in self.exposed_states.items()}


class StateUpdate(_Record):
    old: StrictStr | None = None
    new: StrictStr


class Period(_Record):
    period_start: StrictStr | None = None
    period_end: StrictStr | None = None
    period_summary: StrictStr | None = None
    sessions: list[Session]
    state: dict[str, StrictStr]
    updates: dict[str, StateUpdate] = Field(default_factory=dict)
    update_cnts: dict[str, StrictInt] = Field(default_factory=dict)


class EnvironmentItem(_Record):
    """One simulated user: profile, state schema, state trajectory and evaluation questions."""

    id: StrictStr
    start_time: StrictStr | None = None
    user_profile: StrictStr | dict[str, Any]
    state_schema: dict[str, list[StrictStr]]
    periods: list[Period] = Field(min_length=1)
    qas: list[QA]

    def profile_text(self) -> str:
        """The profile as text (the original keeps a ready `formatted_str` in a dict)."""
        profile = self.user_profile
        if isinstance(profile, str):
            return profile
        if isinstance(profile.get("formatted_str"), str):
            return profile["formatted_str"]
        return "\n".join(f"{key}: {value}" for key, value in profile.items())

    def gold_state(self, period_index: int, qa_index: int) -> tuple[str, ...]:
        """The required variables' values at the end of `period_index`, in question order."""
        state = self.periods[period_index].state
        qa = self.qas[qa_index]
        missing = [name for name in qa.required_info if name not in state]
        if missing:
            raise EnvironmentDataError(
                f"item {self.id!r} period {period_index}: question {qa_index} requires "
                f"{missing} but the period's state has no value for them; fix the state"
            )
        return tuple(state[name] for name in qa.required_info)

    def gold_choice_index(self, period_index: int, qa_index: int) -> int:
        """Index of the answer choice whose state is the gold state of `period_index`."""
        gold = list(self.gold_state(period_index, qa_index))
        for index, choice in enumerate(self.qas[qa_index].answer_choices):
            if choice.state == gold:
                return index
        raise EnvironmentDataError(
            f"item {self.id!r} period {period_index}: question {qa_index} has no answer choice "
            f"with the gold state {gold}; add a choice for it"
        )

    def last_write_period(self, var: str, period_index: int) -> int:
        """The latest period <= `period_index` that set or exposed `var` (0: the initial one).

        The diagnosis asks whether memory held the value right after it was last written.
        """
        for index in range(period_index, 0, -1):
            period = self.periods[index]
            if var in period.updates or any(var in s.exposed_states for s in period.sessions):
                return index
        return 0

    def problems(self) -> list[str]:
        """Every consistency problem, each naming the item, period/question and variable."""
        return _item_problems(self)


class Environment(BaseModel):
    """A whole environment: the list of items of one `data.json`."""

    items: list[EnvironmentItem]

    @classmethod
    def from_original(cls, data: Any, source: str = "environment") -> Environment:
        """Build from parsed `data.json` content; structural errors name the item and field."""
        if not isinstance(data, list):
            raise EnvironmentDataError(
                f"{source}: expected a JSON list of environment items (the original data.json "
                f"format), got {type(data).__name__}"
            )
        items: list[EnvironmentItem] = []
        problems: list[str] = []
        total = 0
        for index, raw in enumerate(data):
            try:
                items.append(EnvironmentItem.model_validate(raw))
            except ValidationError as error:
                total += error.error_count()
                if len(problems) >= PROBLEMS_KEPT:
                    continue  # counted only: formatting millions of messages is the cost
                label = f"item #{index}"
                if isinstance(raw, dict) and isinstance(raw.get("id"), str):
                    label += f" ({raw['id']!r})"
                lines = problem_lines(error, EnvironmentItem)
                problems.extend(f"{label}: {line}" for line in lines)
        if total:
            raise InconsistentEnvironmentError(source, problems, total)
        return cls(items=items)

    def to_original(self) -> list[dict[str, Any]]:
        return [item.to_original() for item in self.items]

    def content_hash(self) -> str:
        """sha256 of the canonical JSON (key order and whitespace do not matter)."""
        canonical = json.dumps(
            self.to_original(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def item(self, item_id: str) -> EnvironmentItem:
        for item in self.items:
            if item.id == item_id:
                return item
        known = ", ".join(item.id for item in self.items[:5])
        raise EnvironmentDataError(
            f"no user {item_id!r} in this environment; known ids include: {known}"
        )

    def problems(self) -> list[str]:
        """Every consistency problem (see `iter_problems` to stop early or count)."""
        return list(self.iter_problems())

    def iter_problems(self) -> Iterator[str]:
        if not self.items:
            yield (
                "the environment has no users (an empty list); an evaluation of it would score "
                "nothing. Make one with `evolve env synthesize --preset tiny --out FILE`"
            )
        seen: set[str] = set()
        for item in self.items:
            if item.id in seen:
                yield f"item {item.id!r}: duplicate id; every item needs its own id"
            seen.add(item.id)
            yield from item.problems()


def load_environment(path: str | os.PathLike[str], *, check: bool = True) -> Environment:
    """Read a `data.json` file; with `check`, inconsistent content raises with every problem."""
    path = Path(path)
    data = read_json_file(
        path,
        "environment file",
        error=EnvironmentDataError,
        missing_hint="make one with `evolve env synthesize --preset tiny --out FILE`",
    )
    env = Environment.from_original(data, source=str(path))
    if check:
        problems, total = first_problems(env.iter_problems())
        if total:
            raise InconsistentEnvironmentError(str(path), problems, total)
    return env


def dumps_environment(env: Environment) -> str:
    """The file content `save_environment` writes (stable: same environment, same bytes)."""
    return json.dumps(env.to_original(), ensure_ascii=False, indent=2) + "\n"


def save_environment(env: Environment, path: str | os.PathLike[str]) -> None:
    """Write the original `data.json` format atomically (see `atomic_write_text`)."""
    atomic_write_text(path, dumps_environment(env))


# --- consistency checks -------------------------------------------------------------------


def _as_value(value: str | list[str]) -> str:
    if isinstance(value, list):
        return value[0] if len(value) == 1 else json.dumps(value, ensure_ascii=False)
    return value


def _item_problems(item: EnvironmentItem) -> list[str]:
    head = f"item {item.id!r}"
    schema = item.state_schema
    problems: list[str] = []

    def value_problem(where: str, var: str, value: str, what: str) -> str | None:
        if var not in schema:
            return f"{where}: {what} names unknown variable {var!r} (not in state_schema)"
        if value not in schema[var]:
            return (
                f"{where}: {what} of variable {var!r} is {value!r}, which is not one of its "
                f"schema values {schema[var]}"
            )
        return None

    for var, values in schema.items():
        if len(values) < 2:
            problems.append(f"{head}: variable {var!r} needs at least 2 values, has {values}")
        duplicates = sorted({v for v in values if values.count(v) > 1})
        if duplicates:
            problems.append(f"{head}: variable {var!r} lists values {duplicates} twice")

    previous: dict[str, str] | None = None
    for index, period in enumerate(item.periods):
        where = f"{head} period {index}"
        for var, value in period.state.items():
            found = value_problem(where, var, value, "state")
            if found:
                problems.append(found)
        for var in schema:
            if var not in period.state:
                problems.append(f"{where}: state has no value for variable {var!r}")
        for var, update in period.updates.items():
            found = value_problem(where, var, update.new, "update.new")
            if found:
                problems.append(found)
                continue
            if period.state.get(var) != update.new:
                problems.append(
                    f"{where}: update of variable {var!r} sets {update.new!r} but the period's "
                    f"state says {period.state.get(var)!r}"
                )
            if previous is not None and update.old != previous.get(var):
                problems.append(
                    f"{where}: update of variable {var!r} starts from {update.old!r} but the "
                    f"previous period's state says {previous.get(var)!r}"
                )
        if previous is not None:
            for var, value in period.state.items():
                if var in previous and previous[var] != value and var not in period.updates:
                    problems.append(
                        f"{where}: variable {var!r} changed from {previous[var]!r} to {value!r} "
                        "without an entry in updates"
                    )
        for var, count in period.update_cnts.items():
            if var not in schema:
                problems.append(f"{where}: update_cnts names unknown variable {var!r}")
            elif count < 0:
                problems.append(f"{where}: update_cnts of variable {var!r} is negative ({count})")
        exposed_here: set[str] = set()
        for session_index, session in enumerate(period.sessions):
            session_where = f"{where} session {session_index}"
            for var, value in session.exposed_values().items():
                exposed_here.add(var)
                found = value_problem(session_where, var, value, "exposed value")
                if found:
                    problems.append(found)
                elif period.state.get(var) != value:
                    problems.append(
                        f"{session_where}: exposes {var!r} = {value!r} but the period's state "
                        f"says {period.state.get(var)!r}"
                    )
        # The memory test presumes the user revealed every value it is later asked about.
        must_expose = set(schema) if index == 0 else set(period.updates)
        for var in sorted(must_expose - exposed_here):
            if var in schema:
                problems.append(f"{where}: variable {var!r} is set but no session exposes it")
        previous = dict(period.state)

    for qa_index, qa in enumerate(item.qas):
        where = f"{head} question {qa_index}"
        required = qa.required_info
        unknown = [var for var in required if var not in schema]
        for var in unknown:
            problems.append(f"{where}: required_info names unknown variable {var!r}")
        if len(set(required)) != len(required):
            problems.append(f"{where}: required_info repeats a variable: {required}")
        seen_states: set[tuple[str, ...]] = set()
        for choice_index, choice in enumerate(qa.answer_choices):
            choice_where = f"{where} choice {choice_index}"
            state = tuple(choice.state)
            if len(state) != len(required):
                problems.append(
                    f"{choice_where}: state has {len(state)} values but required_info has "
                    f"{len(required)} variables {required}"
                )
                continue
            for var, value in zip(required, state, strict=True):
                if var in schema and value not in schema[var]:
                    problems.append(
                        f"{choice_where}: value {value!r} of variable {var!r} is not one of its "
                        f"schema values {schema[var]}"
                    )
            if state in seen_states:
                problems.append(f"{choice_where}: duplicate choice state {list(state)}")
            seen_states.add(state)
        if unknown:
            continue
        for period_index, period in enumerate(item.periods):
            if any(var not in period.state for var in required):
                continue  # already reported as a missing state value
            gold = tuple(period.state[var] for var in required)
            if gold not in seen_states:
                problems.append(
                    f"{where} period {period_index}: no answer choice matches the gold state "
                    f"{dict(zip(required, gold, strict=True))}"
                )
    return problems
