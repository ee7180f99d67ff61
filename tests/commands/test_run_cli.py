"""`evolve run`, `evolve compare` and `evolve export` end to end through `evolve.cli.main`,
with scripted LMs injected where the command opens its LMs."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
from optimize.evolve_helpers import MARKER, World, write_spec

import memory_policies
from evolve.cli import main
from evolve.optimize import ExperimentDir
from evolve.tracking import mlflow_client

QUICKSTART = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.toml"


@pytest.fixture
def inject(monkeypatch):
    """Make `evolve run` use scripted LMs; returns the list of worlds it opened."""
    worlds: list[World] = []
    configs = []

    @contextlib.contextmanager
    def fake_open_role_lms(config):
        configs.append(config)
        world = World()
        worlds.append(world)
        yield world.lms

    monkeypatch.setattr("evolve.commands.run.open_role_lms", fake_open_role_lms)
    worlds_and_configs = (worlds, configs)
    return worlds_and_configs


def test_quickstart_runs_end_to_end_on_scripted_lms(tmp_path, monkeypatch, inject, capsys):
    monkeypatch.chdir(tmp_path)  # runs/ and mlruns/ are relative to the current directory
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["run", str(QUICKSTART), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "experiment quickstart (population; score = memory_score)" in out
    assert "lineage of" in out and "best policy (" in out
    # The end says in words what changed and whether the best beats the base, on how much.
    assert "what changed: " in out
    assert "held-out (2 users, 48 questions): " in out
    assert "accuracy references: chance 0.333" in out
    # The table's calls and tokens add up: every generation's row plus the named stages'
    # (the upper bound, the held-out tests) is the total spent, and nothing is in no row.
    table = out[out.index("gen cands best") : out.index("  total = spent")].splitlines()[1:]
    rows = [line for line in table if re.match(r"\s*\d+ ", line)]
    stages = [line for line in table if line.startswith("  ") and not re.match(r"\s*\d+ ", line)]
    assert [line.split()[0:2] for line in stages] == [["upper", "bound"], ["held-out", "tests"]]
    tokens, calls = (sum(int(line.split()[-k]) for line in rows + stages) for k in (2, 1))
    total = out[out.index("total = spent") :].splitlines()[0].split()
    assert [int(total[-2]), int(total[-1])] == [tokens, calls] and calls > 0
    assert f"spent: {calls} LLM calls sent, {tokens} tokens" in out
    assert "in no row" not in out
    for generation in range(4):
        assert f"\n  {generation} " in out
    bundle = tmp_path / "runs" / "quickstart" / "best_policy"
    assert str(bundle.resolve()) in out
    assert memory_policies.load(bundle).kind == "in_context_quotes"
    assert (tmp_path / "mlruns" / "mlflow.db").is_file()
    worlds, configs = inject
    assert configs[0].needs_embedded_server()  # the quickstart names no endpoint
    calls = worlds[0].calls()
    assert calls["reflector"] >= 3 and calls["agent"] > 100
    # It ends with the command that shows these runs (`evolve ui`, the default store) and,
    # by hand, `mlflow ui` and the address of the experiment's scored runs view (not
    # MLflow's GenAI overview), no "..." to fill in.
    store = (tmp_path / "mlruns" / "mlflow.db").resolve()
    experiment = mlflow_client(f"sqlite:///{store}").get_experiment_by_name(
        "amemgym-evolve/quickstart"
    )
    evolve_ui, by_hand = out.rstrip().splitlines()[-2:]
    assert evolve_ui.startswith("MLflow UI: ") and evolve_ui.endswith(
        f" ui {QUICKSTART}   (serves this store, opens the scored runs)"
    )
    assert by_hand.startswith("  or by hand: LITELLM_LOCAL_MODEL_COST_MAP=True ")
    assert " ui --backend-store-uri " in by_hand and "mlflow.db --workers 1, then open" in by_hand
    assert by_hand.endswith(
        f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs"
        "?viewStateShareKey=evolve-scores&workflowType=machine_learning"
    )
    assert "..." not in out

    assert main(["compare", str(QUICKSTART), "--plot", "scores.png"]) == 0
    compared = capsys.readouterr().out
    assert "best train" in compared and "held-out" in compared
    assert (tmp_path / "scores.png").stat().st_size > 1000
    assert (tmp_path / "scores.pdf").stat().st_size > 1000

    assert main(["export", "quickstart", "--out", "exported"]) == 0
    exported = capsys.readouterr().out
    assert "registered quickstart-memory-policy version 1 as models:/" in exported
    # It ends by naming the UI and the registered version's page.
    evolve_ui, page = exported.rstrip().splitlines()[-2:]
    assert evolve_ui.startswith("MLflow UI: ") and " ui quickstart" in evolve_ui
    assert page == (
        "  the registered model: http://127.0.0.1:5000/#/models/quickstart-memory-policy/versions/1"
    )
    result = ExperimentDir(tmp_path / "runs" / "quickstart").load_result()
    best = result.candidate(result.best_id)
    policy = memory_policies.load(tmp_path / "exported")
    assert policy.components() == best.components and policy.parameters() == best.parameters

    # Rerunning resumes: nothing is recomputed.
    assert main(["run", str(QUICKSTART), "--no-progress"]) == 0
    assert worlds[1].calls() == {"agent": 0, "reflector": 0, "simulator": 0}


def test_a_run_logged_to_a_file_says_how_far_gepas_evaluations_are(
    tmp_path, inject, capsys, monkeypatch
):
    # Output to a log (capsys: not a terminal): GEPA's own evaluations, which make most of a
    # run's calls before a candidate is stored, print progress lines too.
    from evolve.commands import progress

    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.0)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["run", str(QUICKSTART), "--no-progress", "--no-tracking"]) == 0
    err = capsys.readouterr().err
    gepa = re.findall(
        r"(?m)^    \.\.\. (?:train|validation) [0-9a-f]{8}: \d+/\d+ user-periods", err
    )
    assert gepa, err[-2000:]
    # And the upper bound, the stage before them.
    assert re.search(r"(?m)^    \.\.\. upper bound: \d+ answers so far$", err), err[:2000]


def test_run_finds_the_marker_and_prints_lineage(tmp_path, inject, capsys):
    spec = write_spec(tmp_path)
    args = ["run", str(spec), "--runs-dir", str(tmp_path / "runs"), "--no-tracking"]
    assert main([*args, "--no-progress"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "reflective(use)" in out
    policy = memory_policies.load(tmp_path / "runs" / "exp" / "best_policy")
    assert MARKER in policy.components()["use"]
    # --no-progress hides the bars, not the run: one plain line per candidate evaluation,
    # its scores named.
    result = ExperimentDir(tmp_path / "runs" / "exp").load_result()
    lines = captured.err.splitlines()
    for record in result.candidates:
        if record.train is not None:
            (line,) = [x for x in lines if x.startswith(f"    {record.id} train: ")]
            assert "memory_score " in line and ", accuracy " in line


def test_llm_flags_override_the_spec(tmp_path, inject):
    spec = write_spec(tmp_path, optimizer="generations = 0")
    runs = str(tmp_path / "runs")
    args = ["run", str(spec), "--runs-dir", runs, "--no-tracking", "--no-progress"]
    assert main([*args, "--agent-model", "my-model"]) == 0
    _, configs = inject
    assert configs[0].agent.model == "my-model"


def test_invalid_spec_fails_before_opening_any_lm(tmp_path, inject, capsys):
    spec = write_spec(tmp_path, optimizer='mutate_components = ["nope"]')
    assert main(["run", str(spec), "--no-tracking"]) == 2
    error = capsys.readouterr().err
    assert "evolve: error:" in error and "'nope'" in error and str(spec) in error
    worlds, configs = inject
    assert configs == []  # no LM was opened


def test_compare_and_export_explain_unknown_experiments(tmp_path, capsys):
    assert main(["compare", "missing", "--runs-dir", str(tmp_path)]) == 2
    assert "no experiment 'missing'" in capsys.readouterr().err
    code = main(
        ["export", "missing", "--out", str(tmp_path / "o"), "--tracking-uri",
         f"sqlite:///{tmp_path}/m/mlflow.db"]
    )  # fmt: skip
    assert code == 2
    assert "not an experiment spec" in capsys.readouterr().err
