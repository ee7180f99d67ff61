"""How a policy folds the messages leaving its buffer into memory: one write strategy per
variant, chosen once when the policy is built (`MemoryPolicy.writes`, from the kind's
`write_strategies` and the variant's `VariantRules.writes`), so no kind branches on its
variant while it builds or writes.

A strategy is stateless, like the dialogue (`memory_policies.dialogue`): every copy of a
policy shares it, and the policy is passed to each call.
"""

from __future__ import annotations

from typing import Any

import dspy


class WriteStrategy:
    """One variant's write procedure of one kind: the predictors it builds and how a batch
    of messages becomes memory."""

    def __deepcopy__(self, memo: dict[int, Any]) -> WriteStrategy:
        return self  # stateless: every copy of a policy shares its variant's strategy

    def build(self, policy: Any) -> None:
        """Create the policy's write predictor(s) (at least `policy.write`)."""
        raise NotImplementedError

    def instruction_predictors(self, policy: Any) -> dict[str, dspy.Predict]:
        """Write component name -> the predictor whose instruction it is."""
        return {"write": policy.write}

    def write(self, policy: Any, state: Any, messages: list[Any], times: list[str | None]) -> None:
        """Fold `messages` (sent at `times`) into `state`'s memory."""
        raise NotImplementedError
