"""A thin DSPy LM on the `openai` client, for OpenAI-compatible chat endpoints.

Hand-written because the per-call cost of the general clients is most of the toolkit's own
overhead: litellm routes, normalises and logs each call for a hundred providers (about 17 ms
a call here), while every endpoint this toolkit talks to (OpenAI, vLLM, llama.cpp, Ollama)
speaks one dialect. This LM sends the chat request as built by DSPy's adapter (our
structured-output dialects included), with:

- bounded retries with exponential backoff (the `openai` client's own: connection errors,
  timeouts, 408/409/429 and 5xx);
- every HTTP request, retries included, recorded as started before it is sent and as
  finished or failed after (`evolve.llm.attempts`), and none sent once the process stops;
- usage read from the response, so role accounting and the spend journal see every call;
- `max_tokens` as the server expects it: `max_completion_tokens` only for OpenAI's own
  reasoning models, `max_tokens` everywhere else (llama.cpp ignores the newer field);
- DSPy's response cache (`dspy.cache`), keyed on the request and the answering model's
  fingerprint without the endpoint's address or key, storing the response as plain data, and
  only once it parsed (`evolve.llm.response_cache`).

Errors are raised as DSPy's `LMError` subclasses, so callers see one error family whichever
client an endpoint uses. litellm stays available: `client = "litellm"` on an endpoint.
"""

from __future__ import annotations

import copy
import re
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import dspy
import openai
from dspy.utils.exceptions import (
    ContextWindowExceededError,
    LMAuthError,
    LMError,
    LMInvalidRequestError,
    LMProviderError,
    LMRateLimitError,
    LMServerError,
    LMTimeoutError,
    LMTransportError,
)

from evolve.core.errors import Interrupted
from evolve.llm import response_cache
from evolve.llm.attempts import RequestsStopped, recording_http_client

if TYPE_CHECKING:
    from evolve.llm.usage import UsageTracker

CACHE_FUNCTION = "evolve.llm.openai_client.chat"
# Settings that configure the connection or DSPy itself, never sent in the request body.
NOT_SENT = {"cache", "rollout_id", "num_retries", "api_key", "api_base", "base_url", "n"}
OPENAI_HOSTS = ("api.openai.com",)
_SHARED = ("_client", "_transport")  # attributes an LM's copies share
_REASONING_MODEL = re.compile(r"^(o[1345](-|$)|gpt-5)")


def uses_max_completion_tokens(model: str, base_url: str) -> bool:
    """OpenAI's reasoning models refuse `max_tokens`; every other server expects it."""
    return any(host in base_url for host in OPENAI_HOSTS) and bool(_REASONING_MODEL.match(model))


class OpenAIChatLM(dspy.BaseLM):
    """`dspy.BaseLM` for one OpenAI-compatible endpoint, on the `openai` client."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        api_key: str,
        temperature: float = 0.0,
        max_tokens: int = 512,
        timeout: float = 120.0,
        num_retries: int = 3,
        cache: bool = True,
        cache_fingerprint: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            model=model,
            model_type="chat",
            temperature=temperature,
            max_tokens=max_tokens,
            cache=cache,
            num_retries=num_retries,
            **kwargs,
        )
        self.wire_model = model.removeprefix("openai/")
        # What identifies the answering model beyond its name; part of every cache key.
        self.cache_fingerprint = cache_fingerprint
        # Kept for cache identities (`RoleLMs.identity`); never sent, never in cache keys.
        self.base_url = base_url
        self._max_tokens_field = (
            "max_completion_tokens"
            if uses_max_completion_tokens(self.wire_model, base_url)
            else "max_tokens"
        )
        # One client (one connection pool) per LM, shared by its copies and threads; its
        # transport records each request (`attach_requests` names the role and tracker).
        http_client, self._transport = recording_http_client(timeout)
        self._client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=num_retries,
            http_client=http_client,
        )

    def attach_requests(self, role: str, tracker: UsageTracker) -> None:
        """Record this LM's HTTP requests (each retry its own) with `tracker` as `role`."""
        self._transport.attach(role, tracker)

    def __deepcopy__(self, memo: dict[int, Any]) -> OpenAIChatLM:
        # `lm.copy()` deep-copies: the client (its pool and key) and its transport are
        # shared, never copied.
        clone = copy.copy(self)
        for name, value in vars(self).items():
            if name not in _SHARED:
                setattr(clone, name, copy.deepcopy(value, memo))
        return clone

    def forward(self, prompt: str | None = None, messages: Any = None, **kwargs: Any) -> Any:
        use_cache = kwargs.get("cache", self.cache)
        settings = {**self.kwargs, **kwargs}
        body: dict[str, Any] = {
            name: value
            for name, value in settings.items()
            if name not in NOT_SENT and value is not None
        }
        if "max_tokens" in body and self._max_tokens_field != "max_tokens":
            body[self._max_tokens_field] = body.pop("max_tokens")
        body["messages"] = messages or [{"role": "user", "content": prompt}]
        key = {"_fn_identifier": CACHE_FUNCTION, "model": self.wire_model, **body}
        key[response_cache.NAMESPACE_FIELD] = response_cache.namespace(self.cache_fingerprint)
        if settings.get("rollout_id") is not None:
            key["rollout_id"] = settings["rollout_id"]
        if not use_cache:
            return self._create(body)
        while True:
            cached = response_cache.lookup(key)
            if cached is not None:
                return _free_copy(cached)
            flight, leading = _join_flight(name := dspy.cache.cache_key(key))
            if leading:
                break
            # The same request is in flight on another thread: its answer is this one's, as
            # the cache would give it a moment later; a failed flight is asked again here.
            answer = flight.result()
            if answer is not None:
                return _free_copy(answer)
        try:
            response = self._create(body)
        except BaseException:
            _land(name, flight, None)
            raise
        response_cache.store(key, response)  # held until the adapter parsed it
        _land(name, flight, response)
        return response

    async def aforward(self, prompt: str | None = None, messages: Any = None, **kwargs: Any) -> Any:
        import asyncio

        return await asyncio.to_thread(self.forward, prompt, messages, **kwargs)

    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        # The raw route of the `openai` client: same retries, timeout and error classes as
        # `chat.completions.create`, without its per-call conversion of the request through
        # the typed-dict schema and of the response into pydantic models and back (together
        # several ms a call, most of this client's own cost). DSPy reads plain dicts.
        try:
            completion = self._client.post(
                "/chat/completions", body={"model": self.wire_model, **body}, cast_to=object
            )
        except RequestsStopped as error:
            raise Interrupted(str(error)) from None
        except openai.APIError as error:
            if isinstance(error.__cause__, RequestsStopped):  # a client that wraps it
                raise Interrupted(str(error.__cause__)) from None
            raise _as_lm_error(error, self.model) from error
        choices = completion.get("choices") if isinstance(completion, dict) else None
        if not isinstance(choices, list) or not choices:
            raise LMProviderError(
                f"the endpoint answered without choices: {str(completion)[:200]!r}",
                model=self.model,
                provider="openai-compatible",
            )
        return completion


def _as_lm_error(error: openai.APIError, model: str) -> LMError:
    """DSPy's error class for an `openai` client error (after the client's own retries)."""
    message = " ".join(str(getattr(error, "message", error)).split())[:300]
    details: dict[str, Any] = {"model": model, "provider": "openai-compatible"}
    if isinstance(error, openai.APITimeoutError):
        return LMTimeoutError(f"timed out: {message}", **details)
    if isinstance(error, openai.APIConnectionError):
        return LMTransportError(f"connection failed: {message}", **details)
    status = getattr(error, "status_code", None)
    details["status"] = status
    if isinstance(error, openai.RateLimitError):
        return LMRateLimitError(message, **details)
    if isinstance(error, (openai.AuthenticationError, openai.PermissionDeniedError)):
        return LMAuthError(message, **details)
    if isinstance(error, openai.BadRequestError):
        if "context" in message.lower() and "length" in message.lower():
            return ContextWindowExceededError(message=message, **details)
        return LMInvalidRequestError(message, **details)
    if status is not None and status >= 500:
        return LMServerError(message, **details)
    return LMProviderError(message, **details)


# Identical requests in flight at once (two policies' episodes reaching the same prompt in
# parallel) are asked once. Without this both reach the server, may get different answers
# (batched decoding is timing-dependent), and the cache keeps only one of them: a rerun from
# the warm cache then replays another conversation than the run it resumes. Keyed like the
# cache itself (the model's fingerprint, the request, the rollout id).
_flights: dict[str, Future] = {}
_flights_lock = threading.Lock()


def _join_flight(name: str) -> tuple[Future, bool]:
    """The flight of the request whose cache key is `name`, and whether this thread leads
    it (asks the server)."""
    with _flights_lock:
        flight = _flights.get(name)
        if flight is not None:
            return flight, False
        flight = _flights[name] = Future()
        return flight, True


def _land(name: str, flight: Future, response: dict[str, Any] | None) -> None:
    """End the flight `name`: its followers get `response` (None: the request failed)."""
    with _flights_lock:
        _flights.pop(name, None)
    flight.set_result(response)


def _free_copy(response: dict[str, Any]) -> dict[str, Any]:
    """A response served without a request: a copy that reports no usage (it cost nothing)."""
    copied = copy.deepcopy(response)
    copied["usage"] = {}
    copied.pop("timings", None)  # llama-server's: the server spent nothing on this one
    return copied
