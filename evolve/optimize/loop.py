"""The self-evolution loop: P_{k+1} = G(P_k, F_k), with a population, held-out users and lineage.

This module opens a run (its experiment directory, identity, budget, tracker and upper
bound), builds the `EvolutionContext` the schedules share (`context`), runs the schedule the
spec names and writes the experiment result. Each schedule is a class with `run(context)` in
its own module, `population` (GEPA) and `chain` (the paper's per-period chain). Two schedules:

- ``population`` (default): GEPA (`gepa.optimize`, see `gepa_engine` and `gepa_adapter`)
  evolves the base policy's mutable components (text instructions and numeric parameters).
  One GEPA iteration is one generation: GEPA selects a parent (`candidate_selection`), the
  component(s) to mutate (`module_selector`), one of our operators proposes the child
  (reflective, parameter, tuned), GEPA tries it on a minibatch of train users and keeps it
  if it is better (`acceptance`), then scores it on all train users. Each new best is
  evaluated on the held-out users (never shown to GEPA). Our frozen records (candidates with
  lineage, one generation record per iteration) are built from GEPA's state at each
  iteration's end (`gepa_records`).
- ``per_period`` (the paper's setup, AMemGym Table 3): one on-policy train run with one
  evolving chain per user: after each period, the reflector rewrites a mutable component of
  each user's policy from that user's feedback of the period, and the user's episode
  continues with the new instructions and the same memory (see `chain`). Each step is a
  candidate (generation = the period from which it is in effect); with held-out users, the
  base and the final policies (or every step) are also evaluated on them from scratch.

The reflector: the `reflector` role at `reflector_temperature`; under `protocol = "paper"`,
as in the paper, the agent's own model at temperature 0 unless `[llm.reflector]` names
another model (or `reflector_temperature` is set). Which one answered is in the run's
identity (`reflector`).

Optuna in the population schedule: `parameter_proposer = "optuna"` makes the parameter
operator ask an Optuna TPE sampler told every candidate's train score; `tune_every = N` makes
the tuned operator run a short study on the parent in every N-th generation.

What GEPA does for us: parent selection (Pareto front over train users), minibatch
acceptance, merge, the metric-call budget and its run_dir checkpoints. What stays ours: the
adapter (episodes, per-user scores, feedback), the operators, the records/MLflow lineage,
the budget over LLM calls/tokens/wall time (a GEPA stop callback) and the per-period chain.

The simulated user is never mutated: it is not part of a policy. Every unit (a candidate's
proposal, its evaluation on a split, a generation) is stored when finished and never
recomputed (`experiment_dir`); the budget is checked before each unit and at every period barrier.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evolve.llm import RoleLMs
from evolve.optimize.chain import ChainSchedule
from evolve.optimize.context import EvolutionContext, Schedule
from evolve.optimize.experiment_dir import UPPER_BOUND_STAGE, ExperimentDir
from evolve.optimize.list_edit import refuse_idle_operators
from evolve.optimize.operators import check_operators
from evolve.optimize.parameters import ParameterProposer
from evolve.optimize.population import PopulationSchedule, default_proposer
from evolve.optimize.progress import LoopProgress
from evolve.optimize.reflect import REFLECTOR_PROMPTS, Reflector
from evolve.optimize.report import format_lineage, format_table
from evolve.results.budget import Budget, BudgetExhausted
from evolve.results.comparison import heldout_comparison
from evolve.results.records import CandidateRecord, ExperimentResult, select_best
from evolve.simulator.environment import Environment
from evolve.spec.config import ExperimentSpec, ResolvedExperiment, resolve, spec_label
from evolve.tracking import ExperimentTracker, NullTracker, TrackingContext

__all__ = ["SCHEDULES", "LoopProgress", "build_reflector", "evolve_policy", "reflector_setup"]

# `optimizer.schedule` -> the class that runs it.
SCHEDULES: dict[str, type[Schedule]] = {
    schedule.name: schedule for schedule in (PopulationSchedule, ChainSchedule)
}


def evolve_policy(
    experiment: ExperimentSpec | ResolvedExperiment,
    lms: RoleLMs,
    *,
    runs_dir: str | Path = "runs",
    tracker: ExperimentTracker | None = None,
    progress: LoopProgress | None = None,
    proposer_factory: Callable[[], ParameterProposer] | None = None,
    upper_bound_cache: str | Path | None = None,
    refresh_upper_bound: bool = False,
    stop: threading.Event | None = None,
) -> ExperimentResult:
    """Run (or resume) an experiment's evolution with the LMs already open; returns its
    records. Stops cleanly on the budget.

    `evolve.api.run_experiment` (what `evolve run` runs) opens the LMs from the spec, locks
    the run directory and calls this.

    `refresh_upper_bound` asks every upper-bound question again instead of using the cache.
    `stop` (the CLI's interrupt event) makes in-flight evaluations stop at their next unit.
    """
    resolved = experiment if isinstance(experiment, ResolvedExperiment) else resolve(experiment)
    # Resolving imported the plugin modules (with the policy), so the registry is complete.
    check_operators(resolved.spec.optimizer, resolved.rules, label=spec_label(resolved.spec))
    refuse_idle_operators(resolved.spec.optimizer)
    SCHEDULES[resolved.spec.optimizer.schedule].check_spec(resolved.spec)
    run = _ExperimentRun(
        resolved,
        lms,
        experiment_dir=ExperimentDir(Path(runs_dir) / resolved.spec.name),
        tracker=tracker or NullTracker(),
        progress=progress or LoopProgress(),
        proposer_factory=proposer_factory or (lambda: default_proposer(resolved.spec)),
        upper_bound_cache=Path(upper_bound_cache) if upper_bound_cache else None,
        refresh_upper_bound=refresh_upper_bound,
        stop=stop,
    )
    return run.run()


def reflector_setup(spec: ExperimentSpec) -> tuple[str, float]:
    """(LM role, temperature) of the reflector: under the paper's protocol the agent's own
    model at temperature 0, unless the spec names a reflector model or temperature."""
    temperature = spec.optimizer.reflector_temperature
    if not spec.rules.reflector_is_agent_model:
        return "reflector", temperature
    if "reflector_temperature" not in spec.optimizer.model_fields_set:
        temperature = 0.0
    return ("reflector" if spec.llm.reflector is not None else "agent"), temperature


def build_reflector(spec: ExperimentSpec, lms: RoleLMs) -> Reflector:
    """The run's one reflector (every schedule and operator that reflects uses it)."""
    role, temperature = reflector_setup(spec)
    rules = spec.rules
    prompt = REFLECTOR_PROMPTS[rules.reflector_prompt]
    # A prompt that caps no text (the reference's) is held only to a length the spec sets.
    length_set = "max_instruction_chars" in spec.optimizer.model_fields_set
    return Reflector(
        lms,
        temperature=temperature,
        max_chars=spec.optimizer.max_instruction_chars
        if prompt.caps_length or length_set
        else None,
        role=role,
        # Proposal checks and structured edits are ours; the paper's reflector is unchecked.
        check_proposals=rules.structured_edits,
        prompt=prompt,
    )


class _ExperimentRun:
    """One invocation: open the experiment directory, start tracking, prepare the context, run the
    schedule, write the result (also when the budget stops it)."""

    def __init__(
        self,
        resolved: ResolvedExperiment,
        lms: RoleLMs,
        *,
        experiment_dir: ExperimentDir,
        tracker: ExperimentTracker,
        progress: LoopProgress,
        proposer_factory: Callable[[], ParameterProposer],
        upper_bound_cache: Path | None,
        refresh_upper_bound: bool,
        stop: threading.Event | None,
    ) -> None:
        self.resolved, self.spec, self.lms = resolved, resolved.spec, lms
        self.experiment_dir, self.tracker, self.progress = experiment_dir, tracker, progress
        self.proposer_factory = proposer_factory
        self.upper_bound_cache = upper_bound_cache
        self.refresh_upper_bound = refresh_upper_bound
        self.stop = stop
        self.reflector = build_reflector(resolved.spec, lms)
        self.schedule = SCHEDULES[resolved.spec.optimizer.schedule]()

    def run(self) -> ExperimentResult:
        model_names = self.lms.model_names()
        identity = self.resolved.identity(model_names)
        # Recorded (added only here: older runs keep their hashes).
        if self.spec.rules.reflector_is_agent_model:
            identity["reflector"] = {
                "role": self.reflector.role,
                "model": model_names.get(self.reflector.role),
                "temperature": self.reflector.temperature,
            }
        digest = self.experiment_dir.open(identity)
        records = {record.id: record for record in self.experiment_dir.load_candidates()}
        journal = self.experiment_dir.open_journal()
        budget = Budget(self.spec.budget, self.lms, self.experiment_dir.load_spend(), journal)
        self.tracker.start(
            TrackingContext(
                name=self.spec.name,
                config_hash=digest,
                spec=self.spec,
                run_dir=self.experiment_dir.root.resolve(),
                # The model that actually reflects (the agent's, under the paper's protocol).
                model_names={**model_names, "reflector": model_names[self.reflector.role]},
                environment=self.resolved.environment_description,
                train_users=[item.id for item in self.resolved.train.items],
                heldout_users=[item.id for item in self.resolved.heldout.items],
                registered_model=self.spec.registered_model_name(),
            )
        )
        stopped: str | None = None
        try:
            budget.check()
            context = EvolutionContext(
                resolved=self.resolved,
                lms=self.lms,
                experiment_dir=self.experiment_dir,
                budget=budget,
                tracker=self.tracker,
                progress=self.progress,
                reflector=self.reflector,
                proposer_factory=self.proposer_factory,
                upper_bound=self._upper_bound(budget),
                records=records,
                stop=self.stop,
            )
            self.schedule.run(context)
        except BudgetExhausted as exhausted:
            stopped = exhausted.reason
        except BaseException:
            self.tracker.fail()
            raise
        finally:
            self.experiment_dir.save_spend(budget.spent())
            budget.close()
        result = self._result(digest, stopped, records, budget)
        self.experiment_dir.save_result(result)
        self.tracker.finish(
            result,
            report=format_table(result, self.spec.rules) + "\n\n" + format_lineage(result) + "\n",
        )
        return result

    def _upper_bound(self, budget: Budget) -> Any:
        from evolve.core.paths import cache_dir
        from evolve.simulator.baselines import compute_upper_bound

        self.progress.stage("upper bound")
        # One table for train, validation and held-out users (the runner accepts a superset).
        users = Environment(items=self.resolved.evaluated_items())
        answered = itertools.count(1)  # count's next() is atomic under the GIL
        with self.experiment_dir.spend_stage(UPPER_BOUND_STAGE, budget.spent):
            upper_bound = compute_upper_bound(
                users,
                self.lms,
                self.upper_bound_cache or cache_dir() / "upper_bound",
                concurrency=self.spec.concurrency,
                on_entry=lambda _: self.progress.stage_step(UPPER_BOUND_STAGE, next(answered)),
                refresh=self.refresh_upper_bound,
                rules=self.spec.rules,
            )
        self.experiment_dir.save_spend(budget.spent())
        return upper_bound

    def _result(
        self,
        digest: str,
        stopped: str | None,
        records: dict[str, CandidateRecord],
        budget: Budget,
    ) -> ExperimentResult:
        ordered = sorted(records.values(), key=lambda r: (r.generation, r.id))
        best = select_best(ordered)
        spend = budget.spent()
        result = ExperimentResult(
            name=self.spec.name,
            config_hash=digest,
            schedule=self.spec.optimizer.schedule,
            candidates=ordered,
            generations=self.experiment_dir.load_generations(),
            best_id=best.id if best is not None else None,
            stopped=stopped,
            complete=stopped is None,
            chain_summary=self.schedule.summary,
            llm_calls=spend.requests,
            tokens=spend.tokens,
            wall_time_s=spend.wall_time_s,
            prompt_eval_s=round(spend.prompt_eval_s, 3),
            decode_s=round(spend.decode_s, 3),
            toolkit_share=self.lms.usage.snapshot().toolkit_share(),
            reflection_parse_failures=sum(r.reflection_parse_failures for r in ordered),
            max_tokens={
                "simulator": self.lms.identity("simulator").get("max_tokens"),
                "agent": self.lms.identity("agent").get("max_tokens"),
                "reflector": self.lms.identity(self.reflector.role).get("max_tokens"),
            },
            protocol=self.spec.protocol,
            stage_spend=self.experiment_dir.load_stage_spend(),
        )
        return result.model_copy(
            update={"heldout_comparison": heldout_comparison(self.experiment_dir.root, result)}
        )
