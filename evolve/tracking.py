"""MLflow tracking of experiments: one parent run per experiment, one child run per candidate.

Why one module: the run layout below (parent, candidates, prompt versions, artifacts) is
one contract with `evolve compare`, `evolve export` and the MLflow UI.

Called by the optimizer loop and the commands only (never by the simulator or a policy). The
tracking URI is `--tracking-uri`, else the spec's, else `MLFLOW_TRACKING_URI`, else
`sqlite:///mlruns/mlflow.db` relative to the current directory, with artifacts under
`mlruns/artifacts/` (`evolve.tracking_uri`, which also refuses unusable URIs up front).

- the experiment: the spec's `description` as its description (`mlflow.note.content`) and the
  kind "custom model development", so the MLflow UI opens on the runs table.
- parent run: params (experiment, seeds, environment, optimizer, budget, models per role);
  metrics per generation (`step` = generation): best and mean train and held-out scores,
  calls and tokens spent, candidates evaluated so far (a running count: never re-logged at
  step 0); at the end the totals (at the last generation's step), the compare table and
  lineage as text.
- child run per candidate (tags: generation, candidate id, parent ids, mutation kind; tag
  `mlflow.parentRunId`): params (policy kind, numeric parameters, models, seeds, mutation),
  summary metrics with `step` = generation for the train and held-out evaluations (memory
  score, accuracy, write/read/utilization rates, parse failures, tokens, LLM calls, wall
  time), per-period curves with `step` = period (`train_period/memory_score`, ...), and
  artifacts: each component's instruction, the diff of a mutated component against its
  parent (unified `.diff` and a side-by-side `.html` the UI previews), the policy bundle,
  the per-period score tables, the reflector's feedback.
- every run: a description (`mlflow.note.content`) and the source, user and git tags the
  fluent API sets (`mlflow.tracking.context`; MLflow strips credentials from repo URLs).
- Prompt Registry: each distinct component text is a prompt version named
  `<experiment>.<component>` with lineage tags (candidate, parents, operator, generation,
  scores); the candidate run links its versions and names them in `evolve.prompt.<component>`
  tags (`evolve export` gives the champion's versions the `champion` alias).
- traces (`[tracking] traces`): see `evolve.tracing`.

Nothing logged comes from an endpoint description: models are logged by name, never a URL,
and never a key. Logging is idempotent (state in `<run dir>/mlflow.json`), so a resumed
experiment continues the same parent run and never logs a candidate twice.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import json
import logging
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from evolve.errors import ConfigError, StorageError
from evolve.files import atomic_write_json
from evolve.locking import exclusive_file_lock
from evolve.simulator.metric_registry import metrics_in
from evolve.simulator.storage import read_json
from evolve.tracking_uri import TrackingLocation, check_tracking_uri, resolve_tracking_uri

if TYPE_CHECKING:
    from evolve.budget import Spend
    from evolve.config import ExperimentSpec, RunSpec
    from evolve.records import (
        CandidateRecord,
        EvaluationScores,
        ExperimentResult,
        GenerationRecord,
    )
    from evolve.simulator.runner import ProgressSink

STATE_FILE = "mlflow.json"
TAG_KIND = "evolve.kind"
TAG_EXPERIMENT = "evolve.experiment"
TAG_CONFIG_HASH = "evolve.config_hash"
TAG_RUN_DIR = "evolve.run_dir"
TAG_CANDIDATE = "evolve.candidate_id"
TAG_GENERATION = "evolve.generation"
TAG_PARENTS = "evolve.parent_ids"
TAG_MUTATION = "evolve.mutation"
TAG_STATUS = "evolve.status"
TAG_PROMPT_PREFIX = "evolve.prompt."
PARENT_RUN_TAG = "mlflow.parentRunId"
# MLflow's description of a run or an experiment (what the UI shows as "Description").
NOTE_TAG = "mlflow.note.content"
# Without it MLflow 3's UI guesses "GenAI" for an experiment and opens an empty traces page.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


@dataclass(frozen=True)
class TrackingContext:
    """What a tracker needs to know about the experiment it tracks."""

    name: str
    config_hash: str
    spec: ExperimentSpec
    run_dir: Path
    model_names: dict[str, str]
    environment: str
    train_users: list[str] = field(default_factory=list)
    heldout_users: list[str] = field(default_factory=list)
    registered_model: str | None = None


class ExperimentTracker:
    """The loop's view of tracking; every hook is a no-op here (see `MLflowTracker`)."""

    # Where runs are logged and why there (printed at start); None when tracking is off.
    location: TrackingLocation | None = None

    def start(self, context: TrackingContext) -> None:
        """The experiment starts or resumes."""

    def log_candidate(
        self,
        record: CandidateRecord,
        *,
        split: str,
        parent: CandidateRecord | None,
        policy_dir: Path,
        feedback: str | None,
    ) -> None:
        """`record` was evaluated on `split` ("train" or "heldout")."""

    def log_generation(self, record: GenerationRecord, *, spent: Spend) -> None:
        """A generation finished."""

    def evaluation_sink(
        self,
        split: str,
        inner: ProgressSink | None,
        *,
        record: CandidateRecord | None = None,
        fingerprint: str | None = None,
    ) -> ProgressSink | None:
        """The runner's progress sink for an evaluation on `split` ("train" or "heldout") of
        `record` (or of a policy known by `fingerprint` only, e.g. inside GEPA): `inner` (the
        CLI's progress), or a sink that forwards to it and records traces."""
        return inner

    def finish(self, result: ExperimentResult, *, report: str = "") -> None:
        """The invocation ended (complete, or stopped on the budget).

        `report` is the compare table and lineage as text, formatted by the engine (tracking
        depends on the records only, never on the engine's modules).
        """

    def fail(self) -> None:
        """The invocation was interrupted by an error or Ctrl-C."""


class NullTracker(ExperimentTracker):
    """Tracking disabled."""


def quiet_mlflow() -> None:
    """Keep MLflow's and alembic's INFO logs, warnings, telemetry and progress bars quiet."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for name in ("mlflow", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # It logs a database error (statement and parameters included) and raises it too; the
    # raised one becomes our one-line error (a full disk: exit 5), the log only noise.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", module=r"mlflow(\..*)?$")
    warnings.filterwarnings("ignore", category=FutureWarning, message=r".*mlflow.*")


def default_artifact_location(tracking_uri: str) -> str | None:
    """For a sqlite store: `<db dir>/artifacts` (absolute file URI); else the server decides."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db_path = Path(tracking_uri.removeprefix("sqlite:///"))
    return (db_path.parent.resolve() / "artifacts").as_uri()


def normalize_tracking_uri(tracking_uri: str) -> str:
    """A relative sqlite path made absolute (relative to the current directory, once)."""
    if tracking_uri.startswith("sqlite:///") and not tracking_uri.startswith("sqlite:////"):
        return f"sqlite:///{Path(tracking_uri.removeprefix('sqlite:///')).resolve()}"
    return tracking_uri


def prepare_tracking_uri(tracking_uri: str) -> str:
    """Normalize; create the directory of a sqlite store; refuse URIs with credentials, an
    unknown scheme, a file that is no database and a server that does not answer."""
    tracking_uri = normalize_tracking_uri(tracking_uri)
    parsed = urlparse(tracking_uri)
    if parsed.password or (parsed.username and parsed.scheme in ("http", "https")):
        raise ConfigError(
            f"tracking URI {parsed.scheme}://{parsed.hostname}... carries credentials; set "
            "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (or a token) in the "
            "environment instead"
        )
    check_tracking_uri(tracking_uri)
    if tracking_uri.startswith("sqlite:///"):
        check_sqlite_writable(Path(tracking_uri.removeprefix("sqlite:///")))
    return tracking_uri


def check_sqlite_writable(db_path: Path) -> None:
    """Fail at once on a store that cannot be written (SQLAlchemy would retry for minutes)."""
    try:
        db_path.parent.mkdir(parents=True, exist_ok=True)
        if db_path.exists():
            os.close(os.open(db_path, os.O_RDWR))
        _store_lock_path(db_path).touch(exist_ok=True)  # sqlite writes journals there too
    except OSError as error:
        raise StorageError(
            f"MLflow tracking DB {db_path} is not writable ({error.strerror or error}); make it "
            "writable, pass --tracking-uri with another store, or --no-tracking"
        ) from None


def _store_lock_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".lock")


def store_creation_lock(tracking_uri: str) -> contextlib.AbstractContextManager[None]:
    """Held around the first use of a sqlite store: opening it creates or migrates its
    schema, and two processes doing that at once die with `duplicate column name`."""
    if not tracking_uri.startswith("sqlite:///"):
        return contextlib.nullcontext()
    return exclusive_file_lock(_store_lock_path(Path(tracking_uri.removeprefix("sqlite:///"))))


@functools.cache
def run_context_tags() -> dict[str, str]:
    """The tags MLflow's fluent `start_run` sets: user, source name and type, and the git
    commit, branch and repo URL of the entry point; when the entry point is no git checkout
    (an installed `evolve` command), those of the current directory (where the specs are).
    MLflow strips credentials from repo URLs; this strips any left, to be sure."""
    from mlflow.tracking.context.registry import resolve_tags
    from mlflow.utils.git_utils import get_git_branch, get_git_commit, get_git_repo_url
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_BRANCH, MLFLOW_GIT_COMMIT, MLFLOW_GIT_REPO_URL

    tags = {k: str(v) for k, v in resolve_tags().items() if v is not None}
    if MLFLOW_GIT_COMMIT not in tags:
        cwd = os.getcwd()
        git = {
            MLFLOW_GIT_COMMIT: get_git_commit(cwd),
            MLFLOW_GIT_BRANCH: get_git_branch(cwd),
            MLFLOW_GIT_REPO_URL: get_git_repo_url(cwd),
        }
        tags.update({k: v for k, v in git.items() if v})
    return {k: strip_url_credentials(v) for k, v in tags.items()}


def strip_url_credentials(text: str) -> str:
    """`scheme://user:secret@host/...` -> `scheme://host/...` (anything else unchanged)."""
    return re.sub(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]+@", r"\1", text)


def describe_experiment(client: Any, experiment_id: str, description: str) -> None:
    """The experiment's description and kind (set again on every start: the spec may change)."""
    client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    if description.strip():
        client.set_experiment_tag(experiment_id, NOTE_TAG, description.strip())


def prompt_name(experiment: str, component: str) -> str:
    """`<experiment>.<component>` in the characters the Prompt Registry accepts."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{experiment}.{component}").strip("-.") or "prompt"


def mlflow_client(tracking_uri: str):
    quiet_mlflow()
    from mlflow.tracking import MlflowClient

    uri = prepare_tracking_uri(tracking_uri)
    # Explicit registry URI: the default is MLflow's process-wide one, which may point elsewhere.
    with store_creation_lock(uri):
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.search_experiments(max_results=1)  # opens the store: schema created here
    return client


def get_or_create_experiment(client: Any, name: str, tracking_uri: str) -> str:
    # Serialized too: two processes creating one experiment at once would collide.
    with store_creation_lock(normalize_tracking_uri(tracking_uri)):
        return _get_or_create_experiment(client, name, tracking_uri)


def _get_or_create_experiment(client: Any, name: str, tracking_uri: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage != "active":
            raise ConfigError(
                f"MLflow experiment {name!r} is deleted; restore it (mlflow experiments "
                "restore) or set [tracking] experiment_name to another name"
            )
        return experiment.experiment_id
    return client.create_experiment(name, artifact_location=default_artifact_location(tracking_uri))


def tracking_location(flag: str | None, spec: RunSpec) -> TrackingLocation:
    """The tracking URI of a command by precedence (see `evolve.tracking_uri`), checked and
    normalized before any LLM call."""
    location = resolve_tracking_uri(flag, spec.tracking.tracking_uri)
    return TrackingLocation(prepare_tracking_uri(location.uri), location.source)


class MLflowTracker(ExperimentTracker):
    def __init__(
        self, tracking_uri: str, experiment_name: str, location: TrackingLocation | None = None
    ) -> None:
        self.tracking_uri = normalize_tracking_uri(tracking_uri)
        # What the command prints at start: the URI and where it came from.
        self.location = location or TrackingLocation(self.tracking_uri, "the caller")
        self.experiment_name = experiment_name
        self.client: Any = None
        self.parent_run_id: str | None = None
        self.context: TrackingContext | None = None
        self._state: dict[str, Any] = {}
        self._state_file: Path | None = None
        self._tracers: list[Any] = []  # EpisodeTracers not yet closed
        # (trace ids, candidate id, run id) of GEPA's traces, tagged once they are written.
        self._adopted: list[tuple[list[str], str, str]] = []
        self._traced = False  # a tracer was handed out in this invocation

    # ----- lifecycle -----------------------------------------------------------------------

    def start(self, context: TrackingContext) -> None:
        from mlflow.entities import Param, RunTag

        self.context = context
        self.client = mlflow_client(self.tracking_uri)
        experiment_id = get_or_create_experiment(
            self.client, self.experiment_name, self.tracking_uri
        )
        describe_experiment(self.client, experiment_id, context.spec.description)
        self._state_file = context.run_dir / STATE_FILE
        state = read_json(self._state_file) if self._state_file.exists() else {}
        same_store = (
            state.get("tracking_uri") == self.tracking_uri
            and state.get("experiment_id") == experiment_id
            and state.get("config_hash") == context.config_hash
            and self._run_exists(state.get("parent_run_id"))
        )
        if not same_store:
            state = {
                "tracking_uri": self.tracking_uri,
                "experiment_id": experiment_id,
                "config_hash": context.config_hash,
                "parent_run_id": None,
                "candidates": {},
                "generations": {},
            }
        # Added after the first release of this file: states written before lack them.
        state.setdefault("evaluated_per_generation", {})
        state.setdefault("heldout_scores", {})
        state.setdefault("prompt_versions", {})
        if state["parent_run_id"] is None:
            run = self.client.create_run(
                experiment_id,
                run_name=context.name,
                tags={
                    **run_context_tags(),
                    NOTE_TAG: experiment_description(context),
                    TAG_KIND: "experiment",
                    TAG_EXPERIMENT: context.name,
                    TAG_CONFIG_HASH: context.config_hash,
                    TAG_RUN_DIR: str(context.run_dir),
                },
            )
            state["parent_run_id"] = run.info.run_id
            params = [Param(k, v) for k, v in experiment_params(context).items()]
            self.client.log_batch(run.info.run_id, params=params)
        else:
            self.client.update_run(state["parent_run_id"], status="RUNNING")
            self.client.log_batch(
                state["parent_run_id"], tags=[RunTag(TAG_RUN_DIR, str(context.run_dir))]
            )
        self.parent_run_id = state["parent_run_id"]
        # `evolve export <name>` finds the store and the registry name here.
        state["registered_model"] = context.registered_model
        self._state = state
        self._save_state()

    def _run_exists(self, run_id: str | None) -> bool:
        if not run_id:
            return False
        try:
            return self.client.get_run(run_id).info.lifecycle_stage == "active"
        except Exception:  # noqa: BLE001 - any lookup failure means: make a new run
            return False

    def _save_state(self) -> None:
        if self._state_file is not None:
            atomic_write_json(self._state_file, self._state)

    def finish(self, result: ExperimentResult, *, report: str = "") -> None:
        from mlflow.entities import Metric, RunTag

        run_id = self.parent_run_id
        assert run_id is not None
        timestamp = _now_ms()
        # Totals sit at the last generation's step: at step 0 they would draw every curve
        # back to the start (the per-generation `candidates_evaluated` is a running count).
        last_step = max((g.generation for g in result.generations), default=0)
        metrics = {
            "total_llm_calls": result.llm_calls,
            "total_tokens": result.tokens,
            "total_wall_time_s": result.wall_time_s,
            "reflection_parse_failures": result.reflection_parse_failures,
            "total_candidates_evaluated": sum(r.train is not None for r in result.candidates),
        }
        if result.best_id is not None:
            best = result.candidate(result.best_id)
            if best.train is not None:
                metrics["final_best_train_score"] = best.train.score
            if best.heldout is not None:
                metrics["final_best_heldout_score"] = best.heldout.score
        if result.chain_summary is not None:
            metrics.update(result.chain_summary.flat_metrics("chain_"))
        tags = [RunTag("evolve.complete", str(result.complete).lower())]
        if result.best_id is not None:
            tags.append(RunTag("evolve.best_candidate", result.best_id))
        if result.stopped:
            tags.append(RunTag("evolve.stopped", result.stopped[:500]))
        # A resumed run logs only the totals that changed (no second point of the same one).
        before = self._state.get("final_metrics") or {}
        changed = {
            k: float(v) for k, v in metrics.items() if before.get(k) != [last_step, float(v)]
        }
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, v, timestamp, last_step) for k, v in changed.items()],
            tags=tags,
        )
        self._state["final_metrics"] = {k: [last_step, float(v)] for k, v in metrics.items()}
        self._save_state()
        self._write_traces()
        if report:
            self.client.log_text(run_id, report, "compare.txt")
        self.client.set_terminated(run_id, "FINISHED")

    def fail(self) -> None:
        if self.client is not None and self.parent_run_id is not None:
            # Never hide the original error behind a tracking failure.
            with contextlib.suppress(Exception):
                self._write_traces()
            with contextlib.suppress(Exception):
                # Runs opened for a traced evaluation that never finished.
                for entry in self._state.get("candidates", {}).values():
                    if entry.get("run_id") and not entry.get("logged"):
                        self.client.set_terminated(entry["run_id"], "KILLED")
            with contextlib.suppress(Exception):
                self.client.set_terminated(self.parent_run_id, "KILLED")

    # ----- traces -------------------------------------------------------------------------------

    def evaluation_sink(
        self,
        split: str,
        inner: ProgressSink | None,
        *,
        record: CandidateRecord | None = None,
        fingerprint: str | None = None,
    ) -> ProgressSink | None:
        from evolve.tracing import traces_wanted

        assert self.context is not None
        if not traces_wanted(self.context.spec.tracking.traces, split):
            return inner
        from evolve.tracing import EpisodeTracer

        tags = {TAG_EXPERIMENT: self.context.name, "evolve.split": split}
        source_run_id = None
        if record is not None:
            tags[TAG_CANDIDATE] = record.id
            # The candidate's run exists from its first traced evaluation on: the trace
            # links to it (and the run's duration covers the evaluation).
            source_run_id = self.candidate_run(record)
        elif fingerprint is not None:
            tags["evolve.fingerprint"] = fingerprint
            # GEPA's held-out evaluations come after the train one was logged: link those.
            for candidate_id, entry in self._state["candidates"].items():
                if entry.get("fingerprint") == fingerprint and entry.get("run_id"):
                    tags[TAG_CANDIDATE] = candidate_id
                    source_run_id = entry["run_id"]
                    break
        tracer = EpisodeTracer(
            inner,
            tracking_uri=self.tracking_uri,
            experiment_id=self._state["experiment_id"],
            tags=tags,
            source_run_id=source_run_id,
        )
        self._tracers.append(tracer)
        self._traced = True
        return tracer

    def _adopt_traces(self, record: CandidateRecord, run_id: str) -> None:
        """Traces GEPA recorded by fingerprint before `record` existed: closed, tagged with
        the candidate and linked to its run."""
        adopted = [
            t for t in self._tracers if t.tags.get("evolve.fingerprint") == record.fingerprint
        ]
        self._tracers = [t for t in self._tracers if t not in adopted]
        trace_ids = []
        for tracer in adopted:
            tracer.close()
            trace_ids += tracer.trace_ids
        if trace_ids:
            self._adopted.append((trace_ids, record.id, run_id))

    def _write_traces(self) -> None:
        """Close every tracer, wait for the traces to be written (once: it costs a second),
        then tag and link the adopted ones."""
        if not self._traced:
            return
        from evolve.tracing import flush_traces

        self._close_tracers()
        flush_traces()
        for trace_ids, candidate_id, run_id in self._adopted:
            for trace_id in trace_ids:
                self.client.set_trace_tag(trace_id, TAG_CANDIDATE, candidate_id)
            self.client.link_traces_to_run(trace_ids, run_id)
        self._adopted = []

    def _close_tracers(self, candidate_id: str | None = None) -> None:
        """Close the tracers of `candidate_id` (all when None): their traces are written."""
        keep = []
        for tracer in self._tracers:
            if candidate_id is None or tracer.tags.get(TAG_CANDIDATE) == candidate_id:
                tracer.close()
            else:
                keep.append(tracer)
        self._tracers = keep

    # ----- candidates and generations ---------------------------------------------------------

    def log_candidate(
        self,
        record: CandidateRecord,
        *,
        split: str,
        parent: CandidateRecord | None,
        policy_dir: Path,
        feedback: str | None,
    ) -> None:
        from mlflow.entities import Metric

        scores: EvaluationScores | None = getattr(record, split)
        if scores is None:
            return
        entry = self._candidate_entry(record)
        if split in entry["logged"]:
            return
        run_id = self.candidate_run(record)
        # State written before the "artifacts" flag existed: a logged split had them.
        if not entry.get("artifacts", bool(entry["logged"])):
            self._log_candidate_artifacts(run_id, record, parent, policy_dir, feedback)
            self._register_prompts(run_id, record, entry)
            entry["artifacts"] = True
            self._save_state()
        timestamp = _now_ms()
        values = scores.summary.flat_metrics(f"{split}_")
        values[f"{split}_score"] = scores.score
        values[f"{split}_wall_time_s"] = scores.wall_time_s
        if split == "train":
            values["reflection_llm_calls"] = record.reflection_calls
            values["reflection_tokens"] = record.reflection_tokens
            values["reflection_parse_failures"] = record.reflection_parse_failures
        metrics = [Metric(k, float(v), timestamp, record.generation) for k, v in values.items()]
        metrics += per_period_metrics(scores, split, timestamp)
        self.client.log_batch(run_id, metrics=metrics)
        if split == "heldout":
            self._state["heldout_scores"][record.id] = scores.score
        self._close_tracers(record.id)
        self._adopt_traces(record, run_id)
        self._tag_prompt_versions(record, entry, split, scores.score)
        self.client.log_text(run_id, per_period_table(scores), f"scores/{split}_per_period.csv")
        self.client.set_tag(run_id, TAG_STATUS, str(record.status))
        if scores.objective_used:  # e.g. pooled_memory_score: what `score` is
            self.client.set_tag(run_id, f"evolve.{split}_objective_used", scores.objective_used)
        self.client.set_terminated(run_id, "FINISHED")
        entry["logged"].append(split)
        self._save_state()

    def _candidate_entry(self, record: CandidateRecord) -> dict[str, Any]:
        return self._state["candidates"].setdefault(record.id, {"run_id": None, "logged": []})

    def candidate_run(self, record: CandidateRecord) -> str:
        """The id of `record`'s run, created (with its params) on first use."""
        from mlflow.entities import Param

        entry = self._candidate_entry(record)
        if entry["run_id"] is None or not self._run_exists(entry["run_id"]):
            entry.update(run_id=self._create_candidate_run(record), logged=[], artifacts=False)
            entry["fingerprint"] = record.fingerprint  # GEPA evaluates by fingerprint
            params = [Param(k, v) for k, v in self._candidate_params(record).items()]
            self.client.log_batch(entry["run_id"], params=params)
            self._save_state()
        return entry["run_id"]

    def _create_candidate_run(self, record: CandidateRecord) -> str:
        assert self.context is not None
        tags = {
            **run_context_tags(),
            NOTE_TAG: candidate_description(record, self.context),
            PARENT_RUN_TAG: self.parent_run_id,
            TAG_KIND: "candidate",
            TAG_EXPERIMENT: self.context.name,
            TAG_CANDIDATE: record.id,
            TAG_GENERATION: str(record.generation),
            TAG_PARENTS: ",".join(record.parent_ids),
            TAG_MUTATION: record.mutation.kind,
            TAG_STATUS: str(record.status),
        }
        if record.mutation.component:
            tags["evolve.component"] = record.mutation.component
        run = self.client.create_run(self._state["experiment_id"], run_name=record.id, tags=tags)
        return run.info.run_id

    def _candidate_params(self, record: CandidateRecord) -> dict[str, str]:
        assert self.context is not None
        params = {
            "policy_kind": record.kind,
            "candidate_id": record.id,
            "generation": str(record.generation),
            "parent_ids": ",".join(record.parent_ids) or "-",
            "mutation": record.mutation.describe()[:250],
            "seed.candidate": str(record.seed),
            "seed.experiment": str(self.context.spec.seed),
            "seed.environment": str(self.context.spec.environment.seed),
            "seed.episode": str(
                self.context.spec.seed
                if self.context.spec.episode.seed is None
                else self.context.spec.episode.seed
            ),
            "fingerprint": record.fingerprint,
            "protocol": self.context.spec.protocol,  # results differ by information flow
        }
        for name, value in sorted(record.parameters.items()):
            params[f"param.{name}"] = str(value)
        for role, model in sorted(self.context.model_names.items()):
            params[f"model.{role}"] = str(model)
        if record.mutation.feedback is not None:  # proposed by the reflector
            params["feedback"] = str(record.mutation.feedback)
            params["reflector_temperature"] = str(record.mutation.temperature)
            params["rollout_id"] = str(record.mutation.rollout_id)
        return params

    def _log_candidate_artifacts(
        self,
        run_id: str,
        record: CandidateRecord,
        parent: CandidateRecord | None,
        policy_dir: Path,
        feedback: str | None,
    ) -> None:
        for name, text in sorted(record.components.items()):
            self.client.log_text(run_id, text + "\n", f"components/{name}.txt")
            if parent is not None and parent.components.get(name) != text:
                old = parent.components.get(name, "")
                diff = instruction_diff(old, text, name, parent.id, record.id)
                self.client.log_text(run_id, diff, f"diffs/{name}.diff")
                page = instruction_diff_html(old, text, name, parent.id, record.id)
                self.client.log_text(run_id, page, f"diffs/{name}.html")
        if Path(policy_dir).is_dir():
            self.client.log_artifacts(run_id, str(policy_dir), "policy")
        if feedback:
            self.client.log_text(run_id, feedback + "\n", "feedback.txt")

    # ----- prompt registry ------------------------------------------------------------------

    def _register_prompts(self, run_id: str, record: CandidateRecord, entry: dict) -> None:
        """Each distinct text of a component becomes one prompt version; a candidate that
        inherits a text unchanged points at the version its ancestor registered."""
        from mlflow.entities import RunTag

        assert self.context is not None
        known = self._state["prompt_versions"]
        entry.setdefault("prompts", {})
        entry.setdefault("registered", [])
        tags = []
        for component, text in sorted(record.components.items()):
            name = prompt_name(self.context.name, component)
            digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
            versions = known.setdefault(name, {})
            if digest not in versions:
                version = self.client.register_prompt(
                    name=name,
                    template=text,
                    commit_message=f"{record.id}: {record.mutation.describe()}"[:500],
                    tags=self._prompt_tags(record),
                )
                versions[digest] = int(version.version)
                entry["registered"].append(component)
            version_number = versions[digest]
            entry["prompts"][component] = version_number
            tags.append(RunTag(f"{TAG_PROMPT_PREFIX}{component}", f"{name}/{version_number}"))
            # MLflow 3.17 resolves the linking store from the process-wide tracking URI, not
            # the client's: without this it would create ./mlflow.db and link nothing.
            with (
                contextlib.suppress(Exception),  # a link is a convenience of the UI
                _use_tracking_uri(self.tracking_uri),
            ):
                self.client.link_prompt_version_to_run(run_id, f"prompts:/{name}/{version_number}")
        if tags:
            self.client.log_batch(run_id, tags=tags)

    def _prompt_tags(self, record: CandidateRecord) -> dict[str, str]:
        assert self.context is not None
        tags = {
            TAG_CANDIDATE: record.id,
            TAG_PARENTS: ",".join(record.parent_ids) or "-",
            TAG_MUTATION: record.mutation.kind,
            TAG_GENERATION: str(record.generation),
            TAG_EXPERIMENT: self.context.name,
            TAG_CONFIG_HASH: self.context.config_hash,
        }
        if record.mutation.component:
            tags["evolve.component"] = record.mutation.component
        return tags

    def _tag_prompt_versions(
        self, record: CandidateRecord, entry: dict, split: str, score: float
    ) -> None:
        """The versions this candidate registered carry its scores."""
        assert self.context is not None
        for component in entry.get("registered", []):
            name = prompt_name(self.context.name, component)
            version = entry["prompts"][component]
            self.client.set_prompt_version_tag(name, version, f"{split}_score", f"{score:.6g}")

    def log_generation(self, record: GenerationRecord, *, spent: Spend) -> None:
        from mlflow.entities import Metric

        key = str(record.generation)
        digest = record.model_dump_json()
        if self._state["generations"].get(key) == digest:
            return
        timestamp = _now_ms()
        evaluated = self._state["evaluated_per_generation"]
        evaluated[key] = len(record.evaluated_ids)
        values: dict[str, float] = {
            "generation_llm_calls": record.llm_calls,
            "generation_tokens": record.tokens,
            "population_size": len(record.population),
            "generation_candidates_evaluated": len(record.evaluated_ids),
            # A running count: it only grows with the step, so its chart never zig-zags.
            "candidates_evaluated": sum(
                count for g, count in evaluated.items() if int(g) <= record.generation
            ),
            "spent_llm_calls": spent.llm_calls,
            "spent_tokens": spent.tokens,
            "spent_wall_time_s": spent.wall_time_s,
        }
        for name in ("best_train_score", "mean_train_score", "best_heldout_score"):
            value = getattr(record, name)
            if value is not None:
                values[name] = value
        # Held-out evaluations are reported to the tracker as they finish (the loop scores
        # only promising candidates there): the mean over the kept population's scored ones.
        heldout = self._state["heldout_scores"]
        scored = [heldout[c] for c in record.population if c in heldout]
        if scored:
            values["mean_heldout_score"] = sum(scored) / len(scored)
        metrics = [Metric(k, float(v), timestamp, record.generation) for k, v in values.items()]
        self.client.log_batch(self.parent_run_id, metrics=metrics)
        self._state["generations"][key] = digest
        self._save_state()


def experiment_params(context: TrackingContext) -> dict[str, str]:
    """The parent run's params: the spec's settings (never endpoints or keys) and models."""
    spec = context.spec
    data = spec.model_dump(mode="json", exclude={"llm", "tracking", "description"})
    params: dict[str, str] = {}

    def flatten(value: Any, prefix: str) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                flatten(inner, f"{prefix}{key}.")
        else:
            text = json.dumps(value) if not isinstance(value, str) else value
            params[prefix.rstrip(".")] = text[:500]

    flatten(data, "")
    for role, model in sorted(context.model_names.items()):
        params[f"model.{role}"] = str(model)
    params["environment"] = context.environment[:500]
    params["train_users"] = ",".join(context.train_users)[:500]
    params["heldout_users"] = ",".join(context.heldout_users)[:500]
    params["config_hash"] = context.config_hash
    params["protocol"] = spec.protocol  # always present, even when left at its default
    return params


def experiment_description(context: TrackingContext) -> str:
    spec = context.spec
    description = spec.description.strip()
    summary = (
        f"amemgym-evolve experiment {context.name}: {spec.policy.kind or 'bundle'} policy, "
        f"{spec.optimizer.schedule} schedule, protocol {spec.protocol}, environment "
        f"{context.environment}."
    )
    return f"{description}\n\n{summary}" if description else summary


def candidate_description(record: CandidateRecord, context: TrackingContext) -> str:
    parents = ", ".join(record.parent_ids) or "none"
    text = (
        f"Candidate {record.id} of {context.name}: generation {record.generation}, "
        f"{record.mutation.describe()}; parents {parents}."
    )
    description = context.spec.description.strip()
    return f"{text}\n\n{description}" if description else text


def per_period_metrics(scores: EvaluationScores, split: str, timestamp: int) -> list[Any]:
    """`<split>_period/<name>` with step = period: the curves a researcher compares."""
    from mlflow.entities import Metric

    periods = scores.periods if scores.periods is not None else range(len(scores.per_period))
    metrics = []
    for period, summary in zip(periods, scores.per_period, strict=False):
        # Per-period curves of a candidate (`<split>_period/<name>`, step = period).
        for declaration in metrics_in("per_period"):
            value = declaration.value_of(summary)
            if value is not None:
                name = f"{split}_period/{declaration.name}"
                metrics.append(Metric(name, value, timestamp, period))
        metrics.append(
            Metric(
                f"{split}_period/parse_failures",
                float(summary.parse_failures_total),
                timestamp,
                period,
            )
        )
    return metrics


def instruction_diff_html(old: str, new: str, name: str, old_id: str, new_id: str) -> str:
    """A side-by-side diff as a standalone page: the MLflow UI previews `.html` artifacts."""
    return difflib.HtmlDiff().make_file(
        old.splitlines(),
        new.splitlines(),
        fromdesc=f"{old_id}/{name}",
        todesc=f"{new_id}/{name}",
    )


def instruction_diff(old: str, new: str, name: str, old_id: str, new_id: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"{old_id}/{name}",
        tofile=f"{new_id}/{name}",
    )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return text or f"(no change in {name})\n"


def per_period_table(scores: EvaluationScores) -> str:
    declared = metrics_in("per_period")
    counts = ("n_items", "llm_calls", "tokens")
    columns = [declaration.name for declaration in declared] + list(counts)
    periods = scores.periods if scores.periods is not None else range(len(scores.per_period))
    lines = ["period," + ",".join(columns) + ",parse_failures"]
    for period, summary in zip(periods, scores.per_period, strict=False):
        values = [declaration.value_of(summary) for declaration in declared]
        values += [getattr(summary, count) for count in counts]
        cells = ["" if value is None else f"{value:g}" for value in values]
        lines.append(f"{period}," + ",".join(cells) + f",{summary.parse_failures_total}")
    return "\n".join(lines) + "\n"


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def tracker_for(spec: ExperimentSpec, *, tracking_uri: str | None = None, enabled: bool = True):
    """The tracker a command should use for `spec` (a `NullTracker` when disabled)."""
    if not enabled or not spec.tracking.enabled:
        return NullTracker()
    location = tracking_location(tracking_uri, spec)
    return MLflowTracker(location.uri, spec.mlflow_experiment_name(), location)


@contextlib.contextmanager
def _use_tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's process-wide tracking URI set to `uri` for the block, then restored."""
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri as use_uri

    with use_uri(uri):
        yield
