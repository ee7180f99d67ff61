"""The memory-policy interface: explicit state in, state out; three DSPy sub-modules.

A policy never holds an LM: its predictors use the ambient DSPy LM, so the caller decides
which endpoint serves it (``dspy.context(lm=..., adapter=dspy.JSONAdapter())``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import dspy
from dspy.utils.exceptions import AdapterParseError
from pydantic import BaseModel, ValidationError

from memory_policies.dialogue import CHAT_TURNS_DIALOGUE, FIELDS_DIALOGUE, Dialogue
from memory_policies.errors import PolicyError
from memory_policies.evolvable import EvolvableModule
from memory_policies.messages import (
    MemoryState,
    Message,
    PolicyAnswer,
    parse_current_time,
)
from memory_policies.parameters import validate_parameters
from memory_policies.variants import (
    DEFAULT_VARIANT,
    EVOLVE,
    Variant,
    VariantRules,
    check_supported,
    check_variant,
    pop_variant,
    variant_rules,
)
from memory_policies.writes import WriteStrategy

logger = logging.getLogger(__name__)

BUNDLE_FORMAT = "memory_policies.bundle"
# 2: the policy variant is recorded as "variant" (version 1 bundles say "preset"; both load).
BUNDLE_FORMAT_VERSION = 2
BUNDLE_FILE = "policy.json"


class MemoryPolicy(EvolvableModule):
    """Base class: subclasses build `write`, `read`, `use` and implement `_write`.

    Hooks for subclasses (the rest is shared):
      - ``_build_modules()``: create ``self.write``, ``self.read``, ``self.use``.
      - ``_write(state, messages, times)``: fold messages leaving the buffer into memory
        (or ``write_strategies``: one `WriteStrategy` per variant, which `_write` calls).
      - ``_use_inputs(state, query)``: extra `use` inputs (e.g. the memory text) + what was read.
      - ``_instruction_predictors()``: component name -> predictor whose instruction it is.
    """

    kind: ClassVar[str]
    parameter_names: ClassVar[tuple[str, ...]] = ("update_every", "short_term_len")
    default_parameters: ClassVar[dict[str, int]] = {"update_every": 2, "short_term_len": 4}
    # Defaults that differ under variant=paper (the reference configs' values).
    paper_parameters: ClassVar[dict[str, int]] = {}
    state_type: ClassVar[type[MemoryState]] = MemoryState
    uses_embedder: ClassVar[bool] = False
    # The variants this kind can follow. A kind follows the paper's flow only when it says
    # so (it then needs a `paper_choose_signature`); building another variant is a
    # PolicyError before any LLM call.
    variants: ClassVar[tuple[Variant, ...]] = (EVOLVE.name,)
    # Multiple-choice variant of the `use` signature; shares the `use` instruction text.
    choose_signature: ClassVar[type[dspy.Signature]]
    # The same under variant=paper (a raw-chat signature, see memory_policies.paper).
    paper_choose_signature: ClassVar[type[dspy.Signature]]
    # The kind's write procedures by `VariantRules.writes` ("reference", "own"): the one of
    # the policy's variant becomes `self.writes`. A kind that overrides `_write` instead
    # declares none.
    write_strategies: ClassVar[Mapping[str, WriteStrategy]] = {}

    write: dspy.Module
    read: dspy.Module
    use: dspy.Predict

    def __init__(self, variant: str | None = None, **parameters: Any) -> None:
        super().__init__()
        chosen = pop_variant(self.kind, parameters, variant)
        # Set before the modules are built: the variant decides their signatures and texts.
        self.variant: Variant = check_supported(
            self.kind,
            check_variant(self.kind, DEFAULT_VARIANT if chosen is None else chosen),
            self.variants,
        )
        defaults = {**self.default_parameters}
        if self.rules.reference_defaults:
            defaults.update(self.paper_parameters)
        values = validate_parameters(self.kind, self.parameter_table(), {**defaults, **parameters})
        for name, value in values.items():
            setattr(self, name, value)
        # How replies and answers are asked, decided once for the variant.
        self.dialogue: Dialogue = CHAT_TURNS_DIALOGUE if self.rules.chat_turns else FIELDS_DIALOGUE
        # How memory is written, decided once for the variant (None: the kind's own `_write`).
        self.writes: WriteStrategy | None = self.write_strategies.get(self.rules.writes)
        self._build_modules()

    @property
    def rules(self) -> VariantRules:
        """What this policy's variant decides (see `memory_policies.variants`)."""
        return variant_rules(self.variant)

    # ----- hooks -----------------------------------------------------------------------------

    def _build_modules(self) -> None:
        raise NotImplementedError

    def _write(self, state: MemoryState, messages: list[Message], times: list[str | None]) -> None:
        if self.writes is None:
            raise NotImplementedError(f"{type(self).__name__} declares no write strategy")
        self.writes.write(self, state, messages, times)

    def _use_inputs(self, state: MemoryState, query: str) -> tuple[dict[str, str], list[str]]:
        return {}, []

    def _instruction_predictors(self) -> dict[str, dspy.Predict]:
        return {"use": self.use}

    def _buffer_limit(self) -> int | None:
        """Short-term size that triggers a write; None means the buffer never flushes."""
        return self.update_every + self.short_term_len

    def describe_memory(self, state: MemoryState) -> str:
        raise NotImplementedError

    # ----- state ----------------------------------------------------------------------------

    def initial_state(
        self, *, state_schema: Mapping[str, Sequence[str]] | None = None
    ) -> MemoryState:
        """A fresh state for one user.

        `state_schema` (the user's tracked variables: name -> possible values) is read only by
        policies that need it (`in_context_oracle`); callers that have it should always pass it.
        """
        return self.state_type(kind=self.kind)

    def state_from_json(self, data: dict[str, Any] | str) -> MemoryState:
        try:
            raw = json.loads(data) if isinstance(data, str) else dict(data)
        except json.JSONDecodeError as exc:
            raise PolicyError(f"memory state checkpoint is not valid JSON: {exc}") from exc
        if raw.get("kind") != self.kind:
            raise PolicyError(
                f"memory state of kind {raw.get('kind')!r} cannot be used with a "
                f"'{self.kind}' policy; resume with the policy that wrote the checkpoint"
            )
        try:
            return self.state_type.model_validate(raw)
        except ValidationError as exc:
            raise PolicyError(f"invalid '{self.kind}' memory state checkpoint: {exc}") from exc

    def _own_copy(self, state: MemoryState) -> MemoryState:
        if not isinstance(state, self.state_type):
            raise PolicyError(
                f"a '{self.kind}' policy needs a {self.state_type.__name__} (from "
                f"initial_state() or state_from_json()), got {type(state).__name__} "
                f"of kind {getattr(state, 'kind', None)!r}"
            )
        return state.model_copy(deep=True)

    # ----- the policy ------------------------------------------------------------------------

    def respond(self, state: MemoryState, user_msg: str) -> tuple[str, MemoryState]:
        """On-policy turn: reply to `user_msg`, then store the exchange (may trigger a write)."""
        state = self._own_copy(state)
        time = parse_current_time(user_msg)
        if time is not None:
            state.current_time = time
        prediction = self.dialogue.reply(self, state, user_msg)
        reply = str(prediction.reply).strip() if prediction is not None else ""
        self._ingest(
            state,
            [Message(role="user", content=user_msg), Message(role="assistant", content=reply)],
        )
        return reply, state

    def observe(self, state: MemoryState, messages: Sequence[Message]) -> MemoryState:
        """Off-policy ingestion of messages the policy did not produce."""
        state = self._own_copy(state)
        # Re-validate from plain data: the state must not share objects with the caller.
        self._ingest(
            state,
            [
                Message.model_validate(m.model_dump() if isinstance(m, BaseModel) else m)
                for m in messages
            ],
        )
        return state

    def answer(
        self, state: MemoryState, question: str, options: Sequence[str] | None = None
    ) -> PolicyAnswer:
        """Answer an evaluation question; read-only (the caller's state is never touched)."""
        return self.dialogue.answer(self, self._own_copy(state), question, options)

    def forward(self, state: MemoryState, user_msg: str) -> dspy.Prediction:
        """DSPy entry point (so `policy(state, msg)` works in DSPy tooling): one on-policy turn."""
        reply, new_state = self.respond(state, user_msg)
        return dspy.Prediction(reply=reply, state=new_state)

    def _ingest(self, state: MemoryState, messages: list[Message]) -> None:
        for message in messages:
            if message.role == "user":
                time = parse_current_time(message.content)
                if time is not None:
                    state.current_time = time
            state.short_term.append(message)
            state.short_term_times.append(state.current_time)
        limit = self._buffer_limit()
        if limit is None:
            return
        # Checking once after appending gives the same batches as checking after every message:
        # each flush takes the oldest `update_every`, in order, until the buffer is below limit.
        while len(state.short_term) >= limit:
            batch = state.short_term[: self.update_every]
            times = state.short_term_times[: self.update_every]
            del state.short_term[: self.update_every]
            del state.short_term_times[: self.update_every]
            self._write(state, batch, times)

    def _predict(
        self, state: MemoryState, component: str, predictor: dspy.Predict, **inputs: Any
    ) -> dspy.Prediction | None:
        """Call a predictor; an unparseable output is counted in the state, never hidden."""
        try:
            return predictor(**inputs)
        except AdapterParseError as exc:
            state.parse_failures[component] = state.parse_failures.get(component, 0) + 1
            logger.info("%s policy: unparseable %s output: %s", self.kind, component, exc)
            return None

    # ----- mutable parts and parameters -------------------------------------------------------

    # ----- bundles ---------------------------------------------------------------------------

    def embedder_name(self) -> str | None:
        return None

    def identity(self) -> dict[str, Any]:
        """What the policy's behaviour depends on, for run hashes and records (no LM, no key):
        kind, variant, parameters, instructions and the embedder's name."""
        return {
            "kind": self.kind,
            # Under its old name "preset": run and experiment config hashes include this
            # mapping, and a renamed key would refuse to resume every earlier run directory.
            "preset": self.variant,
            "parameters": self.parameters(),
            "components": self.components(),
            "embedder": self.embedder_name(),
        }

    def to_bundle(self, provenance: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The self-describing, JSON-ready bundle (no LM, endpoint, key or pickle inside)."""
        state = self.dump_state(json_mode=True)
        for predictor_state in state.values():
            # Predictors never own an LM here; if one was attached it may carry a key or URL.
            predictor_state["lm"] = None
        return {
            "format": BUNDLE_FORMAT,
            "format_version": BUNDLE_FORMAT_VERSION,
            "kind": self.kind,
            "variant": self.variant,
            "parameters": self.parameters(),
            "components": self.components(),
            "embedder": self.embedder_name(),
            "provenance": _checked_provenance(provenance),
            "dspy_version": dspy.__version__,
            "dspy_state": state,
        }

    def save(
        self, directory: str | os.PathLike[str], provenance: Mapping[str, Any] | None = None
    ) -> Path:
        bundle = self.to_bundle(provenance)
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        path = target / BUNDLE_FILE
        write_json_atomic(path, bundle)
        return path


_SECRET_KEY_WORDS = ("key", "token", "secret", "password", "credential", "url", "endpoint")


def _checked_provenance(provenance: Mapping[str, Any] | None) -> dict[str, Any]:
    """Provenance is free-form but must not smuggle credentials or endpoints into a bundle."""
    if provenance is None:
        return {}
    try:
        data = json.loads(json.dumps(dict(provenance)))
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"provenance must be JSON-serializable: {exc}") from exc

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if any(word in str(key).lower() for word in _SECRET_KEY_WORDS):
                    raise PolicyError(
                        f"provenance field '{path}{key}' looks like a credential or endpoint; "
                        "bundles never hold keys or URLs — drop it"
                    )
                walk(item, f"{path}{key}.")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{path}{i}.")
        elif isinstance(value, str) and re.search(r"\b[a-z][a-z0-9+.-]*://", value, re.I):
            raise PolicyError(
                f"provenance field '{path.rstrip('.')}' holds a URL ({value[:40]}...); "
                "bundles never hold endpoints — record a name instead"
            )

    walk(data, "")
    return data


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON via a temporary file and `os.replace`; the file's mode follows the umask.

    Not `tempfile.mkstemp`, which creates mode 0600 whatever the umask: an exported bundle
    would be unreadable by the service or colleague it was made for.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, flags, 0o666)  # the kernel applies the umask
            break
        except FileExistsError:  # another writer drew the same name: draw again
            continue
    else:
        raise PolicyError(f"no free temporary name beside {path} after 100 attempts")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, ensure_ascii=False)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
