"""The LLM synthesis work directory: resumable per-user, per-stage unit files.

Layout: `<work_dir>/<key>/config.json` (what the key stands for) and
`<work_dir>/<key>/users/<user id>/<unit>.json`, one file per finished unit (a stage, or a
stage's part such as one period's updates). `<key>` hashes the synthesis config, seed and
simulator model, so a changed config never reuses stale outputs. Every file is written
atomically: a crash leaves either the previous state or the finished unit, never half.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evolve.core.errors import ResumeMismatchError
from evolve.core.files import atomic_write_json, safe_name

OUTCOME_FILE = "outcome"
PERSONA_FILE = "persona"


class UserUnitFiles:
    """Finished units of one user."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, unit: str) -> Path:
        return self.directory / f"{unit}.json"

    def load(self, unit: str) -> dict[str, Any] | None:
        path = self.path(unit)
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            # Only a hand edit can cause this (writes are atomic): say which file to delete.
            raise ResumeMismatchError(
                f"{path} is not valid JSON ({error.msg}); delete it to regenerate that unit"
            ) from None

    def save(self, unit: str, data: dict[str, Any]) -> None:
        atomic_write_json(self.path(unit), data, indent=1, final_newline=False)

    def check_persona(self, persona: dict[str, Any]) -> None:
        """The user's directory must belong to the same persona (same id, same content)."""
        stored = self.load(PERSONA_FILE)
        if stored is None:
            self.save(PERSONA_FILE, persona)
        elif stored != persona:
            raise ResumeMismatchError(
                f"{self.directory} was generated from a different persona with the same user "
                "id; use another --work-dir or delete that directory to regenerate the user"
            )


class WorkDir:
    def __init__(self, root: str | Path, key: str, description: dict[str, Any]) -> None:
        self.root = Path(root)
        self.key = key
        self.directory = self.root / key
        manifest = self.directory / "config.json"
        if manifest.is_file():
            try:
                stored = json.loads(manifest.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                stored = None
            if stored != description:
                raise ResumeMismatchError(
                    f"{manifest} does not describe this run although its key matches; "
                    "delete that directory or use another --work-dir"
                )
        else:
            atomic_write_json(manifest, description, indent=1, final_newline=False)

    def user(self, user_id: str) -> UserUnitFiles:
        return UserUnitFiles(self.directory / "users" / safe_name(user_id))
