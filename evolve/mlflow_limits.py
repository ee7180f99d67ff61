"""MLflow's own limits on the names and texts a spec gives it, checked when the spec loads.

MLflow enforces these only when a value reaches the tracking store, which is after the
embedded server started and LLM calls were spent, and it answers with a traceback. The
values mirror `mlflow.utils.validation` (a test keeps them equal); this module does not import
MLflow, so that loading a spec stays fast.
"""

from __future__ import annotations

import posixpath

# MAX_EXPERIMENT_NAME_LENGTH
EXPERIMENT_NAME_MAX_CHARS = 500
# MAX_EXPERIMENT_TAG_VAL_LENGTH: the spec's description is the experiment's description
# (the `mlflow.note.content` tag). Run descriptions are cut by MLflow itself at 8000.
DESCRIPTION_MAX_CHARS = 20_000
# `_validate_model_name`: characters a registered model name cannot contain.
MODEL_NAME_FORBIDDEN = ("/", ":")


def experiment_name_problem(name: str) -> str | None:
    """Why MLflow would refuse `name` as an experiment name, or None."""
    if not name.strip():
        return "is empty; MLflow needs a name"
    if len(name) > EXPERIMENT_NAME_MAX_CHARS:
        return f"has {len(name)} characters; MLflow accepts at most {EXPERIMENT_NAME_MAX_CHARS}"
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


def registered_model_name_problem(name: str) -> str | None:
    """Why MLflow's model registry would refuse `name`, or None (its rules: not blank, no
    '/' or ':', and unchanged when read as a file path)."""
    if not name.strip():
        return "is empty; the model registry needs a name"
    forbidden = [c for c in MODEL_NAME_FORBIDDEN if c in name]
    if forbidden:
        return f"contains {' and '.join(repr(c) for c in forbidden)}, which MLflow forbids"
    normalized = posixpath.normpath(name)
    if normalized != name or normalized == "." or normalized.startswith(".."):
        return "reads as a relative file path ('.', '..' or a name starting with '..')"
    return None
