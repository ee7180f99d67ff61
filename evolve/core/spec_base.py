"""Building blocks shared by the experiment spec (`evolve.spec.config`) and the study spec
(`evolve.tuning.spec`): the strict table base, the one integer-range type, and the one
formatter that turns a pydantic `ValidationError` into a one-line toolkit error (every
module that validates user input with pydantic formats its errors here).

A leaf module (pydantic only), so both spec modules import it without importing each other.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evolve.core.errors import shown_value


class StrictTable(BaseModel):
    """A spec table: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class IntRange(StrictTable):
    """Integers `low, low + step, ..., high` (inclusive); TOML: `{ low = 1, high = 8 }`."""

    low: int
    high: int
    step: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> IntRange:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        if (self.high - self.low) % self.step:
            raise ValueError(
                f"high - low ({self.high} - {self.low}) must be a multiple of step ({self.step}), "
                "so that high is a value of the range"
            )
        return self

    def values(self) -> list[int]:
        return list(range(self.low, self.high + 1, self.step))

    def contains(self, value: int) -> bool:
        return on_grid(value, self.low, self.high, self.step)


def on_grid(value: int, low: int, high: int, step: int = 1) -> bool:
    """`value` is one of low, low + step, ..., high: the one range check of a numeric
    parameter's search space (spec bounds, Optuna distributions, mutation steps)."""
    return low <= value <= high and (value - low) % step == 0


def refuse_renamed_keys(data: object, renamed: Mapping[str, str]) -> object:
    """`data` unchanged, or a ValueError when it holds a key of `renamed` (old -> new). For a
    table's before-validator: the formatter prefixes the table's path, so the user reads
    e.g. "policy: the key 'preset' is now called 'variant'"."""
    if isinstance(data, Mapping):
        for old, new in renamed.items():
            if old in data:
                raise ValueError(f"the key '{old}' is now called '{new}': rename it")
    return data


# A spec-specific rule for one error: a line to print, SKIP to drop the error, or None to let
# the generic rules below describe it. Arguments: pydantic's error detail and its location
# with union tags removed.
ErrorRule = Callable[[Mapping[str, Any], tuple[Any, ...]], str | None]
SKIP = ""


def format_validation_error(
    label: str,
    error: ValidationError,
    root: type[BaseModel] | None,
    *,
    rule: ErrorRule | None = None,
    extra_tags: Collection[str] = (),
    limit: int = 4,
) -> str:
    """`label: ` and the first `limit` lines of `problem_lines`, joined on one line."""
    lines = problem_lines(error, root, rule=rule, extra_tags=extra_tags)
    more = len(lines) - limit
    text = "; ".join(lines[:limit]) + (f"; ... and {more} more" if more > 0 else "")
    return f"{label}: {text}"


def problem_lines(
    error: ValidationError,
    root: type[BaseModel] | None,
    *,
    rule: ErrorRule | None = None,
    extra_tags: Collection[str] = (),
) -> list[str]:
    """One line per problem: the key path, what was wrong, and what is expected.

    `root` is the validated model (unknown keys are answered with the table's valid keys;
    None when the model is not known); `extra_tags` names further location parts that are
    union alternatives, not keys (e.g. a discriminated union's kinds); `rule` handles a
    spec's own cases first.
    """

    def is_tag(part: Any) -> bool:
        return is_union_tag(part) or (isinstance(part, str) and part in extra_tags)

    lines: list[str] = []
    seen: set[str] = set()
    details = error.errors()
    alternatives: dict[str, list[str]] = {}
    for detail in details:
        tags = [str(part) for part in detail["loc"] if is_tag(part)]
        if tags:
            where = ".".join(str(part) for part in detail["loc"] if not is_tag(part))
            alternatives.setdefault(where, [])
            if tags[0] not in alternatives[where]:
                alternatives[where].append(tags[0])
    for detail in details:
        loc = tuple(part for part in detail["loc"] if not is_tag(part))
        where = ".".join(str(part) for part in loc) or "(top level)"
        if where in seen:
            continue  # a union reports one error per alternative; one line is enough
        special = rule(detail, loc) if rule is not None else None
        if special is not None:
            if special:
                seen.add(where)
                lines.append(special)
            continue
        seen.add(where)
        kind = detail["type"]
        if len(alternatives.get(where, [])) > 1:
            expected = " or ".join(alternatives[where])
            lines.append(f"{where}: expected {expected} (got {shown_value(detail.get('input'))})")
        elif kind == "extra_forbidden":
            parent = loc[:-1]
            table = f"[{'.'.join(map(str, parent))}]" if parent else "the top level"
            valid = ", ".join(valid_keys(root, parent)) if root is not None else ""
            listed = "" if root is None else f"; valid keys: {valid or 'none'}"
            lines.append(f"{where}: unknown key in {table}{listed}")
        elif kind == "missing":
            lines.append(f"{where}: required key is missing")
        else:
            lines.append(value_problem(where, detail))
    return lines


def value_problem(where: str, detail: Mapping[str, Any]) -> str:
    """The line for a wrong value: pydantic's message and the value received (not a table)."""
    message = detail["msg"].removeprefix("Value error, ")
    received = detail.get("input")
    shown = "" if isinstance(received, dict) else f" (got {shown_value(received)})"
    return f"{where}: {message}{shown}"


def is_union_tag(part: Any) -> bool:
    """Whether a location part names a union alternative ("int", "list[str]", a model name)."""
    return isinstance(part, str) and (
        part in {"int", "str", "float", "bool", "none"} or "[" in part or part[:1].isupper()
    )


def valid_keys(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys of the table at `loc` under `root` (empty when `loc` is not a table)."""
    model: Any = root
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return []
        model = _model_in(field.annotation)
        if model is None:
            return []
    # A field left out of dumps (a spec's resolved `rules`) is no key a user writes.
    return [name for name, field in model.model_fields.items() if not field.exclude]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None
