"""`mlflow ui` as a child process: started on a store, waited for, stopped with its workers.

Used by `evolve ui` and by the docs' screenshot script, so that both open the same server
the same way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from evolve.core.errors import ConfigError, StorageError

# LiteLLM, imported by the server, otherwise fetches its model cost map from GitHub at
# start (warnings and a long wait offline).
FAST_UI_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
# A cold start on a busy 2-core machine takes about 30 s; four minutes means it failed.
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 20.0


def installed_executable(prog: str) -> str:
    """The program `prog` when that is the one next to this interpreter (or none is found
    there), else the full path of the one installed with the toolkit (e.g.
    `.venv/bin/mlflow`): what a printed command should say to run the toolkit's own copy."""
    beside = Path(sys.executable).with_name(prog)
    found = shutil.which(prog)
    if not beside.is_file() or (found is not None and Path(found).resolve() == beside.resolve()):
        return prog
    return str(beside)


def check_port_free(host: str, port: int) -> None:
    """Refuse, in one line, a port another server holds (a second `mlflow ui`, say)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ConfigError(
                f"cannot serve the MLflow UI on {host}:{port}: {error.strerror or error}; "
                "another server (an `mlflow ui` already running?) holds it: open that one, "
                "stop it, or pass --port with a free port"
            ) from None


@contextlib.contextmanager
def running_ui(tracking_uri: str, *, host: str, port: int) -> Iterator[subprocess.Popen]:
    """`mlflow ui` on `tracking_uri` at host:port with one worker, answering when entered;
    its whole process group is stopped on exit. Its output goes to a temporary log whose
    tail is quoted when it does not start."""
    check_port_free(host, port)
    command = [installed_executable(prog="mlflow"), "ui", "--backend-store-uri", tracking_uri]
    command += ["--host", host, "--port", str(port), "--workers", "1"]
    with tempfile.TemporaryFile(mode="w+", prefix="evolve-mlflow-ui-") as log:
        process = subprocess.Popen(
            command,
            env={**os.environ, **FAST_UI_ENV},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its workers and job consumers stop with it
        )
        try:
            _wait_until_serving(process, f"http://{host}:{port}/health", log)
            yield process
        finally:
            stop_process_group(process)


def _wait_until_serving(process: subprocess.Popen, url: str, log) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as response:
            if response.status == 200:
                return
        time.sleep(0.5)
    log.seek(0)
    tail = " | ".join(log.read().strip().splitlines()[-3:])[-600:]
    state = "exited" if process.poll() is not None else f"did not answer in {START_TIMEOUT_S:.0f} s"
    raise StorageError(f"mlflow ui {state}: {tail or 'no output'}; check the store and the port")


def stop_process_group(process: subprocess.Popen) -> None:
    """SIGTERM to the group, SIGKILL to what is left after `STOP_TIMEOUT_S`; the job
    consumers `mlflow ui` starts outlive it by seconds and are waited for too."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.3)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
