"""Smoke run of `benchmarks/chaos.py`: `evolve eval` killed twice with -9, rerun, books checked.

The full benchmark (20 kills of eval, run and tune, response cache off and on) takes minutes;
this keeps the script itself working and fails when any of its checks fails on eval (results
equal an uninterrupted run, ledger vs server count, time to stop after SIGINT and, with the
cache on, a broken server's answers not replayed to a healthy one), one cache mode at a time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CHAOS = Path(__file__).resolve().parents[3] / "benchmarks" / "chaos.py"


@pytest.mark.parametrize(("cache", "kills"), [("off", 2), ("on", 1)])
def test_chaos_benchmark_passes_on_eval(tmp_path: Path, cache: str, kills: int) -> None:
    command = [sys.executable, str(CHAOS), "--kills", str(kills), "--only", "eval"]
    completed = subprocess.run(
        [*command, "--llm-cache", cache, "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,  # < 60 s each on an idle 2-core machine; generous when it is shared
    )
    assert "eval" in completed.stdout and "results" in completed.stdout, completed.stderr[-2000:]
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-2000:]
    if cache == "on":
        assert "PASS eval+cache replay" in completed.stdout, completed.stdout[-3000:]
