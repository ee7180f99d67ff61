"""`evolve arms` end to end on scripted LMs: every arm x seed x replicate runs and resumes,
the test users are scored once, and the table is made from the per-question records."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from optimize.evolve_helpers import World

from evolve.arms.runner import RECORD_FILE
from evolve.cli import main

QUICKSTART = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.toml"


@pytest.fixture
def worlds(monkeypatch) -> list[World]:
    opened: list[World] = []

    @contextlib.contextmanager
    def fake_open_role_lms(config):
        world = World()
        opened.append(world)
        yield world.lms

    monkeypatch.setattr("evolve.commands.arms.open_role_lms", fake_open_role_lms)
    return opened


def _write_arms(tmp_path: Path, seeds: list[int], replicates: int = 2) -> Path:
    experiment = tmp_path / "quickstart.toml"
    text = QUICKSTART.read_text(encoding="utf-8").replace("generations = 3", "generations = 1")
    experiment.write_text(text, encoding="utf-8")
    spec = tmp_path / "arms.toml"
    spec.write_text(
        f'name = "smoke"\nexperiment = "quickstart.toml"\nseeds = {seeds}\n'
        f"replicates = {replicates}\nvalidation_users = 1\ntest_users = 2\nresamples = 400\n",
        encoding="utf-8",
    )
    return spec


def test_arms_run_every_unit_once_and_resume(tmp_path, monkeypatch, worlds, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache"))
    spec = _write_arms(tmp_path, [13])
    assert main(["arms", str(spec), "--no-tracking"]) == 0
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "runs" / "smoke" / RECORD_FILE).read_text())
    units = {(u["arm"], u["seed"], u["replicate"]) for u in record["units"]}
    assert units == {
        ("evolved", 13, 0), ("evolved", 13, 1), ("blind", 13, 0), ("blind", 13, 1),
        ("capacity", 13, 0), ("capacity", 13, 1), ("base", 13, None),
    }  # fmt: skip
    assert all(u["test_complete"] for u in record["units"])
    # The capacity control records how many neutral slots it added: what its replicate's
    # evolved best added to the list (recomputed from that run's candidate records).
    for unit in (u for u in record["units"] if u["arm"] == "capacity"):
        run = (
            tmp_path / "runs" / "smoke" / "experiments" / f"smoke-evolved-s13-r{unit['replicate']}"
        )
        result = json.loads((run / "result.json").read_text())
        by_id = {c["id"]: c for c in result["candidates"]}
        added, current = 0, by_id[result["best_id"]]
        while True:
            edits = current["mutation"]["edits"].get("write.types_to_remember", {})
            added += len(edits.get("added", [])) - len(edits.get("removed", []))
            if not current["parent_ids"]:
                break
            current = by_id[current["parent_ids"][0]]
        assert unit["slots_added"] == max(0, added)
    # Replicates are their own runs with their own optimizer seed.
    runs = tmp_path / "runs" / "smoke" / "experiments"
    seeds = {
        name: json.loads((runs / name / "experiment.json").read_text())["identity"]["spec"].get(
            "seed"
        )
        for name in ("smoke-evolved-s13-r0", "smoke-evolved-s13-r1")
    }
    assert seeds["smoke-evolved-s13-r0"] != seeds["smoke-evolved-s13-r1"]
    for arm in ("evolved", "blind", "capacity", "base"):
        assert f"| {arm} |" in out
    assert "vs base:" in out and "vs blind:" in out and "vs capacity:" in out
    calls_first = sum(sum(world.calls().values()) for world in worlds)
    assert calls_first > 0

    # A rerun finds every unit done: it opens no LLM at all and prints the same table.
    assert main(["arms", str(spec), "--no-tracking"]) == 0
    assert capsys.readouterr().out == out
    assert len(worlds) == 1


def test_an_interrupted_arms_run_resumes_to_the_same_units(tmp_path, monkeypatch, capsys) -> None:
    from optimize.evolve_helpers import make_agent

    from evolve.core.errors import Interrupted

    budget = {"calls": 0, "limit": 150}
    agent = make_agent()

    def interrupting_agent(call):
        budget["calls"] += 1
        if budget["limit"] is not None and budget["calls"] > budget["limit"]:
            raise Interrupted("stopped by the test")
        return agent(call)

    opened: list[World] = []

    @contextlib.contextmanager
    def fake_open_role_lms(config):
        world = World(agent=interrupting_agent)
        opened.append(world)
        yield world.lms

    monkeypatch.setattr("evolve.commands.arms.open_role_lms", fake_open_role_lms)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache"))
    spec = _write_arms(tmp_path, [13], replicates=1)
    assert main(["arms", str(spec), "--no-tracking"]) != 0  # stopped part-way
    record_file = tmp_path / "runs" / "smoke" / RECORD_FILE
    before = json.loads(record_file.read_text())["units"] if record_file.exists() else []
    assert len(before) < 4
    budget["limit"] = None
    assert main(["arms", str(spec), "--no-tracking"]) == 0
    units = {(u["arm"], u["replicate"]) for u in json.loads(record_file.read_text())["units"]}
    assert units == {("evolved", 0), ("blind", 0), ("capacity", 0), ("base", None)}
    assert "| evolved |" in capsys.readouterr().out


def test_transfer_tables_only_questions_about_facts_no_train_user_had(
    tmp_path, monkeypatch, worlds, capsys
) -> None:
    from evolve.simulator.synthesis.offline import synthesize_users
    from evolve.simulator.synthesis.presets import get_preset

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache"))
    everyday = QUICKSTART.parent / "everyday.toml"
    text = everyday.read_text(encoding="utf-8").replace("generations = 3", "generations = 1")
    (tmp_path / "everyday.toml").write_text(text, encoding="utf-8")
    (tmp_path / "arms.toml").write_text(
        'name = "transfer"\nexperiment = "everyday.toml"\nseeds = [501]\nreplicates = 1\n'
        'arms = ["evolved", "base"]\nvalidation_users = 1\ntest_users = 2\nresamples = 400\n'
        "transfer = true\n",
        encoding="utf-8",
    )
    assert main(["arms", str(tmp_path / "arms.toml"), "--no-tracking"]) == 0
    out = capsys.readouterr().out
    # Recomputed from the world: users 0-1 train, 2 validation, 3-4 test.
    users = synthesize_users(get_preset("recall"), 501, range(5)).items
    seen = {v for item in users[:2] for qa in item.qas for v in qa.required_info}
    unseen = [
        qa for item in users[3:] for qa in item.qas if not seen.intersection(qa.required_info)
    ]
    periods = len(users[3].periods)
    transfer = out.split("Transfer:")[1]
    assert f"| base | 1 | 1 | 2 | {len(unseen) * periods} |" in transfer
    assert f"| base | 1 | 1 | 2 | {2 * len(users[3].qas) * periods} |" in out.split("Transfer:")[0]


def test_the_arms_table_is_one_mlflow_run_with_bounds_as_metrics(
    tmp_path, monkeypatch, worlds, capsys
) -> None:
    from evolve.tracking import mlflow_client

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache"))
    spec = _write_arms(tmp_path, [13], replicates=1)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["arms", str(spec), "--tracking-uri", uri]) == 0
    capsys.readouterr()
    summary = json.loads((tmp_path / "runs" / "smoke" / "summary.json").read_text())
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name("amemgym-evolve/quickstart")
    runs = client.search_runs(
        [experiment.experiment_id], filter_string="tags.`evolve.kind` = 'arms'"
    )
    assert len(runs) == 1
    metrics = runs[0].data.metrics
    evolved = next(row for row in summary["rows"] if row["arm"] == "evolved")
    to_base = next(diff for diff in evolved["differences"] if diff["to"] == "base")
    assert metrics["evolved.vs_base.difference"] == to_base["accuracy"]["value"]
    assert metrics["evolved.vs_base.difference_low"] == to_base["accuracy"]["interval"]["low"]
    assert metrics["base.test_accuracy"] == next(
        row["scores"]["accuracy"]["value"] for row in summary["rows"] if row["arm"] == "base"
    )
    # A rerun updates the same run rather than adding one.
    assert main(["arms", str(spec), "--tracking-uri", uri]) == 0
    again = client.search_runs(
        [experiment.experiment_id], filter_string="tags.`evolve.kind` = 'arms'"
    )
    assert [run.info.run_id for run in again] == [runs[0].info.run_id]
