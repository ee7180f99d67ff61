"""Does evolution beat its base on held-out users, and beat selection on noise? The quickstart
on several environment seeds.

For each environment seed, runs the quickstart spec (`experiments/quickstart.toml`, its own
seed among them) twice: as shipped (`feedback = "diagnostic"`), and as the blind control
(`feedback = "blind"`: the same proposals and acceptance, the reflector shown no feedback, so
whatever the blind run gains is selection on noise). Prints per seed, on the held-out users:
the base, the best, the blind control's best, the upper bound and random (accuracy), the
memory scores of base and best, and the number of held-out questions; then the means and the
LLM calls and tokens spent, and the conversation health of each run.

Runs resume, also across sessions: the run directories are kept under
`benchmarks/records/quickstart_seeds/` (committed with the repository; the response cache is
not), so a rerun finishes what is missing and a finished one only prints. The table is also
written to `benchmarks/records/quickstart_seeds/summary.json`, which the README's first result
quotes.

    .venv/bin/python benchmarks/quickstart_seeds.py [--seeds 13 14 15] [--spec ...]
        [--runs-dir benchmarks/records/quickstart_seeds] [--no-tracking] [--threads N]

Every role is served by the spec's LLM setup (the embedded 1.5B model for the quickstart).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from evolve import api
from evolve.core.files import atomic_write_text
from evolve.optimize.report import conversation_lines
from evolve.results.records import ExperimentResult
from evolve.spec.config import ExperimentSpec

ROOT = Path(__file__).resolve().parents[1]


def variant(spec: ExperimentSpec, seed: int, feedback: str) -> ExperimentSpec:
    suffix = f"s{seed}" + ("" if feedback == spec.optimizer.feedback else f"-{feedback}")
    return spec.model_copy(
        update={
            "name": f"{spec.name}-{suffix}",
            "environment": spec.environment.model_copy(update={"seed": seed}),
            "optimizer": spec.optimizer.model_copy(update={"feedback": feedback}),
        }
    )


def heldout_row(result: ExperimentResult) -> dict[str, float | int | None]:
    """Held-out figures of the base and the best (None where not evaluated)."""
    best = result.candidate(result.best_id) if result.best_id else None
    base = result.lineage(best.id)[-1] if best else None
    if best is None or base is None or best.heldout is None or base.heldout is None:
        return {}
    return {
        "base": base.heldout.summary.accuracy,
        "best": best.heldout.summary.accuracy,
        "upper_bound": best.heldout.summary.upper_bound_score,
        "random": best.heldout.summary.random_score,
        "base_memory": base.heldout.summary.memory_score,
        "best_memory": best.heldout.summary.memory_score,
        "questions": best.heldout.summary.n_items,
        "calls": result.llm_calls,
        "tokens": result.tokens,
        "wall_s": result.wall_time_s,
        "conversation": conversation_lines(result),
        # The paired test of best against base on these questions: interval, counts, method.
        "comparison": result.heldout_comparison.model_dump(mode="json")
        if result.heldout_comparison is not None
        else None,
    }


def _f(value: float | int | None) -> str:
    return "  -  " if value is None else f"{value:5.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "experiments" / "quickstart.toml")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument(
        "--runs-dir", type=Path, default=ROOT / "benchmarks" / "records" / "quickstart_seeds"
    )
    parser.add_argument("--no-tracking", action="store_true", help="no MLflow logging")
    parser.add_argument("--threads", type=int, default=None, help="embedded server threads")
    args = parser.parse_args()
    spec = api.load_spec(args.spec)
    if args.threads is not None:
        embedded = spec.llm.embedded.model_copy(update={"threads": args.threads})
        spec = spec.model_copy(update={"llm": spec.llm.model_copy(update={"embedded": embedded})})
    own = spec.environment.seed
    seeds = args.seeds or [own, own + 1, own + 2]
    rows: list[tuple[int, dict, dict]] = []
    for seed in seeds:
        runs = {}
        for feedback in (spec.optimizer.feedback, "blind"):
            started = time.perf_counter()
            result = api.run_experiment(
                variant(spec, seed, feedback), runs_dir=args.runs_dir, tracking=not args.no_tracking
            )
            runs[feedback] = heldout_row(result)
            print(
                f"seed {seed} feedback {feedback}: {time.perf_counter() - started:.0f} s in this "
                f"invocation, {result.llm_calls} LLM calls, {result.tokens} tokens",
                flush=True,
            )
        rows.append((seed, runs[spec.optimizer.feedback], runs["blind"]))
        summary = [
            {"seed": seed, "shipped": shipped, "blind": blind} for seed, shipped, blind in rows
        ]
        atomic_write_text(args.runs_dir / "summary.json", json.dumps(summary, indent=2) + "\n")

    print(
        f"\nheld-out accuracy (memory score) per environment seed; spec {args.spec.name}, "
        f"feedback {spec.optimizer.feedback} vs blind"
    )
    print("seed  questions   base   best  blind  upper  random | memory: base  best")
    for seed, shipped, blind in rows:
        print(
            f"{seed:>4}  {shipped.get('questions', 0):>9}  {_f(shipped.get('base'))}  "
            f"{_f(shipped.get('best'))}  {_f(blind.get('best'))}  {_f(shipped.get('upper_bound'))}"
            f"  {_f(shipped.get('random'))} |        {_f(shipped.get('base_memory'))} "
            f"{_f(shipped.get('best_memory'))}"
        )
        for line in shipped.get("conversation", []):
            print(f"      {line}")
    complete = [(s, b) for _, s, b in rows if s and b]
    if complete:

        def mean(key: str, runs: list[dict]) -> float:
            values = [run[key] for run in runs if run.get(key) is not None]
            return statistics.fmean(values) if values else float("nan")

        shipped = [s for s, _ in complete]
        blind = [b for _, b in complete]
        gains = [s["best"] - s["base"] for s in shipped]
        print(
            f"mean  best - base {statistics.fmean(gains):+.3f} (per seed "
            f"{', '.join(f'{g:+.3f}' for g in gains)}); best {mean('best', shipped):.3f} vs "
            f"blind best {mean('best', blind):.3f}; memory score base "
            f"{mean('base_memory', shipped):.3f} -> best {mean('best_memory', shipped):.3f}"
        )
        print(
            f"spent: {sum(int(s['calls']) for s in shipped)} + "
            f"{sum(int(b['calls']) for b in blind)} (blind) LLM calls, "
            f"{sum(int(s['tokens']) for s in shipped)} + {sum(int(b['tokens']) for b in blind)} "
            "tokens"
        )


if __name__ == "__main__":
    main()
