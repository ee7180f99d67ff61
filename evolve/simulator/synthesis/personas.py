"""Personas for LLM synthesis: rows of a Nemotron-Personas parquet file, or the catalog's.

A `PersonaRecord` keeps the structured facts (age, occupation, ...) apart from the free text
the profile stage summarizes. Users are drawn through one seeded permutation, so user i is
the same persona whatever the number of users asked for (a run can be extended later).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from evolve.core.errors import ConfigError
from evolve.core.seeds import derive_rng
from evolve.simulator.synthesis.catalogs import Catalog, load_catalog

# Free-text columns summarized by the profile stage (as the original does).
NEMOTRON_TEXT_COLUMNS = (
    "persona",
    "professional_persona",
    "sports_persona",
    "arts_persona",
    "travel_persona",
    "culinary_persona",
    "career_goals_and_ambitions",
    "skills_and_expertise",
    "hobbies_and_interests",
)
NEMOTRON_FACT_COLUMNS = (
    "sex",
    "age",
    "marital_status",
    "education_level",
    "bachelors_field",
    "occupation",
    "skills_and_expertise_list",
    "hobbies_and_interests_list",
)


class PersonaRecord(BaseModel):
    """One persona before the profile stage: structured facts plus text to summarize."""

    model_config = ConfigDict(frozen=True)

    user_id: str
    uuid: str
    facts: dict[str, Any]
    texts: dict[str, str]
    known_name: str | None = None
    source: str


def _clean(value: Any) -> Any:
    """Arrow/pandas missing values (None, NaN) become None; everything else is kept."""
    if value is None:
        return None
    if isinstance(value, float) and value != value:
        return None
    return value


def _as_list_text(value: Any) -> str | None:
    """Nemotron stores lists as Python literals in strings; some exports use real lists."""
    value = _clean(value)
    if value is None:
        return None
    items: Any = value
    if isinstance(value, str):
        try:
            items = ast.literal_eval(value)  # literals only: never evaluates code
        except (ValueError, SyntaxError):
            return value.strip() or None
    if isinstance(items, list | tuple):
        text = ", ".join(str(item).strip() for item in items if str(item).strip())
        return text or None
    return str(items).strip() or None


def nemotron_record(row: dict[str, Any], user_id: str | None = None) -> PersonaRecord:
    """A parquet row (column -> value) as a persona record."""
    uuid = str(_clean(row.get("uuid")) or "").strip()
    if not uuid:
        raise ConfigError("a personas row has no uuid; Nemotron-Personas rows need a uuid column")
    education = _clean(row.get("education_level"))
    field = _clean(row.get("bachelors_field"))
    if education and field:
        education = f"{education} ({str(field).replace('_', ' ')})"
    facts: dict[str, Any] = {
        "age": _clean(row.get("age")),
        "gender": _clean(row.get("sex")),
        "marital_status": _clean(row.get("marital_status")),
        "education_level": education,
        "occupation": _clean(row.get("occupation")),
        "hobbies_and_interests": _as_list_text(row.get("hobbies_and_interests_list")),
        "skills_and_expertise": _as_list_text(row.get("skills_and_expertise_list")),
    }
    facts = {key: value for key, value in facts.items() if value not in (None, "")}
    if isinstance(facts.get("age"), float) and float(facts["age"]).is_integer():
        facts["age"] = int(facts["age"])
    texts = {
        column: str(row[column]).strip()
        for column in NEMOTRON_TEXT_COLUMNS
        if isinstance(_clean(row.get(column)), str) and str(row[column]).strip()
    }
    return PersonaRecord(
        user_id=user_id or uuid, uuid=uuid, facts=facts, texts=texts, source="nemotron"
    )


def load_nemotron_personas(path: str | Path, count: int, seed: int) -> list[PersonaRecord]:
    """`count` personas of a Nemotron-Personas parquet file, drawn by a seeded permutation."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"personas file {str(path)!r} does not exist; download a Nemotron-Personas parquet "
            "file or omit --personas to use the built-in catalog personas"
        )
    try:
        columns = set(pq.read_schema(path).names)
    except Exception as error:  # pyarrow raises several types for non-parquet files
        raise ConfigError(f"{path} is not a readable parquet file: {error}") from None
    if "uuid" not in columns or not columns & set(NEMOTRON_TEXT_COLUMNS):
        raise ConfigError(
            f"{path} does not look like Nemotron-Personas: it needs a 'uuid' column and at least "
            f"one of {', '.join(NEMOTRON_TEXT_COLUMNS)}; it has {', '.join(sorted(columns))}"
        )
    wanted = [c for c in ("uuid", *NEMOTRON_FACT_COLUMNS, *NEMOTRON_TEXT_COLUMNS) if c in columns]
    table = pq.read_table(path, columns=wanted)
    if count > table.num_rows:
        raise ConfigError(
            f"{path} has {table.num_rows} personas but {count} users were asked for; "
            "lower --users or use a larger personas file"
        )
    order = list(range(table.num_rows))
    derive_rng("nemotron-personas", seed).shuffle(order)
    rows = table.take(order[:count]).to_pylist()
    records = [nemotron_record(row) for row in rows]
    seen: set[str] = set()
    for record in records:
        if record.uuid in seen:
            raise ConfigError(f"{path}: uuid {record.uuid!r} appears twice; uuids must be unique")
        seen.add(record.uuid)
    return records


def catalog_personas(count: int, seed: int, catalog: Catalog | None = None) -> list[PersonaRecord]:
    """`count` personas of the offline catalog, in offline synthesis's order and ids."""
    catalog = catalog or load_catalog()
    order = list(catalog.personas)
    # Same permutation as offline synthesis: user i has the same persona in both.
    derive_rng("personas", seed).shuffle(order)
    records = []
    for index in range(count):
        persona = order[index % len(order)]
        records.append(
            PersonaRecord(
                user_id=f"u{index:03d}-{persona.id}",
                uuid=persona.id,
                facts={
                    "age": persona.age,
                    "gender": persona.gender,
                    "occupation": persona.occupation,
                },
                texts={"persona": f"{persona.name}. {persona.profile}"},
                known_name=persona.name,
                source="catalog",
            )
        )
    return records


def check_unique_ids(personas: Sequence[PersonaRecord]) -> None:
    ids = [persona.user_id for persona in personas]
    duplicates = sorted({user_id for user_id in ids if ids.count(user_id) > 1})
    if duplicates:
        raise ConfigError(f"personas share user ids {duplicates}; every user needs its own id")
