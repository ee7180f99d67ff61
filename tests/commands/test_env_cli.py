"""`evolve env synthesize|validate|show` through the real CLI entry point (no LLM involved)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from evolve import cli
from evolve.simulator.environment import (
    PROBLEMS_KEPT,
    EnvironmentItem,
    InconsistentEnvironmentError,
    load_environment,
)

FIXTURE = Path(__file__).parents[1] / "simulator" / "data" / "original_small.json"


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """Run `evolve env ...` with only this command registered; returns (code, stdout, stderr)."""
    monkeypatch.setattr(cli, "COMMAND_MODULES", ["env"])

    def invoke(*argv: str) -> tuple[int, str, str]:
        code = cli.main(["env", *argv])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return invoke


def test_synthesize_tiny_defaults_to_four_users_and_validates(run, tmp_path: Path) -> None:
    out = tmp_path / "tiny.json"
    code, stdout, _ = run("synthesize", "--preset", "tiny", "--seed", "3", "--out", str(out))
    assert code == 0
    assert "4 users" in stdout and "rounds_initial=1" in stdout
    env = load_environment(out)
    assert len(env.items) == 4
    assert env.content_hash() in stdout


@pytest.mark.parametrize("llm", [False, True])
def test_synthesize_into_a_directory_is_bad_input_not_a_storage_failure(run, tmp_path, llm):
    flags = ["--llm", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"] if llm else []
    code, _, stderr = run("synthesize", "--preset", "tiny", "--out", str(tmp_path), *flags)
    assert code == 2, stderr
    assert stderr.startswith("evolve: error: --out") and stderr.count("\n") == 1
    assert "is a directory" in stderr and "rerun" not in stderr
    assert list(tmp_path.iterdir()) == []


def test_synthesize_v1_base_makes_twenty_valid_users(run, tmp_path: Path) -> None:
    out = tmp_path / "v1.json"
    code, stdout, _ = run("synthesize", "--preset", "v1.base", "--seed", "0", "--out", str(out))
    assert code == 0 and "20 users, 11 periods each" in stdout
    code, stdout, _ = run("validate", str(out))
    assert code == 0 and stdout.startswith("OK:") and "20 users" in stdout


def test_synthesize_is_byte_identical_for_the_same_seed(run, tmp_path: Path) -> None:
    first, second, other = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    for path, seed in ((first, "5"), (second, "5"), (other, "6")):
        code, _, _ = run(
            "synthesize", "--preset", "tiny", "--seed", seed, "--users", "2", "--out", str(path)
        )
        assert code == 0
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() != other.read_bytes()
    assert len(json.loads(first.read_text(encoding="utf-8"))) == 2


def test_synthesize_with_a_broken_extra_catalog_is_a_one_line_error(run, tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text('{"personas": [{"id": "x"}]}', encoding="utf-8")
    code, _, stderr = run(
        "synthesize", "--catalog", str(tmp_path), "--out", str(tmp_path / "env.json")
    )
    assert code == 2 and stderr.startswith("evolve: error:") and "bad.json" in stderr
    assert not (tmp_path / "env.json").exists()


def test_validate_lists_every_problem_and_exits_2(run, tmp_path: Path) -> None:
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    data[0]["periods"][1]["state"]["exercise_routine"] = "yoga"
    data[1]["qas"][0]["answer_choices"][0]["state"] = ["no pet"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    code, stdout, _ = run("validate", str(bad))
    assert code == 2
    assert "INVALID" in stdout
    assert "period 1" in stdout and "'exercise_routine'" in stdout and "'yoga'" in stdout
    assert "item 'plain-profile-user'" in stdout and "duplicate choice state" in stdout


def test_validate_structural_errors_and_missing_file(run, tmp_path: Path) -> None:
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    del data[0]["periods"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    code, stdout, _ = run("validate", str(bad))
    assert code == 2 and "item #0" in stdout and "periods" in stdout
    code, _, stderr = run("validate", str(tmp_path / "missing.json"))
    assert code == 2 and "does not exist" in stderr


def test_validate_of_many_bogus_users_lists_fifty_and_counts_the_rest(run, tmp_path: Path) -> None:
    # Each user has only an id: every other required field is one structural problem.
    users = 20_000
    bad = tmp_path / "bogus.json"
    bad.write_text(json.dumps([{"id": f"u{i}"} for i in range(users)]), encoding="utf-8")
    per_user = sum(1 for f in EnvironmentItem.model_fields.values() if f.is_required()) - 1
    total = users * per_user
    started = time.perf_counter()
    code, stdout, _ = run("validate", str(bad))
    assert time.perf_counter() - started < 60  # generous: it took seconds to print 100k lines
    lines = stdout.splitlines()
    assert code == 2
    assert len([line for line in lines if line.startswith("  - ")]) == PROBLEMS_KEPT
    assert lines[0].startswith("  - item #0 ('u0'): ")
    assert lines[-2] == f"  ... and {total - PROBLEMS_KEPT} more problem(s) not listed"
    assert lines[-1] == f"INVALID: {bad}: {total} problem(s)"


def test_validate_counts_consistency_problems_beyond_the_listed_ones(run, tmp_path: Path) -> None:
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    data[0]["periods"][1]["state"]["exercise_routine"] = "yoga"
    copies = [{**data[0], "id": f"user-{i}"} for i in range(80)]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(copies), encoding="utf-8")
    # Recomputed per user: the CLI's total must be their sum, not the listed count.
    total = sum(len(item.problems()) for item in load_environment(bad, check=False).items)
    assert total > PROBLEMS_KEPT
    code, stdout, _ = run("validate", str(bad))
    lines = stdout.splitlines()
    assert code == 2
    assert len([line for line in lines if line.startswith("  - ")]) == PROBLEMS_KEPT
    assert lines[-2] == f"  ... and {total - PROBLEMS_KEPT} more problem(s) not listed"
    assert lines[-1].endswith(f": {total} problem(s)")
    # Loading (what eval and run do) quotes a few and gives the same total.
    with pytest.raises(InconsistentEnvironmentError) as caught:
        load_environment(bad)
    assert caught.value.total == total and len(caught.value.problems) == PROBLEMS_KEPT
    assert f"{total} problem(s)" in str(caught.value)


def test_validate_accepts_original_format_files(run) -> None:
    code, stdout, _ = run("validate", str(FIXTURE))
    assert code == 0 and "2 users" in stdout


def test_show_overview_and_one_user(run, tmp_path: Path) -> None:
    out = tmp_path / "tiny.json"
    run("synthesize", "--preset", "tiny", "--seed", "1", "--out", str(out))
    env = load_environment(out)
    code, stdout, _ = run("show", str(out))
    assert code == 0
    assert all(item.id in stdout for item in env.items)

    item = env.items[2]
    code, stdout, _ = run("show", str(out), "--user", "2")
    assert code == 0
    assert stdout.startswith(f"User {item.id}")
    assert "Trajectory" in stdout and "Questions" in stdout
    for var in item.state_schema:
        assert var in stdout
    for qa in item.qas:
        assert qa.query in stdout
    code, by_prefix, _ = run("show", str(out), "--user", item.id[:4])
    assert code == 0 and by_prefix == stdout

    code, _, stderr = run("show", str(out), "--user", "nobody")
    assert code == 2 and "matches no user" in stderr


def test_show_marks_changes_and_gold_choices(run) -> None:
    code, stdout, _ = run("show", str(FIXTURE), "--user", "0b6f")
    assert code == 0
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Trajectory"))
    row = next(line for line in lines[start:] if line.strip().startswith("exercise_routine"))
    assert row.split()[1:] == ["b", "c*", "c"]
    assert "gold P0:2 P1:3 P2:1" in stdout


def test_the_old_generate_action_is_an_error_naming_the_new_one(run, tmp_path: Path) -> None:
    out = tmp_path / "old.json"
    code, _, err = run("generate", "--preset", "tiny", "--out", str(out))
    assert code == 2 and not out.exists()
    assert err.strip() == (
        "evolve: error: 'evolve env generate' is now called 'evolve env synthesize': run "
        f"evolve env synthesize --preset tiny --out {out}"
    )


def test_env_help_lists_synthesize_and_hides_generate(run, capsys) -> None:
    with pytest.raises(SystemExit):
        run("--help")
    listing = capsys.readouterr().out
    assert "synthesize" in listing and "generate" not in listing


@pytest.mark.parametrize("llm", [False, True])
@pytest.mark.parametrize("users", ["100000", "9" * 1000])
def test_synthesize_refuses_a_huge_user_count_in_one_short_line(run, tmp_path, llm, users):
    # The LLM path too: it is refused before the endpoint (port 9, nothing listens) is asked.
    flags = ["--llm", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"] if llm else []
    out = tmp_path / "env.json"
    code, _, stderr = run(
        "synthesize", *flags, "--preset", "tiny", "--users", users, "--out", str(out)
    )
    assert code == 2 and stderr.count("\n") == 1 and "10000" in stderr, stderr
    assert len(stderr) < 400, stderr  # a huge value is cut, not echoed whole
    assert not out.exists()
