"""Results on disk: the run directory layout, the config hash guarding
resumption, and an export in the original AMemGym per-user layout.

Run directory::

    run.json                         resolved config, its hash, format version
    environment.json                 the environment (original data.json format)
    upper_bound.json                 the upper-bound table used for the memory score, if any
    users/<user>/period_NN/
        transcript.json              the period's sessions and what they cost
        checkpoint.json              policy memory after the sessions, before the questions
        result.json                  the PeriodResult; written last: marks the unit finished
    report.json                      EvaluationReport without the per-item records
    original/<user>/                 the original code's layout (see `export_original_layout`)
        overall_results.json  overall_metrics.json  interactions/period_NN.json
        diagnosis_results.json  diagnosis_metrics.json   the ORIGINAL's diagnosis and schema
        failure_partition.json       ours: write / read / utilization per wrong item
    original/random_metrics.json  original/utilization_metrics.json

Every file is written with `evolve.core.files.atomic_write_text` (temporary file, fsync,
`os.replace`), so a reader (or a resumed run) never sees a half-written file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from evolve.core.errors import DamagedRunFileError, ResumeMismatchError, ToolkitError
from evolve.core.files import (
    atomic_write_json,
    atomic_write_text,
    parse_json_text,
    read_text_file,
    unused_path,
)

# Re-exported for the runner and the chain schedule, which name users' directories with it.
from evolve.core.files import safe_name as safe_name
from evolve.llm.usage import Usage
from evolve.simulator.original_format import diagnosis_entries, diagnosis_metrics
from evolve.simulator.records import (
    PeriodResult,
    SessionTranscript,
    UserResult,
)

if TYPE_CHECKING:
    from evolve.simulator.upper_bound_table import UpperBoundTable


class _StoredTranscript(BaseModel):
    """transcript.json: a period's sessions and what they cost."""

    sessions: list[SessionTranscript]
    usage: Usage = Usage()


RUN_FORMAT = "amemgym-evolve.run"
RUN_FORMAT_VERSION = 1


Record = TypeVar("Record", bound=BaseModel)

# What to do about a damaged file, when the reader cannot recompute it itself.
DAMAGED_FILE_FIX = "delete it and rerun to recompute it, or delete the run directory to start over"


def read_json(path: Path, *, fix: str = DAMAGED_FILE_FIX) -> Any:
    """A JSON file evolve wrote into a run directory, read back. Anything unreadable
    (truncated, garbled, not UTF-8) raises `DamagedRunFileError`: one line naming the file,
    what is wrong and `fix`, never a decoder traceback."""
    return _read_json_text(path, fix)[1]


def _read_json_text(path: Path, fix: str) -> tuple[str, Any]:
    """The file's text and what it parses to (see `read_json`)."""
    try:
        text = read_text_file(path, "run file", error=_Unreadable)
        return text, parse_json_text(text, path, "run file", _Unreadable)
    except _Unreadable as exc:
        raise DamagedRunFileError(path, str(exc).removeprefix(f"{path}: "), fix) from None


class _Unreadable(ToolkitError):
    """What the shared readers raise, before it becomes a `DamagedRunFileError`."""


def read_object(path: Path, *, fix: str = DAMAGED_FILE_FIX) -> dict[str, Any]:
    """`read_json` of a file that holds a JSON object."""
    return _json_object(path, read_json(path, fix=fix), fix)


def _json_object(path: Path, data: Any, fix: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise DamagedRunFileError(
            path, f"expected a JSON object, found a {type(data).__name__}", fix
        )
    return data


def read_record(path: Path, model: type[Record], *, fix: str = DAMAGED_FILE_FIX) -> Record:
    """`read_json` validated as `model`: a file that parses but is not such a record (a
    field missing or of the wrong type) is damaged too."""
    data = read_json(path, fix=fix)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the top level"
        raise DamagedRunFileError(
            path, f"not a {model.__name__} record ({first['msg']} at {where})", fix
        ) from None


# ----- config hash -----------------------------------------------------------------------------


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def config_hash(resolved_config: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(resolved_config).encode("utf-8")).hexdigest()


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, Mapping) and data:
        flat: dict[str, Any] = {}
        for key, value in data.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix.rstrip("."): data}


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def open_header(
    path: Path,
    *,
    file_format: str,
    format_version: int,
    key: str,
    config: Mapping[str, Any],
    mismatch: str,
    fix: str,
    listed: int = 8,
) -> str:
    """Write a run header holding `config` and its hash, or check an existing one.

    Returns the hash. An existing header with another hash raises ResumeMismatchError:
    "<mismatch>: <each differing setting>. <fix>".
    """
    digest = config_hash(config)
    if path.exists():
        stored = read_object(path)
        if stored.get("config_hash") != digest:
            differences = config_differences(stored.get(key, {}), config)
            shown = "; ".join(differences[:listed]) or "(stored header unreadable)"
            more = f" (+{len(differences) - listed} more)" if len(differences) > listed else ""
            raise ResumeMismatchError(f"{mismatch}: {shown}{more}. {fix}")
        return digest
    atomic_write_json(
        path,
        {
            "format": file_format,
            "format_version": format_version,
            "config_hash": digest,
            key: dict(config),
        },
    )
    return digest


def config_differences(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Human-readable `path: old -> new` lines for every differing leaf."""
    old, new = _flatten(stored), _flatten(current)
    lines = []
    for key in sorted(old.keys() | new.keys()):
        if old.get(key, "<absent>") != new.get(key, "<absent>"):
            lines.append(
                f"{key}: {_short(old.get(key, '<absent>'))} -> {_short(new.get(key, '<absent>'))}"
            )
    return lines


# ----- layout ----------------------------------------------------------------------------------


class RunLayout:
    """Paths inside one run directory (nothing is created until written)."""

    def __init__(self, run_dir: Path):
        self.root = Path(run_dir)

    @property
    def run_file(self) -> Path:
        return self.root / "run.json"

    @property
    def environment_file(self) -> Path:
        return self.root / "environment.json"

    @property
    def upper_bound_file(self) -> Path:
        return self.root / "upper_bound.json"

    @property
    def report_file(self) -> Path:
        return self.root / "report.json"

    @property
    def original_dir(self) -> Path:
        return self.root / "original"

    def user_dir(self, user_dir_name: str) -> Path:
        return self.root / "users" / user_dir_name

    def period_dir(self, user_dir_name: str, period_index: int) -> Path:
        return self.user_dir(user_dir_name) / f"period_{period_index:02d}"

    def transcript_file(self, user_dir_name: str, period_index: int) -> Path:
        return self.period_dir(user_dir_name, period_index) / "transcript.json"

    def checkpoint_file(self, user_dir_name: str, period_index: int) -> Path:
        return self.period_dir(user_dir_name, period_index) / "checkpoint.json"

    def result_file(self, user_dir_name: str, period_index: int) -> Path:
        return self.period_dir(user_dir_name, period_index) / "result.json"

    # -- run header ---------------------------------------------------------------------

    def open_run(self, resolved_config: Mapping[str, Any]) -> str:
        """Create the run header, or check that an existing run has the same config.

        Returns the config hash. Raises ResumeMismatchError naming each differing setting.
        """
        return open_header(
            self.run_file,
            file_format=RUN_FORMAT,
            format_version=RUN_FORMAT_VERSION,
            key="config",
            config=resolved_config,
            mismatch=f"{self.root} holds a run made with a different configuration",
            fix="Resume with the same settings, or choose another output directory (or delete "
            "this one) to start a new run",
        )

    # -- units ----------------------------------------------------------------------------

    def load_period_result(self, user_dir_name: str, period_index: int) -> PeriodResult | None:
        path = self.result_file(user_dir_name, period_index)
        if not path.exists():
            return None
        return read_record(path, PeriodResult)

    def save_transcript(
        self,
        user_dir_name: str,
        period_index: int,
        sessions: Sequence[SessionTranscript],
        usage: Usage,
    ) -> None:
        """The sessions and the LM usage they cost (kept so that a resumed unit, which skips
        its sessions, still reports what they cost)."""
        atomic_write_json(
            self.transcript_file(user_dir_name, period_index),
            {
                "sessions": [session.model_dump(mode="json") for session in sessions],
                "usage": usage.model_dump(mode="json"),
            },
        )

    def load_transcript(
        self, user_dir_name: str, period_index: int
    ) -> tuple[list[SessionTranscript], Usage] | None:
        path = self.transcript_file(user_dir_name, period_index)
        if not path.exists():
            return None
        stored = read_record(path, _StoredTranscript)
        return stored.sessions, stored.usage

    def save_checkpoint(self, user_dir_name: str, period_index: int, state_json: str) -> None:
        atomic_write_text(self.checkpoint_file(user_dir_name, period_index), state_json + "\n")

    def load_checkpoint(self, user_dir_name: str, period_index: int) -> str | None:
        """The policy state's JSON text (checked to be a JSON object; the policy parses it)."""
        path = self.checkpoint_file(user_dir_name, period_index)
        if not path.exists():
            return None
        text, state = _read_json_text(path, DAMAGED_FILE_FIX)
        _json_object(path, state, DAMAGED_FILE_FIX)  # a policy state
        return text.strip()

    def set_aside(self, user_dir_name: str, from_period: int) -> list[Path]:
        """Move a user's period `from_period` and every later one out of the way, under
        `set_aside/`, so that they are recomputed: a damaged unit, and the units that
        continued from its memory. Kept, not deleted: nothing a run wrote is lost. Returns
        where they went."""
        moved = []
        index = from_period
        while (source := self.period_dir(user_dir_name, index)).exists():
            # Not named period_NN there: nothing that gathers a run's units finds them.
            target = unused_path(self.root / "set_aside" / user_dir_name / f"damaged-{source.name}")
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, target)
            moved.append(target)
            index += 1
        return moved

    def save_period_result(self, user_dir_name: str, result: PeriodResult) -> None:
        atomic_write_json(
            self.result_file(user_dir_name, result.period_index), result.model_dump(mode="json")
        )


# ----- original layout export ----------------------------------------------------------------

ORIGINAL_METRICS = ("accuracy",)


def _overall_result(item: Any) -> dict[str, Any]:
    """One entry of the original overall_results.json (its `answer` is 0-based, its
    `response` 1-based, as in the original code). No random fallback: an unparseable answer
    has `response` None and scores 0."""
    return {
        "query": item.question,
        "answer": item.gold - 1,
        "answer_state": item.gold_state,
        "answer_choice": item.options[item.gold - 1],
        "raw_response": item.raw_answer,
        "response": item.chosen,
        "response_state": item.chosen_state,
        "response_choice": item.options[item.chosen - 1] if item.chosen else None,
        "json_error": item.parse_failed,
        "llm_usage_statistics": {},
        "scores": {"accuracy": float(item.correct)},
        "relevant_memories": item.retrieved,
    }


def _partition_entry(item: Any) -> dict[str, Any]:
    return {
        "question_index": item.question_index,
        "query": item.question,
        "required_info": item.required_info,
        "correct": item.correct,
        "diagnosis": item.diagnosis.value,
        "variables": [check.model_dump(mode="json") for check in item.variables],
    }


FAILURE_PARTITION_FILE = "failure_partition.json"


def export_original_user(target: Path, user: UserResult) -> None:
    """Write one user's results in the original per-user layout under `target`.

    `diagnosis_results.json` / `diagnosis_metrics.json` hold the original's diagnosis with
    its schema (`original_format`); they are left out when it cannot be derived (wrong_only
    probes). Our partition goes to `failure_partition.json`.
    """
    periods = sorted(user.periods, key=lambda p: p.period_index)
    overall = [[_overall_result(item) for item in p.items] for p in periods]
    atomic_write_json(target / "overall_results.json", overall)
    atomic_write_json(
        target / "overall_metrics.json",
        {"accuracy": [[float(item.correct) for item in p.items] for p in periods]},
    )
    atomic_write_json(
        target / FAILURE_PARTITION_FILE,
        {
            "meaning": "each wrong item attributed to write, read or utilization; "
            "write + read + utilization = 1 - accuracy (amemgym-evolve, not the original's)",
            "periods": [
                {
                    "period_index": p.period_index,
                    "probes": [probe.model_dump(mode="json") for probe in p.probes],
                    "question_probes": [q.model_dump(mode="json") for q in p.question_probes],
                    "items": [_partition_entry(item) for item in p.items],
                }
                for p in periods
            ],
        },
    )
    entries = [diagnosis_entries(p) for p in periods]
    stale = [target / "diagnosis_results.json", target / "diagnosis_metrics.json"]
    if periods and all(e is not None for e in entries):
        complete = [e for e in entries if e is not None]
        atomic_write_json(stale[0], [[e.model_dump(mode="json") for e in row] for row in complete])
        atomic_write_json(stale[1], diagnosis_metrics(complete).model_dump(mode="json"))
    else:
        for path in stale:
            path.unlink(missing_ok=True)
    for p in periods:
        atomic_write_json(
            target / "interactions" / f"period_{p.period_index:02d}.json",
            [[m.model_dump(mode="json") for m in s.messages] for s in p.sessions],
        )


def export_original_layout(
    layout: RunLayout,
    users: Sequence[UserResult],
    user_dir_names: Mapping[str, str],
    upper_bound: UpperBoundTable | None = None,
) -> Path:
    """The original code's per-user files, plus its global random / upper-bound matrices.

    `random_metrics.json` and `utilization_metrics.json` hold `{metric: [user][period][q]}`
    like the original `random.py` / `upperbound.py` outputs (the latter only with a table).
    """
    root = layout.original_dir
    for user in users:
        export_original_user(root / user_dir_names[user.user_id], user)

    def matrix(value) -> list[list[list[float]]]:
        return [
            [[value(user, p, item) for item in p.items] for p in user.periods] for user in users
        ]

    atomic_write_json(
        root / "random_metrics.json",
        {"accuracy": matrix(lambda user, p, item: item.random_score)},
    )
    if upper_bound is not None:

        def ub(user: UserResult, p: PeriodResult, item: Any) -> float:
            found = upper_bound.correct(user.user_id, item.question_index, item.gold - 1)
            return float(bool(found))

        atomic_write_json(root / "utilization_metrics.json", {"accuracy": matrix(ub)})
    return root
