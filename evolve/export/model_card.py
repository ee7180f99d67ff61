"""What a registered memory-policy version says about itself: its description, tags and
metrics, and the held-out verdict of the exported candidate against the base it evolved
from.

An export crowns a policy (the alias `champion`); what the crown is worth is the held-out
test of the candidate against its base, paired on the same questions. The version carries
the verdict (beats / within noise / worse, read from the interval of the difference) as the
tag `evolve.heldout_verdict`, and its description says what the verdict rests on: the
interval, McNemar's counts, the users and questions. Two point scores never name a winner:
a best that does not beat its base is exported with a warning saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from evolve.optimize.report import heldout_warning
from evolve.results.comparison import base_and_best
from evolve.stats import Verdict
from evolve.tracking import TAG_CANDIDATE
from evolve.tracking.intervals import (
    comparison_metrics,
    comparison_tags,
    heldout_verdict_text,
    memory_difference_sentence,
    score_interval_metrics,
)
from evolve.tracking.tags import (
    HELDOUT_VERDICT_TAGS,
    TAG_BEST_CANDIDATE,
    TAG_HELDOUT_EVIDENCE,
    TAG_HELDOUT_VERDICT,
)

if TYPE_CHECKING:
    from evolve.results.records import CandidateRecord, ExperimentResult


@dataclass(frozen=True)
class HeldoutVerdict:
    """The held-out test of an exported candidate against its base, as the export shows it."""

    text: str  # the verdict with its evidence, as the version's description says it
    warning: str | None = None  # one line, unless the test shows that the best beats the base
    tags: dict[str, str] = field(default_factory=dict)  # evolve.heldout_verdict, ...
    metrics: dict[str, float] = field(default_factory=dict)  # heldout_difference, ...

    @property
    def verdict(self) -> str | None:
        """beats / within noise / worse; None: no paired test (e.g. the best is the base)."""
        return self.tags.get(TAG_HELDOUT_VERDICT)


def heldout_verdict(result: ExperimentResult) -> HeldoutVerdict | None:
    """The verdict of an experiment's best against its base, from the experiment's records
    (None: either was not scored on held-out users)."""
    pair = base_and_best(result)
    if pair is None or pair[0].heldout is None or pair[1].heldout is None:
        return None
    warning = heldout_warning(result)
    comparison = result.heldout_comparison
    if comparison is None:  # the best is the base, or their records are not there to pair
        return HeldoutVerdict(text=_sentence(warning or "no held-out verdict"), warning=warning)
    if warning:  # the verdict in words ("is within noise of"), with the same evidence
        text = _sentence(warning) + memory_difference_sentence(comparison)
    else:
        text = heldout_verdict_text(result) or ""
    return HeldoutVerdict(
        text=text,
        warning=warning,
        tags=comparison_tags(comparison),
        metrics=comparison_metrics(comparison),
    )


def heldout_verdict_from_run(tags: Mapping[str, str], candidate_id: str) -> HeldoutVerdict | None:
    """The verdict an experiment's parent run recorded (its records are not here), when the
    exported candidate is the one that run selected."""
    verdict = tags.get(TAG_HELDOUT_VERDICT)
    if verdict is None or tags.get(TAG_BEST_CANDIDATE) != candidate_id:
        return None
    evidence = tags.get(TAG_HELDOUT_EVIDENCE, "")
    text = f"held-out test of the best ({candidate_id}) against its base: {verdict}: {evidence}"
    warning = None if verdict == Verdict.BEATS else f"warning: {text}"
    return HeldoutVerdict(
        text=_sentence(text),
        warning=warning,
        tags={key: tags[key] for key in HELDOUT_VERDICT_TAGS if key in tags},
    )


def _sentence(line: str) -> str:
    line = line.removeprefix("warning: ")
    return f"{line[:1].upper()}{line[1:]}."


def version_tags(
    candidate: CandidateRecord | None, verdict: HeldoutVerdict | None
) -> dict[str, str]:
    """The candidate's id and scores (each named: what `score` is, the memory score where it
    is defined, the accuracy) and the held-out verdict's tags."""
    tags: dict[str, str] = dict(verdict.tags) if verdict is not None else {}
    if candidate is None:
        return tags
    tags[TAG_CANDIDATE] = candidate.id
    for split in ("heldout", "validation", "train"):
        scores = getattr(candidate, split)
        if scores is None:
            continue
        tags[f"{split}_score"] = f"{scores.score:.6g}"
        if scores.objective_used:  # what `score` is: memory_score, or accuracy
            tags[f"{split}_objective_used"] = scores.objective_used
        if scores.summary.memory_score is not None:  # undefined: no tag, never a stand-in
            tags[f"{split}_memory_score"] = f"{scores.summary.memory_score:.6g}"
        if scores.summary.accuracy is not None:  # unknown for a record rebuilt from a run
            tags[f"{split}_accuracy"] = f"{scores.summary.accuracy:.6g}"
    return tags


def model_metrics(
    candidate: CandidateRecord | None, verdict: HeldoutVerdict | None = None
) -> dict[str, float]:
    """The registered model's metrics: the candidate's train and held-out scores and, where
    the evaluation's summary is known, its defined metrics with their intervals' bounds
    (undefined ones stay absent); the held-out test against the base where there is one."""
    metrics: dict[str, float] = {}
    for split in ("train", "validation", "heldout"):
        scores = getattr(candidate, split) if candidate is not None else None
        if scores is None:
            continue
        metrics[f"{split}_score"] = float(scores.score)
        if scores.summary.n_items:  # a record rebuilt from a run has no summary
            metrics.update(scores.summary.flat_metrics(f"{split}_"))
        metrics.update(score_interval_metrics(split, scores.estimate))
    if verdict is not None:
        metrics.update(verdict.metrics)
    return metrics


def version_description(candidate: CandidateRecord | None, verdict: HeldoutVerdict | None) -> str:
    if candidate is None:
        return "Memory policy exported by amemgym-evolve."
    heldout = "-" if candidate.heldout_score is None else f"{candidate.heldout_score:.3f}"
    train = "-" if candidate.train_score is None else f"{candidate.train_score:.3f}"
    parents = ", ".join(candidate.parent_ids) or "none"
    test = f" {verdict.text}" if verdict is not None else ""
    return (
        f"Memory policy {candidate.id} ({candidate.kind or 'policy'}, generation "
        f"{candidate.generation}, mutation {candidate.mutation.kind}, parents {parents}) "
        f"exported by amemgym-evolve. Held-out score {heldout}, train score {train}.{test} "
        "predict() takes records {user_message, state} (one user turn with that user's memory "
        "state) or {question, options, state}; the LM comes from model_config or "
        "MEMORY_POLICY_MODEL at load time."
    )
