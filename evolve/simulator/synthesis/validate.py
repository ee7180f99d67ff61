"""Pure checks of each stage's LLM output: normalized result plus the problems found.

Problems are phrased for the LLM (they are fed back on the next attempt) and for the report
(the last ones become the exclusion reason), so each says what was wrong and what is allowed.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from evolve.simulator.synthesis.config import LLMSynthesisConfig
from evolve.simulator.synthesis.signatures import (
    ChangeDraft,
    EventDraft,
    QuestionDraft,
    VariableGroup,
    VariableOptions,
)

_MAX_NAME_WORDS = 8
_IDENTIFIER_CHARS = 60


class InfoSpec(BaseModel):
    info_type: str
    info_choices: list[str]


class QuestionSpec(BaseModel):
    question: str
    required_info: list[InfoSpec]

    @property
    def info_types(self) -> list[str]:
        return [info.info_type for info in self.required_info]


def normalize_identifier(text: str) -> str:
    """ASCII snake_case: accents dropped, anything else non-alphanumeric becomes `_`.

    Variable names and values are keys in states, choices and exposures, so they stay ASCII
    in every language; comparing normalized forms tolerates case and punctuation drift.
    """
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[^a-z0-9]+", "_", ascii_text.lower()).strip("_")[:_IDENTIFIER_CHARS]


def _identifier(raw: str, what: str, problems: list[str]) -> str:
    normalized = normalize_identifier(raw)
    if not normalized:
        problems.append(f"{what} {raw!r} is not an English snake_case identifier")
    elif re.search(r"[^\x00-\x7f]", raw) and len(normalized) < len(raw.strip()) / 2:
        # Most characters were non-Latin: the model wrote the identifier in another language.
        problems.append(f"{what} {raw!r} must be written in English snake_case (ASCII)")
        return ""
    return normalized


def _span_text(span: tuple[int, int]) -> str:
    low, high = span
    return str(low) if low == high else f"{low} to {high}"


def check_profile(
    name: str, summary: str, known_name: str | None
) -> tuple[tuple[str, str], list[str]]:
    problems: list[str] = []
    name, summary = " ".join(name.split()), summary.strip()
    if not name:
        problems.append("the name is empty; copy the person's full name from extra_info")
    elif len(name.split()) > _MAX_NAME_WORDS:
        problems.append(f"the name {name[:60]!r} is not a name; give only the full name")
    elif known_name and name.casefold() != known_name.casefold():
        problems.append(f"the name {name!r} is not the one written in extra_info")
    if not summary:
        problems.append("the summary is empty")
    return (name, summary), problems


def check_questions(
    drafts: Sequence[QuestionDraft], config: LLMSynthesisConfig
) -> tuple[list[QuestionSpec], list[str]]:
    """Exactly `num_questions` (extras are dropped), each with `states_per_question` facts."""
    problems: list[str] = []
    need, per_question = config.num_questions, config.states_per_question
    low, high = config.choices_per_state
    if len(drafts) < need:
        problems.append(f"wrote {len(drafts)} questions; exactly {need} are needed")
    specs: list[QuestionSpec] = []
    seen_questions: set[str] = set()
    for index, draft in enumerate(drafts[:need]):
        where = f"question {index + 1}"
        text = " ".join(draft.question.split())
        if not text:
            problems.append(f"{where} is empty")
        elif text.casefold() in seen_questions:
            problems.append(f"{where} repeats an earlier question")
        seen_questions.add(text.casefold())
        if len(draft.required_info) != per_question:
            problems.append(
                f"{where} has {len(draft.required_info)} required_info items; it needs exactly "
                f"{per_question}"
            )
        infos: list[InfoSpec] = []
        for info in draft.required_info[:per_question]:
            info_type = _identifier(info.info_type, f"{where}: info_type", problems)
            choices = [
                _identifier(choice, f"{where}: option of {info.info_type!r}", problems)
                for choice in info.info_choices
            ]
            choices = [choice for choice in choices if choice]
            if len(set(choices)) != len(choices):
                problems.append(f"{where}: options of {info.info_type!r} repeat: {choices}")
            elif not low <= len(choices) <= high:
                problems.append(
                    f"{where}: {info.info_type!r} has {len(choices)} options; it needs "
                    f"{_span_text(config.choices_per_state)}"
                )
            if info_type:
                infos.append(InfoSpec(info_type=info_type, info_choices=choices))
        types = [info.info_type for info in infos]
        if len(set(types)) != len(types):
            problems.append(f"{where}: its info types repeat: {types}")
        specs.append(QuestionSpec(question=text, required_info=infos))
    return specs, problems


def info_type_occurrences(
    questions: Sequence[QuestionSpec],
) -> dict[str, list[tuple[int, list[str]]]]:
    """info type -> [(question index, options)] in first-seen order."""
    occurrences: dict[str, list[tuple[int, list[str]]]] = {}
    for index, question in enumerate(questions):
        for info in question.required_info:
            occurrences.setdefault(info.info_type, []).append((index, info.info_choices))
    return occurrences


def min_variables(config: LLMSynthesisConfig) -> int:
    """Variables needed so that every period can make its minimum number of changes."""
    low = config.changes_per_period[0]
    return max(low, math.ceil(config.num_periods * low / config.max_changes_per_state))


def check_groups(
    groups: Sequence[VariableGroup],
    questions: Sequence[QuestionSpec],
    config: LLMSynthesisConfig,
) -> tuple[dict[str, str], list[str]]:
    """Mapping info type -> variable: a partition that keeps each question's facts apart."""
    problems: list[str] = []
    known = info_type_occurrences(questions)
    mapping: dict[str, str] = {}
    names: list[str] = []
    for group in groups:
        name = _identifier(group.name, "variable name", problems)
        if not name:
            continue
        if name in names:
            problems.append(f"variable {name!r} is listed twice; merge the two entries")
            continue
        names.append(name)
        for member in group.merges:
            info_type = normalize_identifier(member)
            if info_type not in known:
                problems.append(
                    f"variable {name!r} merges {member!r}, which is not one of the info types"
                )
            elif info_type in mapping and mapping[info_type] != name:
                problems.append(
                    f"info type {info_type!r} is in both {mapping[info_type]!r} and {name!r}; "
                    "put it in exactly one"
                )
            else:
                mapping[info_type] = name
    missing = [info_type for info_type in known if info_type not in mapping]
    if missing:
        problems.append(f"info types {missing} are in no variable; add them")
    used = {mapping[t] for t in known if t in mapping}
    empty = [name for name in names if name not in used]
    if empty:
        problems.append(f"variables {empty} merge no info type; remove them")
    for index, question in enumerate(questions):
        targets = [mapping.get(t) for t in question.info_types if t in mapping]
        if len(set(targets)) != len(targets):
            problems.append(
                f"question {index + 1} needs {question.info_types} as separate facts; do not "
                "merge them into one variable"
            )
    if not missing and len(used) < min_variables(config):
        problems.append(
            f"only {len(used)} variables remain but {config.num_periods} periods with at least "
            f"{config.changes_per_period[0]} changes need {min_variables(config)}; merge less"
        )
    return mapping, problems


def check_unified(
    unified: Sequence[VariableOptions], needed: Sequence[str], config: LLMSynthesisConfig
) -> tuple[dict[str, list[str]], list[str]]:
    problems: list[str] = []
    low, high = config.choices_per_state
    result: dict[str, list[str]] = {}
    given: set[str] = set()
    for entry in unified:
        name = normalize_identifier(entry.name)
        given.add(name)
        if name not in needed:
            problems.append(f"{entry.name!r} is not one of the variables {list(needed)}")
            continue
        options = [_identifier(o, f"option of {name!r}", problems) for o in entry.options]
        options = [option for option in options if option]
        if len(set(options)) != len(options):
            problems.append(f"options of {name!r} repeat: {options}")
        elif not low <= len(options) <= high:
            problems.append(
                f"{name!r} has {len(options)} options; it needs "
                f"{_span_text(config.choices_per_state)}"
            )
        else:
            result[name] = options
    missing = [name for name in needed if name not in given]
    if missing:
        problems.append(f"no options were given for {missing}")
    return result, problems


def budget_left(counts: Mapping[str, int], config: LLMSynthesisConfig) -> dict[str, int]:
    return {var: config.max_changes_per_state - count for var, count in counts.items()}


def check_changes(
    drafts: Sequence[ChangeDraft],
    schema: Mapping[str, list[str]],
    state: Mapping[str, str],
    counts: Mapping[str, int],
    config: LLMSynthesisConfig,
    period_index: int,
) -> tuple[dict[str, str], list[str]]:
    """Valid keys and values, real changes, the count range and every variable's budget.

    Also refuses a period that would leave too little budget for the remaining periods'
    minimum changes, which would otherwise surface as an unsatisfiable later period.
    """
    problems: list[str] = []
    changes: dict[str, str] = {}
    for draft in drafts:
        var = normalize_identifier(draft.variable)
        value = normalize_identifier(draft.new_value)
        if var not in schema:
            problems.append(f"{draft.variable!r} is not a variable; use one of {list(schema)}")
        elif var in changes:
            problems.append(f"{var!r} is changed twice; change it once")
        elif value not in schema[var]:
            problems.append(
                f"{draft.new_value!r} is not an option of {var!r}; options: {schema[var]}"
            )
        elif value == state[var]:
            problems.append(f"{var!r} is already {value!r}; a change needs a different option")
        elif counts[var] >= config.max_changes_per_state:
            problems.append(
                f"{var!r} already changed {counts[var]} times, the maximum; change another"
            )
        else:
            changes[var] = value
    low, high = config.changes_per_period
    if not problems and not low <= len(changes) <= high:
        problems.append(
            f"{len(changes)} variables changed; this period needs {_span_text((low, high))}"
        )
    periods_after = config.num_periods - period_index
    if not problems and periods_after > 0:
        left = budget_left(counts, config)
        for var in changes:
            left[var] -= 1
        open_vars = sum(1 for remaining in left.values() if remaining > 0)
        if sum(left.values()) < periods_after * low or open_vars < low:
            problems.append(
                f"these changes leave too few possible changes for the {periods_after} later "
                "periods; change variables that changed less often"
            )
    return changes, problems


def check_events(
    drafts: Sequence[EventDraft], changed: Sequence[str], unchanged: Sequence[str]
) -> tuple[list[tuple[list[str], str]], list[str]]:
    """Events partition the changed variables; none names an unchanged or unknown variable."""
    problems: list[str] = []
    covered: dict[str, int] = {}
    events: list[tuple[list[str], str]] = []
    for index, draft in enumerate(drafts):
        where = f"event {index + 1}"
        text = " ".join(draft.event.split())
        if not text:
            problems.append(f"{where} has no description")
        variables: list[str] = []
        for raw in draft.variables:
            var = normalize_identifier(raw)
            if var in unchanged:
                problems.append(f"{where} names {var!r}, which did not change; leave it out")
            elif var not in changed:
                problems.append(f"{where} names {raw!r}, which is not a changed variable")
            elif var in covered or var in variables:
                problems.append(f"{var!r} is in more than one event; put it in exactly one")
            else:
                variables.append(var)
        if not draft.variables:
            problems.append(f"{where} lists no variables")
        for var in variables:
            covered[var] = index
        if variables:
            events.append(([var for var in changed if var in variables], text))
    missing = [var for var in changed if var not in covered]
    if missing:
        problems.append(f"changes of {missing} are explained by no event; cover them")
    return events, problems


def check_texts(texts: Sequence[str], count: int, what: str) -> tuple[list[str], list[str]]:
    """`count` non-empty, pairwise different texts (answers or queries)."""
    problems: list[str] = []
    cleaned = [text.strip() for text in texts]
    if len(cleaned) != count:
        problems.append(f"wrote {len(cleaned)} {what}; exactly {count} are needed, in order")
    if any(not text for text in cleaned):
        problems.append(f"some {what} are empty")
    folded = [" ".join(text.casefold().split()) for text in cleaned]
    if len(set(folded)) != len(folded):
        problems.append(f"some {what} are identical; each must be different")
    return cleaned, problems


def quoted_identifiers(text: str, names: Sequence[str]) -> list[str]:
    """Variable names (with an underscore) copied verbatim into user-facing text."""
    lowered = text.casefold()
    return [name for name in names if "_" in name and name in lowered]
