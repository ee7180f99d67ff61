"""The held-out check of a finished study: its best parameters (or Pareto front, and the base
policy if asked) evaluated on the users no trial saw, then recorded on the study."""

from __future__ import annotations

from evolve.results.objective import objective_used, objective_value
from evolve.simulator.evaluation import run_evaluation
from evolve.stats import QuestionOutcomes, compare, estimate, outcomes_from_users
from evolve.tuning.job import StudyRun
from evolve.tuning.records import HeldoutRecord, best_trial_numbers, record_choice
from evolve.tuning.spec import parameter_slug


def evaluate_heldout(run: StudyRun) -> None:
    """Evaluate the chosen settings on the held-out users (appended to `run.heldout`)."""
    job, tuning = run.job, run.tuning
    if tuning.heldout == "none" or job.heldout is None:
        return
    if run.finished() < job.trials:
        run.notes.append(
            "held-out evaluation waits for the study to finish (trials of other workers "
            "are still running); rerun evolve tune with --wait: it waits for them, then "
            "checks the held-out users"
        )
        return
    numbers = best_trial_numbers(run.study)
    if not numbers:
        run.notes.append("no trial completed (all pruned or failed): nothing to check")
        return
    trials = {t.number: t for t in run.study.get_trials(deepcopy=False)}
    label = "best"
    if tuning.multi_objective:
        label = "pareto"
        numbers = sorted(numbers, key=lambda n: (-trials[n].values[0], trials[n].values[1]))
        numbers = numbers[: tuning.heldout_max_trials]
    settings: list[tuple[str, int | None, dict[str, int]]] = [
        (label, n, {k: int(v) for k, v in trials[n].params.items()}) for n in numbers
    ]
    if tuning.heldout == "best_and_base":
        base = job.base_parameters
        if all({**base, **params} != base for _, _, params in settings):
            settings.append(("base", None, base))
    outcomes: dict[int, QuestionOutcomes] = {}
    for label, number, parameters in settings:
        run.budget.check()
        policy = job.base_policy.with_parameters(**parameters)
        run_dir = run.study_dir.heldout_dir(policy.parameters())
        title = f"held-out {parameter_slug(parameters)}"
        report = run_evaluation(
            job.heldout,
            policy,
            run.lms,
            run_dir,
            job.episode,
            progress=run.tracker.evaluation_sink(
                "heldout", run.progress.evaluation_started(title), label=title
            ),
            upper_bound=run.upper_bound,
        )
        summary = report.summary
        found = outcomes_from_users(report.users, upper_bound=run.upper_bound)
        outcomes[len(run.heldout)] = found
        record = HeldoutRecord(
            label=label,
            trial=number,
            parameters=parameters,
            score=objective_value(summary, tuning.objective),
            objective_used=objective_used(summary, tuning.objective),
            metrics=summary.flat_metrics(),
            run_dir=run.study_dir.relative(run_dir),
            estimate=estimate(found) if found.questions else None,
        )
        run.heldout.append(record)
        run.progress.heldout_finished(record)
    _compare_with_base(run, outcomes)


def _compare_with_base(run: StudyRun, outcomes: dict[int, QuestionOutcomes]) -> None:
    """Each chosen setting against the base parameters on the same held-out questions: the
    test of whether tuning helped, with its interval (not two point scores)."""
    base = next((i for i, r in enumerate(run.heldout) if r.label == "base"), None)
    if base is None or base not in outcomes or not outcomes[base].questions:
        return
    for index, record in enumerate(run.heldout):
        if index == base or index not in outcomes or not outcomes[index].questions:
            continue
        comparison = compare(outcomes[index], outcomes[base])
        run.heldout[index] = record.model_copy(update={"against_base": comparison})


def record_heldout_choice(run: StudyRun) -> None:
    """The chosen trial(s) and their held-out results on the study, once it is complete."""
    numbers = best_trial_numbers(run.study)
    if numbers and run.finished() >= run.job.trials:
        record_choice(run.study, numbers, run.heldout)
