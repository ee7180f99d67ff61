"""Where a tuning study keeps its things: the run directory's layout and the study's own
attributes. A leaf of the tuning package: the worker writes these, and the spend ledger, the
live reader and `evolve compare` read them without importing the worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from evolve.core.files import atomic_write_json, safe_name
from evolve.simulator.run_dir import read_record
from evolve.tuning.records import IN_MEMORY_STORAGE, TuningResult
from evolve.tuning.spec import parameter_slug
from evolve.tuning.storage import redact_storage_url

# Study attributes: the configuration the study was made with (a rerun must match it).
STUDY_ATTR_HASH = "evolve.config_hash"
STUDY_ATTR_IDENTITY = "evolve.identity"
RESULT_FILE = "tuning.json"


class TuningDir:
    """`runs/<name>/`: trial and held-out runner directories and the latest result.

    Layout::

        trials/<study>/<NNNN>-<params>/   runner directory of trial NNNN (train users)
        heldout/<params>/                 runner directory of a held-out check
        spend/<study>/*.jsonl             spend journals (`evolve.tuning.spend`): one line
                                          per completed LLM call, per trial and per process
        tuning.json                       TuningResult of the latest invocation (written when
                                          it starts and after every trial)
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def trial_dir(self, study_name: str, number: int, parameters: Mapping[str, int]) -> Path:
        # The parameters are in the name: the same number with other parameters (a study
        # recreated in a new storage) never resumes a directory evaluated with different ones.
        slug = parameter_slug(dict(parameters))
        return self.root / "trials" / safe_name(study_name) / f"{number:04d}-{slug}"

    def heldout_dir(self, parameters: Mapping[str, int]) -> Path:
        return self.root / "heldout" / parameter_slug(dict(parameters))

    @property
    def result_file(self) -> Path:
        return self.root / RESULT_FILE

    def save_result(self, result: TuningResult) -> None:
        atomic_write_json(self.result_file, result.model_dump(mode="json"))

    def load_result(self) -> TuningResult:
        return read_record(self.result_file, TuningResult)

    def relative(self, path: Path) -> str:
        return str(Path(path).relative_to(self.root))


def storage_label(url: str | None) -> str:
    """How results name a study's storage: its URL without credentials, or in-memory."""
    return redact_storage_url(url) if url is not None else IN_MEMORY_STORAGE
