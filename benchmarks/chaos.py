"""Chaos benchmark: `kill -9` evolve eval / run / tune at random points, rerun, check the books.

Why one long file: a standalone benchmark script (only this file and the stub server);
splitting it would add an import path for no reuse.

For each command (`evolve eval`, `evolve run`, `evolve tune`, each a real subprocess
`python -m evolve.cli ...` against `benchmarks/stub_openai_server.py`):

1. **reference**: one uninterrupted run in its own directory; the stub's request count R is
   the size of the job.
2. **chaos**: in a fresh directory, N kill points are drawn with a seeded RNG from [1, R) as
   cumulative server-request counts; the k-th invocation is `kill -9`ed (its whole process
   group) when the stub has seen the k-th count (or, when the previous kill overshot it, its
   first request). Then the command is rerun until it completes.
3. **SIGINT**: in a fresh directory, the command is started, SIGINT is sent (to its process
   group, as a terminal's Ctrl-C does) once the stub has seen about a third of R, and the
   time until the process exits and its exit code are measured.

Checks, one PASS/FAIL line each (the script exits 1 if any fails):

- **results**: the chaos run's final results equal the reference's. Compared files, with
  spend, timing and location fields removed (`VOLATILE_KEYS`: wall times, usage, LLM calls,
  tokens, run directories, MLflow run ids, timestamps) and the scenario directory replaced by
  a placeholder:
  - eval: every policy directory's `report.json`, `upper_bound.json` and
    `users/*/period_*/result.json` (per-item choices, correctness, diagnosis, transcripts);
  - run: `runs/<name>/result.json` (every candidate record: lineage, mutation, instructions,
    parameters, status, train / held-out scores; every generation: population and best;
    the best id), plus each candidate's `policy/policy.json`;
  - tune: `runs/<name>/tuning.json` with finished trials keyed by their parameters
    (trial numbers, seeds and notes dropped: a trial retried after a kill legitimately gets
    a new number; failed and surplus trials are the kills' leftovers and are dropped), the
    best trial's parameters, the held-out records and the `complete` flag; plus every
    finished trial's and held-out check's `users/*/period_*/result.json`. The best trial is
    compared by its parameters: when trials tie (the stub makes them tie), which one is best
    must not depend on the trial numbers that kills shift.
- **ledger**: the command's durable spend ledger against the stub's server-side count of
  chat requests. The ledger's LLM calls are the HTTP requests it journaled as started before
  sending them: finished or failed ones plus those of unknown outcome (started, then the
  process was killed before it could record their end). What is checked, after every
  invocation and in total after all kills:

      server <= finished + unknown <= server + calls in flight at the kills

  The left side says no request the server received (and would bill) is missing from the
  books, retries included; the right side that the books hold at most the requests in
  flight at each kill beyond it (started but never received, or received while the killed
  process could no longer record the answer). The calls in flight at one kill are at most
  the concurrency (`CONCURRENCY`), the allowance per killed invocation; the stub's own
  in-flight count at each kill is printed too. The ledger is read with
  `evolve.tuning.recorded_spend(<run dir>)` for tune and
  `ExperimentDir(<run dir>).load_spend()` otherwise, where a `ledger*` or `spend*`
  (journal) file exists (`runs/<name>/` for run and tune, the `--out` directory for eval);
  a command without one prints "n/a" (not a failure: reported as missing).
- **mlflow dups**: MLflow runs per candidate (run) / per trial number (tune) and parent runs
  per experiment / study in the sqlite tracking DB must each be 1; eval does not track: n/a.
- **SIGINT**: the process exits within one call's latency + 2 s, with exit code 130, and no
  request reaches the server after it has exited; the detail also says whether a request
  arrived after the signal (the stub's `last_chat_arrival`).
- **replay** (eval, response cache on): the issue of a cache that replays a broken server. In
  a fresh directory, `evolve eval` runs against a stub whose every answer is not JSON; then
  its output directory is removed (its caches are kept) and it runs again against a healthy
  stub on another port under the same model name, with `--refresh-upper-bound`. Passes when
  the healthy stub was asked at least one request per upper-bound question, the upper bound
  has no unparseable answer, and its entries (question, variant, choice, correctness) equal
  the cold reference's.

The stub answers every call with minimal valid JSON after `--latency` seconds, so outputs are
deterministic. `--llm-cache` chooses whether the phases run with DSPy's response cache off
(`--no-llm-cache`: the server count is the true number of calls), on (rows `<command>+cache`:
each scenario starts with a cold cache; a rerun after a kill is served what the killed
invocations stored, so the results check also says that replayed answers change nothing, and
the ledger counts only the calls that reached the server, as the stub does) or both (the
default). Every scenario has its own `EVOLVE_CACHE_DIR` (DSPy cache, upper-bound cache).
Tune gets a short `[tuning] heartbeat_grace_s` when `evolve.tuning` knows the key (so a rerun
fails the killed trial and retries it); without it the rerun cannot take over the killed
trial and the script says so.

    python benchmarks/chaos.py                 # 20 kills for each command, cache off and on
    python benchmarks/chaos.py --kills 2 --only eval --llm-cache on
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STUB_SCRIPT = REPO / "benchmarks" / "stub_openai_server.py"
COMMANDS = ("eval", "run", "tune")
CONCURRENCY = 2  # LLM calls in flight (users, questions, probes share them)
INVOCATION_TIMEOUT_S = 300.0
# A killed client's last requests may reach the stub this long after nothing is in flight.
SETTLE_S = 0.5
SIGINT_GRACE_S = 2.0
MAX_COMPLETION_RERUNS = 3
HEARTBEAT_GRACE_S = 3  # a killed trial is failed and retried by the first rerun after this
VOLATILE_KEYS = frozenset(
    {
        "wall_time_s",
        "usage",
        "llm_calls",
        "tokens",
        "cache_hits",
        "reflection_calls",
        "reflection_tokens",
        "run_dir",
        "mlflow_run_id",
        "started_at",
        "finished_at",
        "created_at",
        "timestamp",
        "duration_s",
        "latency_s",
    }
)

sys.path.insert(0, str(REPO))

_PR_SET_PDEATHSIG = 1
_LIBC = (
    ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None
)


def _die_with_this_script() -> None:
    """Run in each child before exec (Linux): SIGKILL it when this script dies, even by
    `kill -9` (e.g. a test's timeout), so no stub or evolve process outlives it."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# ----- the stub server ------------------------------------------------------------------------


def _load_stub_module() -> Any:
    """The stub script as a module (benchmarks/ is not a package): one launcher, its own."""
    name = "stub_openai_server"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, STUB_SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before exec: dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


class Stub(_load_stub_module().StubServer):
    """The stub server in its own process (its stderr to `log`, killed with this script),
    plus what the chaos checks read: the request count once nothing is in flight."""

    def __init__(self, latency: float, log: Path) -> None:
        super().__init__(latency=latency, stderr=log, preexec_fn=_die_with_this_script)
        self.start()

    def chat_requests(self) -> int:
        return int(self.stats()["chat_requests"])

    def drain(self) -> int:
        """The chat-request count once it has settled: nothing in flight and no new request
        for `SETTLE_S`. A killed client's requests are still being served until the stub
        tries to answer them, and some are still on their way when nothing is in flight (in
        the listen backlog, or accepted with the body not yet read: the stub counts a request
        once it has read it). Counted before they arrive, they were charged to the next
        invocation, which then showed more requests at the server than it journaled."""
        deadline = time.monotonic() + self.latency + 5
        count, settled_since = -1, time.monotonic()
        while True:
            stats = self.stats()
            now = time.monotonic()
            if int(stats["chat_requests"]) != count:
                count, settled_since = int(stats["chat_requests"]), now
            if (stats["in_flight"] == 0 and now - settled_since >= SETTLE_S) or now > deadline:
                return count
            time.sleep(0.02)


# ----- the scenario: one command in one directory ----------------------------------------------


@dataclass
class Invocation:
    code: int | None
    seconds: float
    log: Path
    killed: bool = False
    # The stub's chat requests in flight just after the signal, and when it was sent.
    in_flight_at_signal: int = 0
    signalled_wall: float | None = None

    @property
    def summary(self) -> str:
        """Its error / note line if it printed one, else its last lines (and the log's path)."""
        return f"{_summary(self.log)} (log: {self.log})"


@dataclass
class Scenario:
    """One command run in its own directory (runs, caches, MLflow DB, study storage)."""

    command: str
    root: Path
    env_file: Path
    stub: Stub
    heartbeat_key: bool
    log_index: int = 0
    llm_cache: bool = False  # DSPy's response cache on (each scenario has its own)
    extra_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.command in ("run", "tune"):
            self.spec = self.root / f"{self.command}.toml"
            self.spec.write_text(self._spec_text(), encoding="utf-8")

    # -- the command line ------------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"chaos-{self.command}"

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"

    @property
    def run_dir(self) -> Path:
        """Where the results (and a ledger, if the command keeps one) live."""
        if self.command == "eval":
            return self.root / "eval"
        return self.root / "runs" / self.name

    def argv(self) -> list[str]:
        llm = ["--base-url", self.stub.base_url, "--model", "stub"]
        llm += [*([] if self.llm_cache else ["--no-llm-cache"]), *self.extra_args]
        if self.command == "eval":
            return [
                *("eval", "--env", str(self.env_file), "--policy", "in_context"),
                *("--concurrency", str(CONCURRENCY), "--out", str(self.run_dir), *llm),
            ]
        return [
            *(self.command, str(self.spec), "--runs-dir", str(self.root / "runs")),
            *("--tracking-uri", self.tracking_uri, "--no-progress", *llm),
        ]

    def _spec_text(self) -> str:
        common = f"""
            name = "{self.name}"
            seed = 0
            concurrency = {CONCURRENCY}

            [environment]
            file = "{self.env_file}"
            train_users = 1
            heldout_users = 1

            [policy]
            kind = "in_context"
            parameters = {{ update_every = 2, short_term_len = 4 }}

            [tracking]
            tracking_uri = "{self.tracking_uri}"
        """
        if self.command == "run":
            return textwrap.dedent(common) + textwrap.dedent(
                """
                [optimizer]
                generations = 2
                reflection_minibatch_size = 1
                objective = "accuracy"
                mutate_components = ["write.types_to_remember", "use"]
                max_feedback_failures = 2
                max_feedback_chars = 600

                [optimizer.parameters]
                update_every = { low = 1, high = 4 }
                """
            )
        grace = f"heartbeat_grace_s = {HEARTBEAT_GRACE_S}" if self.heartbeat_key else ""
        tuning = f"""
            [tuning]
            sampler = "grid"
            trials = 4
            objectives = ["accuracy"]
            heldout = "best"
            storage = "sqlite:///{self.root / "optuna.db"}"
            {grace}

            [tuning.parameters]
            update_every = [2, 4]
            short_term_len = [0, 4]
        """
        return textwrap.dedent(common) + textwrap.dedent(tuning)

    def process_env(self) -> dict[str, str]:
        cache = self.root / "cache"
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            "EVOLVE_CACHE_DIR": str(cache),
            "DSPY_CACHEDIR": str(cache / "dspy"),
            "PYTHONUNBUFFERED": "1",
        }

    # -- running it ------------------------------------------------------------------------

    def start(self) -> tuple[subprocess.Popen[bytes], Path]:
        self.log_index += 1
        log = self.root / "logs" / f"{self.log_index:03d}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as handle:
            process = subprocess.Popen(
                [sys.executable, "-m", "evolve.cli", *self.argv()],
                cwd=self.root,
                env=self.process_env(),
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: signals reach it as a whole
                preexec_fn=_die_with_this_script,
            )
        return process, log

    def invoke(
        self, until: Callable[[], bool] | None = None, sig: int = signal.SIGKILL
    ) -> Invocation:
        """Run once; when `until()` turns true first, send `sig` to the process group and
        time how long the process takes to exit after it."""
        process, log = self.start()
        started = time.monotonic()
        signalled_at: float | None = None
        signalled_wall: float | None = None
        in_flight = 0
        while process.poll() is None:
            now = time.monotonic()
            if now - started > INVOCATION_TIMEOUT_S or (
                signalled_at is not None and now - signalled_at > 60
            ):
                _signal_group(process, signal.SIGKILL)
                process.wait()
                return Invocation(None, now - started, log, killed=True)
            if signalled_at is None and until is not None and until():
                signalled_wall = time.time()
                _signal_group(process, sig)
                signalled_at = time.monotonic()
                # Answers to a killed client are still being served: in flight at the kill.
                in_flight = int(self.stub.stats()["in_flight"])
            time.sleep(0.01)
        ended = time.monotonic()
        if sig == signal.SIGKILL and signalled_at is not None:
            _signal_group(process, signal.SIGKILL)  # anything it left behind
        return Invocation(
            process.returncode,
            ended - (signalled_at if signalled_at is not None else started),
            log,
            killed=signalled_at is not None,
            in_flight_at_signal=in_flight,
            signalled_wall=signalled_wall,
        )

    def complete(self) -> bool:
        if self.command == "eval":
            return (self.run_dir / "in_context" / "report.json").is_file()
        result = self.run_dir / ("result.json" if self.command == "run" else "tuning.json")
        return result.is_file() and bool(_read_json(result).get("complete"))

    # -- what it recorded ------------------------------------------------------------------

    def ledger_calls(self) -> int | None:
        """LLM calls in the command's durable spend ledger (`ledger.json` and, where the
        checkout journals spend, its journal `spend.jsonl`); None when it keeps none."""
        spend = self._ledger()
        if spend is None:
            return None
        # `requests` since spend is a `Usage`; a checkout from before names them `llm_calls`.
        fields = getattr(type(spend), "model_fields", {})
        return int(spend.requests if "requests" in fields else spend.llm_calls)

    def ledger_unknown(self) -> int:
        """Of the ledger's calls, those started with no outcome recorded (0 for a checkout
        whose ledger does not tell)."""
        spend = self._ledger()
        return int(getattr(spend, "unknown_outcome", 0) or 0)

    def _ledger(self) -> Any:
        if not any(self.run_dir.glob("ledger*")) and not any(self.run_dir.glob("spend*")):
            return None
        if self.command == "tune":
            # Per-trial and per-process journals under spend/<study>/ (evolve.tuning.spend).
            from evolve.tuning import recorded_spend

            return recorded_spend(self.run_dir)
        from evolve.optimize.experiment_dir import ExperimentDir

        return ExperimentDir(self.run_dir).load_spend()

    def results(self) -> Any:
        """The result files that matter, normalized (see the module docstring)."""
        if self.command == "eval":
            files = {}
            for path in sorted(self.run_dir.rglob("*.json")):
                relative = path.relative_to(self.run_dir)
                if relative.name in ("report.json", "upper_bound.json") or (
                    relative.name == "result.json" and "users" in relative.parts
                ):
                    files[str(relative)] = _read_json(path)
            return self._normalize(files)
        if self.command == "run":
            files = {"result.json": _read_json(self.run_dir / "result.json")}
            for path in sorted(self.run_dir.glob("candidates/*/policy/policy.json")):
                files[str(path.relative_to(self.run_dir))] = _read_json(path)
            return self._normalize(files)
        result = _read_json(self.run_dir / "tuning.json")
        outcome = _tuning_outcome(result)
        # Each finished trial's and held-out check's per-period results, keyed by parameters
        # (a retried trial resumes the killed one's directory under another number).
        units = {}
        for record in [*result["trials"], *result.get("heldout", [])]:
            if record.get("state", "complete") in ("complete", "pruned") and record["run_dir"]:
                label = f"{record.get('label', 'trial')} {_parameter_key(record['parameters'])}"
                directory = self.run_dir / record["run_dir"]
                units[label] = {
                    str(path.relative_to(directory)): _read_json(path)
                    for path in sorted(directory.glob("users/*/period_*/result.json"))
                }
        outcome["unit_results"] = dict(sorted(units.items()))
        return self._normalize(outcome)

    def _normalize(self, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: self._normalize(v) for k, v in data.items() if k not in VOLATILE_KEYS}
        if isinstance(data, list):
            return [self._normalize(v) for v in data]
        if isinstance(data, str):
            return data.replace(str(self.root), "<scenario>")
        return data

    def mlflow_duplicates(self) -> tuple[int, str] | None:
        """(duplicate runs, detail); None for a command that does not track."""
        if self.command == "eval":
            return None
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.tracking_uri)
        experiments = [e.experiment_id for e in client.search_experiments()]
        runs = list(_all_runs(client, experiments))
        if self.command == "run":
            parents = Counter(
                r.data.tags.get("evolve.experiment")
                for r in runs
                if r.data.tags.get("evolve.kind") == "experiment"
            )
            children = Counter(
                r.data.tags.get("evolve.candidate_id")
                for r in runs
                if r.data.tags.get("evolve.kind") == "candidate"
            )
            unit = "candidate"
        else:
            parents = Counter(
                r.data.tags.get("evolve.study")
                for r in runs
                if r.data.tags.get("evolve.kind") == "tuning"
            )
            children = Counter(
                r.data.tags.get("evolve.trial")
                for r in runs
                if r.data.tags.get("evolve.kind") == "trial"
            )
            unit = "trial"
        duplicates = sum(n - 1 for n in parents.values()) + sum(n - 1 for n in children.values())
        repeated = sorted(k for k, n in children.items() if n > 1)
        detail = f"{len(parents)} parent / {len(children)} {unit} runs" + (
            f"; repeated {unit}s {repeated}" if repeated else ""
        )
        if not parents:
            duplicates, detail = 1, "no parent run found in the tracking DB"
        return duplicates, detail


def _all_runs(client: Any, experiment_ids: list[str]) -> Iterator[Any]:
    token = None
    while True:
        page = client.search_runs(experiment_ids, max_results=1000, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def _tuning_outcome(result: dict[str, Any]) -> dict[str, Any]:
    """A tuning result without what a retried trial legitimately changes (numbers, seeds)."""
    trials = {t["number"]: t for t in result["trials"]}
    key = _parameter_key
    finished = {
        key(t["parameters"]): {
            k: v
            for k, v in t.items()
            if k not in ("number", "seed", "note", "parameters") and k not in VOLATILE_KEYS
        }
        for t in result["trials"]
        if t["state"] in ("complete", "pruned")
    }
    return {
        "finished_trials": dict(sorted(finished.items())),
        "best": sorted(key(trials[n]["parameters"]) for n in result.get("best", [])),
        "heldout": [
            {k: v for k, v in h.items() if k != "trial" and k not in VOLATILE_KEYS}
            for h in result.get("heldout", [])
        ],
        "complete": result.get("complete"),
        "requested_trials": result.get("requested_trials"),
        "space": result.get("space"),
    }


def _parameter_key(parameters: dict[str, int]) -> str:
    return ",".join(f"{name}={value}" for name, value in sorted(parameters.items()))


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it already exited
        os.killpg(process.pid, sig)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


_TELLING = re.compile(r"^(evolve: |note: |warning: |\w+(Error|Exception|Interrupt)\b)")


def _summary(log: Path) -> str:
    """What a command said last that explains its exit: its last error / note / warning
    line, else its last line (progress-bar redraws removed)."""
    text = _ANSI.sub("", log.read_text(encoding="utf-8", errors="replace"))
    lines = [line.strip() for line in re.split(r"[\r\n]+", text) if line.strip()]
    telling = [line for line in lines if _TELLING.match(line)]
    return ((telling or lines or ["(no output)"])[-1])[:300]


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two JSON values first differ (for a one-line FAIL reason)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}/{key}: only in {'chaos' if key in a else 'reference'}"
            found = _first_difference(a[key], b[key], f"{path}/{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} entries"
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, y, f"{path}[{index}]")
            if found:
                return found
        return None
    return None if a == b else f"{path}: {str(a)[:60]!r} vs {str(b)[:60]!r}"


# ----- one command: reference, chaos, SIGINT ---------------------------------------------------


@dataclass
class Check:
    name: str
    passed: bool | None  # None: not applicable (n/a)
    shown: str
    detail: str = ""


@dataclass
class Outcome:
    command: str
    llm_cache: bool = False
    reference_calls: int | None = None
    kills: int = 0
    invocations: int = 0
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The report's row, and the scenarios' directory under the work directory."""
        return f"{self.command}+cache" if self.llm_cache else self.command


def _heartbeat_key(command: str) -> bool:
    """Whether this checkout's study specs accept `[tuning] heartbeat_grace_s`."""
    if command != "tune":
        return False
    from evolve.tuning.spec import TuningSpec

    return "heartbeat_grace_s" in TuningSpec.model_fields


def chaos_phase(
    command: str,
    workdir: Path,
    env_file: Path,
    kills: int,
    seed: int,
    latency: float,
    llm_cache: bool = False,
) -> Outcome:
    """The reference run, then the killed-and-rerun one (results, ledger, MLflow checks)."""
    heartbeat_key = _heartbeat_key(command)
    outcome = Outcome(command, llm_cache)
    if command == "tune" and not heartbeat_key:
        outcome.notes.append(
            "evolve.tuning has no [tuning] heartbeat_grace_s yet: the spec goes without it "
            "(a killed trial stays RUNNING for the default grace)"
        )
    home = workdir / outcome.label
    stub = Stub(latency, home / "stub.log")
    try:
        reference = Scenario(
            command, home / "reference", env_file, stub, heartbeat_key, llm_cache=llm_cache
        )
        before = stub.chat_requests()
        finished = reference.invoke()
        outcome.reference_calls = stub.drain() - before
        if finished.code != 0 or not reference.complete():
            outcome.checks.append(
                Check("reference", False, "ERROR", f"exit {finished.code}: {finished.summary}")
            )
            return outcome
        print(
            f"[{outcome.label}] reference: {outcome.reference_calls} LLM calls, "
            f"{finished.seconds:.1f}s; ledger {_shown(reference.ledger_calls())}",
            flush=True,
        )
        chaos = Scenario(
            command, home / "chaos", env_file, stub, heartbeat_key, llm_cache=llm_cache
        )
        rng = random.Random(f"{seed}:{command}")
        _run_chaos(outcome, chaos, reference, outcome.reference_calls, kills, rng)
    finally:
        stub.stop()
    return outcome


def sigint_phase(outcome: Outcome, workdir: Path, env_file: Path, latency: float) -> None:
    """Ctrl-C in the middle of a fresh run: time to exit and exit code."""
    if outcome.reference_calls is None:
        return
    stub = Stub(latency, workdir / outcome.label / "stub_sigint.log")
    try:
        scenario = Scenario(
            outcome.command,
            workdir / outcome.label / "sigint",
            env_file,
            stub,
            _heartbeat_key(outcome.command),
            llm_cache=outcome.llm_cache,
        )
        _run_sigint(outcome, scenario, outcome.reference_calls)
    finally:
        stub.stop()


def _shown(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def _run_chaos(
    outcome: Outcome,
    scenario: Scenario,
    reference: Scenario,
    total: int,
    kills: int,
    rng: random.Random,
) -> None:
    stub = scenario.stub
    base = stub.chat_requests()
    targets = sorted(rng.randint(1, max(1, total - 1)) for _ in range(kills))
    # (server count, ledger calls, calls allowed in flight at its kill, stub's in-flight)
    ledger_rows: list[tuple[int, int | None, int, int]] = [(0, scenario.ledger_calls(), 0, 0)]
    failure: str | None = None
    stuck = 0
    index = 0
    while index < len(targets):
        start_count = stub.chat_requests() - base
        target = max(targets[index], start_count + 1)
        invocation = scenario.invoke(until=lambda t=target: stub.chat_requests() - base >= t)
        outcome.invocations += 1
        served = stub.drain() - base
        allowed = CONCURRENCY if invocation.killed else 0
        ledger_rows.append(
            (served, scenario.ledger_calls(), allowed, invocation.in_flight_at_signal)
        )
        if invocation.killed and invocation.code is None:
            failure = f"an invocation hung: {invocation.summary}"
            break
        if invocation.killed:
            outcome.kills += 1
            index += 1
            stuck = 0
            continue
        # It exited by itself before its kill point.
        if invocation.code != 0:
            failure = f"exit {invocation.code} before its kill point: {invocation.summary}"
            break
        if scenario.complete():
            outcome.notes.append(
                f"finished after {outcome.kills} of {kills} kills (server count {served}, "
                f"kill point {target})"
            )
            break
        stuck += 1
        if stuck >= MAX_COMPLETION_RERUNS:
            failure = f"{stuck} reruns in a row exited 0 without finishing: {invocation.summary}"
            break
    if failure is None and not scenario.complete():
        for _ in range(MAX_COMPLETION_RERUNS):
            invocation = scenario.invoke()
            outcome.invocations += 1
            ledger_rows.append((stub.drain() - base, scenario.ledger_calls(), 0, 0))
            if invocation.code != 0:
                failure = f"rerun exit {invocation.code}: {invocation.summary}"
                break
            if scenario.complete():
                break
        else:
            failure = (
                f"{MAX_COMPLETION_RERUNS} reruns after the kills exited 0 without finishing: "
                f"{invocation.summary}"
            )
    print(
        f"[{outcome.label}] chaos: {outcome.kills} kills, {outcome.invocations} invocations, "
        f"server saw {ledger_rows[-1][0]} calls (reference {total})",
        flush=True,
    )
    if failure is not None:
        outcome.checks.append(Check("results", False, "FAIL", failure))
    else:
        difference = _first_difference(scenario.results(), reference.results())
        outcome.checks.append(
            Check(
                "results",
                difference is None,
                "identical" if difference is None else "DIFFER",
                difference or "final results equal the uninterrupted reference",
            )
        )
    outcome.checks.append(
        ledger_check(scenario.command, ledger_rows, outcome.kills, scenario.ledger_unknown())
    )
    duplicates = scenario.mlflow_duplicates()
    if duplicates is None:
        outcome.checks.append(Check("mlflow dups", None, "n/a", "eval does not track in MLflow"))
    else:
        count, detail = duplicates
        if failure is not None:
            detail += " (the run did not finish)"
        outcome.checks.append(Check("mlflow dups", count == 0, str(count), detail))


def ledger_check(
    command: str, rows: list[tuple[int, int | None, int, int]], kills: int, unknown: int
) -> Check:
    """server <= finished + unknown <= server + in flight at the kills, per invocation and in
    total (see the module docstring); `rows` are cumulative after each invocation."""
    if rows[-1][1] is None:
        return Check("ledger", None, "n/a", f"`evolve {command}` keeps no spend ledger")
    previous_server = previous_ledger = 0
    violations = []
    allowance = seen_in_flight = 0
    for index, (server, recorded, allowed, in_flight) in enumerate(rows[1:], start=1):
        ledger = recorded or 0  # no ledger file yet: nothing recorded
        extra = (ledger - previous_ledger) - (server - previous_server)
        if not 0 <= extra <= allowed:
            violations.append(f"invocation {index}: {extra:+d} (allowed 0..{allowed})")
        allowance += allowed
        seen_in_flight += in_flight
        previous_server, previous_ledger = server, ledger
    server, ledger = rows[-1][0], rows[-1][1] or 0
    holds = server <= ledger <= server + allowance
    passed = holds and not violations
    return Check(
        "ledger",
        passed,
        f"{ledger}/{server} (+{ledger - server})",
        f"server {server} <= finished {ledger - unknown} + unknown {unknown} = {ledger} <= "
        f"server + in flight at the {kills} "
        f"kills {server + allowance} (at most {CONCURRENCY} a kill; the stub saw "
        f"{seen_in_flight} in flight at the kills): {'holds' if holds else 'VIOLATED'}"
        + (f"; per invocation: {', '.join(violations)}" if violations else ""),
    )


def _run_sigint(outcome: Outcome, scenario: Scenario, total: int) -> None:
    stub = scenario.stub
    base = stub.chat_requests()
    wanted = max(3, total // 3)
    invocation = scenario.invoke(
        until=lambda: stub.chat_requests() - base >= wanted, sig=signal.SIGINT
    )
    after_exit = stub.drain()
    time.sleep(min(1.0, stub.latency * 5))
    later = stub.chat_requests()
    limit = stub.latency + SIGINT_GRACE_S
    if not invocation.killed:
        outcome.checks.append(
            Check("sigint", False, "?", f"exited (code {invocation.code}) before SIGINT was sent")
        )
        return
    if invocation.code is None:
        outcome.checks.append(
            Check("sigint", False, ">60s", f"still running 60 s after SIGINT: {invocation.summary}")
        )
        return
    passed = invocation.seconds <= limit and invocation.code == 130 and later == after_exit
    last_arrival = stub.stats().get("last_chat_arrival")
    late = (
        last_arrival is not None
        and invocation.signalled_wall is not None
        and last_arrival > invocation.signalled_wall
    )
    arrival = (
        f"a request arrived {last_arrival - invocation.signalled_wall:.3f}s after the signal"
        if late
        else "no request arrived after the signal"
    )
    outcome.checks.append(
        Check(
            "sigint",
            passed,
            f"{invocation.seconds:.2f}s ({invocation.code})",
            f"exited {invocation.seconds:.2f}s after SIGINT with code {invocation.code} "
            f"(allowed: <= {limit:.2f}s, code 130); server calls after exit: "
            f"{later - after_exit}; {arrival}; last output: {invocation.summary}",
        )
    )


def replay_phase(outcome: Outcome, workdir: Path, env_file: Path, latency: float) -> None:
    """A broken server, then a healthy one under the same name: the upper bound must be asked
    of the healthy one, not replayed from the response cache (see the module docstring)."""
    reference_file = workdir / outcome.label / "reference" / "eval" / "in_context"
    reference_file /= "upper_bound.json"
    if outcome.command != "eval" or not outcome.llm_cache or not reference_file.is_file():
        return
    expected = _read_json(reference_file)["entries"]
    root = workdir / outcome.label / "replay"
    broken = Stub(latency, root / "stub_broken.log")
    try:
        broken.set_fault("non_json")
        scenario = Scenario("eval", root, env_file, broken, False, llm_cache=True)
        first = scenario.invoke()
    finally:
        broken.stop()
    if first.code != 0:
        outcome.checks.append(
            Check(
                "replay",
                False,
                "ERROR",
                f"the broken-server run: exit {first.code}: {first.summary}",
            )
        )
        return
    shutil.rmtree(scenario.run_dir)  # its results go; the response and upper-bound caches stay
    healthy = Stub(latency, root / "stub_healthy.log")
    try:
        scenario.stub = healthy
        scenario.extra_args = ["--refresh-upper-bound"]
        second = scenario.invoke()
        asked = healthy.drain()
    finally:
        healthy.stop()
    table_file = scenario.run_dir / "in_context" / "upper_bound.json"
    if second.code != 0 or not table_file.is_file():
        outcome.checks.append(
            Check(
                "replay",
                False,
                "ERROR",
                f"the healthy-server run: exit {second.code}: {second.summary}",
            )
        )
        return
    entries = _read_json(table_file)["entries"]
    unparsed = sum(bool(entry["parse_failed"]) for entry in entries.values())
    difference = _first_difference(entries, expected)
    passed = asked >= len(expected) and unparsed == 0 and difference is None
    outcome.checks.append(
        Check(
            "replay",
            passed,
            f"{asked} asked",
            f"after a run against a non-JSON server, the healthy server got {asked} requests "
            f"(at least {len(expected)} upper-bound questions expected), {unparsed} "
            f"upper-bound answers unparseable; entries "
            + ("equal the reference's" if difference is None else f"differ: {difference}"),
        )
    )


# ----- the report ----------------------------------------------------------------------------


CHECK_NAMES = ("results", "ledger", "mlflow dups", "sigint", "replay")


def print_report(outcomes: list[Outcome]) -> bool:
    header = (
        f"{'command':<11} {'kills':>5} {'runs':>5} {'results':>10} {'ledger/server':>22} "
        f"{'mlflow dups':>11} {'SIGINT stop':>14}"
    )
    print()
    print(header)
    print("-" * len(header))
    for outcome in outcomes:
        shown = {check.name: check.shown for check in outcome.checks}
        if "reference" in shown:
            print(f"{outcome.label:<11} reference run failed")
            continue
        print(
            f"{outcome.label:<11} {outcome.kills:>5} {outcome.invocations:>5} "
            f"{shown.get('results', '-'):>10} {shown.get('ledger', '-'):>22} "
            f"{shown.get('mlflow dups', '-'):>11} {shown.get('sigint', '-'):>14}"
        )
    print()
    all_passed = True
    for outcome in outcomes:
        for check in outcome.checks:
            verdict = "n/a " if check.passed is None else ("PASS" if check.passed else "FAIL")
            all_passed &= check.passed is not False
            print(f"{verdict} {outcome.label} {check.name}: {check.detail}")
        for note in outcome.notes:
            print(f"note {outcome.label}: {note}")
    return all_passed


def synthesize_environment(workdir: Path) -> Path:
    env_file = workdir / "env.json"
    subprocess.run(
        [sys.executable, "-m", "evolve.cli", "env", "synthesize", "--preset", "tiny"]
        + ["--seed", "0", "--users", "2", "--out", str(env_file)],
        check=True,
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
    )
    return env_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20, help="kill -9 points per command (20)")
    parser.add_argument(
        "--only", choices=COMMANDS, action="append", help="only this command (repeatable)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill points (0)")
    parser.add_argument("--latency", type=float, default=0.05, help="stub seconds per call")
    parser.add_argument(
        "--jobs",
        type=int,
        default=len(COMMANDS),
        help="commands whose kill phases run at once (default: all); the SIGINT timings "
        "always run one at a time",
    )
    parser.add_argument("--workdir", type=Path, help="keep everything here (default: a temp dir)")
    parser.add_argument(
        "--llm-cache",
        choices=("off", "on", "both"),
        default="both",
        help="DSPy's response cache in every phase: off, on (adds the replay check), or both "
        "(default)",
    )
    args = parser.parse_args(argv)
    if args.kills < 0 or args.jobs < 1:
        parser.error(f"--kills must be >= 0 and --jobs >= 1, got {args.kills} and {args.jobs}")
    commands = list(dict.fromkeys(args.only or COMMANDS))
    caches = {"off": [False], "on": [True], "both": [False, True]}[args.llm_cache]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="evolve-chaos-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # The result readers' imports, done once before any thread (and only those needed).
    if {"run", "tune"} & set(commands):
        import mlflow.tracking  # noqa: F401

        import evolve.optimize.experiment_dir  # noqa: F401
    if "tune" in commands:
        import evolve.tuning.spec  # noqa: F401

    try:
        env_file = synthesize_environment(workdir)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [
                pool.submit(
                    chaos_phase,
                    command,
                    workdir,
                    env_file,
                    args.kills,
                    args.seed,
                    args.latency,
                    llm_cache,
                )
                for llm_cache in caches
                for command in commands
            ]
            outcomes = [future.result() for future in futures]
        for outcome in outcomes:
            sigint_phase(outcome, workdir, env_file, args.latency)
            replay_phase(outcome, workdir, env_file, args.latency)
        passed = print_report(outcomes)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{'PASS' if passed else 'FAIL'} in {time.monotonic() - started:.0f}s")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
