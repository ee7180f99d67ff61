"""Names of registered models: checked before anything is written or any LLM is called.

MLflow refuses a registered-model name only when it registers the model, that is after
`evolve export` wrote the bundle (or after a whole `evolve run`), and with a traceback. Its
rules (mlflow.utils.validation and the file store): not empty, no '/' or ':', no '%' or path
separator, not a path such as '..'. The name also goes into `models:/<name>@champion`, where
'?', '#' and '@' would end it early, so those are refused too.
"""

from __future__ import annotations

import posixpath

_REFUSED_CHARACTERS = "/:%\\?#@"


def registered_model_name_problem(name: str) -> str | None:
    """Why `name` cannot name a registered model (a phrase ending in the fix), or None."""
    if not name.strip():
        return "a registered model name must not be empty; give a name such as 'my-policy'"
    refused = sorted({character for character in name if character in _REFUSED_CHARACTERS})
    control = any(not character.isprintable() for character in name)
    if refused or control:
        shown = " ".join(repr(character) for character in refused)
        what = f"the character(s) {shown}" if refused else "control characters"
        return (
            f"registered model name {name!r} contains {what}, which MLflow's model registry or "
            "a models:/NAME@ALIAS URI cannot hold; use letters, digits, '.', '_', '-' and "
            "spaces, e.g. 'my-policy'"
        )
    normalized = posixpath.normpath(name)
    if name != name.strip() or name.strip(".") == "" or normalized != name or name.startswith(".."):
        return (
            f"registered model name {name!r} has leading or trailing spaces, is only dots or "
            "reads as a relative file path ('.', '..'); MLflow stores it as a path; use "
            "letters, digits, '.', '_', '-', e.g. 'my-policy'"
        )
    return None
