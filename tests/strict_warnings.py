"""`no_warnings()`: the code inside may not warn (a warning there is an error).

Garbage is collected first: a file another test left open on the same worker is finalized
(with its ResourceWarning) before the strict filter is on, not inside a block that checks
something else. Under xdist which test ran before is chance, so without this a leak elsewhere
fails whichever strict test happens to follow it."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_warnings() -> Iterator[None]:
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield
