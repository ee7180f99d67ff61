"""Old names that still work for one minor version: the one warning and the one way to say it.

Renamed spec keys, CLI flags, Python names and modules keep working until `REMOVED_IN`, with a
warning that says what to use instead. `memory_policies` is the lowest package, so this module
lives here and `evolve` imports it (`memory_policies` never imports `evolve`).

Why `FutureWarning` and not `DeprecationWarning`: Python hides `DeprecationWarning` outside
`__main__`, and the people who must see these are users editing a spec or a command line, not
only developers running tests.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

REMOVED_IN = "0.2.0"


class RenamedWarning(FutureWarning):
    """A name, key, flag or module that was renamed; the old one goes in `REMOVED_IN`."""


def warn_renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that `old` is now `new` (both as the user writes them, e.g. `--model-preset`)."""
    warnings.warn(
        f"{old} is deprecated and will be removed in {REMOVED_IN}; use {new} instead",
        RenamedWarning,
        stacklevel=stacklevel,
    )


def rename_keys(data: Any, renamed: Mapping[str, str], *, where: str = "") -> Any:
    """`data` with every old key of `renamed` (old -> new) moved to its new name, warning once
    per key. A mapping that holds both the old and the new key is an error: which one wins
    would be a guess. Non-mappings are returned unchanged (pydantic reports them)."""
    if not isinstance(data, Mapping) or not any(old in data for old in renamed):
        return data
    moved = dict(data)
    prefix = f"{where}." if where else ""
    for old, new in renamed.items():
        if old not in moved:
            continue
        if new in moved:
            raise ValueError(
                f"{prefix}{old} and {prefix}{new} are both set; {old} is the old name of "
                f"{new}: keep only {new}"
            )
        warn_renamed(f"{prefix}{old}", f"{prefix}{new}", stacklevel=4)
        moved[new] = moved.pop(old)
    return moved


def renamed_attributes(
    module: str,
    renamed: Mapping[str, str],
    namespace: Mapping[str, Any],
    *,
    rest: ModuleType | None = None,
) -> Callable[[str], Any]:
    """A module `__getattr__` under which each old name of `renamed` still works, with a
    warning. A new name is one of `namespace` (the module's globals) or `package.module:name`
    for one that lives elsewhere (imported when first asked for). Other names come from
    `rest` (a moved module's new home), else they are missing as usual."""

    def __getattr__(name: str) -> Any:
        if name in renamed:
            home, _, new = renamed[name].rpartition(":")
            warn_renamed(f"{module}.{name}", f"{home or module}.{new}")
            return getattr(importlib.import_module(home), new) if home else namespace[new]
        if rest is not None:
            return getattr(rest, name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def moved_module(
    old: str, new: ModuleType, renamed: Mapping[str, str] | None = None
) -> Callable[[str], Any]:
    """For a module left at its old path: warns once, at its import, and returns its
    `__getattr__`, which serves every name of `new` and the old names of `renamed` (old ->
    new, a name in `new`), each with its own warning. A shim is then two statements:

        import memory_policies.embedding_store as _new
        __getattr__ = moved_module(__name__, _new)
    """
    warn_renamed(old, new.__name__, stacklevel=4)  # the line that imported the old module
    targets = {name: f"{new.__name__}:{target}" for name, target in (renamed or {}).items()}
    return renamed_attributes(old, targets, {}, rest=new)
