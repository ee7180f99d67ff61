from __future__ import annotations

import sys
from pathlib import Path

# `scripted_lm` and `mp_helpers` are plain modules (no packages: a `tests/memory_policies`
# package would shadow the real `memory_policies`).
for _path in (Path(__file__).parent, Path(__file__).parents[1]):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
