"""MLflow's own limits on the names and texts a spec gives it, checked when the spec loads.

MLflow enforces these only when a value reaches the tracking store, which is after the
embedded server started and LLM calls were spent, and it answers with a traceback. The
values mirror `mlflow.utils.validation` (a test keeps them equal); this module does not import
MLflow, so that loading a spec stays fast.
"""

from __future__ import annotations

# MAX_EXPERIMENT_NAME_LENGTH
EXPERIMENT_NAME_MAX_CHARS = 500
# MAX_EXPERIMENT_TAG_VAL_LENGTH: the spec's description is the experiment's description
# (the `mlflow.note.content` tag). Run descriptions are cut by MLflow itself at 8000.
DESCRIPTION_MAX_CHARS = 20_000
# `_validate_model_name`: characters a registered model name cannot contain.


def experiment_name_problem(name: str) -> str | None:
    """Why MLflow would refuse `name` as an experiment name, or None."""
    if not name.strip():
        return "is empty; MLflow needs a name"
    if len(name) > EXPERIMENT_NAME_MAX_CHARS:
        return f"has {len(name)} characters; MLflow accepts at most {EXPERIMENT_NAME_MAX_CHARS}"
    if any(ord(character) < 32 or ord(character) == 127 for character in name):
        return "holds a control character (a newline, a tab, ...); use printable characters"
    return None


def description_problem(text: str) -> str | None:
    """Why MLflow would refuse `text` as an experiment description, or None."""
    length = len(text.strip())  # stored stripped
    if length > DESCRIPTION_MAX_CHARS:
        return (
            f"has {length} characters; MLflow accepts at most {DESCRIPTION_MAX_CHARS} for an "
            "experiment's description"
        )
    return None


# The registry's name rules live with the other checks of names (one definition).
from evolve.stores.registered_names import registered_model_name_problem  # noqa: E402

__all__ = ["description_problem", "experiment_name_problem", "registered_model_name_problem"]
