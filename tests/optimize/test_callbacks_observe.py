"""GEPA's callbacks only observe: while gepa dispatches a callback, no user is played, no
operator is told a score, no attribute of the adapter is set and no record is written.
The schedule does all of that between GEPA's iterations (`run_gepa`, `GepaRecords`)."""

from __future__ import annotations

import threading
from typing import Any

import gepa.core.engine
import gepa.proposer.merge
import gepa.proposer.reflective_mutation.reflective_mutation as reflective_mutation
from optimize.evolve_helpers import World, write_spec

from evolve.optimize import ExperimentDir, evolve_policy
from evolve.optimize.gepa_adapter import AMemGymAdapter
from evolve.spec.config import load_spec

GEPA_MODULES = (gepa.core.engine, gepa.proposer.merge, reflective_mutation)


class CallbackWatch:
    """Marks the time gepa spends inside its callbacks and lists what was done then."""

    def __init__(self) -> None:
        self.depth = threading.local()
        self.acts: list[str] = []
        self.dispatched = 0

    def inside(self) -> bool:
        return getattr(self.depth, "value", 0) > 0

    def wrap_dispatch(self, notify: Any) -> Any:
        def dispatch(*args: Any, **kwargs: Any) -> Any:
            self.depth.value = getattr(self.depth, "value", 0) + 1
            self.dispatched += 1
            try:
                return notify(*args, **kwargs)
            finally:
                self.depth.value -= 1

        return dispatch

    def flag(self, what: str, original: Any) -> Any:
        def flagged(*args: Any, **kwargs: Any) -> Any:
            if self.inside():
                self.acts.append(what)
            return original(*args, **kwargs)

        return flagged


def test_no_callback_plays_a_user_tells_an_operator_or_writes(tmp_path, monkeypatch):
    watch = CallbackWatch()
    for module in GEPA_MODULES:
        monkeypatch.setattr(
            module, "notify_callbacks", watch.wrap_dispatch(module.notify_callbacks)
        )
    for method in ("run_user", "run_jobs", "observe"):
        original = getattr(AMemGymAdapter, method)
        monkeypatch.setattr(AMemGymAdapter, method, watch.flag(f"adapter.{method}", original))
    setattr_original = AMemGymAdapter.__setattr__

    def guarded_setattr(adapter: AMemGymAdapter, name: str, value: Any) -> None:
        if watch.inside():
            watch.acts.append(f"adapter.{name} =")
        setattr_original(adapter, name, value)

    monkeypatch.setattr(AMemGymAdapter, "__setattr__", guarded_setattr)
    for name in vars(ExperimentDir):
        if name.startswith("save"):
            original = getattr(ExperimentDir, name)
            monkeypatch.setattr(ExperimentDir, name, watch.flag(f"ExperimentDir.{name}", original))

    world = World()
    optimizer = """
        generations = 3
        reflection_minibatch_size = 2
        mutate_components = ["write.types_to_remember", "use"]
    """
    spec = load_spec(write_spec(tmp_path, optimizer=optimizer))
    result = evolve_policy(
        spec, world.lms, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path / "ub"
    )

    assert result.complete and len(result.generations) == 4
    assert watch.dispatched > 10, "gepa's callbacks were not watched"
    assert watch.acts == []


def test_the_watch_sees_an_acting_callback(tmp_path, monkeypatch):
    """The watch itself can fail: a callback that plays a user is caught."""
    from evolve.optimize import gepa_engine

    watch = CallbackWatch()
    for module in GEPA_MODULES:
        monkeypatch.setattr(
            module, "notify_callbacks", watch.wrap_dispatch(module.notify_callbacks)
        )
    original = AMemGymAdapter.run_user
    monkeypatch.setattr(AMemGymAdapter, "run_user", watch.flag("adapter.run_user", original))
    adapters: list[AMemGymAdapter] = []
    init = AMemGymAdapter.__init__

    def remember(adapter: AMemGymAdapter, *args: Any, **kwargs: Any) -> None:
        init(adapter, *args, **kwargs)
        adapters.append(adapter)

    monkeypatch.setattr(AMemGymAdapter, "__init__", remember)

    class Acting(gepa_engine.GepaEvents):
        def on_valset_evaluated(self, event: Any) -> None:
            super().on_valset_evaluated(event)
            adapters[0].run_users(dict(event["candidate"]), ["user-2"], split="heldout")

    monkeypatch.setattr(gepa_engine, "GepaEvents", Acting)
    world = World()
    spec = load_spec(write_spec(tmp_path))
    evolve_policy(spec, world.lms, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path / "ub")
    assert "adapter.run_user" in watch.acts
