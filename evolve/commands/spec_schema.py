"""JSON schemas of the spec files, generated from the pydantic models that validate them.

Editors read them to complete and check TOML specs: a first line
`#:schema ../docs/schema/experiment.json` is what taplo (Even Better TOML) follows. The
committed copies under `docs/schema/` are regenerated with `evolve schema --out docs/schema`;
a test checks that they equal freshly built ones.

The schemas describe what a file may hold (pydantic's validation mode), not what a loaded
spec looks like after defaults and resolution.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from evolve.core.files import atomic_write_text

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _experiment() -> dict[str, Any]:
    from evolve.spec.config import ExperimentSpec

    return _schema_of(ExperimentSpec, "evolve run: an experiment spec (experiments/*.toml)")


def _tuning() -> dict[str, Any]:
    from evolve.tuning.spec import StudySpec

    return _schema_of(StudySpec, "evolve tune: a study spec (a run spec plus [tuning])")


def _arms() -> dict[str, Any]:
    from evolve.arms.spec import ArmsSpec

    return _schema_of(ArmsSpec, "evolve arms: arms x environment seeds x replicates")


def _synthesis() -> dict[str, Any]:
    from evolve.simulator.synthesis import PRESETS
    from evolve.simulator.synthesis.config import LLMSynthesisConfig

    schema = _schema_of(
        LLMSynthesisConfig, "evolve env synthesize --llm --config: the LLM synthesis config"
    )
    # `preset` is read before validation (`synthesis_config_from_dict`): the offline preset
    # whose shape the other keys override. Without it here, editors would flag a valid key.
    for field in schema["properties"].values():
        _accept_integer_for_span(field)
    schema["properties"] = {
        "preset": {
            "enum": sorted(PRESETS),
            "title": "Preset",
            "description": "Offline preset whose shape the other keys override.",
            "type": "string",
        },
        **schema["properties"],
    }
    return schema


def _accept_integer_for_span(field: dict[str, Any]) -> None:
    """A span (`[min, max]`) also accepts one integer n, meaning [n, n], before validation;
    pydantic's schema shows only the pair."""
    items = field.get("prefixItems")
    if field.get("type") == "array" and items == [{"type": "integer"}, {"type": "integer"}]:
        pair = {key: field.pop(key) for key in ("type", "prefixItems", "minItems", "maxItems")}
        field["anyOf"] = [{"type": "integer"}, pair]


# File name stem under docs/schema/ -> the schema's builder. Imports happen inside each
# builder so that `evolve schema experiment` does not import the tuning or synthesis code.
SPEC_SCHEMAS: dict[str, Callable[[], dict[str, Any]]] = {
    "experiment": _experiment,
    "tuning": _tuning,
    "arms": _arms,
    "synthesis": _synthesis,
}


def _schema_of(model: type[BaseModel], title: str) -> dict[str, Any]:
    schema = model.model_json_schema(mode="validation")
    return {"$schema": JSON_SCHEMA_DIALECT, **schema, "title": title}


def spec_schema(kind: str) -> dict[str, Any]:
    """The JSON schema of one kind of spec file (`experiment`, `tuning` or `synthesis`)."""
    try:
        build = SPEC_SCHEMAS[kind]
    except KeyError:
        raise ValueError(
            f"unknown spec kind {kind!r}; expected one of {', '.join(SPEC_SCHEMAS)}"
        ) from None
    return build()


def schema_text(kind: str) -> str:
    """The schema as written to `docs/schema/<kind>.json` (stable key order, final newline)."""
    return json.dumps(spec_schema(kind), indent=2, ensure_ascii=False) + "\n"


def write_spec_schemas(directory: Path) -> list[Path]:
    """Write every spec schema into `directory` as `<kind>.json`; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in SPEC_SCHEMAS:
        path = directory / f"{kind}.json"
        atomic_write_text(path, schema_text(kind))
        written.append(path)
    return written
