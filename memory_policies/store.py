"""Old path of `memory_policies.embedding_store` (a policy's embedding store is its "memory
store"; the word "store" alone named six things). Works with a `RenamedWarning` until
`memory_policies.deprecation.REMOVED_IN`."""

from __future__ import annotations

from typing import Any

import memory_policies.embedding_store as _new
from memory_policies.deprecation import warn_renamed

warn_renamed("memory_policies.store", "memory_policies.embedding_store")


def __getattr__(name: str) -> Any:
    return getattr(_new, name)
