"""The code of every registered memory-policy model (MLflow "models from code").

`evolve export` logs this file, not a pickle: MLflow copies it into the model and runs it at
load time, so it must import nothing from `evolve` — only mlflow, dspy, pydantic and
`memory_policies` (which the model also carries as `code_paths`). The policy bundle
(`policy.json`) is the model's only artifact.

The LM endpoint is never stored with the model. At load time it comes from `model_config`
(`mlflow.pyfunc.load_model(uri, model_config={...})`) or from environment variables:

| setting | model_config key | environment variable | default |
|---|---|---|---|
| LiteLLM model name | `model` | `MEMORY_POLICY_MODEL` | none: the LM of `dspy.configure` |
| OpenAI-compatible base URL | `base_url` | `MEMORY_POLICY_BASE_URL` | the provider's |
| name of the API-key variable | `api_key_env` | `MEMORY_POLICY_API_KEY_ENV` | `OPENAI_API_KEY` |

A key itself is only ever read from the environment.
"""

from __future__ import annotations

import os
from typing import Any

import dspy
import mlflow
from mlflow.pyfunc import PythonModel
from pydantic import BaseModel, Field

MODEL_ENV = "MEMORY_POLICY_MODEL"
BASE_URL_ENV = "MEMORY_POLICY_BASE_URL"
API_KEY_ENV_ENV = "MEMORY_POLICY_API_KEY_ENV"
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
CONFIG_KEYS = ("model", "base_url", "api_key_env", "temperature", "max_tokens")


class PolicyRequest(BaseModel):
    """One call: a user turn (`user_message` with the user's `state`) or a `question`."""

    user_message: str = Field(default="", description="The user's message (an on-policy turn).")
    state: str | None = Field(
        default=None, description="The user's memory state JSON from the last call; None: new."
    )
    question: str | None = Field(default=None, description="Answer read-only instead.")
    options: list[str] | None = Field(default=None, description="Multiple-choice options.")


class PolicyResponse(BaseModel):
    reply: str
    state: str = Field(description="Memory state JSON after the turn (unchanged for questions).")
    choice: int | None = Field(default=None, description="1-based option, for questions.")


def lm_from_settings(config: dict[str, Any] | None) -> dspy.LM | None:
    """The LM named by `model_config` or the environment; None: the caller configures DSPy."""
    config = dict(config or {})
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"unknown model_config keys {unknown}; expected some of {list(CONFIG_KEYS)} "
            "(an API key goes in the environment variable named by api_key_env)"
        )
    model = config.get("model") or os.environ.get(MODEL_ENV)
    if not model:
        return None
    base_url = config.get("base_url") or os.environ.get(BASE_URL_ENV)
    key_variable = (
        config.get("api_key_env") or os.environ.get(API_KEY_ENV_ENV) or DEFAULT_API_KEY_ENV
    )
    kwargs: dict[str, Any] = {"api_key": os.environ.get(key_variable) or "unused"}
    if base_url:
        kwargs["api_base"] = base_url
    for name in ("temperature", "max_tokens"):
        if config.get(name) is not None:
            kwargs[name] = config[name]
    return dspy.LM(model, **kwargs)


class PolicyModel(PythonModel):
    """A memory policy as an MLflow pyfunc model; `predict` takes `PolicyRequest` records."""

    def load_context(self, context) -> None:
        import memory_policies

        self.policy = memory_policies.load(context.artifacts["policy"])
        self.lm = lm_from_settings(getattr(context, "model_config", None))

    def predict(
        self, context, model_input: list[PolicyRequest], params: dict[str, Any] | None = None
    ) -> list[dict[str, str | int | None]]:
        if self.lm is None and dspy.settings.lm is None:
            raise ValueError(
                "no LM for the memory policy: pass model_config={'model': ...} to "
                f"mlflow.pyfunc.load_model, set {MODEL_ENV}, or call dspy.configure(lm=...)"
            )
        settings = {"lm": self.lm, "adapter": dspy.JSONAdapter()} if self.lm is not None else {}
        with dspy.context(**settings):
            return [self._one(PolicyRequest.model_validate(r)).model_dump() for r in model_input]

    def _one(self, request: PolicyRequest) -> PolicyResponse:
        policy = self.policy
        state = policy.state_from_json(request.state) if request.state else policy.initial_state()
        if request.question:
            answer = policy.answer(state, request.question, request.options)
            return PolicyResponse(
                reply=answer.text, choice=answer.choice, state=state.model_dump_json()
            )
        reply, state = policy.respond(state, request.user_message)
        return PolicyResponse(reply=reply, state=state.model_dump_json())


mlflow.models.set_model(PolicyModel())
