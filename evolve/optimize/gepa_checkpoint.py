"""GEPA's checkpoint (`gepa/gepa_state.bin`), checked before GEPA opens it.

GEPA (0.1.4) persists its state with `pickle`, and unpickling a file can run any code the
file names: a run directory someone sent you could run their code when you resume it. The
state this toolkit has GEPA write holds builtins only (dicts, lists, sets, tuples, numbers,
strings), with no class or function anywhere. So the file is first read by an unpickler
that refuses to look up any class or function: a file that names one was not written by
this toolkit and is refused in one line, before GEPA (which uses plain `pickle`) reads it.
A truncated or garbled file is refused the same way instead of failing inside GEPA.

The trust boundary this leaves: a run directory from someone else is data to read (`evolve
compare`, `evolve export` read JSON records only), not to resume. Resuming checks the
checkpoint as above; the JSON records it reads back are checked by `run_dir.read_json`.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

from evolve.core.errors import DamagedRunFileError

# GEPA's checkpoint in its run_dir (gepa.core.state): present once a run has started.
GEPA_STATE_FILE = "gepa_state.bin"

_FIX = (
    "resuming would unpickle it, so it is not resumed (a run directory from someone else is "
    "data to read with `evolve compare`, not to resume); delete the run directory to start over"
)


class _NamesCode(pickle.UnpicklingError):
    """The pickle asks for a class or function by name."""


class _BuiltinsOnly(pickle.Unpickler):
    """An unpickler that builds builtin containers and scalars only: every lookup of a
    class or function by name (the only way a pickle reaches code, including the copyreg
    extension codes) is refused."""

    def find_class(self, module: str, name: str) -> object:
        raise _NamesCode(f"{module}.{name}")

    def persistent_load(self, pid: object) -> object:
        raise _NamesCode(f"persistent id {pid!r}")


def check_gepa_state(gepa_dir: Path) -> None:
    """Refuse, in one line, a GEPA checkpoint this toolkit did not write or cannot read."""
    path = Path(gepa_dir) / GEPA_STATE_FILE
    if not path.exists():
        return
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DamagedRunFileError(path, f"cannot read it ({exc.strerror or exc})", _FIX) from None
    try:
        state = _BuiltinsOnly(io.BytesIO(data)).load()
    except _NamesCode as named:
        raise DamagedRunFileError(
            path, f"it names {named} (code), which this toolkit's GEPA state never holds", _FIX
        ) from None
    # Garbage makes the unpickler fail in many ways (EOFError, ValueError, KeyError, ...);
    # the bytes are untrusted, so every failure is the same verdict.
    except Exception as exc:  # noqa: BLE001
        raise DamagedRunFileError(
            path, f"not a readable GEPA checkpoint ({type(exc).__name__})", _FIX
        ) from None
    if not isinstance(state, dict):
        raise DamagedRunFileError(
            path, f"not a GEPA checkpoint (holds a {type(state).__name__})", _FIX
        )
