"""How a policy asks its `use` predictor, chosen once per variant when the policy is built
(`MemoryPolicy.dialogue`): the on-policy reply and the answer to an evaluation question,
through DSPy fields (variant evolve) or raw chat turns (variant paper)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dspy
from dspy.utils.exceptions import AdapterParseError

from memory_policies.choice import lean_choice
from memory_policies.common import capped_call_config
from memory_policies.messages import (
    MemoryState,
    PolicyAnswer,
    checked_choice,
    render_conversation,
    render_options,
    short_error,
)
from memory_policies.paper import chat_turns, paper_chat, paper_question_prompt


class Dialogue:
    """How a policy asks its `use` predictor, chosen once per variant when the policy is built
    (`MemoryPolicy.dialogue`): the on-policy reply and the answer to an evaluation question.
    The policy supplies what `use` is shown (`_use_inputs`); the dialogue, how it is asked."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Dialogue:
        return self  # stateless: every copy of a policy shares its variant's dialogue

    def pick(self, fields: Any, chat_turns: Any) -> Any:
        """Of a kind's two versions of a part (e.g. its `use` signature), the one this
        dialogue asks: `fields` under DSPy fields, `chat_turns` under raw chat turns."""
        raise NotImplementedError

    def reply(self, policy: Any, state: MemoryState, user_msg: str) -> dspy.Prediction | None:
        raise NotImplementedError

    def answer(
        self,
        policy: Any,
        state: MemoryState,
        question: str,
        options: Sequence[str] | None,
    ) -> PolicyAnswer:
        raise NotImplementedError


class FieldsDialogue(Dialogue):
    """variant=evolve: DSPy input fields (the recent messages as a rendered transcript), the
    reply capped; a multiple-choice question through the kind's `choose_signature`."""

    def pick(self, fields, chat_turns):
        return fields

    def reply(self, policy, state, user_msg):
        extra, _ = policy._use_inputs(state, user_msg)
        return policy._predict(
            state,
            "use",
            policy.use,
            **extra,
            conversation=render_conversation(state.short_term),
            user_message=user_msg,
            config=capped_call_config(),
        )

    def answer(self, policy, state, question, options):
        # The question and its options are the read's query, as under the paper's flow: the
        # options name the values a memory must tell apart.
        query = f"{question}\n{render_options(options)}" if options else question
        extra, retrieved = policy._use_inputs(state, query)
        conversation = render_conversation(state.short_term)
        if not options:
            try:
                prediction = policy.use(**extra, conversation=conversation, user_message=question)
            except AdapterParseError as exc:
                return PolicyAnswer(text="", parse_error=short_error(exc), retrieved=retrieved)
            return PolicyAnswer(text=str(prediction.reply).strip(), retrieved=retrieved)
        instructions = policy.use.signature.instructions
        signature = policy.choose_signature.with_instructions(instructions)
        try:
            # Demos (if an optimizer added any) are free-text replies: wrong shape here.
            with lean_choice():
                prediction = policy.use(
                    signature=signature,
                    demos=[],
                    **extra,
                    conversation=conversation,
                    question=question,
                    options=render_options(options),
                )
        except AdapterParseError as exc:
            text = str(exc.lm_response or "")
            return PolicyAnswer(text=text, parse_error=short_error(exc), retrieved=retrieved)
        return checked_choice(prediction.choice, str(prediction.choice), options, retrieved)


class ChatTurnsDialogue(Dialogue):
    """variant=paper, the reference code's: raw chat turns (see `memory_policies.paper`); with
    options, one user message holding the question, the numbered options and the JSON
    request, which is also the retrieval query."""

    def pick(self, fields, chat_turns):
        return chat_turns

    def reply(self, policy, state, user_msg):
        extra, _ = policy._use_inputs(state, user_msg)
        with paper_chat():
            return policy._predict(
                state,
                "use",
                policy.use,
                **extra,
                history=chat_turns(state.short_term),
                user_message=user_msg,
            )

    def answer(self, policy, state, question, options):
        prompt = paper_question_prompt(question, options) if options else question
        extra, retrieved = policy._use_inputs(state, prompt)
        signature = policy.use.signature
        if options:
            signature = policy.paper_choose_signature.with_instructions(signature.instructions)
        try:
            with paper_chat():
                prediction = policy.use(
                    signature=signature,
                    demos=[],
                    **extra,
                    history=chat_turns(state.short_term),
                    user_message=prompt,
                )
        except AdapterParseError as exc:
            text = str(exc.lm_response or "")
            return PolicyAnswer(text=text, parse_error=short_error(exc), retrieved=retrieved)
        if not options:
            return PolicyAnswer(text=str(prediction.reply).strip(), retrieved=retrieved)
        return checked_choice(prediction.choice, str(prediction.choice), options, retrieved)


FIELDS_DIALOGUE = FieldsDialogue()
CHAT_TURNS_DIALOGUE = ChatTurnsDialogue()
