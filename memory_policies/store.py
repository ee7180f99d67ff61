"""Old path of `memory_policies.embedding_store` (a policy's embedding store is its "memory
store"; the word "store" alone named six things). Works with a `RenamedWarning` until
`memory_policies.deprecation.REMOVED_IN`."""

import memory_policies.embedding_store as _new
from memory_policies.deprecation import moved_module

__getattr__ = moved_module(__name__, _new)
