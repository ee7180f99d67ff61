"""The LLM synthesis pipeline: persona -> validated `EnvironmentItem`, one user at a time.

Stages follow the paper (and the original code's order): profile, questions, schema
refinement, initial state, per-period state updates and life events
(`evolve.simulator.synthesis.stages`), personalized answers checked by a classifier
(`answers`), and opening queries checked by a classifier (`queries`). Each stage's output is
validated; a synthesis step is retried with the problems fed back, a classifier check leads
to bounded refinement (`calls`). A user still failing after its budget is excluded and
reported with the stage and the reason (the original code skipped such users silently).

Every finished unit is saved under the work directory before the next one starts, so a
crashed or interrupted run resumes where it stopped without repeating any LLM call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.core.files import atomic_write_json
from evolve.llm.usage import Usage, add_usage
from evolve.simulator.environment import (
    QA,
    AnswerChoice,
    Environment,
    EnvironmentItem,
    Period,
    Session,
    StateUpdate,
)
from evolve.simulator.synthesis import stages
from evolve.simulator.synthesis.answers import write_answers
from evolve.simulator.synthesis.calls import (
    StageCalls,
    StageFailure,
    SynthesisCancelled,
    one_line,
)
from evolve.simulator.synthesis.config import LLMSynthesisConfig
from evolve.simulator.synthesis.offline import DATE_FORMAT
from evolve.simulator.synthesis.personas import PersonaRecord, check_unique_ids
from evolve.simulator.synthesis.queries import write_queries
from evolve.simulator.synthesis.report import (
    Stage,
    SynthesisReport,
    UserOutcome,
)
from evolve.simulator.synthesis.validate import QuestionSpec
from evolve.simulator.synthesis.work_dir import OUTCOME_FILE, UserUnitFiles, WorkDir

if TYPE_CHECKING:
    from evolve.llm import RoleLMs

# Re-exported: the stage failure and the cancellation are part of the pipeline's surface.
__all__ = [
    "ProgressCallback",
    "ProgressEvent",
    "StageFailure",
    "SynthesisCancelled",
    "SynthesisResult",
    "UserPipeline",
    "synthesize_environment_llm",
]


@dataclass(frozen=True)
class ProgressEvent:
    user_id: str
    unit: str
    status: str  # "done", "resumed", "included" or "excluded"
    detail: str = ""


ProgressCallback = Callable[[ProgressEvent], None]


@dataclass
class SynthesisResult:
    environment: Environment
    report: SynthesisReport


class UserPipeline:
    """Generates one user: its stages run in order, each finished unit saved (or resumed);
    every LLM call goes through `self.calls` (usage, seeds, cancellation)."""

    def __init__(
        self,
        config: LLMSynthesisConfig,
        lms: RoleLMs,
        persona: PersonaRecord,
        *,
        seed: int,
        files: UserUnitFiles,
        on_progress: ProgressCallback | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.config = config
        self.persona = persona
        self.files = files
        self.on_progress = on_progress or (lambda event: None)
        self.calls = StageCalls(
            config, lms, user_id=persona.user_id, seed=seed, stop=stop or threading.Event()
        )
        self.usage_total: dict[str, Usage] = {}
        self.usage_this_run: dict[str, Usage] = {}
        self.resumed_units: list[str] = []
        self.refinements: dict[str, int] = {}

    # --- plumbing ------------------------------------------------------------------------

    def _flush_pending(self) -> dict[str, Usage]:
        pending = self.calls.take_pending()
        add_usage(self.usage_total, pending)
        add_usage(self.usage_this_run, pending)
        return pending

    def _unit(self, unit: str, compute: Callable[[], Any]) -> Any:
        """A unit's output: loaded when a previous run finished it, else computed and saved."""
        stored = self.files.load(unit)
        if stored is not None:
            self.resumed_units.append(unit)
            add_usage(
                self.usage_total,
                {stage: Usage.model_validate(u) for stage, u in stored["usage"].items()},
            )
            if stored.get("refinements"):
                self.refinements[unit] = stored["refinements"]
            self.on_progress(ProgressEvent(self.persona.user_id, unit, "resumed"))
            return stored["output"]
        self.calls.pending_refinements = 0
        output = compute()
        usage = self._flush_pending()
        record: dict[str, Any] = {
            "unit": unit,
            "output": output,
            "usage": {stage: u.model_dump() for stage, u in usage.items()},
        }
        if self.calls.pending_refinements:
            record["refinements"] = self.calls.pending_refinements
            self.refinements[unit] = self.calls.pending_refinements
        self.files.save(unit, record)
        self.on_progress(ProgressEvent(self.persona.user_id, unit, "done"))
        return output

    # --- the run -------------------------------------------------------------------------

    def run(self) -> tuple[UserOutcome, EnvironmentItem | None]:
        self.files.check_persona(self.persona.model_dump(mode="json"))
        stored_outcome = self.files.load(OUTCOME_FILE)
        if stored_outcome is not None:
            outcome = UserOutcome.model_validate(stored_outcome)
            outcome.usage_this_run = {}
            self.on_progress(
                ProgressEvent(
                    self.persona.user_id, outcome.unit or "", "excluded", outcome.reason or ""
                )
            )
            return outcome, None
        try:
            item = self._run_stages()
        except StageFailure as failure:
            self._flush_pending()
            if self.calls.pending_refinements:
                self.refinements[failure.unit] = self.calls.pending_refinements
            outcome = self._outcome("excluded", failure.stage, failure.unit, failure.reason)
            self.files.save(OUTCOME_FILE, outcome.model_dump(mode="json"))
            self.on_progress(
                ProgressEvent(self.persona.user_id, failure.unit, "excluded", failure.reason)
            )
            return outcome, None
        self.on_progress(ProgressEvent(self.persona.user_id, "item", "included"))
        return self._outcome("included"), item

    def _outcome(
        self,
        status: str,
        stage: Stage | None = None,
        unit: str | None = None,
        reason: str | None = None,
    ) -> UserOutcome:
        return UserOutcome(
            user_id=self.persona.user_id,
            status=status,  # type: ignore[arg-type]
            stage=stage,
            unit=unit,
            reason=reason,
            usage=dict(self.usage_total),
            usage_this_run=dict(self.usage_this_run),
            resumed_units=list(self.resumed_units),
            refinements=dict(self.refinements),
        )

    def _run_stages(self) -> EnvironmentItem:
        config = self.config
        calls = self.calls
        profile = self._unit("profile", partial(stages.write_profile, calls, self.persona))
        calls.profile_text = profile["formatted_str"][: config.profile_chars]
        questions = [
            QuestionSpec.model_validate(q)
            for q in self._unit("questions", partial(stages.draft_questions, calls))
        ]
        refined = self._unit("schema", partial(stages.group_schema, calls, questions))
        schema: dict[str, list[str]] = refined["schema"]
        questions = [QuestionSpec.model_validate(q) for q in refined["questions"]]
        initial = self._unit("initial_state", partial(stages.pick_initial_state, calls, schema))

        states = [initial]
        updates: list[dict[str, Any]] = [{}]
        events: list[list[dict[str, Any]]] = [[]]
        counts = dict.fromkeys(schema, 0)
        cumulative_counts = [dict(counts)]
        for period in range(1, config.num_periods + 1):
            previous = states[-1]
            update = self._unit(
                f"updates_p{period:02d}",
                partial(stages.update_state, calls, period, schema, previous, counts, updates),
            )
            changed = update["changes"]
            for var in changed:
                counts[var] += 1
            state = {**previous, **changed}
            period_events = self._unit(
                f"events_p{period:02d}",
                partial(stages.narrate_events, calls, period, update, previous, state),
            )
            states.append(state)
            updates.append(update)
            events.append(period_events)
            cumulative_counts.append(dict(counts))

        qas = [
            self._unit(
                f"answers_q{index:02d}", partial(write_answers, calls, index, question, states)
            )
            for index, question in enumerate(questions)
        ]
        sessions = [
            self._unit(
                f"queries_p{period:02d}",
                partial(write_queries, calls, period, schema, states, updates, events),
            )
            for period in range(config.num_periods + 1)
        ]
        return _assemble(
            config,
            self.persona.user_id,
            profile,
            schema,
            questions,
            states,
            updates,
            cumulative_counts,
            qas,
            sessions,
        )


def _assemble(
    config: LLMSynthesisConfig,
    user_id: str,
    profile: dict[str, Any],
    schema: dict[str, list[str]],
    questions: list[QuestionSpec],
    states: list[dict[str, str]],
    updates: list[dict[str, Any]],
    cumulative_counts: list[dict[str, int]],
    qas: list[dict[str, Any]],
    sessions: list[dict[str, Any]],
) -> EnvironmentItem:
    periods = []
    for index, state in enumerate(states):
        update = updates[index]
        if index == 0:
            period_updates = {var: StateUpdate(old=None, new=state[var]) for var in schema}
            start, end, summary = None, config.start_date.strftime(DATE_FORMAT), None
        else:
            period_updates = {
                var: StateUpdate(old=update["old"][var], new=new)
                for var, new in update["changes"].items()
            }
            start, end = update["period_start"], update["period_end"]
            summary = update["period_summary"]
        periods.append(
            Period(
                period_start=start,
                period_end=end,
                period_summary=summary,
                sessions=[Session(**session) for session in sessions[index]["sessions"]],
                state=dict(state),
                updates=period_updates,
                update_cnts=dict(cumulative_counts[index]),
            )
        )
    item = EnvironmentItem(
        id=user_id,
        start_time=config.start_date.strftime(DATE_FORMAT),
        user_profile=profile,
        state_schema=schema,
        periods=periods,
        qas=[
            QA(
                query=qa["query"],
                required_info=list(qa["required_info"]),
                answer_choices=[AnswerChoice(**choice) for choice in qa["answer_choices"]],
            )
            for qa in qas
        ],
    )
    problems = item.problems()
    if problems:
        raise StageFailure(Stage.ASSEMBLE, "item", one_line("; ".join(problems[:3]), 400))
    return item


def synthesize_environment_llm(
    config: LLMSynthesisConfig,
    lms: RoleLMs,
    personas: Sequence[PersonaRecord],
    *,
    seed: int,
    work_dir: str | Path,
    on_progress: ProgressCallback | None = None,
) -> SynthesisResult:
    """Generate one user per persona (concurrently, `config.workers`), resuming finished work.

    Excluded users are in the report, never in the environment. Any other error (an endpoint
    down, an interrupt) stops every worker at its next call and propagates; finished units
    stay saved, so rerunning resumes.
    """
    check_unique_ids(personas)
    model = str(getattr(lms.simulator, "model", type(lms.simulator).__name__))
    payload = config.synthesis_payload(seed, model)
    key = config.synthesis_key(seed, model)
    work = WorkDir(work_dir, key, payload)
    stop = threading.Event()
    results: dict[int, tuple[UserOutcome, EnvironmentItem | None]] = {}

    def run_user(index: int) -> tuple[UserOutcome, EnvironmentItem | None]:
        persona = personas[index]
        pipeline = UserPipeline(
            config, lms, persona, seed=seed, files=work.user(persona.user_id),
            on_progress=on_progress, stop=stop,
        )  # fmt: skip
        return pipeline.run()

    workers = max(1, min(config.workers, len(personas)))
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="synthesize")
    futures = {pool.submit(run_user, index): index for index in range(len(personas))}
    try:
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        errors = [future.exception() for future in done if future.exception() is not None]
        if errors:
            stop.set()
            for future in futures:
                future.cancel()
            wait(futures)
            # The cause, not the cancellations it triggered in the other workers.
            errors.sort(key=lambda error: isinstance(error, SynthesisCancelled))
            raise errors[0]  # type: ignore[misc]
        for future, index in futures.items():
            results[index] = future.result()
    except BaseException:
        stop.set()
        for future in futures:
            future.cancel()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

    ordered = [results[index] for index in range(len(personas))]
    environment = Environment(items=[item for _, item in ordered if item is not None])
    report = SynthesisReport(
        work_key=key,
        seed=seed,
        simulator_model=model,
        lang=config.lang,
        prices=config.prices,
        users=[outcome for outcome, _ in ordered],
    )
    atomic_write_json(
        work.directory / "report.json",
        report.model_dump(mode="json"),
        indent=1,
        final_newline=False,
    )
    return SynthesisResult(environment=environment, report=report)
