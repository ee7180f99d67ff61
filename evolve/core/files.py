"""Files: reading user-supplied JSON and TOML (every way a file can be unreadable becomes one
toolkit error that names the file, never a traceback) and the one atomic writer evolve uses.

Beyond a missing file or a syntax error, `json` and `tomllib` fail on inputs a user can hand
us by mistake or on purpose: a binary file (`UnicodeDecodeError`), an integer longer than
Python's 4300-digit limit (`ValueError`), and deeply nested arrays (`RecursionError`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import tomllib
from pathlib import Path
from typing import Any

from evolve.core.errors import ConfigError, ToolkitError, shown_value

logger = logging.getLogger(__name__)


def read_text_file(
    path: str | os.PathLike[str],
    what: str,
    *,
    error: type[ToolkitError] = ConfigError,
    missing_hint: str = "",
) -> str:
    """The file's UTF-8 text; `what` names it in messages ("environment file", ...)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        hint = f"; {missing_hint}" if missing_hint else ""
        raise error(f"{what} {str(path)!r} does not exist{hint}") from None
    except IsADirectoryError:
        raise error(f"{what} {str(path)!r} is a directory; pass a file") from None
    except OSError as exc:
        raise error(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not a UTF-8 text file (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            f"is it really a {what}?"
        ) from None


def parse_json_text(
    text: str, source: str | os.PathLike[str], what: str, error: type[ToolkitError]
) -> Any:
    """`json.loads` whose failures name `source`. A string holding a lone surrogate (an
    escape such as `\\ud800` that no character stands for) is refused here, in one line:
    it parses, but every later encode (a hash, a prompt, a file) would fail on it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"{source}: not valid JSON ({exc.msg}: line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise error(f"{source}: {what} is nested too deeply to read") from None
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit
        raise error(f"{source}: cannot read {what}: {_one_line(exc)}") from None
    # Only an escape can make one (the text itself was decoded from UTF-8): skip the walk
    # for files without any.
    if _SURROGATE_ESCAPE.search(text):
        where = _lone_surrogate(data, "")
        if where is not None:
            raise error(
                f"{source}: {what} holds a lone surrogate escape (e.g. \\ud800, no character) at "
                f"{where or 'the top level'}; remove it or write the character it stands for"
            )
    return data


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(value: Any, where: str) -> str | None:
    """Where in parsed JSON a string (or key) holds a lone surrogate, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _lone_surrogate(key, f"{where}.{key!r} (key)") or _lone_surrogate(
                item, f"{where}.{key}" if where else str(key)
            )
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _lone_surrogate(item, f"{where}[{index}]")
            if found is not None:
                return found
    return None


def unused_path(path: Path) -> Path:
    """`path`, or `path-2`, `path-3`, ... : the first that does not exist (to set a file
    aside without replacing an earlier one)."""
    candidate, number = path, 1
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.name}-{number}")
    return candidate


def warn_damaged(path: object, problem: str, action: str) -> None:
    """Say that a damaged run file is recomputed or rebuilt (`action`): never silently. A
    log warning, which reaches stderr with no logging set up (the CLI's case); only the
    commands print."""
    logger.warning("evolve: warning: damaged run file %s: %s; %s", path, problem, action)


def read_json_file(
    path: str | os.PathLike[str],
    what: str,
    *,
    error: type[ToolkitError] = ConfigError,
    missing_hint: str = "",
) -> Any:
    """Parse a JSON file; any unreadable content raises `error` naming the file."""
    text = read_text_file(path, what, error=error, missing_hint=missing_hint)
    return parse_json_text(text, path, what, error)


def read_toml_file(
    path: str | os.PathLike[str],
    what: str,
    *,
    error: type[ToolkitError] = ConfigError,
    missing_hint: str = "",
) -> dict[str, Any]:
    """Parse a TOML file; any unreadable content raises `error` naming the file."""
    text = read_text_file(path, what, error=error, missing_hint=missing_hint)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"cannot read {what} {path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise error(f"{path}: {what} is nested too deeply to read") from None
    except ValueError as exc:
        raise error(f"{path}: cannot read {what}: {_one_line(exc)}") from None


def create_temporary_beside(path: Path) -> tuple[int, Path]:
    """A new, empty file in `path`'s directory, opened for writing: (descriptor, its path).

    Not `tempfile.mkstemp`: it creates mode 0600 whatever the umask, and the rename carries
    that mode to the finished file, so a shared environment or an exported bundle could not
    be read by the group or service it was made for. Created with mode 0666, the file gets
    what the umask (and any default ACL) allows, like any file `open()` creates.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        temporary = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(temporary, flags, 0o666), temporary
        except FileExistsError:  # another writer drew the same name: draw again
            continue
    raise FileExistsError(f"no free temporary name beside {path} after 100 attempts")


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` (UTF-8) so that readers and resumed runs see the old file or the whole new
    one, never half: a temporary file beside `path`, fsynced (an OS crash after the rename
    must not leave an empty file), then `os.replace`. Parent directories are created; the
    file's mode follows the umask."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = create_temporary_beside(path)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        if error.filename is None:  # a write or fsync on the descriptor names no file
            error.filename = str(path)
        raise
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def atomic_write_json(
    path: str | os.PathLike[str], data: Any, *, indent: int = 2, final_newline: bool = True
) -> None:
    """`atomic_write_text` of `data` as JSON (non-ASCII kept as is)."""
    text = json.dumps(data, indent=indent, ensure_ascii=False)
    atomic_write_text(path, text + "\n" if final_newline else text)


# A name that is its own folder: what `safe_name` leaves unchanged, and no more.
_FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
FOLDER_NAME_MAX_CHARS = 120


def folder_name_problem(name: str) -> str | None:
    """Why `name` cannot name its own folder (runs/<name>/, trials/<study>/), or None.

    Refused rather than sanitized: two names that sanitize alike (`x` and `../../x`) would
    share a folder and its spend journals, and a newline would end up in a file name."""
    if len(name) > FOLDER_NAME_MAX_CHARS:
        return f"has {len(name)} characters; at most {FOLDER_NAME_MAX_CHARS}"
    if not _FOLDER_NAME.fullmatch(name):
        return (
            f"{shown_value(name)} must start with a letter or digit and contain only letters, "
            "digits, '.', '_' and '-' (no spaces, slashes or control characters)"
        )
    # Windows drops a trailing dot (`r1.` and `r1` would share a folder) and reserves the
    # device names, with any extension: a project must open on every system.
    if name.endswith("."):
        return f"{shown_value(name)} must not end with '.'"
    if name.split(".")[0].upper() in _RESERVED_NAMES:
        return f"{shown_value(name)} is a device name reserved on Windows; choose another"
    return None


_RESERVED_NAMES = frozenset(
    ["CON", "PRN", "AUX", "NUL"]
    + [f"{port}{number}" for port in ("COM", "LPT") for number in range(1, 10)]
)


def safe_name(text: str, *, fallback: str = "user", max_length: int = 120) -> str:
    """`text` as one file or directory name on any file system: every run of characters
    other than letters, digits, `.`, `_` and `-` becomes `_`, the result is cut to
    `max_length` (a long user id must not exceed the file system's name limit), and leading
    or trailing `.` and `_` are dropped (never a hidden file, `.` or `..`); `fallback` when
    nothing is left. The one rule for user ids, study names, host and model names."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:max_length].strip("._")
    return name or fallback


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300]
