"""The commands' tqdm progress: the bar of the evaluation under way and the plain lines
above it (`CommandBars`, which `run` and `tune` extend with their outer bar), and the bars of
`evolve eval` (`EvalBars`).

Bars are drawn on a terminal only: redirected to a file or a pipe (CI logs, `nohup`), their
carriage returns and cursor moves would fill the log, so there the commands' plain lines
(stages, candidates, trials) are all that is written.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from tqdm import tqdm

from evolve.simulator.evaluation import ProgressSink
from evolve.simulator.metrics import MetricSummary

# Where no bar is drawn, a plain progress line at least this often (while calls go on).
HEARTBEAT_S = 60.0


def stderr_is_terminal() -> bool:
    """Whether stderr renders bars (a terminal), looked up at each call: tests and callers
    may replace `sys.stderr`."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # no stream, or a closed one
        return False


def make_bar(enabled: bool, **kwargs) -> tqdm:
    """A bar on stderr; disabled (draws nothing) unless wanted and stderr is a terminal."""
    drawn = enabled and stderr_is_terminal()
    return tqdm(disable=not drawn, file=sys.stderr, dynamic_ncols=True, **kwargs)


def kept_failed_units_line(units: int, answers: int, run_dir: Path) -> str:
    """The one line a resumed evaluation prints when it keeps earlier unparseable answers."""
    return (
        f"evolve: kept {units} finished user-period(s) of an earlier invocation in {run_dir} "
        f"with {answers} unparseable answer(s) (a broken endpoint or a weak model); they are "
        f"not asked again: delete {run_dir} (or use another output directory) to redo them"
    )


class EvaluationBar:
    """The second-line bar of the evaluation under way: its user-periods and LLM calls.

    One bar is reused for every evaluation of a command (a candidate, a trial, a held-out
    check); `sink(label)` gives the runner a `ProgressSink` that drives it.
    """

    def __init__(self, enabled: bool = True, heartbeat_s: float | None = None) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._bar: tqdm | None = None
        # Evaluations of one command resume one after another: the first says it, once
        # (not at all where the command said it already, for the whole run).
        self.kept_units_said = False
        # Where no bar is drawn (a log, a pipe): a plain line at least every `heartbeat_s`
        # while work goes on, so that a quiet log does not look like a hung run.
        self.heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
        self._label, self._total, self._done, self._initial, self._calls = "", 0, 0, 0, 0
        self._started = self._last_line = time.monotonic()

    def _heartbeat(self) -> None:
        """The evaluation's progress as a plain line, when no bar shows it and the last
        line is `heartbeat_s` old (called with the lock held)."""
        now = time.monotonic()
        if (self.enabled and stderr_is_terminal()) or now - self._last_line < self.heartbeat_s:
            return
        self._last_line = now
        done_here = self._done - self._initial
        left = ""
        if done_here > 0 and self._done < self._total:
            seconds = (now - self._started) / done_here * (self._total - self._done)
            left = f", about {seconds / 60:.0f} min left in this evaluation"
        print(
            f"    ... {self._label}: {self._done}/{self._total} user-periods, "
            f"{self._calls} LLM calls so far{left}",
            file=sys.stderr,
            flush=True,
        )

    def set_postfix(self, text: str) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.set_postfix_str(text, refresh=False)

    def sink(self, label: str) -> ProgressSink:
        owner = self

        class Sink(ProgressSink):
            def run_started(self, *, users: int, periods: int, finished_units: int) -> None:
                with owner._lock:
                    owner._label, owner._total = label, users * periods
                    owner._done = owner._initial = finished_units
                    owner._started = time.monotonic()
                    if owner._bar is not None:
                        owner._bar.close()
                    owner._bar = make_bar(
                        owner.enabled,
                        total=users * periods,
                        initial=finished_units,
                        desc=label,
                        unit="user-period",
                        position=1,
                        leave=False,
                    )

            def kept_failed_units(self, *, units: int, answers: int, run_dir: Path) -> None:
                with owner._lock:
                    if owner.kept_units_said:
                        return
                    owner.kept_units_said = True
                print(kept_failed_units_line(units, answers, run_dir), file=sys.stderr)

            def unit_finished(self, user_id: str, period_index: int, *, resumed: bool) -> None:
                if not resumed:
                    with owner._lock:
                        owner._done += 1
                        if owner._bar is not None:
                            owner._bar.update(1)
                        owner._heartbeat()

            def llm_calls(self, total: int) -> None:
                owner.set_postfix(f"{total} LLM calls")
                with owner._lock:
                    owner._calls = total
                    owner._heartbeat()

            def period_finished(self, period_index: int, summary: MetricSummary) -> None:
                pass

        return Sink()

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None


class CommandBars:
    """What the bars of `run` and `tune` share: plain lines on stderr and the evaluation bar.

    A command adds its outer bar (generations, trials) and the lines of its own events, and
    mixes in the progress interface of its loop (`LoopProgress`, `TuneProgress`).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.evaluation = EvaluationBar(enabled)
        self._stage_lock = threading.Lock()
        self._stage_line_at = time.monotonic()

    def _write(self, text: str) -> None:
        """A plain line on stderr; above the bars when they are drawn. --no-progress hides
        the bars only: a long command still says what it is doing, one line per step."""
        if self.enabled:
            tqdm.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def stage(self, text: str) -> None:
        self._write(f"... {text}")
        self._stage_line_at = time.monotonic()

    def stage_step(self, text: str, done: int) -> None:
        """Where no bar is drawn, a line at least every `HEARTBEAT_S` while a stage (the
        upper bound) goes on: how many of its calls have answered."""
        if self.enabled and stderr_is_terminal():
            return
        with self._stage_lock:
            now = time.monotonic()
            if now - self._stage_line_at < HEARTBEAT_S:
                return
            self._stage_line_at = now
        print(f"    ... {text}: {done} answers so far", file=sys.stderr, flush=True)

    def close(self) -> None:
        self.evaluation.close()


class EvalBars(ProgressSink):
    """The bars of one policy's evaluation in `evolve eval`: periods, user-periods and LLM
    calls (on stderr; thread-safe)."""

    def __init__(self, label: str, *, enabled: bool = True):
        self.label = label
        self.enabled = enabled
        self._lock = threading.Lock()
        self._bars: list[tqdm] = []
        self._calls_seen = 0

    def run_started(self, *, users: int, periods: int, finished_units: int) -> None:
        options = {"enabled": self.enabled, "leave": False}
        self.periods = make_bar(total=periods, desc=f"{self.label} periods", position=0, **options)
        self.units = make_bar(
            total=users * periods, desc=f"{self.label} user-periods", position=1, **options
        )
        self.calls = make_bar(desc=f"{self.label} LLM calls", unit="call", position=2, **options)
        self._bars = [self.periods, self.units, self.calls]

    def kept_failed_units(self, *, units: int, answers: int, run_dir: Path) -> None:
        print(kept_failed_units_line(units, answers, run_dir), file=sys.stderr)

    def unit_finished(self, user_id: str, period_index: int, *, resumed: bool) -> None:
        with self._lock:
            self.units.update(1)

    def llm_calls(self, total: int) -> None:
        with self._lock:
            if total > self._calls_seen:
                self.calls.update(total - self._calls_seen)
                self._calls_seen = total

    def period_finished(self, period_index: int, summary: MetricSummary) -> None:
        with self._lock:
            self.periods.update(1)
            if summary.accuracy is not None:
                self.periods.set_postfix(acc=f"{summary.accuracy:.3f}")

    def close(self) -> None:
        for bar in self._bars:
            bar.close()
