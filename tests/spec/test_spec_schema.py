"""The spec files' JSON schemas: the committed copies are current, every shipped spec names
its schema on its first line and validates against it, and the schemas refuse what the
loaders refuse."""

from __future__ import annotations

import datetime
import json
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from evolve.arms.spec import load_arms_spec
from evolve.cli import main
from evolve.commands.spec_schema import SPEC_SCHEMAS, schema_text
from evolve.simulator.synthesis.config import load_synthesis_config
from evolve.spec.config import load_spec
from evolve.tuning.spec import is_study_spec, load_study_spec

REPO = Path(__file__).resolve().parents[2]
SCHEMA_DIR = REPO / "docs" / "schema"
SHIPPED_SPECS = sorted((REPO / "experiments").glob("*.toml"))
REGENERATE = "regenerate them with `evolve schema --out docs/schema` and commit the result"


@pytest.mark.parametrize("kind", list(SPEC_SCHEMAS))
def test_committed_schema_equals_a_fresh_build(kind: str) -> None:
    committed = SCHEMA_DIR / f"{kind}.json"
    assert committed.is_file(), f"{committed} is missing; {REGENERATE}"
    assert committed.read_text(encoding="utf-8") == schema_text(kind), (
        f"{committed} is out of date with the spec models; {REGENERATE}"
    )


def _as_json_values(value: Any) -> Any:
    """TOML values as an editor's schema check sees them: dates and times become strings."""
    if isinstance(value, dict):
        return {key: _as_json_values(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_json_values(item) for item in value]
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    return value


def _kind_and_loader(path: Path) -> tuple[str, Any]:
    """Which schema a spec must name, decided by the loader that accepts it."""
    if is_study_spec(path):
        return "tuning", load_study_spec
    if "arms" in tomllib.loads(path.read_text(encoding="utf-8")):
        return "arms", load_arms_spec
    if "environment" in tomllib.loads(path.read_text(encoding="utf-8")):
        return "experiment", load_spec
    return "synthesis", load_synthesis_config


def _validator(kind: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMA_DIR / f"{kind}.json").read_text(encoding="utf-8"))
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def test_every_kind_of_spec_is_shipped() -> None:
    assert {_kind_and_loader(path)[0] for path in SHIPPED_SPECS} == set(SPEC_SCHEMAS)


@pytest.mark.parametrize("path", SHIPPED_SPECS, ids=lambda path: path.name)
def test_shipped_spec_names_its_schema_and_validates_against_it(path: Path) -> None:
    kind, load = _kind_and_loader(path)
    load(path)  # the loader accepts it: the kind is right
    first_line = path.read_text(encoding="utf-8").splitlines()[0]
    assert first_line == f"#:schema ../docs/schema/{kind}.json", (
        f"{path.name} must start with the line '#:schema ../docs/schema/{kind}.json' (what "
        f"taplo / Even Better TOML read); it starts with {first_line!r}"
    )
    assert (path.parent / first_line.removeprefix("#:schema ")).resolve().is_file()
    data = _as_json_values(tomllib.loads(path.read_text(encoding="utf-8")))
    problems = [error.message for error in _validator(kind).iter_errors(data)]
    assert problems == [], f"{path.name} does not validate against the {kind} schema"


@pytest.mark.parametrize(
    ("spec", "kind", "change"),
    [
        ("quickstart.toml", "experiment", lambda data: data["optimizer"].update(typo=1)),
        ("quickstart.toml", "experiment", lambda data: data.update(protocol="other")),
        ("tune_quick.toml", "tuning", lambda data: data["tuning"].update(sampler="annealing")),
        ("synthesize_llm.toml", "synthesis", lambda data: data.update(num_periods=0)),
    ],
    ids=["unknown-key", "protocol", "sampler", "bound"],
)
def test_schemas_refuse_what_the_loaders_refuse(spec: str, kind: str, change) -> None:
    data = _as_json_values(tomllib.loads((REPO / "experiments" / spec).read_text()))
    change(data)
    assert list(_validator(kind).iter_errors(data)), f"the {kind} schema accepted a bad spec"


def test_schema_command_prints_one_kind_and_refuses_an_unknown_one(capsys) -> None:
    assert main(["schema", "tuning"]) == 0
    assert capsys.readouterr().out == schema_text("tuning")
    assert main(["schema", "toml"]) == 2
    err = capsys.readouterr().err
    assert "unknown spec kind 'toml'" in err and "experiment, tuning, arms, synthesis" in err


def test_schema_command_writes_every_kind(tmp_path: Path, capsys) -> None:
    assert main(["schema", "--out", str(tmp_path / "schema")]) == 0
    for kind in SPEC_SCHEMAS:
        assert (tmp_path / "schema" / f"{kind}.json").read_text() == schema_text(kind)
    assert capsys.readouterr().out.count("wrote ") == len(SPEC_SCHEMAS)
