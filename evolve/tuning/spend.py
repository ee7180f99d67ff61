"""The spend ledger of a tuning study: every LLM request, journaled before it is sent.

Why not the trial attributes alone: a worker writes a trial's calls and tokens to Optuna
when the trial ends, so a `kill -9` mid-trial loses the spend of the killed trial, and a
budget summed from the attributes under-counts real spend by every killed trial. Instead,
each request appends one flushed line to a journal file (the `SpendJournal` of `evolve
run`, written by the same `evolve.results.budget.SpendListener`) before it is sent, and another
when it ends, so after any crash the study's recorded spend holds every request the server
received, plus at most those in flight at the crash (reported as of unknown outcome).

Layout under the tuning run directory `runs/<name>/` (`<study>` is the study name made
file-system safe, `evolve.core.files.safe_name`)::

    spend/<study>/trial-NNNN.jsonl           calls made while trial NNNN ran (written by
                                             the one process that ran it; a retried trial
                                             has a new number, hence its own file)
    spend/<study>/main.jsonl                 calls of main invocations outside trials
                                             (upper bound, held-out checks)
    spend/<study>/worker-<host>-<pid>.jsonl  calls of a `--worker` outside trials

Every file holds the JSON lines of `evolve.results.budget.SpendJournal` (`wall_s`: seconds since
the file's writer attached it): each HTTP request as started before it is sent and as
finished or failed after, each completed call with its tokens. A line torn by a kill is
skipped. The study's spend is the sum over all files: LLM calls = requests started (retries,
failed requests and those of unknown outcome included; calls of older journals without
request lines count one each unless served from DSPy's cache), tokens = the sum of
"prompt" + "completion". Trials finished before journals existed
(no file of their number) add the `evolve.llm_calls` / `evolve.tokens` attributes they
hold in Optuna. A reader without the toolkit (e.g. `benchmarks/chaos.py`) may sum the
lines itself, or call `recorded_spend(runs/<name>)`.

Journals are keyed by trial number, not by invocation, so a retried trial never counts
the calls of the trial it retries a second time, and the killed trial's own calls stay
counted: they were paid. A study deleted and created again under the same name in the
same run directory keeps the old study's spend for the same reason; delete
`spend/<study>/` (with `trials/<study>/`) to start its ledger over. An in-memory study (no
storage: the candidate tuning inside `evolve run`) keeps no journal; the experiment's own
journal records its calls.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from evolve.core.files import safe_name
from evolve.llm.usage import Usage, UsageTracker
from evolve.results.budget import Budget, SpendJournal, SpendListener
from evolve.simulator.run_dir import read_record
from evolve.tuning.records import TrialRecord

SPEND_DIR = "spend"
MAIN_JOURNAL = "main.jsonl"
_TRIAL_PREFIX = "trial-"
_CARRIED_STATES = ("complete", "pruned", "failed")


class StudySpendJournals:
    """The journal files of one study under a tuning run directory (see the layout above)."""

    def __init__(self, run_dir: str | Path, study_name: str) -> None:
        self.directory = Path(run_dir) / SPEND_DIR / safe_name(study_name)

    def trial_journal(self, number: int) -> SpendJournal:
        return SpendJournal(self.directory / f"{_TRIAL_PREFIX}{number:04d}.jsonl")

    def process_journal(self, *, worker: bool) -> SpendJournal:
        if not worker:
            return SpendJournal(self.directory / MAIN_JOURNAL)
        host = safe_name(socket.gethostname())
        return SpendJournal(self.directory / f"worker-{host}-{os.getpid()}.jsonl")

    def files(self) -> list[Path]:
        return sorted(self.directory.glob("*.jsonl")) if self.directory.is_dir() else []

    def listener(self, usage: UsageTracker, *, worker: bool) -> SpendListener:
        """A listener that journals to this process's file (opened on the first event: no
        empty files) outside `trial` blocks. Close it when the worker ends."""
        return SpendListener(usage, lambda: self.process_journal(worker=worker).open())

    @contextlib.contextmanager
    def trial(self, listener: SpendListener, number: int) -> Iterator[None]:
        """Journal the calls made inside the block to trial `number`'s file."""
        journal = self.trial_journal(number).open()  # exists even if no call is made
        try:
            with listener.redirect(journal):
                yield
        finally:
            journal.close()

    def trial_spend(self) -> dict[int, Usage]:
        """Spend per trial number, for every trial that has a journal."""
        spend: dict[int, Usage] = {}
        for path in self.files():
            number = path.stem.removeprefix(_TRIAL_PREFIX)
            if path.stem.startswith(_TRIAL_PREFIX) and number.isdigit():
                spend[int(number)] = SpendJournal(path).total()
        return spend

    def total(self, records: Iterable[TrialRecord] = ()) -> Usage:
        """LLM calls and tokens of every journal, plus those of trials in `records` that
        finished before journals existed. Wall time is not summed here: the writers overlap
        (workers run side by side), so it is the trials' own `wall_time_s`."""
        spent = Usage()
        journaled: set[int] = set()
        for path in self.files():
            spent = spent + SpendJournal(path).total()
            number = path.stem.removeprefix(_TRIAL_PREFIX)
            if path.stem.startswith(_TRIAL_PREFIX) and number.isdigit():
                journaled.add(int(number))
        for record in records:
            # Trials without a journal: their Optuna attributes (a queued retry copies the
            # attributes of the trial it retries, so only finished trials carry spend).
            if record.number not in journaled and record.state in _CARRIED_STATES:
                # Optuna holds the total only: counted as prompt tokens (see `Usage`).
                spent = spent + Usage(requests=record.llm_calls, prompt_tokens=record.tokens)
        return spent.model_copy(update={"wall_time_s": 0.0})


class StudyBudget(Budget):
    """The study's budget: calls and tokens of every worker and invocation, re-read from the
    journals at each check (other workers spend too); wall time is the trials' recorded
    wall time plus this invocation's."""

    def __init__(
        self,
        limits: Any,
        lms: Any,
        journals: StudySpendJournals,
        records: Iterable[TrialRecord],
    ) -> None:
        records = list(records)
        self.journals = journals
        self._carried = [r for r in records if r.state in _CARRIED_STATES]
        self._wall_before = sum(r.wall_time_s or 0.0 for r in records)
        self._wall_started = time.perf_counter()
        super().__init__(limits, lms, self.recorded())

    def recorded(self) -> Usage:
        return self.journals.total(self._carried)

    def spent(self) -> Usage:
        wall = self._wall_before + time.perf_counter() - self._wall_started
        return self.recorded().model_copy(update={"wall_time_s": wall})


def recorded_spend(run_dir: str | Path, study_name: str | None = None) -> Usage:
    """The LLM calls and tokens a tuning run directory has recorded for its study (every
    study under `spend/` when `study_name` is None and no `tuning.json` names it)."""
    from evolve.tuning.layout import RESULT_FILE
    from evolve.tuning.records import TuningResult

    run_dir = Path(run_dir)
    records: list[TrialRecord] = []
    result_file = run_dir / RESULT_FILE
    if result_file.is_file():
        result = read_record(result_file, TuningResult)
        if study_name is None or study_name == result.study_name:
            study_name = result.study_name
            records = result.trials
    if study_name is not None:
        return StudySpendJournals(run_dir, study_name).total(records)
    total = Usage()
    for directory in sorted((run_dir / SPEND_DIR).glob("*/")):
        total = total + StudySpendJournals(run_dir, directory.name).total()
    return total
