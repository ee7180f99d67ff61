"""MLflow traces of evaluations (`[tracking] traces`): one trace per user episode with its
periods, sessions, memory checkpoints and questions, linked to the candidate's run, opened
through the runner's progress callbacks; and no trace holds a key or a credentialed URL."""

from __future__ import annotations

from pathlib import Path

import pytest
from optimize.evolve_helpers import World, write_spec
from scripted_lm import ScriptedLM

from evolve.llm import EndpointConfig, RoleLMs
from evolve.optimize import evolve_policy
from evolve.simulator.evaluation import ProgressSink
from evolve.spec.config import load_spec
from evolve.tracking import MLflowTracker, mlflow_client
from evolve.tracking.tracing import EpisodeTracer, traces_wanted

SECRET = "sk-test-TRACESECRET-0123456789abcdef"
CREDENTIALED_URL = "https://alice:TRACEPASSWORD@llm.example.com/v1"


def _secret_world(monkeypatch) -> World:
    """LMs holding what a DSPy LM can hold: the key and an `api_base` with a user and
    password in its kwargs (the spec refuses such a URL, a hand-made dspy.LM does not)."""
    monkeypatch.setenv("EVOLVE_TEST_TRACE_KEY", SECRET)
    endpoint = EndpointConfig(
        model="gpt-4.1-mini",
        base_url="https://llm.example.com/v1",
        api_key_env="EVOLVE_TEST_TRACE_KEY",
    )
    world = World()
    for lm in (world.agent, world.simulator, world.reflector):
        lm.kwargs.update(api_key=SECRET, api_base=CREDENTIALED_URL)
    world.lms = RoleLMs.from_lms(
        simulator=world.simulator,
        agent=world.agent,
        reflector=world.reflector,
        endpoints={"agent": endpoint.describe()},
    )
    return world


def _run(tmp_path: Path, world: World, traces: str):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    spec_path = write_spec(
        tmp_path, tracking=f'experiment_name = "traces-{traces}"\ntraces = "{traces}"'
    )
    spec = load_spec(spec_path)
    tracker = MLflowTracker(uri, spec.mlflow_experiment_name())
    result = evolve_policy(
        spec, world.lms, runs_dir=tmp_path / "runs", tracker=tracker, upper_bound_cache=tmp_path
    )
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name(f"traces-{traces}")
    traces = client.search_traces(locations=[experiment.experiment_id], max_results=500)
    return result, client, experiment, traces


@pytest.fixture(scope="module")
def traced_all(tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    try:
        tmp_path = tmp_path_factory.mktemp("traces")
        yield tmp_path, *_run(tmp_path, _secret_world(monkeypatch), "all")
    finally:
        monkeypatch.undo()


def test_each_user_episode_is_a_trace_of_periods_sessions_memory_and_questions(traced_all):
    _, result, client, experiment, all_traces = traced_all
    assert all_traces, "traces = 'all' recorded no trace"
    splits = {t.info.tags.get("evolve.split") for t in all_traces}
    assert splits == {"train", "heldout", "reflection"}
    traces = [t for t in all_traces if t.info.tags["evolve.split"] != "reflection"]
    for trace in traces:
        spans = trace.data.spans
        root = next(s for s in spans if s.parent_id is None)
        user = trace.info.tags["evolve.user"]
        assert root.name == f"episode {user}"
        periods = [s for s in spans if s.parent_id == root.span_id]
        assert periods and all(s.name.startswith("period ") for s in periods)
        inside = [s for s in spans if s.parent_id == periods[0].span_id]
        names = [s.name for s in inside]
        assert "memory checkpoint" in names
        assert any(n.startswith("session ") for n in names)
        assert any(n.startswith("question ") for n in names)
        session = next(s for s in inside if s.name.startswith("session "))
        assert session.outputs["messages"][0]["content"].startswith("[Current Time:")
        question = next(s for s in inside if s.name.startswith("question "))
        assert set(question.outputs) >= {"raw_answer", "chosen", "gold", "correct"}
    # Held-out traces name their candidate and link to its run.
    runs = {
        r.data.tags["evolve.candidate_id"]: r.info.run_id
        for r in client.search_runs([experiment.experiment_id], max_results=500)
        if "evolve.candidate_id" in r.data.tags
    }
    heldout = [t for t in traces if t.info.tags.get("evolve.split") == "heldout"]
    assert heldout
    for trace in heldout:
        candidate = trace.info.tags["evolve.candidate_id"]
        assert result.candidate(candidate).heldout is not None
        linked = client.search_traces(
            locations=[experiment.experiment_id], run_id=runs[candidate], max_results=500
        )
        assert trace.info.trace_id in {t.info.trace_id for t in linked}


def test_every_llm_call_sits_in_the_step_that_made_it_with_tokens_and_time(traced_all):
    _, _, _, _, traces = traced_all
    calls = []
    in_questions = writes = 0
    for trace in traces:
        if trace.info.tags["evolve.split"] == "reflection":
            continue
        spans = trace.data.spans
        by_id = {s.span_id: s for s in spans}

        def ancestors(span, by_id=by_id):
            while span.parent_id is not None:
                span = by_id[span.parent_id]
                yield span

        for span in spans:
            if not span.name.startswith("llm "):
                continue
            chain = list(ancestors(span))
            period = next(s for s in chain if s.name.startswith("period "))  # its own period
            assert period.start_time_ns <= span.start_time_ns < span.end_time_ns
            assert span.end_time_ns <= period.end_time_ns
            # Inside a step of the period (a session, question or probe), which spans it.
            step = chain[chain.index(period) - 1]
            assert step.name.split(" ")[0] in ("session", "question", "probe"), step.name
            assert step.start_time_ns <= span.start_time_ns and span.end_time_ns <= step.end_time_ns
            if step.name.startswith("session ") and chain[0] is not step:
                writes += chain[0].name == "write"  # a write inside its session
            if step.name.startswith("question "):
                in_questions += 1
                # A policy's predictor made it: the step holds the predictor, which holds it.
                assert chain[0].name == "use" and chain[1] is step
            role = span.attributes["role"]
            assert span.name == f"llm {role}" and span.span_type == "CHAT_MODEL"
            assert span.inputs["messages"] and span.outputs["completions"]
            usage = span.attributes["mlflow.chat.tokenUsage"]  # MLflow's own key
            assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
            assert {"latency_s", "cached"} <= set(span.attributes)
            calls.append((role, span.inputs["messages"][-1]["content"]))
        # The trace's output carries each period's accuracy, as the period spans say.
        root = next(s for s in spans if s.parent_id is None)
        periods = {
            s.name.split(" ")[1]: s.outputs["accuracy"]
            for s in spans
            if s.name.startswith("period ")
        }
        assert root.outputs["accuracy_per_period"] == periods
        # MLflow sums the spans' token usage into the trace's (the Tokens column).
        assert trace.info.token_usage is not None
    # This world's sessions are one round (the scripted user never speaks): agent calls.
    assert {role for role, _ in calls} == {"agent"}
    # The questions' calls (answered on the runner's question threads) are in their spans.
    assert in_questions and any("options" in str(text).lower() for _, text in calls)
    assert writes  # each write of the policy is a span holding its LLM call


def test_each_proposal_is_a_trace_of_its_reflector_calls_linked_to_its_run(traced_all):
    _, result, client, experiment, traces = traced_all
    reflections = {
        t.info.tags["evolve.candidate_id"]: t
        for t in traces
        if next(s for s in t.data.spans if s.parent_id is None).name.startswith("reflection ")
    }
    proposed = [r for r in result.candidates if r.reflection_calls]
    assert proposed and sorted(reflections) == sorted(r.id for r in proposed)
    runs = {
        r.data.tags["evolve.candidate_id"]: r.info.run_id
        for r in client.search_runs([experiment.experiment_id], max_results=500)
        if "evolve.candidate_id" in r.data.tags
    }
    for record in proposed:
        trace = reflections[record.id]
        calls = [s for s in trace.data.spans if s.name.startswith("llm ")]
        assert len(calls) == record.reflection_calls
        assert {s.attributes["role"] for s in calls} == {"reflector"}
        linked = client.search_traces(
            locations=[experiment.experiment_id], run_id=runs[record.id], max_results=500
        )
        assert trace.info.trace_id in {t.info.trace_id for t in linked}


def test_no_trace_holds_a_key_or_a_credentialed_url(traced_all):
    tmp_path, _, _, _, traces = traced_all
    assert traces
    for trace in traces:
        text = trace.to_json()
        for secret in (SECRET, "TRACESECRET", "TRACEPASSWORD", "alice:"):
            assert secret not in text, f"{secret!r} in trace {trace.info.trace_id}"
    # And nowhere in the store (trace artifacts included).
    for path in (tmp_path / "mlruns").rglob("*"):
        if path.is_file():
            assert b"TRACESECRET" not in path.read_bytes(), path
            assert b"TRACEPASSWORD" not in path.read_bytes(), path


def test_heldout_mode_traces_held_out_evaluations_only(tmp_path):
    _, _, _, traces = _run(tmp_path, World(), "heldout")
    assert traces
    assert {t.info.tags["evolve.split"] for t in traces} == {"heldout"}


def test_traces_wanted_by_mode():
    assert not traces_wanted("none", "heldout")
    assert traces_wanted("heldout", "heldout") and not traces_wanted("heldout", "train")
    assert traces_wanted("all", "train") and traces_wanted("all", "heldout")


def test_the_tracer_forwards_every_event_to_the_inner_sink(tmp_path):
    events = []

    class Recorder(ProgressSink):
        def run_started(self, **kwargs):
            events.append("run_started")

        def unit_started(self, user_id, period_index):
            events.append("unit_started")

        def unit_finished(self, user_id, period_index, *, resumed):
            events.append("unit_finished")

        def llm_calls(self, total):
            events.append("llm_calls")

        def period_finished(self, period_index, summary):
            events.append("period_finished")

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow_client(uri)
    tracer = EpisodeTracer(
        Recorder(), tracking_uri=uri, experiment_id=client.create_experiment("t"), tags={}
    )
    tracer.run_started(users=1, periods=1, finished_units=0)
    tracer.unit_started("u", 0)
    tracer.llm_calls(3)
    tracer.unit_finished("u", 0, resumed=False)
    tracer.period_finished(0, None)
    tracer.close()
    expected = ["run_started", "unit_started", "llm_calls", "unit_finished", "period_finished"]
    assert events == expected


def test_scripted_lm_keeps_kwargs():
    # Guard for the secret test: the scripted LM keeps kwargs as a dspy.LM does.
    lm = ScriptedLM(lambda call: {})
    lm.kwargs["api_base"] = CREDENTIALED_URL
    assert lm.kwargs["api_base"] == CREDENTIALED_URL


def test_a_tracing_failure_never_fails_the_evaluation(tmp_path, monkeypatch, caplog):
    import mlflow

    from evolve.simulator.records import PeriodResult

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow_client(uri)
    finished = []

    class Recorder(ProgressSink):
        def unit_result(self, result):
            finished.append(result.period_index)

    tracer = EpisodeTracer(
        Recorder(), tracking_uri=uri, experiment_id=client.create_experiment("f"), tags={}
    )

    def broken(*args, **kwargs):
        raise RuntimeError("trace store unreachable")

    tracer.run_started(users=1, periods=1, finished_units=0)
    tracer.unit_started("u", 0)
    monkeypatch.setattr(mlflow, "start_span_no_context", broken)
    result = PeriodResult.model_construct(
        user_id="u", period_index=0, period_start="", period_end="", state={}, state_updates={}
    )
    tracer.unit_result(result)
    tracer.close()
    assert finished == [0]
    assert "could not record a period in its trace" in caplog.text
    assert "trace store unreachable" in caplog.text
