"""A mutation operator that drops one line of a text component (an ablation step)."""

import random

from evolve.optimize.operators import (
    MutationOperator,
    OperatorProposal,
    is_parameter,
    register_operator,
)


class DropLineOperator(MutationOperator):
    """Removes one line, chosen by the proposal's seed, from each text component it owns."""

    name = "drop_line"

    def owns(self, component: str, generation: int = 0) -> bool:
        return not is_parameter(component)  # every text component; numbers are not lines

    def propose(self, parent, components, records, *, seed):
        rng = random.Random(seed)
        changed = {}
        for component in components:
            lines = [line for line in parent[component].splitlines() if line.strip()]
            if len(lines) < 2:
                reason = f"{component} has a single line: nothing left to drop"
                return OperatorProposal(operator=self.name, invalid=reason, seed=seed)
            del lines[rng.randrange(len(lines))]
            changed[component] = "\n".join(lines)
        return OperatorProposal(operator=self.name, components=changed, seed=seed)


register_operator("drop_line", lambda **_: DropLineOperator())
