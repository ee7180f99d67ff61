"""Reference scores for the memory score: random choice and the upper bound.

The upper bound is the agent LLM answering each question with the relevant state stated
explicitly (no memory needed). As in the original `upperbound.py` it is computed once per
question x answer-option variant (the variant's state is the one given), so a user-period's
upper bound is a table lookup with its gold variant.

What the agent is shown is the same under both protocols (the question, the state of the
variant as a `{variable: value}` object, the numbered options; answer with the option's
number). Under `paper` the layout follows the reference `upperbound.py`: question first, the
state as indented JSON, options as `"<n>: <text>"`. Under `evolve` it is our compact layout.

Unlike the reference, the per-period lookup goes through (user, question, variant), never
through the variant's state tuple: the reference maps state tuples to scores over all of a
user's questions, so two questions whose options share a state tuple overwrite each other and
a question may be scored with another question's answer. Both protocols keep our fix.

The table is cached on disk and reused by every candidate and trial. Its key is everything an
answer depends on: the environment's content hash, the agent model, its endpoint's address
(scheme, host, port and path; never credentials; "embedded" plus the model file for the
embedded server, whose port changes every start), the structured-output dialect, the
temperature, max_tokens, the protocol (its prompt layout) and `UPPER_BOUND_PROMPT_VERSION`.
Only answers that parsed are cached, here and in DSPy's response cache: an unparseable answer
is counted in the run that got it (as an upper-bound parse failure) and asked again of the
server by the next one. `refresh=True` recomputes
the whole table. A cached entry is read back only if it agrees with the environment: the
option it names exists and its `correct` flag is what that option's state says; otherwise the
file is refused (an edited or corrupt file would move the memory score silently).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dspy
from dspy.utils.exceptions import AdapterParseError

from evolve.core.errors import DamagedRunFileError, ToolkitError
from evolve.core.files import atomic_write_json, safe_name
from evolve.core.protocol import DEFAULT_PROTOCOL, DEFAULT_RULES, Protocol, ProtocolRules
from evolve.llm.response_cache import held_until_parsed

# Defined with the metrics (original_format needs it and sits below this module); kept
# importable from here, where the upper bound's counterpart lives.
from evolve.simulator.metrics import random_score as random_score
from evolve.simulator.run_dir import read_record
from evolve.simulator.upper_bound_table import (
    UPPER_BOUND_FORMAT_VERSION,
    UpperBoundEntry,
    UpperBoundTable,
)

if TYPE_CHECKING:
    from evolve.llm import RoleLMs
    from evolve.simulator.environment import Environment

# Bump when the upper-bound question changes (signature, instructions, state or option
# formatting, how a choice is scored): earlier answers then no longer count.
# (Named "prompt" version: "protocol" means the information flow, paper or evolve.)
UPPER_BOUND_PROMPT_VERSION = 2
# Entries are saved in batches so an interrupted computation loses little and writes rarely.
_SAVE_EVERY = 8


class AnswerWithKnownState(dspy.Signature):
    """The user's current situation is given. Pick the option that best fits it."""

    known_state: str = dspy.InputField(desc="the user's current relevant state and preferences")
    question: str = dspy.InputField(desc="the user's question")
    options: str = dspy.InputField(desc="numbered answer options")
    choice: int = dspy.OutputField(desc="the number of the single best option")


class PaperAnswerWithKnownState(dspy.Signature):
    """The user asks `question` and states their current relevant preferences and situation in
    `current_state`. Pick the option that suits that situation best; give its number."""

    question: str = dspy.InputField(desc="the user's question")
    current_state: str = dspy.InputField(desc="the user's current preferences and situation")
    options: str = dspy.InputField(desc="the answer options, '<number>: <text>'")
    choice: int = dspy.OutputField(desc="the number of the most suitable option")


def agent_identity(lms: RoleLMs) -> dict[str, Any]:
    """The agent role's identity without secrets (see `RoleLMs.identity`)."""
    identity = getattr(lms, "identity", None)
    if callable(identity):
        return dict(identity("agent"))
    return {"model": str(getattr(lms.agent, "model", type(lms.agent).__name__))}


def upper_bound_cache_key(
    environment_hash: str, identity: dict[str, Any], protocol: Protocol = DEFAULT_PROTOCOL
) -> str:
    """Hash of the environment, the agent's identity, the protocol (its prompt layout) and the
    upper-bound prompt version."""
    material = {
        "environment": environment_hash,
        "agent": identity,
        "prompt_version": UPPER_BOUND_PROMPT_VERSION,
        "protocol": protocol,
    }
    text = json.dumps(material, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def upper_bound_cache_path(
    cache_dir: Path, environment_hash: str, agent_model: str, cache_key: str
) -> Path:
    model_slug = safe_name(agent_model, fallback="model", max_length=60)
    return (
        Path(cache_dir) / f"upper_bound-{environment_hash[:12]}-{model_slug}-{cache_key[:16]}.json"
    )


def _load_cached(path: Path, cache_key: str) -> dict[str, UpperBoundEntry]:
    """Parsed entries of a cache file with this key; nothing from an older or foreign file."""
    if not path.exists():
        return {}
    try:
        cached = read_record(path, UpperBoundTable)
    except DamagedRunFileError:
        return {}  # unreadable or of an older format: recomputed and overwritten
    if cached.format_version != UPPER_BOUND_FORMAT_VERSION or cached.cache_key != cache_key:
        return {}
    return {key: entry for key, entry in cached.entries.items() if not entry.parse_failed}


class UpperBoundCacheError(ToolkitError):
    """A cached upper-bound entry disagrees with the environment it claims to answer."""


def check_cached_entries(path: Path, entries: dict[str, UpperBoundEntry], env: Environment) -> None:
    """Refuse (one line) a cache whose entries do not match `env`'s questions and options.

    Why recompute rather than trust: `correct` decides the upper bound and so the memory
    score; it must be what the named option's state says for the variant given.
    """
    states: dict[tuple[str, int], list[list[str]]] = {
        (item.id, qi): [list(choice.state) for choice in qa.answer_choices]
        for item in env.items
        for qi, qa in enumerate(item.qas)
    }
    fix = f"delete {path} or pass --refresh-upper-bound to recompute it"
    for key, entry in entries.items():
        where = f"upper-bound cache entry {key[:80]!r}"
        options = states.get((entry.item_id, entry.question_index))
        if key != UpperBoundTable.key(entry.item_id, entry.question_index, entry.variant_index):
            problem = "is stored under another question's key"
        elif options is None or not 0 <= entry.variant_index < len(options):
            problem = "names a question or option this environment does not have"
        elif entry.chosen is None or not 1 <= entry.chosen <= len(options):
            problem = f"has chosen={entry.chosen!r}, expected an option number in 1..{len(options)}"
        elif entry.correct != (options[entry.chosen - 1] == options[entry.variant_index]):
            problem = (
                f"says correct={entry.correct} for option {entry.chosen}, but that option's "
                f"state {'matches' if not entry.correct else 'differs from'} the state given"
            )
        else:
            continue
        raise UpperBoundCacheError(f"{where} {problem} (the file was edited or is corrupt); {fix}")


def _save_cache(path: Path, table: UpperBoundTable) -> None:
    """Only answers that parsed: a failed one is asked again by the next computation."""
    cacheable = table.model_copy(
        update={
            "entries": {k: e for k, e in table.entries.items() if not e.parse_failed},
        }
    )
    atomic_write_json(path, cacheable.model_dump(mode="json"))


@dataclass(frozen=True)
class UpperBoundPrompt:
    """One layout of the upper-bound question (`ProtocolRules.upper_bound_layout` names it)."""

    signature: type[dspy.Signature]
    # The input field that carries the variant's state.
    state_field: str
    state_indent: int | None
    option_separator: str

    def predictor(self) -> dspy.Predict:
        return dspy.Predict(self.signature)

    def inputs(
        self,
        question: str,
        required_info: Sequence[str],
        values: Sequence[str],
        options: Sequence[str],
    ) -> dict[str, str]:
        state = dict(zip(required_info, values, strict=True))
        separator = self.option_separator
        return {
            "question": question,
            self.state_field: json.dumps(state, ensure_ascii=False, indent=self.state_indent),
            "options": "\n".join(f"{i}{separator} {o}" for i, o in enumerate(options, start=1)),
        }


UPPER_BOUND_PROMPTS: dict[str, UpperBoundPrompt] = {
    # The reference's: the state as indented JSON, options as ``<n>: <text>``.
    "reference": UpperBoundPrompt(PaperAnswerWithKnownState, "current_state", 2, ":"),
    # Ours: the same content, compact.
    "compact": UpperBoundPrompt(AnswerWithKnownState, "known_state", None, "."),
}


def upper_bound_prompt(rules: ProtocolRules) -> UpperBoundPrompt:
    """The upper-bound prompt layout a protocol uses."""
    return UPPER_BOUND_PROMPTS[rules.upper_bound_layout]


def choice_error(choice: object, option_count: int) -> str | None:
    """Why `choice` is not a 1-based option number, or None when it is one."""
    if isinstance(choice, bool) or not isinstance(choice, int):
        return f"choice {choice!r} is not an integer"
    if not 1 <= choice <= option_count:
        return f"choice {choice} is not an option number in 1..{option_count}"
    return None


def _ask(
    predictor: dspy.Predict,
    lms: RoleLMs,
    item_id: str,
    question_index: int,
    variant_index: int,
    question: str,
    required_info: Sequence[str],
    option_texts: Sequence[str],
    option_states: Sequence[Sequence[str]],
    prompt: UpperBoundPrompt,
) -> UpperBoundEntry:
    given = option_states[variant_index]
    # A choice that is no option number fails here, after the adapter parsed it: its reply is
    # kept out of the response cache too, so that the next computation really asks again.
    with held_until_parsed() as held:
        try:
            with lms.context("agent"):
                prediction = predictor(
                    **prompt.inputs(question, required_info, given, option_texts)
                )
            choice = prediction.choice
            error = choice_error(choice, len(option_texts))
        except AdapterParseError as exc:
            choice, error = None, " ".join(str(exc).split())[:300]
        if error is None:
            held.accept()
    if error is not None:
        return UpperBoundEntry(
            item_id=item_id,
            question_index=question_index,
            variant_index=variant_index,
            chosen=None,
            correct=False,
            parse_failed=True,
            parse_error=error,
        )
    return UpperBoundEntry(
        item_id=item_id,
        question_index=question_index,
        variant_index=variant_index,
        chosen=choice,
        correct=list(option_states[choice - 1]) == list(given),
        parse_failed=False,
    )


def compute_upper_bound(
    env: Environment,
    lms: RoleLMs,
    cache_dir: Path,
    *,
    concurrency: int = 1,
    on_entry: Callable[[UpperBoundEntry], None] | None = None,
    refresh: bool = False,
    rules: ProtocolRules = DEFAULT_RULES,
) -> UpperBoundTable:
    """The upper-bound table for `env` and the agent, computed only where not cached.

    The cache file is keyed as the module docstring says; parsed entries already in it cost no
    LLM call, and progress is saved while computing, so an interrupted computation resumes.
    The returned table also holds this computation's unparseable answers (they count as
    upper-bound parse failures), which are never written to the cache. `refresh` ignores the
    cache and recomputes every entry. `on_entry` is called for each newly computed entry.
    `rules` (the protocol's) choose the prompt layout (see the module docstring); each has
    its own cache.
    """
    protocol = rules.name
    prompt = upper_bound_prompt(rules)
    environment_hash = env.content_hash()
    identity = agent_identity(lms)
    agent_model = str(identity.get("model") or getattr(lms.agent, "model", "model"))
    cache_key = upper_bound_cache_key(environment_hash, identity, protocol)
    path = upper_bound_cache_path(Path(cache_dir), environment_hash, agent_model, cache_key)
    table = UpperBoundTable(
        environment_hash=environment_hash,
        protocol=protocol,
        agent_model=agent_model,
        agent_identity=identity,
        cache_key=cache_key,
        entries={} if refresh else _load_cached(path, cache_key),
    )
    check_cached_entries(path, table.entries, env)
    todo = []
    for item in env.items:
        for qi, qa in enumerate(item.qas):
            texts = [choice.answer for choice in qa.answer_choices]
            states = [list(choice.state) for choice in qa.answer_choices]
            for ci in range(len(qa.answer_choices)):
                if table.key(item.id, qi, ci) not in table.entries:
                    todo.append(
                        (item.id, qi, ci, qa.query, list(qa.required_info), texts, states, prompt)
                    )
    if not todo:
        return table
    predictor = prompt.predictor()
    lock = threading.Lock()
    pending = 0

    cancelled = threading.Event()

    def run(task: tuple) -> None:
        nonlocal pending
        if cancelled.is_set():
            return
        entry = _ask(predictor, lms, *task)
        with lock:
            table.entries[table.key(entry.item_id, entry.question_index, entry.variant_index)] = (
                entry
            )
            pending += 1
            if pending >= _SAVE_EVERY:
                _save_cache(path, table)
                pending = 0
        if on_entry is not None:
            on_entry(entry)

    try:
        if concurrency <= 1:
            for task in todo:
                run(task)
        else:
            pool = ThreadPoolExecutor(max_workers=concurrency)
            try:
                for future in [pool.submit(run, task) for task in todo]:
                    future.result()
            except BaseException:
                # Ctrl-C or a failure: no new call starts; calls in flight are not waited for.
                cancelled.set()
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            pool.shutdown(wait=True)
    finally:
        with lock:
            _save_cache(path, table)
    return table
