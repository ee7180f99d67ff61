"""What the optimizers change in a policy: named instruction texts (components) and checked
numeric parameters, each changed on a copy, never in place.

`EvolvableModule` is the base of `memory_policies.base.MemoryPolicy`; a subclass names its
kind and parameters and says which predictor holds each component.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar, Self

import dspy

from memory_policies.errors import PolicyError
from memory_policies.parameters import ParameterRule, merged_rules, validate_parameters


class EvolvableModule(dspy.Module):
    """A DSPy module whose instructions and numeric parameters are read and replaced by name."""

    kind: ClassVar[str]
    parameter_names: ClassVar[tuple[str, ...]] = ()
    # Rules of this kind's own numeric parameters (name -> valid range and meaning); the
    # shared ones (`memory_policies.parameters.PARAMETER_RULES`) need none here.
    parameter_rules: ClassVar[Mapping[str, ParameterRule]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.parameter_table()  # a parameter with no rule fails here, where the class is written

    @classmethod
    def parameter_table(cls) -> dict[str, ParameterRule]:
        """The rule of each of this kind's numeric parameters: its own, else the shared one."""
        kind = getattr(cls, "kind", cls.__name__)
        return merged_rules(kind, cls.parameter_names, cls.parameter_rules)

    def _instruction_predictors(self) -> dict[str, dspy.Predict]:
        """Component name -> the predictor whose instruction it is."""
        raise NotImplementedError

    def _shared_objects(self) -> list[Any]:
        """Objects that copies share instead of duplicating (e.g. a loaded embedding model)."""
        return []

    def components(self) -> dict[str, str]:
        return {
            name: predictor.signature.instructions
            for name, predictor in self._instruction_predictors().items()
        }

    def with_components(self, updates: Mapping[str, str]) -> Self:
        valid = list(self.components())
        unknown = sorted(set(updates) - set(valid))
        if unknown:
            raise PolicyError(
                f"unknown component(s) {unknown} for policy '{self.kind}'; valid: {valid}"
            )
        for name, text in updates.items():
            if not isinstance(text, str) or not text.strip():
                raise PolicyError(f"component '{name}' must be non-empty text, got {text!r}")
        new = self._copy()
        new._set_components(dict(updates))
        return new

    def _set_components(self, updates: dict[str, str]) -> None:
        predictors = self._instruction_predictors()
        for name, text in updates.items():
            predictor = predictors[name]
            predictor.signature = predictor.signature.with_instructions(text.strip())

    def parameters(self) -> dict[str, int]:  # type: ignore[override]
        # Overrides dspy's `BaseModule.parameters()` (a list of predictors); `reset_copy`, its
        # only caller in DSPy, is overridden below to keep working.
        return {name: getattr(self, name) for name in self.parameter_names}

    def with_parameters(self, **values: int) -> Self:
        checked = validate_parameters(
            self.kind, self.parameter_table(), {**self.parameters(), **values}
        )
        new = self._copy()
        for name, value in checked.items():
            setattr(new, name, value)
        return new

    def reset_copy(self) -> Self:
        new = self._copy()
        for _, predictor in new.named_parameters():
            predictor.reset()
        return new

    def deepcopy(self) -> Self:
        return self._copy()

    def _copy(self) -> Self:
        memo = {id(obj): obj for obj in self._shared_objects()}
        return copy.deepcopy(self, memo)
