"""Old path of `memory_policies.memory_system` (third-party memory systems are "memory
systems"; "external" is the paper's AWE kind). Works with a `RenamedWarning` until
`memory_policies.deprecation.REMOVED_IN`."""

from __future__ import annotations

from typing import Any

from memory_policies.deprecation import warn_renamed
from memory_policies.memory_system import (
    LiveSystems,
    MemorySystem,
    MemorySystemPolicy,
    MemorySystemState,
    OptionValue,
    Snapshot,
    snapshot_digest,
)

warn_renamed("memory_policies.external_system", "memory_policies.memory_system")

_RENAMED = {"ExternalSystemPolicy": MemorySystemPolicy, "ExternalSystemState": MemorySystemState}

__all__ = [
    "LiveSystems",
    "MemorySystem",
    "MemorySystemPolicy",
    "MemorySystemState",
    "OptionValue",
    "Snapshot",
    "snapshot_digest",
]


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        new = _RENAMED[name]
        warn_renamed(f"memory_policies.external_system.{name}", f"memory_policies.{new.__name__}")
        return new
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
