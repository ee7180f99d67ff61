"""The `list_edit` mutation operator: the reflector names items to add to a list component as
JSON under a schema, and the toolkit applies the edit (see `edits`).

Select it in a spec with `optimizer.operators = ["list_edit", "reflective"]`: it owns the
list components (`write.types_to_remember`), the reflective operator the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dspy
from dspy.utils.exceptions import AdapterParseError

from evolve.core.errors import ConfigError
from evolve.feedback import AnsweredQuestion, failures_of, feedback_kind
from evolve.llm import call_events
from evolve.optimize.edits import (
    MAX_ADDED_ITEMS,
    AddedItem,
    ListEdit,
    apply_list_edit,
    is_list_component,
    list_items,
)
from evolve.optimize.operators import MutationOperator, OperatorProposal, register_operator
from evolve.optimize.reflect import Reflector, proposal_feedback
from evolve.simulator.records import Diagnosis

# No example names: the 1.5B added the instruction's examples ('pets', 'sleep') whether or not
# a failure was about them, and the blind control's reflector, which sees no failures, named
# them too (they are recall-world domains).
LIST_EDIT_INSTRUCTIONS = (
    "A personal assistant failed questions about its user because its memory never stored "
    "some kinds of information. Name those kinds of information as short general type names "
    "that are not in the current list: one for each failed question whose cause says it was "
    "not in memory."
)


class ProposeListAdditions(dspy.Signature):
    failures: str = dspy.InputField(desc="failed questions and their causes")
    current_list: str = dspy.InputField(desc="types the memory stores now")
    add: list[AddedItem] = dspy.OutputField(desc=f"short type names, at most {MAX_ADDED_ITEMS}")


def failure_lines(failures: Sequence[AnsweredQuestion]) -> str:
    """What a list edit can act on: each failed question, and which facts were not in memory
    (the diagnosis without its values), numbered as the feedback showed them.

    Why so little: asked with the whole diagnostic (answers, the user's words, the memory
    held), the 0.5B copied list items and memory lines (4 of 4 tries); with the question and
    cause lines it named the missing types in 4 of 4. Shown the cause's values too, the 1.5B
    added values as types ('index funds', 'school-age children', 'books a month' on the
    quickstart's seeds 13-15): a value files only the sentences that repeat it, and another
    user's values are other words."""
    return "\n".join(
        _failure_lines(number, failure) for number, failure in enumerate(failures, start=1)
    )


def addable_failures(
    failures: Sequence[AnsweredQuestion], current_list: str
) -> list[tuple[int, AnsweredQuestion]]:
    """The failures (with their number in the feedback) that an added type can fix: not
    those whose facts were in memory (use failures), nor those whose missing facts
    `current_list` already names (their statements were filed under another slot, or pushed
    out of their own by a later sentence).

    Why: shown such failures, the 1.5B added restatements of listed facts
    ('stained_glass_skills', 'staining_glass_skills' beside 'stained_glass_technique'; the
    quickstart's world, seed 15: 9 of its 14 added items, held-out +0.021 over the base); shown
    only the rest, it added the facts the list lacked (+0.229 on the same seed)."""
    listed = {_fact_key(item) for item in list_items(current_list)}
    return [
        (number, failure)
        for number, failure in enumerate(failures, start=1)
        if failure.diagnosis != Diagnosis.UTILIZATION
        and not (
            failure.missing_facts()
            and all(_fact_key(fact) in listed for fact in failure.missing_facts())
        )
    ]


def addable_failure_lines(failures: Sequence[AnsweredQuestion], current_list: str) -> str:
    """`failure_lines` of the `addable_failures` only."""
    return "\n".join(
        _failure_lines(number, failure)
        for number, failure in addable_failures(failures, current_list)
    )


def _failure_lines(number: int, failure: AnsweredQuestion) -> str:
    question = " ".join(failure.question.split())
    if len(question) > _QUESTION_CHARS:
        question = question[: _QUESTION_CHARS - 3] + "..."
    if failure.diagnosis == Diagnosis.UTILIZATION:
        cause = "use - the facts were in memory, the answer was wrong"
    else:
        facts = ", ".join(failure.missing_facts()) or "the facts asked for"
        cause = f"{failure.diagnosis.value} - {_NOT_IN_MEMORY} {facts}"
    return f'{number}. Period {failure.period}, question: "{question}"\n   cause: {cause}'


def _fact_key(name: str) -> str:
    return " ".join(name.replace("_", " ").casefold().split())


_NOT_IN_MEMORY = "not in memory:"
_QUESTION_CHARS = 120


class ListEditOperator(MutationOperator):
    """Structured edits of list components by the reflector role (see the module docstring)."""

    name = "list_edit"
    reflective = True

    def __init__(self, reflector: Reflector) -> None:
        self.reflector = reflector
        self.predictor = dspy.Predict(
            ProposeListAdditions.with_instructions(LIST_EDIT_INSTRUCTIONS)
        )

    def owns(self, component: str, generation: int = 0) -> bool:
        return is_list_component(component)

    def propose(
        self,
        parent: Mapping[str, str],
        components: Sequence[str],
        records: Mapping[str, Sequence[Mapping[str, Any]]],
        *,
        seed: int,
    ) -> OperatorProposal:
        changed: dict[str, str] = {}
        detail: dict[str, Any] = {}
        for component in components:
            component_records = records.get(component, [])
            feedback = proposal_feedback(component_records)
            shown = failures_of(component_records)
            # A kind that diagnoses shows failures as data; any other kind's text (the blind
            # control's request, the paper's questions) is what the reflector is shown.
            failures = addable_failure_lines(shown, parent[component]) if shown else feedback
            if shown and not failures.strip():
                return OperatorProposal(
                    operator=self.name,
                    invalid="no failure an added type can fix (only use failures, or listed facts)",
                    seed=seed,
                )
            config = {
                "rollout_id": seed,
                "temperature": self.reflector.temperature,
                "seed": seed,
            }
            try:
                with (
                    call_events.purpose("reflection"),
                    self.reflector.lms.context(self.reflector.role),
                ):
                    prediction = self.predictor(
                        failures=failures or "(no feedback)",
                        current_list=parent[component],
                        config=config,
                    )
            except AdapterParseError as error:
                message = " ".join(str(error).split())[:200]
                return OperatorProposal(
                    operator=self.name,
                    invalid=f"unparseable list edit: {message}",
                    parse_failed=True,
                    seed=seed,
                )
            # Additions only: offered removals, the 0.5B removed items it then re-added.
            offered = list(prediction.add or [])
            edit = ListEdit(add=offered[:MAX_ADDED_ITEMS])
            text, applied = apply_list_edit(parent[component], edit)
            if len(offered) > MAX_ADDED_ITEMS:
                # An endpoint without grammar-constrained decoding may name more: recorded.
                applied["beyond_limit"] = offered[MAX_ADDED_ITEMS:]
            if not applied["added"] and not applied["removed"]:
                return OperatorProposal(
                    operator=self.name,
                    invalid="the list edit changes nothing (no new item, no valid removal)",
                    seed=seed,
                    detail={component: edit.model_dump()},
                )
            problem = self.reflector.problem(component, text, feedback)
            if problem is not None:
                return OperatorProposal(
                    operator=self.name, invalid=problem, seed=seed, detail={component: applied}
                )
            if not list_items(text):
                return OperatorProposal(
                    operator=self.name, invalid="the edit leaves an empty list", seed=seed
                )
            changed[component] = text
            detail[component] = applied
        return OperatorProposal(operator=self.name, components=changed, seed=seed, detail=detail)


def _list_edit_check(optimizer: Any, rules: Any) -> str | None:
    if rules.structured_edits:
        return None
    return (
        f"list_edit (structured list edits for small models) is not part of protocol "
        f"{rules.name!r}: the reference's reflector rewrites the text itself; remove list_edit "
        '(e.g. operators = ["reflective"]) or set protocol = "evolve"'
    )


register_operator(
    "list_edit", lambda *, reflector, **_: ListEditOperator(reflector), check=_list_edit_check
)


# The built-in operators that call the reflector (idle under a kind that proposes nothing), and
# those of them that own text components: list_edit the list ones, reflective every one.
_REFLECTIVE = frozenset({"reflective", "list_edit"})


def refuse_idle_operators(optimizer: Any) -> None:
    """Refuse (before any LLM call) an `optimizer.operators` list that would propose nothing.

    Why at all: such a spec runs every generation and only ever evaluates the base, which reads
    like a result ("no proposal was better") rather than the misconfiguration it is. Only the
    built-in operators are judged: a plugin's ownership is known once it is built.
    """
    names = list(optimizer.operators or [])
    if not names or not set(names) <= _REFLECTIVE | {"parameter", "tuned"}:
        return
    listed = f"operators = {names}"
    proposes = feedback_kind(optimizer.feedback).proposes
    if not proposes and set(names) <= _REFLECTIVE:
        raise ConfigError(
            f"optimizer: {listed} all call the reflector, which feedback = "
            f"{optimizer.feedback!r} turns off, so no generation would propose anything; for "
            'the unevolved control drop "operators" (feedback = "none" then evaluates the '
            "base only), or choose another feedback"
        )
    if "list_edit" not in names or not proposes:
        return
    owners: dict[str, str | None] = {}
    for component in optimizer.mutate_components:
        owners[component] = next(
            (
                name
                for name in names
                if name == "reflective" or (name == "list_edit" and is_list_component(component))
            ),
            None,
        )
    if "list_edit" not in owners.values():
        raise ConfigError(
            f"optimizer: {listed} with mutate_components = {optimizer.mutate_components}: "
            "list_edit edits list components only (write.types_to_remember) and would never "
            "propose (a non-list component, or reflective listed first owns it); add a list "
            'component to mutate_components, put "list_edit" first, or remove it'
        )
    orphans = [component for component, owner in owners.items() if owner is None]
    if orphans:
        raise ConfigError(
            f"optimizer: {listed}: no operator rewrites {orphans} (list_edit edits list "
            'components only); add "reflective" to operators or remove them from '
            "mutate_components"
        )
