"""The paper protocol's deviations from the reference AMemGym code, as data.

`paper_deviations.toml` (package data, next to this module) lists every difference between
what `protocol = "paper"` sends or scores and what the reference code does: the deliberate
ones (`status = "kept"`, printed at the start of every paper run) and the closed ones
(history). The same file is rendered into docs/reference/paper-deviations.md and read by the
tests that compare each role's requests with the reference's, so the three cannot drift.
Every reader goes through `parse_deviations` (the same checks for the bundled table and for
any other file, `read_deviations(path)`).

    python -m evolve.spec.paper_deviations --markdown > docs/reference/paper-deviations.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections.abc import Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# Who is shown something: the simulated user, each policy, the upper bound, the diagnosis
# probe, the reflector and the embedding model.
ROLES = (
    "user",
    "native",
    "awi",
    "awe",
    "rag",
    "upper_bound",
    "probe",
    "reflector",
    "embedder",
)
# What a request carries (information items and call parameters), and how the reply is read.
ITEMS = (
    "profile",
    "dates",
    "state",
    "schema",
    "last_messages",
    "memory",
    "options",
    "feedback",
    "question",
    "system_message",
    "temperature",
    "max_tokens",
    "response_format",
    "top_p",
    "seed",
    "stop",
    "model",
    "embedding_model",
    "parsing",
    "wording",  # how a prompt is worded (not compared: the project writes its own)
    "calls",  # how many calls the role makes (or: on one side only)
    "calls_per_user_period",  # how many calls in each user-period
    "items_per_request",  # how many requests carry each set of items
    "turns",  # earlier conversation turns a request quotes
    "memories",  # stored memories a request shows
    "facts",  # freshly extracted facts a request shows
    "own_period_end",  # whether a request shows its own period's end date
    "start_date",  # whether a request shows its user's start date
    "memory_order",  # whether the memories a request shows are oldest first
    "headed_inputs",  # texts of an embeddings request that carry a session time header
    "turn_labels",  # stored conversation turns shown with their speaker's label
    "shown",  # which marked memories, facts and turns a policy's or the user's request shows
)
# The items the request comparison measures: a kept row covering one of them states the
# value expected on each side (`expect`), and only that exact difference is accepted.
COMPARED_ITEMS = (
    "profile",
    "dates",
    "state",
    "schema",
    "last_messages",
    "memory",
    "options",
    "question",
    "system_message",
    "temperature",
    "max_tokens",
    "response_format",
    "top_p",
    "seed",
    "stop",
    "embedding_model",
    "calls",
    "calls_per_user_period",
    "items_per_request",
    "turns",
    "memories",
    "facts",
    "own_period_end",
    "start_date",
    "memory_order",
    "headed_inputs",
    "turn_labels",
    "shown",
)
DEVIATIONS_FILE = "paper_deviations.toml"


class Expectation(BaseModel):
    """The value a compared item takes on each side where a kept row differs: the request
    comparison accepts a difference only when it equals one of its row's expectations."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    item: str = Field(description="A compared item the row lists.")
    call: str | None = Field(
        default=None, description="Only requests of this call (reply, write, ...); None: any."
    )
    policy: str | None = Field(
        default=None, description="Only requests of this policy's run; None: any the row names."
    )
    ours: Any = Field(description="The value on our side, as the comparison reports it.")
    reference: Any = Field(description="The value on the reference's side.")

    def matches(self, policy: str, call: str, item: str, ours: Any, reference: Any) -> bool:
        return (
            self.item == item
            and (self.call is None or self.call == call)
            and (self.policy is None or self.policy == policy)
            and _same(self.ours, ours)
            and _same(self.reference, reference)
        )


def _same(expected: Any, actual: Any) -> bool:
    """Equal as JSON values (TOML arrays and JSON lists, ints and floats alike)."""
    return json.dumps(expected, sort_keys=True) == json.dumps(actual, sort_keys=True) or (
        expected == actual
    )


class Deviation(BaseModel):
    """One difference between the paper protocol and the reference code."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Short unique slug.")
    status: Literal["kept", "closed"] = Field(
        description="kept: deliberate, printed at every paper run's start; closed: history."
    )
    roles: list[str] = Field(description="Roles whose requests it changes.")
    items: list[str] = Field(
        description="What differs in those requests; empty: only how replies are scored."
    )
    ours: str = Field(min_length=1)
    reference: str = Field(min_length=1)
    why: str = Field(min_length=1)
    affects: str = Field(min_length=1, description="Which reported numbers it moves.")
    policies: list[str] = Field(
        default_factory=list,
        description="The runs the row is about (native, awi, awe, rag, awi-evolve); empty: all.",
    )
    expect: list[Expectation] = Field(
        default_factory=list,
        description="Per compared item: the value on each side; nothing else is accepted.",
    )

    @field_validator("roles")
    @classmethod
    def _known_roles(cls, roles: list[str]) -> list[str]:
        return _known("role", roles, ROLES)

    @field_validator("items")
    @classmethod
    def _known_items(cls, items: list[str]) -> list[str]:
        return _known("item", items, ITEMS)

    @model_validator(mode="after")
    def _expectations_state_each_compared_item(self) -> Deviation:
        stray = [e.item for e in self.expect if e.item not in self.items]
        if stray:
            raise ValueError(
                f"expect names item(s) {stray} the row does not list in items {self.items}; "
                "add them to items or drop the expectation"
            )
        if self.status == "kept":
            missing = [
                item
                for item in self.items
                if item in COMPARED_ITEMS and not any(e.item == item for e in self.expect)
            ]
            if missing:
                raise ValueError(
                    f"kept row lists compared item(s) {missing} without an expect entry; add "
                    "[[deviation.expect]] with item, ours and reference (the values the request "
                    "comparison reports) for each"
                )
        return self

    def accepts(self, role: str, policy: str, call: str, item: str, ours: Any, ref: Any) -> bool:
        """Whether this row states exactly this difference (a kept row, same role, policy,
        item and values on both sides)."""
        if self.status != "kept" or role not in self.roles or item not in self.items:
            return False
        if self.policies and policy not in self.policies:
            return False
        return any(e.matches(policy, call, item, ours, ref) for e in self.expect)

    def start_line(self) -> str:
        """The one line printed at the start of a paper run."""
        return f"  {self.id}: {self.ours}"


def _known(what: str, values: list[str], vocabulary: tuple[str, ...]) -> list[str]:
    unknown = [value for value in values if value not in vocabulary]
    if unknown:
        raise ValueError(f"unknown {what}(s) {unknown}; expected some of {', '.join(vocabulary)}")
    if len(set(values)) != len(values):
        raise ValueError(f"a {what} is listed twice: {list(values)}")
    return values


def parse_deviations(text: str, source: str = DEVIATIONS_FILE) -> list[Deviation]:
    """Validated deviations from TOML text; ValueError naming the row and the problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{source}: not valid TOML: {error}") from None
    extra = set(data) - {"deviation"}
    if extra:
        raise ValueError(f"{source}: unknown top-level key(s) {sorted(extra)}; only [[deviation]]")
    deviations: list[Deviation] = []
    for index, row in enumerate(data.get("deviation", [])):
        try:
            deviations.append(Deviation.model_validate(row))
        except ValidationError as error:
            label = row.get("id", f"#{index + 1}") if isinstance(row, dict) else f"#{index + 1}"
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'row'}: {e['msg']}" for e in error.errors()
            )
            raise ValueError(f"{source}: deviation {label}: {problems}") from None
    ids = [deviation.id for deviation in deviations]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"{source}: deviation id(s) {repeated} used more than once")
    return deviations


@cache
def _load_cached() -> tuple[Deviation, ...]:
    text = resources.files(__package__).joinpath(DEVIATIONS_FILE).read_text(encoding="utf-8")
    return tuple(parse_deviations(text))


def load_deviations() -> list[Deviation]:
    """Every row of the packaged deviation table, in file order."""
    return [deviation.model_copy(deep=True) for deviation in _load_cached()]


def read_deviations(path: str | Path) -> list[Deviation]:
    """Every row of the deviation table in `path`, in file order, checked as the packaged one
    is (`parse_deviations`): for the request comparison and for tables written by hand."""
    path = Path(path)
    return parse_deviations(path.read_text(encoding="utf-8"), source=str(path))


def kept_deviations() -> list[Deviation]:
    """The deliberate differences: printed at the start of every paper run."""
    return [deviation for deviation in load_deviations() if deviation.status == "kept"]


START_HEADING = (
    "protocol paper: deliberate differences from the reference code (why: "
    "docs/reference/paper-deviations.md):"
)


def start_lines() -> list[str]:
    """What a paper run prints before its first call: a heading, then one line per kept
    deviation."""
    return [START_HEADING, *(deviation.start_line() for deviation in kept_deviations())]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _expectation_text(expectation: Expectation) -> str:
    scope = [part for part in (expectation.policy, expectation.call) if part]
    where = f" ({' '.join(scope)})" if scope else ""
    ours = json.dumps(expectation.ours)
    reference = json.dumps(expectation.reference)
    return f"{expectation.item}{where}: {ours} / {reference}"


def _table(deviations: Sequence[Deviation]) -> list[str]:
    lines = [
        "| id | roles | items | ours | reference | why | affects | expected (ours / reference) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in deviations:
        roles = ", ".join(d.roles) or "-"
        items = ", ".join(d.items) or "- (scoring only)"
        expected = "; ".join(_expectation_text(e) for e in d.expect) or "-"
        cells = [f"`{d.id}`", roles, items, d.ours, d.reference, d.why, d.affects, expected]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return lines


def render_markdown(deviations: Sequence[Deviation] | None = None) -> str:
    """The documentation page of the deviation table (docs/reference/paper-deviations.md)."""
    rows = load_deviations() if deviations is None else list(deviations)
    kept = [d for d in rows if d.status == "kept"]
    closed = [d for d in rows if d.status == "closed"]
    lines = [
        "# Paper protocol: deviations from the reference code",
        "",
        "<!-- Generated from evolve/spec/paper_deviations.toml by "
        "`python -m evolve.spec.paper_deviations --markdown`; do not edit by hand. -->",
        "",
        'Where `protocol = "paper"` differs from the reference AMemGym code '
        "(AGI-Eval-Official/amemgym at `ffcd188`). The table is one machine-readable file, "
        "`evolve/spec/paper_deviations.toml`: this page is generated from it, every paper run "
        "prints its kept rows at start (one line each), and the request-comparison tests "
        "accept a difference from the reference only when a kept row names its role and item "
        "and states the value found on each side (the `expected` column).",
        "",
        "Roles: the simulated user (`user`), the policies (`native`, `awi`, `awe`, `rag`), "
        "the upper bound, the diagnosis `probe`, the `reflector` and the `embedder`. Items: "
        "what a request carries (information and call parameters) or `parsing` (how the "
        "reply is read); no item means only the scoring differs.",
        "",
        "## Kept: deliberate differences",
        "",
        *_table(kept),
        "",
        "## Closed: paper now does what the reference does",
        "",
        *_table(closed),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evolve.spec.paper_deviations",
        description="Print the paper protocol's deviation table.",
    )
    parser.add_argument(
        "--markdown", action="store_true", help="the documentation page (default: start lines)"
    )
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(render_markdown())
    else:
        for line in start_lines():
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
