"""Human-readable views of an experiment: the per-generation table and the lineage (its
figure is `evolve.reporting.plots.plot_evolution`).

Pure functions over `ExperimentResult`; `evolve compare`, `evolve run` and the MLflow parent
run all show the same text.
"""

from __future__ import annotations

from collections.abc import Callable

from evolve.core.protocol import ProtocolRules
from evolve.results.objective import format_score
from evolve.results.records import CandidateRecord, ExperimentResult
from evolve.simulator.conversation_health import ConversationHealth
from evolve.simulator.metric_registry import metrics_in
from evolve.simulator.metrics import MetricSummary
from evolve.stats import PairedComparison, Verdict, minimum_detectable, users_to_detect

_score = format_score


def _rate(value: float | None) -> str:
    return format_score(value, 2)


def score_unit(result: ExperimentResult) -> str:
    """What the candidates' `score` is, in words: the objective, or accuracy where the memory
    score is undefined (its upper bound not clearly above random), said so."""
    objective = next(
        (r.train.objective for r in result.candidates if r.train is not None), "memory_score"
    )
    used = {
        scores.objective_used
        for record in result.candidates
        for scores in (record.train, record.heldout)
        if scores is not None and scores.objective_used
    }
    if objective == "memory_score" and "accuracy" in used:
        return (
            "accuracy where the memory score is undefined (upper bound not clearly above "
            "random), else memory_score"
            if "memory_score" in used
            else "accuracy (the memory score is undefined: upper bound not clearly above random)"
        )
    return objective


def generation_rows(result: ExperimentResult) -> list[dict[str, object]]:
    """One row per stored generation (numbers, for tables, plots and tests)."""
    rows = []
    for generation in result.generations:
        best = result.candidate(generation.best_id) if generation.best_id else None
        summary = best.train.summary if best is not None and best.train is not None else None
        periods = best.train.periods if summary is not None else None
        if periods is not None and generation.generation in periods:  # per_period: its period
            summary = best.train.per_period[periods.index(generation.generation)]
        rows.append(
            {
                "generation": generation.generation,
                "proposed": len(generation.candidate_ids),
                "evaluated": len(generation.evaluated_ids),
                "best_id": generation.best_id,
                "best_train": generation.best_train_score,
                "mean_train": generation.mean_train_score,
                "heldout_best": (
                    best.heldout.score if best is not None and best.heldout is not None else None
                ),
                # The best candidate's diagnosis, under each metric's column name.
                **{
                    declaration.column: declaration.value_of(summary) if summary else None
                    for declaration in metrics_in("report")
                },
                "parse_failures": summary.parse_failures_total if summary else None,
                "tokens": generation.tokens,
                "llm_calls": generation.llm_calls,
            }
        )
    return rows


def format_table(result: ExperimentResult, rules: ProtocolRules) -> str:
    """The per-generation table; `rules` (of the protocol that produced `result`) choose
    the chain's headline."""
    diagnosis = [declaration.column for declaration in metrics_in("report")]
    header = (
        f"{'gen':>3} {'cands':>5} {'best':<8} {'best train':>10} {'mean train':>10} "
        f"{'held-out':>8} {''.join(f'{column:>5} ' for column in diagnosis)}{'parse':>5} "
        f"{SPEND_COLUMNS[1:]}"
    )
    lines = [f"experiment {result.name} ({result.schedule}; score = {score_unit(result)})", header]
    for row in generation_rows(result):
        cands = f"{row['evaluated']}/{row['proposed']}"
        parse = "-" if row["parse_failures"] is None else str(row["parse_failures"])
        lines.append(
            f"{row['generation']:>3} {cands:>5} {str(row['best_id'] or '-'):<8} "
            f"{_score(row['best_train']):>10} {_score(row['mean_train']):>10} "  # type: ignore[arg-type]
            f"{_score(row['heldout_best']):>8} "  # type: ignore[arg-type]
            f"{''.join(f'{_rate(row[column]):>5} ' for column in diagnosis)}{parse:>5} "  # type: ignore[arg-type]
            f"{row['tokens']:>9} {row['llm_calls']:>6}"
        )
    if not result.generations:
        lines.append("  (no finished generation yet)")
    lines.extend(spend_rows(result, width=len(header) - len(SPEND_COLUMNS)))
    references = _references(result)
    if references:
        lines.append(references)
    skipped = [r for r in result.candidates if r.status in ("duplicate", "invalid")]
    if skipped:
        duplicates = sum(r.status == "duplicate" for r in skipped)
        lines.append(
            f"skipped candidates: {duplicates} duplicate, {len(skipped) - duplicates} invalid "
            f"(reflector parse failures: {result.reflection_parse_failures})"
        )
    lines.extend(conversation_lines(result))
    if result.chain_summary is not None:
        lines.append(chain_headline(result.chain_summary, rules))
    status = "complete" if result.complete else f"stopped: {result.stopped or 'interrupted'}"
    lines.append(
        f"spent: {result.llm_calls} LLM calls sent, {result.tokens} tokens, "
        f"{result.wall_time_s:.0f} s wall time ({status}; every invocation of the run)"
    )
    return "\n".join(lines)


SPEND_COLUMNS = f" {'tokens':>9} {'calls':>6}"


def spend_rows(result: ExperimentResult, *, width: int) -> list[str]:
    """The rows under the generations that make the calls and tokens columns add up to the
    run's spend: each stage outside the generations (the upper bound, the held-out tests),
    the rest when something was spent in no row, and the total."""
    rows = [
        (f"  {stage}", usage.tokens, usage.requests) for stage, usage in result.stage_spend.items()
    ]
    counted_calls = sum(g.llm_calls for g in result.generations) + sum(r[2] for r in rows)
    counted_tokens = sum(g.tokens for g in result.generations) + sum(r[1] for r in rows)
    if (result.llm_calls, result.tokens) != (counted_calls, counted_tokens):
        # A run recorded before the stages were has its upper bound and held-out tests here.
        label = "in no row: redone or replayed work" if rows else "in no row: stages not recorded"
        rows.append(
            (
                f"  {label}",
                result.tokens - counted_tokens,
                result.llm_calls - counted_calls,
            )
        )
    rows.append(("  total = spent", result.tokens, result.llm_calls))
    lines = [f"{label:<{width}} {tokens:>9} {calls:>6}" for label, tokens, calls in rows]
    lines.append(
        "calls: LLM calls sent to the endpoint, retries included (response-cache hits are free "
        "and not counted); tokens: their prompt + completion tokens"
    )
    return lines


def conversation_lines(result: ExperimentResult) -> list[str]:
    """Conversation health over every on-policy evaluation of the run, and its warning."""
    total = ConversationHealth()
    for record in result.candidates:
        for scores in (record.train, record.heldout):
            if scores is not None:
                total = total + scores.summary.conversation
    if not (total.user_messages or total.assistant_messages):
        return []
    warning = total.warning()
    return [f"conversation health: {total.describe()}", *([f"WARNING: {warning}"] * bool(warning))]


def _paper_headline(summary: MetricSummary) -> str:
    return (
        f"evolving train run (the paper's number, the reference's formula): memory score "
        f"{_score(summary.memory_score_original)}, accuracy with random fallback "
        f"{_score(summary.accuracy_with_random_fallback)}; ours (parse failures wrong, "
        f"over all items): memory score {_score(summary.memory_score)}, "
        f"accuracy {_score(summary.accuracy)}, parse failures "
        f"{summary.parse_failures_total}"
    )


def _our_headline(summary: MetricSummary) -> str:
    return (
        f"evolving train run: memory score {_score(summary.memory_score)}, accuracy "
        f"{_score(summary.accuracy)}, parse failures {summary.parse_failures_total}"
    )


# The headline of each `ProtocolRules.headline_memory_score`: under paper the paper's number,
# the reference's formula (`memory_score_original`: mean over user-periods, an unparseable
# answer given its random score), with ours next to it; under evolve our memory score. "-":
# undefined (an upper bound not clearly above random).
HEADLINES: dict[str, Callable[[MetricSummary], str]] = {
    "memory_score_original": _paper_headline,
    "memory_score": _our_headline,
}


def chain_headline(summary: MetricSummary, rules: ProtocolRules) -> str:
    """The per-period chain's headline under a protocol's rules."""
    return HEADLINES[rules.headline_memory_score](summary)


def accuracy_references(result: ExperimentResult) -> dict[str, float]:
    """Mean chance (random) and upper-bound accuracy over every evaluation of the run."""
    levels: dict[str, list[float]] = {"chance": [], "upper bound": []}
    for record in result.candidates:
        for scores in (record.train, record.heldout):
            if scores is None:
                continue
            if scores.summary.random_score is not None:
                levels["chance"].append(scores.summary.random_score)
            if scores.summary.upper_bound_score is not None:
                levels["upper bound"].append(scores.summary.upper_bound_score)
    return {name: sum(values) / len(values) for name, values in levels.items() if values}


def _references(result: ExperimentResult) -> str | None:
    levels = accuracy_references(result)
    if "chance" not in levels:
        return None
    text = f"accuracy references: chance {levels['chance']:.3f}"
    if "upper bound" in levels:
        text += f", upper bound {levels['upper bound']:.3f} (the agent told the true state)"
    return text


def format_lineage(result: ExperimentResult, candidate_id: str | None = None) -> str:
    """The best policy's ancestry, newest first, with each step's mutation and scores."""
    target = candidate_id or result.best_id
    if target is None:
        return "no evaluated candidate yet"
    basis = "validation" if result.candidate(target).validation is not None else "train"
    lines = [f"lineage of {target} (best by {basis} score):"]
    for record in result.lineage(target):
        lines.append(f"  {_describe(record)}")
    return "\n".join(lines)


def _describe(record: CandidateRecord) -> str:
    train = record.train.score if record.train is not None else None
    heldout = record.heldout.score if record.heldout is not None else None
    params = ",".join(f"{k}={v}" for k, v in sorted(record.parameters.items()))
    return (
        f"{record.id:<7} gen {record.generation:<2} {record.mutation.describe():<36} "
        f"train {_score(train)}  held-out {_score(heldout)}  [{params}]"
    )


def format_outcome(result: ExperimentResult) -> str:
    """In words: what the best policy changed from the base, and the held-out verdict: a
    paired test of the best against the base on the same questions, read from its interval
    (beats / within noise / worse), with the counts and users it rests on."""
    if result.best_id is None:
        return "no evaluated candidate yet"
    best = result.candidate(result.best_id)
    lineage = result.lineage(best.id)  # newest first; the base last
    base = lineage[-1]
    changes = [_change_in_words(record) for record in reversed(lineage[:-1])]
    lines = [
        "what changed: "
        + ("; ".join(changes) if changes else f"nothing - the best policy is the base ({base.id})")
    ]
    if base.heldout is None or best.heldout is None:
        lines.append("held-out: not evaluated (no held-out users, or the run stopped early)")
        return "\n".join(lines)
    questions = best.heldout.summary.n_items
    users = len(best.heldout.users)
    scope = f"held-out ({users} user{'s' if users != 1 else ''}, {questions} questions)"
    scores = (
        f"accuracy {_score(best.heldout.summary.accuracy)} vs "
        f"{_score(base.heldout.summary.accuracy)}"
    )
    if best.id == base.id:
        lines.append(
            f"{scope}: no candidate beat the base where the best is chosen, so the base is "
            f"kept ({scores.split(' vs ')[0]})"
        )
        return "\n".join(lines)
    comparison = result.heldout_comparison
    if comparison is None:
        lines.append(
            f"{scope}: no verdict (the per-question records of the base and the best are not "
            f"both there to pair): {scores}"
        )
        return "\n".join(lines)
    lines.append(
        f"{scope}: the best ({best.id}) {_verdict_words(comparison.verdict)} the base: "
        f"{scores}, {comparison.evidence()}"
    )
    memory = comparison.memory_score_difference
    if memory.value is not None:
        lines.append(f"  memory score difference {memory.format(signed=True)}")
    resolution = resolution_note(comparison)
    if resolution:
        lines.append(f"  {resolution}")
    return "\n".join(lines)


def _verdict_words(verdict: Verdict) -> str:
    return {
        Verdict.BEATS: "beats",
        Verdict.WITHIN_NOISE: "is within noise of",
        Verdict.WORSE: "is worse than",
    }[verdict]


def resolution_note(comparison: PairedComparison) -> str | None:
    """What the held-out set can resolve, when the verdict is within noise: the smallest gain
    it detects with 80% power, and how many users would resolve the observed one."""
    if comparison.verdict is not Verdict.WITHIN_NOISE:
        return None
    error = comparison.difference.standard_error
    observed = comparison.difference.value
    if not error or observed is None:
        return None
    users = comparison.basis.users
    text = (
        f"these {users} users resolve (80% power) a gain of {minimum_detectable(error):+.3f} "
        "or more"
    )
    if observed > 0:
        needed = users_to_detect(error, users, observed)
        text += f"; about {needed} would resolve the observed {observed:+.3f}"
    return text


def heldout_warning(result: ExperimentResult) -> str | None:
    """One line when the held-out test does not show that the best beats the base (None when
    it does, or when either was not scored there): an export must not crown it silently."""
    if result.best_id is None:
        return None
    best = result.candidate(result.best_id)
    base = result.lineage(best.id)[-1]
    if best.heldout is None or base.heldout is None:
        return None
    if best.id == base.id:
        return (
            f"warning: the exported policy is the base ({base.id}): no candidate beat it where "
            f"the best is chosen (held-out accuracy {_score(base.heldout.summary.accuracy)})"
        )
    comparison = result.heldout_comparison
    if comparison is None:
        return (
            f"warning: the best ({best.id}) has no held-out verdict: the per-question records "
            "of the best and the base are not both there to pair"
        )
    if comparison.verdict is Verdict.BEATS:
        return None
    return (
        f"warning: the best ({best.id}) {_verdict_words(comparison.verdict)} the base "
        f"({base.id}) on the held-out users: {comparison.evidence()}"
    )


def _change_in_words(record: CandidateRecord) -> str:
    mutation = record.mutation
    if mutation.edits:
        parts = []
        for component, applied in mutation.edits.items():
            added = ", ".join(repr(item) for item in applied.get("added", []))
            removed = ", ".join(repr(item) for item in applied.get("removed", []))
            words = [f"added {added}" if added else "", f"removed {removed}" if removed else ""]
            parts.append(f"{component} {' and '.join(w for w in words if w)}")
        return f"{record.id}: " + "; ".join(parts)
    if mutation.parameter_changes:
        changed = ", ".join(f"{n} {a}->{b}" for n, (a, b) in mutation.parameter_changes.items())
        return f"{record.id}: {changed}"
    if mutation.component is not None:
        return f"{record.id}: rewrote {mutation.component}"
    return f"{record.id}: {mutation.kind}"
