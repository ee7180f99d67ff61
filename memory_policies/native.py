"""`native`: the whole conversation stays in context; no long-term memory at all."""

from __future__ import annotations

from typing import ClassVar, Literal

import dspy

from memory_policies.base import MemoryPolicy
from memory_policies.common import (
    CHOICE_DESC,
    OPTIONS_DESC,
    QUESTION_DESC,
    REPLY_DESC,
    USER_MESSAGE_DESC,
    PassThrough,
)
from memory_policies.messages import MemoryState
from memory_policies.paper import NativeChatChoose, NativeChatReply
from memory_policies.variants import VARIANTS, Variant

DEFAULT_USE = (
    "You are a helpful personal assistant in a long-running conversation with one user. "
    "Earlier messages tell you about the user's situation and preferences, which may change "
    "over time: personalise your reply using the most recent information the user gave."
)

_HISTORY_DESC = "the whole conversation so far, oldest first"


class NativeReply(dspy.Signature):
    conversation: str = dspy.InputField(desc=_HISTORY_DESC)
    user_message: str = dspy.InputField(desc=USER_MESSAGE_DESC)
    reply: str = dspy.OutputField(desc=REPLY_DESC)


class NativeChoose(dspy.Signature):
    conversation: str = dspy.InputField(desc=_HISTORY_DESC)
    question: str = dspy.InputField(desc=QUESTION_DESC)
    options: str = dspy.InputField(desc=OPTIONS_DESC)
    choice: int = dspy.OutputField(desc=CHOICE_DESC)


class NativeState(MemoryState):
    kind: Literal["native"] = "native"


class NativePolicy(MemoryPolicy):
    """Long-context baseline: `write` and `read` are identity, `short_term` is the history.

    The history grows without bound, so a long episode can exceed the LM's context window;
    that is the baseline's known weakness, not something this policy hides by truncating.
    """

    kind: ClassVar[str] = "native"
    parameter_names: ClassVar[tuple[str, ...]] = ()
    default_parameters: ClassVar[dict[str, int]] = {}
    state_type: ClassVar[type[MemoryState]] = NativeState
    choose_signature: ClassVar[type[dspy.Signature]] = NativeChoose
    variants: ClassVar[tuple[Variant, ...]] = VARIANTS
    paper_choose_signature: ClassVar[type[dspy.Signature]] = NativeChatChoose

    def _build_modules(self) -> None:
        self.write = PassThrough()
        self.read = PassThrough()
        # The reference sends the history alone, with no system message: nothing to evolve.
        self.use = dspy.Predict(
            self.dialogue.pick(NativeReply.with_instructions(DEFAULT_USE), NativeChatReply)
        )

    def _instruction_predictors(self) -> dict[str, dspy.Predict]:
        return self.dialogue.pick({"use": self.use}, {})

    def _buffer_limit(self) -> int | None:
        return None

    def _write(self, state, messages, times) -> None:  # pragma: no cover - never flushes
        raise AssertionError("the native policy never writes")

    def describe_memory(self, state: MemoryState) -> str:
        return (
            "(no long-term memory: the whole conversation stays in context, "
            f"{len(state.short_term)} messages)"
        )
