"""The embedded OpenAI-compatible llama.cpp server (`llama-server`, built by install.sh).

One server per process, on a free loopback port, shared by every role that has no endpoint.
It decodes `slots` requests at once (continuous batching), each slot keeping its last
prompt's KV cache so that a request sharing a prefix with it skips that part of the prompt.
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

from evolve.core.errors import ModelFileError, ServerStartError
from evolve.core.paths import cache_dir
from evolve.llm.config import EmbeddedModelConfig
from evolve.llm.model_files import bundled_model, check_gguf_file
from evolve.llm.model_source import ResolvedModelFile, resolve_bundled_model

_PR_SET_PDEATHSIG = 1
SERVER_KIND = "llama-server"
LLAMA_SERVER_ENV = "EVOLVE_LLAMA_SERVER"
# Host-RAM copies of idle slots' prompt caches (llama-server's default is 8 GiB per server):
# enough for a few dozen 4k-token prompts of the bundled models.
PROMPT_CACHE_RAM_MIB = 1024
# The bundled model that drafts under speculative = "draft" (same tokenizer as the 1.5B).
DRAFT_MODEL_SIZE = "0.5b"


def llama_server_binary() -> Path:
    """The `llama-server` executable: $EVOLVE_LLAMA_SERVER, else the one install.sh put next
    to this interpreter (.venv/bin/llama-server). Never a guess from $PATH: its version and
    build flags would be unknown."""
    configured = os.environ.get(LLAMA_SERVER_ENV)
    binary = (
        Path(configured).expanduser() if configured else Path(sys.prefix) / "bin" / "llama-server"
    )
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        where = f"${LLAMA_SERVER_ENV}={configured}" if configured else str(binary)
        raise ServerStartError(
            f"the llama.cpp server binary is missing: no executable at {where}; run "
            f"scripts/install.sh (it compiles llama-server into .venv/bin) or set "
            f"{LLAMA_SERVER_ENV} to a llama-server executable"
        )
    return binary


def other_llama_servers() -> list[int]:
    """Pids of llama-server processes already running on this machine that may run on a core
    this process may use (Linux; else none). A server pinned to other cores (taskset, a
    cpuset, a test worker of its own) does not compete with one started here."""
    ours = _affinity(0)
    pids = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() != SERVER_KIND:
                continue
            pid = int(comm.parent.name)
            theirs = _affinity(pid)
        except OSError:  # the process ended while we looked
            continue
        if ours is None or theirs is None or ours & theirs:
            pids.append(pid)
    return sorted(pids)


def _affinity(pid: int) -> set[int] | None:
    """The cores a process may run on, or None where the platform does not say."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return set(os.sched_getaffinity(pid))


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under taskset or a cpuset), not
    the machine's: llama.cpp's threads spin while they wait for each other, so two threads on
    one allowed core decode many times slower than one."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity API on this platform
        return os.cpu_count() or 1


def contention_warning(others: list[int], threads: int, cores: int) -> str | None:
    """Why a second server on a small machine is slow, or None when the cores suffice.
    llama.cpp's worker threads spin while they wait for each other; two servers that each
    use every core decoded at seconds per token instead of 25-65 ms on a 2-core machine (seen)."""
    if not others or threads * (len(others) + 1) <= cores:
        return None
    listed = ", ".join(str(pid) for pid in others)
    return (
        f"warning: another llama-server is running (pid {listed}); with {threads} threads "
        f"each on {cores} cores the servers slow each other down many times over. Let the "
        f"other run finish, point this command at its endpoint (--base-url), or give each "
        f"fewer threads ([llm.embedded] threads)"
    )


def served_model_name(model_stem: str, config: EmbeddedModelConfig) -> str:
    """The name the server answers to. It carries the server kind, the slot count and any
    speculative decoding because each can change greedy outputs slightly (batched decoding;
    a draft's batched verification: benchmarks/records/speculative-decoding.txt): runs record
    the model names in their identity, and DSPy's cache keys on them, so results of
    different setups never mix."""
    name = f"{model_stem}@{SERVER_KIND}-{config.slots}slots"
    if config.speculative == "draft":
        return f"{name}-draft{config.draft_tokens}"
    if config.speculative == "ngram":
        return f"{name}-ngram"
    return name


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
        self.bundled_file: ResolvedModelFile | None = None  # a model size's file and its source
        self.draft_path: Path | None = None  # the draft model's file (speculative = draft)
        self.model_name = served_model_name(bundled_model(self.config.model_size).name, self.config)
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
            self.model_name = served_model_name(path.stem, self.config)
            return path
        self.bundled_file = resolve_bundled_model(self.config.model_size, self.config.model_source)
        if self.bundled_file.note:
            print(f"model: {self.bundled_file.note}", file=sys.stderr)
        return self.bundled_file.path

    @property
    def model_file_name(self) -> str:
        """The weights' name in cache keys: a model size's, whichever source served its file
        (both are the same bytes, held to one sha256)."""
        if self.bundled_file is not None:
            return f"{bundled_model(self.bundled_file.model_size).name}.gguf"
        return self.model_path.name if self.model_path is not None else self.model_name

    def command(self, binary: Path) -> list[str]:
        """The llama-server command line (model and port must be resolved)."""
        threads = self.config.threads or usable_cores()
        return [
            str(binary),
            "--model", str(self.model_path),
            "--alias", self.model_name,
            "--host", "127.0.0.1",  # loopback only: the server has no API key
            "--port", str(self.port),
            # Each slot gets ctx_per_slot tokens of its own (no unified KV buffer).
            "--ctx-size", str(self.config.context_tokens),
            "--parallel", str(self.config.slots),
            "--no-kv-unified",
            "--cont-batching",
            "--cache-prompt",
            "--cache-ram", str(PROMPT_CACHE_RAM_MIB),
            "--threads", str(threads),
            "--threads-batch", str(threads),
            "--poll", str(self.config.poll),
            # The context size is ours, never shrunk to fit a device's free memory.
            "--fit", "off",
            "--no-webui",
            *self.speculative_flags(),
        ]  # fmt: skip

    def speculative_flags(self) -> list[str]:
        """llama-server's flags for `speculative` (the draft model must be resolved)."""
        if self.config.speculative == "draft":
            assert self.draft_path is not None
            threads = self.config.threads or usable_cores()
            return [
                "--spec-type", "draft-simple",
                "--model-draft", str(self.draft_path),
                "--spec-draft-n-max", str(self.config.draft_tokens),
                "--threads-draft", str(threads),
                "--threads-batch-draft", str(threads),
            ]  # fmt: skip
        if self.config.speculative == "ngram":
            return ["--spec-type", "ngram-simple"]
        return []

    def start(self) -> EmbeddedServer:
        if self.process is not None:
            return self
        self.model_path = self.resolve_model()  # the user's input is checked first
        if self.config.speculative == "draft":
            self.draft_path = resolve_bundled_model(DRAFT_MODEL_SIZE, self.config.model_source).path
        binary = llama_server_binary()
        if self.config.port is not None and port_in_use(self.config.port):
            raise ServerStartError(
                f"port {self.config.port} on 127.0.0.1 is already in use; stop the process using "
                f"it or leave the port unset so a free one is chosen"
            )
        self.port = self.config.port or free_loopback_port()
        cores = usable_cores()
        warning = contention_warning(other_llama_servers(), self.config.threads or cores, cores)
        if warning:
            print(warning, file=sys.stderr)
        command = self.command(binary)
        # One log per server: a process may start several (e.g. the slots benchmark).
        self.log_path = cache_dir() / "server" / f"llama-server-{os.getpid()}-{self.port}.log"
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
        # /health answers 503 while the model loads and 200 once requests are served.
        url = f"http://127.0.0.1:{self.port}/health"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self._startup_failure(f"exited with code {self.process.returncode}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200 and json.load(response).get("status") == "ok":
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
