"""How a synthesis stage talks to the simulator LLM: one call (usage, seed, cancellation), a
checked call retried with its problems fed back, and a text refined until a classifier
accepts it. Every stage of `evolve.simulator.synthesis.stages` goes through `StageCalls`.

Tokens are counted per call in the calling thread (`evolve.llm.usage.tracked_usage`), which
attributes them to the right user and stage even when users run concurrently. A stage's
`Usage` counts predictor calls (`calls`), those the server never saw (`cache_hits`), and
outputs that did not parse or failed validation (`parse_failures`, `rejected`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import dspy
from dspy.utils.exceptions import AdapterParseError

from evolve.core.errors import ToolkitError
from evolve.core.seeds import derive_seed
from evolve.llm.usage import Usage, tracked_usage
from evolve.simulator.synthesis.config import LLMSynthesisConfig
from evolve.simulator.synthesis.report import Stage

if TYPE_CHECKING:
    from evolve.llm import RoleLMs

T = TypeVar("T")


class StageFailure(Exception):
    """A stage's output stayed invalid after its retry budget: the user is excluded."""

    def __init__(self, stage: Stage, unit: str, reason: str) -> None:
        super().__init__(f"{stage.value} ({unit}): {reason}")
        self.stage = stage
        self.unit = unit
        self.reason = reason


class SynthesisCancelled(ToolkitError):
    """Another user's failure or an interrupt stopped the run; finished units are saved."""


def one_line(text: object, limit: int = 200) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def numbered(lines: Sequence[str]) -> str:
    return "\n".join(f"{index}. {line}" for index, line in enumerate(lines, 1))


def options_text(schema: dict[str, list[str]], variables: Sequence[str] | None = None) -> str:
    names = list(schema) if variables is None else list(variables)
    return "\n".join(f"- {var}: {' | '.join(schema[var])}" for var in names)


@dataclass(frozen=True)
class Refinement:
    """How one text is refined until a classifier accepts it (`StageCalls.refine`)."""

    stage: Stage
    unit: str
    subject: str  # names the text in the failure reason ("session 2", "variant (...)")
    budget: int  # refinements allowed after the first rejection
    judge: Callable[[str, int], tuple[bool, str]]  # (text, round) -> (accepted, problem)
    signature: type[dspy.Signature]  # the refine call
    key: str  # seed key of the refine calls: `<key>/<refinement number>`
    inputs: Callable[[str, str], dict[str, Any]]  # (text, problem) -> the refine call's inputs
    output: str  # the signature's field holding the refined text
    empty: str  # what an unusable refinement is called ("empty answer")


class StageCalls:
    """One user's calls to the simulator LLM, with the usage and refinements not yet saved
    (`take_pending` hands them to the unit that caused them)."""

    def __init__(
        self,
        config: LLMSynthesisConfig,
        lms: RoleLMs,
        *,
        user_id: str,
        seed: int,
        stop: threading.Event,
    ) -> None:
        self.config = config
        self.lms = lms
        self.user_id = user_id
        self.seed = seed
        self.stop = stop
        self.pending: dict[str, Usage] = {}
        self.pending_refinements = 0
        self.profile_text = ""  # the user's profile as later stages are shown it

    def take_pending(self) -> dict[str, Usage]:
        pending, self.pending = self.pending, {}
        return pending

    def call(
        self, stage: Stage, signature: type[dspy.Signature], *, key: str, creative: bool, **inputs
    ) -> tuple[dspy.Prediction | None, str | None]:
        """One predictor call as the simulator; a parse failure is counted and returned."""
        if self.stop.is_set():
            raise SynthesisCancelled("synthesis stopped; rerun the command to resume")
        lm_config: dict[str, Any] = {"seed": derive_seed(self.seed, self.user_id, key)}
        temperature = (
            self.config.creative_temperature if creative else self.config.precise_temperature
        )
        if temperature is not None:
            lm_config["temperature"] = temperature
        usage = self.pending.setdefault(stage.value, Usage())
        error: str | None = None
        prediction: dspy.Prediction | None = None
        with self.lms.context("simulator"), dspy.track_usage() as tracker:
            try:
                prediction = dspy.Predict(signature)(**inputs, config=lm_config)
            except AdapterParseError as exc:
                error = one_line(exc)
            finally:
                served = tracked_usage(tracker)
                usage.calls += 1
                if not served.calls and (prediction is not None or error is not None):
                    usage.cache_hits += 1  # answered, and the server was never asked
                usage.prompt_tokens += served.prompt_tokens
                usage.completion_tokens += served.completion_tokens
        if error is not None:
            usage.parse_failures += 1
        return prediction, error

    def checked(
        self,
        stage: Stage,
        unit: str,
        signature: type[dspy.Signature],
        check: Callable[[dspy.Prediction], tuple[T, list[str]]],
        *,
        creative: bool = False,
        **inputs: Any,
    ) -> T:
        """Call, validate, and retry with the problems fed back, up to `stage_attempts`."""
        feedback = "none"
        problems: list[str] = []
        attempts = self.config.retries.stage_attempts
        for attempt in range(attempts):
            prediction, error = self.call(
                stage, signature, key=f"{unit}/{attempt}", creative=creative,
                feedback=feedback, **inputs,
            )  # fmt: skip
            if prediction is None:
                problems = [f"the output was not valid JSON with the requested fields ({error})"]
            else:
                result, problems = check(prediction)
                if not problems:
                    return result
                self.pending[stage.value].rejected += 1
            feedback = "Fix these problems: " + "; ".join(problems[:6])
        raise StageFailure(
            stage,
            unit,
            f"still invalid after {attempts} attempt(s): " + one_line("; ".join(problems[:3]), 300),
        )

    def refine(self, refinement: Refinement, text: str) -> str:
        """`text`, or its refinement, once the judge accepts it; a judge still rejecting after
        the budget excludes the user. An unusable refinement spends a round: the unchanged
        text is known to fail."""
        stage = refinement.stage
        ok, problem = refinement.judge(text, 0)
        used = 0
        while not ok:
            self.pending[stage.value].rejected += 1
            if used >= refinement.budget:
                raise StageFailure(
                    stage,
                    refinement.unit,
                    f"{refinement.subject}: {problem} after {used} refinement(s)",
                )
            used += 1
            self.pending_refinements += 1
            prediction, error = self.call(
                stage,
                refinement.signature,
                key=f"{refinement.key}/{used}",
                creative=False,
                **refinement.inputs(text, problem),
            )
            refined = (
                str(getattr(prediction, refinement.output)).strip()
                if prediction is not None
                else ""
            )
            if not refined:
                problem = f"the refinement was unusable ({error or refinement.empty})"
                continue
            text = refined
            ok, problem = refinement.judge(text, used)
        return text
