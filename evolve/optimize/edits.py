"""Structured edits of list components, and the checks every proposal passes before it is
evaluated.

Why structured edits: asked to rewrite a numbered types list as free text, the bundled 0.5B
reflector returned a useful list in 1 of 6 tries (4 empty, 1 prose, and in real runs text
copied from its feedback); asked to name the missing types as a JSON list under a schema, it
named them in 6 of 8. So for a list component the reflector only says which items to add and
which to remove, under a JSON schema that bounds their number and length, and the toolkit
applies the edit to the list. Free-text rewriting stays for capable models (`reflective`).

Why checks: a proposal is text from a model, and a small model's text can be damage (a
types list replaced by an answer option copied from the feedback). A proposal that is not a
valid text for its component is refused with a reason (`invalid` status) and never evaluated
or accepted:

- a list component must stay a numbered list of short type descriptions;
- no text may mostly copy the feedback's quoted messages, questions or options.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from difflib import SequenceMatcher
from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints

# Components whose text is a numbered list of items (one per line).
LIST_COMPONENTS = frozenset({"write.types_to_remember"})

MAX_LIST_ITEMS = 20
MAX_ITEM_CHARS = 120
# Edit bounds in the reflector's JSON schema (llama.cpp's grammar enforces them).
# As many as the failures a proposal is shown (the quickstart shows 8): capped at 4, the 1.5B's
# first edit named 4 of the train user's 8 missing facts and later ones invented others.
MAX_ADDED_ITEMS = 8
MAX_ADDED_ITEM_CHARS = 60
MAX_REMOVED_ITEMS = 2
# A proposal whose characters come mostly from the feedback's quotes is a copy, not an edit.
MAX_COPIED_FRACTION = 0.5
# Shorter common runs are ordinary words and phrases shared by any two texts about a user.
_MIN_COPIED_RUN = 16

_ITEM = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s*(?P<text>\S.*)$")
_QUOTED = re.compile(r'"([^"\n]{12,})"')

AddedItem = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_ADDED_ITEM_CHARS)
]


class ListEdit(BaseModel):
    """What a reflector may do to a list: add short items, remove items by number."""

    add: list[AddedItem] = Field(
        default_factory=list,
        max_length=MAX_ADDED_ITEMS,
        description="new short type names to add",
    )
    remove: list[int] = Field(
        default_factory=list,
        max_length=MAX_REMOVED_ITEMS,
        description="numbers of items to remove because they are wrong or redundant",
    )


def is_list_component(component: str) -> bool:
    return component in LIST_COMPONENTS


def list_items(text: str) -> list[str]:
    """The items of a numbered (or bulleted) list, numbering stripped; other lines are kept
    as items too, so that a validator can refuse them."""
    items = []
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _ITEM.match(line)
        items.append(match.group("text").strip() if match else line.strip())
    return items


def render_list(items: Sequence[str]) -> str:
    return "\n".join(f"{number}. {item}" for number, item in enumerate(items, start=1))


def apply_list_edit(text: str, edit: ListEdit) -> tuple[str, dict[str, list[str]]]:
    """The list with `edit` applied, and what actually changed (`added`, `removed`).

    Removals name 1-based item numbers of the current list (unknown numbers are ignored);
    an added item already present (case-insensitively) is not added twice.
    """
    items = list_items(text)
    readded = {" ".join(item.split()).strip(" .;,").casefold() for item in edit.add}
    # Removing an item and adding it back (a small model does) leaves it where it was.
    removed = [
        items[n - 1]
        for n in sorted(set(edit.remove))
        if 1 <= n <= len(items) and items[n - 1].casefold() not in readded
    ]
    kept = [item for item in items if item not in removed]
    present = {item.casefold() for item in kept}
    added = []
    for item in edit.add:
        cleaned = " ".join(item.split()).strip(" .;,")
        if cleaned and cleaned.casefold() not in present:
            added.append(cleaned)
            present.add(cleaned.casefold())
    return render_list([*kept, *added]), {"added": added, "removed": removed}


def _feedback_quotes(feedback: str) -> list[str]:
    """The feedback's quoted texts (questions, options, user messages) and lettered options."""
    quotes = _QUOTED.findall(feedback)
    quotes += [m.group(1) for m in re.finditer(r"^\s*\([A-Z]\)\s+(.{12,})$", feedback, re.M)]
    quotes += [m.group(1) for m in re.finditer(r"^Question \d+: (.{12,})$", feedback, re.M)]
    return [" ".join(q.split()).rstrip(".") for q in quotes]


def copied_fraction(text: str, feedback: str) -> float:
    """Share of `text`'s characters inside runs of >= 16 characters that also occur in one of
    the feedback's quotes (case-insensitive)."""
    flat = " ".join(text.split()).casefold()
    if not flat:
        return 0.0
    covered = [False] * len(flat)
    for quote in _feedback_quotes(feedback):
        matcher = SequenceMatcher(None, flat, quote.casefold(), autojunk=False)
        for block in matcher.get_matching_blocks():
            if block.size >= _MIN_COPIED_RUN:
                covered[block.a : block.a + block.size] = [True] * block.size
    return sum(covered) / len(flat)


def proposal_problem(component: str, text: str, feedback: str = "") -> str | None:
    """Why `text` is not a valid new text for `component`, or None when it is."""
    if not text.strip():
        return "the proposed text is empty"
    if is_list_component(component):
        problem = _list_problem(text)
        if problem:
            return problem
    copied = copied_fraction(text, feedback)
    if copied > MAX_COPIED_FRACTION:
        return (
            f"{copied:.0%} of the proposed text copies the feedback's quoted messages, questions "
            f"or options (at most {MAX_COPIED_FRACTION:.0%}): it is an answer, not an instruction"
        )
    return None


def _list_problem(text: str) -> str | None:
    lines = [line for line in text.splitlines() if line.strip()]
    items = list_items(text)
    if len(items) > MAX_LIST_ITEMS:
        return f"the list has {len(items)} items, more than {MAX_LIST_ITEMS}"
    for line, item in zip(lines, items, strict=True):
        shown = " ".join(line.split())[:60]
        if not _ITEM.match(line):
            return f"the list has a line that is not a numbered item: {shown!r}"
        if len(item) > MAX_ITEM_CHARS:
            return (
                f"item {shown!r} has {len(item)} characters; a type description has at most "
                f"{MAX_ITEM_CHARS}"
            )
        if item.rstrip().endswith("?"):
            return f"item {shown!r} is a question, not a type of information"
    return None


def says_less(parent: dict[str, str], child: dict[str, str]) -> str | None:
    """How `child` says less than `parent` (a list item dropped, a text shortened), or None.

    Used on ties: a child whose score only equals its parent's may replace it when it keeps
    everything the parent says, never when it drops some of it (see `TieKeepsContent`).
    """
    for component, old in parent.items():
        new = child.get(component, old)
        if new == old or component.startswith("param."):
            continue
        if is_list_component(component):
            kept = {item.casefold() for item in list_items(new)}
            dropped = [item for item in list_items(old) if item.casefold() not in kept]
            if dropped:
                return f"{component} drops {dropped[:3]}"
        elif len(new.strip()) < len(old.strip()):
            return f"{component} is shorter ({len(new.strip())} < {len(old.strip())} characters)"
    return None
