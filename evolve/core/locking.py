"""Advisory file locks: one evolve process per run directory, serialized store creation.

Hand-written on `fcntl.flock` rather than a lock library because the kernel must release the
lock when its holder dies (a `kill -9` leaves no stale lock to clean up: the next process just
takes it over), which rules out pid files and lock files whose mere existence means "taken".
The lock file also records who holds it (pid, start time, command) so that a refused process,
`evolve compare` and `evolve export` can say which process is running the directory.

Locks are per open file description: two opens of the same file conflict even inside one
process, and file descriptors are not inherited by child processes (the embedded llama.cpp
server never keeps a run locked after its parent died).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from evolve.core.errors import ConfigError, RunBusyError, StorageError

RUN_LOCK_FILE = ".evolve.lock"

# A reader (`lock_holder`) takes the lock shared for an instant; a starting process that
# meets it retries for this long before deciding that another process really runs the dir.
_BRIEF_CONTENTION_S = 0.5


@dataclass(frozen=True)
class LockHolder:
    """The process a lock file names (what it wrote when it took the lock)."""

    pid: int | None
    started: str | None
    command: str | None

    def describe(self) -> str:
        pid = "unknown" if self.pid is None else str(self.pid)
        return f"pid {pid}, started {self.started or 'at an unknown time'}"


def _read_holder(fd: int) -> LockHolder:
    try:
        raw = os.pread(fd, 4096, 0).decode("utf-8", errors="replace")
        data = json.loads(raw) if raw.strip() else {}
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    pid = data.get("pid")
    return LockHolder(
        pid=pid if isinstance(pid, int) else None,
        started=str(data["started"]) if data.get("started") else None,
        command=str(data["command"]) if data.get("command") else None,
    )


def _storage_error(path: Path, error: OSError, what: str) -> StorageError:
    return StorageError(
        f"cannot create {what} {path}: {error.strerror or error}; the directory must be "
        "writable (check permissions, free space, or choose another directory)"
    )


class RunLock:
    """An exclusive, non-blocking lock on a run directory, held until `release()`.

    `acquire()` raises `RunBusyError` (exit code 4) at once when another live process holds
    it; a lock file left by a dead process is simply taken over.
    """

    def __init__(self, directory: str | os.PathLike[str], command: str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / RUN_LOCK_FILE
        self.command = command
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        if self.directory.exists() and not self.directory.is_dir():
            raise ConfigError(
                f"{self.directory} is a file, not a directory: `evolve {self.command}` keeps its "
                "run there; pass a directory (a new one is created)"
            )
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise _storage_error(self.path, error, "the run lock file") from None
        deadline = time.monotonic() + _BRIEF_CONTENTION_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise _storage_error(self.path, error, "the run lock on") from None
                holder = _read_holder(fd)
                # An unnamed holder is a reader peeking (or a process writing its name now).
                if holder.pid is not None or time.monotonic() > deadline:
                    os.close(fd)
                    raise RunBusyError(
                        f"{self.directory}: another evolve process ({holder.describe()}) is "
                        "running this; wait or stop it"
                    ) from None
                time.sleep(0.02)
        record = {
            "pid": os.getpid(),
            "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "command": self.command,
        }
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
        except OSError as error:
            os.close(fd)
            raise _storage_error(self.path, error, "the run lock file") from None
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # no holder named once released
        os.close(fd)  # closing drops the flock

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def run_lock(directory: str | os.PathLike[str], command: str) -> RunLock:
    """`with run_lock(run_dir, "run"):` -- the directory belongs to this process inside."""
    return RunLock(directory, command)


def lock_holder(directory: str | os.PathLike[str]) -> LockHolder | None:
    """The live process holding `directory`'s run lock, or None (free, or its holder died).

    Never blocks and never takes the lock for longer than the check.
    """
    path = Path(directory) / RUN_LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _read_holder(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive_file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """A blocking exclusive lock on `path` (created if missing) for a short critical section.

    Used around the first open of a shared store (an MLflow sqlite DB runs its schema
    migrations then; two processes migrating at once die with `duplicate column name`).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise _storage_error(path, error, "the lock file") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
