"""The LLM synthesis pipeline: persona -> validated `EnvironmentItem`, one user at a time.

Why one long module: the stages are methods of one `UserPipeline` that share its retry,
usage, seeding and resume state; split by stage, every file would reach into that state.

Stages follow the paper (and the original code's order): profile, questions, schema
refinement, initial state, per-period state updates and life events, personalized answers
checked by a classifier, and opening queries checked by a classifier. Each stage's output is
validated; a synthesis step is retried with the problems fed back, a classifier check leads
to bounded refinement. A user still failing after its budget is excluded and reported with
the stage and the reason (the original code skipped such users silently).

Every finished unit is saved under the work directory before the next one starts, so a
crashed or interrupted run resumes where it stopped without repeating any LLM call.
Tokens are counted per call in the calling thread (`dspy.track_usage`), which attributes
them to the right user and stage even when users run concurrently.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import date
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import dspy
from dspy.utils.exceptions import AdapterParseError

from evolve.errors import ToolkitError
from evolve.files import atomic_write_json
from evolve.seeds import derive_rng, derive_seed
from evolve.simulator.environment import (
    CHOICE_EXPERIENCED,
    CHOICE_RANDOM,
    QA,
    AnswerChoice,
    Environment,
    EnvironmentItem,
    Period,
    Session,
    StateUpdate,
)
from evolve.simulator.synthesis.config import LLMSynthesisConfig
from evolve.simulator.synthesis.offline import (
    DATE_FORMAT,
    _advance,
    _groups,
    _session_times,
)
from evolve.simulator.synthesis.personas import PersonaRecord, check_unique_ids
from evolve.simulator.synthesis.report import (
    Stage,
    StageUsage,
    SynthesisReport,
    UserOutcome,
    add_usage,
)
from evolve.simulator.synthesis.signatures import (
    DraftQuestions,
    ExtractProfile,
    GroupInfoTypes,
    InferValues,
    MatchAnswer,
    NarrateEvents,
    PickInitialState,
    RefineAnswer,
    RefineQuery,
    UnifyOptions,
    UpdateState,
    WriteAnswers,
    WriteQueries,
    options_model,
    with_output_type,
)
from evolve.simulator.synthesis.store import OUTCOME_FILE, UserStore, WorkDir
from evolve.simulator.synthesis.validate import (
    QuestionSpec,
    check_changes,
    check_events,
    check_groups,
    check_profile,
    check_questions,
    check_texts,
    check_unified,
    info_type_occurrences,
    quoted_identifiers,
)

if TYPE_CHECKING:
    from evolve.llm import RoleLMs

T = TypeVar("T")

# Earlier period summaries shown to the update step: enough for continuity, bounded prompts.
_EARLIER_SUMMARIES = 3
_PROFILE_FIELDS = (
    "name",
    "age",
    "gender",
    "marital_status",
    "education_level",
    "occupation",
    "hobbies_and_interests",
    "skills_and_expertise",
    "complementary_info",
)


class StageFailure(Exception):
    """A stage's output stayed invalid after its retry budget: the user is excluded."""

    def __init__(self, stage: Stage, unit: str, reason: str) -> None:
        super().__init__(f"{stage.value} ({unit}): {reason}")
        self.stage = stage
        self.unit = unit
        self.reason = reason


class SynthesisCancelled(ToolkitError):
    """Another user's failure or an interrupt stopped the run; finished units are saved."""


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


def _one_line(text: object, limit: int = 200) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _assignment(variables: Sequence[str], values: Sequence[str]) -> str:
    return ", ".join(f"{var}={value}" for var, value in zip(variables, values, strict=True))


def _numbered(lines: Sequence[str]) -> str:
    return "\n".join(f"{index}. {line}" for index, line in enumerate(lines, 1))


def _options_text(schema: dict[str, list[str]], variables: Sequence[str] | None = None) -> str:
    names = list(schema) if variables is None else list(variables)
    return "\n".join(f"- {var}: {' | '.join(schema[var])}" for var in names)


class UserPipeline:
    """Generates one user; every LLM call goes through `_call` (usage, seeds, cancellation)."""

    def __init__(
        self,
        config: LLMSynthesisConfig,
        lms: RoleLMs,
        persona: PersonaRecord,
        *,
        seed: int,
        store: UserStore,
        on_progress: ProgressCallback | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.config = config
        self.lms = lms
        self.persona = persona
        self.seed = seed
        self.store = store
        self.on_progress = on_progress or (lambda event: None)
        self.stop = stop or threading.Event()
        self.usage_total: dict[str, StageUsage] = {}
        self.usage_this_run: dict[str, StageUsage] = {}
        self.resumed_units: list[str] = []
        self.refinements: dict[str, int] = {}
        self._pending: dict[str, StageUsage] = {}
        self._pending_refinements = 0
        self.profile_text = ""

    # --- plumbing ------------------------------------------------------------------------

    def _call(
        self, stage: Stage, signature: type[dspy.Signature], *, key: str, creative: bool, **inputs
    ) -> tuple[dspy.Prediction | None, str | None]:
        """One predictor call as the simulator; a parse failure is counted and returned."""
        if self.stop.is_set():
            raise SynthesisCancelled("synthesis stopped; rerun the command to resume")
        lm_config: dict[str, Any] = {"seed": derive_seed(self.seed, self.persona.user_id, key)}
        temperature = (
            self.config.creative_temperature if creative else self.config.precise_temperature
        )
        if temperature is not None:
            lm_config["temperature"] = temperature
        usage = self._pending.setdefault(stage.value, StageUsage())
        error: str | None = None
        prediction: dspy.Prediction | None = None
        with self.lms.context("simulator"), dspy.track_usage() as tracker:
            try:
                prediction = dspy.Predict(signature)(**inputs, config=lm_config)
            except AdapterParseError as exc:
                error = _one_line(exc)
            finally:
                usage.calls += 1
                for entries in tracker.usage_data.values():
                    usage.billed_calls += len(entries)
                    for entry in entries:
                        usage.prompt_tokens += int(
                            entry.get("prompt_tokens", entry.get("input_tokens")) or 0
                        )
                        usage.completion_tokens += int(
                            entry.get("completion_tokens", entry.get("output_tokens")) or 0
                        )
        if error is not None:
            usage.parse_failures += 1
        return prediction, error

    def _checked_stage(
        self,
        stage: Stage,
        unit: str,
        signature: type[dspy.Signature],
        check: Callable[[dspy.Prediction], tuple[T, list[str]]],
        *,
        creative: bool = False,
        **inputs: Any,
    ) -> T:
        """Call, validate, and retry with the problems fed back, up to `stage_attempts`."""
        feedback = "none"
        problems: list[str] = []
        attempts = self.config.retries.stage_attempts
        for attempt in range(attempts):
            prediction, error = self._call(
                stage, signature, key=f"{unit}/{attempt}", creative=creative,
                feedback=feedback, **inputs,
            )  # fmt: skip
            if prediction is None:
                problems = [f"the output was not valid JSON with the requested fields ({error})"]
            else:
                result, problems = check(prediction)
                if not problems:
                    return result
                self._pending[stage.value].rejected += 1
            feedback = "Fix these problems: " + "; ".join(problems[:6])
        raise StageFailure(
            stage,
            unit,
            f"still invalid after {attempts} attempt(s): "
            + _one_line("; ".join(problems[:3]), 300),
        )

    def _flush_pending(self) -> dict[str, StageUsage]:
        pending, self._pending = self._pending, {}
        add_usage(self.usage_total, pending)
        add_usage(self.usage_this_run, pending)
        return pending

    def _unit(self, unit: str, compute: Callable[[], Any]) -> Any:
        """A unit's output: loaded when a previous run finished it, else computed and saved."""
        stored = self.store.load(unit)
        if stored is not None:
            self.resumed_units.append(unit)
            add_usage(
                self.usage_total,
                {stage: StageUsage.model_validate(u) for stage, u in stored["usage"].items()},
            )
            if stored.get("refinements"):
                self.refinements[unit] = stored["refinements"]
            self.on_progress(ProgressEvent(self.persona.user_id, unit, "resumed"))
            return stored["output"]
        self._pending_refinements = 0
        output = compute()
        usage = self._flush_pending()
        record: dict[str, Any] = {
            "unit": unit,
            "output": output,
            "usage": {stage: u.model_dump() for stage, u in usage.items()},
        }
        if self._pending_refinements:
            record["refinements"] = self._pending_refinements
            self.refinements[unit] = self._pending_refinements
        self.store.save(unit, record)
        self.on_progress(ProgressEvent(self.persona.user_id, unit, "done"))
        return output

    # --- the run -------------------------------------------------------------------------

    def run(self) -> tuple[UserOutcome, EnvironmentItem | None]:
        self.store.check_persona(self.persona.model_dump(mode="json"))
        stored_outcome = self.store.load(OUTCOME_FILE)
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
            if self._pending_refinements:
                self.refinements[failure.unit] = self._pending_refinements
            outcome = self._outcome("excluded", failure.stage, failure.unit, failure.reason)
            self.store.save(OUTCOME_FILE, outcome.model_dump(mode="json"))
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
        profile = self._unit("profile", self._profile)
        self.profile_text = profile["formatted_str"][: config.profile_chars]
        questions = [
            QuestionSpec.model_validate(q) for q in self._unit("questions", self._questions)
        ]
        refined = self._unit("schema", lambda: self._schema(questions))
        schema: dict[str, list[str]] = refined["schema"]
        questions = [QuestionSpec.model_validate(q) for q in refined["questions"]]
        initial = self._unit("initial_state", lambda: self._initial_state(schema))

        states = [initial]
        updates: list[dict[str, Any]] = [{}]
        events: list[list[dict[str, Any]]] = [[]]
        counts = dict.fromkeys(schema, 0)
        cumulative_counts = [dict(counts)]
        for period in range(1, config.num_periods + 1):
            previous = states[-1]
            update = self._unit(
                f"updates_p{period:02d}",
                partial(self._update, period, schema, previous, counts, updates),
            )
            changed = update["changes"]
            for var in changed:
                counts[var] += 1
            state = {**previous, **changed}
            period_events = self._unit(
                f"events_p{period:02d}", partial(self._events, period, update, previous, state)
            )
            states.append(state)
            updates.append(update)
            events.append(period_events)
            cumulative_counts.append(dict(counts))

        qas = [
            self._unit(f"answers_q{index:02d}", partial(self._answers, index, question, states))
            for index, question in enumerate(questions)
        ]
        sessions = [
            self._unit(
                f"queries_p{period:02d}",
                partial(self._queries, period, schema, states, updates, events),
            )
            for period in range(config.num_periods + 1)
        ]
        return self._assemble(
            profile, schema, questions, states, updates, cumulative_counts, qas, sessions
        )

    # --- stages --------------------------------------------------------------------------

    def _profile(self) -> dict[str, Any]:
        persona = self.persona
        basic = "\n".join(f"{key}: {value}" for key, value in persona.facts.items())
        extra = "\n".join(f"{key}: {value}" for key, value in persona.texts.items())
        name, summary = self._checked_stage(
            Stage.PROFILE,
            "profile",
            ExtractProfile,
            lambda p: check_profile(str(p.name), str(p.summary), persona.known_name),
            basic_profile=basic or "(none)",
            extra_info=extra[: self.config.profile_chars] or "(none)",
            language=self.config.language_name,
        )
        profile: dict[str, Any] = {
            "uuid": persona.user_id,
            "name": name,
            **persona.facts,
            "complementary_info": summary,
        }
        profile["formatted_str"] = "\n".join(
            f"{key}: {profile[key]}" for key in _PROFILE_FIELDS if key in profile
        )
        return profile

    def _horizon(self) -> str:
        return f"the {self.config.total_months} months from {self.config.start_date:%Y-%m-%d}"

    def _choices_text(self) -> str:
        low, high = self.config.choices_per_state
        return str(low) if low == high else f"{low} to {high}"

    def _questions(self) -> list[dict[str, Any]]:
        config = self.config
        requirements = (
            f"Exactly {config.num_questions} questions. Each has exactly "
            f"{config.states_per_question} required_info items with {self._choices_text()} "
            "options each."
        )
        specs = self._checked_stage(
            Stage.QUESTIONS,
            "questions",
            DraftQuestions,
            lambda p: check_questions(p.questions, config),
            creative=True,
            profile=self.profile_text,
            horizon=self._horizon(),
            requirements=requirements,
            language=config.language_name,
        )
        return [spec.model_dump() for spec in specs]

    def _schema(self, questions: list[QuestionSpec]) -> dict[str, Any]:
        """Merge overlapping info types into variables and give each one option list."""
        config = self.config
        occurrences = info_type_occurrences(questions)
        listing = [f"q{i + 1}: {q.question}" for i, q in enumerate(questions)] + [
            f"- {info_type}: {' | '.join(uses[0][1])} (in "
            f"{', '.join(f'q{index + 1}' for index, _ in uses)})"
            for info_type, uses in occurrences.items()
        ]
        mapping = self._checked_stage(
            Stage.SCHEMA,
            "schema",
            GroupInfoTypes,
            lambda p: check_groups(p.variables, questions, config),
            info_types="\n".join(listing),
        )
        members: dict[str, list[str]] = {}
        for info_type in occurrences:
            members.setdefault(mapping[info_type], []).append(info_type)
        schema: dict[str, list[str]] = {}
        conflicts: dict[str, list[tuple[int, list[str]]]] = {}
        for variable, info_types in members.items():
            uses = [use for info_type in info_types for use in occurrences[info_type]]
            option_lists = {tuple(options) for _, options in uses}
            if len(option_lists) == 1:
                schema[variable] = list(uses[0][1])
            else:
                conflicts[variable] = uses
        if conflicts:
            merged = "\n".join(
                f"- {variable}: "
                + "; ".join(f"q{index + 1} options {' | '.join(opts)}" for index, opts in uses)
                for variable, uses in conflicts.items()
            )
            unified = self._checked_stage(
                Stage.SCHEMA,
                "schema_options",
                UnifyOptions,
                lambda p: check_unified(p.unified, list(conflicts), config),
                profile=self.profile_text,
                horizon=self._horizon(),
                merged="\n".join(
                    [*(f"q{i + 1}: {q.question}" for i, q in enumerate(questions)), merged]
                ),
                requirements=f"{self._choices_text()} options per variable.",
            )
            schema.update(unified)
        ordered = {variable: schema[variable] for variable in members}
        canonical = [
            QuestionSpec.model_validate(
                {
                    "question": question.question,
                    "required_info": [
                        {"info_type": mapping[t], "info_choices": ordered[mapping[t]]}
                        for t in question.info_types
                    ],
                }
            ).model_dump()
            for question in questions
        ]
        return {"schema": ordered, "questions": canonical, "mapping": mapping}

    def _initial_state(self, schema: dict[str, list[str]]) -> dict[str, str]:
        model = options_model("InitialState", schema)
        signature = with_output_type(PickInitialState, "initial_state", model)

        def check(prediction: dspy.Prediction) -> tuple[dict[str, str], list[str]]:
            state = prediction.initial_state.model_dump(by_alias=True)
            return {var: state[var] for var in schema}, []

        return self._checked_stage(
            Stage.INITIAL_STATE,
            "initial_state",
            signature,
            check,
            profile=self.profile_text,
            start_date=f"{self.config.start_date:%Y-%m-%d}",
            horizon=self._horizon(),
            variables=_options_text(schema),
        )

    def _period_dates(self, period: int) -> tuple[date, date]:
        return _advance(self.config, period - 1), _advance(self.config, period)

    def _update(
        self,
        period: int,
        schema: dict[str, list[str]],
        state: dict[str, str],
        counts: dict[str, int],
        updates: list[dict[str, Any]],
    ) -> dict[str, Any]:
        config = self.config
        start, end = self._period_dates(period)
        limit = config.max_changes_per_state
        variables = "\n".join(
            f"- {var}: now {state[var]}; options {' | '.join(values)}; changed {counts[var]} of "
            f"at most {limit} times" + (" (may not change again)" if counts[var] >= limit else "")
            for var, values in schema.items()
        )
        earlier = [
            f"period {index}: {update['period_summary']}"
            for index, update in enumerate(updates)
            if update
        ][-_EARLIER_SUMMARIES:]
        low, high = config.changes_per_period
        span = str(low) if low == high else f"between {low} and {high}"

        # The accepted prediction's summary goes with its changes.
        accepted: dict[str, str] = {}

        def check(prediction: dspy.Prediction) -> tuple[dict[str, str], list[str]]:
            changes, problems = check_changes(
                prediction.changes, schema, state, counts, config, period
            )
            summary = " ".join(str(prediction.period_summary).split())
            if not summary:
                problems.append("period_summary is empty")
            if not problems:
                accepted["summary"] = summary
            return changes, problems

        changes = self._checked_stage(
            Stage.UPDATES,
            f"updates_p{period:02d}",
            UpdateState,
            check,
            creative=True,
            profile=self.profile_text,
            period=f"{start:%Y-%m-%d} to {end:%Y-%m-%d} (period {period} of {config.num_periods})",
            variables=variables,
            earlier="\n".join(earlier) or "none",
            requirements=f"Change {span} variables.",
            language=config.language_name,
        )
        return {
            "period_start": start.strftime(DATE_FORMAT),
            "period_end": end.strftime(DATE_FORMAT),
            "period_summary": accepted["summary"],
            "changes": {var: changes[var] for var in schema if var in changes},
            "old": {var: state[var] for var in schema if var in changes},
        }

    def _events(
        self,
        period: int,
        update: dict[str, Any],
        previous: dict[str, str],
        state: dict[str, str],
    ) -> list[dict[str, Any]]:
        changed = list(update["changes"])
        unchanged = [var for var in state if var not in update["changes"]]
        events = self._checked_stage(
            Stage.EVENTS,
            f"events_p{period:02d}",
            NarrateEvents,
            lambda p: check_events(p.events, changed, unchanged),
            profile=self.profile_text,
            period=f"{update['period_start']} to {update['period_end']}: "
            f"{update['period_summary']}",
            changes="\n".join(f"- {var}: {previous[var]} -> {state[var]}" for var in changed),
            unchanged="\n".join(f"- {var}: {state[var]}" for var in unchanged) or "none",
            language=self.config.language_name,
        )
        return [{"variables": variables, "event": text} for variables, text in events]

    def _variants(
        self, index: int, question: QuestionSpec, states: list[dict[str, str]]
    ) -> tuple[list[tuple[str, ...]], set[tuple[str, ...]]]:
        """Every variant on the trajectory, padded with unseen ones, in a seeded order."""
        variables = question.info_types
        seen = list(dict.fromkeys(tuple(state[var] for var in variables) for state in states))
        rng = derive_rng("answer-variants", self.seed, self.persona.user_id, index)
        variants = list(seen)
        if len(variants) < self.config.min_state_variants:
            unseen = [
                combination
                for combination in itertools.product(
                    *(i.info_choices for i in question.required_info)
                )
                if combination not in seen
            ]
            variants += rng.sample(unseen, self.config.min_state_variants - len(variants))
        rng.shuffle(variants)
        return variants, set(seen)

    def _answers(
        self, index: int, question: QuestionSpec, states: list[dict[str, str]]
    ) -> dict[str, Any]:
        config = self.config
        unit = f"answers_q{index:02d}"
        variables = question.info_types
        variants, seen = self._variants(index, question, states)
        described = [_assignment(variables, variant) for variant in variants]
        answers = self._checked_stage(
            Stage.ANSWERS,
            unit,
            WriteAnswers,
            lambda p: check_texts(p.answers, len(variants), "answers"),
            question=question.question,
            variants=_numbered(described),
            length=config.answer_sentences,
            language=config.language_name,
        )
        for target, answer in enumerate(list(answers)):
            answers[target] = self._checked_answer(
                unit, question.question, described, target, answer
            )
        choices = [
            {
                "state": list(variant),
                "answer": answer,
                "type": CHOICE_EXPERIENCED if variant in seen else CHOICE_RANDOM,
            }
            for variant, answer in zip(variants, answers, strict=True)
        ]
        return {"query": question.question, "required_info": variables, "answer_choices": choices}

    def _match(
        self, unit: str, question: str, described: list[str], target: int, answer: str, round_: int
    ) -> tuple[bool, str]:
        """Ask the classifier which variant `answer` fits; situations in a seeded order so a
        position bias (always "1") cannot pass the check."""
        order = list(range(len(described)))
        derive_rng("match", self.seed, self.persona.user_id, unit, target, round_).shuffle(order)
        prediction, error = self._call(
            Stage.ANSWERS,
            MatchAnswer,
            key=f"{unit}/match{target}/{round_}",
            creative=False,
            question=question,
            answer=answer,
            situations=_numbered([described[i] for i in order]),
        )
        if prediction is None:
            return False, f"the classifier's output was unparseable ({error})"
        try:
            option = int(prediction.option)
        except (TypeError, ValueError):
            option = 0
        if not 1 <= option <= len(order):
            return False, f"the classifier answered {prediction.option!r}, not an option number"
        picked = order[option - 1]
        return picked == target, f"the classifier matched it to ({described[picked]})"

    def _checked_answer(
        self, unit: str, question: str, described: list[str], target: int, answer: str
    ) -> str:
        budget = self.config.retries.answer_refinements
        ok, problem = self._match(unit, question, described, target, answer, 0)
        used = 0
        while not ok:
            self._pending[Stage.ANSWERS.value].rejected += 1
            if used >= budget:
                raise StageFailure(
                    Stage.ANSWERS,
                    unit,
                    f"variant ({described[target]}): {problem} after {used} refinement(s)",
                )
            used += 1
            self._pending_refinements += 1
            prediction, error = self._call(
                Stage.ANSWERS,
                RefineAnswer,
                key=f"{unit}/refine{target}/{used}",
                creative=False,
                question=question,
                target=described[target],
                others="\n".join(d for i, d in enumerate(described) if i != target),
                answer=answer,
                problem=f"A reader thought this answer was for: {problem}",
                length=self.config.answer_sentences,
                language=self.config.language_name,
            )
            refined = str(prediction.refined_answer).strip() if prediction is not None else ""
            if not refined:
                problem = f"the refinement was unusable ({error or 'empty answer'})"
                continue  # the unchanged answer is known to fail: spend the next refinement
            answer = refined
            ok, problem = self._match(unit, question, described, target, answer, used)
        return answer

    def _session_groups(
        self,
        period: int,
        schema: dict[str, list[str]],
        events: list[list[dict[str, Any]]],
    ) -> list[tuple[list[str], str | None]]:
        if period == 0:
            rng = derive_rng("initial-sessions", self.seed, self.persona.user_id)
            groups = _groups(rng, list(schema), self.config.variables_per_initial_session)
            return [([var for var in schema if var in group], None) for group in groups]
        return [(event["variables"], event["event"]) for event in events[period]]

    def _queries(
        self,
        period: int,
        schema: dict[str, list[str]],
        states: list[dict[str, str]],
        updates: list[dict[str, Any]],
        events: list[list[dict[str, Any]]],
    ) -> dict[str, Any]:
        config = self.config
        unit = f"queries_p{period:02d}"
        state = states[period]
        groups = self._session_groups(period, schema, events)
        lines = []
        for variables, event in groups:
            if event is None:
                context = "an early conversation"
                reveal = ", ".join(f"{var} = {state[var]}" for var in variables)
            else:
                context = event
                old = updates[period]["old"]
                reveal = ", ".join(f"{var} = {state[var]} (was {old[var]})" for var in variables)
            lines.append(f"context: {context}; reveal: {reveal}")
        day = config.start_date if period == 0 else _advance(config, period)
        names = list(schema)

        def check(prediction: dspy.Prediction) -> tuple[list[str], list[str]]:
            texts, problems = check_texts(prediction.queries, len(groups), "messages")
            for number, text in enumerate(texts, 1):
                quoted = quoted_identifiers(text, names)
                if quoted:
                    problems.append(f"message {number} quotes variable names {quoted}")
            return texts, problems

        queries = self._checked_stage(
            Stage.QUERIES,
            unit,
            WriteQueries,
            check,
            profile=self.profile_text,
            date=f"{day:%Y-%m-%d}",
            sessions=_numbered(lines),
            language=config.language_name,
        )
        times = _session_times(
            derive_rng("session-times", self.seed, self.persona.user_id, period), day, len(groups)
        )
        sessions = []
        for session, ((variables, event), query) in enumerate(zip(groups, queries, strict=True)):
            exposed = {var: state[var] for var in variables}
            query = self._checked_query(unit, session, query, exposed, schema)
            sessions.append(
                {
                    "event": event,
                    "exposed_states": exposed,
                    "query": query,
                    "session_time": times[session],
                }
            )
        return {"sessions": sessions}

    def _infer(
        self, unit: str, session: int, round_: int, query: str, exposed: dict[str, str],
        schema: dict[str, list[str]],
    ) -> tuple[bool, str]:  # fmt: skip
        model = options_model("Inferred", {var: schema[var] for var in exposed})
        signature = with_output_type(InferValues, "inferred", model)
        prediction, error = self._call(
            Stage.QUERIES,
            signature,
            key=f"{unit}/infer{session}/{round_}",
            creative=False,
            message=query,
            variables=_options_text(schema, list(exposed)),
        )
        if prediction is None:
            return False, f"the classifier's output was unparseable ({error})"
        inferred = prediction.inferred.model_dump(by_alias=True)
        wrong = [
            f"{var} read as {inferred.get(var)!r} instead of {value!r}"
            for var, value in exposed.items()
            if inferred.get(var) != value
        ]
        return not wrong, "; ".join(wrong)

    def _checked_query(
        self, unit: str, session: int, query: str, exposed: dict[str, str],
        schema: dict[str, list[str]],
    ) -> str:  # fmt: skip
        budget = self.config.retries.query_refinements
        ok, problem = self._infer(unit, session, 0, query, exposed, schema)
        used = 0
        while not ok:
            self._pending[Stage.QUERIES.value].rejected += 1
            if used >= budget:
                raise StageFailure(
                    Stage.QUERIES,
                    unit,
                    f"session {session + 1}: {problem} after {used} refinement(s)",
                )
            used += 1
            self._pending_refinements += 1
            prediction, error = self._call(
                Stage.QUERIES,
                RefineQuery,
                key=f"{unit}/refine{session}/{used}",
                creative=False,
                message=query,
                reveal=_options_text(schema, list(exposed))
                + "\nintended: "
                + ", ".join(f"{var} = {value}" for var, value in exposed.items()),
                problem=problem,
                language=self.config.language_name,
            )
            refined = str(prediction.refined_query).strip() if prediction is not None else ""
            if not refined:
                problem = f"the refinement was unusable ({error or 'empty message'})"
                continue
            query = refined
            ok, problem = self._infer(unit, session, used, query, exposed, schema)
        return query

    def _assemble(
        self,
        profile: dict[str, Any],
        schema: dict[str, list[str]],
        questions: list[QuestionSpec],
        states: list[dict[str, str]],
        updates: list[dict[str, Any]],
        cumulative_counts: list[dict[str, int]],
        qas: list[dict[str, Any]],
        sessions: list[dict[str, Any]],
    ) -> EnvironmentItem:
        config = self.config
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
            id=self.persona.user_id,
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
            raise StageFailure(Stage.ASSEMBLE, "item", _one_line("; ".join(problems[:3]), 400))
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
            config, lms, persona, seed=seed, store=work.user(persona.user_id),
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
