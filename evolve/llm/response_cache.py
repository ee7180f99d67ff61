"""What DSPy's response cache may keep: answers that parsed, keyed by who answered.

Hand-written around `dspy.cache` (its memory and disk layers are used as they are) because
DSPy stores a response the moment it arrives, before any adapter has read it: a server whose
replies do not parse would otherwise be replayed to every later run, even against a healthy
server under the same model name. Four rules:

- **Held until parsed.** Inside `held_until_parsed()` a received response is held, not
  stored. It is written only when the scope accepts it; a parse failure, an error or a
  rejection drops it. A response that was served from the cache and then rejected is
  evicted, so it is never served again either. `RoleLMs.context` calls `hold_in_adapters`,
  which makes every DSPy adapter call (its LM call and its parse, whichever adapter) one
  scope; call sites that check more than the adapter (an option number's range) open their
  own around it.
- **Keyed by who answered.** Every key carries `answered_by`: the endpoint's
  `cache_fingerprint` (the embedded server's names its model file, server kind and slots;
  remote endpoints may set one). The model name is in the request already. Never the address
  or the key: a fingerprint is what the user says identifies the model, nothing more.
- **Dropped with a broken run.** A free-text reply (a simulated user's turn, an assistant's
  turn) parses whatever a broken server sends. `recording_writes()` notes every response
  stored inside it, from any thread, so that a run whose endpoint turns out broken (it
  failed for good, or most answers did not parse) evicts what it stored (`evict_all`).
- **Versioned.** Every key carries `RESPONSE_CACHE_FORMAT`: entries written before a change of
  these rules are never served again (delete the cache directory to reclaim their space).

The toolkit's `OpenAIChatLM` keys and stores through `lookup` / `store`. DSPy's litellm route
(`dspy.LM`) reads and writes `dspy.cache` itself; `answering()` marks its calls, and
`guard(dspy.cache)` applies the same rules to the cache's `get` / `put` while one is marked.
`scrub_cached_responses` keeps endpoint addresses out of what litellm responses carry.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

import dspy

# Bump when what a cached response means changes (what is stored, what the key holds).
# 1: DSPy's key on the request alone, every response stored; 2: parsed answers only, the
# answering model's fingerprint in the key.
RESPONSE_CACHE_FORMAT = 2
NAMESPACE_FIELD = "_evolve_response_cache"


def namespace(fingerprint: str | None) -> dict[str, Any]:
    """The part of every cache key that says which format and which model answered."""
    return {"format": RESPONSE_CACHE_FORMAT, "answered_by": fingerprint}


@dataclass
class _Response:
    request: dict[str, Any]
    value: Any
    ignored: list[str] | None
    served: bool  # read from the cache rather than received from the server


@dataclass
class HeldResponses:
    """The responses received or served inside one `held_until_parsed` scope."""

    parent: HeldResponses | None = None
    responses: list[_Response] = field(default_factory=list)
    accepted: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def accept(self) -> None:
        """The responses parsed: store them when the scope ends (or hand them to the
        enclosing scope, which decides in turn)."""
        self.accepted = True

    def _add(self, response: _Response) -> None:
        with self._lock:  # threads that inherit the scope's context may add concurrently
            self.responses.append(response)


_held: ContextVar[HeldResponses | None] = ContextVar("evolve_held_responses", default=None)
_answering: ContextVar[dict[str, Any] | None] = ContextVar("evolve_answering", default=None)


@contextmanager
def held_until_parsed() -> Iterator[HeldResponses]:
    """Hold every response of the calls inside until `accept()`; drop them otherwise.

    Nested scopes pass accepted responses to the enclosing scope, so an outer check can
    still reject what an inner parse accepted.
    """
    held, token = _open()
    try:
        yield held
    except BaseException:
        _close(held, token, failed=True)
        raise
    _close(held, token, failed=False)


def _open() -> tuple[HeldResponses, Token]:
    held = HeldResponses(parent=_held.get())
    return held, _held.set(held)


def _close(held: HeldResponses, token: Token, *, failed: bool) -> None:
    try:
        _held.reset(token)
    except ValueError:  # closed from another context than it was opened in
        _held.set(held.parent)
    if failed or not held.accepted:
        _reject(held)
    elif held.parent is not None:
        for response in held.responses:
            held.parent._add(response)
    else:
        for response in held.responses:
            if not response.served:
                dspy.cache.put(response.request, response.value, response.ignored)
                _record_write(response.request, response.ignored)


def hold_in_adapters() -> None:
    """Make every DSPy adapter call one `held_until_parsed` scope (idempotent).

    Every adapter makes its LM call and parses the reply inside `dspy.Adapter.__call__` /
    `acall` (ours through JSONAdapter and ChatAdapter, the paper policies' directly): a reply
    that does not parse raises `AdapterParseError` out of it, whoever catches it afterwards.
    Wrapping that one method costs a context variable per call; a DSPy callback in
    `dspy.settings` would do the same through DSPy's dispatch on every module, adapter and LM
    call (measured: it nearly doubled the toolkit's own time per call). LMs that are not the
    toolkit's store nothing through this module, so for them nothing changes.
    """
    adapter = dspy.Adapter
    if getattr(adapter.__call__, "_evolve_holds", False):
        return
    call, acall = adapter.__call__, adapter.acall

    @functools.wraps(call)
    def held_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        with held_until_parsed() as held:
            values = call(self, *args, **kwargs)
            held.accept()
        return values

    @functools.wraps(acall)
    async def held_acall(self: Any, *args: Any, **kwargs: Any) -> Any:
        with held_until_parsed() as held:
            values = await acall(self, *args, **kwargs)
            held.accept()
        return values

    held_call._evolve_holds = True  # type: ignore[attr-defined]
    adapter.__call__ = held_call  # type: ignore[method-assign]
    adapter.acall = held_acall  # type: ignore[method-assign]


def _reject(held: HeldResponses) -> None:
    for response in held.responses:
        if response.served:
            evict(response.request, response.ignored)


def evict(request: dict[str, Any], ignored: list[str] | None = None) -> None:
    """Remove one entry from both layers of `dspy.cache` (nothing if it is absent)."""
    cache = dspy.cache
    try:
        key = cache.cache_key(request, ignored)
    except Exception:  # a request DSPy could not key was never stored either
        return
    memory = getattr(cache, "memory_cache", None)
    if memory is not None:
        # DSPy guards its in-memory LRU with this lock (cachetools is not thread-safe).
        with getattr(cache, "_lock", None) or nullcontext():
            memory.pop(key, None)
    disk = getattr(cache, "disk_cache", None)
    if disk is not None and hasattr(disk, "delete"):
        disk.delete(key)
    elif isinstance(disk, dict):
        disk.pop(key, None)


class WrittenResponses:
    """The cache entries stored while a `recording_writes()` block is open."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._written: list[tuple[dict[str, Any], list[str] | None]] = []

    def add(self, request: dict[str, Any], ignored: list[str] | None) -> None:
        with self._lock:
            self._written.append((request, ignored))

    def __len__(self) -> int:
        with self._lock:
            return len(self._written)

    def evict_all(self) -> int:
        """Remove every entry recorded from the cache; how many were recorded."""
        with self._lock:
            written, self._written = self._written, []
        for request, ignored in written:
            evict(request, ignored)
        return len(written)


# Process-wide, not per context: the writes of a run come from its worker threads.
_recorders: list[WrittenResponses] = []
_recorders_lock = threading.Lock()


@contextmanager
def recording_writes() -> Iterator[WrittenResponses]:
    """Note every response stored into the cache inside the block (any thread's), so that
    the caller can evict them all if the run turns out to have talked to a broken endpoint.
    Blocks that overlap (concurrent evaluations) each note every write: one endpoint serves
    them, so a broken one is broken for all."""
    written = WrittenResponses()
    with _recorders_lock:
        _recorders.append(written)
    try:
        yield written
    finally:
        with _recorders_lock:
            _recorders.remove(written)


def _record_write(request: dict[str, Any], ignored: list[str] | None) -> None:
    with _recorders_lock:
        recorders = list(_recorders)
    for written in recorders:
        written.add(request, ignored)


def lookup(request: dict[str, Any]) -> Any:
    """`dspy.cache.get` for a namespaced request, remembered so that a rejection evicts it."""
    value = dspy.cache.get(request)
    if value is not None:
        _note(_Response(request, None, None, served=True))
    return value


def store(request: dict[str, Any], value: Any) -> None:
    """`dspy.cache.put`, deferred to the end of the enclosing `held_until_parsed` scope."""
    if _held.get() is None:
        dspy.cache.put(request, value)
        _record_write(request, None)
    else:
        _note(_Response(request, value, None, served=False))


def _note(response: _Response) -> None:
    held = _held.get()
    if held is not None:
        held._add(response)


@contextmanager
def answering(fingerprint: str | None) -> Iterator[None]:
    """Mark the calls inside as made by a model with this fingerprint (DSPy's litellm route:
    `guard` then namespaces and holds what it reads and writes)."""
    guard(dspy.cache)
    token = _answering.set(namespace(fingerprint))
    try:
        yield
    finally:
        _answering.reset(token)


def guard(cache: Any) -> None:
    """Apply the module's rules to `cache.get` / `cache.put` while `answering` (idempotent).

    Outside `answering` both behave exactly as DSPy's; a request that already carries a
    namespace (written by `lookup` / `store` or a scope's commit) passes through.
    """
    if getattr(cache, "_evolve_response_rules", False):
        return
    get, put = cache.get, cache.put

    def guarded_get(request: dict[str, Any], ignored: list[str] | None = None, *args, **kwargs):
        marked = _answering.get()
        if marked is None or NAMESPACE_FIELD in request:
            return get(request, ignored, *args, **kwargs)
        keyed = {**request, NAMESPACE_FIELD: marked}
        value = get(keyed, ignored, *args, **kwargs)
        if value is not None:
            _note(_Response(keyed, None, ignored, served=True))
        return value

    def guarded_put(
        request: dict[str, Any], value: Any, ignored: list[str] | None = None, *args, **kwargs
    ) -> None:
        marked = _answering.get()
        if marked is None or NAMESPACE_FIELD in request:
            put(request, value, ignored, *args, **kwargs)
            return
        keyed = {**request, NAMESPACE_FIELD: marked}
        if _held.get() is None:
            put(keyed, value, ignored, *args, **kwargs)
            _record_write(keyed, ignored)
        else:
            _note(_Response(keyed, value, ignored, served=False))

    cache.get = guarded_get
    cache.put = guarded_put
    cache._evolve_response_rules = True


# litellm keeps the request's `api_base` (and the server's response headers) in a
# response's hidden parameters, which DSPy pickles into its disk cache; the cache key
# already leaves them out. Endpoint addresses never belong in a cache file.
_HIDDEN_PARAMS_NOT_CACHED = ("api_base", "additional_headers", "litellm_call_id")


def _scrubbed(value: Any) -> Any:
    hidden = getattr(value, "_hidden_params", None)
    if isinstance(hidden, dict):
        for name in _HIDDEN_PARAMS_NOT_CACHED:
            hidden.pop(name, None)
    if hasattr(value, "_response_headers"):
        with suppress(AttributeError, TypeError, ValueError):
            value._response_headers = None
    return value


def scrub_cached_responses() -> None:
    """Strip endpoint addresses from every response DSPy's cache stores (idempotent)."""
    cache = dspy.cache
    if getattr(cache, "_evolve_scrubbing", False):
        return
    store = cache.put

    def put(request: dict[str, Any], value: Any, *args: Any, **kwargs: Any) -> None:
        store(request, _scrubbed(value), *args, **kwargs)

    cache.put = put  # type: ignore[method-assign]
    cache._evolve_scrubbing = True  # type: ignore[attr-defined]
