"""Which registered version an export is, and what the registered model says about itself.

An export of an unchanged experiment must not add a version and a LoggedModel each time: a
version carries the digest of what it was made of (`evolve.content_digest`), and an export
with the same digest reuses it. MLflow has no content addressing of model versions, hence
these few lines.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evolve.tracking.store import filter_literal
from evolve.tracking.tags import TAG_HELDOUT_VERDICT

# On a registered version: the digest of what it was made of (`export_digest`).
CONTENT_DIGEST_TAG = "evolve.content_digest"
# The model's code (models from code: no pickle, nothing from `evolve` inside the model).
MODEL_CODE = Path(__file__).with_name("exported_model.py")


def export_digest(bundle_dir: Path, run_id: str | None, requirements: Sequence[str]) -> str:
    """What a registered version is made of: the bundle, the model's code (ours and the
    `memory_policies` it carries), its requirements and its source run. Exporting an
    unchanged experiment again gives the same digest, and reuses the version it names."""
    import memory_policies

    digest = hashlib.sha256()
    roots = [("policy", Path(bundle_dir)), ("code", Path(memory_policies.__file__).parent)]
    files = [(label, root, path) for label, root in roots for path in sorted(root.rglob("*"))]
    for label, root, path in [*files, ("model", MODEL_CODE.parent, MODEL_CODE)]:
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            digest.update(f"{label}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
    digest.update(json.dumps({"run": run_id, "requirements": list(requirements)}).encode())
    return digest.hexdigest()


def registered_version_with_digest(client: Any, name: str, digest: str) -> str | None:
    """The version of `name` registered from the same content (`export_digest`), if any."""
    from mlflow.exceptions import MlflowException

    try:
        versions = client.search_model_versions(f"name = {filter_literal(name)}")
    except MlflowException:  # no such model yet
        return None
    for version in versions:
        if version.tags.get(CONTENT_DIGEST_TAG) == digest and version.status == "READY":
            return str(version.version)
    return None


def registered_model_description(name: str) -> str:
    """The registered model's own description (its page's header), whichever version."""
    return (
        f"Memory policies exported by amemgym-evolve as {name}: each version is the best "
        "candidate of an evolution experiment, chosen on its validation users (else its train "
        "users; the held-out users only report). Its description and tags name the candidate, "
        f"its scores and the held-out verdict against the base (tag {TAG_HELDOUT_VERDICT}: "
        "beats, within noise or worse, read from the interval of the paired difference); the "
        "alias champion points at the latest export, whatever its verdict. "
        "A version is a pyfunc model from code with the policy bundle as its artifact, no LM "
        "or key inside: load it with mlflow.pyfunc.load_model('models:/"
        f"{name}@champion') and give the LM through model_config or MEMORY_POLICY_MODEL."
    )
