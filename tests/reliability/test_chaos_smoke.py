"""Smoke run of `benchmarks/chaos.py`: `evolve eval` killed twice with -9, rerun, books checked.

The full benchmark (20 kills of eval, run and tune) takes minutes; this keeps the script
itself working and fails when any of its checks fails on eval (results equal an
uninterrupted run, ledger vs server count, time to stop after SIGINT).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHAOS = Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py"


def test_chaos_benchmark_passes_on_eval_with_two_kills(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, str(CHAOS), "--kills", "2", "--only", "eval", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,  # < 60 s on an idle 2-core machine; generous when it is shared
    )
    assert "eval" in completed.stdout and "results" in completed.stdout, completed.stderr[-2000:]
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-2000:]
