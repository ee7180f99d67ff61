"""A damaged run directory is one line or a warned recomputation, never a traceback.

One tiny experiment (`evolve run`) and one `evolve eval --out` are made against the stub.
Then every kind of file they wrote is damaged in a fresh copy, by truncation and by
garbage, and `run` / `eval`, `compare` and `export` are rerun over it:
- no command prints a traceback;
- a command that fails names the damaged file in its one error line (exit 2);
- the writer (`run` or `eval`) either fails that way, and then following the line's advice
  (deleting the file) makes its next rerun succeed, or succeeds and leaves the file
  readable again: recomputed with a warning naming it, or written again as every run
  writes it (a result, a bundle). Nothing is silently left damaged.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability.process_helpers import llm_flags, run_in_process, write_tiny_spec
from stub_server import StubServer

from evolve.core.errors import EXIT_BAD_INPUT

# Files nobody reads back: written for people (GEPA's own logs and copies of its state)
# or locks. Damaging them changes nothing a command computes.
NEVER_READ = re.compile(
    r"(\.evolve\.lock|feedback\.txt|gepa/run_log\.(txt|json)|gepa/candidates\.json"
    r"|gepa/generated_best_outputs_valset/.*)$"
)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garble(path: Path) -> None:
    path.write_bytes(b"\x00\xff{garbage" * 3)


DAMAGES = {"truncated": _truncate, "garbled": _garble}


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(latency=0.0) as server:
        yield server


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory, stub: StubServer) -> Path:
    """A finished tiny experiment (runs/tiny) and a finished evaluation (evals/)."""
    home = tmp_path_factory.mktemp("pristine")
    spec = write_tiny_spec(home, generations=1)
    assert run_in_process(home, "run", str(spec), *llm_flags(stub)) == 0
    assert run_in_process(home, *_eval_args(stub)) == 0
    return home


def _eval_args(stub: StubServer) -> list[str]:
    env = ["--env", "small_env.json", "--policy", "in_context", "--no-upper-bound"]
    return ["eval", *env, "--out", "evals", *llm_flags(stub)]


def _file_kinds(home: Path, under: str) -> list[str]:
    """One file of each kind under `home/under` (hash and user directories vary)."""
    kinds: dict[str, str] = {}
    for path in sorted((home / under).rglob("*")):
        relative = path.relative_to(home).as_posix()
        if not path.is_file() or NEVER_READ.search(relative):
            continue
        kind = re.sub(r"[0-9a-f]{16}|user-\d+|g\d\d-c\d+|period_\d\d|gen_\d\d", "*", relative)
        kinds.setdefault(kind, relative)
    return sorted(kinds.values())


def _run(home: Path, *args: str) -> tuple[int, str]:
    """Exit code and stderr of `evolve ARGS` in this process."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = run_in_process(home, *args)
    return code, stderr.getvalue()


def _damaged_copy(pristine: Path, tmp_path: Path, relative: str, damage: str) -> Path:
    home = tmp_path / "home"
    shutil.copytree(pristine, home, symlinks=True)
    DAMAGES[damage](home / relative)
    return home


def _readable(path: Path) -> bool:
    if path.suffix == ".bin":
        with contextlib.suppress(Exception):
            return isinstance(pickle.loads(path.read_bytes()), dict)
        return False
    if path.suffix == ".jsonl":
        return all(json.loads(line) is not None for line in path.read_text().splitlines())
    with contextlib.suppress(ValueError):
        json.loads(path.read_text(encoding="utf-8"))
        return True
    return False


def _writer_problem(home: Path, relative: str, args: list[str]) -> str | None:
    damaged = (home / relative).read_bytes()
    code, stderr = _run(home, *args)
    if "Traceback" in stderr:
        return f"{relative}: traceback:\n{stderr[-2000:]}"
    if code == 0:
        # Recomputed (with a warning naming it), or written again as a matter of course
        # (a result or bundle each run writes): either way readable now.
        if (home / relative).exists() and not _readable(home / relative):
            return f"{relative}: exit 0 and still damaged:\n{stderr[-2000:]}"
        warned = [line for line in stderr.splitlines() if "damaged run file" in line]
        if (home / relative).read_bytes() == damaged and not any(
            relative.split("/")[-1] in line for line in warned
        ):
            return f"{relative}: exit 0, unchanged and no warning naming it:\n{stderr[-2000:]}"
        return None
    error = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if code != EXIT_BAD_INPUT or relative not in error:
        return f"{relative}: exit {code}, last line does not name the file:\n{stderr[-2000:]}"
    if "delete it and rerun" in error:
        (home / relative).unlink()
        code, stderr = _run(home, *args)
        if code != 0:
            return f"{relative}: deleting it as advised did not repair it:\n{stderr[-2000:]}"
    return None


def _reader_problem(home: Path, relative: str, *args: str) -> str | None:
    code, stderr = _run(home, *args)
    if "Traceback" in stderr:
        return f"{relative}: `{args[0]}` traceback:\n{stderr[-2000:]}"
    error = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if code != 0 and (code != EXIT_BAD_INPUT or relative not in error):
        return f"{relative}: `{args[0]}` exit {code} without naming it:\n{stderr[-2000:]}"
    return None


def test_every_experiment_file_kind_is_covered(pristine: Path) -> None:
    kinds = _file_kinds(pristine, "runs/tiny")
    for expected in ("experiment.json", "gepa_state.bin", "candidate.json", "checkpoint.json"):
        assert any(kind.endswith(expected) for kind in kinds), kinds
    assert len(kinds) >= 20, kinds


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_each_damaged_experiment_file(
    pristine: Path, tmp_path: Path, stub: StubServer, damage: str
) -> None:
    problems = []
    for index, relative in enumerate(_file_kinds(pristine, "runs/tiny")):
        home = _damaged_copy(pristine, tmp_path / str(index), relative, damage)
        problems += [
            _reader_problem(home, relative, "compare", "tiny"),
            _reader_problem(home, relative, "export", "tiny", "--out", "bundle", "--no-register"),
            _writer_problem(home, relative, ["run", "tiny.toml", *llm_flags(stub)]),
        ]
    assert not [p for p in problems if p], "\n\n".join(p for p in problems if p)


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_each_damaged_evaluation_file(
    pristine: Path, tmp_path: Path, stub: StubServer, damage: str
) -> None:
    problems = []
    for index, relative in enumerate(_file_kinds(pristine, "evals")):
        home = _damaged_copy(pristine, tmp_path / str(index), relative, damage)
        problems += [
            _reader_problem(home, relative, "compare", "evals"),
            _writer_problem(home, relative, _eval_args(stub)),
        ]
    assert not [p for p in problems if p], "\n\n".join(p for p in problems if p)


class _Payload:
    """A hostile GEPA checkpoint's content: unpickling it creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - pickle's protocol
        return (os.system, (f"touch {self.marker}",))


def test_resuming_a_crafted_gepa_state_never_runs_it(
    pristine: Path, tmp_path: Path, stub: StubServer
) -> None:
    home = tmp_path / "home"
    shutil.copytree(pristine, home, symlinks=True)
    state_file = home / "runs" / "tiny" / "gepa" / "gepa_state.bin"
    state = pickle.loads(state_file.read_bytes())
    marker = tmp_path / "payload-ran"
    state_file.write_bytes(pickle.dumps({**state, "i": _Payload(marker)}))
    code, stderr = _run(home, "run", "tiny.toml", *llm_flags(stub))
    assert code == EXIT_BAD_INPUT, stderr[-3000:]
    assert "gepa_state.bin" in stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr
    assert not marker.exists()


def test_a_unit_stopped_after_its_sessions_with_a_damaged_transcript_is_replayed(
    pristine: Path, tmp_path: Path, stub: StubServer, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    shutil.copytree(pristine, home, symlinks=True)
    period = next((home / "evals").glob("*/users/user-0/period_01"))
    (period / "result.json").unlink()  # stopped after its sessions, before its questions
    _garble(period / "transcript.json")
    code, stderr = _run(home, *_eval_args(stub))
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    warned = [r.getMessage() for r in caplog.records if "damaged run file" in r.getMessage()]
    assert any(
        "transcript.json" in line and "recomputing user-0 from period 1" in line for line in warned
    ), warned
    assert _readable(period / "transcript.json") and (period / "result.json").is_file()
    assert (period.parents[2] / "set_aside" / "user-0" / "damaged-period_01").is_dir()
