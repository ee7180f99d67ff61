"""Synthesis config (TOML, presets, work key) and persona sources (parquet, catalog)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from llm_helpers import small_config

from evolve.core.errors import ConfigError
from evolve.simulator.synthesis import (
    catalog_personas,
    load_nemotron_personas,
    load_synthesis_config,
    synthesis_config_from_dict,
)
from evolve.simulator.synthesis.offline import synthesize_user
from evolve.simulator.synthesis.personas import nemotron_record
from evolve.simulator.synthesis.presets import PRESETS

REPO = Path(__file__).parents[3]


def test_example_config_loads_with_the_papers_shape() -> None:
    config = load_synthesis_config(REPO / "experiments" / "synthesize_llm.toml")
    assert config.num_periods == 10 and config.num_questions == 10
    assert config.total_months == 30
    assert config.prices.input_per_million == 2.0 and config.prices.output_per_million == 8.0
    assert config.retries.answer_refinements == 3


def test_preset_with_overrides_and_errors(tmp_path: Path) -> None:
    config = synthesis_config_from_dict({"preset": "tiny", "lang": "zh", "workers": 2})
    assert config.num_periods == PRESETS["tiny"].num_periods and config.language_name == "Chinese"
    with pytest.raises(ConfigError, match="unknown preset"):
        synthesis_config_from_dict({"preset": "huge"})
    with pytest.raises(ConfigError, match="retries.stage_attempts"):
        synthesis_config_from_dict({"preset": "tiny", "retries": {"stage_attempts": 0}})
    with pytest.raises(ConfigError, match="min_state_variants"):
        synthesis_config_from_dict({"preset": "tiny", "min_state_variants": 9})
    bad = tmp_path / "bad.toml"
    bad.write_text("preset = \n")
    with pytest.raises(ConfigError, match="cannot read"):
        load_synthesis_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_synthesis_config(tmp_path / "missing.toml")


def test_work_key_tracks_content_settings_only() -> None:
    base = small_config()
    key = base.synthesis_key(7, "gpt-4.1")
    assert small_config(num_users=50, workers=8).synthesis_key(7, "gpt-4.1") == key
    assert small_config(prices={"input_per_million": 1}).synthesis_key(7, "gpt-4.1") == key
    assert base.synthesis_key(8, "gpt-4.1") != key
    assert base.synthesis_key(7, "gpt-4.1-mini") != key
    assert small_config(lang="fr").synthesis_key(7, "gpt-4.1") != key
    assert small_config(retries={"query_refinements": 5}).synthesis_key(7, "gpt-4.1") != key


def write_personas(path: Path, rows: int) -> None:
    table = pa.table(
        {
            "uuid": [f"id{i:03d}" for i in range(rows)],
            "persona": [f"Person {i} Smith is a careful planner." for i in range(rows)],
            "professional_persona": ["Works in logistics."] * rows,
            "sex": ["Female"] * rows,
            "age": [30 + i for i in range(rows)],
            "marital_status": ["married_present"] * rows,
            "education_level": ["bachelors"] * rows,
            "bachelors_field": ["business_administration"] * rows,
            "occupation": ["logistician"] * rows,
            "hobbies_and_interests_list": ["['hiking', 'chess']"] * rows,
            "skills_and_expertise_list": [None] * rows,
            "culinary_persona": [None] * rows,
        }
    )
    pq.write_table(table, path)


def test_nemotron_personas_are_parsed_and_drawn_by_a_stable_seeded_permutation(
    tmp_path: Path,
) -> None:
    path = tmp_path / "personas.parquet"
    write_personas(path, 30)
    five = load_nemotron_personas(path, 5, seed=3)
    ten = load_nemotron_personas(path, 10, seed=3)
    assert [p.uuid for p in ten[:5]] == [p.uuid for p in five]  # a larger run extends
    assert [p.uuid for p in load_nemotron_personas(path, 5, seed=4)] != [p.uuid for p in five]
    record = five[0]
    assert record.user_id == record.uuid and record.source == "nemotron"
    assert record.facts["education_level"] == "bachelors (business administration)"
    assert record.facts["hobbies_and_interests"] == "hiking, chess"
    assert "skills_and_expertise" not in record.facts  # missing values are dropped
    assert set(record.texts) == {"persona", "professional_persona"}
    assert record.known_name is None


def test_nemotron_file_problems_are_explained(tmp_path: Path) -> None:
    path = tmp_path / "personas.parquet"
    write_personas(path, 3)
    with pytest.raises(ConfigError, match="has 3 personas but 5 users"):
        load_nemotron_personas(path, 5, seed=0)
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"name": ["x"]}), other)
    with pytest.raises(ConfigError, match="needs a 'uuid' column"):
        load_nemotron_personas(other, 1, seed=0)
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_text("hello")
    with pytest.raises(ConfigError, match="not a readable parquet"):
        load_nemotron_personas(not_parquet, 1, seed=0)
    with pytest.raises(ConfigError, match="does not exist"):
        load_nemotron_personas(tmp_path / "none.parquet", 1, seed=0)
    with pytest.raises(ConfigError, match="no uuid"):
        nemotron_record({"uuid": None, "persona": "x"})


def test_catalog_personas_match_the_offline_synthesis_users() -> None:
    records = catalog_personas(3, seed=5)
    for index, record in enumerate(records):
        offline = synthesize_user(PRESETS["tiny"], 5, index)
        assert record.user_id == offline.id
        assert record.known_name == offline.user_profile["name"]
        assert record.texts["persona"].startswith(record.known_name)
