"""The Prompt Registry side of an experiment: each distinct component text is one prompt
version named `<experiment>.<component>`, with its lineage on the version.

MLflow copies the tags given at registration onto the prompt itself (the header of its page),
so a version registered later would rename the prompt's candidate: registration carries the
experiment's tags only, the candidate's lineage goes on the version (`set_prompt_version_tag`),
and `evolve export` names the champion on the prompt (`tag_champion_prompts`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from evolve.tracking.store import prompt_name, use_tracking_uri
from evolve.tracking.tags import (
    TAG_CANDIDATE,
    TAG_CONFIG_HASH,
    TAG_EXPERIMENT,
    TAG_GENERATION,
    TAG_MUTATION,
    TAG_PARENTS,
    TAG_PROMPT_PREFIX,
)

# What MLflow's fluent API reads for its current experiment (see `filed_under`).
_EXPERIMENT_ID_ENV = "MLFLOW_EXPERIMENT_ID"
_EXPERIMENT_NAME_ENV = "MLFLOW_EXPERIMENT_NAME"

if TYPE_CHECKING:
    from evolve.results.records import CandidateRecord
    from evolve.tracking.hooks import TrackingContext


@contextlib.contextmanager
def filed_under(experiment_id: str, tracking_uri: str) -> Iterator[None]:
    """Prompts registered in the block are listed under `experiment_id` (its Prompts tab).

    MLflow files a newly registered prompt version under the fluent API's experiment, which
    for a client-only program is the Default one; it reads `MLFLOW_EXPERIMENT_ID` (and
    `MLFLOW_EXPERIMENT_NAME` first) from the environment, resolved in the process-wide store.
    A program that set an active experiment itself (`mlflow.set_experiment`) keeps it."""
    saved = {key: os.environ.get(key) for key in (_EXPERIMENT_ID_ENV, _EXPERIMENT_NAME_ENV)}
    os.environ[_EXPERIMENT_ID_ENV] = experiment_id
    os.environ.pop(_EXPERIMENT_NAME_ENV, None)
    try:
        with use_tracking_uri(tracking_uri):
            yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class PromptVersions:
    """Registers a candidate's instructions and tags their versions with its scores.

    `known` (prompt name -> text digest -> version) lives in the tracker's state file, so a
    resumed experiment never registers a text twice."""

    def __init__(
        self,
        client: Any,
        context: TrackingContext,
        known: dict[str, dict[str, int]],
        uri: str,
        experiment_id: str,
    ) -> None:
        self.client = client
        self.context = context
        self.known = known
        self.tracking_uri = uri
        self.experiment_id = experiment_id

    def register(self, run_id: str, record: CandidateRecord, entry: dict) -> None:
        """Each distinct text of a component becomes one prompt version; a candidate that
        inherits a text unchanged points at the version its ancestor registered."""
        from mlflow.entities import RunTag

        entry.setdefault("prompts", {})
        entry.setdefault("registered", [])
        tags = []
        for component, text in sorted(record.components.items()):
            name = prompt_name(self.context.name, component)
            digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
            versions = self.known.setdefault(name, {})
            if digest not in versions:
                with filed_under(self.experiment_id, self.tracking_uri):
                    version = self.client.register_prompt(
                        name=name,
                        template=text,
                        commit_message=f"{record.id}: {record.mutation.describe()}"[:500],
                        tags=self._experiment_tags(),
                    )
                for key, value in self._lineage_tags(record).items():
                    self.client.set_prompt_version_tag(name, version.version, key, value)
                versions[digest] = int(version.version)
                entry["registered"].append(component)
            version_number = versions[digest]
            entry["prompts"][component] = version_number
            tags.append(RunTag(f"{TAG_PROMPT_PREFIX}{component}", f"{name}/{version_number}"))
            # MLflow 3.17 resolves the linking store from the process-wide tracking URI, not
            # the client's: without this it would create ./mlflow.db and link nothing.
            # Loading the version to link it files the prompt under the fluent experiment too.
            with (
                contextlib.suppress(Exception),  # a link is a convenience of the UI
                filed_under(self.experiment_id, self.tracking_uri),
            ):
                self.client.link_prompt_version_to_run(run_id, f"prompts:/{name}/{version_number}")
        if tags:
            self.client.log_batch(run_id, tags=tags)

    def _experiment_tags(self) -> dict[str, str]:
        return {
            TAG_EXPERIMENT: self.context.name,
            TAG_CONFIG_HASH: self.context.config_hash,
        }

    def _lineage_tags(self, record: CandidateRecord) -> dict[str, str]:
        tags = {
            TAG_CANDIDATE: record.id,
            TAG_PARENTS: ",".join(record.parent_ids) or "-",
            TAG_MUTATION: record.mutation.kind,
            TAG_GENERATION: str(record.generation),
        }
        if record.mutation.component:
            tags["evolve.component"] = record.mutation.component
        return tags

    def tag_scores(self, entry: dict, split: str, score: float) -> None:
        """The versions this candidate registered carry its scores."""
        for component in entry.get("registered", []):
            name = prompt_name(self.context.name, component)
            version = entry["prompts"][component]
            self.client.set_prompt_version_tag(name, version, f"{split}_score", f"{score:.6g}")
