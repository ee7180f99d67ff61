"""The `evolve` program handles SIGTERM and Ctrl-C from its first instant: during the
seconds its imports take, a signal ends it with one line and exit 130 (it used to die with
-15 and no word, or print an import traceback)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from reliability.process_helpers import REPO, cli_env

from evolve.core.errors import EXIT_INTERRUPTED


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_start_up_is_one_line_and_exit_130(tmp_path, signum):
    process = subprocess.Popen(
        [sys.executable, "-m", "evolve.launcher", "env", "validate", "missing.json"],
        cwd=tmp_path,
        env=cli_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.3)  # the handler is in place; importing the command takes seconds more
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == EXIT_INTERRUPTED, stderr[-2000:]
    assert stderr.strip() == "evolve: interrupted while starting; nothing was run"


def test_the_installed_program_is_the_launcher():
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'evolve = "evolve.launcher:main"' in text
