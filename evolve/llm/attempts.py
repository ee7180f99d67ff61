"""Every HTTP request to an endpoint on the books, and none sent once the process stops.

Why at the transport: the `openai` client retries inside one call (connection errors,
timeouts, 408/409/429, 5xx), so one LM call seen by DSPy's callbacks may be several requests
to the server, each of them paid. The HTTP transport under the client sees every one, so each
request is recorded as *started* just before it is sent and as *finished* or *failed* after.
A killed process leaves at worst "started, outcome unknown" entries: the books never hold
fewer requests than the server received, and at most the requests in flight at the kill more.
Both clients go through one: the toolkit's `OpenAIChatLM` (its own client's transport) and
litellm (a recording `litellm.client_session`, shared by every role).

The same place enforces the stop: once `STOP` is set (SIGINT / SIGTERM, see
`evolve.commands.interrupt`, or a call that failed after its retries, see `evolve.core.stopping`),
a request that has not started is refused before any byte is sent, whichever code path (a
retry, DSPy's adapter fallback, the next module call) asks.

And it gives every request a deadline for its whole response. The HTTP libraries' timeouts
bound connecting and each read, so a server that sends its body a byte a second is never
timed out by them; here the response body is cut once the request's timeout has passed since
it was sent (at the next byte), with the library's own read-timeout error, which both
clients treat as any timeout (retried, then reported). So `(retries + 1) x timeout` bounds a
call, trickling servers included.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import openai

from evolve.core.stopping import STOP, stop_reason

if TYPE_CHECKING:
    from evolve.llm.usage import UsageTracker

__all__ = [
    "STOP",
    "RecordingTransport",
    "RequestsStopped",
    "install_litellm_session",
    "litellm_requests_recorded",
    "recording_http_client",
]

# Who is calling, for a transport shared by every role (litellm's process-wide session): set
# around each LM call by the usage callback (`evolve.llm.usage_callback`), in the calling
# thread.
CALLER: contextvars.ContextVar[tuple[str, UsageTracker] | None] = contextvars.ContextVar(
    "evolve_llm_caller", default=None
)


class RequestsStopped(openai.OpenAIError):
    """A request was refused because the process is stopping.

    An `OpenAIError` on purpose: the `openai` client re-raises its own errors at once instead
    of retrying them (any other exception from the transport would be retried with backoff,
    keeping a worker thread alive after the stop for nothing).
    """


def _http_library() -> Any:
    """The httpx flavour the installed `openai` client is built on (httpx, or httpx2)."""
    client_class = openai.DefaultHttpxClient
    for base in client_class.__mro__:
        if base.__name__ == "Client" and base.__module__.split(".")[0] != "openai":
            return importlib.import_module(base.__module__.split(".")[0])
    raise ImportError(
        f"cannot tell which HTTP library openai {openai.__version__} is built on "
        f"(DefaultHttpxClient bases: {[b.__module__ for b in client_class.__mro__]}); expected "
        "httpx or httpx2: install a supported openai version"
    )


class RecordingTransport:
    """An HTTP transport that records each request with the usage tracker, around the real one.

    It is built with the LM, before its role is known; `attach(role, tracker)` (done by
    `evolve.llm.roles.attach_usage_tracking`) names where requests are recorded. A transport
    shared by all roles is never attached: it records for the `CALLER` of the moment. With
    neither, it records nothing but still refuses requests after the stop.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.role: str | None = None
        self.tracker: UsageTracker | None = None

    def attach(self, role: str, tracker: UsageTracker) -> None:
        self.role, self.tracker = role, tracker

    def handle_request(self, request: Any) -> Any:
        if STOP.is_set():
            raise RequestsStopped(f"not sent: the process is stopping ({stop_reason()})")
        role, tracker = self.role, self.tracker
        if tracker is None:
            role, tracker = CALLER.get() or (None, None)
        started = tracker.request_started(role) if tracker is not None and role else None
        sent_at = time.monotonic()
        try:
            response = self.inner.handle_request(request)
        except BaseException:
            if started is not None and tracker is not None:
                tracker.request_ended(started, failed=True, status=None)
            raise
        if started is not None and tracker is not None:
            # An HTTP error status is a failed request that the server did receive (and may
            # bill); the client decides whether to retry it.
            status = int(response.status_code)
            tracker.request_ended(started, failed=status >= 400, status=status)
        limit = _response_deadline(request)
        if limit is not None:
            library = importlib.import_module(type(self.inner).__module__.split(".")[0])
            response.stream = _deadline_stream_class(library)(
                response.stream, sent_at + limit, limit, request
            )
        return response

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> RecordingTransport:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.inner.__exit__(*exc)


def _response_deadline(request: Any) -> float | None:
    """Seconds the whole response may take: the request's timeout (the read timeout, which
    the clients set from the endpoint's `timeout`), or None when it has none."""
    timeouts = request.extensions.get("timeout") or {}
    limit = timeouts.get("read")
    return float(limit) if limit else None


@functools.cache
def _deadline_stream_class(library: Any) -> type:
    """A response body, of `library`'s own stream type (the client checks it), that raises
    the library's `ReadTimeout` once the deadline has passed, checked at every chunk."""

    class DeadlineStream(library.SyncByteStream):  # type: ignore[name-defined, misc]
        def __init__(self, inner: Any, deadline: float, limit: float, request: Any) -> None:
            self.inner, self.deadline, self.limit, self.request = inner, deadline, limit, request

        def __iter__(self) -> Iterator[bytes]:
            for chunk in self.inner:
                if time.monotonic() > self.deadline:
                    raise library.ReadTimeout(
                        f"the response did not finish within the request's timeout "
                        f"({self.limit:g} s)",
                        request=self.request,
                    )
                yield chunk

        def close(self) -> None:
            self.inner.close()

    return DeadlineStream


def recording_http_client(timeout: float) -> tuple[Any, RecordingTransport]:
    """An HTTP client for `openai.OpenAI(http_client=...)` whose requests go through a
    `RecordingTransport`, with the `openai` client's own connection limits."""
    library = _http_library()
    # A client given a transport ignores `limits`: the transport gets the client's own.
    transport = RecordingTransport(library.HTTPTransport(limits=openai.DEFAULT_CONNECTION_LIMITS))
    client = openai.DefaultHttpxClient(transport=transport, timeout=timeout)
    return client, transport


_litellm_installed = threading.Lock()


def install_litellm_session() -> None:
    """Route litellm's OpenAI-compatible requests through a `RecordingTransport` (idempotent).

    litellm builds its `openai` clients on `litellm.client_session` when one is set, and on a
    fresh HTTP client otherwise; one recording session, shared by every role, makes each of
    its requests (DSPy's retries included) visible and stoppable like the toolkit's own
    client's. Its async calls (`litellm.aclient_session`) are not routed: the toolkit calls
    LMs synchronously.
    """
    import litellm

    with _litellm_installed:
        if litellm.client_session is not None:
            return  # ours already, or the user's own (then `litellm_requests_recorded` is False)
        import httpx  # litellm's own HTTP library

        litellm.client_session = httpx.Client(
            transport=RecordingTransport(httpx.HTTPTransport()), follow_redirects=True
        )


def litellm_requests_recorded() -> bool:
    """Whether litellm's requests go through a `RecordingTransport` (`install_litellm_session`)."""
    import sys

    litellm = sys.modules.get("litellm")
    session = getattr(litellm, "client_session", None) if litellm is not None else None
    return isinstance(getattr(session, "_transport", None), RecordingTransport)
