"""Run `python -m evolve.cli` as a real process against the stub server (lock and signal
tests need separate processes: flock conflicts and signal delivery are per process)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import optuna
from optimize.evolve_helpers import make_item
from optuna.trial import TrialState
from stub_server import StubServer

from evolve.simulator.environment import Environment, save_environment

REPO = Path(__file__).resolve().parents[2]

# Every process a test starts here, closed after the test (`close_started_processes`, an
# autouse fixture in conftest.py): a test that stops reading a killed child's pipes would
# otherwise leave them open until some later test's garbage collection, warning there.
_STARTED: list[subprocess.Popen] = []


def started(process: subprocess.Popen) -> subprocess.Popen:
    """`process`, to be killed if still running and its pipes closed after the test."""
    _STARTED.append(process)
    return process


def close_started_processes() -> None:
    while _STARTED:
        process = _STARTED.pop()
        if process.poll() is None:
            process.kill()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        process.wait(timeout=30)


def write_small_environment(path: Path, users: int = 2) -> Path:
    """Users with 2 periods (3 sessions) and 1 question: about a dozen LLM calls per user."""
    items = []
    for index in range(users):
        item = make_item(f"user-{index}")
        item["periods"] = item["periods"][:2]
        item["qas"] = item["qas"][:1]
        items.append(item)
    env = Environment.from_original(items)
    assert env.problems() == []
    save_environment(env, path)
    return path


# A study spec over `write_small_environment(<spec dir>/env.json)`: 2 grid trials.
TUNE_SPEC = """
name = "tiny-tune"
seed = 0
concurrency = 2

[environment]
file = "env.json"
train_users = 1
heldout_users = 1

[policy]
kind = "in_context"
parameters = { update_every = 2, short_term_len = 2 }

[tracking]
enabled = false

[tuning]
sampler = "grid"
trials = 2
objectives = ["accuracy"]
heldout = "none"
storage = "sqlite:///optuna.db"

[tuning.parameters]
update_every = [2, 4]

[tuning.pruner]
kind = "none"
"""


def write_tiny_spec(
    directory: Path, name: str = "tiny", *, generations: int = 1, tracking: bool = False
) -> Path:
    """A small evolution spec: 1 train and 1 held-out user of `write_small_environment`."""
    directory.mkdir(parents=True, exist_ok=True)
    write_small_environment(directory / "small_env.json")
    path = directory / f"{name}.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            name = "{name}"
            seed = 0
            concurrency = 2

            [environment]
            file = "small_env.json"
            train_users = 1
            heldout_users = 1

            [policy]
            kind = "in_context"
            parameters = {{ update_every = 2, short_term_len = 2 }}

            [optimizer]
            schedule = "population"
            generations = {generations}
            reflection_minibatch_size = 1
            objective = "accuracy"
            mutate_components = ["use"]

            [tracking]
            enabled = {"true" if tracking else "false"}
            """
        ),
        encoding="utf-8",
    )
    return path


def cli_env(home: Path) -> dict[str, str]:
    """The environment of a CLI process whose caches live under `home`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["EVOLVE_CACHE_DIR"] = str(home / "cache")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def llm_flags(stub: StubServer) -> list[str]:
    return ["--base-url", stub.base_url, "--model", "stub", "--no-llm-cache"]


def start_cli(home: Path, *args: str) -> subprocess.Popen[str]:
    """`evolve ARGS` started in `home` (its current directory and cache location)."""
    home.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "evolve.cli", *args],
        cwd=home,
        env=cli_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return started(process)


def run_cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`evolve ARGS` run to its end in `home` (its current directory and cache location)."""
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "evolve.cli", *args],
        cwd=home,
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_timed(home: Path, *args: str) -> tuple[subprocess.Popen[str], list[tuple[float, str]]]:
    """The CLI run to its end, with each stderr line and the wall-clock time it was read."""
    process = start_cli(home, *args)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(timeout=10)
    return process, lines


def wait_for_requests(stub: StubServer, at_least: int, timeout: float = 60) -> int:
    """Block until the stub has served `at_least` chat requests; returns the count."""
    deadline = time.monotonic() + timeout
    while True:
        count = stub.stats()["chat_requests"]
        if count >= at_least:
            return count
        if time.monotonic() > deadline:
            raise TimeoutError(f"the stub saw only {count} chat requests in {timeout}s")
        time.sleep(0.05)


def run_in_process(home: Path, *args: str) -> int:
    """`evolve ARGS` in this process (no import cost), in `home` with its caches there."""
    from evolve.cli import main
    from evolve.core.paths import CACHE_DIR_ENV

    home.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get(CACHE_DIR_ENV)
    os.environ[CACHE_DIR_ENV] = str(home / "cache")
    try:
        with contextlib.chdir(home):
            return main(list(args))
    finally:
        if previous is None:
            os.environ.pop(CACHE_DIR_ENV, None)
        else:
            os.environ[CACHE_DIR_ENV] = previous


# The [environment] of a study spec over `write_tune_spec`'s env.json with one train user.
ONE_TRAIN_USER = 'file = "env.json"\ntrain_users = 1\nheldout_users = 1'


def tune_process(spec: Path, tmp_path: Path, stub: StubServer, *extra: str) -> subprocess.Popen:
    """`evolve tune SPEC` as its own process against the stub (no LLM cache, no tracking)."""
    command = [sys.executable, "-m", "evolve.cli", "tune", str(spec), "--no-progress"]
    command += ["--no-tracking", "--no-llm-cache", "--base-url", stub.base_url, "--model", "stub"]
    command += ["--runs-dir", str(tmp_path / "runs"), "--upper-bound-cache", str(tmp_path / "ub")]
    env = {**os.environ, "EVOLVE_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [*command, *extra],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return started(process)


def load_tune_study(tmp_path: Path) -> optuna.Study:
    """The study named "tune" in `tmp_path/optuna.db` (`write_tune_spec`'s default storage)."""
    return optuna.load_study(study_name="tune", storage=f"sqlite:///{tmp_path / 'optuna.db'}")


def running_trial(tmp_path: Path) -> optuna.trial.FrozenTrial | None:
    """The study's RUNNING trial, or None (also while the study does not exist yet)."""
    if not (tmp_path / "optuna.db").is_file():
        return None
    try:
        running = load_tune_study(tmp_path).get_trials(states=(TrialState.RUNNING,))
    except Exception:  # the study is not created yet (any storage error while it is made)
        return None
    return running[0] if running else None
