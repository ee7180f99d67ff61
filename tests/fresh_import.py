"""Import a module anew, for tests of a renamed module's import-time warning.

A module's top level runs once per process, so the test drops it from `sys.modules` first.
Whatever was there before is put back afterwards: other tests (and the modules that
imported it) hold that object, and a second copy left behind would break their identity
checks (`importlib.import_module(name) is module`).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def import_fresh(name: str) -> ModuleType:
    saved = sys.modules.pop(name, None)
    try:
        return importlib.import_module(name)
    finally:
        sys.modules.pop(name, None)
        if saved is not None:
            sys.modules[name] = saved
