"""The experiment directory `runs/<name>/`: records on disk, resume guard, spend ledger.

Layout::

    experiment.json                 format, config hash, the identity it hashes
    ledger.json                     LLM calls / tokens / wall time spent so far (all invocations)
    spend.jsonl                     the ledger's journal: one line per completed LLM call
    candidates/<id>/candidate.json  CandidateRecord (written when proposed, rewritten when scored)
    candidates/<id>/policy/         the candidate's policy bundle (memory_policies.load)
    candidates/<id>/feedback.txt    what the reflector was shown (reflective mutations)
    candidates/<id>/train/          runner directory of its train evaluation (resumable)
    candidates/<id>/heldout/        runner directory of its held-out evaluation
    chain/train/                    per_period schedule: the evolving train run (all chains)
    chain/final/<user>/             per_period schedule: each user's final policy bundle
    chain/final_policies.json       per_period schedule: user -> final candidate and bundle
    generations/gen_NN.json         GenerationRecord: written when the generation is finished
    stages.json                     spend of the work outside the generations, by stage (the
                                    upper bound, the final held-out tests), all invocations
    result.json                     ExperimentResult of the latest invocation

Every file is written atomically; a finished unit (candidate split, generation) is never
recomputed, which is what makes an interrupted `evolve run` resume where it stopped.

Spend is journaled, not only checkpointed: `ledger.json` is rewritten at every finished
unit, but a `kill -9` between two units would lose the calls made since the last one. Each
completed LLM call therefore appends one line to `spend.jsonl` (flushed at once, fsynced at
every unit), and a resumed run sums the journal: after any crash the spend it starts from
is short only by the calls that were in flight.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from evolve.core.errors import DamagedRunFileError
from evolve.core.files import atomic_write_json, atomic_write_text, warn_damaged
from evolve.core.protocol import DEFAULT_PROTOCOL
from evolve.llm.usage import Usage
from evolve.results.budget import SpendJournal, spend_json
from evolve.results.records import CandidateRecord, ExperimentResult, GenerationRecord
from evolve.simulator.run_dir import open_header, read_object, read_record

EXPERIMENT_FORMAT = "amemgym-evolve.experiment"
EXPERIMENT_FORMAT_VERSION = 1

# The stages whose spend `stages.json` holds, as the report names their rows.
UPPER_BOUND_STAGE = "upper bound"
HELDOUT_STAGE = "held-out tests"


class ExperimentDir:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._journal: SpendJournal | None = None

    # -- header -----------------------------------------------------------------------------

    @property
    def experiment_file(self) -> Path:
        return self.root / "experiment.json"

    def open(self, identity: dict[str, Any]) -> str:
        """Create the header, or check that the stored experiment has the same identity."""
        return open_header(
            self.experiment_file,
            file_format=EXPERIMENT_FORMAT,
            format_version=EXPERIMENT_FORMAT_VERSION,
            key="identity",
            config=identity,
            mismatch=f"{self.root} holds an experiment run with a different spec",
            fix="Resume with the same spec (budget, concurrency, tracking and the number of "
            "generations may change), rename the experiment (name = ...), or delete the "
            "directory to start over",
            listed=6,
        )

    def exists(self) -> bool:
        return self.experiment_file.exists()

    def config_hash(self) -> str:
        return str(read_object(self.experiment_file).get("config_hash", ""))

    # -- candidates ---------------------------------------------------------------------------

    def candidate_dir(self, candidate_id: str) -> Path:
        return self.root / "candidates" / candidate_id

    def policy_dir(self, candidate_id: str) -> Path:
        return self.candidate_dir(candidate_id) / "policy"

    def feedback_file(self, candidate_id: str) -> Path:
        return self.candidate_dir(candidate_id) / "feedback.txt"

    def save_candidate(self, record: CandidateRecord) -> None:
        atomic_write_json(
            self.candidate_dir(record.id) / "candidate.json", record.model_dump(mode="json")
        )

    def load_candidate(self, candidate_id: str) -> CandidateRecord | None:
        path = self.candidate_dir(candidate_id) / "candidate.json"
        if not path.exists():
            return None
        return read_record(path, CandidateRecord)

    def load_candidates(self) -> list[CandidateRecord]:
        records = [
            read_record(path, CandidateRecord)
            for path in (self.root / "candidates").glob("*/candidate.json")
        ]
        return sorted(records, key=lambda r: (r.generation, r.id))

    def save_feedback(self, candidate_id: str, text: str) -> None:
        atomic_write_text(self.feedback_file(candidate_id), text + "\n")

    def load_feedback(self, candidate_id: str) -> str | None:
        path = self.feedback_file(candidate_id)
        return path.read_text(encoding="utf-8").rstrip("\n") if path.exists() else None

    # -- generations ----------------------------------------------------------------------------

    def generation_file(self, generation: int) -> Path:
        return self.root / "generations" / f"gen_{generation:02d}.json"

    def save_generation(self, record: GenerationRecord) -> None:
        atomic_write_json(self.generation_file(record.generation), record.model_dump(mode="json"))

    def load_generation(self, generation: int) -> GenerationRecord | None:
        path = self.generation_file(generation)
        return read_record(path, GenerationRecord) if path.exists() else None

    def load_generations(self) -> list[GenerationRecord]:
        records = [
            read_record(path, GenerationRecord)
            for path in (self.root / "generations").glob("gen_*.json")
        ]
        return sorted(records, key=lambda r: r.generation)

    # -- spend and result --------------------------------------------------------------------

    @property
    def ledger_file(self) -> Path:
        return self.root / "ledger.json"

    @property
    def journal_file(self) -> Path:
        return self.root / "spend.jsonl"

    def _ledger_spend(self) -> Usage:
        if not self.ledger_file.exists():
            return Usage()
        return read_record(self.ledger_file, Usage)

    def load_spend(self) -> Usage:
        """Spend of every invocation so far: the journal's sum (the ledger before journals)."""
        if self.journal_file.exists():
            return SpendJournal(self.journal_file).total()
        return self._ledger_spend()

    def open_journal(self) -> SpendJournal:
        """Open the spend journal for appending (the ledger's spend is carried into a new one)."""
        self._journal = SpendJournal(self.journal_file).open(carried=self._ledger_spend())
        return self._journal

    def save_spend(self, spend: Usage) -> None:
        atomic_write_json(self.ledger_file, spend_json(spend))
        if self._journal is not None:
            self._journal.mark_wall_time(spend.wall_time_s)
            self._journal.sync()

    @property
    def stages_file(self) -> Path:
        return self.root / "stages.json"

    def load_stage_spend(self) -> dict[str, Usage]:
        """Spend per stage outside the generations (`add_stage_spend`); a damaged file is
        set aside with a warning: the report then shows that spend as in no row."""
        if not self.stages_file.exists():
            return {}
        try:
            stored = read_object(self.stages_file)
            return {name: Usage.model_validate(spend) for name, spend in stored.items()}
        except (DamagedRunFileError, ValueError) as damaged:
            problem = getattr(damaged, "problem", "not a spend per stage")
            warn_damaged(self.stages_file, problem, "its spend is reported in no row")
            return {}

    @contextlib.contextmanager
    def spend_stage(self, stage: str, spent: Callable[[], Usage]) -> Iterator[None]:
        """Count the spend made inside (`spent()` after minus before) as `stage`'s, also
        when the work inside is interrupted: the report's rows then add up to the total."""
        before = spent()
        try:
            yield
        finally:
            self.add_stage_spend(stage, spent() - before)

    def add_stage_spend(self, stage: str, spend: Usage) -> None:
        """Add one invocation's spend in `stage` to the stored total (summed over resumes)."""
        stages = self.load_stage_spend()
        stages[stage] = stages.get(stage, Usage()) + spend
        atomic_write_json(
            self.stages_file, {name: spend_json(usage) for name, usage in stages.items()}
        )

    @property
    def result_file(self) -> Path:
        return self.root / "result.json"

    def save_result(self, result: ExperimentResult) -> None:
        atomic_write_json(self.result_file, result.model_dump(mode="json"))

    def load_result(self) -> ExperimentResult:
        """The latest result; rebuilt from the records when an invocation was killed."""
        if not self.exists():
            raise FileNotFoundError(self.experiment_file)
        stored: dict[str, Any] = {}
        if self.result_file.exists():
            try:
                stored = read_object(self.result_file)
            except DamagedRunFileError as damaged:  # rebuilt from the records below
                warn_damaged(
                    damaged.path, damaged.problem, "rebuilding the result from the records"
                )
        from evolve.results.records import select_best

        candidates = self.load_candidates()
        best = select_best(candidates)
        spend = self.load_spend()
        result = ExperimentResult(
            name=stored.get("name", self.root.name),
            config_hash=self.config_hash(),
            schedule=stored.get("schedule", "population"),
            candidates=candidates,
            generations=self.load_generations(),
            best_id=best.id if best is not None else None,
            stopped=stored.get("stopped"),
            complete=bool(stored.get("complete", False)),
            chain_summary=stored.get("chain_summary"),
            llm_calls=spend.requests,
            tokens=spend.tokens,
            wall_time_s=spend.wall_time_s,
            prompt_eval_s=round(spend.prompt_eval_s, 3),
            decode_s=round(spend.decode_s, 3),
            toolkit_share=stored.get("toolkit_share"),
            reflection_parse_failures=sum(r.reflection_parse_failures for r in candidates),
            max_tokens=stored.get("max_tokens", {}),
            protocol=stored.get("protocol", DEFAULT_PROTOCOL),
            stage_spend=self.load_stage_spend(),
        )
        from evolve.results.comparison import heldout_comparison

        return result.model_copy(
            update={"heldout_comparison": heldout_comparison(self.root, result)}
        )


def experiment_dir_for(target: str, runs_dir: str | Path = "runs") -> Path | None:
    """The experiment directory named by a spec file, a name under `runs_dir`, or a path."""
    path = Path(target)
    if path.suffix == ".toml" and path.is_file():
        from evolve.spec.config import load_spec

        return Path(runs_dir) / load_spec(path).name
    for candidate in (Path(runs_dir) / target, path):
        if (candidate / "experiment.json").is_file():
            return candidate
    return None
