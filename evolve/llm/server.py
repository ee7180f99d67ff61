"""The embedded OpenAI-compatible llama.cpp server (llama-cpp-python[server]).

One server per process, on a free loopback port, shared by every role that has no endpoint.
It never outlives its parent: it is stopped on normal exit, on exceptions, on Ctrl-C and on
SIGTERM (by the context manager and an atexit hook), and the kernel kills it if the parent
dies abruptly (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from evolve.errors import ModelFileError, ServerStartError
from evolve.llm.config import EmbeddedModelConfig
from evolve.llm.model_files import DEFAULT_MODEL_NAME, check_gguf_file, default_model_path
from evolve.paths import cache_dir

_PR_SET_PDEATHSIG = 1


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the atexit hook and the context manager still stop the server
    # Own process group: a terminal's Ctrl-C reaches the parent, which shuts us down in order.
    os.setsid()


class EmbeddedServer:
    """Start with `with EmbeddedServer(config) as server:`; `server.base_url` ends in /v1."""

    def __init__(self, config: EmbeddedModelConfig | None = None):
        self.config = config or EmbeddedModelConfig()
        self.model_path: Path | None = None
        self.model_name = DEFAULT_MODEL_NAME
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = cache_dir() / "server" / f"llama-server-{os.getpid()}.log"

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the embedded server is not started")
        return f"http://127.0.0.1:{self.port}/v1"

    def resolve_model(self) -> Path:
        if self.config.model_path is not None:
            path = check_gguf_file(self.config.model_path)
            self.model_name = path.stem
            return path
        return default_model_path()

    def start(self) -> EmbeddedServer:
        if self.process is not None:
            return self
        self.model_path = self.resolve_model()
        if self.config.port is not None and port_in_use(self.config.port):
            raise ServerStartError(
                f"port {self.config.port} on 127.0.0.1 is already in use; stop the process using "
                f"it or leave the port unset so a free one is chosen"
            )
        self.port = self.config.port or free_loopback_port()
        threads = self.config.threads or os.cpu_count() or 1
        command = [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(self.model_path),
            "--model_alias", self.model_name,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--n_ctx", str(self.config.context_tokens),
            "--n_threads", str(threads),
            "--n_threads_batch", str(threads),
            # Only the last token's logits are needed for sampling; all-token logits cost time.
            "--logits_all", "false",
            # No RAM state cache: each saved state also copies a 300 MB logits buffer that the
            # cache's size limit does not count (a 1-hour run grew the server past 20 GB).
            # llama.cpp still reuses the KV of the previous prompt's common prefix.
            "--cache", "false",
            "--verbose", "false",
        ]  # fmt: skip
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        try:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - fork+exec of our own child only
            )
        finally:
            log.close()
        atexit.register(self.stop)
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.config.startup_timeout
        url = f"{self.base_url}/models"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self._startup_failure(f"exited with code {self.process.returncode}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200 and json.load(response).get("data"):
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                pass
            time.sleep(0.25)
        raise self._startup_failure(f"did not answer within {self.config.startup_timeout:.0f}s")

    def _startup_failure(self, what: str) -> Exception:
        tail = self.log_tail()
        if "failed to load model" in tail.lower() or "error loading model" in tail.lower():
            return ModelFileError(
                f"llama.cpp could not load model file {self.model_path} ({what}); the file is "
                f"corrupted or not a supported GGUF model: pass another --model-path "
                f"(server log: {self.log_path})"
            )
        last = tail.strip().splitlines()[-1] if tail.strip() else "no output"
        return ServerStartError(
            f"the embedded llama.cpp server {what}: {last[:200]} (full log: {self.log_path})"
        )

    def log_tail(self, max_bytes: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-max_bytes:].decode("utf-8", errors="replace")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        atexit.unregister(self.stop)
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
