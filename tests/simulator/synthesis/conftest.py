from __future__ import annotations

import sys
from pathlib import Path

# `llm_helpers` and `scripted_lm` are plain modules beside the tests (no packages).
for _path in (Path(__file__).parent, Path(__file__).parents[2]):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
