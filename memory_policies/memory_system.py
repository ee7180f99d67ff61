"""Memory systems (mem0, a vector database, your own service) as memory policies.

A *memory system* is long-term memory that someone else wrote: the policy does not decide
what is stored or how it is searched. (The `external` policy kind is the paper's AWE, an
embedding store of our own, not one of these.)

A system implements the narrow `MemorySystem` protocol for one user's memory:

    add(messages, at)     store messages that leave the short-term buffer (at: session time)
    search(query, k)      up to k memories relevant to the query, as self-contained text
    snapshot()            everything the system remembers, as JSON-ready data
    restore(snapshot)     load a snapshot into a fresh, empty system

`MemorySystemPolicy` wraps a system in the policy interface of `memory_policies.base`, so
the episode runner evaluates it exactly like the DSPy policies, on- and off-policy: the
short-term buffer and its flush rule are shared, the system's snapshot travels inside the
`MemoryState` (so a period checkpoint holds the whole memory and resuming restores it), and
answering uses the ambient (agent) LM with the retrieved memories, as the paper's AWE does.

Memory systems are baselines, not candidates: they have no mutable instruction text
(`components()` is empty), so an optimizer has nothing to rewrite. Besides the numeric
parameters they may take switches (`option_defaults`, e.g. mem0's `infer`), which are part of
`parameters()` so that run hashes and reports record them.
"""

from __future__ import annotations

import hashlib
import json
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import dspy
from pydantic import Field

from memory_policies.base import MemoryPolicy
from memory_policies.common import DEFAULT_MEMORY_USE, MemoryChoose, MemoryReply, latest_time
from memory_policies.errors import PolicyError
from memory_policies.messages import MemoryState, Message, strip_time_header
from memory_policies.paper import PAPER_STORE_USE, StoreChatChoose, StoreChatReply
from memory_policies.parameters import describe_parameters, validate_parameters
from memory_policies.variants import VARIANTS, Variant, pop_variant

Snapshot = dict[str, Any]
OptionValue = bool | int | str


class MemorySystem(ABC):
    """One user's memory held by a memory system. Methods are called from one thread at a
    time per instance; different instances may be used concurrently."""

    @abstractmethod
    def add(self, messages: list[Message], at: str | None) -> None:
        """Store messages leaving the short-term buffer; `at` is their session time, if known."""

    @abstractmethod
    def search(self, query: str, k: int) -> list[str]:
        """At most `k` memories relevant to `query`; must not change what is stored."""

    @abstractmethod
    def snapshot(self) -> Snapshot:
        """Everything the system remembers, JSON-serializable (no keys, URLs or clients)."""

    @abstractmethod
    def restore(self, snapshot: Snapshot) -> None:
        """Load `snapshot` (from `snapshot()`) into this fresh, empty system."""

    # ----- optional hooks ------------------------------------------------------------------------

    def describe(self) -> str:
        """Human-readable memory, stored with each period's results."""
        return json.dumps(self.snapshot(), ensure_ascii=False)[:2000]

    def fingerprint(self) -> str:
        """Identity of what is remembered, compared before and after each evaluation read.

        Override to leave out representation noise (e.g. float bits a vector store rewrites)."""
        return snapshot_digest(self.snapshot())

    def parse_failures(self) -> int:
        """LLM outputs this system could not use so far (counted as `write` parse failures)."""
        return 0

    def close(self) -> None:  # noqa: B027 (an optional hook: most systems hold nothing)
        """Release resources; the instance is not used afterwards."""


class MemorySystemState(MemoryState):
    # None: nothing stored yet (a fresh system). Otherwise the system's own snapshot.
    snapshot: Snapshot | None = Field(default=None)


def snapshot_digest(snapshot: Snapshot | None) -> str:
    text = json.dumps(snapshot, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Lease:
    """A live system checked out of `LiveSystems`.

    `digest` names the state snapshot the system stands for (its key in the pool);
    `content` is the system's own `fingerprint()`, once known.
    """

    def __init__(self, system: MemorySystem, digest: str, content: str | None = None) -> None:
        self.system = system
        self.digest = digest
        self.content = content

    def now_holds(self, snapshot: Snapshot) -> None:
        """Record the system's snapshot after a change (it goes back to the pool under it)."""
        self.digest = snapshot_digest(snapshot)
        self.content = None  # taken again before the next read


class LiveSystems:
    """Idle live systems keyed by the digest of the snapshot they hold.

    Each operation checks a system out exclusively, so one system never serves two threads.
    Reusing an idle system whose content equals the state's snapshot saves a restore per
    operation (consecutive writes of one user, the questions on one checkpoint). A system
    whose operation failed is closed, never reused: its content is unknown.
    """

    def __init__(self, open_system: Callable[[], MemorySystem], capacity: int = 8) -> None:
        self._open_system = open_system
        self._capacity = capacity
        self._idle: OrderedDict[int, Lease] = OrderedDict()
        self._lock = threading.Lock()
        self._serial = 0

    @contextmanager
    def holding(self, snapshot: Snapshot | None, *, read_only: bool = False) -> Iterator[Lease]:
        """A live system holding `snapshot`, returned to the pool afterwards.

        With `read_only`, the system's own snapshot is compared before and after: an adapter
        whose search changes the memory is an error, not a silent drift.
        """
        digest = snapshot_digest(snapshot)
        lease = self._take(digest)
        if lease is None:
            lease = Lease(self._open_system(), digest)
            try:
                if snapshot is not None:
                    lease.system.restore(snapshot)
            except BaseException:
                lease.system.close()
                raise
        try:
            if read_only and lease.content is None:
                lease.content = lease.system.fingerprint()
            yield lease
            if read_only and lease.system.fingerprint() != lease.content:
                raise PolicyError(
                    f"{type(lease.system).__name__} changed its memory while searching; "
                    "search() must be read-only (evaluation never changes memory)"
                )
        except BaseException:
            lease.system.close()
            raise
        self._give_back(lease)

    def _take(self, digest: str) -> Lease | None:
        with self._lock:
            for key, lease in self._idle.items():
                if lease.digest == digest:
                    del self._idle[key]
                    return lease
        return None

    def _give_back(self, lease: Lease) -> None:
        evicted: list[Lease] = []
        with self._lock:
            self._serial += 1
            self._idle[self._serial] = lease
            while len(self._idle) > self._capacity:
                evicted.append(self._idle.popitem(last=False)[1])
        for oldest in evicted:
            oldest.system.close()

    def close(self) -> None:
        with self._lock:
            leases = list(self._idle.values())
            self._idle.clear()
        for lease in leases:
            lease.system.close()

    def __deepcopy__(self, memo: dict[int, Any]) -> LiveSystems:
        return self  # policy copies with the same switches share live systems


class SystemAdd(dspy.Module):
    """Not an LLM step of ours: the memory system stores the messages (its own LLM may run)."""

    def forward(self, system: MemorySystem, messages: list[Message], at: str | None) -> None:
        system.add(messages, at)


class SystemSearch(dspy.Module):
    """Not an LLM step: the memory system's retrieval."""

    def forward(self, system: MemorySystem, query: str, k: int) -> dspy.Prediction:
        return dspy.Prediction(memories=list(system.search(query, k)))


class MemorySystemPolicy(MemoryPolicy):
    """A memory policy whose long-term memory is a `MemorySystem`.

    Subclasses set `kind` and implement `open_system()`; switches go in `option_defaults`.
    """

    parameter_names: ClassVar[tuple[str, ...]] = ("update_every", "short_term_len", "top_k")
    default_parameters: ClassVar[dict[str, int]] = {
        "update_every": 2,
        "short_term_len": 4,
        "top_k": 5,
    }
    paper_parameters: ClassVar[dict[str, int]] = {"top_k": 30}
    option_defaults: ClassVar[dict[str, OptionValue]] = {}
    state_type: ClassVar[type[MemoryState]] = MemorySystemState
    choose_signature: ClassVar[type[dspy.Signature]] = MemoryChoose
    variants: ClassVar[tuple[Variant, ...]] = VARIANTS
    paper_choose_signature: ClassVar[type[dspy.Signature]] = StoreChatChoose

    def __init__(self, **settings: Any) -> None:
        variant = pop_variant(self.kind, settings)
        options = {
            name: settings.pop(name) for name in list(settings) if name in self.option_defaults
        }
        self._check_names(settings.keys())
        self.options: dict[str, OptionValue] = self._checked_options(
            {**self.option_defaults, **options}
        )
        super().__init__(variant=variant, **settings)
        self._systems = LiveSystems(self.open_system)

    # ----- the one hook ----------------------------------------------------------------------

    def open_system(self) -> MemorySystem:
        """A fresh, empty system for one user (uses `self.options`)."""
        raise NotImplementedError

    # ----- parameters and switches -----------------------------------------------------------

    def _check_names(self, names: Any) -> None:
        unknown = sorted(set(names) - set(self.parameter_names) - set(self.option_defaults))
        if unknown:
            numeric = describe_parameters(self.parameter_table())
            switches = ", ".join(f"{n} (default {v!r})" for n, v in self.option_defaults.items())
            raise PolicyError(
                f"unknown parameter(s) {unknown} for policy kind '{self.kind}'; valid "
                f"parameters: {numeric}" + (f"; switches: {switches}" if switches else "")
            )

    def _checked_options(self, options: Mapping[str, Any]) -> dict[str, OptionValue]:
        checked: dict[str, OptionValue] = {}
        for name, default in self.option_defaults.items():
            value = options[name]
            # bool is an int subclass: `infer=1` is ambiguous, `top_k=True` a mistake.
            if type(value) is not type(default):
                raise PolicyError(
                    f"switch '{name}' of policy '{self.kind}' must be a "
                    f"{type(default).__name__} (e.g. {name}={_spec_text(default)}), got {value!r}"
                )
            checked[name] = value
        return checked

    def parameters(self) -> dict[str, Any]:  # type: ignore[override]
        return {**super().parameters(), **self.options}

    def with_parameters(self, **values: Any) -> MemoryPolicy:
        self._check_names(values.keys())
        options = {name: values.pop(name) for name in list(values) if name in self.option_defaults}
        numeric = {name: getattr(self, name) for name in self.parameter_names}
        checked = validate_parameters(self.kind, self.parameter_table(), {**numeric, **values})
        new_options = self._checked_options({**self.options, **options})
        new = self._copy()
        for name, value in checked.items():
            setattr(new, name, value)
        if new_options != self.options:
            new.options = new_options
            new._systems = LiveSystems(new.open_system)  # different switches, different systems
        return new

    # ----- the policy ------------------------------------------------------------------------

    def _build_modules(self) -> None:
        self.write = SystemAdd()
        self.read = SystemSearch()
        self.use = dspy.Predict(
            self.dialogue.pick(
                MemoryReply.with_instructions(DEFAULT_MEMORY_USE),
                StoreChatReply.with_instructions(PAPER_STORE_USE),
            )
        )

    def _instruction_predictors(self) -> dict[str, dspy.Predict]:
        return {}  # nothing to evolve: the system is the baseline as its authors ship it

    def _shared_objects(self) -> list[Any]:
        return [self._systems]

    def _write(self, state: MemoryState, messages: list[Message], times: list[str | None]) -> None:
        assert isinstance(state, MemorySystemState)
        with self._systems.holding(state.snapshot) as lease:
            failures_before = lease.system.parse_failures()
            at = latest_time(times) or state.current_time
            self.write(system=lease.system, messages=messages, at=at)
            failed = lease.system.parse_failures() - failures_before
            state.snapshot = lease.system.snapshot()
            lease.now_holds(state.snapshot)
        if failed:
            state.parse_failures["write"] = state.parse_failures.get("write", 0) + failed

    def _use_inputs(self, state: MemoryState, query: str) -> tuple[dict[str, str], list[str]]:
        assert isinstance(state, MemorySystemState)
        rules = self.rules
        # Nothing found: the reference's prompt shows an empty memory, ours says so.
        nothing = "" if rules.plain_memory_lines else "(nothing relevant)"
        if state.snapshot is None:
            return {"memory": nothing}, []
        with self._systems.holding(state.snapshot, read_only=True) as lease:
            # variant=paper searches with the message as sent (time header, options included).
            query_text = query if rules.search_with_message_as_sent else strip_time_header(query)
            found = self.read(system=lease.system, query=query_text, k=self.top_k).memories
        memory = "\n".join(f"- {text}" for text in found)
        return {"memory": memory or nothing}, list(found)

    def describe_memory(self, state: MemoryState) -> str:
        assert isinstance(state, MemorySystemState)
        if state.snapshot is None:
            return "(empty)"
        with self._systems.holding(state.snapshot, read_only=True) as lease:
            return lease.system.describe()

    def live_snapshot(self, state: MemoryState) -> Snapshot | None:
        """What a live system holding `state` reports now (tests compare it across answers)."""
        assert isinstance(state, MemorySystemState)
        if state.snapshot is None:
            return None
        with self._systems.holding(state.snapshot) as lease:
            return lease.system.snapshot()


def _spec_text(value: OptionValue) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
