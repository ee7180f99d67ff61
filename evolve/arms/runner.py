"""Run an arms spec: every evolving arm x seed x replicate as an experiment, then every arm's
policy once on each seed's test users; resumable at every step (experiments and evaluations
resume from their directories, and `arms.json` records each finished unit).

Evaluations that do not depend on the arm are shared: the base and the upper bound once per
seed, and any two units whose policies are identical (a run that kept its base) share one
test evaluation, keyed by the policy's fingerprint.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import memory_policies
from evolve.arms.ledger import record_test_sets
from evolve.arms.records import ArmsRecord, ArmUnit
from evolve.arms.registry import ARMS, FixedArmInputs
from evolve.arms.spec import ArmsSpec
from evolve.arms.worlds import SeedWorld, replicate_spec, seed_world
from evolve.core.errors import ToolkitError
from evolve.core.files import atomic_write_json
from evolve.core.paths import cache_dir
from evolve.llm import RoleLMs
from evolve.optimize.experiment_dir import ExperimentDir
from evolve.optimize.loop import evolve_policy
from evolve.results.records import ExperimentResult, fingerprint
from evolve.simulator.baselines import compute_upper_bound
from evolve.simulator.evaluation import run_evaluation
from evolve.simulator.run_dir import config_hash, read_record
from evolve.spec.config import load_spec
from evolve.tracking import ExperimentTracker, NullTracker

RECORD_FILE = "arms.json"


class ArmIncomplete(ToolkitError):
    """An evolving arm's experiment stopped early (its budget): not comparable yet."""


# Not "runs": a run directory's own subfolder of that name would read as the runs directory
# (and the usual ignore rules for runs/ would hide committed records).
EXPERIMENTS_DIR = "experiments"

Say = Callable[[str], None]


def design_hash(spec: ArmsSpec, experiment_identity: dict[str, Any]) -> str:
    return config_hash({"arms": spec.identity(), "experiment": experiment_identity})


def planned_units(spec: ArmsSpec) -> set[tuple[str, int, int | None]]:
    """(arm, seed, replicate) of every unit the spec asks for."""
    units: set[tuple[str, int, int | None]] = set()
    for name in spec.arms:
        arm = ARMS[name]
        replicates = range(spec.replicates) if arm.evolves or arm.per_replicate else [None]
        units |= {(name, seed, replicate) for seed in spec.seeds for replicate in replicates}
    return units


def finished(spec: ArmsSpec, record: ArmsRecord | None) -> bool:
    """Every planned unit scored on its test users (a rerun has nothing to call an LLM for)."""
    if record is None:
        return False
    experiment = load_spec(spec.experiment_path())
    if record.design_hash != design_hash(spec, experiment.identity()):
        return False  # `run_arms` says why it will not resume it
    done = {(u.arm, u.seed, u.replicate) for u in record.units if u.test_complete}
    return planned_units(spec) <= done


def load_record(directory: Path) -> ArmsRecord | None:
    path = directory / RECORD_FILE
    return read_record(path, ArmsRecord) if path.is_file() else None


def run_arms(
    spec: ArmsSpec,
    lms: RoleLMs,
    runs_dir: Path,
    *,
    tracker_for_experiment: Callable[[Any], ExperimentTracker] | None = None,
    say: Say = lambda _: None,
    stop: threading.Event | None = None,
) -> ArmsRecord:
    """Run or resume every unit of `spec`; returns the record of all finished units."""
    experiment = load_spec(spec.experiment_path())
    directory = runs_dir / spec.name
    digest = design_hash(spec, experiment.identity())
    record = load_record(directory)
    if record is not None and record.design_hash != digest:
        from evolve.core.errors import ResumeMismatchError

        raise ResumeMismatchError(
            f"{directory}: made by another design (design hash {record.design_hash}, this "
            f"spec's {digest}); give the changed design another name, or move {directory}"
        )
    record = record or ArmsRecord(
        name=spec.name, design_hash=digest, seeds=spec.seeds, arms=spec.arms,
        replicates=spec.replicates,
    )  # fmt: skip
    save = _saver(directory)
    save(record)
    trackers = tracker_for_experiment or (lambda _spec: NullTracker())
    for seed in spec.seeds:
        world = seed_world(spec, experiment, seed)
        facts = sorted(
            {v for item in world.resolved.train.items for qa in item.qas for v in qa.required_info}
        )
        record = record.model_copy(update={"train_facts": {**record.train_facts, str(seed): facts}})
        save(record)
        for warning in record_test_sets(runs_dir, spec.name, digest, world):
            say(warning)
        evolved: dict[tuple[str, int], ExperimentResult] = {}
        for replicate in range(spec.replicates):
            for arm in (ARMS[name] for name in spec.arms if ARMS[name].evolves):
                experiment = replicate_spec(world, spec.name, arm.name, replicate,
                                         arm.experiment(world.experiment))  # fmt: skip
                say(f"seed {seed}: {arm.name} replicate {replicate} ({experiment.name})")
                evolved[(arm.name, replicate)] = evolve_policy(
                    experiment, lms, runs_dir=directory / EXPERIMENTS_DIR,
                    tracker=trackers(experiment), stop=stop,
                )  # fmt: skip
        record = _score_on_test(spec, world, directory, lms, evolved, record, save, say, stop)
    return record


def _score_on_test(
    spec: ArmsSpec,
    world: SeedWorld,
    directory: Path,
    lms: RoleLMs,
    evolved: dict[tuple[str, int], ExperimentResult],
    record: ArmsRecord,
    save: Callable[[ArmsRecord], None],
    say: Say,
    stop: threading.Event | None,
) -> ArmsRecord:
    """Every arm's policy of this seed on its test users (each distinct policy once)."""
    say(f"seed {world.seed}: upper bound on {len(world.test.items)} test users")
    table = compute_upper_bound(
        world.test, lms, cache_dir() / "upper_bound", concurrency=world.episode.concurrency,
        rules=world.episode.rules,
    )  # fmt: skip
    base_policy = world.resolved.base_policy
    for name in spec.arms:
        arm = ARMS[name]
        replicates: list[int | None] = (
            list(range(spec.replicates)) if arm.evolves or arm.per_replicate else [None]
        )
        for replicate in replicates:
            unit_fields: dict[str, Any] = {}
            if arm.evolves:
                assert replicate is not None
                result = evolved[(name, replicate)]
                if result.best_id is None or not result.complete:
                    raise ArmIncomplete(
                        f"{result.name} stopped before its last generation ({result.stopped}): "
                        "an arm is compared only once finished; raise run_budget and rerun"
                    )
                experiment_dir = ExperimentDir(directory / EXPERIMENTS_DIR / result.name)
                policy = memory_policies.load(experiment_dir.policy_dir(result.best_id))
                unit_fields = {
                    "experiment": result.name, "best_id": result.best_id,
                    "optimizer_seed": result.candidate(result.best_id).seed,
                    "evolution_calls": result.llm_calls, "evolution_wall_s": result.wall_time_s,
                }  # fmt: skip
            else:
                source = evolved.get(("evolved", replicate)) if replicate is not None else None
                inputs = FixedArmInputs(base_policy, world.experiment, source)
                policy = arm.policy(inputs)
                unit_fields.update(arm.unit_fields(inputs))
            key = fingerprint(policy.kind, policy.components(), policy.parameters())
            test_dir = Path(f"seed-{world.seed}") / "test" / key
            say(f"seed {world.seed}: test {name}" + ("" if replicate is None else f" r{replicate}"))
            started = time.perf_counter()
            report = run_evaluation(
                world.test, policy, lms, directory / test_dir, world.episode,
                upper_bound=table, stop=stop,
            )  # fmt: skip
            unit = ArmUnit(
                arm=name, seed=world.seed, replicate=replicate, policy_fingerprint=key,
                test_dir=str(test_dir), test_complete=report.complete,
                test_calls=sum(p.usage.calls for u in report.users for p in u.periods),
                test_wall_s=time.perf_counter() - started, **unit_fields,
            )  # fmt: skip
            record = record.with_unit(unit)
            save(record)
    return record


def _saver(directory: Path) -> Callable[[ArmsRecord], None]:
    directory.mkdir(parents=True, exist_ok=True)

    def save(record: ArmsRecord) -> None:
        atomic_write_json(directory / RECORD_FILE, record.model_dump(mode="json"))

    return save
