"""The offline synthesis catalog: its file format (see catalog/README.md) and loading.

Every `*.json` file of the built-in `catalog/` directory, plus those of user-given
directories, is validated and merged into one `Catalog` of state variables, advice questions
and personas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evolve.core.errors import ConfigError
from evolve.core.files import read_json_file
from evolve.core.spec_base import format_validation_error

CATALOG_DIR = Path(__file__).with_name("catalog")


class _CatalogModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CatalogVariable(_CatalogModel):
    """A state variable: mutually exclusive values, each with paraphrases revealing it."""

    name: str = Field(min_length=1)
    domain: str = Field(min_length=1)
    label: str = Field(min_length=1)
    requests: list[str] = Field(min_length=1)
    recall: str | None = Field(
        default=None,
        description="the user asking for this variable's current value, in their own words "
        "(recall questions; see evolve.simulator.synthesis.recall)",
    )
    values: dict[str, list[str]] = Field(description="value -> paraphrases revealing it")

    @model_validator(mode="after")
    def _check_values(self) -> CatalogVariable:
        if len(self.values) < 2:
            raise ValueError(f"variable {self.name!r} needs at least 2 values")
        for value, paraphrases in self.values.items():
            if not paraphrases:
                raise ValueError(f"value {value!r} of variable {self.name!r} has no paraphrase")
        return self


class CatalogQuestion(_CatalogModel):
    """An advice question; its answer is composed from per-value fragments."""

    id: str = Field(min_length=1)
    query: str = Field(min_length=1)
    opening: str
    variables: list[str] = Field(min_length=1)
    advice: dict[str, dict[str, str]] = Field(description="variable -> value -> fragment")

    def answer(self, assignment: Mapping[str, str]) -> str:
        """The answer for values of (a subset of) the question's variables, in its order."""
        fragments = [
            self.advice[var][assignment[var]] for var in self.variables if var in assignment
        ]
        return " ".join(part for part in [self.opening, *fragments] if part)


class Persona(_CatalogModel):
    id: str = Field(min_length=1)
    name: str
    age: int = Field(ge=0)
    gender: str
    occupation: str
    profile: str

    def user_profile(self, user_id: str) -> dict[str, Any]:
        """A profile dict shaped like the original's (with its ready `formatted_str`)."""
        fields: dict[str, Any] = {
            "name": self.name,
            "age": self.age,
            "gender": self.gender,
            "occupation": self.occupation,
            "complementary_info": self.profile,
        }
        formatted = "\n".join(f"{key}: {value}" for key, value in fields.items())
        return {"uuid": user_id, **fields, "formatted_str": formatted}


class _CatalogFile(_CatalogModel):
    variables: list[CatalogVariable] = Field(default_factory=list)
    questions: list[CatalogQuestion] = Field(default_factory=list)
    personas: list[Persona] = Field(default_factory=list)


class Catalog(_CatalogModel):
    variables: dict[str, CatalogVariable]
    questions: list[CatalogQuestion]
    personas: list[Persona]

    @property
    def domains(self) -> list[str]:
        return sorted({variable.domain for variable in self.variables.values()})

    def question(self, question_id: str) -> CatalogQuestion:
        for question in self.questions:
            if question.id == question_id:
                return question
        raise KeyError(question_id)

    def problems(self) -> list[str]:
        """Cross-references that a single file cannot check."""
        problems: list[str] = []
        for question in self.questions:
            where = f"question {question.id!r}"
            if len(set(question.variables)) != len(question.variables):
                problems.append(f"{where}: variables repeat: {question.variables}")
            for var in question.variables:
                variable = self.variables.get(var)
                if variable is None:
                    problems.append(f"{where}: unknown variable {var!r}")
                    continue
                fragments = question.advice.get(var, {})
                missing = [value for value in variable.values if value not in fragments]
                if missing:
                    problems.append(f"{where}: no advice for {var!r} values {missing}")
                extra = [value for value in fragments if value not in variable.values]
                if extra:
                    problems.append(f"{where}: advice for unknown {var!r} values {extra}")
                texts = [fragments[value] for value in variable.values if value in fragments]
                if len(set(texts)) != len(texts):
                    problems.append(f"{where}: two values of {var!r} share the same advice")
            for var in question.advice:
                if var not in question.variables:
                    problems.append(f"{where}: advice for {var!r}, which is not in its variables")
        return problems


def load_catalog(extra_dirs: Sequence[str | Path] = ()) -> Catalog:
    """The built-in catalog merged with every `*.json` file of `extra_dirs`."""
    variables: dict[str, CatalogVariable] = {}
    questions: dict[str, CatalogQuestion] = {}
    personas: dict[str, Persona] = {}
    for directory in [CATALOG_DIR, *(Path(d) for d in extra_dirs)]:
        if not directory.is_dir():
            raise ConfigError(f"catalog directory {str(directory)!r} does not exist")
        for path in sorted(directory.glob("*.json")):
            part = _read_catalog_file(path)
            for kind, target, entries in (
                ("variable", variables, [(v.name, v) for v in part.variables]),
                ("question", questions, [(q.id, q) for q in part.questions]),
                ("persona", personas, [(p.id, p) for p in part.personas]),
            ):
                for key, entry in entries:
                    if key in target:
                        raise ConfigError(
                            f"{path}: {kind} {key!r} is already defined by another catalog "
                            "file; give it a unique name"
                        )
                    target[key] = entry
    catalog = Catalog(
        variables=variables, questions=list(questions.values()), personas=list(personas.values())
    )
    problems = catalog.problems()
    if problems:
        raise ConfigError(f"catalog is inconsistent: {'; '.join(problems)}")
    if not catalog.personas:
        raise ConfigError("catalog has no personas; add a file with a 'personas' list")
    return catalog


def _read_catalog_file(path: Path) -> _CatalogFile:
    data = read_json_file(path, "catalog file")
    try:
        return _CatalogFile.model_validate(data)
    except ValidationError as error:
        raise ConfigError(
            format_validation_error(
                f"catalog file {path} does not follow the catalog format (see catalog/README.md)",
                error,
                _CatalogFile,
                limit=5,
            )
        ) from None
