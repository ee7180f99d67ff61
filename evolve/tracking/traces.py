"""The traces of an experiment's evaluations (`[tracking] traces`): the episode tracers
handed to the runner, closed when their candidate is logged, and GEPA's traces (recorded by
a policy's fingerprint before its candidate exists) tagged and linked to the candidate's run
once they are written. The spans themselves: `evolve.tracking.tracing`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from evolve.tracking.tags import TAG_CANDIDATE

if TYPE_CHECKING:
    from evolve.simulator.evaluation import ProgressSink

FINGERPRINT_TAG = "evolve.fingerprint"


class TraceBook:
    """The open episode tracers of one invocation and the traces waiting for their run."""

    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self._tracers: list[Any] = []  # EpisodeTracers not yet closed
        # (trace ids, candidate id, run id) of GEPA's traces, tagged once they are written.
        self._adopted: list[tuple[list[str], str, str]] = []
        self._traced = False  # a tracer was handed out in this invocation
        # candidate id -> its reflection traces, linked once its run exists (`link`).
        self._waiting: dict[str, list[str]] = {}

    def start_reflections(self) -> None:
        """Collect the reflector's calls from now on (earlier ones belong to no proposal of
        this invocation: dropped)."""
        from evolve.tracking.tracing import collect_llm_calls, take_reflection_calls

        collect_llm_calls()
        take_reflection_calls()

    def reflection(self, candidate_id: str, *, experiment_id: str, tags: dict[str, str]) -> None:
        """The reflector calls made since the last proposal, as the trace `reflection
        <candidate>` (proposals are made and reported one at a time)."""
        from evolve.tracking.tracing import record_calls_trace, take_reflection_calls

        calls = take_reflection_calls()
        trace_id = record_calls_trace(
            f"reflection {candidate_id}",
            calls,
            experiment_id=experiment_id,
            tags={**tags, TAG_CANDIDATE: candidate_id},
        )
        if trace_id is not None:
            self._traced = True
            self._waiting.setdefault(candidate_id, []).append(trace_id)

    def link(self, candidate_id: str, run_id: str) -> None:
        """Link the candidate's reflection traces to its run (once they are written)."""
        trace_ids = self._waiting.pop(candidate_id, [])
        if trace_ids:
            self._adopted.append((trace_ids, candidate_id, run_id))

    def sink(
        self,
        inner: ProgressSink | None,
        *,
        experiment_id: str,
        tags: dict[str, str],
        source_run_id: str | None,
    ) -> ProgressSink:
        """A progress sink that forwards to `inner` and records one trace per episode."""
        from evolve.tracking.tracing import EpisodeTracer

        tracer = EpisodeTracer(
            inner,
            tracking_uri=self.tracking_uri,
            experiment_id=experiment_id,
            tags=tags,
            source_run_id=source_run_id,
        )
        self._tracers.append(tracer)
        self._traced = True
        return tracer

    def adopt(self, candidate_id: str, fingerprint: str, run_id: str) -> None:
        """Traces recorded by `fingerprint` before the candidate existed: closed, and
        tagged with the candidate and linked to its run once written (`write`)."""
        adopted = [t for t in self._tracers if t.tags.get(FINGERPRINT_TAG) == fingerprint]
        self._tracers = [t for t in self._tracers if t not in adopted]
        trace_ids = []
        for tracer in adopted:
            tracer.close()
            trace_ids += tracer.trace_ids
        if trace_ids:
            self._adopted.append((trace_ids, candidate_id, run_id))

    def close(self, candidate_id: str | None = None) -> None:
        """Close the tracers of `candidate_id` (all when None): their traces are written."""
        keep = []
        for tracer in self._tracers:
            if candidate_id is None or tracer.tags.get(TAG_CANDIDATE) == candidate_id:
                tracer.close()
            else:
                keep.append(tracer)
        self._tracers = keep

    def write(self, client: Any) -> None:
        """Close every tracer, wait for the traces to be written (once: it costs a second),
        then tag and link the adopted ones."""
        if not self._traced:
            return
        from evolve.tracking.tracing import flush_traces

        self.close()
        flush_traces()
        for trace_ids, candidate_id, run_id in self._adopted:
            for trace_id in trace_ids:
                client.set_trace_tag(trace_id, TAG_CANDIDATE, candidate_id)
            client.link_traces_to_run(trace_ids, run_id)
        self._adopted = []
