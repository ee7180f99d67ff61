"""DSPy's disk cache, checked before a run relies on it.

DSPy opens its disk cache (a diskcache `FanoutCache`: one sqlite file per shard) the first
time `dspy.cache` is read, and when a file is not a database it falls back to a memory-only
cache with one log line: every response of the run, and of every later run, is then asked
again and nothing says why. `check_response_cache` opens the cache itself (where the failure
is seen), writes, reads and deletes a probe key in every shard, and on failure prints one
warning line naming the directory and what to do.

A corrupted cache is moved aside to `<dir>.broken-<time>` and a fresh one created, rather than
running with caching off: moving loses nothing (every file of the old cache is kept, for
inspection or a `sqlite3 .recover`; its entries could not be read anyway), while caching off
would lose every response of this run and of every later one until someone noticed. A cache
that cannot be used for another reason (permissions, a full disk) is not moved: moving would
not fix it, so the run goes on without caching to disk and the line says what to fix.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dspy

from evolve.core.locking import exclusive_file_lock

# sqlite's result codes for a damaged file: SQLITE_CORRUPT ("database disk image is
# malformed") and SQLITE_NOTADB ("file is not a database").
_CORRUPTION_CODES = frozenset({11, 26})
# What DSPy's own lazy build uses (`dspy.clients._get_dspy_cache`).
_DEFAULT_SIZE_LIMIT = 3e10
_DEFAULT_MEMORY_ENTRIES = 1_000_000


def check_response_cache() -> None:
    """Make sure `dspy.cache` caches to disk when it is meant to; repair or warn otherwise.

    A cache someone configured memory-only is left alone. Before DSPy has built its cache,
    it is built here with DSPy's defaults, so that a failure is seen rather than logged away.
    """
    if "cache" not in vars(dspy):  # DSPy builds it on first read, from $DSPY_CACHEDIR
        from dspy.utils.caching import default_cache_dir

        settings = {
            "enable_memory_cache": True,
            "disk_cache_dir": default_cache_dir(),
            "disk_size_limit_bytes": int(os.environ.get("DSPY_CACHE_LIMIT", _DEFAULT_SIZE_LIMIT)),
            "memory_max_entries": _DEFAULT_MEMORY_ENTRIES,
        }
        failure = _open(settings)
    else:
        cache = dspy.cache
        if not getattr(cache, "enable_disk_cache", False) or not cache.disk_cache_dir:
            return
        settings = _settings_of(cache)
        failure = _probe(cache.disk_cache)
    if failure is not None:
        _recover(Path(settings["disk_cache_dir"]), settings, failure)


def _settings_of(cache: Any) -> dict[str, Any]:
    memory = getattr(cache, "memory_cache", None)
    disk = cache.disk_cache
    # A FanoutCache reports the limit of one shard: the whole is shared among them.
    shards = len(getattr(disk, "_shards", None) or (disk,))
    try:
        size_limit = int(disk.size_limit * shards)
    except (AttributeError, TypeError, ValueError):
        size_limit = int(_DEFAULT_SIZE_LIMIT)
    return {
        "enable_memory_cache": cache.enable_memory_cache,
        "disk_cache_dir": cache.disk_cache_dir,
        "disk_size_limit_bytes": size_limit,
        "memory_max_entries": getattr(memory, "maxsize", _DEFAULT_MEMORY_ENTRIES),
    }


def _open(settings: dict[str, Any]) -> Exception | None:
    """Configure DSPy's cache with a disk layer and probe it; the failure, if any."""
    try:
        dspy.configure_cache(enable_disk_cache=True, **settings)
    except Exception as error:  # sqlite, OS and diskcache errors alike: reported, not raised
        return error
    return _probe(dspy.cache.disk_cache)


def _probe(disk: Any) -> Exception | None:
    """Write, read back and delete a probe key in every shard (a key lands in one shard)."""
    key = f"evolve-disk-cache-probe-{os.getpid()}-{uuid.uuid4().hex}"
    try:
        for shard in getattr(disk, "_shards", None) or (disk,):
            shard.set(key, key)
            if shard.get(key) != key:
                return OSError("a probe value written to it could not be read back")
            shard.delete(key)
    except Exception as error:
        if type(error).__name__ == "Timeout":  # diskcache: another process holds it, not broken
            return None
        return error
    return None


def _corrupted(error: Exception) -> bool:
    return getattr(error, "sqlite_errorcode", None) in _CORRUPTION_CODES


def _recover(directory: Path, settings: dict[str, Any], failure: Exception) -> None:
    if not _corrupted(failure):
        _run_without_disk(directory, settings, failure)
        return
    found = failure
    _close(vars(dspy).get("cache"))
    # Two processes opening one broken cache: the second must not move the first one's fresh
    # cache aside, so the check is redone under a lock, on a new connection.
    with exclusive_file_lock(directory.with_name(directory.name + ".repair.lock")):
        failure = _open(settings)
        if failure is None:  # repaired by another process meanwhile
            return
        if not _corrupted(failure):
            _run_without_disk(directory, settings, failure)
            return
        _close(vars(dspy).get("cache"))
        aside = _moved_aside(directory)
        failure = _open(settings)
    if failure is not None:
        _run_without_disk(directory, settings, failure)
        return
    _warn(
        f"the response cache at {directory} was corrupted ({_reason(found)}); moved it to "
        f"{aside} and started an empty one (delete {aside} once you no longer need it)"
    )


def _moved_aside(directory: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    aside = directory.with_name(f"{directory.name}.broken-{stamp}")
    number = 1
    while aside.exists():
        number += 1
        aside = directory.with_name(f"{directory.name}.broken-{stamp}-{number}")
    directory.rename(aside)
    return aside


def _run_without_disk(directory: Path, settings: dict[str, Any], failure: Exception) -> None:
    _close(vars(dspy).get("cache"))
    memory_only = {**settings, "enable_disk_cache": False}
    dspy.configure_cache(**memory_only)
    _warn(
        f"the response cache at {directory} cannot be used ({_reason(failure)}); responses "
        f"are not cached on disk this run: make that directory writable (or free disk space "
        f"there), or set EVOLVE_CACHE_DIR to another directory"
    )


def _close(cache: Any) -> None:
    disk = getattr(cache, "disk_cache", None)
    close = getattr(disk, "close", None)
    if callable(close):
        # Closing a broken file may fail in turn; it is being replaced either way.
        with contextlib.suppress(Exception):
            close()


def _reason(error: Exception) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)
