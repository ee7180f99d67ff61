"""The toolkit as Python functions: what the `evolve run`, `evolve eval` and `evolve tune`
commands call, without argument parsing, printing or progress bars.

```python
from evolve import api

spec = api.load_spec("experiments/quickstart.toml")
result = api.run_experiment(spec)              # resumes like `evolve run`
best = result.candidate(result.best_id)        # frozen records with lineage
```

Every function opens the LM endpoints of its spec (or the `llm` given; with none configured,
the embedded llama.cpp server) and closes them before returning. Like the commands, the
functions put DSPy's response cache under the toolkit's cache directory
(`evolve.core.paths.use_toolkit_caches`: environment defaults that values you set beforehand
override); importing `evolve` or this module sets nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from evolve.core.paths import cache_dir, use_toolkit_caches
from evolve.llm import LLMConfig
from evolve.optimize.loop import LoopProgress
from evolve.results.records import ExperimentResult
from evolve.simulator.environment import Environment
from evolve.simulator.evaluation import EpisodeConfig, EvaluationReport
from evolve.spec.config import ExperimentSpec, ResolvedExperiment
from evolve.spec.config import load_spec as _load_experiment_spec
from evolve.tuning.records import TuningResult
from evolve.tuning.spec import StudySpec
from evolve.tuning.study import TuneProgress
from memory_policies import MemoryPolicy

__all__ = ["evaluate_policies", "load_spec", "load_study_spec", "run_experiment", "run_tuning"]


def load_spec(path: str | Path) -> ExperimentSpec:
    """Read and validate an experiment spec (TOML), as `evolve run` does.

    Raises `evolve.core.errors.ConfigError` naming the file and the offending key.
    """
    return _load_experiment_spec(path)


def load_study_spec(path: str | Path) -> StudySpec:
    """Read and validate a study spec (TOML with a `[tuning]` table), as `evolve tune` does."""
    from evolve.tuning import load_study_spec as _load_study_spec

    return _load_study_spec(path)


def run_experiment(
    spec: ExperimentSpec | ResolvedExperiment | str | Path,
    *,
    llm: LLMConfig | None = None,
    runs_dir: str | Path = "runs",
    tracking: bool = True,
    tracking_uri: str | None = None,
    progress: LoopProgress | None = None,
) -> ExperimentResult:
    """Run (or resume) a self-evolution experiment; the same run as `evolve run SPEC`.

    `spec`: a spec, a resolved spec or a spec file. `llm` replaces the spec's `[llm]` table.
    With `tracking`, candidates are logged to MLflow (`tracking_uri`, else the spec's, else
    `MLFLOW_TRACKING_URI`, else `sqlite:///mlruns/mlflow.db`). Records
    land in `runs_dir/<name>/`; a second process on the same directory is refused
    (`evolve.core.errors.RunBusyError`, exit code 4 on the command line). The loop inside, for LMs
    you opened yourself: `evolve.optimize.evolve_policy`.
    """
    from evolve.core.locking import run_lock
    from evolve.llm import open_role_lms, protocol_llm_config
    from evolve.optimize import evolve_policy
    from evolve.spec.config import resolve
    from evolve.tracking import tracker_for

    use_toolkit_caches()
    if isinstance(spec, str | Path):
        spec = load_spec(spec)
    resolved = spec if isinstance(spec, ResolvedExperiment) else resolve(spec)
    tracker = tracker_for(resolved.spec, tracking_uri=tracking_uri, enabled=tracking)
    runs = Path(runs_dir)
    with (
        run_lock(runs / resolved.spec.name, "run"),
        open_role_lms(protocol_llm_config(llm or resolved.spec.llm, resolved.rules)) as lms,
    ):
        return evolve_policy(resolved, lms, runs_dir=runs, tracker=tracker, progress=progress)


def evaluate_policies(
    environment: Environment | str | Path,
    policies: Mapping[str, MemoryPolicy | str] | Sequence[str],
    out_dir: str | Path,
    *,
    llm: LLMConfig | None = None,
    episode: EpisodeConfig | None = None,
    upper_bound: bool = True,
    upper_bound_cache: str | Path | None = None,
    off_policy: str | Path | None = None,
) -> dict[str, EvaluationReport]:
    """Evaluate memory policies on-policy on an environment; the same as `evolve eval`.

    `environment`: an `Environment` or a `data.json` path. `policies`: policy specs
    (`"in_context:update_every=2"`, a bundle directory) or a mapping from a run name to a
    policy or spec. Each policy's results go to `out_dir/<name>/` and resume. With
    `upper_bound`, the memory score is computed against the agent model's upper bound
    (cached under `upper_bound_cache`, by default the toolkit's cache directory). With
    `off_policy` (a previous run directory, as `evolve eval --off-policy`), the recorded
    transcripts are replayed instead of live sessions. Returns one report per name, in order.
    """
    from evolve.commands.eval import run_dir_names
    from evolve.core.locking import run_lock
    from evolve.llm import open_role_lms, protocol_llm_config
    from evolve.simulator.baselines import compute_upper_bound
    from evolve.simulator.environment import load_environment
    from evolve.simulator.evaluation import run_evaluation
    from memory_policies import build_policy

    use_toolkit_caches()
    env = environment if isinstance(environment, Environment) else load_environment(environment)
    config = episode or EpisodeConfig()
    # Under the paper protocol a spec naming no variant gets the paper variant.
    variant = config.rules.policy_variant
    if isinstance(policies, Mapping):
        named = {
            name: policy
            if isinstance(policy, MemoryPolicy)
            else build_policy(policy, default_variant=variant)
            for name, policy in policies.items()
        }
    else:
        specs = list(policies)
        built = (build_policy(s, default_variant=variant) for s in specs)
        named = dict(zip(run_dir_names(specs), built, strict=True))
    out = Path(out_dir)
    reports: dict[str, EvaluationReport] = {}
    with (
        run_lock(out, "eval"),
        open_role_lms(protocol_llm_config(llm or LLMConfig(), config.rules)) as lms,
    ):
        table = None
        if upper_bound:
            table = compute_upper_bound(
                env,
                lms,
                Path(upper_bound_cache or cache_dir() / "upper_bound"),
                concurrency=config.concurrency,
                rules=config.rules,
            )
        for name, policy in named.items():
            reports[name] = run_evaluation(
                env,
                policy,
                lms,
                out / name,
                config,
                upper_bound=table,
                off_policy_dir=Path(off_policy) if off_policy is not None else None,
            )
    return reports


def run_tuning(
    spec: StudySpec | str | Path,
    *,
    llm: LLMConfig | None = None,
    runs_dir: str | Path = "runs",
    trials: int | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    tracking: bool = True,
    tracking_uri: str | None = None,
    progress: TuneProgress | None = None,
) -> TuningResult:
    """Run (or resume) an Optuna study over policy parameters; the same as `evolve tune SPEC`.

    `spec`: a study spec (`evolve.tuning.StudySpec`) or its file. `trials`, `storage` and
    `study_name` override the spec as the command's flags do; the MLflow store is chosen as
    for `run_experiment`. The worker inside, for LMs you opened yourself:
    `evolve.tuning.run_study`.
    """
    from evolve.core.locking import run_lock
    from evolve.llm import open_role_lms, protocol_llm_config
    from evolve.tuning import resolve_tuning, run_study, study_tracker_for

    use_toolkit_caches()
    if isinstance(spec, str | Path):
        spec = load_study_spec(spec)
    resolved = resolve_tuning(spec, trials=trials, storage=storage, study_name=study_name)
    tracker = study_tracker_for(spec, tracking_uri=tracking_uri, enabled=tracking)
    runs = Path(runs_dir)
    with (
        run_lock(runs / spec.name, "tune"),
        open_role_lms(protocol_llm_config(llm or spec.llm, spec.rules)) as lms,
    ):
        return run_study(resolved, lms, runs_dir=runs, tracker=tracker, progress=progress)
