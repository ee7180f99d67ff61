"""MLflow traces of evaluations: one trace per user episode, so a researcher can open one
simulated conversation, the memory at each checkpoint and every answer in the Traces tab.

Opt-in with `[tracking] traces = "heldout"` (held-out evaluations only) or `"all"`. The
simulator never imports MLflow: `EpisodeTracer` is a `ProgressSink` (the runner's progress
callbacks), which the tracker hands the runner instead of the CLI's sink and which forwards
every event to that sink.

A trace: `episode <user>` (root; tags: experiment, candidate, split, user; linked to the
candidate's run; its output each period's accuracy) > `period <p>` > one span per step
(session, memory checkpoint, question, probe), each holding its LLM calls: that span tree is
`evolve.tracking.period_spans`. The runner reports a user-period once it is done.

Every LLM call is a span `llm <role>` inside the step that made it (the runner labels its
steps, `evolve.llm.call_events.step`; a policy's predictor labels its own calls, so a write
is a span `write` inside its session), with its real start and end; its tokens go under
MLflow's `mlflow.chat.tokenUsage`, which MLflow sums into the trace's token usage. The
runner's threads carry the unit being played in a context variable, so a call is filed under
its own user's period. A reflector's proposal is a trace `reflection <candidate>` of its LLM
calls, linked to the candidate's run. Other calls outside an episode (the upper bound's) are
not traced.

What goes into a trace is what the runner stores in the unit's `result.json` and those LLM
calls' messages and completions, never an LM, an endpoint or a key. Why not MLflow's DSPy
autologging: docs/mlflow.md (it copies an LM's kwargs minus five names, and makes one trace
per DSPy call instead of this structure).

Overhead: measured in docs/mlflow.md (traces).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from evolve.llm import call_events
from evolve.simulator.evaluation import ProgressSink
from evolve.tracking.period_spans import (
    llm_span,
    period_accuracy,
    record_step_spans,
    start_period_span,
)

if TYPE_CHECKING:
    from evolve.simulator.metrics import MetricSummary
    from evolve.simulator.records import PeriodResult

logger = logging.getLogger(__name__)
TRACE_MODES = ("none", "heldout", "all")
# MLflow's trace metadata key that links a trace to a run (the run page lists its traces).
SOURCE_RUN_METADATA = "mlflow.sourceRun"
# The unit the current thread plays, for a traced evaluation: (tracer, user id, period).
_CURRENT_UNIT: contextvars.ContextVar[tuple[EpisodeTracer, str, int] | None] = (
    contextvars.ContextVar("evolve_traced_unit", default=None)
)


# Reflector calls made outside any episode, waiting for the proposal they belong to.
_REFLECTIONS: list[call_events.LMCall] = []
_REFLECTIONS_LOCK = threading.Lock()
REFLECTION = "reflection"
_REFLECTIONS_MAX = 1000


def _file_call(call: call_events.LMCall) -> None:
    """An LM call made while a traced unit is played: kept for that unit's period span; a
    reflector call outside any episode: kept for its proposal's trace."""
    unit = _CURRENT_UNIT.get()
    if unit is not None:
        tracer, user_id, period = unit
        tracer.note_call(user_id, period, call)
    elif call.purpose == REFLECTION:
        with _REFLECTIONS_LOCK:
            if len(_REFLECTIONS) < _REFLECTIONS_MAX:  # nobody takes them when traces are off
                _REFLECTIONS.append(call)


def collect_llm_calls() -> None:
    """From now on, LM calls are filed for traces (episodes' periods, proposals)."""
    call_events.add_observer(_file_call)


def take_reflection_calls() -> list[call_events.LMCall]:
    """The reflector calls made since the last take (proposals are made one at a time)."""
    with _REFLECTIONS_LOCK:
        calls = list(_REFLECTIONS)
        _REFLECTIONS.clear()
    return calls


def record_calls_trace(
    name: str,
    calls: list[call_events.LMCall],
    *,
    experiment_id: str,
    tags: dict[str, str],
    source_run_id: str | None = None,
) -> str | None:
    """One trace `name` whose root spans `calls` (each an `llm <role>` span); its id, or
    None when it could not be recorded (a trace never fails the experiment)."""
    import mlflow

    if not calls:
        return None
    with _never_fails(f"record the trace {name!r}"):
        metadata = {SOURCE_RUN_METADATA: source_run_id} if source_run_id else None
        root = mlflow.start_span_no_context(
            name,
            span_type="CHAIN",
            inputs={"calls": len(calls), **tags},
            tags=tags,
            metadata=metadata,
            experiment_id=experiment_id,
            start_time_ns=min(call.started_ns for call in calls),
        )
        for call in calls:
            llm_span(root, call)
        root.end(end_time_ns=max(call.ended_ns for call in calls))
        return root.trace_id
    return None


@contextlib.contextmanager
def _never_fails(what: str) -> Iterator[None]:
    """A trace is a record of the evaluation, never a reason for it to fail."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - logged; the evaluation goes on
        logger.warning("could not %s (the evaluation goes on): %s", what, error)


def flush_traces() -> None:
    """Wait until every ended trace is in the store. It costs about a second (MLflow's
    writer polls its queue once a second), so it is called once per invocation."""
    import mlflow

    mlflow.flush_trace_async_logging()


def traces_wanted(mode: str, split: str) -> bool:
    """Whether an evaluation on `split` ("train" or "heldout") is traced under `mode`."""
    return mode == "all" or (mode == "heldout" and split == "heldout")


class EpisodeTracer(ProgressSink):
    """Forwards the runner's events to `inner` and records each user episode as a trace.

    Hooks are called from the runner's worker threads: the spans of one user are only ever
    touched by the thread playing that user, the table of open episodes is under a lock.
    """

    def __init__(
        self,
        inner: ProgressSink | None,
        *,
        tracking_uri: str,
        experiment_id: str,
        tags: dict[str, str],
        source_run_id: str | None = None,
    ) -> None:
        import mlflow

        # Traces go to the process-wide tracking URI (MLflow's tracing has no client form).
        mlflow.set_tracking_uri(tracking_uri)
        self.inner = inner or ProgressSink()
        self.experiment_id = experiment_id
        self.tags = dict(tags)
        self.source_run_id = source_run_id
        self.periods = 0
        self._lock = threading.Lock()
        self._episodes: dict[str, Any] = {}  # user id -> open root span
        self._unit_started_ns: dict[tuple[str, int], int] = {}
        self._calls: dict[tuple[str, int], list[call_events.LMCall]] = {}
        self._scores: dict[str, dict[int, float | None]] = {}  # user -> period -> accuracy
        self.trace_ids: list[str] = []
        collect_llm_calls()

    def note_call(self, user_id: str, period: int, call: call_events.LMCall) -> None:
        with self._lock:
            self._calls.setdefault((user_id, period), []).append(call)

    # ----- forwarded ------------------------------------------------------------------------

    def run_started(self, *, users: int, periods: int, finished_units: int) -> None:
        self.periods = periods
        self.inner.run_started(users=users, periods=periods, finished_units=finished_units)

    def unit_finished(self, user_id: str, period_index: int, *, resumed: bool) -> None:
        self.inner.unit_finished(user_id, period_index, resumed=resumed)

    def llm_calls(self, total: int) -> None:
        self.inner.llm_calls(total)

    def period_finished(self, period_index: int, summary: MetricSummary) -> None:
        self.inner.period_finished(period_index, summary)

    # ----- traced ---------------------------------------------------------------------------

    def unit_started(self, user_id: str, period_index: int) -> None:
        now = time.time_ns()
        with self._lock, _never_fails("start an episode trace"):
            self._unit_started_ns[(user_id, period_index)] = now
            if user_id not in self._episodes:
                self._episodes[user_id] = self._start_episode(user_id, now)
        # This thread plays the unit until its result: its LM calls are filed under it.
        _CURRENT_UNIT.set((self, user_id, period_index))
        self.inner.unit_started(user_id, period_index)

    def unit_result(self, result: PeriodResult) -> None:
        _CURRENT_UNIT.set(None)
        with _never_fails("record a period in its trace"):
            self._record_period(result)
        self.inner.unit_result(result)
        if result.period_index >= self.periods - 1:
            with _never_fails("end an episode trace"):
                self._end_episode(result.user_id)

    def _record_period(self, result: PeriodResult) -> None:
        with self._lock:
            root = self._episodes.get(result.user_id)
            started = self._unit_started_ns.pop((result.user_id, result.period_index), None)
            calls = self._calls.pop((result.user_id, result.period_index), [])
        if root is None:
            return
        end = time.time_ns()
        period = start_period_span(root, result, started or end)
        record_step_spans(period, result, calls, end)
        accuracy = period_accuracy(result)
        with self._lock:
            self._scores.setdefault(result.user_id, {})[result.period_index] = accuracy
        period.end(outputs={"accuracy": accuracy}, end_time_ns=end)

    def close(self) -> None:
        """End the episodes still open (a user with fewer periods, or a failed evaluation).
        MLflow writes ended traces in the background: `flush_traces` waits for them."""
        with self._lock:
            users = list(self._episodes)
        for user_id in users:
            with _never_fails("end an episode trace"):
                self._end_episode(user_id)

    # ----- episodes -------------------------------------------------------------------------

    def _start_episode(self, user_id: str, now: int) -> Any:
        import mlflow

        metadata = {SOURCE_RUN_METADATA: self.source_run_id} if self.source_run_id else None
        root = mlflow.start_span_no_context(
            f"episode {user_id}",
            span_type="CHAIN",
            inputs={"user": user_id, **self.tags},
            tags={**self.tags, "evolve.user": user_id},
            metadata=metadata,
            experiment_id=self.experiment_id,
            start_time_ns=now,
        )
        self.trace_ids.append(root.trace_id)
        return root

    def _end_episode(self, user_id: str) -> None:
        with self._lock:
            root = self._episodes.pop(user_id, None)
            scores = self._scores.pop(user_id, {})
        if root is not None:
            # The trace's output (the Traces table's Response column): each period's accuracy.
            root.end(
                outputs={
                    "user": user_id,
                    "accuracy_per_period": {str(p): a for p, a in sorted(scores.items())},
                }
            )
