"""The `list_edit` mutation operator: the reflector names items to add to (or remove from) a
list component as JSON under a schema, and the toolkit applies the edit (see `edits`).

Select it in a spec with `optimizer.operators = ["list_edit", "reflective"]`: it owns the
list components (`write.types_to_remember`), the reflective operator the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dspy
from dspy.utils.exceptions import AdapterParseError

from evolve.optimize.edits import ListEdit, apply_list_edit, is_list_component, list_items
from evolve.optimize.operators import MutationOperator, OperatorProposal, register_operator
from evolve.optimize.reflect import COMPONENT_ROLES, Reflector, proposal_feedback

LIST_EDIT_INSTRUCTIONS = (
    "You maintain a numbered list that tells a personal assistant which types of information "
    "about its user to store in long-term memory. `feedback` shows questions about the user "
    "that the assistant answered wrongly and why. When a failure says the memory never held "
    "something, add a short general type name for it (two or three words, e.g. 'pets' or "
    "'sleep habits'), not the user's value. Remove an item only if it is wrong. Never copy "
    "questions, answers or messages."
)


class ProposeListEdit(dspy.Signature):
    part: str = dspy.InputField(desc="what the list controls")
    current_list: str = dspy.InputField(desc="the current numbered list")
    feedback: str = dspy.InputField(desc="how the assistant did")
    edit: ListEdit = dspy.OutputField(desc="short type names to add; item numbers to remove")


class ListEditOperator(MutationOperator):
    """Structured edits of list components by the reflector role (see the module docstring)."""

    name = "list_edit"
    reflective = True

    def __init__(self, reflector: Reflector) -> None:
        self.reflector = reflector
        self.predictor = dspy.Predict(ProposeListEdit.with_instructions(LIST_EDIT_INSTRUCTIONS))

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
            feedback = proposal_feedback(records.get(component, []))
            config = {
                "rollout_id": seed,
                "temperature": self.reflector.temperature,
                "seed": seed,
            }
            try:
                with self.reflector.lms.context(self.reflector.role):
                    prediction = self.predictor(
                        part=COMPONENT_ROLES.get(component, component),
                        current_list=parent[component],
                        feedback=feedback or "(no feedback)",
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
            edit = prediction.edit
            if not isinstance(edit, ListEdit):
                edit = ListEdit.model_validate(edit)
            text, applied = apply_list_edit(parent[component], edit)
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


register_operator("list_edit", lambda *, reflector, **_: ListEditOperator(reflector))
