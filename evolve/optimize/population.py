"""The population schedule on GEPA: `run_gepa` drives the generations over the
`AMemGymAdapter` with the operators the spec names, one iteration at a time; after each,
`GepaRecords` turns GEPA's outcome into our frozen records; held-out users score each new
best (between iterations) or, with `heldout = "final"`, the base and the final best.

What GEPA does here: parent selection, component selection, minibatch acceptance, merge,
the metric-call budget and run_dir checkpoints. What stays ours and why: records and MLflow
lineage (GEPA keeps no operator, seed or held-out score per candidate), the budget over LLM
calls/tokens/wall time (a GEPA stop callback) and the interrupt event (GEPA knows neither).
"""

from __future__ import annotations

from evolve.optimize.context import EvolutionContext, Schedule
from evolve.optimize.experiment_dir import HELDOUT_STAGE
from evolve.optimize.gepa_adapter import AMemGymAdapter, seed_candidate
from evolve.optimize.gepa_engine import GepaSettings, budget_stop, run_gepa
from evolve.optimize.gepa_records import GepaRecords
from evolve.optimize.operator_set import build_operators
from evolve.optimize.parameters import ParameterProposer, RandomStepProposer
from evolve.results.budget import BudgetExhausted
from evolve.results.records import CandidateRecord
from evolve.simulator.environment import Environment
from evolve.spec.config import ExperimentSpec

# Under runs/<experiment>/: GEPA's run_dir (state, resumable) and the runner directories of
# every (candidate, user) evaluation, keyed by the candidate's fingerprint.
GEPA_DIR = "gepa"
EVALUATIONS_DIR = "evaluations"


def default_proposer(spec: ExperimentSpec) -> ParameterProposer:
    """The parameter proposer the spec asks for (`optimizer.parameter_proposer`)."""
    if spec.optimizer.parameter_proposer == "optuna":
        # Imported here: evolve.tuning builds on this module (Budget, objective_value).
        from evolve.tuning.evolution import OptunaParameterProposer

        return OptunaParameterProposer(spec.optimizer.parameters, seed=spec.seed)
    return RandomStepProposer()


class PopulationSchedule(Schedule):
    """GEPA generations over the train users; our records synced from GEPA's state."""

    name = "population"

    def run(self, context: EvolutionContext) -> None:
        optimizer = context.optimizer
        base = context.base()
        base_policy = context.policy(base)
        train = [item.id for item in context.resolved.train.items]
        validation = [item.id for item in context.resolved.validation.items]
        heldout = [item.id for item in context.resolved.heldout.items]
        adapter = AMemGymAdapter(
            base_policy=base_policy,
            environment=Environment(items=context.resolved.evaluated_items()),
            lms=context.lms,
            episode=context.resolved.episode,
            work_dir=context.experiment_dir.root / EVALUATIONS_DIR,
            operators=build_operators(context, base_policy),
            objective=optimizer.objective,
            feedback=optimizer.feedback,
            max_feedback_failures=optimizer.max_feedback_failures,
            max_feedback_chars=optimizer.max_feedback_chars,
            upper_bound=context.upper_bound,
            seed=context.spec.seed,
            stop=context.stop,
            validation_users=validation,
        )
        # GEPA's own evaluations (before a candidate has a record): the bars and the
        # progress lines of a log follow them too, and the tracker records their traces.
        adapter.progress_for = lambda split, fingerprint: context.tracker.evaluation_sink(
            split,
            context.progress.unrecorded_evaluation_started(f"{split} {fingerprint[:8]}"),
            fingerprint=fingerprint,
        )
        # feedback = "none": no reflective mutation (the unevolved-instructions control).
        texts = optimizer.mutate_components if optimizer.reflective_enabled() else []
        start = seed_candidate(base_policy, texts, optimizer.tunable_parameters())
        if not start:
            self._evaluate_base_only(context, base)
            return
        generations = optimizer.generations
        valset = validation or train
        minibatch = min(optimizer.reflection_minibatch_size, len(train))
        settings = GepaSettings(
            candidate_selection=optimizer.candidate_selection,
            use_merge=optimizer.use_merge,
            reflection_minibatch_size=optimizer.reflection_minibatch_size,
            acceptance=optimizer.acceptance,
            module_selector=optimizer.module_selector,
            # Enough user evaluations for every generation: parent and child on a minibatch,
            # an accepted child on all train users (finished ones are read back, not replayed).
            max_metric_calls=optimizer.max_metric_calls
            or len(valset) + generations * (2 * minibatch + len(valset)),
            max_generations=generations,
        )
        every_generation = optimizer.heldout == "every_generation"
        context.progress.generation_started(0, generations)
        records = GepaRecords(context, adapter)
        outcome = run_gepa(
            adapter,
            train_users=train,
            validation_users=validation,
            heldout_users=heldout if every_generation else [],
            seed_candidate=start,
            settings=settings,
            run_dir=context.experiment_dir.root / GEPA_DIR,
            seed=context.spec.seed,
            stop_when=budget_stop(context.budget, context.stop),
            spent=context.budget.spent,
            before_iteration=lambda iteration: context.progress.generation_started(
                iteration, generations
            ),
            after_iteration=records.sync,
        )
        if not every_generation and heldout:
            records.final_heldout = {0, outcome.best_by_score()}
            with context.experiment_dir.spend_stage(HELDOUT_STAGE, context.budget.spent):
                records.sync(outcome)
        if context.budget.exhausted() is not None:
            raise BudgetExhausted(context.budget.exhausted() or "budget exhausted")

    def _evaluate_base_only(self, context: EvolutionContext, base: CandidateRecord) -> None:
        """Nothing may mutate (feedback = "none" and no numeric parameter): GEPA needs at
        least one component, so the base is scored directly, as generation 0."""
        context.progress.generation_started(0, 0)
        base = context.evaluate(base, "train")
        if context.resolved.heldout.items:
            base = context.evaluate(base, "heldout")
        assert base.train is not None
        spent = [s for s in (base.train, base.heldout) if s is not None]
        context.store_generation(
            generation=0,
            candidate_ids=[base.id],
            evaluated_ids=[base.id],
            population=[base.id],
            best_id=base.id,
            best_train_score=base.train.score,
            mean_train_score=base.train.score,
            best_heldout_score=base.heldout.score if base.heldout is not None else None,
            llm_calls=sum(s.summary.llm_calls for s in spent),
            tokens=sum(s.summary.tokens for s in spent),
        )
