"""Configuration of the LLM synthesis pipeline: the environment's shape plus the LLM knobs.

The shape fields (periods, questions, changes per period, ...) are offline synthesis's
`OfflineSynthesisConfig`, with its consistency checks, so one TOML file describes an environment for
both kinds of synthesis. The rest bounds the LLM work (attempts, refinements, temperatures), sets
the language of the generated text and prices the tokens.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evolve.core.errors import ConfigError
from evolve.core.files import read_toml_file
from evolve.core.spec_base import format_validation_error
from evolve.simulator.synthesis.presets import PRESETS, OfflineSynthesisConfig

# Bumped whenever prompts or stage semantics change, so work dirs of older runs are not reused.
PIPELINE_VERSION = "1"

# Language codes people type, and the names the prompts use for them.
_LANGUAGE_NAMES = {
    "en": "English",
    "zh": "Chinese",
    "ja": "Japanese",
    "ko": "Korean",
    "fr": "French",
    "de": "German",
    "es": "Spanish",
    "it": "Italian",
    "pt": "Portuguese",
    "ru": "Russian",
    "ar": "Arabic",
    "hi": "Hindi",
    "nl": "Dutch",
}


class Prices(BaseModel):
    """US dollars per million tokens; the defaults are gpt-4.1's list prices (the paper's model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_per_million: float = Field(default=2.0, ge=0)
    output_per_million: float = Field(default=8.0, ge=0)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (
            prompt_tokens * self.input_per_million + completion_tokens * self.output_per_million
        ) / 1_000_000


class RetryBudget(BaseModel):
    """How much LLM work one user may spend before it is excluded (and reported)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage_attempts: int = Field(
        default=3,
        ge=1,
        description="Calls per synthesis step; each retry is told why the last output failed.",
    )
    answer_refinements: int = Field(
        default=3, ge=0, description="Rewrites of an answer its classifier did not map back."
    )
    query_refinements: int = Field(
        default=3, ge=0, description="Rewrites of a query whose exposed values were not recovered."
    )


class LLMSynthesisConfig(OfflineSynthesisConfig):
    """An environment shape (see `OfflineSynthesisConfig`) plus the LLM pipeline's settings."""

    lang: str = Field(
        default="en",
        description="Language of generated text; variable names and values stay ASCII.",
    )
    workers: int = Field(default=4, ge=1, description="Users generated concurrently.")
    retries: RetryBudget = RetryBudget()
    prices: Prices = Prices()
    # The original samples questions and state updates at a high temperature and everything
    # else at a low one; None leaves the endpoint's own temperature.
    creative_temperature: float | None = Field(default=1.0, ge=0.0, le=2.0)
    precise_temperature: float | None = Field(default=0.0, ge=0.0, le=2.0)
    answer_sentences: str = Field(default="2-3", description="Length of each personalized answer.")
    profile_chars: int = Field(
        default=1500, ge=200, description="Persona text shown to the LLM (longer is cut)."
    )

    @property
    def language_name(self) -> str:
        return _LANGUAGE_NAMES.get(self.lang.lower(), self.lang)

    @property
    def total_months(self) -> int:
        """The horizon the questions must stay relevant for (num_periods x period length)."""
        months = self.num_periods * self.period_length
        return months if self.period_unit == "months" else max(1, round(months / 30))

    def synthesis_payload(self, seed: int, simulator_model: str) -> dict[str, Any]:
        """Everything that changes generated content (the work directory's key is its hash).

        Excluded: the user count (user i never depends on how many users there are), worker
        count, prices and the episode defaults, none of which changes a generated user.
        """
        content = self.model_dump(
            mode="json",
            exclude={"name", "num_users", "workers", "prices", "rounds_initial", "rounds_update"},
        )
        return {
            "pipeline": PIPELINE_VERSION,
            "config": content,
            "seed": seed,
            "simulator_model": simulator_model,
        }

    def synthesis_key(self, seed: int, simulator_model: str) -> str:
        payload = self.synthesis_payload(seed, simulator_model)
        text = json.dumps(payload, sort_keys=True, ensure_ascii=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def synthesis_config_from_dict(data: dict[str, Any], source: str = "config") -> LLMSynthesisConfig:
    """Build a config; an optional `preset` key names the offline preset the fields override."""
    data = dict(data)
    preset = data.pop("preset", None)
    base: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(
                f"{source}: unknown preset {preset!r}; choose one of {', '.join(PRESETS)} or "
                "remove `preset` and give every shape field"
            )
        base = PRESETS[preset].model_dump()
    try:
        return LLMSynthesisConfig.model_validate({**base, **data})
    except ValidationError as error:
        problems = format_validation_error(
            f"{source}: invalid LLM synthesis config", error, LLMSynthesisConfig, limit=5
        )
        raise ConfigError(
            f"{problems} (see experiments/synthesize_llm.toml for an annotated example)"
        ) from None


def load_synthesis_config(path: str | Path) -> LLMSynthesisConfig:
    """Read a TOML synthesis config (format: experiments/synthesize_llm.toml)."""
    path = Path(path)
    data = read_toml_file(
        path, "synthesis config", missing_hint="start from experiments/synthesize_llm.toml"
    )
    return synthesis_config_from_dict(data, source=str(path))
