"""Export the best evolved policy as a bundle and register it in the MLflow model registry.

Finding the target, where it registers and the registration are one sequence whose checks
(name, store) all run before the bundle is written.

The exported candidate is the experiment's best: chosen on its validation users, else its
train users (`evolve.results.records.select_best`); the held-out users never choose it, they
report the held-out test of it against its base (`evolve.export.model_card`). The bundle is
written with `policy.save` (instructions, parameters, provenance; never an LM, endpoint or
key) and reloads with `memory_policies.load(dir)`.

Registration does not use MLflow's DSPy flavor, which pickles the configured LM with its
key, nor a pickle of any class of ours: the model is "from code" (`evolve/export/exported_model.py`,
which imports nothing from `evolve`), carries the `memory_policies` package as `code_paths`
and the bundle as its only artifact, and lists its pip requirements. It loads where only
mlflow, dspy and numpy are installed; its LM endpoint is read at load time from
`model_config` or environment variables, never stored. It is an MLflow 3 LoggedModel whose
source is the candidate's run (linked by id; the run is not reopened), and the registered
version carries a description, the candidate id, its held-out and train scores, the held-out
verdict against the base (tag `evolve.heldout_verdict`: beats / within noise / worse, with
its interval, McNemar's counts, users and questions in the description) and the alias
`champion`. The logged model carries the candidate's train and held-out metrics (with their
intervals' bounds and the held-out test's `heldout_difference`, ...) and the experiment's
evolution plot (`figures/`), which the registered version's page shows. The
champion's instructions in the Prompt Registry (the versions its candidate run names in its
`evolve.prompt.<component>` tags) get the alias `champion`, are linked to the model (MLflow's
prompt-model link), and each prompt's own tags name the champion's candidate and version.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from evolve.core.errors import ConfigError
from evolve.export.candidate_runs import record_from_run, selected_candidate_run
from evolve.export.model_card import (
    HeldoutVerdict,
    heldout_verdict,
    heldout_verdict_from_run,
)
from evolve.export.registry import (
    alias_champion_prompts,
    register_model_version,
)
from evolve.optimize.experiment_dir import ExperimentDir, experiment_dir_for
from evolve.results.records import CandidateRecord, ExperimentResult
from evolve.simulator.run_dir import read_object
from evolve.stores.registered_names import registered_model_name_problem
from evolve.stores.tracking_uri import (
    ENV_VAR,
    SOURCE_SPEC,
    TrackingLocation,
    masked_uri,
    resolve_tracking_uri,
)
from evolve.tracking import (
    PARENT_RUN_TAG,
    STATE_FILE,
    TAG_CANDIDATE,
    TAG_KIND,
    TAG_RUN_DIR,
    mlflow_client,
    normalize_tracking_uri,
    prepare_tracking_uri,
)
from evolve.tracking.tags import TAG_BEST_CANDIDATE


@dataclass(frozen=True)
class ExportResult:
    path: Path
    candidate_id: str
    experiment: str
    train_score: float | None
    heldout_score: float | None
    registered_name: str | None = None
    registered_version: str | None = None
    model_uri: str | None = None
    # component -> `prompts:/<name>@champion` (empty: not registered, or an untracked run)
    prompts: dict[str, str] = field(default_factory=dict)
    # The held-out test of the candidate against its base (None: none was made or recorded).
    heldout: HeldoutVerdict | None = None


def best_candidate(result: ExperimentResult) -> CandidateRecord:
    if result.best_id is None:
        raise ConfigError(
            f"experiment {result.name} has no evaluated candidate yet; run it first "
            f"(evolve run <spec>) and export when at least generation 0 is finished"
        )
    return result.candidate(result.best_id)


def export_tracking_location(
    target: str, *, runs_dir: str | Path = "runs", tracking_uri: str | None = None
) -> TrackingLocation:
    """Where `evolve export target` registers: the flag, the spec's store as written (also
    for an experiment name: recorded with its run), `MLFLOW_TRACKING_URI`, the default."""
    return _export_settings(target, runs_dir, tracking_uri)[1]


def _export_settings(
    target: str, runs_dir: str | Path, tracking_uri: str | None
) -> tuple[str | None, TrackingLocation]:
    """The spec's (or the run's) registered model name, and the tracking location."""
    from evolve.spec.config import load_spec

    experiment_dir = experiment_dir_for(target, runs_dir)
    state_file = experiment_dir / STATE_FILE if experiment_dir is not None else None
    state = read_object(state_file) if state_file is not None and state_file.is_file() else {}
    spec_name = state.get("registered_model")
    # The spec's own setting as written, recorded by the run (not the absolute store the run
    # resolved: a moved or copied checkout exports into its own store).
    configured, source = state.get("spec_tracking_uri"), SOURCE_SPEC
    if Path(target).suffix == ".toml" and Path(target).is_file():
        spec = load_spec(target)
        spec_name = spec.registered_model_name()
        if spec.tracking.tracking_uri:
            configured, source = spec.tracking.tracking_uri, SOURCE_SPEC
    if tracking_uri is None and configured and source != SOURCE_SPEC:
        configured = _unmasked(configured)
    location = resolve_tracking_uri(tracking_uri, configured, configured_source=source)
    return spec_name, TrackingLocation(normalize_tracking_uri(location.uri), location.source)


def export_policy(
    target: str,
    out_dir: str | Path,
    *,
    runs_dir: str | Path = "runs",
    register: bool = True,
    registered_name: str | None = None,
    tracking_uri: str | None = None,
) -> ExportResult:
    """Write the best policy of an experiment (or of an MLflow run) to `out_dir`.

    `target`: an experiment spec file, an experiment name under `runs_dir`, an experiment
    directory, or an MLflow run id (a parent run: the candidate it selected, on validation
    users, else train users; a candidate run: that candidate). The tracking URI:
    `export_tracking_location`.
    """
    out = Path(out_dir)
    if register and registered_name is not None:
        check_registered_model_name(registered_name)  # before anything is written
    experiment_dir = experiment_dir_for(target, runs_dir)
    spec_name, location = _export_settings(target, runs_dir, tracking_uri)
    tracking_uri = location.uri
    if register or experiment_dir is None:
        # Before the bundle is written: a store that cannot work fails with nothing done.
        prepare_tracking_uri(tracking_uri)
    if experiment_dir is not None:
        result = ExperimentDir(experiment_dir).load_result()
        best = best_candidate(result)
        source = ExperimentDir(experiment_dir).policy_dir(best.id)
        run_id = _candidate_run_id(experiment_dir, best.id, tracking_uri)
        name = registered_name or spec_name or result.name
        if register:
            check_registered_model_name(name)
        verdict = heldout_verdict(result)
        exported = write_bundle(source, out, result.name, best, verdict=verdict)
    else:
        exported, best, run_id, experiment_name, verdict = _export_from_run(
            target, out, tracking_uri
        )
        name = registered_name or experiment_name
        result = None
    export = ExportResult(
        path=exported,
        candidate_id=best.id,
        experiment=result.name if result is not None else name,
        train_score=best.train_score,
        heldout_score=best.heldout_score,
        heldout=verdict,
    )
    if not register:
        return export
    with tempfile.TemporaryDirectory() as tmp:
        figures = evolution_figures(result, Path(tmp)) if result is not None else []
        version, model_uri = register_model_version(
            exported,
            name,
            tracking_uri=tracking_uri,
            run_id=run_id,
            candidate=best,
            figures=figures,
            verdict=verdict,
        )
    registered = mlflow_client(tracking_uri).get_model_version(name, version)
    # A version registered from a LoggedModel has the source `models:/<model id>`.
    model_id = registered.model_id or registered.source.removeprefix("models:/")
    prompts = (
        alias_champion_prompts(tracking_uri, run_id, model_id=model_id)
        if run_id is not None
        else {}
    )
    return ExportResult(
        **{
            **export.__dict__,
            "registered_name": name,
            "registered_version": version,
            "model_uri": model_uri,
            "prompts": prompts,
        }
    )


def check_registered_model_name(name: str) -> None:
    """Refuse, as a `ConfigError`, a name MLflow's model registry would refuse."""
    problem = registered_model_name_problem(name)
    if problem is not None:
        raise ConfigError(problem)


def write_bundle(
    source: Path,
    out: Path,
    experiment: str,
    record: CandidateRecord,
    *,
    verdict: HeldoutVerdict | None = None,
) -> Path:
    """Load and save again: proves the bundle loads, and records where it came from (and
    the held-out verdict against its base, where there is one)."""
    import memory_policies

    policy = memory_policies.load(source)
    provenance = dict(memory_policies.read_bundle(source).get("provenance") or {})
    provenance.update(
        {
            "experiment": experiment,
            "candidate": record.id,
            "train_score": record.train_score,
            "heldout_score": record.heldout_score,
        }
    )
    if verdict is not None and verdict.verdict is not None:
        provenance["heldout_verdict"] = verdict.verdict
    policy.save(out, provenance=provenance)
    return out


def _unmasked(recorded: str) -> str | None:
    """The recorded store (kept with its credentials masked) as a usable URI: itself when
    nothing was masked, else `MLFLOW_TRACKING_URI` when it names the same store (then None:
    the resolution picks the variable up); refused otherwise."""
    if masked_uri(recorded) == recorded and "***" not in recorded:
        return recorded
    from_environment = os.environ.get(ENV_VAR, "").strip()
    if from_environment and masked_uri(normalize_tracking_uri(from_environment)) == recorded:
        return None
    raise ConfigError(
        f"the experiment recorded its MLflow store as {recorded} (credentials are never "
        f"stored); pass --tracking-uri with the full URI, or set {ENV_VAR} to it"
    )


def _candidate_run_id(experiment_dir: Path, candidate_id: str, tracking_uri: str) -> str | None:
    """The candidate's run when the store holds it: the store the run logged to, or a copy
    of it (a copied checkout), whatever absolute path the run recorded."""
    state_file = experiment_dir / STATE_FILE
    if not state_file.exists():
        return None
    state = read_object(state_file)
    run_id = (state.get("candidates", {}).get(candidate_id) or {}).get("run_id")
    if not run_id:
        return None
    try:
        run = mlflow_client(tracking_uri).get_run(run_id)
    except Exception:  # noqa: BLE001 - not in this store: registered without a source run
        return None
    return run_id if run.data.tags.get(TAG_CANDIDATE) == candidate_id else None


def _export_from_run(
    run_id: str, out: Path, tracking_uri: str
) -> tuple[Path, CandidateRecord, str | None, str, HeldoutVerdict | None]:
    from mlflow.exceptions import MlflowException

    client = mlflow_client(tracking_uri)
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise ConfigError(
            f"{run_id!r} is not an experiment spec, an experiment under runs/, nor a run id in "
            f"the MLflow store {tracking_uri}; pass e.g. experiments/quickstart.toml, "
            "quickstart, or a run id from `mlflow ui` (and --tracking-uri if it lives elsewhere)"
        ) from None
    tags = run.data.tags
    parent_tags: dict[str, str] = {}
    if tags.get(TAG_KIND) == "experiment":
        local = Path(tags.get(TAG_RUN_DIR, ""))
        if (local / "experiment.json").is_file():
            result = ExperimentDir(local).load_result()
            best = best_candidate(result)
            candidate_run = _candidate_run_id(local, best.id, tracking_uri)
            verdict = heldout_verdict(result)
            source = ExperimentDir(local).policy_dir(best.id)
            path = write_bundle(source, out, result.name, best, verdict=verdict)
            return path, best, candidate_run, result.name, verdict
        children = client.search_runs(
            [run.info.experiment_id],
            filter_string=f"tags.`{PARENT_RUN_TAG}` = '{run_id}'",
            max_results=10000,
        )
        if not children:
            raise ConfigError(f"MLflow run {run_id} has no candidate runs to export")
        parent_tags = dict(tags)
        run = selected_candidate_run(children, tags.get(TAG_BEST_CANDIDATE))
        tags = run.data.tags
    if tags.get(TAG_KIND) != "candidate":
        raise ConfigError(
            f"MLflow run {run_id} is not an amemgym-evolve experiment or candidate run "
            f"(tag {TAG_KIND} is {tags.get(TAG_KIND)!r})"
        )
    candidate_run_id = run.info.run_id
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(client.download_artifacts(candidate_run_id, "policy", tmp))
        record = record_from_run(run)
        experiment = tags.get("evolve.experiment", "policy")
        verdict = heldout_verdict_from_run(parent_tags, record.id)
        path = write_bundle(local, out, experiment, record, verdict=verdict)
    return path, record, candidate_run_id, experiment, verdict


def evolution_figures(result: ExperimentResult, directory: Path) -> list[Path]:
    """The experiment's evolution plot (what `evolve compare --plot` draws), as PNG."""
    from evolve.reporting.plots import plot_evolution, save_figure

    written = save_figure(plot_evolution(result), directory / "evolution.png")
    return [path for path in written if path.suffix == ".png"]
