"""Concurrent candidate evaluation in the GEPA engine.

The evaluations GEPA hands over at once (`batch_evaluate`: parents, children, valset) run
together under ONE limit of LM calls in flight, `episode.concurrency`, shared by every
(candidate, user) evaluation: the server is never sent more. Results are those of a
sequential run, with the scripted LM and against the stub server.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from optimize.category_world import HELDOUT, TRAIN, world
from optimize.evolve_helpers import make_item
from stub_server import StubServer

import memory_policies
from evolve.llm import EndpointConfig, RoleLMs, build_lm
from evolve.optimize.gepa_adapter import AMemGymAdapter, seed_candidate
from evolve.optimize.gepa_engine import GepaSettings, run_gepa
from evolve.optimize.operators import build_operator
from evolve.optimize.reflect import Reflector
from evolve.simulator.environment import Environment
from evolve.simulator.evaluation import EpisodeConfig

USERS = [f"user-{i}" for i in range(3)]


def stub_lms(base_url: str) -> RoleLMs:
    endpoint = EndpointConfig(
        model="stub", base_url=base_url, api_key_env="STUB_API_KEY", cache=False, retries=0
    )
    return RoleLMs.from_lms(
        simulator=build_lm(endpoint), agent=build_lm(endpoint), reflector=build_lm(endpoint)
    )


def stub_adapter(base_url: str, work_dir: Path, concurrency: int) -> AMemGymAdapter:
    env = Environment.from_original([make_item(user) for user in USERS])
    base = memory_policies.create_policy("in_context", {"update_every": 1, "short_term_len": 0})
    return AMemGymAdapter(
        base_policy=base,
        environment=env,
        lms=stub_lms(base_url),
        episode=EpisodeConfig(concurrency=concurrency, seed=0),
        work_dir=work_dir,
        operators=[],
        objective="accuracy",
    )


def two_candidates(adapter: AMemGymAdapter) -> list[dict[str, str]]:
    seed = seed_candidate(adapter.base_policy, ["write.types_to_remember"], [])
    child = {"write.types_to_remember": seed["write.types_to_remember"] + "\n- pets"}
    return [seed, child]


@pytest.mark.parametrize("concurrency", [2, 4])
def test_one_limit_bounds_the_calls_in_flight_of_every_evaluation(tmp_path, concurrency):
    with StubServer(latency=0.05) as stub:
        adapter = stub_adapter(stub.base_url, tmp_path / "evals", concurrency)
        items = [(candidate, list(USERS)) for candidate in two_candidates(adapter)]
        batches = adapter.batch_evaluate(items)
        peak = stub.stats()["peak_in_flight"]
    assert [len(b.scores) for b in batches] == [3, 3]
    # 2 candidates x 3 users evaluated together: the limit is reached and never exceeded.
    assert peak == concurrency, f"peak in flight {peak}, limit {concurrency}"


def test_users_of_one_candidate_share_the_limit(tmp_path):
    with StubServer(latency=0.05) as stub:
        adapter = stub_adapter(stub.base_url, tmp_path / "evals", 2)
        adapter.run_users(two_candidates(adapter)[0], USERS)
        peak = stub.stats()["peak_in_flight"]
    assert peak <= 2, f"{peak} calls in flight at once with concurrency = 2"


def test_stub_results_are_those_of_a_sequential_run(tmp_path):
    runs = {}
    with StubServer(latency=0.01) as stub:
        for concurrency in (1, 4):
            adapter = stub_adapter(stub.base_url, tmp_path / f"c{concurrency}", concurrency)
            items = [(candidate, list(USERS)) for candidate in two_candidates(adapter)]
            batches = adapter.batch_evaluate(items)
            runs[concurrency] = (
                [(b.scores, b.objective_scores, b.outputs) for b in batches],
                [[p.model_dump() for u in b.trajectories for p in u.periods] for b in batches],
                adapter.lms.usage.snapshot().total_calls,
            )
    assert runs[1][0] == runs[4][0]
    assert runs[1][2] == runs[4][2]
    # The transcripts and answers match too (wall times aside).
    strip = [
        [{k: v for k, v in period.items() if "time" not in k} for period in batch]
        for batch in runs[1][1]
    ]
    assert strip == [
        [{k: v for k, v in period.items() if "time" not in k} for period in batch]
        for batch in runs[4][1]
    ]


def evolve_scripted(tmp_path: Path, concurrency: int):
    env, lms, base = world(tmp_path)
    adapter = AMemGymAdapter(
        base_policy=base,
        environment=env,
        lms=lms,
        episode=EpisodeConfig(concurrency=concurrency, seed=0),
        work_dir=tmp_path / "evals",
        operators=[
            build_operator("reflective", reflector=Reflector(lms, temperature=1.0, max_chars=2000))
        ],
        objective="accuracy",
        feedback="complete",
        seed=0,
    )
    outcome = run_gepa(
        adapter,
        train_users=TRAIN,
        heldout_users=HELDOUT,
        seed_candidate=seed_candidate(base, ["write.types_to_remember"], []),
        settings=GepaSettings(max_metric_calls=40, max_generations=3, reflection_minibatch_size=3),
        run_dir=tmp_path / "gepa",
        seed=0,
    )
    return outcome, lms.usage.snapshot()


def test_scripted_evolution_is_that_of_a_sequential_run(tmp_path):
    sequential, sequential_usage = evolve_scripted(tmp_path / "c1", 1)
    concurrent, concurrent_usage = evolve_scripted(tmp_path / "c4", 4)
    assert len(sequential.candidates) > 1  # something was evolved and compared
    assert concurrent.model_dump() == sequential.model_dump()
    assert concurrent_usage.total_calls == sequential_usage.total_calls
    assert concurrent_usage.total_tokens == sequential_usage.total_tokens


def test_seed_train_and_heldout_evaluations_run_at_once(tmp_path):
    """On a fresh start the seed's valset and held-out evaluations (both certain) overlap;
    GEPA then reads them back: no user is played twice."""
    env, lms, base = world(tmp_path)
    adapter = AMemGymAdapter(
        base_policy=base,
        environment=env,
        lms=lms,
        episode=EpisodeConfig(concurrency=4, seed=0),
        work_dir=tmp_path / "evals",
        operators=[],
        objective="accuracy",
    )
    intervals: dict[tuple[str, str], list[tuple[float, float]]] = {}
    play = adapter.run_user

    def timed(candidate, user, split="train"):
        started = time.perf_counter()
        result = play(candidate, user, split)
        intervals.setdefault((user, split), []).append((started, time.perf_counter()))
        return result

    adapter.run_user = timed
    calls_before = lms.usage.snapshot().total_calls
    outcome = run_gepa(
        adapter,
        train_users=TRAIN[:1],
        heldout_users=HELDOUT[:1],
        seed_candidate=seed_candidate(base, ["write.types_to_remember"], []),
        settings=GepaSettings(max_generations=0),
        run_dir=tmp_path / "gepa",
        seed=0,
    )
    (train_start, train_end), *again = intervals[(TRAIN[0], "train")]
    (heldout_start, heldout_end), *_ = intervals[(HELDOUT[0], "heldout")]
    assert train_start < heldout_end and heldout_start < train_end, "they ran one after another"
    assert [h.candidate_idx for h in outcome.heldout] == [0]
    # Read back by GEPA and the held-out callback: the LLM calls are those of two users.
    sequential_lms = world(tmp_path / "sequential")[1]
    per_user = []
    for user, split in ((TRAIN[0], "train"), (HELDOUT[0], "heldout")):
        solo = AMemGymAdapter(
            base_policy=base,
            environment=env,
            lms=sequential_lms,
            episode=EpisodeConfig(concurrency=1, seed=0),
            work_dir=tmp_path / "solo",
            operators=[],
        )
        solo.run_users(seed_candidate(base, ["write.types_to_remember"], []), [user], split)
        per_user.append(sequential_lms.usage.snapshot().total_calls - sum(per_user))
    assert lms.usage.snapshot().total_calls - calls_before == sum(per_user)


def run_final_heldout(tmp_path: Path, concurrency: int, monkeypatch) -> tuple[Any, list]:
    from optimize.evolve_helpers import World, write_spec

    from evolve.optimize import evolve_policy
    from evolve.spec.config import load_spec

    batches: list[list[tuple[str, str]]] = []
    run_jobs = AMemGymAdapter.run_jobs

    def spy(self, jobs):
        batches.append([(self.fingerprint(candidate), split) for candidate, _, split in jobs])
        return run_jobs(self, jobs)

    monkeypatch.setattr(AMemGymAdapter, "run_jobs", spy)
    spec = write_spec(
        tmp_path,
        optimizer="""
            generations = 2
            reflection_minibatch_size = 2
            mutate_components = ["use"]
            heldout = "final"
        """,
    )
    text = spec.read_text().replace("concurrency = 1", f"concurrency = {concurrency}")
    spec.write_text(text)
    result = evolve_policy(
        load_spec(spec), World().lms, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path / "ub"
    )
    return result, batches


def test_final_heldout_checks_of_base_and_best_run_together(tmp_path, monkeypatch):
    result, batches = run_final_heldout(tmp_path / "c4", 4, monkeypatch)
    assert result.best_id != "g00-c0"  # the base and the best are two candidates
    heldout_candidates = [{fp for fp, split in batch if split == "heldout"} for batch in batches]
    assert max(len(c) for c in heldout_candidates) == 2, batches
    sequential, _ = run_final_heldout(tmp_path / "c1", 1, monkeypatch)

    def scores(experiment):
        return {
            c.id: [s.score if s is not None else None for s in (c.train, c.heldout)]
            for c in experiment.candidates
        }

    assert scores(result) == scores(sequential)
    assert result.best_id == sequential.best_id and result.llm_calls == sequential.llm_calls
