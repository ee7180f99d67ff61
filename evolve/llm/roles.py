"""DSPy LMs per role, usage tracking attached, and the context that opens them.

`open_role_lms(config)` is the one way the toolkit gets its models: it checks keys before
any call, loads the LM client completely (in the calling thread, before any worker starts),
starts the embedded server for roles with no endpoint, builds one `dspy.LM` per role and
stops the server when the context closes.
"""

from __future__ import annotations

import importlib
import pickle
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import urlsplit

import dspy
from dspy.utils.exceptions import LMError, LMUnexpectedError

from evolve.core.errors import EndpointError, Interrupted, LMClientError
from evolve.core.stopping import clear_endpoint_failure, stop_for_endpoint_failure
from evolve.llm.adapter import STRUCTURED_OUTPUT_ATTRIBUTE, StructuredJSONAdapter
from evolve.llm.attempts import STOP, install_litellm_session, litellm_requests_recorded
from evolve.llm.config import (
    ROLES,
    EndpointConfig,
    LLMConfig,
    Role,
)
from evolve.llm.disk_cache import check_response_cache
from evolve.llm.openai_client import OpenAIChatLM
from evolve.llm.response_cache import answering, hold_in_adapters, scrub_cached_responses
from evolve.llm.server import EmbeddedServer
from evolve.llm.usage import UsageTracker
from evolve.llm.usage_callback import track_usage

# DSPy 3.4's default ("auto") engine routes openai/* through its native lm15 client, which
# speaks the newer OpenAI dialect (max_completion_tokens). llama.cpp's server ignores that
# field and would generate until the context is full; LiteLLM sends max_tokens, which
# llama.cpp, vLLM, Ollama and OpenAI all honour.
ENGINE = "litellm"

# Modules an LM call may import on first use. DSPy loads litellm through importlib's
# LazyLoader and litellm resolves `completion` & co. lazily too; neither is thread-safe, and
# unpickling a cached response imports `litellm.types.utils` from whichever thread hits the
# cache first. Worker threads racing through those imports failed with "partially
# initialized module 'litellm'", `KeyError: 'litellm'` or an import deadlock, so every one
# of them is imported, and every lazy attribute resolved, in the thread that opens the LMs.
CLIENT_MODULES = (
    "dspy.clients.call_result",
    "dspy.clients.disk_serialization",
    "dspy.clients.engines.legacy_engine",
    "dspy.clients.execution",
    "dspy.adapters.json_adapter",
    "openai.resources.chat.completions",
    "openai.types.chat",
)
LITELLM_MODULES = (
    "litellm",
    "litellm.types.utils",
    "litellm.litellm_core_utils.core_helpers",
    "dspy.clients._litellm",
    "dspy.clients.engines.litellm_engine",
    "dspy.clients.engines.litellm_errors",
)
LITELLM_LAZY_ATTRIBUTES = ("completion", "acompletion", "ModelResponse", "Usage", "Choices")

_client_loaded = threading.Lock()
_loaded: set[str] = set()


def load_lm_client(*, litellm: bool = False) -> None:
    """Import the LM clients' modules completely, once, before any worker thread starts.

    litellm (a few seconds of imports) is loaded only when an endpoint uses it.
    """
    with _client_loaded:
        if "openai" not in _loaded:
            for module in CLIENT_MODULES:
                importlib.import_module(module)
            _loaded.add("openai")
        if litellm and "litellm" not in _loaded:
            _load_litellm()
            _loaded.add("litellm")


def _load_litellm() -> None:
    from dspy.clients._litellm import get_litellm

    for module in LITELLM_MODULES:
        importlib.import_module(module)
    module = get_litellm(feature="evolve LM roles")
    for name in LITELLM_LAZY_ATTRIBUTES:
        getattr(module, name)
    install_litellm_session()  # each request recorded and stoppable, as on our own client
    # A cached response is a pickled litellm ModelResponse: one round trip resolves every
    # class its unpickling needs, here rather than in the first worker.
    response = module.ModelResponse(choices=[{"message": {"content": "{}"}}])
    pickle.loads(pickle.dumps(response))


def _is_client_failure(error: BaseException) -> bool:
    """An error raised inside this process's LM client, not by the endpoint.

    DSPy wraps any exception escaping its engine as `LMUnexpectedError`, whatever its cause;
    transport and provider failures arrive as lm15 errors or OS-level errors instead.
    """
    from dspy import lm15

    if isinstance(error, LMUnexpectedError):
        cause = error.__cause__
        return cause is not None and not isinstance(cause, (lm15.LM15Error, OSError, LMError))
    return isinstance(error, (KeyError, AttributeError, ImportError, pickle.UnpicklingError))


class EndpointLM(dspy.LM):
    """`dspy.LM` whose in-process client failures are not reported as endpoint failures, and
    whose calls refused after the stop end as `Interrupted` (litellm reports the refusal as a
    connection error), and whose responses are cached under the rules of
    `evolve.llm.response_cache` (DSPy reads and writes the cache itself on this route: its
    calls are marked as this model's)."""

    cache_fingerprint: str | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            with answering(self.cache_fingerprint):
                return super().__call__(*args, **kwargs)
        except Exception as error:
            if STOP.is_set() and not isinstance(error, Interrupted):
                raise Interrupted(
                    f"{self.model} call not completed: the process is stopping; a rerun resumes"
                ) from error
            _raise_failure(self.model, error)

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        try:
            with answering(self.cache_fingerprint):
                return await super().acall(*args, **kwargs)
        except Exception as error:
            _raise_failure(self.model, error)


def _raise_failure(model: str, error: Exception) -> NoReturn:
    """Raise what a failed LM call ends in: a client failure as ours; an endpoint failure
    (after the client's retries) as it is, once it has stopped every other worker."""
    if _is_client_failure(error):
        raise _client_error(model, error) from error
    if isinstance(error, LMError):
        stop_for_endpoint_failure(error)
    raise error


def _client_error(model: str, error: BaseException) -> LMClientError:
    cause = error.__cause__ if isinstance(error, LMUnexpectedError) and error.__cause__ else error
    text = " ".join(f"{type(cause).__name__}: {cause}".split())[:200]
    return LMClientError(
        f"the LM client failed inside this process on a {model} call ({text}); this is not "
        f"an endpoint failure but a toolkit bug: rerun to resume, and report it if it repeats"
    )


def attach_usage_tracking(lm: dspy.BaseLM, role: str, tracker: UsageTracker) -> dspy.BaseLM:
    """Count `lm`'s calls as `role` in `tracker`, and its HTTP requests one by one where they
    go through a recording transport: `OpenAIChatLM`'s own, litellm's session for an
    `EndpointLM`. Other LMs (scripted test LMs) count one request per call not cached."""
    attach_requests = getattr(lm, "attach_requests", None)
    if attach_requests is not None:
        attach_requests(role, tracker)
    recorded = attach_requests is not None or (
        isinstance(lm, EndpointLM) and litellm_requests_recorded()
    )
    return track_usage(lm, role, tracker, requests_recorded=recorded)


class GuardedOpenAIChatLM(OpenAIChatLM):
    """`OpenAIChatLM` whose in-process client failures are not reported as endpoint ones."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as error:
            _raise_failure(self.model, error)

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().acall(*args, **kwargs)
        except Exception as error:
            _raise_failure(self.model, error)


def build_lm(endpoint: EndpointConfig) -> dspy.BaseLM:
    """A DSPy LM for an OpenAI-compatible endpoint (the key is resolved, never stored)."""
    load_lm_client(litellm=endpoint.client == "litellm")
    settings: dict[str, Any] = {
        "api_key": endpoint.resolve_api_key(),
        "temperature": endpoint.temperature,
        "max_tokens": endpoint.max_tokens,
        "cache": endpoint.cache,
        "num_retries": endpoint.retries,
        "timeout": endpoint.timeout,
    }
    model = f"openai/{endpoint.model}"
    lm: dspy.BaseLM
    if endpoint.client == "openai":
        lm = GuardedOpenAIChatLM(
            model,
            base_url=endpoint.resolved_base_url(),
            cache_fingerprint=endpoint.cache_fingerprint,
            **settings,
        )
    else:
        lm = EndpointLM(model, api_base=endpoint.resolved_base_url(), engine=ENGINE, **settings)
        lm.cache_fingerprint = endpoint.cache_fingerprint  # never a setting: it would be sent
    setattr(lm, STRUCTURED_OUTPUT_ATTRIBUTE, endpoint.structured_output)
    return lm


@dataclass
class RoleLMs:
    """The three roles' LMs, their endpoints' descriptions and the shared usage tracker."""

    simulator: dspy.BaseLM
    agent: dspy.BaseLM
    reflector: dspy.BaseLM
    usage: UsageTracker = field(default_factory=UsageTracker)
    endpoints: dict[str, str] = field(default_factory=dict)
    # Per role, identity fields that replace those read from the LM (the embedded server:
    # its port changes every start, its model file does not).
    identity_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_lms(
        cls,
        simulator: dspy.BaseLM,
        agent: dspy.BaseLM,
        reflector: dspy.BaseLM,
        endpoints: dict[str, str] | None = None,
    ) -> RoleLMs:
        tracker = UsageTracker()
        lms = {"simulator": simulator, "agent": agent, "reflector": reflector}
        for role, lm in lms.items():
            attach_usage_tracking(lm, role, tracker)
        return cls(usage=tracker, endpoints=endpoints or {}, **lms)

    def lm(self, role: Role) -> dspy.BaseLM:
        return getattr(self, role)

    def context(self, role: Role):
        """Run DSPy predictors as `role`: its LM, the JSON adapter, and the response cache
        keeping only replies that parsed (`hold_in_adapters`)."""
        hold_in_adapters()
        return dspy.context(lm=self.lm(role), adapter=StructuredJSONAdapter())

    def model_names(self) -> dict[str, str]:
        return {role: self.lm(role).model for role in ROLES}

    def identity(self, role: Role) -> dict[str, Any]:
        """What a role's answers depend on, without secrets, for caches keyed on it.

        Model, endpoint address (scheme://host:port/path; never credentials, query or key),
        structured-output dialect, temperature, max_tokens and the endpoint's
        `cache_fingerprint` when one is set.
        """
        lm = self.lm(role)
        kwargs = dict(getattr(lm, "kwargs", None) or {})
        identity: dict[str, Any] = {
            "model": str(getattr(lm, "model", type(lm).__name__)),
            "endpoint": endpoint_address(
                str(kwargs.get("api_base") or getattr(lm, "base_url", None) or "")
            ),
            "structured_output": getattr(lm, STRUCTURED_OUTPUT_ATTRIBUTE, None),
            "temperature": kwargs.get("temperature"),
            "max_tokens": kwargs.get("max_tokens", kwargs.get("max_completion_tokens")),
        }
        fingerprint = getattr(lm, "cache_fingerprint", None)
        if fingerprint and role not in self.identity_overrides:
            # Only when set, so tables keyed before fingerprints existed stay valid; the
            # embedded server's overrides name its model file already.
            identity["cache_fingerprint"] = fingerprint
        identity.update(self.identity_overrides.get(role, {}))
        return identity


def endpoint_address(url: str) -> str:
    """scheme://host[:port]/path of an endpoint URL, without userinfo, query or fragment."""
    if not url:
        return ""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}"


def check_reachable(endpoint: EndpointConfig, timeout: float = 10.0) -> None:
    """Fail fast, before any LLM call, when nothing answers at an endpoint's address.

    Any HTTP answer (even 401/404) proves a server is there; only connection-level failures
    (refused, unknown host, timeout) are errors, so servers without GET /models still pass.
    """
    url = f"{endpoint.resolved_base_url()}/models"
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {endpoint.resolve_api_key()}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise EndpointError(
            f"cannot reach the {endpoint.model} endpoint at {endpoint.shown_base_url()}: "
            f"{reason}; check that the server is running and that --base-url (or "
            f"$OPENAI_BASE_URL) is right"
        ) from None


@contextmanager
def open_role_lms(config: LLMConfig) -> Iterator[RoleLMs]:
    clear_endpoint_failure()  # an earlier session's failure does not refuse these LMs' calls
    config.check_keys()  # before any server start or LLM call
    # Here, in the calling thread: before any worker thread starts.
    load_lm_client(
        litellm=any(
            endpoint is not None and endpoint.client == "litellm"
            for endpoint in (config.endpoint_for(role) for role in ROLES)
        )
    )
    if any((config.endpoint_for(role) or config.embedded).cache for role in ROLES):
        check_response_cache()  # may replace the cache: before it is wrapped below
    scrub_cached_responses()  # the cache in use now (dspy.configure_cache replaces it)
    for endpoint in {config.endpoint_for(role) for role in ROLES} - {None}:
        check_reachable(endpoint)
    with ExitStack() as stack:
        endpoints: dict[Role, EndpointConfig] = {}
        embedded_identity: dict[str, Any] = {}
        if config.needs_embedded_server():
            server = stack.enter_context(EmbeddedServer(config.embedded))
            embedded = config.embedded
            model_file = server.model_path
            embedded_identity = {
                "endpoint": "embedded",
                # The name is the model size's, not the file's: Hub and PyPI copies are one model.
                "model_file": f"{server.model_file_name} ({model_file.stat().st_size} bytes)"
                if model_file is not None
                else server.model_name,
            }
            local = EndpointConfig(
                model=server.model_name,
                base_url=server.base_url,
                api_key_env="EVOLVE_EMBEDDED_API_KEY",
                temperature=embedded.temperature,
                max_tokens=embedded.max_tokens,
                timeout=embedded.timeout,
                retries=embedded.retries,
                cache=embedded.cache,
                # The served name says server kind and slots; the file, which weights.
                cache_fingerprint=f"{server.model_name} {embedded_identity['model_file']}",
                structured_output="llama_cpp",
            )
        for role in ROLES:
            endpoints[role] = config.endpoint_for(role) or local
        user_temperature = config.embedded.simulator_temperature
        if config.endpoint_for("simulator") is None and user_temperature is not None:
            update = {"temperature": user_temperature}
            endpoints["simulator"] = local.model_copy(update=update)
        # One LM object per role (each carries its role's usage callback); identical
        # endpoints still share DSPy's response cache, which is keyed on the request.
        lms = {role: build_lm(endpoints[role]) for role in ROLES}
        role_lms = RoleLMs.from_lms(
            **lms, endpoints={role: endpoints[role].describe() for role in ROLES}
        )
        role_lms.identity_overrides = {
            role: dict(embedded_identity) for role in ROLES if config.endpoint_for(role) is None
        }
        yield role_lms
